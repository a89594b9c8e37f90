//! Settings that are one run on a trace are replayed once by the what-if table
//! (`AllocatorConfig::same_run`: a `max_split_size_mb` that no segment of the trace reaches, a
//! `roundup_power2_divisions` that no request reaches). Here each such row is checked against
//! replays of its own setting: at the table's capacity, with no limit, and at its smallest
//! capacity and 2 MiB below it, on every shipped trace and on a trace of small requests.

use analyzer::analysis::capacity_search::CAPACITY_RESOLUTION;
use analyzer::analysis::whatif::{whatif, WhatifOptions};
use analyzer::model::Trace;
use analyzer::replay::{replay, ReplayOptions, ReplayResult};
use recorder::engine::config::AllocatorConfig;
use std::path::Path;

fn figures(r: &ReplayResult) -> (bool, Option<u64>, u64, u64, u64, u64, u64) {
    (
        r.is_oom(),
        r.oom_event(),
        r.peak_reserved_bytes,
        r.peak_allocated_bytes,
        r.num_device_alloc,
        r.num_device_free,
        r.num_alloc_retries,
    )
}

#[test]
fn rows_replayed_with_another_are_what_their_own_setting_replays() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut traces: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .chain(std::fs::read_dir(root.join("large")).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "atrace"))
        .collect();
    traces.sort();
    let checked: usize = traces
        .iter()
        .map(|path| {
            let trace = Trace::open(path).unwrap();
            check_rows(path, &trace, trace.default_capacity())
        })
        .sum();
    println!("{checked} rows replayed with another setting's run, each checked against its own");
    assert!(checked >= 3, "the shipped traces have rows whose split size no segment reaches");
}

/// A job of small requests (1 B to 2 KiB on two streams, freed in random order, a few kept):
/// `roundup_power2_divisions:4` and `:8` round none of them other than the default does, so
/// both are the recorded run. Checked with no limit, and under a limit the job runs out of
/// (after releasing its cache and retrying), with each row's smallest capacity.
#[test]
fn divisions_no_request_reaches_are_the_recorded_run() {
    use recorder::trace::{Event, Header, Pool, Record, Source, TraceWriter};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.atrace");
    let mut w = TraceWriter::create(&path, &Header::new(Source::Recorded)).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut live, mut t) = (Vec::new(), 0u64);
    let mut put = |w: &mut TraceWriter<_>, event: Event| {
        t += 1;
        w.write_owned(Record { time_ns: t, event }).unwrap();
    };
    for id in 1..=40_000u64 {
        let requested_bytes = 1 + rnd() % 2048;
        let stream = if rnd() % 4 == 0 { 7 } else { 0 };
        let block_bytes = requested_bytes.div_ceil(512) * 512;
        let event = Event::Alloc { id, addr: 0, requested_bytes, block_bytes, stream, pool: Pool::Small, callsite: 0 };
        put(&mut w, event);
        live.push(id);
        while live.len() > 3000 || (live.len() > 1 && rnd() % 3 == 0) {
            let k = (rnd() % live.len() as u64) as usize;
            let id = live.swap_remove(k);
            put(&mut w, Event::FreeRequested { id, addr: 0, callsite: 0 });
            put(&mut w, Event::FreeCompleted { id, addr: 0 });
        }
    }
    w.finish().unwrap();
    let trace = Trace::open(&path).unwrap();
    let mut checked = 0;
    for capacity in [analyzer::model::Capacity::NONE, analyzer::model::Capacity::given(5 << 20)] {
        checked += check_rows(&path, &trace, capacity);
        let w =
            whatif(&trace, &WhatifOptions { capacity, search_capacity: false, repeats: 1, rows_only: false }).unwrap();
        let recorded = &w.rows[0];
        if capacity.bytes.is_some() {
            assert!(
                recorded.num_alloc_retries > 0 && recorded.reach == analyzer::analysis::outcome::Reach::RunsOutOfMemory
            );
        }
        for divisions in ["roundup_power2_divisions:4", "roundup_power2_divisions:8"] {
            let row = w.rows.iter().find(|r| r.policy.name() == divisions).unwrap();
            assert_eq!(row.same_as.as_deref(), Some("recorded"), "{divisions}");
        }
        let notes = w.same_run_notes();
        assert!(
            notes.iter().any(|n| n
                .starts_with("roundup_power2_divisions:4, roundup_power2_divisions:8: the same run as recorded")
                && n.contains("no request is large enough for the power-of-two divisions to round it")),
            "{notes:?}"
        );
    }
    assert_eq!(checked, 2 * 5, "three split sizes and two divisions, at each capacity");
}

