//! CUDA graphs and MemPools, from one real job on an H100 (`fixtures/pools/`, see its README):
//! a recorded trace and PyTorch's own snapshot replay to the segment events the run made and to
//! the peaks PyTorch's counters reported, because each request is served from the private pool
//! the recording shows it came from.

use analyzer::replay::{replay_file, ReplayOptions};
use analyzer::source::import::{import_file, ImportOptions};
use recorder::recorder::replay::check_segments;
use recorder::trace::{Event, Record, TraceReader, TraceWriter};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(rel)
}

/// PyTorch's `max_memory_reserved()` and `max_memory_allocated()`, as the run printed them.
fn torch_peaks(run_output: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(run_output).unwrap();
    let line = text.lines().find(|l| l.starts_with("torch:")).expect("the counters line");
    let field = |name: &str| -> u64 {
        let mut words = line.split_whitespace();
        words.find(|w| *w == name).and_then(|_| words.next()).and_then(|v| v.parse().ok()).unwrap()
    };
    (field("max_memory_reserved"), field("max_memory_allocated"))
}

fn pool_ids(records: impl IntoIterator<Item = Record>) -> BTreeSet<[u64; 2]> {
    records
        .into_iter()
        .filter_map(|r| if let Event::SegmentPool { pool_id, .. } = r.event { Some(pool_id) } else { None })
        .collect()
}

/// The job's pools: torch.cuda.graph's (1, 0), shared by a second graph; a MemPool (0, 1);
/// torch.compile's graph trees (0, 2).
fn the_jobs_pools() -> BTreeSet<[u64; 2]> {
    [[0, 1], [0, 2], [1, 0]].into_iter().collect()
}

fn assert_replays_exactly(path: &Path, run_output: &Path) {
    let c = check_segments(path).unwrap();
    assert!(c.same(), "{}: first difference at {:?}", path.display(), c.first_difference());
    assert_eq!(c.replay_free_errors, 0);
    let r = replay_file(path, &ReplayOptions::default()).unwrap();
    assert_eq!((r.peak_reserved_bytes, r.peak_allocated_bytes), torch_peaks(run_output), "{}", path.display());
}

#[test]
fn a_recorded_graph_job_replays_to_its_segments_and_pytorchs_peaks() {
    // Default settings, and expandable segments (each private pool maps its own ranges).
    for (trace, run) in [
        ("traces/recorded_graph_pools.atrace", "graph_pools.recorded_run.txt"),
        ("analyzer/tests/fixtures/pools/graph_pools.expandable.atrace", "graph_pools.expandable.recorded_run.txt"),
    ] {
        let trace = repo(trace);
        assert_eq!(pool_ids(TraceReader::open(&trace).unwrap()), the_jobs_pools(), "{}", trace.display());
        assert_replays_exactly(&trace, &repo("analyzer/tests/fixtures/pools").join(run));
    }
}

#[test]
fn a_snapshot_taken_while_the_graphs_live_names_their_pools_and_replays_exactly() {
    for name in ["graph_pools", "graph_pools.expandable"] {
        let dir = repo("analyzer/tests/fixtures/pools");
        let im = import_file(&dir.join(format!("{name}.live.pickle")), &ImportOptions::default()).unwrap();
        assert_eq!(pool_ids(im.records.iter().cloned()), the_jobs_pools(), "{name}");
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("live.atrace");
        let mut w = TraceWriter::create(&path, &im.header).unwrap();
        for r in &im.records {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        assert_replays_exactly(&path, &dir.join(format!("{name}.snapshot_run.txt")));
    }
}

/// A snapshot names the pools of the segments it holds at its end only. Taken after the graphs
/// and the MemPool were deleted and the cache emptied, it names none of the job's private pools
/// (the one it names, torch.compile's, still lives), and its replay cannot follow the graphs.
#[test]
fn a_snapshot_taken_after_the_pools_were_released_names_only_the_live_ones() {
    let im = import_file(&repo("analyzer/tests/fixtures/pools/graph_pools.pickle"), &ImportOptions::default()).unwrap();
    let named = pool_ids(im.records.iter().cloned());
    assert!(named.is_subset(&the_jobs_pools()) && named.len() < 3, "{named:?}");
}

/// `summary`'s private-pool figures agree with the segments the trace names: the bytes of the
/// segments each `segment_pool` follows, less those freed, at the peak of reserved memory and
/// at the end.
#[test]
fn summary_counts_the_memory_in_private_pools() {
    let trace = repo("traces/recorded_graph_pools.atrace");
    let records: Vec<Record> = TraceReader::open(&trace).unwrap().collect();
    let (mut reserved, mut private, mut peak, mut at_peak) = (0u64, 0u64, 0u64, 0u64);
    let mut private_segments = std::collections::HashMap::new();
    for (i, r) in records.iter().enumerate() {
        match r.event {
            Event::SegmentAlloc { addr, bytes, .. } => {
                reserved += bytes;
                // A private segment's pool is named by the record after it.
                if let Some(Event::SegmentPool { addr: a, .. }) = records.get(i + 1).map(|n| &n.event) {
                    if *a == addr {
                        private += bytes;
                        private_segments.insert(addr, bytes);
                    }
                }
            }
            Event::SegmentFree { addr, bytes, .. } => {
                reserved -= bytes;
                private -= private_segments.remove(&addr).unwrap_or(0);
            }
            _ => {}
        }
        if reserved > peak {
            (peak, at_peak) = (reserved, private);
        }
    }
    let mut fold = analyzer::source::summary::SummaryFold::new();
    for (i, r) in records.iter().enumerate() {
        fold.record(i as u64, r);
    }
    let s = fold.finish();
    let p = s.private_pools.expect("private pools");
    assert_eq!(p.pool_ids.iter().copied().collect::<BTreeSet<_>>(), the_jobs_pools());
    assert_eq!(s.peak_reserved.bytes, peak);
    assert_eq!((p.reserved_at_peak_reserved_bytes, p.end_reserved_bytes), (at_peak, private));
    assert!(at_peak > 0 && private > 0 && private < at_peak);
}
