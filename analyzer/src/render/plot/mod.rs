//! Pictures of a trace as SVG: memory over time, the segment map at a moment, what-if policies
//! over time, fragmentation over time.
//!
//! The `render_*` functions only draw the data of [`crate::analysis::picture`], which replays or
//! scans the trace.
//!
//! Deterministic by construction: plotters without its `ttf` feature (text is emitted as SVG
//! `<text>`, sized by an estimate, no font is loaded), pixel coordinates are integers, no clock,
//! no map iteration order reaches the output (call sites are ordered by bytes, then label).

mod categories;
mod ranks;
mod style;
pub use categories::render_categories;
pub use ranks::render_ranks;
use style::{
    byte_unit, intersects, Px, BLUE, CAPACITY, GREEN, GREY, LABEL_PX, LIGHT, MARK_PX, MESH, ORANGE, PURPLE, SKY,
    TICK_PX, TITLE_PX, VERMILLION,
};
pub use style::{draw_legend, legend_height, text_width_px, LegendEntry, Swatch, HEIGHT, PALETTE, WIDTH};

use crate::analysis::picture::{FragData, SegmentsData, StackedData, TimelineData, WhatifData, XAxis};
use crate::model::units::fmt_bytes;
use anyhow::Result;
use plotters::prelude::*;
use recorder::engine::SegmentView;

/// Rows of the segment map; beyond, the largest segments are shown.
pub const MAX_SEGMENT_ROWS: usize = 200;

/// Splits a picture into the chart and, under it, the legend band of `entries`.
fn with_legend<'b>(
    root: &DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    entries: &[LegendEntry],
) -> (DrawingArea<SVGBackend<'b>, plotters::coord::Shift>, DrawingArea<SVGBackend<'b>, plotters::coord::Shift>) {
    let (w, h) = root.dim_in_pixel();
    root.split_vertically(h - legend_height(entries, w))
}

/// Places labels next to their points without overprinting each other, the mark labels or
/// the markers: for each label, the first free spot among right/left of its point, above or
/// below, stepping away from it; inside the plotting area.
struct Labels {
    taken: Vec<Px>,
    area: Px,
}

impl Labels {
    fn new(area: Px) -> Labels {
        Labels { taken: Vec::new(), area }
    }

    fn take(&mut self, b: Px) {
        self.taken.push(b);
    }

    fn fits(&self, b: Px) -> bool {
        b.0 >= self.area.0
            && b.2 <= self.area.2
            && b.1 >= self.area.1
            && b.3 <= self.area.3
            && !self.taken.iter().any(|t| intersects(*t, b))
    }

    /// A free spot for `text` (plotters size `size`) near the point: its top-left corner.
    fn place(&mut self, (px, py): (i32, i32), text: &str, size: u32) -> Option<(i32, i32)> {
        let w = text_width_px(text, size);
        let h = size as f64 / 1.24 * 1.2;
        let (px, py) = (px as f64, py as f64);
        let gap = 8.0;
        for step in 0..24 {
            let dy = step as f64 * (h + 2.0);
            for (x, y) in [
                (px + gap, py - gap - h - dy),
                (px - gap - w, py - gap - h - dy),
                (px + gap, py + gap + dy),
                (px - gap - w, py + gap + dy),
            ] {
                let b = (x, y, x + w, y + h);
                if self.fits(b) {
                    self.take(b);
                    return Some((x.round() as i32, y.round() as i32));
                }
            }
        }
        None
    }
}

/// The x axis: the factor from trace units to drawn units, and its description.
fn x_unit(x: XAxis, x_last: u64) -> (f64, &'static str) {
    match x {
        XAxis::Event => (1.0, "event index"),
        XAxis::Time if x_last >= 2_000_000_000 => (1e9, "time (s)"),
        XAxis::Time => (1e6, "time (ms)"),
    }
}

/// A named line: legend text, colour, stroke width, points in drawn units.
type Line = (String, RGBColor, u32, Vec<(f64, f64)>);

