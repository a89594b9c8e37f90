//! `alloctrace plot`: deterministic, well-formed SVGs with titles, legends and axes; the
//! downsampling keeps the true peak; no font is ever loaded.

mod pictures_gen;

use analyzer::analysis::moment::At;
use analyzer::analysis::picture::{self, XAxis};
use analyzer::cmd::plot::Kind;
use analyzer::render::plot;
use analyzer::replay::{replay_file, ReplayOptions};
use pictures_gen::*;

const KINDS: [(Kind, bool); 5] = [
    (Kind::Timeline, false),
    (Kind::Timeline, true),
    (Kind::Segments, false),
    (Kind::Whatif, false),
    (Kind::Frag, false),
];

#[test]
fn same_trace_same_bytes_for_every_kind() {
    for trace in ["frag_oom.default.atrace", "gpt2_train.default.atrace"] {
        let path = shipped(trace);
        for (kind, stacked) in KINDS {
            // Each run opens the trace afresh: nothing carries over from one to the next.
            let draw = || {
                let t = analyzer::model::Trace::open(&path).unwrap();
                analyzer::cmd::plot::plot(&t, kind, At::Peak, stacked, XAxis::Time).expect("plot").0
            };
            let (a, b) = (draw(), draw());
            assert!(a == b, "{trace} {kind:?} stacked={stacked}: two runs differ");
        }
    }
}

#[test]
fn svgs_are_well_formed_with_title_legend_and_axes() {
    let path = shipped("gpt2_train.default.atrace");
    let expect: [(Kind, bool, &[&str]); 5] = [
        (
            Kind::Timeline,
            false,
            &[
                "GPU memory over time: gpt2_train.default.atrace",
                "reserved (segments",
                "allocated (blocks",
                "bytes (GiB)",
                "time (ms)",
                "peak reserved 6.26 GiB",
            ],
        ),
        (
            Kind::Timeline,
            true,
            &["by call site: gpt2_train.default.atrace", "other", "workloads.py:", "live requested bytes (GiB)"],
        ),
        (
            Kind::Segments,
            false,
            &[
                "Segments at peak reserved",
                "largest free block",
                "allocated",
                "offset in segment",
                "segments in address order",
            ],
        ),
        (
            Kind::Whatif,
            false,
            &[
                "Reserved bytes under each policy: gpt2_train.default.atrace",
                "expandable_segments:True (peak",
                "live requested bytes",
                "reserved bytes (GiB)",
            ],
        ),
        (
            Kind::Frag,
            false,
            &[
                "Fragmentation over time: gpt2_train.default.atrace",
                "1 - allocated / reserved",
                "1 - largest free block / total free",
                "fraction",
                "100%",
            ],
        ),
    ];
    for (kind, stacked, needles) in expect {
        let (svg, drawn) = analyzer::cmd::plot::plot(
            &analyzer::model::Trace::open(&path).unwrap(),
            kind,
            At::Peak,
            stacked,
            XAxis::Time,
        )
        .expect("plot");
        let elements = check_well_formed(&svg);
        assert!(elements > 20, "{kind:?}: only {elements} elements");
        for n in needles {
            assert!(svg.contains(n), "{kind:?}: no {n:?} in the SVG");
        }
        assert_eq!(drawn.svg_bytes, svg.len() as u64);
        assert!(svg.len() < 2 << 20, "{kind:?}: {} bytes", svg.len());
    }
}

#[test]
fn oom_picture_marks_the_failed_request_and_the_largest_free_block() {
    let path = shipped("frag_oom.default.atrace");
    let d =
        picture::segments_data(&analyzer::model::Trace::open(&path).unwrap(), At::Oom).expect("segments at the OOM");
    assert_eq!(d.failed_request_bytes, Some(1 << 30));
    assert_eq!(d.segments.len(), 92, "92 segments of 20 MiB");
    assert_eq!(d.largest_free_bytes(), 4 << 20, "every other 4 MiB tensor freed");
    let svg = plot::render_segments(&d).expect("render");
    check_well_formed(&svg);
    assert!(svg.contains("failed request (1.00 GiB"), "the request is in the legend");
    assert!(svg.contains("largest free block (4.00 MiB of 920.00 MiB free)"));
    let t = picture::timeline_data(&analyzer::model::Trace::open(&path).unwrap(), XAxis::Event, picture::COLUMNS)
        .expect("timeline");
    assert_eq!(t.ooms.len(), 1);
    assert_eq!(t.capacity_bytes, Some(2 << 30));
    let svg = plot::render_timeline(&t).expect("render");
    assert!(
        svg.contains("capacity limit 2.00 GiB")
            && svg.contains("OOM: 1.00 GiB requested")
            && svg.contains("event index")
    );
}

