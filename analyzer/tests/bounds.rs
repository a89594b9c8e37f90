//! The memory bounds the README states, measured with a counting allocator: reading a trace
//! holds a few chunks whatever the file claims, and an import holds a bounded multiple of the
//! snapshot's size, for the hostile inputs as for real ones.

use recorder::trace::{Event, Frame, Header, MarkKind, Record, Source, TraceWriter, MAX_TEXT_BYTES};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Held by each test while it measures: the counter is the process's, and the test harness
/// runs tests side by side, so one test's allocations would count in another's peak.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Heap bytes `f` needed above what was allocated before it.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed) - base
}

const MIB: usize = 1 << 20;

fn hostile(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile").join(name)
}

/// A trace at the writer's limits: chunks full of the largest marks and deepest call sites.
fn largest_records_trace() -> PathBuf {
    let p = std::env::temp_dir().join(format!("alloctrace-bounds-{}.atrace", std::process::id()));
    let mut w = TraceWriter::create(&p, &Header::new(Source::Recorded)).unwrap();
    let text = "m".repeat(MAX_TEXT_BYTES);
    let frame = Frame { file: "f".repeat(MAX_TEXT_BYTES), line: 1, function: "g".repeat(MAX_TEXT_BYTES) };
    for i in 0..6000u64 {
        w.write_owned(Record { time_ns: i, event: Event::Mark { kind: MarkKind::Annotation, text: text.clone() } })
            .unwrap();
        if i % 1000 == 0 {
            let event = Event::CallSite { id: i as u32 + 1, frames: vec![frame.clone(); 1024] };
            w.write_owned(Record { time_ns: i, event }).unwrap();
        }
    }
    w.finish().unwrap();
    p
}

#[test]
fn reading_and_importing_stay_within_the_stated_bounds() {
    let _one_at_a_time = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    // Reading: a few chunks in flight, each at most MAX_CHUNK_RAW_BYTES (32 MiB) of body plus
    // its decoded records. The README states 100 MiB per decoding thread (at most 8), plus 16.
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 8);
    let read_bound = 16 * MIB + threads * 100 * MIB;
    let big = largest_records_trace();
    for path in [hostile("snap256M.atrace"), hostile("cs250M.atrace"), hostile("hdr_xss.atrace"), big.clone()] {
        let mut events = 0;
        let peak = peak_of(|| {
            events = analyzer::source::tracefile::scan(&path, |_, _| {}).unwrap().events;
        });
        eprintln!("read {}: {:.1} MiB", path.display(), peak as f64 / MIB as f64);
        assert!(peak < read_bound, "{}: {} MiB to read {events} events", path.display(), peak / MIB);
    }
    std::fs::remove_file(big).ok();

    // Import: the snapshot, its parse and the records. The most per input byte is a memo
    // reference (2 bytes) to one entry: an entry and a record, about 200 bytes. The README
    // states at most 16 MiB plus 128 times the snapshot's size.
    for name in [
        "memo_bomb_1k.pickle",
        "laughs_frames_300.pickle",
        "xss.pickle",
        "quadratic_entries.pickle",
        "one_entry_100k_times.pickle",
    ] {
        let path = hostile(name);
        let size = std::fs::metadata(&path).unwrap().len() as usize;
        let peak = peak_of(|| {
            let _ = analyzer::source::import::torch::import_file(&path, &Default::default());
        });
        eprintln!("import {name} ({size} bytes): {:.1} MiB", peak as f64 / MIB as f64);
        assert!(peak < 16 * MIB + 128 * size, "{name}: {} MiB for {size} bytes", peak / MIB);
    }
}

/// Round two: a stream per allocation, and a record budget in bytes.
#[test]
fn a_stream_per_allocation_and_marks_stay_within_their_bounds() {
    let _one_at_a_time = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    // 32,768 allocations, each on a stream of its own, each keeping a 2 MiB segment cached
    // (197 bytes; was 761 MB): the engine holds what is live, about 300 bytes a segment, not
    // 23 KiB of size classes a stream.
    let path = hostile("streams1.atrace");
    let peak = peak_of(|| {
        analyzer::replay::replay_file(&path, &Default::default()).unwrap();
    });
    eprintln!("replay streams1.atrace: {:.1} MiB", peak as f64 / MIB as f64);
    assert!(peak < 16 * MIB + 32_768 * 1024, "{} MiB", peak / MIB);

    // 20,000 marks of 4 KiB (80 MiB of text in a file of a few KiB): kept in memory only while
    // their bytes, not their count, fit in the records budget.
    let p = std::env::temp_dir().join(format!("alloctrace-bounds-marks-{}.atrace", std::process::id()));
    let mut w = TraceWriter::create(&p, &Header::new(Source::Recorded)).unwrap();
    for i in 0..20_000u64 {
        let text = format!("{i:08}{}", "m".repeat(MAX_TEXT_BYTES - 8));
        w.write_owned(Record { time_ns: i, event: Event::Mark { kind: MarkKind::Annotation, text } }).unwrap();
    }
    w.finish().unwrap();
    let budget = 16 * MIB;
    let mut in_memory = true;
    let peak = peak_of(|| {
        in_memory = analyzer::model::Trace::open_with_budget(&p, budget).unwrap().in_memory();
    });
    std::fs::remove_file(&p).ok();
    eprintln!("open 20,000 marks of 4 KiB under a 16 MiB budget: {:.1} MiB", peak as f64 / MIB as f64);
    assert!(!in_memory, "80 MiB of marks do not fit a 16 MiB budget");
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 8);
    assert!(peak < budget + 16 * MIB + threads * 100 * MIB, "{} MiB", peak / MIB);
}