/// A line chart in drawn units.
struct LineChart {
    title: String,
    x_desc: String,
    y_desc: String,
    /// Formats a y tick.
    percent: bool,
    x_range: (f64, f64),
    y_max: f64,
    lines: Vec<Line>,
    /// Vertical lines with a label (marks).
    vlines: Vec<(f64, String)>,
    /// A horizontal line with a legend entry (capacity).
    hline: Option<(f64, String)>,
    /// Points with a label: peaks (filled circles).
    dots: Vec<(f64, f64, String, RGBColor)>,
    /// Crosses with a label: OOMs.
    crosses: Vec<(f64, f64, String, RGBColor)>,
}

fn nonempty_range(lo: f64, hi: f64) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else {
        (lo, lo + 1.0)
    }
}

/// The plotting area of a chart in pixels.
fn pixel_area<X: Ranged, Y: Ranged>(chart: &ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>) -> Px {
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    (xr.start as f64, yr.start as f64, xr.end as f64, yr.end as f64)
}

fn render_line_chart(c: &LineChart) -> Result<String> {
    let mut legend: Vec<LegendEntry> = Vec::new();
    if let Some((_, label)) = &c.hline {
        legend.push((Swatch::Dashed(CAPACITY, 2), label.clone()));
    }
    for (name, color, width, _) in &c.lines {
        legend.push((Swatch::Line(*color, *width), name.clone()));
    }
    let height = HEIGHT + legend_height(&legend, WIDTH);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = with_legend(&root, &legend);
        let (x0, x1) = nonempty_range(c.x_range.0, c.x_range.1);
        let y1 = if c.y_max > 0.0 { c.y_max * 1.08 } else { 1.0 };
        let mut chart = ChartBuilder::on(&top)
            .caption(crate::model::escape::terminal(&c.title), ("sans-serif", TITLE_PX))
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(78)
            .build_cartesian_2d(x0..x1, 0f64..y1)?;
        let percent = c.percent;
        let y_fmt = move |v: &f64| if percent { format!("{:.0}%", v * 100.0) } else { format!("{v:.2}") };
        chart
            .configure_mesh()
            .light_line_style(MESH)
            .x_desc(c.x_desc.as_str())
            .y_desc(c.y_desc.as_str())
            .x_label_formatter(&|v| format!("{v}"))
            .y_label_formatter(&y_fmt)
            .label_style(("sans-serif", TICK_PX))
            .draw()?;
        let area = pixel_area(&chart);
        let mut labels = Labels::new(area);
        // At most one line per pixel column: thousands of iteration marks would otherwise
        // make a large SVG of lines drawn on top of each other.
        let mut lined_at = i32::MIN;
        for (x, label) in &c.vlines {
            let (px, _) = chart.backend_coord(&(*x, 0.0));
            if px > lined_at {
                lined_at = px;
                chart
                    .draw_series(std::iter::once(PathElement::new(vec![(*x, 0.0), (*x, y1)], LIGHT.stroke_width(1))))?;
            }
            // A mark's label at the top of its line, where no earlier label is; the rest are
            // left out.
            // "Optimizer.step#AdamW.step" (a record_function name) reads best after the '#'. The
            // trace's text with its control characters shown escaped, as in every output.
            let label = crate::model::escape::terminal(label);
            let short = label.rsplit('#').next().unwrap_or(&label);
            let text: String = short.chars().take(24).collect();
            let w = text_width_px(&text, MARK_PX);
            let h = MARK_PX as f64 / 1.24 * 1.2;
            let b = (px as f64 + 2.0, area.1 + 2.0, px as f64 + 2.0 + w, area.1 + 2.0 + h);
            // Kept apart by a gap, so that two labels never read as one.
            let spaced = (b.0 - 4.0, b.1, b.2 + 8.0, b.3);
            if labels.fits(spaced) {
                labels.take(spaced);
                top.draw(&Text::new(
                    text,
                    (b.0 as i32, b.1 as i32),
                    TextStyle::from(("sans-serif", MARK_PX).into_font()).color(&BLACK),
                ))?;
            }
        }
        if let Some((y, _)) = &c.hline {
            chart.draw_series(DashedLineSeries::new(vec![(x0, *y), (x1, *y)], 10, 6, CAPACITY.stroke_width(2)))?;
        }
        for (_, color, width, pts) in &c.lines {
            chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(*width)))?;
        }
        // Markers first (labels keep off them), then their labels.
        let mut marked: Vec<((i32, i32), String)> = Vec::new();
        for (x, y, label, color) in &c.dots {
            chart.draw_series(std::iter::once(Circle::new((*x, *y), 5, color.filled())))?;
            let p = chart.backend_coord(&(*x, *y));
            labels.take((p.0 as f64 - 6.0, p.1 as f64 - 6.0, p.0 as f64 + 6.0, p.1 as f64 + 6.0));
            marked.push((p, label.trim().to_string()));
        }
        for (x, y, label, color) in &c.crosses {
            chart.draw_series(std::iter::once(Cross::new((*x, *y), 7, color.stroke_width(3))))?;
            let p = chart.backend_coord(&(*x, *y));
            labels.take((p.0 as f64 - 8.0, p.1 as f64 - 8.0, p.0 as f64 + 8.0, p.1 as f64 + 8.0));
            marked.push((p, label.trim().to_string()));
        }
        for (p, text) in marked {
            if let Some(at) = labels.place(p, &text, LABEL_PX) {
                top.draw(&Text::new(text, at, TextStyle::from(("sans-serif", LABEL_PX).into_font()).color(&BLACK)))?;
            }
        }
        draw_legend(&bottom, &legend)?;
        root.present()?;
    }
    Ok(svg)
}

