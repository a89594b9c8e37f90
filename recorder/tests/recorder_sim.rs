//! The recorder on the simulated device (no GPU): readable traces, many threads, a killed
//! process, an unwritable path, a full queue.

use recorder::device::SimDevice;
use recorder::recorder::{replay, Recorder, RecorderOptions};
use recorder::trace::{Event, Frame, MarkKind, ReleaseCause, TraceEnd, TraceReader};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

const MIB: u64 = 1 << 20;

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("alloctrace-test-{}-{name}.atrace", std::process::id()))
}

#[test]
fn writes_a_readable_trace() {
    let path = tmp("readable");
    let mut opts = RecorderOptions::new(&path);
    opts.alloc_conf = "max_split_size_mb:64".into();
    let rec = Recorder::start(opts, SimDevice::new(Some(1 << 30))).unwrap();
    let site = rec.callsite(vec![Frame { file: "train.py".into(), line: 7, function: "step".into() }]);
    assert_eq!(rec.callsite(vec![Frame { file: "train.py".into(), line: 7, function: "step".into() }]), site);
    rec.mark(MarkKind::Iteration, "iteration 0");
    let a = rec.malloc_at(3 * MIB, 0, site).unwrap();
    let b = {
        let _s = rec.scope(rec.tag("forward"));
        rec.malloc(1000, 0).unwrap()
    };
    assert!(rec.malloc(4 << 30, 0).is_err());
    rec.free(a.addr).unwrap();
    rec.free(b.addr).unwrap();
    assert!(rec.free(b.addr).is_err());
    let released = rec.empty_cache();
    assert!(released.bytes > 0);
    assert_eq!(rec.stats().reserved_bytes.all.current, 0);
    let s = rec.finish();
    assert!(s.writer.complete && s.writer.error.is_none(), "{s:?}");
    assert_eq!(s.writer.events_dropped, 0);
    assert_eq!(s.free_errors, 1);

    let mut r = TraceReader::open(&path).unwrap();
    assert_eq!(r.header().alloc_conf, "max_split_size_mb:64");
    assert_eq!(r.header().pid, std::process::id());
    let recs = r.read_all();
    assert!(matches!(r.end(), TraceEnd::Complete { .. }), "{:?}", r.end());
    assert_eq!(recs.len() as u64, s.events);
    assert_eq!(recs.len() as u64, s.writer.events_written);
    assert!(matches!(recs[0].event, Event::DeviceMemInfo { total_bytes: 1073741824, .. }));
    assert!(recs.windows(2).all(|w| w[0].time_ns <= w[1].time_ns), "timestamps go forward");
    let mut defined = HashSet::new();
    let mut kinds = Vec::new();
    for r in &recs {
        match &r.event {
            Event::CallSite { id, .. } => {
                defined.insert(*id);
            }
            Event::Alloc { callsite, .. } => {
                assert!(*callsite == 0 || defined.contains(callsite), "call site defined before use");
                assert_ne!(*callsite, 0);
            }
            _ => {}
        }
        kinds.push(r.event.kind_name());
    }
    assert!(kinds.contains(&"mark") && kinds.contains(&"oom"));
    // Each OOM is followed by the driver's view of memory.
    let oom = recs.iter().position(|r| matches!(r.event, Event::Oom { .. })).unwrap();
    assert!(recs[oom + 1..].iter().any(|r| matches!(r.event, Event::DeviceMemInfo { .. })));
    assert!(recs.iter().any(|r| matches!(r.event, Event::CacheRelease { cause: ReleaseCause::EmptyCache, .. })));
    let c = replay::check_segments(&path).unwrap();
    assert!(c.same() && !c.recorded.is_empty(), "{c:?}");
    let _ = std::fs::remove_file(&path);
}

