//! `alloctrace export`: the memory-viz snapshot reads back through `alloctrace import torch`
//! with the same peaks and segment events, on every shipped trace; the Perfetto JSON parses,
//! keeps the true peak, and stays small however many events the trace has. And
//! `alloctrace --version` names the trace format.

use recorder::trace::{Event, TraceReader};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_alloctrace"))
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("alloctrace-export-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn ok(args: &[&str]) -> String {
    let o = bin().args(args).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "alloctrace {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).unwrap()
}

/// The segment events of a trace, without their times (an import counts time from its first
/// entry, in microseconds).
fn segment_events(path: &Path) -> Vec<String> {
    let mut r = TraceReader::open(path).unwrap();
    let mut out = Vec::new();
    for rec in r.by_ref() {
        let e = rec.event;
        if let Event::SegmentAlloc { .. }
        | Event::SegmentFree { .. }
        | Event::SegmentMap { .. }
        | Event::SegmentUnmap { .. } = e
        {
            out.push(format!("{e:?}"));
        }
    }
    assert!(!r.end().is_partial(), "{}", path.display());
    out
}

fn shipped_traces() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("traces"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "atrace"))
        .collect();
    v.sort();
    v
}

#[test]
fn memory_viz_round_trips_every_shipped_trace() {
    let traces = shipped_traces();
    assert!(traces.len() >= 12, "{traces:?}");
    for t in traces {
        let name = t.file_stem().unwrap().to_string_lossy().to_string();
        let pickle = tmp(&format!("{name}.pickle"));
        let back = tmp(&format!("{name}.back.atrace"));
        let before = json(&["summary", "--json", t.to_str().unwrap()]);
        let stats =
            json(&["export", t.to_str().unwrap(), "--format", "memory-viz", "-o", pickle.to_str().unwrap(), "--json"]);
        assert!(stats["entries"].as_u64().unwrap() > 0, "{name}: {stats}");
        let mut import = vec!["import", "torch", pickle.to_str().unwrap(), "-o", back.to_str().unwrap(), "--json"];
        let cap = before["capacity_bytes"].as_u64().map(|c| c.to_string());
        if let Some(c) = &cap {
            import.extend(["--capacity", c]);
        }
        let report = json(&import);
        assert_eq!(report["warnings"], serde_json::json!([]), "{name}: the import found the snapshot inconsistent");
        assert_eq!(report["ring_buffer_overflowed"], false, "{name}");
        let after = json(&["summary", "--json", back.to_str().unwrap()]);
        for key in ["peak_reserved_bytes", "peak_requested_bytes", "num_ooms", "num_device_alloc", "num_device_free"] {
            assert_eq!(before[key], after[key], "{name}: {key}");
        }
        assert_eq!(
            before["peak_reserved"]["event"].as_u64().is_some(),
            after["peak_reserved"]["event"].as_u64().is_some()
        );
        let (a, b) = (segment_events(&t), segment_events(&back));
        assert_eq!(a.len(), b.len(), "{name}: segment events");
        assert_eq!(a, b, "{name}: segment events");
    }
}

/// The snapshot's final `segments` agree with its entries: a segment still held at the end is
/// listed with its live blocks, and the blocks tile it.
#[test]
fn memory_viz_final_state_lists_live_blocks() {
    let t = root().join("traces/leak_list_append.default.atrace");
    let pickle = tmp("leak.pickle");
    let s = json(&["export", t.to_str().unwrap(), "--format", "memory-viz", "-o", pickle.to_str().unwrap(), "--json"]);
    let end = json(&["summary", "--json", t.to_str().unwrap()]);
    assert_eq!(s["live_blocks"], end["end_live_blocks"]);
    let bytes = std::fs::read(&pickle).unwrap();
    let pk = analyzer::source::import::pickle::parse(&bytes).unwrap();
    let segs = pk.seq(pk.get(pk.root, "segments").unwrap()).unwrap();
    assert_eq!(segs.len() as u64, s["segments"].as_u64().unwrap());
    let mut reserved = 0;
    for &seg in segs {
        let addr = pk.u64(pk.get(seg, "address").unwrap()).unwrap();
        let total = pk.u64(pk.get(seg, "total_size").unwrap()).unwrap();
        reserved += total;
        let mut cursor = addr;
        for &b in pk.seq(pk.get(seg, "blocks").unwrap()).unwrap() {
            assert_eq!(pk.u64(pk.get(b, "address").unwrap()).unwrap(), cursor, "blocks tile the segment");
            cursor += pk.u64(pk.get(b, "size").unwrap()).unwrap();
        }
        assert_eq!(cursor, addr + total);
    }
    assert_eq!(reserved, end["end_reserved_bytes"].as_u64().unwrap());
}