fn scaled(points: Vec<(u64, f64)>, xs: f64, ys: f64) -> Vec<(f64, f64)> {
    points.into_iter().map(|(x, y)| (x as f64 / xs, y / ys)).collect()
}

/// Memory over time: allocated, reserved, active, requested; peak, OOMs, marks, capacity.
pub fn render_timeline(d: &TimelineData) -> Result<String> {
    let s = &d.series;
    let mut y_max = (0..4).map(|i| s.max(i)).fold(0.0, f64::max);
    if let Some(c) = d.capacity_bytes {
        y_max = y_max.max(c as f64);
    }
    let (ys, unit) = byte_unit(y_max);
    let (xs, x_desc) = x_unit(d.x, s.x_last);
    let colors = [ORANGE, BLUE, GREEN, PURPLE];
    let widths = [2, 2, 1, 1];
    let labels =
        ["allocated (blocks handed out)", "reserved (segments from the device)", "active", "requested (asked for)"];
    let lines = (0..4).map(|i| (labels[i].to_string(), colors[i], widths[i], scaled(s.points(i), xs, ys))).collect();
    let device = if d.device.is_empty() { String::new() } else { format!(" on {}", d.device) };
    render_line_chart(&LineChart {
        title: format!("GPU memory over time: {}{device}", d.trace),
        x_desc: x_desc.into(),
        y_desc: format!("bytes ({unit})"),
        percent: false,
        x_range: (s.x0 as f64 / xs, s.x_last as f64 / xs),
        y_max: y_max / ys,
        lines,
        vlines: d.marks.iter().map(|(x, l)| (*x as f64 / xs, l.clone())).collect(),
        hline: d.capacity_bytes.map(|c| (c as f64 / ys, format!("capacity limit {}", fmt_bytes(c)))),
        dots: vec![
            (
                d.peak_reserved.0 as f64 / xs,
                d.peak_reserved.1 as f64 / ys,
                format!("peak reserved {}", fmt_bytes(d.peak_reserved.1)),
                BLUE,
            ),
            (
                d.peak_allocated.0 as f64 / xs,
                d.peak_allocated.1 as f64 / ys,
                format!("peak allocated {}", fmt_bytes(d.peak_allocated.1)),
                ORANGE,
            ),
        ],
        crosses: d
            .ooms
            .iter()
            .map(|(x, req)| {
                (
                    *x as f64 / xs,
                    d.peak_reserved.1 as f64 / ys,
                    format!("OOM: {} requested", fmt_bytes(*req)),
                    VERMILLION,
                )
            })
            .collect(),
    })
}