/// 8 threads x 1 million alloc/free pairs: nothing lost, no two live blocks overlap, and the replay
/// reproduces the segment events.
#[test]
fn eight_threads_lose_nothing_and_never_overlap() {
    const THREADS: u64 = 8;
    const PAIRS: u64 = 1_000_000;
    let path = tmp("stress");
    let mut opts = RecorderOptions::new(&path);
    opts.queue_batches = 1024;
    // Eight threads allocating flat out on two cores starve the writer of CPU; with a yield
    // budget they give it the core instead of dropping (a real job allocates far slower).
    opts.full_queue_yield = std::time::Duration::from_secs(5);
    let rec = Recorder::start(opts, SimDevice::new(None)).unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let rec = &rec;
            s.spawn(move || {
                let mut x = t * 7919 + 1;
                let mut live = Vec::new();
                for i in 0..PAIRS {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let size = 512 + (x >> 33) % if i % 16 == 0 { 30 * MIB } else { 64 << 10 };
                    live.push(rec.malloc(size, t % 2).unwrap().addr);
                    if live.len() > 8 {
                        let v = live.swap_remove((x % 8) as usize);
                        rec.free(v).unwrap();
                    }
                }
                for v in live {
                    rec.free(v).unwrap();
                }
            });
        }
    });
    let s = rec.finish();
    assert_eq!(s.writer.events_dropped, 0, "{s:?}");
    assert_eq!(s.writer.events_written, s.events);

    let mut r = TraceReader::open(&path).unwrap();
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut allocs, mut frees, mut n) = (0u64, 0u64, 0u64);
    for rec in r.by_ref() {
        n += 1;
        match rec.event {
            Event::Alloc { addr, block_bytes, .. } => {
                allocs += 1;
                if let Some((&a, &b)) = live.range(..addr + block_bytes).next_back() {
                    assert!(a + b <= addr, "block at {addr:#x} overlaps live block {a:#x}+{b}");
                }
                live.insert(addr, block_bytes);
            }
            Event::FreeCompleted { addr, .. } => {
                frees += 1;
                assert!(live.remove(&addr).is_some());
            }
            _ => {}
        }
    }
    assert!(matches!(r.end(), TraceEnd::Complete { .. }));
    assert_eq!(n, s.events);
    assert_eq!(allocs, THREADS * PAIRS);
    assert_eq!(frees, THREADS * PAIRS);
    let c = replay::check_segments(&path).unwrap();
    assert!(c.same(), "first difference at {:?}", c.first_difference());
    let _ = std::fs::remove_file(&path);
}

