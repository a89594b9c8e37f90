//! A trace as Chrome trace-event JSON, which ui.perfetto.dev and chrome://tracing open.
//!
//! What it holds, in one process ("alloctrace: TRACE"):
//! - **Counter tracks** `reserved`, `allocated` and `active` (bytes, all streams), and the same
//!   per stream (`reserved, stream 1`) when the trace has more than one. Streams are named
//!   `stream 0 (default)` for the legacy default stream, then `stream 1`, `stream 2`, ... in
//!   order of first use; `otherData.streams` gives each one's handle. Allocated counts blocks
//!   from their allocation to the program's free; active until the free completes (PyTorch's
//!   `allocated_bytes` and `active_bytes`); reserved is what the device gave the allocator.
//!   Where the trace does not know block sizes (an imported snapshot), a block counts as its
//!   request rounded as the allocator rounds it, and `otherData` says so.
//! - **Instant events** on the `events` thread: every OOM, cache release and mark (phases and
//!   annotations).
//! - **Slices** on the `iterations` thread: one per iteration, by the rule every analysis uses
//!   ([`crate::model::iterations`]: iteration marks, else a repeated annotation such as PyTorch's
//!   `Optimizer.zero_grad`), from its start to the next one (the last one to the end of the
//!   trace). An iteration mark is named by its text, and is not also an instant; an iteration
//!   from an annotation is named `iteration N (the annotation "...")`, and the annotation stays
//!   an instant on the `events` thread.
//!
//! Counters are downsampled per time bucket with the fold of [`crate::analysis::timeline`]: each bucket
//! keeps per track its first, lowest, highest and last value where they happened, so every
//! peak is kept exactly, and the file's size depends on the number of buckets, not of events
//! (at most 4 counter events per bucket and track).

use crate::analysis::timeline::{Mode, Timeline};
use crate::model::iterations::IterationSource;
use crate::model::units::fmt_bytes;
use crate::model::Trace;
use anyhow::Result;
use recorder::engine::round_size;
use recorder::trace::{Event, MarkKind};
use rustc_hash::FxHashMap;
use serde::Serialize;
use serde_json::{json, Value};
use std::io::Write;

/// The export's options.
#[derive(Debug, Clone)]
pub struct PerfettoOptions {
    /// Time buckets per counter track (at least 2).
    pub buckets: usize,
}