/// Live requested bytes by call site, stacked; the top edge is the true peak of the total.
pub fn render_stacked(d: &StackedData) -> Result<String> {
    let s = &d.series;
    let y_max = s.max(0);
    let (ys, unit) = byte_unit(y_max);
    let (xs, x_desc) = x_unit(d.x, s.x_last);
    let nb = d.bands.len();
    let per_band: Vec<Vec<(u64, f64)>> = (1..=nb).map(|b| s.at_max_of_first(b)).collect();
    // The last band, "other", in grey: the call sites take the palette.
    let color_of = |b: usize| if b + 1 == nb { GREY } else { PALETTE[b % PALETTE.len()] };
    // Call-site names as the trace holds them: their control characters shown escaped (not
    // allowed in XML, even as entities); plotters' SVG backend writes `<`, `&` and quotes as
    // entities itself, so `escape::xml` here would show `&lt;` for `<`.
    let legend: Vec<LegendEntry> = (0..nb)
        .map(|b| (Swatch::Block(color_of(b)), crate::model::escape::terminal(&d.bands[b]).into_owned()))
        .collect();
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT + legend_height(&legend, WIDTH))).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = with_legend(&root, &legend);
        let (x0, x1) = nonempty_range(s.x0 as f64 / xs, s.x_last as f64 / xs);
        let y1 = if y_max > 0.0 { y_max / ys * 1.08 } else { 1.0 };
        let title = if d.has_callsites {
            format!("Live requested bytes by call site: {}", d.trace)
        } else {
            format!("Live requested bytes (the trace records no call sites): {}", d.trace)
        };
        let mut chart = ChartBuilder::on(&top)
            .caption(crate::model::escape::terminal(&title), ("sans-serif", TITLE_PX))
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(78)
            .build_cartesian_2d(x0..x1, 0f64..y1)?;
        chart
            .configure_mesh()
            .light_line_style(MESH)
            .x_desc(x_desc)
            .y_desc(format!("live requested bytes ({unit})"))
            .y_label_formatter(&|v| format!("{v:.2}"))
            .label_style(("sans-serif", TICK_PX))
            .draw()?;
        // Cumulative from the top band down, each painted over the previous.
        for b in (0..nb).rev() {
            let color = color_of(b);
            let pts: Vec<(f64, f64)> = (0..per_band[0].len())
                .map(|c| {
                    let sum: f64 = per_band[..=b].iter().map(|band| band[c].1).sum();
                    (per_band[0][c].0 as f64 / xs, sum / ys)
                })
                .collect();
            chart.draw_series(AreaSeries::new(pts, 0.0, color.mix(0.85)).border_style(color.stroke_width(1)))?;
        }
        draw_legend(&bottom, &legend)?;
        root.present()?;
    }
    Ok(svg)
}

