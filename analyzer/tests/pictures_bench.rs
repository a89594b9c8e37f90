//! The plot benchmark: a 10-million-event trace of random allocs and frees, plotted as a
//! timeline. Target: at most 2 s (release) into an SVG of at most 2 MB.
//!
//! cargo test --release -p alloctrace --test pictures_bench -- --ignored --nocapture

mod pictures_gen;

use analyzer::analysis::picture::{self, XAxis};
use analyzer::render::plot;
use pictures_gen::*;
use std::time::Instant;

#[test]
#[ignore = "a benchmark: run with --release -- --ignored --nocapture"]
fn plot_ten_million_events() {
    let events: u64 = std::env::var("PLOT_BENCH_EVENTS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000_000);
    let dir = temp_dir("bench");
    let path = dir.join("random.atrace");
    let t = Instant::now();
    let written = random_trace(&path, events, 6 << 30);
    let size = std::fs::metadata(&path).unwrap().len();
    eprintln!("generated {written} events ({size} bytes) in {:.2} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let scanned = analyzer::source::tracefile::scan(&path, |_, _| {}).expect("scan");
    eprintln!("decode only: {} events in {:.2} s", scanned.events, t.elapsed().as_secs_f64());
    let t = Instant::now();
    let r = analyzer::replay::replay_file(&path, &Default::default()).expect("replay");
    eprintln!("replay only: {} requests in {:.2} s", r.requests, t.elapsed().as_secs_f64());
    let t = Instant::now();
    let d = picture::timeline_data(&analyzer::model::Trace::open(&path).unwrap(), XAxis::Time, picture::COLUMNS)
        .expect("timeline");
    let folded = t.elapsed().as_secs_f64();
    let svg = plot::render_timeline(&d).expect("render");
    let total = t.elapsed().as_secs_f64();
    eprintln!(
        "timeline: {} events in {} columns: replay+fold {folded:.2} s, total {total:.2} s, SVG {} bytes",
        d.series.samples,
        d.series.columns(),
        svg.len()
    );
    // The same requests as a recorder would write them (segments, splits, block sizes): replayed
    // once into a full trace, whose timeline is folded straight from its events.
    let full = dir.join("full.atrace");
    let opts = analyzer::replay::ReplayOptions { output: Some(full.clone()), ..Default::default() };
    analyzer::replay::replay_file(&path, &opts).expect("write the full trace");
    let t = Instant::now();
    let f = picture::timeline_recorded(&analyzer::model::Trace::open(&full).unwrap(), XAxis::Time, picture::COLUMNS)
        .expect("fold")
        .expect("block sizes");
    let svg_full = plot::render_timeline(&f).expect("render");
    eprintln!(
        "timeline of the full trace (no replay): {} events in {:.2} s, SVG {} bytes",
        f.events,
        t.elapsed().as_secs_f64(),
        svg_full.len()
    );
    assert!(svg_full.len() <= 2_000_000);
    for (name, f) in [("stacked", 0), ("frag", 1)] {
        let t = Instant::now();
        let len = if f == 0 {
            plot::render_stacked(
                &picture::stacked_data(&analyzer::model::Trace::open(&path).unwrap(), XAxis::Time, picture::COLUMNS)
                    .unwrap(),
            )
            .unwrap()
            .len()
        } else {
            plot::render_frag(
                &picture::frag_data(&analyzer::model::Trace::open(&path).unwrap(), XAxis::Time, picture::COLUMNS)
                    .unwrap(),
            )
            .unwrap()
            .len()
        };
        eprintln!("{name}: {:.2} s, SVG {len} bytes", t.elapsed().as_secs_f64());
    }
    assert!(svg.len() <= 2_000_000);
    assert!(d.peak_allocated.1 >= 6 << 30, "the spike is the peak");
    let _ = std::fs::remove_dir_all(dir);
}