#[test]
fn downsampling_keeps_the_true_peak() {
    let dir = temp_dir("spike");
    let path = dir.join("spike.atrace");
    let spike = 3u64 << 30;
    let events = random_trace(&path, 200_000, spike);
    let replayed = replay_file(&path, &ReplayOptions::default()).expect("replay");
    let d = picture::timeline_data(&analyzer::model::Trace::open(&path).unwrap(), XAxis::Event, picture::COLUMNS)
        .expect("timeline");
    assert_eq!(d.series.samples, events);
    assert!(d.series.columns() <= picture::COLUMNS);
    // One column spans hundreds of events, yet the spike (3 events wide) is the maximum drawn.
    assert!(d.series.width >= 128, "width {}", d.series.width);
    assert_eq!(d.series.max(1), replayed.peak_reserved_bytes as f64, "reserved");
    assert_eq!(d.series.max(0), replayed.peak_allocated_bytes as f64, "allocated");
    assert!(replayed.peak_allocated_bytes >= spike);
    assert_eq!(d.peak_reserved.1, replayed.peak_reserved_bytes);
    assert!(d.series.points(0).iter().any(|p| p.1 == replayed.peak_allocated_bytes as f64));
    let svg = plot::render_timeline(&d).expect("render");
    let label = format!("peak allocated {}", analyzer::model::units::fmt_bytes(replayed.peak_allocated_bytes));
    assert!(svg.contains(&label), "no {label:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn no_font_machinery_is_compiled_in_and_text_stays_text() {
    // plotters' `ttf`/`ab_glyph` features would pull these in to load system fonts, and so would
    // resvg's `system-fonts` (fontconfig-parser): the PNGs' one font is embedded (ttf-parser reads
    // it), none is looked up on the machine.
    let lock = std::fs::read_to_string(workspace().join("Cargo.lock")).expect("Cargo.lock");
    for krate in
        ["font-kit", "ab_glyph", "yeslogic-fontconfig-sys", "freetype-sys", "dwrote", "fontconfig-parser", "memmap2"]
    {
        assert!(!lock.contains(&format!("name = \"{krate}\"")), "{krate} is in the dependency graph");
    }
    let (svg, _) = analyzer::cmd::plot::plot(
        &analyzer::model::Trace::open(&shipped("seed_experiments.default.atrace")).unwrap(),
        Kind::Timeline,
        At::Peak,
        false,
        XAxis::Time,
    )
    .unwrap();
    assert!(svg.contains("<text") && svg.contains("font-family=\"sans-serif\""));
}

#[test]
fn a_trace_with_block_sizes_is_folded_without_replay_and_shows_what_its_run_computed() {
    let dir = temp_dir("fold");
    let sim = dir.join("sim.atrace");
    let opts = ReplayOptions { output: Some(sim.clone()), ..Default::default() };
    let run = replay_file(&shipped("gpt2_train.default.atrace"), &opts).expect("replay to a full trace");
    let folded =
        picture::timeline_recorded(&analyzer::model::Trace::open(&sim).unwrap(), XAxis::Event, picture::COLUMNS)
            .expect("fold")
            .expect("block sizes known");
    // The fold of the written trace shows exactly what the run that wrote it computed.
    assert_eq!(folded.peak_reserved.1, run.peak_reserved_bytes);
    assert_eq!(folded.peak_allocated.1, run.peak_allocated_bytes);
    assert_eq!(folded.series.max(1), run.peak_reserved_bytes as f64);
    assert_eq!(folded.series.max(0), run.peak_allocated_bytes as f64);
    assert_eq!(folded.series.max(2), run.peak_active_bytes as f64);
    assert_eq!(folded.series.max(3), run.peak_requested_bytes as f64);
    assert_eq!(
        picture::timeline_data(&analyzer::model::Trace::open(&sim).unwrap(), XAxis::Event, picture::COLUMNS)
            .unwrap()
            .events,
        folded.events
    );
    // An imported snapshot records no block sizes: it must be replayed.
    let imported = picture::timeline_recorded(
        &analyzer::model::Trace::open(&shipped("gpt2_train.default.atrace")).unwrap(),
        XAxis::Event,
        picture::COLUMNS,
    );
    assert!(imported.expect("scan").is_none());
    let _ = std::fs::remove_dir_all(dir);
}

/// The box of one SVG `<text>` as plotters writes it, in pixels: (x0, y0, x1, y1), or `None`
/// for rotated text (the axis descriptions, alone in their margins).
fn text_box(tag: &str, text: &str) -> Option<(f64, f64, f64, f64)> {
    let attr = |name: &str| -> Option<&str> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        tag[at..].split('"').next()
    };
    if attr("transform").is_some() {
        return None;
    }
    let num = |name: &str| attr(name).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let (x, y, size) = (num("x"), num("y"), num("font-size"));
    let text = text
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&");
    // The estimate the renderer places labels with, at plotters' size (the SVG's times 1.24).
    let w = plot::text_width_px(&text, (size * 1.24).round() as u32);
    let (x0, x1) = match attr("text-anchor") {
        Some("end") => (x - w, x),
        Some("middle") => (x - w / 2.0, x + w / 2.0),
        _ => (x, x + w),
    };
    let (y0, y1) = match attr("dy") {
        Some("0.76em") => (y, y + size),
        Some("0.5ex") => (y - size / 2.0, y + size / 2.0),
        _ => (y - size, y),
    };
    Some((x0, y0, x1, y1))
}