/// The rectangles of one segment's row, as (start, end) offsets in the segment and a colour:
/// adjacent blocks of one colour are one rectangle, the same picture in one element. A row
/// with more such runs than the picture has pixels across (millions of small blocks, freed
/// every other one) is drawn a pixel column at a time instead, each column in the colour that
/// covers most of its bytes: at that scale nothing finer can show, and the picture stays small
/// whatever the number of blocks. `widest` is the width of the scale in bytes.
fn segment_runs(
    s: &SegmentView,
    color_of: &dyn Fn(&recorder::engine::BlockView) -> RGBColor,
    widest: u64,
) -> Vec<(u64, u64, RGBColor)> {
    // Extends the last run where it ends at `start` in the same colour, else starts one.
    let extend = |runs: &mut Vec<(u64, u64, RGBColor)>, start: u64, end: u64, color: RGBColor| match runs.last_mut() {
        Some(last) if last.2 == color && last.1 == start => last.1 = end,
        _ => runs.push((start, end, color)),
    };
    let mut runs: Vec<(u64, u64, RGBColor)> = Vec::new();
    for b in &s.blocks {
        extend(&mut runs, b.addr - s.addr, b.addr - s.addr + b.bytes, color_of(b));
    }
    let columns = WIDTH as u64;
    if runs.len() as u64 <= 2 * columns {
        return runs;
    }
    // Bytes per column, so that the columns tile the whole scale; this row spans fewer.
    let per = widest.div_ceil(columns).max(1);
    let mut cols: Vec<Vec<(RGBColor, u64)>> = vec![Vec::new(); s.bytes.div_ceil(per) as usize];
    for &(start, end, color) in &runs {
        let mut at = start;
        while at < end {
            let c = at / per;
            let upto = ((c + 1) * per).min(end);
            let col = &mut cols[c as usize];
            match col.iter_mut().find(|(k, _)| *k == color) {
                Some((_, bytes)) => *bytes += upto - at,
                None => col.push((color, upto - at)),
            }
            at = upto;
        }
    }
    let mut out: Vec<(u64, u64, RGBColor)> = Vec::new();
    for (c, col) in cols.iter().enumerate() {
        let Some(&(color, _)) = col.iter().max_by_key(|(_, bytes)| *bytes) else { continue };
        extend(&mut out, c as u64 * per, ((c as u64 + 1) * per).min(s.bytes), color);
    }
    out
}