/// `kill -9` mid-run: the trace reads up to its last flushed chunk, is reported truncated, and
/// lags the program by about the flush interval (100 ms) at most.
#[cfg(unix)]
#[test]
fn a_killed_process_leaves_a_readable_trace() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("examples").join("sim_workload");
    assert!(bin.exists(), "{} is built by `cargo test`", bin.display());
    let path = tmp("killed");
    // About 200 events per iteration and 1 ms of "compute" after each: a steady 100-200k events/s,
    // which even a debug build's writer keeps up with, so the lag measures the flush interval.
    let mut child = Command::new(&bin).arg(&path).args(["0", "1000"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let start = Instant::now();
    let mut last = (0u64, 0u64);
    // Run 800 ms, and on a machine so busy that the writer has flushed nothing by then (the
    // header and a first chunk), until it has: a kill before any flush leaves nothing to read,
    // which is not what this test asks about. At most 20 s.
    let flushed = || std::fs::metadata(&path).map_or(0, |m| m.len()) > 1024;
    while start.elapsed() < Duration::from_millis(800) || (!flushed() && start.elapsed() < Duration::from_secs(20)) {
        let Some(Ok(l)) = lines.next() else { break };
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() == 3 && f[0] == "progress" {
            last = (f[1].parse().unwrap(), f[2].parse().unwrap());
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(last.0 > 0, "the workload made progress");

    let mut r = TraceReader::open(&path).unwrap();
    let recs = r.read_all();
    assert!(matches!(r.end(), TraceEnd::Truncated { .. }), "{:?}", r.end());
    assert!(!recs.is_empty());
    let last_time = recs.last().unwrap().time_ns;
    // The last progress line seen was printed before the kill, so the trace may lag it by the
    // flush interval plus scheduling noise on a busy machine.
    let lag_ms = last.1.saturating_sub(last_time) as f64 / 1e6;
    eprintln!("killed: {} events in the trace, {} produced at the last report, lag {lag_ms:.1} ms", recs.len(), last.0);
    assert!(lag_ms <= 350.0, "trace lags the program by {lag_ms} ms");
    let _ = std::fs::remove_file(&path);
}

/// An unwritable path: the program keeps allocating, the recorder counts every event as
/// dropped and says why.
#[test]
fn an_unwritable_path_keeps_the_job_running() {
    let path = PathBuf::from("/nonexistent-alloctrace-dir/run.atrace");
    let rec = Recorder::start(RecorderOptions::new(&path), SimDevice::new(None)).unwrap();
    for i in 0..10_000u64 {
        let a = rec.malloc(512 + i * 64, 0).unwrap();
        rec.free(a.addr).unwrap();
    }
    let s = rec.finish();
    assert!(s.writer.error.as_deref().is_some_and(|e| e.contains("cannot create")), "{s:?}");
    assert!(!s.writer.complete);
    assert_eq!(s.writer.events_written, 0);
    assert_eq!(s.writer.events_dropped, s.events);
    assert!(s.events >= 20_000);
    assert!(s.describe().contains("DROPPED"));
}

/// A disk that fills up (`/dev/full` takes the file but refuses every byte): the job keeps
/// running, and no event that failed to reach the file is counted as written.
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_counts_every_event_as_dropped() {
    let rec = Recorder::start(RecorderOptions::new("/dev/full"), SimDevice::new(None)).unwrap();
    for i in 0..100_000u64 {
        let a = rec.malloc(512 + (i % 64) * 4096, 0).unwrap();
        rec.free(a.addr).unwrap();
        if i % 20_000 == 0 {
            rec.flush();
        }
    }
    let s = rec.finish();
    assert!(s.writer.error.is_some() && !s.writer.complete, "{s:?}");
    assert_eq!(s.writer.events_written, 0, "{s:?}");
    assert_eq!(s.writer.events_dropped, s.events, "{s:?}");
}

/// A queue too small for the rate, with no yielding to the writer: batches are dropped, never
/// waited for, and the trace says how many events it lacks.
#[test]
fn a_full_queue_drops_and_counts() {
    let path = tmp("full");
    let mut opts = RecorderOptions::new(&path);
    opts.batch_events = 16;
    opts.queue_batches = 1;
    opts.full_queue_yield = std::time::Duration::ZERO;
    let rec = Recorder::start(opts, SimDevice::new(None)).unwrap();
    for i in 0..200_000u64 {
        let a = rec.malloc(512 + (i % 100) * 512, 0).unwrap();
        rec.free(a.addr).unwrap();
    }
    let s = rec.finish();
    assert!(s.writer.events_dropped > 0, "{s:?}");
    // Every produced event was written or dropped; the writer's own `Dropped` markers come on top.
    assert_eq!(s.writer.events_written + s.writer.events_dropped, s.events);
    assert!(dropped_markers(&path) > 0);
    let mut r = TraceReader::open(&path).unwrap();
    let recs = r.read_all();
    let TraceEnd::Complete { trailer } = r.end().clone() else { panic!("{:?}", r.end()) };
    assert_eq!(trailer.dropped_events, s.writer.events_dropped);
    let in_trace: u64 = recs.iter().map(|r| if let Event::Dropped { events } = r.event { events } else { 0 }).sum();
    assert_eq!(in_trace, s.writer.events_dropped);
    let _ = std::fs::remove_file(&path);
}

fn dropped_markers(path: &std::path::Path) -> u64 {
    TraceReader::open(path).unwrap().filter(|r| matches!(r.event, Event::Dropped { .. })).count() as u64
}

/// Timestamps are nanoseconds of the monotonic clock since the recorder started, whichever
/// source it reads on the hot path (the time stamp counter where reliable, else the clock).
#[test]
fn timestamps_are_monotonic_clock_nanoseconds() {
    for use_tsc in [true, false] {
        let path = tmp(if use_tsc { "clock_tsc" } else { "clock_mono" });
        let mut opts = RecorderOptions::new(&path);
        opts.use_tsc = use_tsc;
        // Small batches: many calibrations, many batch boundaries.
        opts.batch_events = 64;
        let rec = Recorder::start(opts, SimDevice::new(None)).unwrap();
        for _ in 0..5000 {
            let a = rec.malloc(4096, 0).unwrap();
            rec.free(a.addr).unwrap();
        }
        let mut brackets = Vec::new();
        for i in 0..4 {
            std::thread::sleep(std::time::Duration::from_millis(15));
            let before = rec.now_ns();
            rec.mark(MarkKind::Phase, &format!("m{i}"));
            brackets.push((before, rec.now_ns()));
        }
        let source = rec.clock_source();
        rec.finish();
        let mut r = TraceReader::open(&path).unwrap();
        assert!(r.header().notes.iter().any(|n| n.starts_with("clock: ")), "{:?}", r.header().notes);
        let recs = r.read_all();
        assert!(recs.windows(2).all(|w| w[0].time_ns <= w[1].time_ns), "{source:?}: a timestamp went backwards");
        let marks: Vec<u64> =
            recs.iter().filter(|r| matches!(r.event, Event::Mark { .. })).map(|r| r.time_ns).collect();
        assert_eq!(marks.len(), brackets.len());
        let slack = 50_000;
        for (t, (before, after)) in marks.iter().zip(&brackets) {
            assert!(
                t + slack >= *before && *t <= after + slack,
                "{source:?}: mark at {t} ns, read in [{before}, {after}]"
            );
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// After `finish` the allocator keeps working but records nothing; every event produced
/// before it is in the trace, including the last partial batch, even while other threads
/// keep allocating.
#[test]
fn calls_after_finish_allocate_but_record_nothing() {
    let path = tmp("after_finish");
    let rec = Recorder::start(RecorderOptions::new(&path), SimDevice::new(None)).unwrap();
    for _ in 0..1000 {
        let a = rec.malloc(4096, 0).unwrap();
        rec.free(a.addr).unwrap();
    }
    let s = std::thread::scope(|scope| {
        let busy = scope.spawn(|| {
            for _ in 0..20_000 {
                let a = rec.malloc(1 << 20, 0).unwrap();
                rec.free(a.addr).unwrap();
            }
        });
        let s = rec.finish();
        busy.join().unwrap();
        s
    });
    assert!(s.writer.complete && s.writer.events_dropped == 0, "{s:?}");
    assert_eq!(s.events, s.writer.events_written);
    let a = rec.malloc(4096, 0).unwrap();
    rec.free(a.addr).unwrap();
    assert_eq!(rec.produced_events(), s.events, "nothing recorded after finish");
    let again = rec.finish();
    assert_eq!((again.events, again.writer.error.as_deref()), (s.events, Some("already finished")));
    let mut r = TraceReader::open(&path).unwrap();
    assert_eq!(r.read_all().len() as u64, s.events);
    let _ = std::fs::remove_file(&path);
}

/// A request of nearly 2^64 bytes (`malloc(SIZE_MAX)` through the C ABI) is an OOM under every
/// setting, with and without a limit: no overflow, and the engine keeps working.
#[test]
fn huge_requests_are_out_of_memory() {
    use recorder::engine::config::AllocatorConfig;
    use recorder::engine::{Engine, NullSink};
    for conf in ["", "roundup_power2_divisions:4", "expandable_segments:True", "max_split_size_mb:64"] {
        for cap in [None, Some(1u64 << 30)] {
            let c = AllocatorConfig::parse(conf).unwrap();
            let mut e = Engine::new(c, cap, SimDevice::new(cap), NullSink);
            for bytes in [u64::MAX, u64::MAX - 4096, 1 << 63] {
                assert!(e.malloc(bytes, 0, 0).is_err(), "{conf} {cap:?} {bytes}");
            }
            let a = e.malloc(4096, 0, 0).expect("a small request still succeeds");
            e.free(a.addr).unwrap();
        }
    }
}