/// Pairs of texts of an SVG whose estimated boxes intersect.
fn overprinted(svg: &str) -> Vec<(String, String)> {
    let mut boxes = Vec::new();
    for part in svg.split("<text").skip(1) {
        let (tag, rest) = part.split_once('>').unwrap();
        let text = rest.split("</text>").next().unwrap().trim().to_string();
        if let Some(b) = text_box(tag, &text) {
            boxes.push((b, text));
        }
    }
    let mut out = Vec::new();
    for (i, (a, ta)) in boxes.iter().enumerate() {
        for (b, tb) in &boxes[i + 1..] {
            if a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3 {
                out.push((ta.clone(), tb.clone()));
            }
        }
    }
    out
}

/// No text of any picture overprints another (peak, OOM and mark labels, legends, ticks): in
/// the report of every trace in traces/ (`reports/`, checked current by `pictures_report`).
#[test]
fn no_label_overprints_another_in_any_shipped_picture() {
    let mut traces: Vec<String> = std::fs::read_dir(workspace().join("traces"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".atrace").map(str::to_string))
        .collect();
    traces.sort();
    let (mut pictures, mut bad) = (0, Vec::new());
    for t in &traces {
        let dir = workspace().join("reports").join(t);
        let mut svgs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|_| panic!("no report of {t}"))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "svg"))
            .collect();
        svgs.sort();
        for svg in svgs {
            pictures += 1;
            for (a, b) in overprinted(&std::fs::read_to_string(&svg).unwrap()) {
                bad.push(format!("{}: {a:?} over {b:?}", svg.strip_prefix(workspace()).unwrap().display()));
            }
        }
    }
    eprintln!("{pictures} pictures, {} overprinted pairs of texts", bad.len());
    assert!(pictures >= 4 * traces.len());
    assert!(bad.is_empty(), "{} overprinted:\n{}", bad.len(), bad.join("\n"));
}

/// The estimate finds overprinting where there is some.
#[test]
fn overprinting_is_detected() {
    let t = |x: u32, y: u32, s: &str| {
        format!(
            r#"<text x="{x}" y="{y}" dy="0.76em" text-anchor="start" font-family="sans-serif" font-size="9.67">{s}</text>"#
        )
    };
    let svg = format!("{}{}{}", t(100, 100, "peak reserved 1.80 GiB"), t(150, 104, "OOM"), t(100, 130, "apart"));
    assert_eq!(overprinted(&svg), vec![("peak reserved 1.80 GiB".to_string(), "OOM".to_string())]);
}
