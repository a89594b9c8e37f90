//! The picture of several ranks of one job ([`crate::analysis::ranks`]), in the style of every picture
//! ([`crate::render::plot`]).

use super::style::byte_unit;
use crate::analysis::ranks::RanksReport;
use anyhow::Result;

/// The picture: per-rank peak bars (reserved, allocated) above the ranks' allocated bytes on
/// the aligned iteration axis. Same deterministic, font-free style as [`crate::render::plot`].
pub fn render_ranks(rep: &RanksReport) -> Result<String> {
    use plotters::prelude::*;
    let palette = super::style::PALETTE;
    use super::style::{draw_legend, legend_height, Swatch};
    // The legends under their charts, in the one legend style of every picture.
    let bar_legend = [
        (Swatch::Block(palette[0]), "peak reserved".to_string()),
        (Swatch::Block(palette[1]), "peak allocated".to_string()),
    ];
    let line_legend: Vec<_> = rep
        .timelines
        .iter()
        .enumerate()
        .map(|(k, t)| (Swatch::Line(palette[k % palette.len()], 2), format!("rank {}", t.rank)))
        .collect();
    let w = super::style::WIDTH;
    let (bar_legend_h, line_legend_h) = (legend_height(&bar_legend, w), legend_height(&line_legend, w));
    let h = super::style::HEIGHT + 240 + bar_legend_h + line_legend_h;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = root.split_vertically(340 + bar_legend_h);
        let (top, top_legend) = top.split_vertically(340);
        let (bottom, bottom_legend) = bottom.split_vertically(super::style::HEIGHT + 240 - 340);
        let n = rep.ranks.len().max(1);
        let max_peak = rep.ranks.iter().map(|r| r.peak_reserved.bytes.max(r.peak_allocated.bytes)).max().unwrap_or(0);
        let (ys, unit) = byte_unit(max_peak as f64);
        let y1 = (max_peak as f64 / ys * 1.15).max(1.0);
        let mut bars = ChartBuilder::on(&top)
            .caption(
                format!(
                    "Peak per rank: rank {} peaks, {:.2}x the median (reserved)",
                    rep.peaking_rank, rep.skew_reserved
                ),
                ("sans-serif", 18),
            )
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(78)
            .build_cartesian_2d(0f64..n as f64, 0f64..y1)?;
        bars.configure_mesh()
            .disable_x_mesh()
            .light_line_style(RGBColor(238, 238, 238))
            .x_label_formatter(&|_| String::new())
            .y_desc(format!("bytes ({unit})"))
            .y_label_formatter(&|v| format!("{v:.2}"))
            .label_style(("sans-serif", 13))
            .draw()?;
        let reserved = palette[0];
        let allocated = palette[1];
        for (k, r) in rep.ranks.iter().enumerate() {
            let x = k as f64;
            let res = r.peak_reserved.bytes as f64 / ys;
            let all = r.peak_allocated.bytes as f64 / ys;
            bars.draw_series(std::iter::once(Rectangle::new([(x + 0.15, 0.0), (x + 0.48, res)], reserved.filled())))?;
            bars.draw_series(std::iter::once(Rectangle::new([(x + 0.52, 0.0), (x + 0.85, all)], allocated.filled())))?;
            let label = format!(
                "rank {}: {} / {}",
                r.rank,
                crate::model::units::fmt_bytes(r.peak_reserved.bytes),
                crate::model::units::fmt_bytes(r.peak_allocated.bytes)
            );
            bars.draw_series(std::iter::once(Text::new(
                label,
                (x + 0.15, res.max(all) + y1 * 0.01),
                TextStyle::from(("sans-serif", 12).into_font()).pos(plotters::style::text_anchor::Pos::new(
                    plotters::style::text_anchor::HPos::Left,
                    plotters::style::text_anchor::VPos::Bottom,
                )),
            )))?;
        }
        draw_legend(&top_legend, &bar_legend)?;

        let x_max = rep.timelines.iter().flat_map(|t| t.points.last()).map(|p| p.0).fold(1.0, f64::max);
        let t_max = rep.timelines.iter().flat_map(|t| t.points.iter()).map(|p| p.1).max().unwrap_or(0);
        let (ts, tunit) = byte_unit(t_max as f64);
        let x_desc = if rep.aligned_on_iterations {
            "iteration (aligned on iteration starts; [0, 1) is before the first)"
        } else {
            "share of the trace's events (no iterations found in every trace)"
        };
        let mut lines = ChartBuilder::on(&bottom)
            .caption("Allocated bytes per rank, aligned on iterations", ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(78)
            .build_cartesian_2d(0f64..x_max.ceil(), 0f64..(t_max as f64 / ts * 1.08).max(1.0))?;
        lines
            .configure_mesh()
            .light_line_style(RGBColor(238, 238, 238))
            .x_desc(x_desc)
            .y_desc(format!("allocated ({tunit})"))
            .x_label_formatter(&|v| format!("{v}"))
            .y_label_formatter(&|v| format!("{v:.2}"))
            .label_style(("sans-serif", 13))
            .draw()?;
        for (k, t) in rep.timelines.iter().enumerate() {
            let color = palette[k % palette.len()];
            lines.draw_series(LineSeries::new(
                t.points.iter().map(|&(x, b)| (x, b as f64 / ts)),
                color.stroke_width(2),
            ))?;
        }
        draw_legend(&bottom_legend, &line_legend)?;
        root.present()?;
    }
    Ok(svg)
}
