//! `frag` on the shipped traces: the four measures stay in [0, 1] and agree with the bytes
//! behind them, and the OOM moment of `frag_oom` shows why the 1 GiB request did not fit.

use analyzer::analysis::frag::{analyze, FragOptions, FragReport};
use analyzer::analysis::moment::At;
use analyzer::model::layout::LayoutMeasures;
use std::path::PathBuf;

fn trace(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../traces/")).join(name)
}

fn frag(name: &str, at: At) -> FragReport {
    analyze(&analyzer::model::Trace::open(&trace(name)).unwrap(), &FragOptions { at }).unwrap()
}

fn check_consistent(r: &FragReport) {
    for m in &r.measures {
        for v in [m.at_moment, m.at_peak, m.mean, m.max] {
            assert!((0.0..=1.0).contains(&v), "{} = {v} out of [0, 1] in {}", m.name, r.trace);
        }
        assert!(m.mean <= m.max + 1e-12, "{}: mean above max", m.name);
    }
    let lm: &LayoutMeasures = &r.moment.measures;
    // Every reserved byte is in exactly one block: allocated, pending or free.
    assert_eq!(lm.allocated_bytes + lm.pending_free_bytes + lm.free_bytes, lm.reserved_bytes);
    let seg_sum: u64 = r.moment.segments.iter().map(|s| s.bytes).sum();
    assert_eq!(seg_sum, lm.reserved_bytes);
    assert!(lm.largest_free_bytes <= lm.free_bytes);
    assert!(lm.internal_bytes <= lm.allocated_bytes);
    let by_name = |n: &str| r.measures.iter().find(|m| m.name == n).unwrap();
    let rva = by_name("reserved_vs_allocated");
    if lm.reserved_bytes > 0 {
        let expect = 1.0 - lm.allocated_bytes as f64 / lm.reserved_bytes as f64;
        assert!((rva.at_moment - expect).abs() < 1e-9);
        // With no pending frees, unallocated reserved memory is exactly the free blocks.
        if lm.pending_free_bytes == 0 {
            assert!((by_name("external").at_moment - rva.at_moment).abs() < 1e-9);
        }
    }
    if let (Some(plan), Some(gap)) = (r.plan.offline_plan_bytes, r.plan.gap) {
        assert!((0.0..=1.0).contains(&gap));
        assert!(plan >= r.plan.live_requested_peak_bytes, "a plan holds at least the live requested bytes");
    }
}

#[test]
fn frag_oom_at_the_oom_shows_pieces_too_small_for_the_request() {
    let r = frag("frag_oom.default.atrace", At::Oom);
    check_consistent(&r);
    let f = r.moment.failed_request.as_ref().expect("the replay runs out of memory at 2 GiB");
    assert_eq!(f.requested_bytes, 1 << 30);
    assert!(f.largest_free_bytes < f.requested_bytes);
    let lm = &r.moment.measures;
    // Half of each segment is free, yet no free block is larger than one 4 MiB tensor.
    assert!(lm.free_bytes >= 900 << 20, "free inside segments: {}", lm.free_bytes);
    assert_eq!(lm.largest_free_bytes, 4 << 20);
    let contiguity = r.measures.iter().find(|m| m.name == "contiguity").unwrap();
    assert!(contiguity.at_moment > 0.99);
    // No segment is wholly free: empty_cache() could not help.
    assert_eq!(lm.releasable_bytes, 0);
    assert!(r.moment.segments.iter().all(|s| s.allocated_bytes > 0));
}

#[test]
fn expandable_frag_oom_is_one_mapped_range_full_of_holes() {
    let r = frag("frag_oom.expandable.atrace", At::Oom);
    check_consistent(&r);
    assert!(r.moment.segments.iter().all(|s| s.is_expandable));
    assert_eq!(r.moment.measures.largest_free_bytes, 4 << 20);
    assert!(r.moment.failed_request.is_some());
}

#[test]
fn peak_moment_is_the_peak_of_reserved() {
    let r = frag("gpt2_train.default.atrace", At::Peak);
    check_consistent(&r);
    assert_eq!(r.moment.event, r.peak_event);
    assert_eq!(r.moment.measures.reserved_bytes, r.plan.peak_reserved_bytes);
    for m in &r.measures {
        assert!((m.at_moment - m.at_peak).abs() < 1e-12, "{}: moment is the peak", m.name);
    }
    assert!(r.samples > 1000);
}

#[test]
fn end_and_event_moments() {
    // seed_experiments ends after two empty_cache() calls: nothing is reserved.
    let r = frag("seed_experiments.default.atrace", At::End);
    check_consistent(&r);
    assert_eq!(r.moment.measures.reserved_bytes, 0);
    assert!(r.moment.segments.is_empty());
    let r = frag("leak_list_append.default.atrace", At::Event(100));
    check_consistent(&r);
    assert_eq!(r.moment.event, 100);
    assert!(analyze(
        &analyzer::model::Trace::open(&trace("leak_list_append.default.atrace")).unwrap(),
        &FragOptions { at: At::Event(1 << 40) }
    )
    .is_err());
    assert!(analyze(
        &analyzer::model::Trace::open(&trace("leak_list_append.default.atrace")).unwrap(),
        &FragOptions { at: At::Oom }
    )
    .is_err());
}