/// The segment map: one row per segment, allocated and free blocks, the largest free block
/// highlighted, and at an OOM the failed request drawn to the same scale.
pub fn render_segments(d: &SegmentsData) -> Result<String> {
    let mut segs: Vec<&SegmentView> = d.segments.iter().collect();
    let total = segs.len();
    let largest = d
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        // The block the legend names: the largest free block a request outside a private pool
        // could get ([`LayoutMeasures::largest_free_bytes`]).
        .filter(|b| !b.allocated && !b.pending_free && !b.in_private_pool)
        .max_by(|a, b| a.bytes.cmp(&b.bytes).then(b.addr.cmp(&a.addr)))
        .map(|b| b.addr);
    let holds_largest = |s: &SegmentView| largest.is_some_and(|a| s.blocks.iter().any(|b| b.addr == a));
    if segs.len() > MAX_SEGMENT_ROWS {
        // The largest segments, and always the one holding the largest free block.
        segs.sort_by(|a, b| {
            holds_largest(b).cmp(&holds_largest(a)).then(b.bytes.cmp(&a.bytes)).then(a.addr.cmp(&b.addr))
        });
        segs.truncate(MAX_SEGMENT_ROWS);
        segs.sort_by_key(|s| s.addr);
    }
    let widest_segment = segs.iter().map(|s| s.bytes).max().unwrap_or(0);
    // A request much larger than every segment is drawn off scale, else the segments would be
    // slivers: the point (no free block is that large) shows either way.
    let request_off_scale = d.failed_request_bytes.is_some_and(|r| r > 4 * widest_segment.max(1));
    let widest =
        if request_off_scale { widest_segment } else { widest_segment.max(d.failed_request_bytes.unwrap_or(0)) };
    let (xs, unit) = byte_unit(widest as f64);
    let extra = usize::from(d.failed_request_bytes.is_some());
    let rows = (segs.len() + extra).max(1);
    let height = (HEIGHT as usize).max(120 + rows * 10).min(2400) as u32;
    let mut legend: Vec<LegendEntry> = Vec::new();
    if let Some(req) = d.failed_request_bytes {
        legend.push((
            Swatch::Block(VERMILLION),
            if request_off_scale {
                format!(
                    "failed request ({}, {:.0}x the largest segment: off scale)",
                    fmt_bytes(req),
                    req as f64 / widest_segment.max(1) as f64
                )
            } else {
                format!("failed request ({})", fmt_bytes(req))
            },
        ));
    }
    legend.extend([
        (Swatch::Block(BLUE), "allocated".to_string()),
        (Swatch::Block(PURPLE), "freed, waiting for its stream (pending)".to_string()),
        (Swatch::Block(LIGHT), "free (cached)".to_string()),
        (
            Swatch::Block(ORANGE),
            format!("largest free block ({} of {} free)", fmt_bytes(d.largest_free_bytes()), fmt_bytes(d.free_bytes())),
        ),
    ]);
    if let Some(n) = d.streams.handles_note() {
        legend.push((Swatch::Block(WHITE), n));
    }
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, height + legend_height(&legend, WIDTH))).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = with_legend(&root, &legend);
        let shown = if segs.len() < total {
            format!(", {} of {total} segments: the largest and the one with the largest free block", segs.len())
        } else {
            String::new()
        };
        let title = format!("Segments at {}: {}{shown}", d.moment, d.trace);
        // Segments on other streams than the default say which (by name; the handles in the legend).
        let side_streams = segs.iter().any(|s| s.stream != 0);
        let labels: Vec<String> = segs
            .iter()
            .map(|s| {
                format!(
                    "{} {}{}{}",
                    fmt_bytes(s.bytes),
                    s.pool.as_str(),
                    if s.is_expandable { " exp" } else { "" },
                    if side_streams { format!(", {}", d.streams.name(s.stream)) } else { String::new() }
                )
            })
            .collect();
        let mut chart = ChartBuilder::on(&top)
            .caption(crate::model::escape::terminal(&title), ("sans-serif", TITLE_PX))
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(if side_streams { 200 } else { 130 })
            .build_cartesian_2d(0f64..(widest.max(1) as f64 / xs) * 1.02, 0f64..rows as f64)?;
        let n = rows;
        let label_of = |v: &f64| -> String {
            let row = n as i64 - 1 - v.floor() as i64;
            if v.fract() != 0.0 || row < 0 {
                return String::new();
            }
            let row = row as usize;
            if extra == 1 && row == 0 {
                "failed request".to_string()
            } else {
                labels.get(row - extra).cloned().unwrap_or_default()
            }
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(MESH)
            .x_desc(format!("offset in segment ({unit})"))
            .y_desc("segments in address order")
            .y_labels(rows.min(40))
            .y_label_formatter(&label_of)
            .x_label_formatter(&|v| format!("{v:.2}"))
            .label_style(("sans-serif", 12))
            .draw()?;
        let y_of = |row: usize| (n - 1 - row) as f64;
        let mut rects = Vec::new();
        let pad = 0.12;
        let color_of = |b: &recorder::engine::BlockView| {
            if b.allocated {
                BLUE
            } else if b.pending_free {
                PURPLE
            } else if Some(b.addr) == largest {
                ORANGE
            } else {
                LIGHT
            }
        };
        for (r, s) in segs.iter().enumerate() {
            let y = y_of(r + extra);
            for (start, end, color) in segment_runs(s, &color_of, widest.max(1)) {
                let (x0, x1) = (start as f64 / xs, end as f64 / xs);
                rects.push(Rectangle::new([(x0, y + pad), (x1, y + 1.0 - pad)], color.filled()));
            }
        }
        chart.draw_series(rects)?;
        if let Some(req) = d.failed_request_bytes {
            let y = y_of(0);
            chart.draw_series(std::iter::once(Rectangle::new(
                [
                    (0.0, y + pad),
                    (req.min(widest) as f64 / xs * if request_off_scale { 1.02 } else { 1.0 }, y + 1.0 - pad),
                ],
                VERMILLION.filled(),
            )))?;
        }
        draw_legend(&bottom, &legend)?;
        root.present()?;
    }
    Ok(svg)
}

