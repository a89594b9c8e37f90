//! `alloctrace plot`: deterministic, well-formed SVGs with titles, legends and axes; the
//! downsampling keeps the true peak; no font is ever loaded.

mod pictures_gen;

use analyzer::plot::{self, At, Kind, XAxis};
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
            let (a, _) =
                plot::plot(&analyzer::model::Trace::open(&path).unwrap(), kind, At::Peak, stacked, XAxis::Time)
                    .expect("plot");
            let (b, _) =
                plot::plot(&analyzer::model::Trace::open(&path).unwrap(), kind, At::Peak, stacked, XAxis::Time)
                    .expect("plot");
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
        let (svg, drawn) =
            plot::plot(&analyzer::model::Trace::open(&path).unwrap(), kind, At::Peak, stacked, XAxis::Time)
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
    let d = plot::segments_data(&analyzer::model::Trace::open(&path).unwrap(), At::Oom).expect("segments at the OOM");
    assert_eq!(d.failed_request_bytes, Some(1 << 30));
    assert_eq!(d.segments.len(), 92, "92 segments of 20 MiB");
    assert_eq!(d.largest_free_bytes(), 4 << 20, "every other 4 MiB tensor freed");
    let svg = plot::render_segments(&d).expect("render");
    check_well_formed(&svg);
    assert!(svg.contains("failed request (1.00 GiB"), "the request is in the legend");
    assert!(svg.contains("largest free block (4.00 MiB of 920.00 MiB free)"));
    let t = plot::timeline_data(&analyzer::model::Trace::open(&path).unwrap(), XAxis::Event, plot::COLUMNS)
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
    let d = plot::timeline_data(&analyzer::model::Trace::open(&path).unwrap(), XAxis::Event, plot::COLUMNS)
        .expect("timeline");
    assert_eq!(d.series.samples, events);
    assert!(d.series.columns() <= plot::COLUMNS);
    // One column spans hundreds of events, yet the spike (3 events wide) is the maximum drawn.
    assert!(d.series.width >= 128, "width {}", d.series.width);
    assert_eq!(d.series.max(1), replayed.peak_reserved_bytes as f64, "reserved");
    assert_eq!(d.series.max(0), replayed.peak_allocated_bytes as f64, "allocated");
    assert!(replayed.peak_allocated_bytes >= spike);
    assert_eq!(d.peak_reserved.1, replayed.peak_reserved_bytes);
    assert!(d.series.points(0).iter().any(|p| p.1 == replayed.peak_allocated_bytes as f64));
    let svg = plot::render_timeline(&d).expect("render");
    let label = format!("peak allocated {}", analyzer::units::fmt_bytes(replayed.peak_allocated_bytes));
    assert!(svg.contains(&label), "no {label:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn no_font_machinery_is_compiled_in_and_text_stays_text() {
    // plotters' `ttf`/`ab_glyph` features would pull these in to load system fonts.
    let lock = std::fs::read_to_string(workspace().join("Cargo.lock")).expect("Cargo.lock");
    for krate in ["font-kit", "ttf-parser", "ab_glyph", "yeslogic-fontconfig-sys", "freetype-sys", "dwrote"] {
        assert!(!lock.contains(&format!("name = \"{krate}\"")), "{krate} is in the dependency graph");
    }
    let (svg, _) = plot::plot(
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
    let folded = plot::timeline_recorded(&analyzer::model::Trace::open(&sim).unwrap(), XAxis::Event, plot::COLUMNS)
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
        plot::timeline_data(&analyzer::model::Trace::open(&sim).unwrap(), XAxis::Event, plot::COLUMNS).unwrap().events,
        folded.events
    );
    // An imported snapshot records no block sizes: it must be replayed.
    let imported = plot::timeline_recorded(
        &analyzer::model::Trace::open(&shipped("gpt2_train.default.atrace")).unwrap(),
        XAxis::Event,
        plot::COLUMNS,
    );
    assert!(imported.expect("scan").is_none());
    let _ = std::fs::remove_dir_all(dir);
}
