//! The one style of every picture: its size, palette, fonts and legend, and the binary unit of
//! a byte axis ([`super`] and the pictures beside it draw with these).

use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Picture size in pixels.
pub const WIDTH: u32 = 1200;
pub const HEIGHT: u32 = 640;
/// Okabe and Ito's colour-blind-safe palette ("Color Universal Design"), in the order series
/// take it: no two of the (at most eight) series of a picture share a colour.
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(230, 159, 0),   // orange
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(86, 180, 233),  // sky blue
    RGBColor(213, 94, 0),    // vermillion
    RGBColor(0, 0, 0),       // black
    RGBColor(240, 228, 66),  // yellow
];
pub(super) const BLUE: RGBColor = PALETTE[0];
pub(super) const ORANGE: RGBColor = PALETTE[1];
pub(super) const GREEN: RGBColor = PALETTE[2];
pub(super) const PURPLE: RGBColor = PALETTE[3];
pub(super) const SKY: RGBColor = PALETTE[4];
pub(super) const VERMILLION: RGBColor = PALETTE[5];
/// Bounds and free memory: greys, which no series takes.
pub(super) const GREY: RGBColor = RGBColor(153, 153, 153);
pub(super) const LIGHT: RGBColor = RGBColor(224, 224, 224);
/// The capacity limit: dark grey and dashed, a colour and a stroke no series uses.
pub(super) const CAPACITY: RGBColor = RGBColor(80, 80, 80);
pub(super) const MESH: RGBColor = RGBColor(238, 238, 238);

/// Font sizes as given to plotters (the SVG says `size / 1.24`, plotters' conversion).
pub(super) const TITLE_PX: u32 = 18;
pub(super) const TICK_PX: u32 = 13;
const LEGEND_PX: u32 = 13;
pub(super) const LABEL_PX: u32 = 12;
pub(super) const MARK_PX: u32 = 10;

/// The width of `text` in pixels at plotters size `size`, estimated (no font is loaded) from
/// DejaVu Sans' advances, rounded up per class of character. The test of overprinting
/// (`tests/pictures_plot.rs`) measures the SVG's text with this same estimate.
pub fn text_width_px(text: &str, size: u32) -> f64 {
    let em: f64 = text
        .chars()
        .map(|c| match c {
            'i' | 'j' | 'l' | '.' | ',' | ':' | ';' | '\'' | '|' | '!' | ' ' => 0.33,
            'f' | 't' | 'r' | '(' | ')' | '[' | ']' | '-' | '/' => 0.42,
            'm' | 'w' | 'M' | 'W' | '%' | '@' => 0.92,
            c if c.is_ascii_uppercase() => 0.74,
            c if c.is_ascii_digit() => 0.64,
            _ => 0.62,
        })
        .sum();
    em * size as f64 / 1.24
}

/// A rectangle in pixels: (x0, y0, x1, y1).
pub(super) type Px = (f64, f64, f64, f64);

pub(super) fn intersects(a: Px, b: Px) -> bool {
    a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3
}

/// What a legend entry shows beside its text.
#[derive(Debug, Clone, Copy)]
pub enum Swatch {
    Line(RGBColor, u32),
    Dashed(RGBColor, u32),
    Block(RGBColor),
}

/// A legend entry.
pub type LegendEntry = (Swatch, String);

const LEGEND_ROW_PX: u32 = 20;
const SWATCH_PX: i32 = 24;

/// Lays the entries out in rows under the chart, left to right: each entry's row and x.
fn legend_layout(entries: &[LegendEntry], width: u32) -> Vec<(usize, i32)> {
    let mut out = Vec::new();
    let (mut row, mut x) = (0usize, 0i32);
    let usable = width as i32 - 2 * 14;
    for (_, text) in entries {
        let w = SWATCH_PX + 6 + text_width_px(text, LEGEND_PX).ceil() as i32 + 24;
        if x > 0 && x + w > usable {
            row += 1;
            x = 0;
        }
        out.push((row, x));
        x += w;
    }
    out
}

/// The height of the legend band under a chart of `width` pixels.
pub fn legend_height(entries: &[LegendEntry], width: u32) -> u32 {
    let rows = legend_layout(entries, width).last().map(|(r, _)| r + 1).unwrap_or(0) as u32;
    if rows == 0 {
        0
    } else {
        rows * LEGEND_ROW_PX + 10
    }
}

/// Draws the legend into its band (the bottom of the picture, outside every data area): the
/// one legend style of every picture, [`crate::analysis::ranks`]' included.
pub fn draw_legend(area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>, entries: &[LegendEntry]) -> Result<()> {
    let (w, _) = area.dim_in_pixel();
    let font =
        TextStyle::from(("sans-serif", LEGEND_PX).into_font()).color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    for ((swatch, text), (row, x)) in entries.iter().zip(legend_layout(entries, w)) {
        let x = x + 14;
        let y = 4 + row as i32 * LEGEND_ROW_PX as i32 + LEGEND_ROW_PX as i32 / 2;
        match *swatch {
            Swatch::Line(c, width) => {
                area.draw(&PathElement::new(vec![(x, y), (x + SWATCH_PX, y)], c.stroke_width(width.max(2))))?
            }
            Swatch::Dashed(c, width) => area.draw(&plotters::element::DashedPathElement::new(
                vec![(x, y), (x + SWATCH_PX, y)],
                6,
                3,
                c.stroke_width(width.max(2)),
            ))?,
            Swatch::Block(c) => area.draw(&Rectangle::new([(x + 6, y - 6), (x + 18, y + 6)], c.filled()))?,
        }
        area.draw(&Text::new(text.clone(), (x + SWATCH_PX + 6, y), font.clone()))?;
    }
    Ok(())
}

/// A binary unit for an axis whose largest value is `max_bytes`.
pub(super) fn byte_unit(max_bytes: f64) -> (f64, &'static str) {
    if max_bytes >= (1u64 << 30) as f64 {
        ((1u64 << 30) as f64, "GiB")
    } else if max_bytes >= (1u64 << 20) as f64 {
        ((1u64 << 20) as f64, "MiB")
    } else {
        (1024.0, "KiB")
    }
}