impl Default for PerfettoOptions {
    fn default() -> Self {
        PerfettoOptions { buckets: 2000 }
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PerfettoStats {
    /// Events read.
    pub events: u64,
    pub streams: u64,
    pub counter_events: u64,
    pub instant_events: u64,
    pub slices: u64,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_active_bytes: u64,
    /// False where the trace does not know block sizes (an imported snapshot): allocated and
    /// active bytes count each request rounded as the allocator rounds it (`summary` then
    /// leaves peak allocated unknown).
    pub block_sizes_known: bool,
    /// Where the trace was damaged (the export covers what came before).
    pub damage: Option<String>,
}

const SERIES: [&str; 3] = ["reserved", "allocated", "active"];
const PID: u64 = 1;
const TID_EVENTS: u64 = 1;
const TID_ITERATIONS: u64 = 2;

/// Reserved, allocated and active bytes of one stream (or all), folded over time.
struct Track {
    name: String,
    handle: u64,
    values: [u64; 3],
    fold: Timeline,
}

impl Track {
    fn new(name: String, handle: u64, buckets: usize) -> Self {
        Track { name, handle, values: [0; 3], fold: Timeline::new(&SERIES, buckets, Mode::Envelope) }
    }
    fn push(&mut self, t: u64) {
        let v = self.values.map(|v| v as f64);
        self.fold.push(t, &v);
    }
}

struct LiveBlock {
    bytes: u64,
    stream: u64,
    free_requested: bool,
}

fn ts_us(time_ns: u64) -> f64 {
    time_ns as f64 / 1000.0
}

/// Most streams that get tracks of their own.
pub const MAX_STREAM_TRACKS: usize = 64;

/// Writes `trace` (read by the one opener: a trace or a snapshot) into `out` as Chrome
/// trace-event JSON (`alloctrace export` puts it in a file).
pub fn export(trace: &Trace, out: &mut dyn Write, opts: &PerfettoOptions) -> Result<PerfettoStats> {
    let header = trace.header.clone();
    let buckets = opts.buckets.max(2);
    let mut total = Track::new(String::new(), 0, buckets);
    let mut streams: Vec<Track> = Vec::new();
    let mut stream_index: FxHashMap<u64, usize> = FxHashMap::default();
    let mut live: crate::model::ids::IdMap<LiveBlock> = Default::default();
    let mut sizes_known = true;
    let mut instants: Vec<Value> = Vec::new();
    let mut iterations: Vec<(u64, String)> = Vec::new();
    let mut last_t = 0u64;
    let mut stats = PerfettoStats::default();

    // Streams are numbered in the order the trace first names them (an OOM's included), as in
    // every other output: the trace's own numbering ([`crate::model::Facts::streams`]).
    let names = &trace.facts.streams;
    // Per-stream tracks for at most MAX_STREAM_TRACKS streams: past that (a trace that names a
    // new stream at every allocation) only the all-streams tracks are written.
    let mut too_many_streams = false;
    let mut stream_of = |handle: u64, streams: &mut Vec<Track>| -> Option<usize> {
        if let Some(&s) = stream_index.get(&handle) {
            return (s != usize::MAX).then_some(s);
        }
        if streams.len() >= MAX_STREAM_TRACKS {
            too_many_streams = true;
            stream_index.insert(handle, usize::MAX);
            return None;
        }
        // The one naming of streams (crate::model::streams), as in every other output.
        let name = names.name(handle);
        streams.push(Track::new(name, handle, buckets));
        stream_index.insert(handle, streams.len() - 1);
        Some(streams.len() - 1)
    };

    // Where each iteration starts (event indices, ascending), by the one rule.
    let found = trace.facts.iterations.iterations();
    let starts: &[u64] = found.as_ref().map_or(&[], |it| &it.starts);
    let by_marks = found.as_ref().is_some_and(|it| it.source == IterationSource::Marks);
    let source = found.as_ref().map(|it| it.source.to_string()).unwrap_or_default();
    let mut next_start = 0usize;
    let scanned = trace.scan(|i, r| {
        let t = r.time_ns;
        let starts_iteration = starts.get(next_start) == Some(&i);
        if starts_iteration {
            next_start += 1;
            if !by_marks {
                iterations.push((t, format!("iteration {next_start} ({source})")));
            }
        }
        last_t = last_t.max(t);
        // (stream, series, +bytes or -bytes)
        let mut change = |stream: u64, deltas: &[(usize, i128)], streams: &mut Vec<Track>| {
            let s = stream_of(stream, streams);
            for &(k, d) in deltas {
                let apply = |v: &mut u64| *v = (*v as i128 + d).clamp(0, u64::MAX as i128) as u64;
                if let Some(s) = s {
                    apply(&mut streams[s].values[k]);
                }
                apply(&mut total.values[k]);
            }
            if let Some(s) = s {
                streams[s].push(t);
            }
            total.push(t);
        };
        match &r.event {
            Event::Alloc { id, requested_bytes, block_bytes, stream, .. } => {
                let bytes = if *block_bytes > 0 {
                    *block_bytes
                } else {
                    sizes_known = false;
                    round_size(&header.config, *requested_bytes)
                };
                live.insert(*id, LiveBlock { bytes, stream: *stream, free_requested: false });
                change(*stream, &[(1, bytes as i128), (2, bytes as i128)], &mut streams);
            }
            Event::FreeRequested { id, .. } => {
                if let Some(b) = live.get_mut(id).filter(|b| !b.free_requested) {
                    b.free_requested = true;
                    let (stream, bytes) = (b.stream, b.bytes);
                    change(stream, &[(1, -(bytes as i128))], &mut streams);
                }
            }
            Event::FreeCompleted { id, .. } => {
                if let Some(b) = live.remove(id) {
                    let d = -(b.bytes as i128);
                    // A completion without a request: the source freed in one step.
                    let deltas: &[(usize, i128)] = if b.free_requested { &[(2, d)] } else { &[(1, d), (2, d)] };
                    change(b.stream, deltas, &mut streams);
                }
            }
            Event::SegmentAlloc { bytes, stream, .. } | Event::SegmentMap { bytes, stream, .. } => {
                change(*stream, &[(0, *bytes as i128)], &mut streams);
            }
            Event::SegmentFree { bytes, stream, .. } | Event::SegmentUnmap { bytes, stream, .. } => {
                change(*stream, &[(0, -(*bytes as i128))], &mut streams);
            }
            Event::Oom {
                requested_bytes,
                alloc_bytes,
                device_free_bytes,
                reserved_bytes,
                allocated_bytes,
                limit_bytes,
                ..
            } => {
                instants.push(json!({
                    "name": format!("OOM: {} requested", fmt_bytes(*requested_bytes)),
                    "cat": "oom", "ph": "i", "s": "p", "ts": ts_us(t), "pid": PID, "tid": TID_EVENTS,
                    "args": {
                        "requested_bytes": requested_bytes, "alloc_bytes": alloc_bytes,
                        "device_free_bytes": device_free_bytes, "reserved_bytes": reserved_bytes,
                        "allocated_bytes": allocated_bytes, "limit_bytes": limit_bytes,
                    },
                }));
            }
            Event::CacheRelease { cause, bytes, segments } => {
                instants.push(json!({
                    "name": format!("cache release ({}): {}", cause.as_str(), fmt_bytes(*bytes)),
                    "cat": "cache_release", "ph": "i", "s": "t", "ts": ts_us(t), "pid": PID, "tid": TID_EVENTS,
                    "args": { "cause": cause.as_str(), "bytes": bytes, "segments": segments },
                }));
            }
            // An iteration mark that starts an iteration starts a slice (which shows where it is);
            // other marks are instants.
            Event::Mark { kind: MarkKind::Iteration, text } if starts_iteration && by_marks => {
                iterations.push((t, if text.is_empty() { format!("iteration {next_start}") } else { text.clone() }))
            }
            Event::Mark { kind, text } => {
                instants.push(json!({
                    "name": text, "cat": kind.as_str(), "ph": "i", "s": "t", "ts": ts_us(t),
                    "pid": PID, "tid": TID_EVENTS,
                }));
            }
            Event::Split { .. }
            | Event::Merge { .. }
            | Event::CallSite { .. }
            | Event::Snapshot { .. }
            | Event::DeviceMemInfo { .. }
            | Event::Dropped { .. }
            | Event::SegmentPool { .. } => {}
        }
    })?;
    stats.damage = scanned.damage_warning();
    stats.events = scanned.events;
    stats.streams = stream_index.len() as u64;

    let stream_handles: serde_json::Map<String, Value> =
        streams.iter().map(|s| (s.name.clone(), Value::String(format!("0x{:x}", s.handle)))).collect();
    let per_stream = streams.len() > 1 && !too_many_streams;
    let mut tracks = vec![total];
    if per_stream {
        tracks.append(&mut streams);
    }

    let mut first = true;
    let mut emit = |out: &mut dyn Write, v: &Value| -> std::io::Result<()> {
        out.write_all(if first { b"\n" } else { b",\n" })?;
        first = false;
        serde_json::to_writer(&mut *out, v).map_err(std::io::Error::from)
    };
    let write = || -> std::io::Result<()> {
        out.write_all(b"{\"traceEvents\":[")?;
        let name = format!("alloctrace: {}", trace.name());
        emit(out, &json!({"name": "process_name", "ph": "M", "pid": PID, "args": {"name": name}}))?;
        for (tid, n) in [(TID_EVENTS, "events"), (TID_ITERATIONS, "iterations")] {
            emit(out, &json!({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": n}}))?;
        }
        for (i, track) in tracks.into_iter().enumerate() {
            let d = track.fold.finish();
            for (k, series) in SERIES.iter().enumerate() {
                let name = if i == 0 { series.to_string() } else { format!("{series}, {}", track.name) };
                let points = d.points(k);
                if i == 0 {
                    let peak = points.iter().map(|p| p.1 as u64).max().unwrap_or(0);
                    *[&mut stats.peak_reserved_bytes, &mut stats.peak_allocated_bytes, &mut stats.peak_active_bytes]
                        [k] = peak;
                }
                for (x, v) in points {
                    let e = json!({"name": name, "ph": "C", "ts": ts_us(x), "pid": PID, "args": {"bytes": v as u64}});
                    emit(out, &e)?;
                    stats.counter_events += 1;
                }
            }
        }
        for e in &instants {
            emit(out, e)?;
        }
        stats.instant_events = instants.len() as u64;
        for (i, (start, text)) in iterations.iter().enumerate() {
            let end = iterations.get(i + 1).map(|n| n.0).unwrap_or(last_t).max(*start);
            let e = json!({"name": text, "cat": "iteration", "ph": "X", "ts": ts_us(*start),
                           "dur": ts_us(end - start), "pid": PID, "tid": TID_ITERATIONS});
            emit(out, &e)?;
            stats.slices += 1;
        }
        out.write_all(b"\n],\"displayTimeUnit\":\"ms\",\"otherData\":")?;
        stats.block_sizes_known = sizes_known;
        let other = json!({
            "trace": trace.path.display().to_string(),
            "source": header.source.as_str(),
            "device_name": header.device_name,
            "alloc_conf": header.alloc_conf,
            "capacity_bytes": header.capacity_bytes,
            "streams": stream_handles,
            "block_sizes": if sizes_known { "recorded" } else { "estimated: requests rounded as the allocator rounds them" },
            "counter_buckets": buckets,
        });
        serde_json::to_writer(&mut *out, &other)?;
        out.write_all(b"}\n")
    };
    write()?;
    Ok(stats)
}
