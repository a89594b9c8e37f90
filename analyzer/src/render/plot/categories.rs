//! The picture of live bytes by category ([`crate::analysis::category`]): a stacked timeline, in the style
//! of every picture ([`crate::render::plot`]).

use crate::analysis::category::{shown, Categories, CategorySample, CATEGORIES};
use anyhow::Result;

/// The stacked timeline: live bytes by category over the trace's events, the categories in the
/// order of [`CATEGORIES`] from the bottom, the peak of allocated bytes marked. Same
/// deterministic, font-free style as [`crate::render::plot`].
pub fn render_categories(c: &Categories, title: &str) -> Result<String> {
    use plotters::prelude::*;
    let palette = super::style::PALETTE;
    let (w, h) = (super::style::WIDTH, super::style::HEIGHT);
    let max = c.over_time.iter().map(|s| s.bytes.total()).max().unwrap_or(0).max(1);
    let (ys, unit) = super::style::byte_unit(max as f64);
    let x_max = c.over_time.last().map(|s| s.event + 1).unwrap_or(1) as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(78)
            .build_cartesian_2d(0f64..x_max, 0f64..(max as f64 / ys * 1.1))?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(238, 238, 238))
            .x_desc("event")
            .y_desc(format!("live bytes ({unit})"))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.2}"))
            .label_style(("sans-serif", 13))
            .draw()?;
        // Each category's top edge is the sum of it and the ones below: drawn from the top down,
        // so that each area covers the ones above it only where they hold nothing.
        let shown = shown(c.max.unknown).count();
        for k in (0..shown).rev() {
            let color = palette[k % palette.len()];
            let top = |s: &CategorySample| CATEGORIES[..=k].iter().map(|&x| s.bytes.get(x)).sum::<u64>() as f64 / ys;
            // Steps: each sample holds until the next one.
            let mut points = Vec::with_capacity(c.over_time.len() * 2);
            for (i, s) in c.over_time.iter().enumerate() {
                let next = c.over_time.get(i + 1).map(|n| n.event as f64).unwrap_or(x_max);
                points.push((s.event as f64, top(s)));
                points.push((next, top(s)));
            }
            chart
                .draw_series(AreaSeries::new(points, 0.0, color.filled()))?
                .label(format!(
                    "{} ({} at the peak)",
                    CATEGORIES[k].as_str(),
                    crate::model::units::fmt_bytes(c.at_peak.get(CATEGORIES[k]))
                ))
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        let peak = c.peak_event as f64;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(peak, 0.0), (peak, max as f64 / ys * 1.05)],
            BLACK.stroke_width(1),
        )))?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}
