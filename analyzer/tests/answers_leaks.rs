//! `leaks` on the shipped traces: the real leak of `leak_list_append` (each step's loss kept in
//! a list, holding its graph) is found, charged to the forward-pass line of the workload, and
//! measured per step; warm-up growth of a healthy training run is not called a leak.

use analyzer::analysis::leaks::{analyze, LeaksOptions, LeaksReport};
use std::path::PathBuf;

fn trace(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../traces/")).join(name)
}

fn leaks(name: &str) -> LeaksReport {
    analyze(&analyzer::model::Trace::open(&trace(name)).unwrap(), &LeaksOptions::default()).unwrap()
}

#[test]
fn leak_list_append_growth_is_charged_to_the_forward_pass() {
    let r = leaks("leak_list_append.default.atrace");
    let g = r.growth.as_ref().expect("the request stream is periodic");
    // 40 steps of the loop; the period is found from the stream (the trace has no iteration marks).
    assert!(g.live_bytes.len() >= 30, "iterations found: {}", g.live_bytes.len());
    assert!(g.source.contains("repeating pattern"), "{}", g.source);
    let top = &g.sites[0];
    // `out = m(x)` is workloads.py line 81 in leak_list_append: it keeps the ReLU output and the
    // second Linear's output alive every step (2 x 4 MiB, 256 x 4096 float32).
    assert_eq!(top.site.file, "workloads.py");
    assert_eq!(top.site.line, 81);
    assert_eq!(top.site.function, "leak_list_append");
    assert_eq!(top.site.label, "workloads.py:81 (leak_list_append)");
    assert_eq!(top.per_iteration_bytes, (8 << 20) as f64);
    assert_eq!(top.per_iteration_count, 2.0);
    assert_eq!(top.rising_intervals, top.intervals);
    // The input `x` (line 80) is kept too: +4 MiB per step.
    let x = g.sites.iter().find(|s| s.site.line == 80).expect("x = torch.randn(...) grows too");
    assert_eq!(x.per_iteration_bytes, (4 << 20) as f64);
    // In total a bit more than 12 MiB per step (plus the loss scalar).
    assert!(g.per_iteration_bytes >= (12 << 20) as f64 && g.per_iteration_bytes < (13 << 20) as f64);
    // Every growing site is user code, never a torch-internal frame.
    assert!(g.sites.iter().all(|s| !s.site.file.contains("site-packages")));
}

#[test]
fn warm_up_of_a_training_run_is_not_growth() {
    // GPT-2 with AdamW: the optimizer state appears in the first step, then memory is flat.
    let r = leaks("gpt2_train.default.atrace");
    let g = r.growth.as_ref().expect("zero_grad annotations mark the steps");
    assert!(g.source.contains("zero_grad"), "{}", g.source);
    assert!(g.live_bytes.len() >= 3);
    assert!(g.per_iteration_bytes.abs() < (1 << 20) as f64, "{}", g.per_iteration_bytes);
    assert!(g.sites.iter().all(|s| s.per_iteration_bytes < (1 << 20) as f64));
}

#[test]
fn live_at_end_and_retention_are_consistent() {
    for name in ["leak_list_append.default.atrace", "gpt2_train.default.atrace", "seed_experiments.default.atrace"] {
        let r = leaks(name);
        let by_site: u64 = r.live_at_end.iter().map(|s| s.requested_bytes).sum();
        assert_eq!(by_site, r.live_at_end_bytes, "{name}");
        assert_eq!(r.live_at_end.iter().map(|s| s.count).sum::<u64>(), r.live_at_end_count);
        let t = &r.retention;
        assert!(t.empty_cache_now_bytes <= t.reserved_bytes);
        for s in &t.sites {
            // Releasing a site's blocks can only add to what empty_cache() frees.
            assert!(s.empty_cache_if_released_bytes >= t.empty_cache_now_bytes);
            assert!(s.empty_cache_if_released_bytes <= t.reserved_bytes);
            assert!(s.segments_pinned <= s.segments_touched);
        }
        // If every site released its blocks, every segment would be releasable.
        let all: u64 = t.empty_cache_now_bytes + t.sites.iter().map(|s| s.pinned_segment_bytes).sum::<u64>();
        assert!(all <= t.reserved_bytes);
        if t.sites.len() == 1 {
            assert_eq!(all, t.reserved_bytes);
        }
    }
}

#[test]
fn frag_oom_blocks_pin_every_segment() {
    // At the OOM every 20 MiB segment holds kept 4 MiB tensors: empty_cache() frees nothing.
    let r = leaks("frag_oom.default.atrace");
    let t = &r.retention;
    assert_eq!(t.empty_cache_now_bytes, 0);
    assert_eq!(t.allocated_bytes, 920 << 20);
    assert_eq!(t.sites[0].empty_cache_if_released_bytes, t.reserved_bytes);
}

/// BERT inference over 40 batches of other shapes, without marks: its 12 layers repeat a
/// pattern of 16 allocations within each batch, which once read as 525 iterations. The
/// iterations are the outer loop's: the 40 batches, and the model's construction before them
/// (its layers' weights repeat the same pattern once).
#[test]
fn bert_inference_over_batches_of_other_shapes_reads_as_its_batches() {
    let r = leaks("recorded_bert_infer_varlen.atrace");
    let g = r.growth.as_ref().expect("iterations are found");
    assert!(g.source.contains("outer loop"), "{}", g.source);
    assert_eq!(g.live_bytes.len(), 41, "{}", g.source);
    assert!(g.sites.is_empty(), "no leak");
}

/// The same leak from a snapshot whose ring buffer dropped its oldest 300 entries: the blocks
/// rebuilt from its segments are alike, and the repetition was looked for in them ("repeats every
/// 8 allocations, too much alike, to be an iteration": no growth measured). The pattern is
/// found after them, with the same sites and rate as in the whole snapshot.
#[test]
fn a_leak_is_found_where_the_snapshot_dropped_its_oldest_entries() {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/leak_list_append.drop300.pickle"));
    let trace = analyzer::source::input::open(&path, &Default::default()).unwrap();
    let r = analyze(&trace, &LeaksOptions::default()).unwrap();
    let g = r.growth.as_ref().unwrap_or_else(|| panic!("no growth: {:?}", r.growth_note));
    assert!(g.source.contains("repeating pattern"), "{}", g.source);
    let whole = leaks("leak_list_append.default.atrace");
    let w = whole.growth.as_ref().unwrap();
    assert_eq!(g.sites[0].site.label, w.sites[0].site.label);
    assert_eq!(g.sites[0].per_iteration_bytes, w.sites[0].per_iteration_bytes);
    assert!(g.per_iteration_bytes >= (12 << 20) as f64 && g.per_iteration_bytes < (13 << 20) as f64);
}
