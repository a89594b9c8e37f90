//! Imports the real PyTorch snapshots of `fixtures/torch/` (copies of the shared traces, see
//! their README) and checks the events against counts and peaks observed independently.

use analyzer::source::import::pickle::{self, Value};
use analyzer::source::import::{import_file, import_snapshot, ImportError, ImportOptions, Imported};
use recorder::trace::{Event, Pool, Record, ReleaseCause, TraceReader, TraceWriter};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/")).join(name)
}

fn import(name: &str) -> Imported {
    import_file(&fixture(name), &ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Counts of events by kind name.
fn counts(records: &[Record]) -> BTreeMap<&'static str, u64> {
    let mut m = BTreeMap::new();
    for r in records {
        *m.entry(r.event.kind_name()).or_insert(0) += 1;
    }
    m
}

/// Peak of reserved bytes: Σ segment allocs and maps minus Σ frees and unmaps.
fn peak_reserved(records: &[Record]) -> u64 {
    let (mut cur, mut peak) = (0i128, 0i128);
    for r in records {
        match r.event {
            Event::SegmentAlloc { bytes, .. } | Event::SegmentMap { bytes, .. } => cur += bytes as i128,
            Event::SegmentFree { bytes, .. } | Event::SegmentUnmap { bytes, .. } => cur -= bytes as i128,
            _ => {}
        }
        peak = peak.max(cur);
    }
    peak as u64
}

/// (alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, oom), counted
/// in the trace entries with Python (`collections.Counter(e['action'] for e in trace)`) when the
/// fixtures were added.
type Expected = (u64, u64, u64, u64, u64, u64, u64);

fn check_counts(name: &str, imported: &Imported, e: Expected) {
    let c = counts(&imported.records);
    let get = |k| c.get(k).copied().unwrap_or(0);
    let got = (
        get("alloc"),
        get("free_requested"),
        get("free_completed"),
        get("segment_alloc"),
        get("segment_free"),
        get("segment_map"),
        get("oom"),
    );
    assert_eq!(got, e, "{name}: {c:?}");
    assert_eq!(get("segment_unmap"), 0, "{name}");
    let entries = e.0 + e.1 + e.2 + e.3 + e.4 + e.5 + e.6;
    assert_eq!(imported.report.entries, entries, "{name}");
    assert_eq!(imported.report.events, imported.records.len() as u64);
    assert!(!imported.report.ring_buffer_overflowed, "{name}: {:?}", imported.report);
    assert_eq!(imported.report.initial_segments, 0, "{name}");
    assert_eq!(imported.report.initial_live_blocks, 0, "{name}");
    assert!(imported.report.warnings.is_empty(), "{name}: {:?}", imported.report.warnings);
}

fn check_times(name: &str, records: &[Record]) {
    for w in records.windows(2) {
        assert!(w[0].time_ns <= w[1].time_ns, "{name}: time goes backwards: {w:?}");
    }
}

/// Call sites are defined before use, exactly once.
fn check_callsites(name: &str, records: &[Record]) -> BTreeMap<u32, Vec<String>> {
    let mut defined = BTreeMap::new();
    for r in records {
        match &r.event {
            Event::CallSite { id, frames } => {
                assert!(*id > 0);
                let files = frames.iter().map(|f| f.file.clone()).collect();
                assert!(defined.insert(*id, files).is_none(), "{name}: call site {id} defined twice");
            }
            Event::Alloc { callsite, .. } | Event::FreeRequested { callsite, .. } if *callsite != 0 => {
                assert!(defined.contains_key(callsite), "{name}: call site {callsite} used before definition");
            }
            _ => {}
        }
    }
    defined
}

/// The live blocks (addr -> requested bytes) and reserved ranges after folding every event.
struct FinalState {
    blocks: BTreeMap<u64, u64>,
    segments: BTreeSet<(u64, u64)>,
    mapped_bytes: u64,
}

fn fold(records: &[Record]) -> FinalState {
    let mut st = FinalState { blocks: BTreeMap::new(), segments: BTreeSet::new(), mapped_bytes: 0 };
    let mut ids = BTreeMap::new();
    for r in records {
        match r.event {
            Event::Alloc { id, addr, requested_bytes, .. } => {
                ids.insert(id, addr);
                assert!(st.blocks.insert(addr, requested_bytes).is_none(), "double alloc at {addr:#x}");
            }
            Event::FreeCompleted { id, addr } => {
                assert_eq!(ids.get(&id), Some(&addr));
                assert!(st.blocks.remove(&addr).is_some());
            }
            Event::SegmentAlloc { addr, bytes, .. } => assert!(st.segments.insert((addr, bytes))),
            Event::SegmentFree { addr, bytes, .. } => assert!(st.segments.remove(&(addr, bytes))),
            Event::SegmentMap { bytes, .. } => st.mapped_bytes += bytes,
            Event::SegmentUnmap { bytes, .. } => st.mapped_bytes -= bytes,
            _ => {}
        }
    }
    st
}

/// The final state the snapshot's `segments` list describes (device 0).
fn snapshot_state(bytes: &[u8]) -> FinalState {
    let pk = pickle::parse(bytes).unwrap();
    let mut st = FinalState { blocks: BTreeMap::new(), segments: BTreeSet::new(), mapped_bytes: 0 };
    let u = |v: Option<Value>| pk.u64(v.unwrap()).unwrap();
    for &s in pk.seq(pk.get(pk.root, "segments").unwrap()).unwrap() {
        let (addr, total) = (u(pk.get(s, "address")), u(pk.get(s, "total_size")));
        if pk.get(s, "is_expandable") == Some(Value::Bool(true)) {
            st.mapped_bytes += total;
        } else {
            st.segments.insert((addr, total));
        }
        for &b in pk.seq(pk.get(s, "blocks").unwrap()).unwrap() {
            let state = pk.str(pk.get(b, "state").unwrap()).unwrap();
            if state.starts_with("active") {
                st.blocks.insert(u(pk.get(b, "address")), u(pk.get(b, "requested_size")));
            }
        }
    }
    st
}

fn check_final_state(name: &str, imported: &Imported) {
    let bytes = std::fs::read(fixture(name)).unwrap();
    let want = snapshot_state(&bytes);
    let got = fold(&imported.records);
    assert_eq!(got.segments, want.segments, "{name}: segments");
    assert_eq!(got.mapped_bytes, want.mapped_bytes, "{name}: mapped bytes");
    assert_eq!(got.blocks, want.blocks, "{name}: live blocks");
}

#[test]
fn frag_oom_default() {
    let name = "torch/frag_oom.default.pickle";
    let im = import(name);
    check_counts(name, &im, (460, 460, 460, 92, 0, 0, 1));
    // truth.tsv: frag_oom default unlimited peak_reserved.
    assert_eq!(peak_reserved(&im.records), 1929379840);
    check_times(name, &im.records);
    check_final_state(name, &im);
    // The failing 1 GiB request is the last allocation-related event: only the frees of the
    // unwinding `keep` list follow it.
    let oom = im.records.iter().rposition(|r| matches!(r.event, Event::Oom { .. })).unwrap();
    assert!(im.records[oom..].iter().all(|r| !matches!(r.event, Event::Alloc { .. } | Event::SegmentAlloc { .. })));
    let Event::Oom { requested_bytes, alloc_bytes, reserved_bytes, allocated_bytes, limit_bytes, .. } =
        im.records[oom].event
    else {
        unreachable!()
    };
    assert_eq!(requested_bytes, 1 << 30);
    assert_eq!(alloc_bytes, 1 << 30);
    assert_eq!(reserved_bytes, 1929379840);
    assert_eq!(allocated_bytes, 230 * (4 << 20), "230 kept 4 MiB tensors");
    assert_eq!(limit_bytes, 0);
    assert_eq!(im.header.alloc_conf, "");
    assert!(im.records.iter().all(|r| !matches!(r.event, Event::CacheRelease { .. })));
}

#[test]
fn frag_oom_expandable() {
    let name = "torch/frag_oom.expandable.pickle";
    let im = import(name);
    check_counts(name, &im, (460, 460, 460, 0, 0, 92, 1));
    // truth.tsv: frag_oom expandable unlimited peak_reserved.
    assert_eq!(peak_reserved(&im.records), 1929379840);
    check_times(name, &im.records);
    check_final_state(name, &im);
    assert_eq!(im.header.alloc_conf, "expandable_segments:True");
    assert!(im.header.config.expandable_segments);
    for r in &im.records {
        if let Event::SegmentMap { pool, bytes, .. } = r.event {
            assert_eq!((pool, bytes), (Pool::Large, 20 << 20));
        }
    }
    assert!(im.records.iter().any(|r| matches!(r.event, Event::Oom { .. })));
}

#[test]
fn gpt2_train() {
    let name = "torch/gpt2_train.default.pickle";
    let im = import(name);
    check_counts(name, &im, (4663, 4660, 4660, 153, 0, 0, 0));
    // truth.tsv: gpt2_train default unlimited peak_reserved.
    assert_eq!(peak_reserved(&im.records), 6721372160);
    check_times(name, &im.records);
    check_final_state(name, &im);
    let sites = check_callsites(name, &im.records);
    assert_eq!(sites.len() as u32, im.report.callsites);
    assert!(sites.values().any(|files| files.iter().any(|f| f == "workloads.py")));
    // Python counted 2454 allocs and 2144 free_requested entries with non-empty `frames` (the
    // others come from the autograd engine's C++ threads, which have no Python stack).
    let with_site = |f: fn(&Event) -> bool| im.records.iter().filter(|r| f(&r.event)).count();
    assert_eq!(with_site(|e| matches!(e, Event::Alloc { callsite: 1.., .. })), 2454);
    assert_eq!(with_site(|e| matches!(e, Event::FreeRequested { callsite: 1.., .. })), 2144);
    // 16 external annotations (8 START, 8 END).
    let marks: Vec<&str> = im
        .records
        .iter()
        .filter_map(|r| match &r.event {
            Event::Mark { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(marks.len(), 16);
    assert_eq!(marks[0], "Optimizer.zero_grad#AdamW.zero_grad START");
}

#[test]
fn leak_list_append() {
    let name = "torch/leak_list_append.default.pickle";
    let im = import(name);
    check_counts(name, &im, (326, 324, 324, 29, 0, 0, 0));
    // truth.tsv: leak_list_append default unlimited peak_reserved.
    assert_eq!(peak_reserved(&im.records), 694157312);
    check_times(name, &im.records);
    check_final_state(name, &im);
    let sites = check_callsites(name, &im.records);
    assert!(sites.values().any(|files| files.iter().any(|f| f == "workloads.py")));
}

#[test]
fn resnet50_train() {
    let name = "torch/resnet50_train.default.pickle";
    let im = import(name);
    check_counts(name, &im, (3192, 3189, 3189, 109, 0, 0, 0));
    // truth.tsv: resnet50_train default unlimited peak_reserved.
    assert_eq!(peak_reserved(&im.records), 3684696064);
    check_times(name, &im.records);
    check_final_state(name, &im);
    assert_eq!(im.report.callsites, 0);
    // Small-pool segments are exactly 2 MiB.
    for r in &im.records {
        if let Event::SegmentAlloc { pool, bytes, .. } = r.event {
            assert_eq!(pool == Pool::Small, bytes == 2 << 20);
        }
    }
}

#[test]
fn seed_experiments_has_two_empty_cache_calls() {
    let name = "torch/seed_experiments.default.pickle";
    let im = import(name);
    check_counts(name, &im, (6, 6, 6, 3, 3, 0, 0));
    // truth.tsv: seed_experiments default unlimited peak_reserved.
    assert_eq!(peak_reserved(&im.records), 3122659328);
    check_times(name, &im.records);
    check_final_state(name, &im);
    let releases: Vec<(ReleaseCause, u64, u32)> = im
        .records
        .iter()
        .filter_map(|r| match r.event {
            Event::CacheRelease { cause, bytes, segments } => Some((cause, bytes, segments)),
            _ => None,
        })
        .collect();
    assert_eq!(
        releases,
        vec![(ReleaseCause::EmptyCache, 2097152, 1), (ReleaseCause::EmptyCache, 960495616 + 2160066560, 2)]
    );
    assert_eq!(im.report.inferred_empty_cache, 2);
    // The first record is at time 0, the origin is the first entry's time.
    assert_eq!(im.records[0].time_ns, 0);
    assert_eq!(im.header.clock_origin_unix_ns, 1795285748986390 * 1000);
}

#[test]
fn truncated_ring_buffer_is_reconstructed() {
    // seed_experiments without its first 5 entries (segment_alloc, alloc, segment_alloc, alloc,
    // free_requested): the two segments and two blocks existed before the first entry.
    let name = "seed_experiments.drop5.pickle";
    let im = import(name);
    assert!(im.report.ring_buffer_overflowed);
    assert_eq!(im.report.initial_segments, 2);
    assert_eq!(im.report.initial_live_blocks, 2);
    assert!(im.header.notes.iter().any(|n| n.contains("ring buffer overflowed")));
    let start: Vec<&Event> = im.records.iter().take_while(|r| r.time_ns == 0).map(|r| &r.event).collect();
    assert!(matches!(start[0], Event::SegmentAlloc { bytes: 960495616, pool: Pool::Large, .. }), "{start:?}");
    assert!(matches!(start[1], Event::SegmentAlloc { bytes: 2097152, pool: Pool::Small, .. }), "{start:?}");
    assert!(matches!(start[2], Event::Alloc { id: 1, requested_bytes: 960000000, .. }), "{start:?}");
    assert!(matches!(start[3], Event::Alloc { id: 2, requested_bytes: 240000, pool: Pool::Small, .. }), "{start:?}");
    check_final_state(name, &im);
    check_times(name, &im.records);
    // Peak reserved is still the truth.tsv value: nothing was lost from the reserved memory.
    assert_eq!(peak_reserved(&im.records), 3122659328);

    // leak_list_append without its first 300 entries: blocks live at the end and blocks freed
    // in the trace were allocated in the lost part.
    let name = "leak_list_append.drop300.pickle";
    let im = import(name);
    assert!(im.report.ring_buffer_overflowed);
    assert!(im.report.initial_live_blocks > 0 && im.report.initial_segments > 0, "{:?}", im.report);
    assert_eq!(im.report.entries, 1003 - 300);
    // The only finding is the overflow itself: the reconstructed start agrees with every entry.
    assert_eq!(im.report.warnings.len(), 1, "{:?}", im.report.warnings);
    assert!(im.report.warnings[0].starts_with("ring buffer overflow: "));
    check_final_state(name, &im);
    check_times(name, &im.records);
    check_callsites(name, &im.records);
}

#[test]
fn round_trip_through_the_trace_format() {
    let dir = std::env::temp_dir().join(format!("alloctrace-import-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let names = [
        "frag_oom.default",
        "frag_oom.expandable",
        "gpt2_train.default",
        "leak_list_append.default",
        "resnet50_train.default",
        "seed_experiments.default",
    ];
    let mut ratios = Vec::new();
    for name in names {
        let im = import(&format!("torch/{name}.pickle"));
        let path = dir.join(format!("{name}.atrace"));
        let mut w = TraceWriter::create(&path, &im.header).unwrap();
        for r in &im.records {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        let mut reader = TraceReader::open(&path).unwrap();
        assert_eq!(reader.header(), &im.header);
        let back: Vec<Record> = reader.by_ref().collect();
        assert!(reader.end().describe() == "complete", "{name}: {}", reader.end().describe());
        assert_eq!(back, im.records, "{name}");
        let per_event = size as f64 / im.records.len() as f64;
        println!("{name}: {} events, {size} bytes, {per_event:.2} bytes/event", im.records.len());
        ratios.push(per_event);
    }
    println!("average over the six: {:.2} bytes/event", ratios.iter().sum::<f64>() / ratios.len() as f64);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn foreign_and_broken_inputs_give_clear_errors() {
    let e = import_file(&fixture("not_a_snapshot.pickle"), &ImportOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("not_a_snapshot.pickle"), "{msg}");
    assert!(
        msg.contains(
            "not a PyTorch memory snapshot: top-level object is a list of 3 ints; expected a dict with `segments` and `device_traces`"
        ),
        "{msg}"
    );

    let e = import_snapshot(br#"{"segments": [], "device_traces": []}"#, &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, ImportError::NotAPickle { .. }), "{e}");
    assert!(e.to_string().starts_with("not a pickle"), "{e}");
    assert!(e.to_string().contains("this starts with `{\"segments\": [],`"), "{e}");

    let bytes = std::fs::read(fixture("torch/leak_list_append.default.pickle")).unwrap();
    let e = import_snapshot(&bytes[..40000], &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().starts_with("corrupt pickle: truncated pickle at byte "), "{e}");
    let ImportError::Pickle(p) = e else { panic!() };
    assert!(p.offset() <= 40000 && p.offset() > 39000, "{p}");

    let e = import_snapshot(&bytes, &ImportOptions { device: 3, ..Default::default() }).unwrap_err();
    assert_eq!(e.to_string(), "device 3 has no trace: the snapshot has 1 device trace(s)");

    let e = import_file(&fixture("no-such-file.pickle"), &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().starts_with("cannot read ") && e.to_string().contains("no-such-file.pickle"), "{e}");
}

#[test]
fn bare_segment_list_is_a_snapshot_without_trace() {
    // pickle.dumps([{'address': 4096, 'total_size': 2097152, 'stream': 0, 'segment_type': 'small',
    //   'blocks': [{'address': 4096, 'size': 512, 'requested_size': 100, 'state': 'active_allocated',
    //   'frames': []}]}], protocol=2), written with this crate's own opcodes by hand below.
    let mut p = vec![0x80, 2, b']', b'(', b'}', b'('];
    let s = |p: &mut Vec<u8>, t: &str| {
        p.push(b'X');
        p.extend_from_slice(&(t.len() as u32).to_le_bytes());
        p.extend_from_slice(t.as_bytes());
    };
    s(&mut p, "address");
    p.extend_from_slice(&[b'M', 0x00, 0x10]);
    s(&mut p, "total_size");
    p.push(b'J');
    p.extend_from_slice(&2097152u32.to_le_bytes());
    s(&mut p, "segment_type");
    s(&mut p, "small");
    s(&mut p, "blocks");
    p.extend_from_slice(b"](}(");
    s(&mut p, "address");
    p.extend_from_slice(&[b'M', 0x00, 0x10]);
    s(&mut p, "size");
    p.extend_from_slice(&[b'M', 0x00, 0x02]);
    s(&mut p, "requested_size");
    p.extend_from_slice(&[b'K', 100]);
    s(&mut p, "state");
    s(&mut p, "active_allocated");
    p.extend_from_slice(b"ue"); // SETITEMS of the block, APPENDS to blocks
    p.extend_from_slice(b"ue."); // SETITEMS of the segment, APPENDS to the list, STOP
    let im = import_snapshot(&p, &ImportOptions::default()).unwrap();
    assert_eq!(im.report.entries, 0);
    assert_eq!(im.report.initial_segments, 1);
    assert_eq!(im.report.initial_live_blocks, 1);
    assert!(!im.report.ring_buffer_overflowed);
    assert_eq!(
        im.records.iter().map(|r| r.event.clone()).collect::<Vec<_>>(),
        vec![
            Event::SegmentAlloc { addr: 4096, bytes: 2097152, stream: 0, pool: Pool::Small },
            Event::Alloc {
                id: 1,
                addr: 4096,
                requested_bytes: 100,
                block_bytes: 512,
                stream: 0,
                pool: Pool::Small,
                callsite: 0
            },
        ]
    );
    assert!(im.header.notes.iter().any(|n| n.contains("without a trace")));
    // The import says so, and how to record a history.
    assert!(im
        .report
        .warnings
        .iter()
        .any(|w| w.contains("no allocation history") && w.contains("_record_memory_history")));
    // The analyses say there is nothing to analyse.
    let trace = analyzer::model::Trace::from_records(Path::new("bare.pickle"), im.header.clone(), im.records.clone());
    let why = analyzer::source::input::nothing_to_analyse(&trace).expect("nothing to analyse");
    assert!(why.contains("nothing to analyse") && why.contains("_record_memory_history"), "{why}");
}

#[test]
fn options_reach_the_header() {
    let opts = ImportOptions {
        device: 0,
        capacity_bytes: Some(2 << 30),
        device_name: Some("NVIDIA H100 80GB HBM3".into()),
        device_total_bytes: Some(85017493504),
        torch_version: Some(recorder::engine::version::TorchVersion::new(2, 12)),
        releases_limit: None,
    };
    let im = import_file(&fixture("torch/frag_oom.default.pickle"), &opts).unwrap();
    assert_eq!(im.header.capacity_bytes, 2 << 30);
    // The limit releases are told apart against is not a recorded limit.
    let classified = ImportOptions { capacity_bytes: None, releases_limit: Some(2 << 30), ..opts.clone() };
    assert_eq!(import_file(&fixture("torch/frag_oom.default.pickle"), &classified).unwrap().header.capacity_bytes, 0);
    assert_eq!(im.header.device_name, "NVIDIA H100 80GB HBM3");
    assert_eq!(im.header.device_total_bytes, 85017493504);
    assert_eq!(im.header.torch_version, "2.12");
    assert_eq!(im.header.source, recorder::trace::Source::ImportedTorch);
    let limit = im.records.iter().find_map(|r| match r.event {
        Event::Oom { limit_bytes, .. } => Some(limit_bytes),
        _ => None,
    });
    assert_eq!(limit, Some(2 << 30));
}

#[test]
fn full_ring_buffer_counts_as_overflowed() {
    // seed_experiments with `allocator_settings.trace_alloc_max_entries = 24` added: the trace
    // holds exactly as many entries as the buffer, so older ones may be lost, even though
    // nothing in the trace contradicts the final segments.
    let im = import("seed_experiments.max24.pickle");
    assert!(im.report.ring_buffer_overflowed);
    assert_eq!((im.report.initial_segments, im.report.initial_live_blocks), (0, 0));
    assert!(im.report.warnings.iter().any(|w| w.contains("trace_alloc_max_entries = 24")), "{:?}", im.report.warnings);
    assert!(im.header.notes.iter().any(|n| n.contains("ring buffer overflowed")));
}