/// Reserved bytes per policy against the live-requested bound.
pub fn render_whatif(d: &WhatifData) -> Result<String> {
    let mut y_max = d.policies.iter().map(|p| p.1.max(0)).fold(d.requested.max(1), f64::max);
    if let Some(c) = d.capacity_bytes {
        y_max = y_max.max(c as f64);
    }
    let (ys, unit) = byte_unit(y_max);
    let x_last = d.policies.iter().map(|p| p.1.x_last).max().unwrap_or(0);
    let (xs, x_desc) = x_unit(d.x, x_last);
    let mut lines = vec![(
        "live requested bytes (no allocator needs less)".to_string(),
        GREY,
        3,
        scaled(d.requested.points(1), xs, ys),
    )];
    let mut crosses: Vec<(f64, f64, String, RGBColor)> = Vec::new();
    // Policies failing at the same point share one label, "first and N more: OOM".
    let mut sharing: Vec<usize> = Vec::new();
    for (k, (name, s, oom, peak)) in d.policies.iter().enumerate() {
        lines.push((
            format!("{name} (peak {})", fmt_bytes(*peak)),
            PALETTE[k % PALETTE.len()],
            2,
            scaled(s.points(0), xs, ys),
        ));
        if let Some(x) = oom {
            let (x, y) = (*x as f64 / xs, s.series(0).last().map(|b| b.last.value).unwrap_or(0.0) / ys);
            match crosses.iter().position(|c| c.0 == x && c.1 == y) {
                Some(i) => sharing[i] += 1,
                None => {
                    crosses.push((x, y, name.clone(), PALETTE[k % PALETTE.len()]));
                    sharing.push(0);
                }
            }
        }
    }
    for (c, more) in crosses.iter_mut().zip(sharing) {
        c.2 = if more == 0 { format!("{}: OOM", c.2) } else { format!("{} and {more} more: OOM", c.2) };
    }
    render_line_chart(&LineChart {
        title: format!("Reserved bytes under each policy: {}", d.trace),
        x_desc: x_desc.into(),
        y_desc: format!("reserved bytes ({unit})"),
        percent: false,
        x_range: (d.requested.x0 as f64 / xs, x_last as f64 / xs),
        y_max: y_max / ys,
        lines,
        vlines: Vec::new(),
        hline: d.capacity_bytes.map(|c| (c as f64 / ys, format!("capacity limit {}", fmt_bytes(c)))),
        dots: Vec::new(),
        crosses,
    })
}

/// Fragmentation over time, both measures.
pub fn render_frag(d: &FragData) -> Result<String> {
    let (xs, x_desc) = x_unit(d.x, d.unallocated.x_last);
    render_line_chart(&LineChart {
        title: format!("Fragmentation over time: {}", d.trace),
        x_desc: x_desc.into(),
        y_desc: "fraction".into(),
        percent: true,
        x_range: (d.unallocated.x0 as f64 / xs, d.unallocated.x_last as f64 / xs),
        y_max: 1.0 / 1.08,
        lines: vec![
            (
                "reserved but unallocated: 1 - allocated / reserved".into(),
                BLUE,
                2,
                scaled(d.unallocated.points(0), xs, 1.0),
            ),
            (
                "free memory in pieces: 1 - largest free block / total free".into(),
                ORANGE,
                2,
                scaled(d.contiguity.points(0), xs, 1.0),
            ),
        ],
        vlines: Vec::new(),
        hline: None,
        dots: Vec::new(),
        crosses: Vec::new(),
    })
}

