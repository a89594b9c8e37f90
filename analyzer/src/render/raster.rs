//! PNG pictures from the SVGs: a report pasted into an issue tracker needs raster images (most
//! trackers neither accept SVG attachments nor render `data:` SVG).
//!
//! Drawn with `resvg` (pure Rust) and one font embedded in the binary, DejaVu Sans (its licence
//! is `analyzer/fonts/DejaVuSans-LICENSE.txt`): no system font is ever looked up, so a PNG is
//! the same bytes on every machine, and the committed example reports stay current.

use anyhow::{anyhow, Context, Result};
use std::sync::{Arc, OnceLock};

/// The one font every PNG's text is drawn with.
pub const FONT_FAMILY: &str = "DejaVu Sans";
static FONT: &[u8] = include_bytes!("../../fonts/DejaVuSans.ttf");

fn fonts() -> Arc<resvg::usvg::fontdb::Database> {
    static DB: OnceLock<Arc<resvg::usvg::fontdb::Database>> = OnceLock::new();
    DB.get_or_init(|| {
        let mut db = resvg::usvg::fontdb::Database::new();
        db.load_font_data(FONT.to_vec());
        // Whatever family the SVG names (plotters writes `sans-serif`), the embedded font draws it.
        db.set_sans_serif_family(FONT_FAMILY);
        db.set_serif_family(FONT_FAMILY);
        db.set_monospace_family(FONT_FAMILY);
        Arc::new(db)
    })
    .clone()
}

/// The picture `svg` as a file of `kind` ([`crate::model::output::picture_kind`]): the SVG
/// itself, or a PNG rasterized from it as the report's are.
pub fn picture_file(svg: &str, kind: crate::model::output::Kind) -> Result<Vec<u8>> {
    match kind {
        crate::model::output::Kind::Png => png_of_svg(svg),
        _ => Ok(svg.as_bytes().to_vec()),
    }
}

/// Rasterises an SVG document at its own size (one pixel per SVG unit) into PNG bytes.
pub fn png_of_svg(svg: &str) -> Result<Vec<u8>> {
    let opt = resvg::usvg::Options {
        font_family: FONT_FAMILY.to_string(),
        fontdb: fonts(),
        // Pictures never reference files: nothing is read from disk while drawing.
        resources_dir: None,
        ..Default::default()
    };
    let tree = resvg::usvg::Tree::from_str(svg, &opt).context("the picture is not an SVG resvg can read")?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| anyhow!("the picture has no area ({}x{})", size.width(), size.height()))?;
    // An opaque white page under the picture: every pixel is then opaque, so no alpha channel.
    pixmap.fill(resvg::tiny_skia::Color::WHITE);
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
    encode(size.width(), size.height(), pixmap.data())
}

/// PNG bytes of opaque RGBA pixels: indexed colour where the picture has at most 256 colours
/// (flat charts often do), else 8-bit RGB; the best compression `png` offers. A third of the
/// size of the RGBA that `tiny-skia` writes.
fn encode(width: u32, height: u32, rgba: &[u8]) -> Result<Vec<u8>> {
    // Indexed if the colours fit in a palette. Neighbouring pixels mostly share a colour, so the
    // previous pixel's index is tried before the map (this loop is unoptimized in test builds).
    let mut palette: Vec<u8> = Vec::new();
    let mut index: rustc_hash::FxHashMap<[u8; 3], u8> = Default::default();
    let mut indexed: Vec<u8> = Vec::with_capacity(rgba.len() / 4);
    let mut last: Option<([u8; 3], u8)> = None;
    for p in rgba.chunks_exact(4) {
        let c = [p[0], p[1], p[2]];
        let i = match last {
            Some((l, i)) if l == c => i,
            _ => match index.get(&c) {
                Some(&i) => i,
                None if index.len() < 256 => {
                    let i = index.len() as u8;
                    index.insert(c, i);
                    palette.extend_from_slice(&c);
                    i
                }
                None => break,
            },
        };
        last = Some((c, i));
        indexed.push(i);
    }
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, width, height);
        e.set_depth(png::BitDepth::Eight);
        e.set_compression(png::Compression::Default);
        let data: Vec<u8> = if indexed.len() * 4 == rgba.len() {
            e.set_color(png::ColorType::Indexed);
            e.set_palette(palette);
            indexed
        } else {
            e.set_color(png::ColorType::Rgb);
            e.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
            rgba.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect()
        };
        let mut w = e.write_header().context("cannot encode the PNG")?;
        w.write_image_data(&data).context("cannot encode the PNG")?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_drawn_with_the_embedded_font_and_output_is_deterministic() {
        let svg = r#"<svg xmlns="http://www.w3.org/2000/svg" width="120" height="40">
            <rect width="120" height="40" fill="white"/>
            <text x="4" y="28" font-family="sans-serif" font-size="20">peak 1 GiB</text></svg>"#;
        let a = png_of_svg(svg).unwrap();
        assert_eq!(&a[1..4], b"PNG");
        assert_eq!(a, png_of_svg(svg).unwrap());
        // The same picture without its text: the text drew pixels (a font was found).
        let blank = svg.replace("peak 1 GiB", "");
        assert_ne!(a, png_of_svg(&blank).unwrap());
    }
}