/// Checks every row of `trace`'s what-if table at `capacity` that is replayed with another's
/// run against replays of its own setting; returns how many there were.
fn check_rows(path: &Path, trace: &Trace, capacity: analyzer::model::Capacity) -> usize {
    let mut checked = 0;
    {
        let w =
            whatif(trace, &WhatifOptions { capacity, search_capacity: true, repeats: 1, rows_only: false }).unwrap();
        for row in w.rows.iter().filter(|r| r.same_as.is_some()) {
            let config = AllocatorConfig::parse(&row.alloc_conf).unwrap();
            let twin = w.rows.iter().find(|r| Some(r.policy.name()) == row.same_as.as_deref()).unwrap();
            assert!(
                twin.same_as.is_none() && twin.alloc_conf != row.alloc_conf,
                "{}: {}",
                path.display(),
                row.alloc_conf
            );
            let at = |cap: Option<u64>| {
                let o = ReplayOptions {
                    config: Some(config.clone()),
                    capacity_bytes: cap,
                    unlimited: cap.is_none(),
                    ..Default::default()
                };
                replay(trace, &o).unwrap()
            };
            let twin_at = |cap: Option<u64>| {
                let o = ReplayOptions {
                    config: Some(AllocatorConfig::parse(&twin.alloc_conf).unwrap()),
                    capacity_bytes: cap,
                    unlimited: cap.is_none(),
                    ..Default::default()
                };
                replay(trace, &o).unwrap()
            };
            // The row's figures at the table's capacity are its own setting's.
            let own_at_cap = at(capacity.bytes);
            assert_eq!(
                (own_at_cap.peak_reserved_bytes, own_at_cap.peak_allocated_bytes, own_at_cap.num_device_alloc),
                (row.peak_reserved_bytes, row.peak_allocated_bytes, row.num_device_alloc),
                "{}: {}",
                path.display(),
                row.alloc_conf
            );
            // And the two settings replay alike with no limit and around the smallest capacity.
            let mut caps = vec![None];
            if let Some(m) = row.min_capacity_bytes {
                caps.push(Some(m));
                caps.push(Some(m.saturating_sub(CAPACITY_RESOLUTION)));
            }
            for cap in caps {
                assert_eq!(
                    figures(&at(cap)),
                    figures(&twin_at(cap)),
                    "{}: {} at {cap:?}",
                    path.display(),
                    row.alloc_conf
                );
            }
            if let Some(m) = row.min_capacity_bytes {
                assert!(!at(Some(m)).is_oom(), "{}: {} at its smallest capacity", path.display(), row.alloc_conf);
            }
            checked += 1;
        }
    }
    checked
}

/// The capacity search replays several levels of its bisection at once where threads would
/// otherwise wait; the probes it then takes are those it would have made one at a time, so the
/// smallest capacity is the same however many levels go at once (and so on any machine), and the
/// same as a search whose every probe replays the trace from its start.
#[test]
fn the_smallest_capacity_does_not_depend_on_the_levels_searched_at_once() {
    use analyzer::analysis::capacity_search::{min_capacity, RESUME_LEVELS};
    let mut searched = 0;
    each_trace_and_setting(|name, trace, conf, config| {
        let (unlimited, _) =
            analyzer::replay::resumable(trace, config, 0, RESUME_LEVELS, analyzer::replay::SAVED_BLOCKS).unwrap();
        let upper = unlimited.peak_reserved_bytes;
        let answers: Vec<_> = [1, 2, 3]
            .into_iter()
            .map(|ahead| {
                let (_, from) =
                    analyzer::replay::resumable(trace, config, 0, RESUME_LEVELS, analyzer::replay::SAVED_BLOCKS)
                        .unwrap();
                // Garbage collection too: its saved run counts cache lookups as under a limit.
                assert!(from.is_some(), "{name} {conf}: no saves");
                min_capacity(trace, config, false, from.as_ref(), 0, None, upper, u32::MAX, &|| ahead, &|| ()).unwrap()
            })
            .collect();
        // Every probe a whole replay from the start, one at a time.
        let whole = min_capacity(trace, config, false, None, 0, None, upper, u32::MAX, &|| 1, &|| ()).unwrap();
        assert!(answers[0].is_some(), "{name} {conf}");
        assert_eq!(answers[0], whole, "{name} {conf}: resumed and whole replays differ");
        assert_eq!(answers[0], answers[1], "{name} {conf}");
        assert_eq!(answers[0], answers[2], "{name} {conf}");
        searched += 1;
    });
    assert_eq!(searched, 20);
}

