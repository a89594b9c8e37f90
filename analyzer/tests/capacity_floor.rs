//! The capacity search's floor (`Bounds::held_floor_bytes`): no capacity below it completes.
//! Checked as a claim on every shipped trace under each setting (a replay 2 MiB below the floor
//! fails), and on a trace that gives every allocation its own stream, where the floor is the
//! answer and the search finds it with one replay instead of bisecting down from terabytes.

use analyzer::analysis::capacity_search::{min_capacity, CAPACITY_RESOLUTION, RESUME_LEVELS};
use analyzer::analysis::whatif::bounds;
use analyzer::model::Trace;
use analyzer::replay::{replay, ReplayOptions};
use recorder::engine::config::AllocatorConfig;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

const SETTINGS: [&str; 5] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6",
];

fn replay_at(trace: &Trace, config: &AllocatorConfig, capacity: u64) -> bool {
    let o = ReplayOptions { config: Some(config.clone()), capacity_bytes: Some(capacity), ..Default::default() };
    !replay(trace, &o).unwrap().is_oom()
}

#[test]
fn no_capacity_below_the_floor_completes_a_shipped_trace() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut checked = 0;
    for name in [
        "gpt2_train.default",
        "resnet50_train.default",
        "recorded_graph_pools",
        "recorded_gpt2_train",
        "recorded_bert_infer_varlen",
        "leak_list_append.default",
    ] {
        let trace = Trace::open(&root.join(format!("{name}.atrace"))).unwrap();
        let b = bounds(&trace, &trace.header.config).unwrap();
        let Some(floor) = b.held_floor_bytes else { continue };
        assert!(floor >= b.live_requested_peak_bytes, "{name}: the floor is below what is live");
        for conf in SETTINGS {
            let config = AllocatorConfig::parse(conf).unwrap();
            let below = floor.saturating_sub(CAPACITY_RESOLUTION);
            assert!(!replay_at(&trace, &config, below), "{name} {conf}: completes at {below}, below the floor {floor}");
            let (unlimited, _) =
                analyzer::replay::resumable(&trace, &config, 0, 0, analyzer::replay::SAVED_BLOCKS).unwrap();
            assert!(unlimited.peak_reserved_bytes >= floor, "{name} {conf}: reserves less than the floor");
            checked += 1;
        }
    }
    println!("{checked} (trace, setting) pairs: nothing completes below the floor");
    assert!(checked >= 20, "the shipped traces record no OOM and have a floor");
}

/// 3,000 allocations of 512 bytes, each on a stream of its own and freed at once, beside a
/// 12 MiB block kept on the default stream. Every stream's small segment stays cached, so the
/// unlimited run reserves 3,000 x 2 MiB; under a limit PyTorch releases the cache and retries,
/// so 2 MiB for the small blocks and a 12 MiB segment for the large one are enough: the floor,
/// 14 MiB, is the answer. Expandable segments map the large pool in 20 MiB pages: there the
/// answer is 22 MiB, and the search goes on from the floor to find it.
#[test]
fn a_stream_per_allocation_is_searched_from_its_floor() {
    use recorder::trace::{Event, Header, Pool, Record, Source, TraceWriter};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("streams.atrace");
    let mut w = TraceWriter::create(&path, &Header::new(Source::Recorded)).unwrap();
    let mut t = 0u64;
    let mut put = |w: &mut TraceWriter<_>, event: Event| {
        t += 1;
        w.write_owned(Record { time_ns: t, event }).unwrap();
    };
    let big = Event::Alloc {
        id: 1,
        addr: 0,
        requested_bytes: 12 << 20,
        block_bytes: 0,
        stream: 0,
        pool: Pool::Large,
        callsite: 0,
    };
    put(&mut w, big);
    for id in 2..3002u64 {
        let event = Event::Alloc {
            id,
            addr: 0,
            requested_bytes: 512,
            block_bytes: 0,
            stream: id,
            pool: Pool::Small,
            callsite: 0,
        };
        put(&mut w, event);
        put(&mut w, Event::FreeRequested { id, addr: 0, callsite: 0 });
        put(&mut w, Event::FreeCompleted { id, addr: 0 });
    }
    w.finish().unwrap();
    let trace = Trace::open(&path).unwrap();
    let b = bounds(&trace, &trace.header.config).unwrap();
    assert_eq!(b.held_floor_bytes, Some(14 << 20));
    for conf in SETTINGS {
        let config = AllocatorConfig::parse(conf).unwrap();
        let (unlimited, from) =
            analyzer::replay::resumable(&trace, &config, 0, RESUME_LEVELS, analyzer::replay::SAVED_BLOCKS).unwrap();
        assert!(unlimited.peak_reserved_bytes > 1000 * (2 << 20), "{conf}: the streams' segments stay cached");
        let upper = unlimited.peak_reserved_bytes;
        let replays = AtomicU32::new(0);
        let count = || {
            replays.fetch_add(1, Ordering::Relaxed);
        };
        let with_floor =
            min_capacity(&trace, &config, false, from.as_ref(), 0, b.held_floor_bytes, upper, u32::MAX, &|| 1, &count)
                .unwrap();
        // The same search without the floor, every probe a whole replay: the bisection's answer.
        let without = min_capacity(&trace, &config, false, None, 0, None, upper, u32::MAX, &|| 1, &|| ()).unwrap();
        let answer = if config.expandable_segments { 22 << 20 } else { 14 << 20 };
        assert_eq!(with_floor, Some((answer, CAPACITY_RESOLUTION)), "{conf}");
        assert_eq!(with_floor.map(|m| m.0), without.map(|m| m.0), "{conf}: the floor changed the answer");
        assert!(replay_at(&trace, &config, answer) && !replay_at(&trace, &config, answer - (2 << 20)), "{conf}");
        // `probed` counts the bisection's rounds: where the floor completes, its replay ends the
        // search before any.
        let rounds = replays.load(Ordering::Relaxed);
        assert_eq!(rounds == 0, !config.expandable_segments, "{conf}: {rounds} rounds");
    }
}