/// Memory over time of two traces on one picture (for `diff`).
pub fn render_overlay(a: &TimelineData, b: &TimelineData) -> Result<String> {
    let y_max = [a.series.max(0), a.series.max(1), b.series.max(0), b.series.max(1)].into_iter().fold(0.0, f64::max);
    let (ys, unit) = byte_unit(y_max);
    let x_last = a.series.x_last.max(b.series.x_last);
    let (xs, x_desc) = x_unit(a.x, x_last);
    let x0 = a.series.x0.min(b.series.x0);
    let mut crosses = Vec::new();
    for (d, tag) in [(a, "A"), (b, "B")] {
        for (x, req) in &d.ooms {
            let color = if tag == "A" { BLUE } else { VERMILLION };
            crosses.push((
                *x as f64 / xs,
                d.peak_reserved.1 as f64 / ys,
                format!("{tag} OOM ({})", fmt_bytes(*req)),
                color,
            ));
        }
    }
    render_line_chart(&LineChart {
        title: format!("A: {}  vs  B: {}", a.trace, b.trace),
        x_desc: x_desc.into(),
        y_desc: format!("bytes ({unit})"),
        percent: false,
        x_range: (x0 as f64 / xs, x_last as f64 / xs),
        y_max: y_max / ys,
        lines: vec![
            ("A reserved".into(), BLUE, 2, scaled(a.series.points(1), xs, ys)),
            ("A allocated".into(), SKY, 2, scaled(a.series.points(0), xs, ys)),
            ("B reserved".into(), VERMILLION, 2, scaled(b.series.points(1), xs, ys)),
            ("B allocated".into(), ORANGE, 2, scaled(b.series.points(0), xs, ys)),
        ],
        vlines: Vec::new(),
        hline: None,
        dots: Vec::new(),
        crosses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use recorder::engine::BlockView;

    fn segment(blocks: &[(u64, bool)]) -> SegmentView {
        let mut at = 1 << 30;
        let blocks: Vec<BlockView> = blocks
            .iter()
            .map(|&(bytes, allocated)| {
                let b = BlockView {
                    addr: at,
                    bytes,
                    allocated,
                    requested_bytes: if allocated { bytes } else { 0 },
                    pending_free: false,
                    in_private_pool: false,
                };
                at += bytes;
                b
            })
            .collect();
        SegmentView {
            addr: 1 << 30,
            bytes: at - (1 << 30),
            pool: recorder::trace::Pool::Large,
            pool_id: [0, 0],
            stream: 0,
            is_expandable: false,
            blocks,
        }
    }

    fn color_of(b: &BlockView) -> RGBColor {
        if b.allocated {
            BLUE
        } else {
            LIGHT
        }
    }

    /// Adjacent blocks of one colour are one rectangle; the runs tile the segment.
    #[test]
    fn blocks_of_one_colour_side_by_side_are_one_rectangle() {
        let s = segment(&[(512, true), (512, true), (1024, false), (512, false), (2048, true)]);
        assert_eq!(
            segment_runs(&s, &color_of, s.bytes),
            vec![(0, 1024, BLUE), (1024, 2560, LIGHT), (2560, 4608, BLUE)]
        );
        let all = segment(&vec![(512, true); 100_000]);
        assert_eq!(segment_runs(&all, &color_of, all.bytes), vec![(0, 512 * 100_000, BLUE)]);
    }

    /// A million blocks freed every other one: a pixel column at a time, each in the colour of
    /// most of its bytes, and the columns tile the segment.
    #[test]
    fn more_runs_than_pixels_are_drawn_a_column_at_a_time() {
        // Every fourth block free: three quarters of each column allocated.
        let s = segment(&(0..1_000_000u64).map(|k| (512, k % 4 != 0)).collect::<Vec<_>>());
        let runs = segment_runs(&s, &color_of, s.bytes);
        assert_eq!(runs, vec![(0, s.bytes, BLUE)]);
        // Alternate halves of 100 KiB: blue and light columns, at most one run per column.
        let halves: Vec<(u64, bool)> = (0..20u64)
            .flat_map(|h| (0..200).map(move |_| (512, h % 2 == 0)))
            .chain((0..5000).map(|k| (512, k % 2 == 0)))
            .collect();
        let s = segment(&halves);
        let runs = segment_runs(&s, &color_of, s.bytes);
        assert!(runs.len() <= WIDTH as usize, "{}", runs.len());
        assert_eq!(runs.first().map(|r| r.0), Some(0));
        assert_eq!(runs.last().map(|r| r.1), Some(s.bytes));
        assert!(runs.windows(2).all(|w| w[0].1 == w[1].0 && w[0].2 != w[1].2));
        assert!(runs.iter().any(|r| r.2 == LIGHT) && runs.iter().any(|r| r.2 == BLUE));
    }
}