/// Replays at several capacities resume from one set of saves side by side (a search's probes
/// beside the run at the capacity compared), each keeping the save it made on its way while the
/// others read: each is the whole replay at its capacity, on the shipped traces under five
/// settings, at capacities from the peak of live requests to the unlimited run's peak reserved.
#[test]
fn replays_resumed_side_by_side_are_the_whole_replays() {
    use rayon::prelude::*;
    let mut checked = 0;
    each_trace_and_setting(|name, trace, conf, config| {
        let (unlimited, from) = analyzer::replay::resumable(
            trace,
            config,
            0,
            analyzer::analysis::capacity_search::RESUME_LEVELS,
            analyzer::replay::SAVED_BLOCKS,
        )
        .unwrap();
        let from = from.expect("saves");
        let (low, high) = (unlimited.peak_requested_bytes, unlimited.peak_reserved_bytes);
        let caps: Vec<u64> =
            (0..=8u64).map(|k| (low + (high - low) * k / 8) / CAPACITY_RESOLUTION * CAPACITY_RESOLUTION).collect();
        let resumed: Vec<ReplayResult> = caps
            .par_iter()
            .map(|&cap| {
                analyzer::replay::replay_resumed(trace, &from, cap, analyzer::model::CapacitySource::Given).unwrap()
            })
            .collect();
        for (&cap, r) in caps.iter().zip(&resumed) {
            let o = ReplayOptions { config: Some(config.clone()), capacity_bytes: Some(cap), ..Default::default() };
            let whole = replay(trace, &o).unwrap();
            assert_eq!(figures(r), figures(&whole), "{name} {conf}: at {cap}");
            checked += 1;
        }
    });
    assert_eq!(checked, 4 * 5 * 9);
}

/// A replay's capacity band ([`ReplayResult::capacity_band`]) is what lets a capacity search
/// take the outcome of other capacities from one replay: every capacity in it replays alike.
/// Checked at its two ends, on the shipped traces, under five settings, at capacities from the
/// peak of live requests to the unlimited run's peak reserved.
#[test]
fn every_capacity_in_a_replays_band_replays_alike() {
    let (mut checked, mut wide) = (0, 0);
    each_trace_and_setting(|name, trace, conf, config| {
        let at = |cap: u64| {
            let o = ReplayOptions { config: Some(config.clone()), capacity_bytes: Some(cap), ..Default::default() };
            replay(trace, &o).unwrap()
        };
        let unlimited =
            replay(trace, &ReplayOptions { config: Some(config.clone()), unlimited: true, ..Default::default() })
                .unwrap();
        let (low, high) = (unlimited.peak_requested_bytes, unlimited.peak_reserved_bytes);
        for k in 0..=4u64 {
            let cap = (low + (high - low) * k / 4) / CAPACITY_RESOLUTION * CAPACITY_RESOLUTION;
            let r = at(cap);
            let Some((from, to)) = r.capacity_band else {
                assert!(conf.starts_with("garbage"), "{name} {conf}: no band at {cap}");
                continue;
            };
            assert!(from <= cap && cap < to, "{name} {conf}: {cap} outside its band {from}..{to}");
            for edge in [from, to - 1] {
                let e = at(edge);
                assert_eq!(figures(&e), figures(&r), "{name} {conf}: {edge} in the band of {cap}");
                assert_eq!(e.capacity_band, r.capacity_band, "{name} {conf}: {edge} in the band of {cap}");
            }
            checked += 1;
            wide += usize::from(to - from > CAPACITY_RESOLUTION);
        }
    });
    println!("{checked} bands checked at both ends, {wide} wider than the search's resolution");
    // Four traces, four settings with bands, five capacities each.
    assert_eq!(checked, 4 * 4 * 5);
    assert!(wide > 0, "no band spared a probe");
}

/// Four shipped traces, each under five settings: the default, expandable segments, a split
/// size, rounding divisions and garbage collection.
fn each_trace_and_setting(mut f: impl FnMut(&str, &Trace, &str, &AllocatorConfig)) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    for name in ["gpt2_train.default", "resnet50_train.default", "frag_oom.default", "recorded_graph_pools"] {
        let trace = Trace::open(&root.join(format!("{name}.atrace"))).unwrap();
        for conf in [
            "",
            "expandable_segments:True",
            "max_split_size_mb:64",
            "roundup_power2_divisions:4",
            "garbage_collection_threshold:0.6",
        ] {
            f(name, &trace, conf, &AllocatorConfig::parse(conf).unwrap());
        }
    }
}