/// Counter events of one track, in order.
fn counter(doc: &Value, name: &str) -> Vec<(f64, u64)> {
    doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == name)
        .map(|e| (e["ts"].as_f64().unwrap(), e["args"]["bytes"].as_u64().unwrap()))
        .collect()
}

#[test]
fn perfetto_keeps_the_peaks_oom_and_marks() {
    let t = root().join("traces/frag_oom.default.atrace");
    let out = tmp("frag.json");
    let s = json(&["export", t.to_str().unwrap(), "--format", "perfetto", "-o", out.to_str().unwrap(), "--json"]);
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let summary = json(&["summary", "--json", t.to_str().unwrap()]);
    assert_eq!(s["block_sizes_known"], false, "{s}");
    let reserved = counter(&doc, "reserved");
    assert_eq!(reserved.iter().map(|p| p.1).max(), summary["peak_reserved_bytes"].as_u64());
    // An imported snapshot does not know block sizes: allocated is estimated, and says so.
    assert_eq!(summary["peak_allocated_bytes"], Value::Null);
    assert!(doc["otherData"]["block_sizes"].as_str().unwrap().starts_with("estimated"));
    assert!(counter(&doc, "allocated").iter().all(|p| p.1 <= summary["peak_reserved_bytes"].as_u64().unwrap()));
    assert!(reserved.windows(2).all(|w| w[0].0 <= w[1].0), "counter samples in time order");
    let ooms: Vec<&Value> = doc["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "oom").collect();
    assert_eq!(ooms.len() as u64, summary["num_ooms"].as_u64().unwrap());
    assert_eq!(ooms[0]["ph"], "i");

    // Iteration marks become slices, other marks instants.
    let t = root().join("traces/recorded_rust_workload.atrace");
    let out = tmp("rust.json");
    let s = json(&["export", t.to_str().unwrap(), "--format", "perfetto", "-o", out.to_str().unwrap(), "--json"]);
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let slices = doc["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").count();
    assert_eq!(slices as u64, s["slices"].as_u64().unwrap());
    let summary = json(&["summary", "--json", t.to_str().unwrap()]);
    assert_eq!(s["peak_reserved_bytes"], summary["peak_reserved_bytes"]);
    assert_eq!(s["peak_allocated_bytes"], summary["peak_allocated_bytes"]);
    assert_eq!(s["block_sizes_known"], true);
    assert!(slices > 0);
}

/// 200,000 events in 50 buckets: at most 4 samples per bucket and track, one track per series
/// and stream (three streams here: all, and two of their own), and still the exact peak.
#[test]
fn perfetto_stays_small_and_keeps_every_peak() {
    let t = tmp("synth.atrace");
    ok(&["synth", "--events", "200000", "--seed", "3", "--streams", "2", "-o", t.to_str().unwrap()]);
    let out = tmp("synth.json");
    let s = json(&[
        "export",
        t.to_str().unwrap(),
        "--format",
        "perfetto",
        "--buckets",
        "50",
        "-o",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(s["streams"], 2);
    let tracks = 3 * (1 + 2);
    assert!(s["counter_events"].as_u64().unwrap() <= 4 * 50 * tracks, "{s}");
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let summary = json(&["summary", "--json", t.to_str().unwrap()]);
    assert_eq!(counter(&doc, "reserved").iter().map(|p| p.1).max(), summary["peak_reserved_bytes"].as_u64());
    assert_eq!(counter(&doc, "allocated").iter().map(|p| p.1).max(), summary["peak_allocated_bytes"].as_u64());
    let per_stream = counter(&doc, "reserved, stream 1");
    assert!(!per_stream.is_empty());
    assert_eq!(doc["otherData"]["streams"].as_object().unwrap().len(), 2);
    assert!(std::fs::metadata(&out).unwrap().len() < 200_000);
}

#[test]
fn export_refuses_a_foreign_file_in_one_line() {
    let o = bin()
        .args([
            "export",
            root().join("README.md").to_str().unwrap(),
            "--format",
            "perfetto",
            "-o",
            tmp("x.json").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(e.contains("README.md"), "{e}");
}

#[test]
fn version_names_the_trace_format() {
    let v = ok(&["--version"]);
    assert_eq!(
        v.trim(),
        format!("alloctrace {} (trace format {})", env!("CARGO_PKG_VERSION"), recorder::trace::FORMAT_VERSION)
    );
}

/// Streams are numbered once, in the order the trace first names them, an OOM's included: a side
/// stream that first appears in an OOM is "stream 1" everywhere, and the next one "stream 2" (the
/// export numbered only streams whose bytes changed, so it called the second "stream 1").
#[test]
fn perfetto_numbers_streams_as_every_output() {
    use recorder::trace::{Header, Pool, Record, Source, TraceWriter};
    let path = tmp("oom-stream.atrace");
    let mut w = TraceWriter::create(&path, &Header::new(Source::Recorded)).unwrap();
    let mut t = 0u64;
    let mut put = |w: &mut TraceWriter<_>, event: Event| {
        t += 1;
        w.write_owned(Record { time_ns: t, event }).unwrap();
    };
    let alloc = |id: u64, stream: u64| Event::Alloc {
        id,
        addr: 0,
        requested_bytes: 1 << 20,
        block_bytes: 0,
        stream,
        pool: Pool::Large,
        callsite: 0,
    };
    put(&mut w, alloc(1, 0));
    put(
        &mut w,
        Event::Oom {
            requested_bytes: 1 << 30,
            alloc_bytes: 1 << 30,
            device_free_bytes: 0,
            reserved_bytes: 2 << 20,
            allocated_bytes: 1 << 20,
            limit_bytes: 0,
            stream: 0xb0,
        },
    );
    put(&mut w, alloc(2, 0xc0));
    put(&mut w, alloc(3, 0));
    w.finish().unwrap();
    let out = tmp("oom-stream.json");
    ok(&["export", path.to_str().unwrap(), "--format", "perfetto", "-o", out.to_str().unwrap()]);
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let streams = doc["otherData"]["streams"].as_object().unwrap();
    assert_eq!(streams.get("stream 2").and_then(|h| h.as_str()), Some("0xc0"), "{streams:?}");
}

/// A snapshot names the private pool only of the segments it holds at the end: the export says
/// how many private-pool segments were freed before (a re-import counts them as the default
/// pools') instead of losing them without a word.
#[test]
fn memory_viz_says_which_private_pools_it_cannot_keep() {
    let t = root().join("traces/recorded_graph_pools.atrace");
    let out = tmp("pools.pickle");
    let args = ["export", t.to_str().unwrap(), "--format", "memory-viz", "-o", out.to_str().unwrap()];
    let o = bin().args(args).arg("--json").output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let s: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(s["private_pool_segments_freed"].as_u64().unwrap() > 0, "{s}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("segment(s) of private pools"));
    let t = root().join("traces/frag_oom.default.atrace");
    let s = json(&["export", t.to_str().unwrap(), "--format", "memory-viz", "-o", out.to_str().unwrap(), "--json"]);
    assert_eq!(s["private_pool_segments_freed"], 0);
}

/// An export re-imported answers at the same limit on the same device: the snapshot has no place
/// for them, so the export carries them under a key of its own, which the importer reads (a
/// round trip lost the 2 GiB limit, and `explain` answered at an inferred 1.80 GiB).
#[test]
fn memory_viz_round_trip_keeps_the_limit_and_device() {
    let t = root().join("traces/frag_oom.default.atrace");
    let out = tmp("round-trip.pickle");
    ok(&["export", t.to_str().unwrap(), "--format", "memory-viz", "-o", out.to_str().unwrap()]);
    let a = json(&["summary", "--json", t.to_str().unwrap()]);
    let b = json(&["summary", "--json", out.to_str().unwrap()]);
    for key in ["capacity_bytes", "capacity_source", "device_total_bytes", "device_name"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert_eq!(b["capacity_source"], "recorded");
    // A limit given on the command line still wins.
    let c = json(&["replay", "--json", out.to_str().unwrap(), "--capacity", "3GiB"]);
    assert_eq!((c["capacity_bytes"].clone(), c["capacity_source"].clone()), ((3u64 << 30).into(), "given".into()));
}
