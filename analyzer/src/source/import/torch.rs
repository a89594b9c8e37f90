//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`, `memory_snapshot()`) turned
//! into alloctrace trace records.
//!
//! # Mapping
//! Every trace entry of the chosen device becomes events, in entry order:
//!
//! | entry | events |
//! |---|---|
//! | `alloc` | [`Event::Alloc`] (ids from 1 in order; `block_bytes` 0 = unknown; pool by `ceil(size/512)*512 <= 1 MiB`) |
//! | `free_requested`, `free_completed` | the free events, with the id of the block live at `addr` |
//! | `segment_alloc`/`_free`/`_map`/`_unmap` | segment events (pool: see below) |
//! | `oom` | [`Event::Oom`] (`allocated_bytes` is an estimate: the live blocks' sizes rounded as `round_size` would) |
//! | `snapshot` | [`Event::Snapshot`] |
//! | `frames` | an interned [`Event::CallSite`], written once before its first use |
//! | `external_annotations` | [`Event::Mark`] of kind `Annotation` (`"forward START"`), merged by time |
//! | `alloctrace_trace` | the limit, device and PyTorch release of the trace an alloctrace export was made from ([`EXPORTED_KEY`]), where the user gives none |
//! | `alloctrace_predicted` | a header note: the stream was predicted, not recorded ([`PREDICTED_KEY`]); its `START` annotations become phase and iteration marks |
//!
//! Times are nanoseconds since the first entry's `time_us`; an annotation older than that, or
//! a timestamp going backwards, is clamped so that times never decrease.
//!
//! **Segment pools.** Small-pool segments are always exactly 2 MiB (`kSmallBuffer`), large ones
//! at least 10 MiB, so a `segment_alloc` of 2 MiB is small and anything else large; a
//! `segment_free` takes the pool its `segment_alloc` had. Expandable segments map pages of
//! 2 MiB (small) or `large_segment_size` (large), so a map is looked up in the final `segments`
//! list (the expandable segment whose range holds it, and its `segment_type`), then in the
//! ranges mapped earlier in the trace (a map adjacent to one is its continuation), and failing
//! both a size that is a multiple of the large page is large, any other small.
//!
//! **empty_cache inference.** PyTorch does not trace `empty_cache()`, and its own releases look
//! the same in a snapshot. A *burst* is a maximal run of consecutive `segment_free`/
//! `segment_unmap` entries; after each burst one [`Event::CacheRelease`] with the burst's bytes
//! and segment count is written. Every release of PyTorch's own happens inside `malloc`, for a
//! request that missed the cache (`c10/cuda/CUDACachingAllocator.cpp`, `malloc`): garbage
//! collection first (only with a memory fraction), then, when `alloc_block` fails,
//! `release_available_cached_blocks` (only with `max_split_size_mb`) and last the full
//! `release_cached_blocks` before the retry; so the next allocation-related entry (`alloc`,
//! `segment_alloc`, `segment_map`, `oom`) after such a burst is that request's `segment_alloc`/
//! `segment_map` or its `oom`. The cause is, in this order:
//! - `OomRetry` when that next entry is an `oom`;
//! - `EmptyCache` when it is an `alloc` (a cache hit) or there is none: no request was failing;
//! - `EmptyCache` when a freed segment could have served the request that followed (same
//!   stream and pool, large enough, allowed by the `max_split_size` rules) and was free before
//!   the burst (no block in it completed a stream-ordered free since the last
//!   allocation-related entry, as the release's own synchronization would): there was no miss;
//! - for a next `segment_alloc`/`segment_map` of `S` bytes, with `R` reserved before the burst
//!   and the limit `L` (`--capacity`): `GarbageCollection` when the settings have
//!   `garbage_collection_threshold` `t`, `R > t * L` and only whole large segments went;
//!   else the request was failing when `R + S > L` (PyTorch's fraction check in `alloc_block`):
//!   `Oversize` when `max_split_size_mb` is set and every segment freed was an oversize large
//!   one, else `OomRetry`; and when it was not failing, `EmptyCache`. With the limit unknown,
//!   a request can only have failed if `R + S` would exceed every level reserved so far (the
//!   limit is at least that) and the trace has an `oom` (a limit or a full device was in
//!   force), or `R + S` exceeds the device's memory when that is known; otherwise the burst is
//!   the program's `empty_cache()`.
//!
//! **Ring buffer overflow.** The trace is a ring buffer: when it overflowed, the oldest entries
//! are gone. Like PyTorch's viewer, the importer starts from the final state (`segments` and
//! their active blocks) and undoes every entry from the newest to the oldest; whatever is left
//! existed before the first entry and is written at time 0, before everything else
//! (`SegmentAlloc`/`SegmentMap` per segment, then `Alloc` per live block):
//!
//! ```text
//! final state: segment S, block b1 live          trace (oldest first): free_completed b0, alloc b1
//! undo alloc b1          -> S, {}                undo free_completed b0 -> S, {b0}
//! start state: S and b0 (b0 was freed in the trace but never allocated in it: entries were lost)
//! ```
//! The trace counts as overflowed when `allocator_settings` says so (`trace_alloc_overflowed`,
//! or as many entries as `trace_alloc_max_entries`), or when something freed in the trace was
//! never allocated in it.

use super::pickle::{self, ContainerId, Pickle, PickleError, Value};
use recorder::engine::config::{AllocatorConfig, MIB, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
use recorder::engine::version::TorchVersion;
use recorder::engine::{allocation_size, pool_for, round_size};
use recorder::trace::{
    bound_frames, bounded_text, frames_cut_marker, Event, Frame, Header, MarkKind, Pool, Record, ReleaseCause, Source,
    MAX_CALLSITE_FRAMES, MAX_TEXT_BYTES, NO_CALLSITE,
};
use serde::Serialize;
use std::borrow::Cow;

/// The top-level key of a snapshot whose request stream was predicted (`alloctrace.predict`
/// runs a step under PyTorch's fake tensors and writes one): a dict whose `by` and `what` (text)
/// say what made it; it becomes a header note starting with [`PREDICTED_NOTE`].
pub const PREDICTED_KEY: &str = "alloctrace_predicted";
/// The top-level key of alloctrace's own memory-viz exports: what the trace knew that a snapshot
/// has no place for (its limit, its device, its PyTorch release), read back by the importer so
/// that an export re-imported answers at the same limit. PyTorch's viewers ignore it.
pub const EXPORTED_KEY: &str = "alloctrace_trace";
/// How the header note of a predicted trace starts ([`crate::model::Trace::predicted`]).
pub const PREDICTED_NOTE: &str = "predicted, not recorded: made by";
/// What a predicted trace's note says when the step used something whose memory is not
/// predicted (cuDNN convolution workspaces, chosen by cuDNN at run time): its requests are then
/// a lower bound on the real ones ([`crate::model::Trace::predicted_lower_bound`]).
pub const PREDICTED_LOWER_BOUND: &str = "not modelled here, so reserved memory may be under-predicted";
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What to import and the facts a snapshot does not hold.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Index into `device_traces` (and the `device` of `segments`).
    pub device: usize,
    /// The capacity limit the program ran under (snapshots do not store the memory fraction).
    pub capacity_bytes: Option<u64>,
    pub device_name: Option<String>,
    pub device_total_bytes: Option<u64>,
    /// The PyTorch release that wrote the snapshot (`--torch-version`): snapshots do not name
    /// it; without it the importer records the oldest release that writes what the snapshot
    /// holds, if that tells anything.
    pub torch_version: Option<TorchVersion>,
    /// Where no capacity is given: the limit the analyses will assume (the one the trace
    /// implies, [`crate::model::Trace::capacity`]), against which the cache releases are told
    /// apart (an out-of-memory retry asked for more than the limit; an `empty_cache()` did not),
    /// so that a replay at that limit follows the releases as they were classified. Not written
    /// into the header: the trace still says no limit was recorded.
    pub releases_limit: Option<u64>,
}

/// An imported snapshot: a trace header, its records and what the import found.
#[derive(Clone, Debug)]
pub struct Imported {
    pub header: Header,
    pub records: Vec<Record>,
    pub report: ImportReport,
}

/// Findings of an import.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ImportReport {
    /// Trace entries of the device.
    pub entries: u64,
    /// Records written.
    pub events: u64,
    /// Distinct call sites defined.
    pub callsites: u32,
    pub ring_buffer_overflowed: bool,
    /// Segments that existed before the first entry (written at time 0).
    pub initial_segments: u64,
    /// Blocks live before the first entry (written at time 0).
    pub initial_live_blocks: u64,
    /// Cache releases attributed to `empty_cache()`.
    pub inferred_empty_cache: u32,
    /// Anomalies: frees of unknown addresses, unparsable settings, clamped times, ...
    pub warnings: Vec<String>,
}

/// Why a snapshot could not be imported. Each message is whole (the inner error is part of it,
/// not a separate `source`), so printing the error chain does not repeat it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    #[error("cannot read {path}: {error}", path = path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("not a pickle (a PyTorch memory snapshot is a Python pickle, starting with byte 0x80; this starts with {found}): {error}")]
    NotAPickle { found: String, error: PickleError },
    #[error("corrupt pickle: {0}")]
    Pickle(PickleError),
    #[error("not a PyTorch memory snapshot: {0}")]
    NotASnapshot(String),
    #[error("device {device} has no trace: the snapshot has {devices} device trace(s)")]
    NoSuchDevice { device: usize, devices: usize },
    #[error("{path}: {error}", path = path.display())]
    InFile { path: PathBuf, error: Box<ImportError> },
}

impl From<PickleError> for ImportError {
    fn from(e: PickleError) -> Self {
        ImportError::Pickle(e)
    }
}

/// The warning for a snapshot without allocation history, with how to record one.
pub const NO_HISTORY: &str = "the snapshot holds no allocation history (its device trace is empty), only the \
segments at the moment it was taken: there is nothing to replay or analyse over time. Record one with \
torch.cuda.memory._record_memory_history(max_entries=1000000) before the job and \
torch.cuda.memory._dump_snapshot(\"snap.pickle\") at the end (or in an except torch.OutOfMemoryError: block)";

/// Most warnings kept in the report; the rest are counted in a last line.
const MAX_WARNINGS: usize = 100;

/// Bytes of text an import copies out of a snapshot into annotations, and again into call
/// sites: at most this much plus [`TEXT_BYTES_PER_INPUT_BYTE`] per byte of the snapshot.
/// A string referenced through the memo costs a few bytes of input however long it is, so
/// without a budget a small snapshot could make every annotation and call site a copy of the
/// longest text it holds. A real snapshot holds its call sites' frames once each and shares
/// them; its text stays far below the budget.
const TEXT_BUDGET_BYTES: usize = 16 << 20;
const TEXT_BYTES_PER_INPUT_BYTE: usize = 32;

/// The text budget of a snapshot of `input_bytes`.
fn text_budget(input_bytes: usize) -> usize {
    TEXT_BUDGET_BYTES.saturating_add(input_bytes.saturating_mul(TEXT_BYTES_PER_INPUT_BYTE))
}

/// Reads and imports a snapshot file; errors name the file.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Imported, ImportError> {
    let bytes = std::fs::read(path).map_err(|error| ImportError::Io { path: path.to_path_buf(), error })?;
    import_snapshot(&bytes, opts).map_err(|e| ImportError::InFile { path: path.to_path_buf(), error: Box::new(e) })
}

/// Imports a snapshot held in memory.
pub fn import_snapshot(bytes: &[u8], opts: &ImportOptions) -> Result<Imported, ImportError> {
    let pk = match pickle::parse(bytes) {
        Ok(pk) => pk,
        Err(source) if bytes.first() != Some(&0x80) => {
            return Err(ImportError::NotAPickle { found: describe_start(bytes), error: source })
        }
        Err(e) => return Err(e.into()),
    };
    let budget = text_budget(bytes.len());
    let snap = Snapshot::read(&pk, opts, budget)?;
    Ok(Importer::new(&pk, opts, &snap, budget).run())
}

fn describe_start(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "nothing (the input is empty)".into();
    }
    let head = &bytes[..bytes.len().min(16)];
    let text: String = head.iter().map(|&b| if (0x20..0x7f).contains(&b) { b as char } else { '.' }).collect();
    format!("`{text}`")
}

// ---------------------------------------------------------------------------------------------
// Reading the snapshot's structure.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    Other,
}

impl Action {
    fn parse(s: &str) -> Action {
        match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "snapshot" => Action::Snapshot,
            _ => Action::Other,
        }
    }

    fn is_release(self) -> bool {
        matches!(self, Action::SegmentFree | Action::SegmentUnmap)
    }

    fn is_alloc_related(self) -> bool {
        matches!(self, Action::Alloc | Action::SegmentAlloc | Action::SegmentMap | Action::Oom)
    }
}

/// One trace entry, decoded. For `oom`, `addr` holds `device_free`.
#[derive(Clone, Copy, Debug)]
struct Entry<'a> {
    action: Action,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: u64,
    frames: Value<'a>,
    /// The `action` string when it is not one we know.
    unknown: Option<&'a str>,
}

struct SegmentInfo<'a> {
    addr: u64,
    bytes: u64,
    stream: u64,
    pool: Pool,
    expandable: bool,
    /// `segment_pool_id`: `[0, 0]` for the default pools, else a CUDA graph's or a MemPool's.
    pool_id: [u64; 2],
    blocks: Vec<BlockInfo<'a>>,
}

#[derive(Clone, Copy)]
struct BlockInfo<'a> {
    addr: u64,
    block_bytes: u64,
    requested_bytes: u64,
    frames: Value<'a>,
}

struct Annotation {
    time_us: u64,
    kind: MarkKind,
    text: String,
}

/// The parts of a snapshot the importer uses.
struct Snapshot<'a> {
    has_trace: bool,
    entries: Vec<Entry<'a>>,
    segments: Vec<SegmentInfo<'a>>,
    annotations: Vec<Annotation>,
    alloc_conf: String,
    /// `trace_alloc_overflowed`, or the entry count reached `trace_alloc_max_entries`.
    settings_say_overflow: Option<String>,
    /// The oldest PyTorch release that writes a key the snapshot holds, and the key.
    written_since: Option<(TorchVersion, &'static str)>,
    /// `alloctrace_predicted`: the request stream was predicted, not recorded (what made it).
    predicted: Option<String>,
    /// [`EXPORTED_KEY`]: the exported trace's limit, device total and name, PyTorch release.
    exported: Exported,
    warnings: Vec<String>,
}

/// What an alloctrace export carries beside the snapshot ([`EXPORTED_KEY`]).
#[derive(Default)]
struct Exported {
    capacity_bytes: Option<u64>,
    device_total_bytes: Option<u64>,
    device_name: Option<String>,
    torch_version: Option<TorchVersion>,
}

fn describe(pk: &Pickle<'_>, v: Value<'_>) -> String {
    fn article(t: &str) -> &'static str {
        if t.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        }
    }
    match v {
        Value::List(_) | Value::Tuple(_) | Value::Set(_) => {
            let items = pk.items(v);
            let kind = v.type_name();
            let first = items.first().map(|i| i.type_name());
            match first {
                None => format!("an empty {kind}"),
                Some(t) if items.iter().all(|i| i.type_name() == t) => {
                    format!("a {kind} of {} {t}{}", items.len(), if items.len() == 1 { "" } else { "s" })
                }
                Some(_) => format!("a {kind} of {} mixed items", items.len()),
            }
        }
        Value::Dict(_) => {
            let keys: Vec<String> = pk
                .dict(v)
                .into_iter()
                .flatten()
                .take(6)
                .map(|(k, _)| match pk.str(k) {
                    Some(s) => format!("`{s}`"),
                    None => k.type_name().to_string(),
                })
                .collect();
            if keys.is_empty() {
                "an empty dict".into()
            } else {
                format!("a dict with keys {}", keys.join(", "))
            }
        }
        other => {
            let t = other.type_name();
            format!("{} {t}", article(t))
        }
    }
}

impl<'a> Snapshot<'a> {
    /// Notes an anomaly of the snapshot's structure (the first [`MAX_WARNINGS`] are kept).
    fn warn(&mut self, w: impl FnOnce() -> String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(w());
        } else if self.warnings.len() == MAX_WARNINGS {
            self.warnings.push("... and more anomalies of the same kinds".into());
        }
    }

    /// A size, address or time field: a negative or too wide integer reads as 0, with a warning
    /// naming the entry (it used to become a number near 2^64).
    fn field_u64(&mut self, pk: &Pickle<'a>, v: Value<'a>, entry: impl FnOnce() -> String, key: &str) -> u64 {
        match v {
            Value::Int(i) if i < 0 => {
                self.warn(|| format!("{} has a negative `{key}` ({i}); read as 0", entry()));
                0
            }
            Value::BigInt(_) if pk.u64(v).is_none() => {
                self.warn(|| format!("{} has a `{key}` that does not fit 64 bits; read as 0", entry()));
                0
            }
            _ => int_u64(pk, v),
        }
    }

    fn read(pk: &Pickle<'a>, opts: &ImportOptions, text_budget: usize) -> Result<Self, ImportError> {
        let expected = "expected a dict with `segments` and `device_traces`, or a list of segment dicts";
        let not_snapshot =
            || ImportError::NotASnapshot(format!("top-level object is {}; {expected}", describe(pk, pk.root)));
        let mut snap = Snapshot {
            has_trace: false,
            entries: Vec::new(),
            segments: Vec::new(),
            annotations: Vec::new(),
            alloc_conf: String::new(),
            settings_say_overflow: None,
            written_since: None,
            predicted: None,
            exported: Exported::default(),
            warnings: Vec::new(),
        };
        let segments = match pk.root {
            Value::Dict(_) => {
                let segments = pk.get(pk.root, "segments");
                let traces = pk.get(pk.root, "device_traces");
                if segments.is_none() || traces.is_none() {
                    return Err(not_snapshot());
                }
                let traces = traces.and_then(|t| pk.seq(t)).ok_or_else(|| {
                    ImportError::NotASnapshot(format!(
                        "`device_traces` is {}; expected a list",
                        describe(pk, traces.unwrap_or(Value::None))
                    ))
                })?;
                if let Some(&trace) = traces.get(opts.device) {
                    let trace = pk.seq(trace).ok_or_else(|| {
                        ImportError::NotASnapshot(format!(
                            "device trace {} is {}; expected a list",
                            opts.device,
                            describe(pk, trace)
                        ))
                    })?;
                    snap.has_trace = !trace.is_empty();
                    snap.read_entries(pk, trace)?;
                } else if !traces.is_empty() {
                    return Err(ImportError::NoSuchDevice { device: opts.device, devices: traces.len() });
                }
                // Other devices' histories: named, so that the user knows to pick one.
                let others: Vec<String> = traces
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| *k != opts.device)
                    .filter_map(|(k, t)| {
                        pk.seq(*t).filter(|e| !e.is_empty()).map(|e| format!("device {k} ({} entries)", e.len()))
                    })
                    .collect();
                if !others.is_empty() {
                    snap.warnings.push(format!(
                        "the snapshot also holds the history of {}; device {} was imported (--device N picks another)",
                        others.join(", "),
                        opts.device
                    ));
                }
                if let Some(settings) = pk.get(pk.root, "allocator_settings") {
                    snap.read_settings(pk, settings);
                }
                // Newer snapshots may carry the ring buffer's state beside the settings.
                snap.read_ring_buffer(pk, pk.root);
                if let Some(p) = pk.get(pk.root, PREDICTED_KEY) {
                    let text = |k| pk.get(p, k).and_then(|v| pk.str(v)).map(|s| bounded_text(s).into_owned());
                    let by = text("by").unwrap_or_else(|| "a prediction".into());
                    let what = text("what").map(|w| format!(" ({w})")).unwrap_or_default();
                    snap.predicted = Some(format!("{PREDICTED_NOTE} {by}{what}"));
                }
                if let Some(x) = pk.get(pk.root, EXPORTED_KEY) {
                    let num =
                        |k| pk.get(x, k).and_then(|v| pk.int(v)).and_then(|v| u64::try_from(v).ok()).filter(|&v| v > 0);
                    let text = |k| pk.get(x, k).and_then(|v| pk.str(v)).map(|s| bounded_text(s).into_owned());
                    snap.exported = Exported {
                        capacity_bytes: num("capacity_bytes"),
                        device_total_bytes: num("device_total_bytes"),
                        device_name: text("device_name").filter(|n| !n.is_empty()),
                        torch_version: text("torch_version").and_then(|v| TorchVersion::parse(&v).ok()),
                    };
                }
                if let Some(ann) = pk.get(pk.root, "external_annotations") {
                    snap.read_annotations(pk, ann, opts.device, text_budget);
                }
                segments.unwrap_or(Value::None)
            }
            Value::List(_) => {
                // `torch.cuda.memory_snapshot()`: only the segments.
                // Each distinct object is looked at once: one big dict referenced many times
                // costs one walk, not one per reference.
                let mut seen = rustc_hash::FxHashSet::default();
                let items = pk.items(pk.root);
                let segment_like = |s: Value<'a>| pk.get(s, "address").is_some() && pk.get(s, "total_size").is_some();
                if !items.iter().all(|&s| !seen.insert(s.container_id()) || segment_like(s)) {
                    return Err(not_snapshot());
                }
                pk.root
            }
            _ => return Err(not_snapshot()),
        };
        let segs = pk.seq(segments).ok_or_else(|| {
            ImportError::NotASnapshot(format!("`segments` is {}; expected a list", describe(pk, segments)))
        })?;
        snap.read_segments(pk, segs, opts.device)?;
        Ok(snap)
    }

    fn read_entries(&mut self, pk: &Pickle<'a>, trace: &[Value<'a>]) -> Result<(), ImportError> {
        // PyTorch writes every entry as a dict of its own. An entry object referenced again
        // (through the memo, or `DUP`: one byte of input each) is skipped, as repeated segments
        // and annotations are: walking one big dict at every reference cost time quadratic in
        // the input, and keeping a copy of it at every reference memory far past the input's.
        let mut seen: rustc_hash::FxHashSet<ContainerId> = rustc_hash::FxHashSet::default();
        let (mut repeated, mut first_repeated) = (0u64, 0usize);
        for (i, &e) in trace.iter().enumerate() {
            if e.container_id().is_some_and(|c| !seen.insert(c)) {
                if repeated == 0 {
                    first_repeated = i;
                }
                repeated += 1;
                continue;
            }
            let Some(items) = pk.dict(e) else {
                return Err(ImportError::NotASnapshot(format!(
                    "trace entry {i} is {}; expected a dict",
                    describe(pk, e)
                )));
            };
            let mut entry = Entry {
                action: Action::Other,
                addr: 0,
                size: 0,
                stream: 0,
                time_us: 0,
                frames: Value::None,
                unknown: None,
            };
            let mut have_action = false;
            for (k, v) in items {
                let Some(key) = pk.str(k) else { continue };
                match key {
                    "action" => {
                        if let Some(a) = pk.str(v) {
                            entry.action = Action::parse(a);
                            if entry.action == Action::Other {
                                entry.unknown = match v {
                                    Value::Str(s) => Some(s),
                                    _ => Some("?"),
                                };
                            }
                            have_action = true;
                        }
                    }
                    "addr" | "device_free" => entry.addr = self.field_u64(pk, v, || format!("trace entry {i}"), key),
                    "size" => entry.size = self.field_u64(pk, v, || format!("trace entry {i}"), key),
                    "stream" => entry.stream = int_u64(pk, v),
                    "time_us" => entry.time_us = self.field_u64(pk, v, || format!("trace entry {i}"), key),
                    "frames" => entry.frames = v,
                    _ => {}
                }
            }
            if !have_action {
                return Err(ImportError::NotASnapshot(format!("trace entry {i} has no `action` string")));
            }
            self.entries.push(entry);
        }
        if repeated > 0 {
            self.warn(|| {
                format!(
                    "{repeated} trace entries (the first: trace entry {first_repeated}) repeat an earlier entry object; skipped"
                )
            });
        }
        Ok(())
    }

    fn read_settings(&mut self, pk: &Pickle<'a>, s: Value<'a>) {
        let conf = pk.get(s, "PYTORCH_CUDA_ALLOC_CONF").and_then(|v| pk.str(v)).unwrap_or("").trim().to_string();
        self.alloc_conf = if conf.is_empty() { conf_from_settings(pk, s) } else { conf };
        self.read_ring_buffer(pk, s);
    }

    /// `trace_alloc_overflowed` and `trace_alloc_max_entries` (written by PyTorch 2.13 and
    /// later) in the dict `s`: whether the ring buffer dropped its oldest entries.
    fn read_ring_buffer(&mut self, pk: &Pickle<'a>, s: Value<'a>) {
        for key in ["trace_alloc_overflowed", "trace_alloc_max_entries"] {
            if self.written_since.is_none() && pk.get(s, key).is_some() {
                self.written_since = Some((TorchVersion::new(2, 13), key));
            }
        }
        if self.settings_say_overflow.is_some() {
            return;
        }
        if pk.get(s, "trace_alloc_overflowed").and_then(|v| pk.int(v)).unwrap_or(0) != 0 {
            self.settings_say_overflow = Some("allocator_settings.trace_alloc_overflowed is set".into());
        } else if let Some(max) = pk.get(s, "trace_alloc_max_entries").and_then(|v| pk.u64(v)) {
            if max > 0 && self.entries.len() as u64 >= max {
                self.settings_say_overflow =
                    Some(format!("the trace holds trace_alloc_max_entries = {max} entries, the ring buffer's size"));
            }
        }
    }

    fn read_annotations(&mut self, pk: &Pickle<'a>, ann: Value<'a>, device: usize, budget: usize) {
        let (mut seen, mut repeated) = (rustc_hash::FxHashSet::default(), Vec::new());
        let (mut text_bytes, mut over_budget) = (0usize, 0u64);
        for (i, &a) in pk.seq(ann).unwrap_or(&[]).iter().enumerate() {
            if pk.dict(a).is_none() {
                continue;
            }
            if !seen.insert(a.container_id()) {
                repeated.push(i);
                continue;
            }
            if let Some(d) = pk.get(a, "device").and_then(|v| pk.u64(v)) {
                if d != device as u64 {
                    continue;
                }
            }
            let time_us = pk.get(a, "time_us").map(|v| int_u64(pk, v)).unwrap_or(0);
            let name = pk.get(a, "name").and_then(|v| pk.str(v)).unwrap_or("");
            let stage = pk.get(a, "stage").and_then(|v| pk.str(v)).unwrap_or("");
            let (name, stage) = (bounded_text(name), bounded_text(stage));
            let mut text = match (name.is_empty(), stage.is_empty()) {
                (false, false) => format!("{name} {stage}"),
                (false, true) => name.to_string(),
                (true, false) => stage.to_string(),
                (true, true) => continue,
            };
            if recorder::trace::bound_text(&mut text) || text.contains("...[truncated: ") {
                self.warn(|| format!("annotation {i} is longer than {MAX_TEXT_BYTES} bytes; cut with a marker"));
            }
            text_bytes = text_bytes.saturating_add(text.len());
            if text_bytes > budget {
                over_budget += 1;
                continue;
            }
            // A predicted stream knows its phases and iterations: its `START` annotations are
            // phase marks (`forward`, `backward`, `optimizer`) and iteration marks.
            let (kind, text) = match (self.predicted.is_some(), stage.as_ref()) {
                (true, "START") if name.starts_with("iteration ") => (MarkKind::Iteration, name.into_owned()),
                (true, "START") => (MarkKind::Phase, name.into_owned()),
                (true, _) => continue,
                (false, _) => (MarkKind::Annotation, text),
            };
            self.annotations.push(Annotation { time_us, kind, text });
        }
        if over_budget > 0 {
            self.warn(|| {
                format!(
                    "{over_budget} annotations left out: their text passes the import's budget of {budget} bytes for this snapshot"
                )
            });
        }
        if let Some(first) = repeated.first() {
            let n = repeated.len();
            self.warn(|| {
                format!("{n} annotations (the first: annotation {first}) repeat an earlier annotation object; skipped")
            });
        }
        self.annotations.sort_by_key(|a| a.time_us);
    }

    fn read_segments(&mut self, pk: &Pickle<'a>, segs: &[Value<'a>], device: usize) -> Result<(), ImportError> {
        // A segment, block list or block is one object: a repeated reference (which PyTorch never
        // writes) is skipped, so a big one referenced many times is not walked many times.
        let (mut seen, mut repeated) = (rustc_hash::FxHashSet::default(), Vec::new());
        for (i, &s) in segs.iter().enumerate() {
            if pk.dict(s).is_none() {
                return Err(ImportError::NotASnapshot(format!("segment {i} is {}; expected a dict", describe(pk, s))));
            }
            if !seen.insert(s.container_id()) {
                repeated.push(format!("segment {i}"));
                continue;
            }
            if let Some(d) = pk.get(s, "device").and_then(|v| pk.u64(v)) {
                if d != device as u64 {
                    continue;
                }
            }
            let seg_name = || format!("segment {i}");
            let addr = pk.get(s, "address").map(|v| self.field_u64(pk, v, seg_name, "address")).unwrap_or(0);
            let bytes = pk.get(s, "total_size").map(|v| self.field_u64(pk, v, seg_name, "total_size")).unwrap_or(0);
            let pool = match pk.get(s, "segment_type").and_then(|v| pk.str(v)) {
                Some("small") => Pool::Small,
                Some("large") => Pool::Large,
                _ => segment_pool_by_size(bytes),
            };
            let mut seg = SegmentInfo {
                addr,
                bytes,
                stream: pk.get(s, "stream").map(|v| int_u64(pk, v)).unwrap_or(0),
                pool,
                expandable: pk.get(s, "is_expandable").and_then(|v| pk.int(v)).unwrap_or(0) != 0,
                pool_id: match pk.get(s, "segment_pool_id").and_then(|v| pk.seq(v)) {
                    Some(&[a, b]) => [int_u64(pk, a), int_u64(pk, b)],
                    _ => [0, 0],
                },
                blocks: Vec::new(),
            };
            let blocks = pk.get(s, "blocks").unwrap_or(Value::None);
            let mut blocks = pk.seq(blocks).map(|items| (blocks, items)).unwrap_or((Value::None, &[]));
            if blocks.0.container_id().is_some() && !seen.insert(blocks.0.container_id()) {
                repeated.push(format!("segment {i}'s block list"));
                blocks.1 = &[];
            }
            for (j, &b) in blocks.1.iter().enumerate() {
                if b.container_id().is_some() && !seen.insert(b.container_id()) {
                    repeated.push(format!("segment {i} block {j}"));
                    continue;
                }
                let state = pk.get(b, "state").and_then(|v| pk.str(v)).unwrap_or("");
                if !state.starts_with("active") {
                    continue;
                }
                let name = || format!("segment {i} block {j}");
                seg.blocks.push(BlockInfo {
                    addr: pk.get(b, "address").map(|v| self.field_u64(pk, v, name, "address")).unwrap_or(0),
                    block_bytes: pk.get(b, "size").map(|v| self.field_u64(pk, v, name, "size")).unwrap_or(0),
                    requested_bytes: pk
                        .get(b, "requested_size")
                        .map(|v| self.field_u64(pk, v, name, "requested_size"))
                        .unwrap_or(0),
                    frames: pk.get(b, "frames").unwrap_or(Value::None),
                });
            }
            self.segments.push(seg);
            if repeated.len() > MAX_WARNINGS {
                repeated.truncate(1);
                repeated.push(String::new());
            }
        }
        if let Some(first) = repeated.first() {
            self.warn(|| {
                format!("segments, block lists or blocks (the first: {first}) repeat an earlier object; skipped")
            });
        }
        Ok(())
    }
}

/// The snapshot's final segments of private pools: the `cudaMalloc` ones by address, with the
/// index of the trace entry that allocated each (the last `segment_alloc` at its address) if the
/// trace has it; and the mapped ranges of expandable ones, by start: (end, pool id).
type PrivateSegments = FxMap<u64, ([u64; 2], Option<usize>)>;
type PrivateRanges = std::collections::BTreeMap<u64, (u64, [u64; 2])>;

fn private_segments(snap: &Snapshot<'_>) -> (PrivateSegments, PrivateRanges) {
    let (mut segments, mut ranges) = (PrivateSegments::default(), PrivateRanges::new());
    for s in snap.segments.iter().filter(|s| s.pool_id != [0, 0]) {
        if s.expandable {
            ranges.insert(s.addr, (s.addr.saturating_add(s.bytes), s.pool_id));
        } else {
            segments.insert(s.addr, (s.pool_id, None));
        }
    }
    if !segments.is_empty() {
        for (i, e) in snap.entries.iter().enumerate() {
            if e.action == Action::SegmentAlloc {
                if let Some(p) = segments.get_mut(&e.addr) {
                    p.1 = Some(i);
                }
            }
        }
    }
    (segments, ranges)
}

/// Integers that do not fit in `u64` (negative, wider) map to 0; snapshot fields never are.
fn int_u64(pk: &Pickle<'_>, v: Value<'_>) -> u64 {
    match v {
        Value::Int(i) => i as u64,
        _ => pk.u64(v).unwrap_or(0),
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string equivalent to the structured `allocator_settings`.
fn conf_from_settings(pk: &Pickle<'_>, s: Value<'_>) -> String {
    let mut parts = Vec::new();
    if let Some(v) = pk.get(s, "max_split_size").and_then(|v| pk.int(v)) {
        // -1 is SIZE_MAX cast to int64: unset.
        if v > 0 && v < (1i128 << 62) {
            parts.push(format!("max_split_size_mb:{}", v as u64 / MIB));
        }
    }
    if let Some(t) = pk.get(s, "garbage_collection_threshold").and_then(|v| pk.f64(v)) {
        if t > 0.0 {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
    }
    if pk.get(s, "expandable_segments").and_then(|v| pk.int(v)).unwrap_or(0) != 0 {
        parts.push("expandable_segments:True".into());
    }
    if let Some(d) = pk.get(s, "roundup_power2_divisions") {
        // Keys "1", "2", ..., "32768": interval i starts at 2^i MiB.
        let mut entries: Vec<(u64, i128)> = pk
            .dict(d)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((pk.str(k)?.parse::<u64>().ok()?, pk.int(v)?)))
            .filter(|(k, _)| k.is_power_of_two())
            .collect();
        entries.sort();
        if entries.iter().any(|&(_, v)| v > 0) {
            let list: Vec<String> = entries.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
        }
    }
    parts.join(",")
}

fn segment_pool_by_size(bytes: u64) -> Pool {
    if bytes == SMALL_BUFFER {
        Pool::Small
    } else {
        Pool::Large
    }
}

fn request_pool(size: u64) -> Pool {
    if size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE) <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// Maps keyed by addresses and ids use the Fx hash (rustc-hash): the import hashes every
/// entry's address, and SipHash was a tenth of its time.
type FxMap<K, V> = rustc_hash::FxHashMap<K, V>;

// ---------------------------------------------------------------------------------------------
// Address ranges of reserved memory (segments and mapped pages).

#[derive(Clone, Copy, Debug)]
struct Range {
    end: u64,
    stream: u64,
    pool: Pool,
    expandable: bool,
    /// Added by undoing a free/unmap of the trace (so the trace lost its allocation).
    from_trace: bool,
}

#[derive(Default)]
struct RangeSet {
    ranges: BTreeMap<u64, Range>,
}

impl RangeSet {
    fn add(&mut self, start: u64, r: Range) {
        self.ranges.insert(start, r);
    }

    /// Removes `[start, end)`; returns the bytes that were present.
    fn remove(&mut self, start: u64, end: u64) -> u64 {
        let hits: Vec<(u64, Range)> =
            self.ranges.range(..end).rev().take_while(|(_, r)| r.end > start).map(|(&s, &r)| (s, r)).collect();
        let mut covered = 0;
        for (s, r) in hits {
            self.ranges.remove(&s);
            covered = (r.end.min(end) - s.max(start)).saturating_add(covered);
            if s < start {
                self.ranges.insert(s, Range { end: start, ..r });
            }
            if r.end > end {
                self.ranges.insert(end, r);
            }
        }
        covered
    }

    fn containing(&self, addr: u64) -> Option<(u64, Range)> {
        let (&s, &r) = self.ranges.range(..=addr).next_back()?;
        (addr < r.end).then_some((s, r))
    }
}

// ---------------------------------------------------------------------------------------------
// The import proper.

struct Importer<'p, 'a> {
    pk: &'p Pickle<'a>,
    snap: &'p Snapshot<'a>,
    config: AllocatorConfig,
    header: Header,
    /// The limit releases are classified against ([`ImportOptions::releases_limit`]).
    releases_limit: Option<u64>,
    report: ImportReport,
    warnings_dropped: u64,
    out: Vec<Record>,
    origin_ns: u64,
    last_ns: u64,
    // Call sites.
    callsite_by_container: FxMap<ContainerId, u32>,
    callsite_by_content: FxMap<Vec<u32>, u32>,
    frames: Vec<Frame>,
    frame_by_container: FxMap<ContainerId, u32>,
    frame_by_content: FxMap<Frame, u32>,
    /// File and function names cut to [`MAX_TEXT_BYTES`].
    frame_strings_cut: u64,
    /// Bytes of frame text copied into call sites, against the snapshot's text budget
    /// ([`text_budget`]), and the call sites left out past it.
    callsite_text_bytes: usize,
    text_budget: usize,
    callsites_over_budget: u64,
    next_callsite: u32,
    // Live state.
    next_id: u64,
    live: FxMap<u64, (u64, u64)>,
    allocated_bytes: u64,
    reserved_bytes: u64,
    segment_pool: FxMap<u64, Pool>,
    /// The final segments of private pools (CUDA graphs, MemPools), `cudaMalloc`ed ones: address
    /// -> pool id, and the index of the trace entry that allocated each (none: before the trace).
    /// The snapshot names a segment's pool only for the segments it holds at its end.
    private_at_end: PrivateSegments,
    /// The final mapped ranges of private pools' expandable segments. An expandable segment's
    /// address range is reserved for one pool while it lives, so every mapping inside such a
    /// range is taken to be that pool's.
    private_ranges_at_end: PrivateRanges,
    /// Expandable ranges: from the final segments, then every mapped range of the trace.
    expandable: RangeSet,
}

/// A run of consecutive segment releases of the trace (module documentation, "empty_cache
/// inference").
#[derive(Debug, Default, Clone, PartialEq)]
struct Burst {
    bytes: u64,
    segments: u32,
    /// Reserved bytes just before the burst, and the most reserved at any time before it.
    reserved_before: u64,
    peak_before: u64,
    /// Some segment went that garbage collection or the oversize release cannot free: a
    /// small-pool segment or expandable pages (GC frees whole large segments only; the oversize
    /// release only whole segments of at least `max_split_size`).
    not_gc: bool,
    not_oversize: bool,
    /// The largest free block `(bytes, stream, pool)` of each freed range that was free before
    /// the burst began: the range less the blocks that completed a stream-ordered free since
    /// the last allocation-related entry (the release's own synchronization may have done it).
    servable: Vec<(u64, u64, Pool)>,
}

/// The longest piece of `[addr, addr + size)` that none of `blocks` (`(addr, bytes)`) covers.
fn largest_uncovered(addr: u64, size: u64, blocks: &[(u64, u64)]) -> u64 {
    let end = addr.saturating_add(size);
    let mut inside: Vec<(u64, u64)> = blocks
        .iter()
        .filter(|&&(a, b)| a < end && a.saturating_add(b) > addr)
        .map(|&(a, b)| (a.max(addr), a.saturating_add(b).min(end)))
        .collect();
    inside.sort_unstable();
    let (mut cursor, mut largest) = (addr, 0);
    for (a, b) in inside {
        largest = largest.max(a.saturating_sub(cursor));
        cursor = cursor.max(b);
    }
    largest.max(end.saturating_sub(cursor))
}

impl Burst {
    fn add(&mut self, e: &Entry<'_>, max_split_size: Option<u64>, pool: Pool, free_before: u64) {
        if free_before > 0 {
            self.servable.push((free_before, e.stream, pool));
        }
        self.bytes = self.bytes.saturating_add(e.size);
        self.segments = self.segments.saturating_add(1);
        let unmap = e.action == Action::SegmentUnmap;
        let small = segment_pool_by_size(e.size) == Pool::Small;
        self.not_gc |= unmap || small;
        self.not_oversize |= unmap || small || max_split_size.is_none_or(|m| e.size < m);
    }
}

/// The next allocation-related entry after a burst.
#[derive(Debug, Clone, Copy, PartialEq)]
enum NextEntry {
    Oom,
    /// A `segment_alloc` or `segment_map` of `bytes`, and the request it served (rounded size
    /// and stream), when the trace holds it.
    Segment {
        bytes: u64,
        request: Option<(u64, u64)>,
    },
    /// An `alloc` (a cache hit), or nothing.
    HitOrEnd,
}

/// What the import knows of the limit the program ran under.
#[derive(Debug, Clone, Copy, Default)]
struct LimitFacts {
    /// `--capacity`: the memory fraction's `allowed_memory_maximum`.
    limit: Option<u64>,
    /// Whether the trace has an `oom` entry.
    trace_has_oom: bool,
    device_total: Option<u64>,
}

/// Who released a burst's segments: PyTorch inside a `malloc`, or the program (module
/// documentation, "empty_cache inference").
fn release_cause(b: &Burst, next: NextEntry, config: &AllocatorConfig, facts: &LimitFacts) -> ReleaseCause {
    let (segment, request) = match next {
        NextEntry::Oom => return ReleaseCause::OomRetry,
        NextEntry::HitOrEnd => return ReleaseCause::EmptyCache,
        NextEntry::Segment { bytes, request } => (bytes, request),
    };
    // PyTorch releases only after the request missed the cache: a freed segment that could
    // have served it was not free at the miss, so the program released it before.
    if let Some((rounded, stream)) = request {
        let msplit = config.max_split_size.unwrap_or(u64::MAX);
        let could_serve = |&(bytes, s, pool): &(u64, u64, Pool)| {
            s == stream
                && pool == pool_for(rounded)
                && bytes >= rounded
                && !(rounded < msplit && bytes >= msplit)
                && !(rounded >= msplit && bytes >= rounded.saturating_add(config.max_non_split_rounding))
        };
        if b.servable.iter().any(could_serve) {
            return ReleaseCause::EmptyCache;
        }
    }
    // The fraction check of `alloc_block` counts the request's whole allocation size
    // (`p.alloc_size`), also where expandable segments then map only the pages missing; the map
    // after the release (which unmapped the free pages) is no measure of it.
    let segment = request.map_or(segment, |(rounded, _)| allocation_size(config, rounded));
    let wanted = b.reserved_before.saturating_add(segment);
    if let (Some(limit), Some(t)) = (facts.limit, config.garbage_collection_threshold) {
        if t > 0.0 && !b.not_gc && b.reserved_before as f64 > t * limit as f64 {
            return ReleaseCause::GarbageCollection;
        }
    }
    let failing = match facts.limit {
        Some(limit) => wanted > limit,
        None => (facts.trace_has_oom && wanted > b.peak_before) || facts.device_total.is_some_and(|d| wanted > d),
    };
    if !failing {
        ReleaseCause::EmptyCache
    } else if config.max_split_size.is_some() && !b.not_oversize {
        ReleaseCause::Oversize
    } else {
        ReleaseCause::OomRetry
    }
}

impl<'p, 'a> Importer<'p, 'a> {
    fn new(pk: &'p Pickle<'a>, opts: &ImportOptions, snap: &'p Snapshot<'a>, text_budget: usize) -> Self {
        let mut report = ImportReport { entries: snap.entries.len() as u64, ..ImportReport::default() };
        let (private_at_end, private_ranges_at_end) = private_segments(snap);
        report.warnings.extend(snap.warnings.iter().cloned());
        let config = match AllocatorConfig::parse(&snap.alloc_conf) {
            Ok(c) => c,
            Err(e) => {
                report.warnings.push(format!("{e}; the default configuration is used"));
                AllocatorConfig::default()
            }
        };
        let mut header = Header::new(Source::ImportedTorch);
        header.alloc_conf = snap.alloc_conf.clone();
        header.config = config.clone();
        // The user's facts first, then what an alloctrace export carried.
        header.capacity_bytes = opts.capacity_bytes.or(snap.exported.capacity_bytes).unwrap_or(0);
        if let Some(note) = &snap.predicted {
            header.notes.push(note.clone());
        }
        header.device_name = opts.device_name.clone().or_else(|| snap.exported.device_name.clone()).unwrap_or_default();
        header.device_total_bytes = opts.device_total_bytes.or(snap.exported.device_total_bytes).unwrap_or(0);
        match (opts.torch_version.or(snap.exported.torch_version), snap.written_since) {
            (Some(v), _) => header.torch_version = v.to_string(),
            (None, Some((v, key))) => {
                header.torch_version = v.to_string();
                header.notes.push(format!(
                    "PyTorch {v} or later wrote the snapshot (it carries `{key}`, which {v} added); replayed as {v} \
                     (--torch-version gives the exact release)"
                ));
            }
            (None, None) => {}
        }
        let origin_ns = snap.entries.first().map(|e| e.time_us.saturating_mul(1000)).unwrap_or(0);
        header.clock_origin_unix_ns = origin_ns;
        if !snap.has_trace {
            header.notes.push("imported from a snapshot without a trace: only the final segments and blocks".into());
            report.warnings.push(NO_HISTORY.into());
        }
        let mut expandable = RangeSet::default();
        for s in snap.segments.iter().filter(|s| s.expandable) {
            let r = Range {
                end: s.addr.saturating_add(s.bytes),
                stream: s.stream,
                pool: s.pool,
                expandable: true,
                from_trace: false,
            };
            expandable.add(s.addr, r);
        }
        Importer {
            pk,
            snap,
            config,
            header,
            releases_limit: opts.releases_limit,
            report,
            warnings_dropped: 0,
            out: Vec::with_capacity(snap.entries.len() + snap.annotations.len() + 64),
            origin_ns,
            last_ns: 0,
            callsite_by_container: FxMap::default(),
            callsite_by_content: FxMap::default(),
            frames: Vec::new(),
            frame_by_container: FxMap::default(),
            frame_by_content: FxMap::default(),
            frame_strings_cut: 0,
            callsite_text_bytes: 0,
            text_budget,
            callsites_over_budget: 0,
            next_callsite: 1,
            next_id: 1,
            live: FxMap::with_capacity_and_hasher(1024, Default::default()),
            allocated_bytes: 0,
            reserved_bytes: 0,
            segment_pool: FxMap::default(),
            private_at_end,
            private_ranges_at_end,
            expandable,
        }
    }

    fn warn(&mut self, w: String) {
        if self.report.warnings.len() < MAX_WARNINGS {
            self.report.warnings.push(w);
        } else {
            self.warnings_dropped += 1;
        }
    }

    fn push(&mut self, time_ns: u64, event: Event) {
        self.out.push(Record { time_ns, event });
    }

    /// Nanoseconds since the origin, never before the previous record.
    fn time(&mut self, time_us: u64) -> u64 {
        let t = time_us.saturating_mul(1000).saturating_sub(self.origin_ns);
        if t < self.last_ns {
            return self.last_ns;
        }
        self.last_ns = t;
        t
    }

    /// The call site of a `frames` list, defined (at `time_ns`) on first use.
    fn callsite(&mut self, frames: Value<'a>, time_ns: u64) -> u32 {
        let pk = self.pk;
        let Some(items) = pk.seq(frames) else {
            return NO_CALLSITE;
        };
        if items.is_empty() {
            return NO_CALLSITE;
        }
        let cid = frames.container_id().expect("sequences are containers");
        if let Some(&id) = self.callsite_by_container.get(&cid) {
            return id;
        }
        // PyTorch shares frame dicts between tracebacks, so frames are interned by identity
        // first (a few dozen distinct objects for tens of thousands of references), and a call
        // site is the sequence of interned frame ids.
        let key: Vec<u32> = items.iter().map(|&f| self.frame_id(f)).collect();
        let id = match self.callsite_by_content.get(&key) {
            Some(&id) => id,
            None => {
                // Only the frames a trace keeps are copied (a list of a million references to
                // one frame is one frame's text a million times), and only within the budget.
                let kept = if key.len() > MAX_CALLSITE_FRAMES { MAX_CALLSITE_FRAMES - 1 } else { key.len() };
                let text: usize = key[..kept]
                    .iter()
                    .map(|&f| &self.frames[f as usize])
                    .map(|f| f.file.len() + f.function.len())
                    .sum();
                self.callsite_text_bytes = self.callsite_text_bytes.saturating_add(text);
                if self.callsite_text_bytes > self.text_budget {
                    self.callsites_over_budget += 1;
                    self.callsite_by_container.insert(cid, NO_CALLSITE);
                    return NO_CALLSITE;
                }
                let id = self.next_callsite;
                self.next_callsite += 1;
                let mut frames: Vec<Frame> = key[..kept].iter().map(|&f| self.frames[f as usize].clone()).collect();
                if key.len() > kept {
                    frames.push(frames_cut_marker(key.len() - kept));
                }
                if bound_frames(&mut frames) || key.len() > kept {
                    self.warn(format!(
                        "call site {id} has {} frames; cut to the {} a trace keeps",
                        key.len(),
                        frames.len()
                    ));
                }
                self.callsite_by_content.insert(key, id);
                self.push(time_ns, Event::CallSite { id, frames });
                id
            }
        };
        self.callsite_by_container.insert(cid, id);
        id
    }

    /// The interned id of one frame dict (`filename`, `line`, `name`).
    fn frame_id(&mut self, f: Value<'a>) -> u32 {
        let pk = self.pk;
        let cid = f.container_id();
        if let Some(id) = cid.and_then(|c| self.frame_by_container.get(&c)) {
            return *id;
        }
        let s = |k| pk.get(f, k).and_then(|v| pk.str(v)).unwrap_or("");
        let line = pk.get(f, "line").and_then(|v| pk.u64(v)).unwrap_or(0).min(u32::MAX as u64) as u32;
        // Each string is cut to what a trace keeps here, before it is copied or hashed: a 1 MiB
        // name referenced from 300 frames took 300 MiB and made a trace its reader refused.
        let (file, function) = (bounded_text(s("filename")), bounded_text(s("name")));
        self.frame_strings_cut += matches!(file, Cow::Owned(_)) as u64 + matches!(function, Cow::Owned(_)) as u64;
        let frame = Frame { file: file.into_owned(), line, function: function.into_owned() };
        let id = match self.frame_by_content.get(&frame) {
            Some(&id) => id,
            None => {
                let id = self.frames.len() as u32;
                self.frames.push(frame.clone());
                self.frame_by_content.insert(frame, id);
                id
            }
        };
        if let Some(c) = cid {
            self.frame_by_container.insert(c, id);
        }
        id
    }

    fn run(mut self) -> Imported {
        let start = self.reconstruct_start();
        self.emit_start(start);
        self.emit_trace();
        self.report.callsites = self.next_callsite - 1;
        if self.callsites_over_budget > 0 {
            let (n, budget) = (self.callsites_over_budget, self.text_budget);
            self.warn(format!(
                "{n} call sites left out (their allocations have none): their frames pass the import's budget of \
                 {budget} bytes of text for this snapshot"
            ));
        }
        if self.frame_strings_cut > 0 {
            let n = self.frame_strings_cut;
            self.warn(format!(
                "{n} frame file or function names are longer than {MAX_TEXT_BYTES} bytes; cut with a marker"
            ));
        }
        self.report.inferred_empty_cache = self
            .out
            .iter()
            .filter(|r| matches!(r.event, Event::CacheRelease { cause: ReleaseCause::EmptyCache, .. }))
            .count() as u32;
        self.report.events = self.out.len() as u64;
        if self.warnings_dropped > 0 {
            let n = self.warnings_dropped;
            self.report.warnings.push(format!("... and {n} more warnings"));
        }
        if self.report.ring_buffer_overflowed {
            self.header.notes.push(format!(
                "PyTorch's trace ring buffer overflowed: the oldest entries are lost; the state before the first entry \
                 ({} segments, {} live blocks) was reconstructed from the final segments",
                self.report.initial_segments, self.report.initial_live_blocks
            ));
            self.header.notes.push(
                "what the lost entries change: peaks, OOMs, empty_cache calls and call sites before the first kept \
                 entry are unknown, so every figure covers the kept window only; a replay starts from the \
                 reconstructed segments, whose free space is taken as cached at that moment"
                    .into(),
            );
        } else if self.report.initial_segments + self.report.initial_live_blocks > 0 {
            self.header.notes.push(format!(
                "{} segments and {} live blocks existed before the first trace entry (reconstructed from the final segments)",
                self.report.initial_segments, self.report.initial_live_blocks
            ));
        }
        Imported { header: self.header, records: self.out, report: self.report }
    }

    /// Walks the trace backwards from the final state: what remains existed before the first
    /// entry (see the module documentation).
    fn reconstruct_start(&mut self) -> StartState<'a> {
        let mut reserved = RangeSet::default();
        let mut live: FxMap<u64, (BlockInfo<'a>, bool)> = FxMap::default();
        for s in &self.snap.segments {
            let r = Range {
                end: s.addr.saturating_add(s.bytes),
                stream: s.stream,
                pool: s.pool,
                expandable: s.expandable,
                from_trace: false,
            };
            reserved.add(s.addr, r);
            for b in &s.blocks {
                live.insert(b.addr, (*b, false));
            }
        }
        let mut anomalies = 0u64;
        let mut first_anomaly = None;
        for (i, e) in self.snap.entries.iter().enumerate().rev() {
            let ok = match e.action {
                Action::Alloc => live.remove(&e.addr).is_some(),
                Action::FreeCompleted => {
                    let b = BlockInfo { addr: e.addr, block_bytes: 0, requested_bytes: e.size, frames: Value::None };
                    live.insert(e.addr, (b, true)).is_none()
                }
                Action::SegmentAlloc | Action::SegmentMap => {
                    reserved.remove(e.addr, e.addr.saturating_add(e.size)) == e.size
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    let end = e.addr.saturating_add(e.size);
                    let clash = reserved.remove(e.addr, end) != 0;
                    let expandable = e.action == Action::SegmentUnmap;
                    let pool = if expandable { self.map_pool(e) } else { segment_pool_by_size(e.size) };
                    reserved.add(e.addr, Range { end, stream: e.stream, pool, expandable, from_trace: true });
                    !clash
                }
                Action::FreeRequested | Action::Oom | Action::Snapshot | Action::Other => true,
            };
            if !ok {
                anomalies += 1;
                first_anomaly.get_or_insert(i);
            }
        }
        if let Some(i) = first_anomaly {
            let e = &self.snap.entries[i];
            self.warn(format!(
                "the trace does not agree with the final segments: {anomalies} entries (the first: entry {i}, {:?} at 0x{:x}) \
                 undo onto a state that lacks or already has their block or segment",
                e.action, e.addr
            ));
        }
        let mut segments: Vec<(u64, Range)> = reserved.ranges.into_iter().collect();
        segments.sort_by_key(|&(a, _)| a);
        let mut blocks: Vec<(BlockInfo<'a>, bool)> = live.into_values().collect();
        blocks.sort_by_key(|(b, _)| b.addr);
        let lost = segments.iter().any(|(_, r)| r.from_trace) || blocks.iter().any(|&(_, from_trace)| from_trace);
        let mut reasons = Vec::new();
        if let Some(why) = &self.snap.settings_say_overflow {
            reasons.push(why.clone());
        }
        if lost {
            reasons.push("blocks or segments are freed in the trace but never allocated in it".into());
        }
        if !reasons.is_empty() {
            self.report.ring_buffer_overflowed = true;
            self.warn(format!("ring buffer overflow: {}", reasons.join("; ")));
        }
        self.report.initial_segments = segments.len() as u64;
        self.report.initial_live_blocks = blocks.len() as u64;
        StartState { segments, blocks: blocks.into_iter().map(|(b, _)| b).collect() }
    }

    fn emit_start(&mut self, start: StartState<'a>) {
        let mut reserved = RangeSet::default();
        for &(addr, r) in &start.segments {
            let bytes = r.end - addr;
            self.reserved_bytes = self.reserved_bytes.saturating_add(bytes);
            reserved.add(addr, r);
            let ev = if r.expandable {
                self.expandable.add(addr, r);
                Event::SegmentMap { addr, bytes, stream: r.stream, pool: r.pool }
            } else {
                self.segment_pool.insert(addr, r.pool);
                Event::SegmentAlloc { addr, bytes, stream: r.stream, pool: r.pool }
            };
            self.push(0, ev);
            // A segment the trace frees without allocating it is not one of the final ones.
            if r.expandable || !r.from_trace {
                self.name_private_segment(0, addr, r.expandable, None);
            }
        }
        for b in start.blocks {
            let (stream, pool) = match reserved.containing(b.addr) {
                Some((_, r)) => (r.stream, r.pool),
                None => (0, request_pool(b.requested_bytes)),
            };
            let callsite = self.callsite(b.frames, 0);
            let id = self.next_id;
            self.next_id += 1;
            let rounded = if b.block_bytes > 0 { b.block_bytes } else { round_size(&self.config, b.requested_bytes) };
            self.live.insert(b.addr, (id, rounded));
            self.allocated_bytes = self.allocated_bytes.saturating_add(rounded);
            let ev = Event::Alloc {
                id,
                addr: b.addr,
                requested_bytes: b.requested_bytes,
                block_bytes: b.block_bytes,
                stream,
                pool,
                callsite,
            };
            self.push(0, ev);
        }
    }

    /// After the event of a segment made at `addr` (mapped, for an expandable one; by trace
    /// entry `entry`, or before the trace): the `segment_pool` naming its private pool, where
    /// the snapshot's final segments say it has one. A `cudaMalloc` segment is named only where
    /// it is the final one at its address; a mapping, wherever it falls in a private pool's final
    /// range.
    fn name_private_segment(&mut self, t: u64, addr: u64, expandable: bool, entry: Option<usize>) {
        let pool_id = if expandable {
            self.private_ranges_at_end
                .range(..=addr)
                .next_back()
                .and_then(|(_, &(end, pool_id))| (addr < end).then_some(pool_id))
        } else {
            self.private_at_end.get(&addr).and_then(|&(pool_id, at)| (at == entry).then_some(pool_id))
        };
        if let Some(pool_id) = pool_id {
            self.push(t, Event::SegmentPool { addr, pool_id });
        }
    }

    /// The pool of an expandable map/unmap (module documentation, "Segment pools").
    fn map_pool(&self, e: &Entry<'_>) -> Pool {
        if let Some((_, r)) = self.expandable.containing(e.addr) {
            return r.pool;
        }
        if let Some((_, r)) = e.addr.checked_sub(1).and_then(|a| self.expandable.containing(a)) {
            if r.stream == e.stream {
                return r.pool;
            }
        }
        if e.size > 0 && e.size.checked_rem(self.config.large_segment_size) == Some(0) {
            Pool::Large
        } else {
            Pool::Small
        }
    }

    fn emit_trace(&mut self) {
        let snap = self.snap;
        let entries = &snap.entries;
        // For each entry, the first allocation-related entry at or after it.
        let mut next_alloc_related = vec![None; entries.len() + 1];
        for i in (0..entries.len()).rev() {
            next_alloc_related[i] =
                if entries[i].action.is_alloc_related() { Some(i) } else { next_alloc_related[i + 1] };
        }
        let mut next_alloc = vec![None; entries.len() + 1];
        for i in (0..entries.len()).rev() {
            next_alloc[i] = if entries[i].action == Action::Alloc { Some(i) } else { next_alloc[i + 1] };
        }
        let trace_has_oom = entries.iter().any(|e| e.action == Action::Oom);
        // Blocks `(addr, rounded bytes)` whose stream-ordered free completed (not right after
        // its request) since the last allocation-related entry: a release's synchronization may
        // have completed them.
        let mut deferred: Vec<(u64, u64)> = Vec::new();
        let mut ann = snap.annotations.iter().peekable();
        let mut clamped_annotations = 0u64;
        let mut burst = Burst::default();
        let mut peak_reserved = self.reserved_bytes;
        for (i, e) in entries.iter().enumerate() {
            while let Some(a) = ann.next_if(|a| a.time_us <= e.time_us) {
                if a.time_us.saturating_mul(1000) < self.origin_ns {
                    clamped_annotations += 1;
                }
                let t = self.time(a.time_us);
                self.push(t, Event::Mark { kind: a.kind, text: a.text.clone() });
            }
            let t = self.time(e.time_us);
            if e.action.is_release() && burst.segments == 0 {
                burst.reserved_before = self.reserved_bytes;
                burst.peak_before = peak_reserved;
            }
            self.entry(e, t);
            if matches!(e.action, Action::SegmentAlloc | Action::SegmentMap) {
                self.name_private_segment(t, e.addr, e.action == Action::SegmentMap, Some(i));
            }
            peak_reserved = peak_reserved.max(self.reserved_bytes);
            match e.action {
                Action::FreeCompleted
                    if !(i > 0 && entries[i - 1].action == Action::FreeRequested && entries[i - 1].addr == e.addr) =>
                {
                    deferred.push((e.addr, round_size(&self.config, e.size)))
                }
                a if a.is_alloc_related() => deferred.clear(),
                _ => {}
            }
            if e.action.is_release() {
                let free_before = largest_uncovered(e.addr, e.size, &deferred);
                let pool =
                    if e.action == Action::SegmentUnmap { self.map_pool(e) } else { segment_pool_by_size(e.size) };
                burst.add(e, self.config.max_split_size, pool, free_before);
                if !entries.get(i + 1).is_some_and(|n| n.action.is_release()) {
                    let next = match next_alloc_related[i + 1].map(|j| &entries[j]) {
                        Some(n) if n.action == Action::Oom => NextEntry::Oom,
                        Some(n) if matches!(n.action, Action::SegmentAlloc | Action::SegmentMap) => {
                            let request = next_alloc[i + 1]
                                .map(|j| &entries[j])
                                .map(|a| (round_size(&self.config, a.size), a.stream));
                            NextEntry::Segment { bytes: n.size, request }
                        }
                        _ => NextEntry::HitOrEnd,
                    };
                    let limit = match self.header.capacity_bytes {
                        0 => self.releases_limit,
                        c => Some(c),
                    };
                    let facts = LimitFacts {
                        limit,
                        trace_has_oom,
                        device_total: Some(self.header.device_total_bytes).filter(|&d| d > 0),
                    };
                    let cause = release_cause(&burst, next, &self.config, &facts);
                    self.push(t, Event::CacheRelease { cause, bytes: burst.bytes, segments: burst.segments });
                    burst = Burst::default();
                }
            }
        }
        for a in ann {
            let t = self.time(a.time_us);
            self.push(t, Event::Mark { kind: a.kind, text: a.text.clone() });
        }
        if clamped_annotations > 0 {
            self.warn(format!(
                "{clamped_annotations} annotations precede the first trace entry; their time is clamped to 0"
            ));
        }
    }

    fn entry(&mut self, e: &Entry<'a>, t: u64) {
        match e.action {
            Action::Alloc => {
                let callsite = self.callsite(e.frames, t);
                let id = self.next_id;
                self.next_id += 1;
                let rounded = round_size(&self.config, e.size);
                if let Some((old, old_rounded)) = self.live.insert(e.addr, (id, rounded)) {
                    self.allocated_bytes = self.allocated_bytes.saturating_sub(old_rounded);
                    self.warn(format!("alloc at 0x{:x} while block {old} is live there", e.addr));
                }
                self.allocated_bytes = self.allocated_bytes.saturating_add(rounded);
                let ev = Event::Alloc {
                    id,
                    addr: e.addr,
                    requested_bytes: e.size,
                    block_bytes: 0,
                    stream: e.stream,
                    pool: request_pool(e.size),
                    callsite,
                };
                self.push(t, ev);
            }
            Action::FreeRequested => match self.live.get(&e.addr) {
                Some(&(id, _)) => {
                    let callsite = self.callsite(e.frames, t);
                    self.push(t, Event::FreeRequested { id, addr: e.addr, callsite });
                }
                None => self.warn(format!("free_requested of unknown address 0x{:x} (skipped)", e.addr)),
            },
            Action::FreeCompleted => match self.live.remove(&e.addr) {
                Some((id, rounded)) => {
                    self.allocated_bytes = self.allocated_bytes.saturating_sub(rounded);
                    self.push(t, Event::FreeCompleted { id, addr: e.addr });
                }
                None => self.warn(format!("free_completed of unknown address 0x{:x} (skipped)", e.addr)),
            },
            Action::SegmentAlloc => {
                let pool = segment_pool_by_size(e.size);
                self.segment_pool.insert(e.addr, pool);
                self.reserved_bytes = self.reserved_bytes.saturating_add(e.size);
                self.push(t, Event::SegmentAlloc { addr: e.addr, bytes: e.size, stream: e.stream, pool });
            }
            Action::SegmentFree => {
                let pool = match self.segment_pool.remove(&e.addr) {
                    Some(p) => p,
                    None => {
                        self.warn(format!("segment_free of unknown segment 0x{:x}", e.addr));
                        segment_pool_by_size(e.size)
                    }
                };
                self.reserved_bytes = self.reserved_bytes.saturating_sub(e.size);
                self.push(t, Event::SegmentFree { addr: e.addr, bytes: e.size, stream: e.stream, pool });
            }
            Action::SegmentMap | Action::SegmentUnmap => {
                let pool = self.map_pool(e);
                let end = e.addr.saturating_add(e.size);
                let ev = if e.action == Action::SegmentMap {
                    self.reserved_bytes = self.reserved_bytes.saturating_add(e.size);
                    let r = Range { end, stream: e.stream, pool, expandable: true, from_trace: true };
                    self.expandable.remove(e.addr, end);
                    self.expandable.add(e.addr, r);
                    Event::SegmentMap { addr: e.addr, bytes: e.size, stream: e.stream, pool }
                } else {
                    // Keep the unmapped range known: a later map there is the same pool.
                    self.reserved_bytes = self.reserved_bytes.saturating_sub(e.size);
                    Event::SegmentUnmap { addr: e.addr, bytes: e.size, stream: e.stream, pool }
                };
                self.push(t, ev);
            }
            Action::Oom => {
                let rounded = round_size(&self.config, e.size);
                let ev = Event::Oom {
                    requested_bytes: e.size,
                    alloc_bytes: allocation_size(&self.config, rounded),
                    device_free_bytes: e.addr,
                    reserved_bytes: self.reserved_bytes,
                    allocated_bytes: self.allocated_bytes,
                    limit_bytes: self.header.capacity_bytes,
                    stream: e.stream,
                };
                self.push(t, ev);
            }
            Action::Snapshot => self.push(t, Event::Snapshot { active_bytes: e.size }),
            Action::Other => {
                let name = e.unknown.unwrap_or("?");
                self.warn(format!("unknown trace action `{name}` skipped"));
            }
        }
    }
}

struct StartState<'a> {
    segments: Vec<(u64, Range)>,
    blocks: Vec<BlockInfo<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(bytes: u64) -> NextEntry {
        NextEntry::Segment { bytes, request: None }
    }

    /// The program's `empty_cache()` after it caught an OOM, followed by a request that would
    /// not have fit under the limit beside the cached segments: one of them could have served
    /// it, so there was no miss, and PyTorch releases only after a miss.
    #[test]
    fn release_cause_a_freed_segment_that_could_serve_the_request() {
        let c = AllocatorConfig::default();
        let limited = LimitFacts { limit: Some(1000 * MIB), trace_has_oom: true, device_total: None };
        let mut b = burst(900 * MIB, 900 * MIB, false, true);
        b.servable.push((256 * MIB, 7, Pool::Large));
        let next =
            |rounded: u64, stream: u64| NextEntry::Segment { bytes: 128 * MIB, request: Some((rounded, stream)) };
        assert_eq!(release_cause(&b, next(128 * MIB, 7), &c, &limited), ReleaseCause::EmptyCache);
        // Another stream's segment, or one too small, could not have served it.
        assert_eq!(release_cause(&b, next(128 * MIB, 8), &c, &limited), ReleaseCause::OomRetry);
        assert_eq!(release_cause(&b, next(300 * MIB, 7), &c, &limited), ReleaseCause::OomRetry);
        // With max_split_size_mb:64 a 256 MiB block does not serve a 32 MiB request (which,
        // with 990 MiB reserved, did not fit either).
        let msplit = AllocatorConfig::parse("max_split_size_mb:64").unwrap();
        let mut tight = burst(990 * MIB, 990 * MIB, false, true);
        tight.servable.push((256 * MIB, 7, Pool::Large));
        assert_eq!(release_cause(&tight, next(32 * MIB, 7), &msplit, &limited), ReleaseCause::OomRetry);
        assert_eq!(release_cause(&tight, next(32 * MIB, 7), &c, &limited), ReleaseCause::EmptyCache);
    }

    /// A block whose stream-ordered free the release's synchronization may have completed was
    /// not free at the miss; the rest of its range was: its largest free piece could serve.
    #[test]
    fn free_before_the_release_is_the_range_less_the_blocks_it_completed() {
        let (a, b) = (0x1000 * MIB, 31 * MIB);
        assert_eq!(largest_uncovered(a, 40 * MIB, &[]), 40 * MIB);
        assert_eq!(largest_uncovered(a, 40 * MIB, &[(a, b)]), 9 * MIB);
        assert_eq!(largest_uncovered(a, 40 * MIB, &[(a + 4 * MIB, 2 * MIB), (a + 30 * MIB, 10 * MIB)]), 24 * MIB);
        assert_eq!(largest_uncovered(a, 40 * MIB, &[(a - MIB, 50 * MIB)]), 0);
        // Blocks of other ranges do not count.
        assert_eq!(largest_uncovered(a, 40 * MIB, &[(a + 40 * MIB, 8 * MIB)]), 40 * MIB);
    }

    /// With expandable segments a request that missed the cache is checked against the memory
    /// fraction with its whole allocation size (`alloc_block`'s `p.alloc_size`), not with the
    /// pages mapped after the release (the release unmapped the free ones it would have grown).
    #[test]
    fn release_cause_with_expandable_segments_checks_the_allocation_size() {
        let c = AllocatorConfig::parse("expandable_segments:True").unwrap();
        let limited = LimitFacts { limit: Some(1000 * MIB), trace_has_oom: false, device_total: None };
        let b = burst(965 * MIB, 965 * MIB, true, true);
        // A 29.6 MiB request (30 MiB allocation size) mapped two 20 MiB pages after the release:
        // 965 + 30 fits in 1000, so nothing was failing; the program called empty_cache().
        let next = |rounded: u64| NextEntry::Segment { bytes: 40 * MIB, request: Some((rounded, 7)) };
        assert_eq!(release_cause(&b, next(31_000_064), &c, &limited), ReleaseCause::EmptyCache);
        // A 37 MiB one (38 MiB) would not have fit: PyTorch's retry.
        assert_eq!(release_cause(&b, next(37 * MIB), &c, &limited), ReleaseCause::OomRetry);
    }

    fn burst(reserved_before: u64, peak_before: u64, not_gc: bool, not_oversize: bool) -> Burst {
        Burst { bytes: 0, segments: 1, reserved_before, peak_before, not_gc, not_oversize, servable: Vec::new() }
    }

    /// PyTorch's own releases happen inside `malloc` for a request that missed: the burst is
    /// followed by that request's new segment (or its OOM). A user's `empty_cache()` is inferred
    /// only when no request was failing.
    #[test]
    fn release_cause_separates_pytorch_releases_from_empty_cache() {
        let default = AllocatorConfig::default();
        let limited = LimitFacts { limit: Some(1000 * MIB), trace_has_oom: true, device_total: None };
        let b = burst(900 * MIB, 900 * MIB, true, true);
        // Followed by an OOM: the last resort of the failing request.
        assert_eq!(release_cause(&b, NextEntry::Oom, &default, &limited), ReleaseCause::OomRetry);
        // A cache hit follows: nothing was failing.
        assert_eq!(release_cause(&b, NextEntry::HitOrEnd, &default, &limited), ReleaseCause::EmptyCache);
        // The next segment would not have fit under the limit: the retry flush that succeeded.
        assert_eq!(release_cause(&b, seg(200 * MIB), &default, &limited), ReleaseCause::OomRetry);
        // It would have fit: the program's empty_cache().
        assert_eq!(release_cause(&b, seg(20 * MIB), &default, &limited), ReleaseCause::EmptyCache);
        // max_split_size_mb: only oversize segments went, the request was failing.
        let msplit = AllocatorConfig::parse("max_split_size_mb:64").unwrap();
        let oversize = burst(900 * MIB, 900 * MIB, false, false);
        assert_eq!(release_cause(&oversize, seg(200 * MIB), &msplit, &limited), ReleaseCause::Oversize);
        assert_eq!(release_cause(&b, seg(200 * MIB), &msplit, &limited), ReleaseCause::OomRetry);
        // garbage_collection_threshold: above threshold * limit, whole large segments only.
        let gc = AllocatorConfig::parse("garbage_collection_threshold:0.6").unwrap();
        let large_only = burst(700 * MIB, 900 * MIB, false, true);
        assert_eq!(release_cause(&large_only, seg(20 * MIB), &gc, &limited), ReleaseCause::GarbageCollection);
        // Below the threshold, or a small segment went: not GC.
        let low = burst(500 * MIB, 900 * MIB, false, true);
        assert_eq!(release_cause(&low, seg(20 * MIB), &gc, &limited), ReleaseCause::EmptyCache);
        assert_eq!(release_cause(&b, seg(20 * MIB), &gc, &limited), ReleaseCause::EmptyCache);
        // GC needs a memory fraction: with no limit it is never GC.
        let none = LimitFacts::default();
        assert_eq!(release_cause(&large_only, seg(20 * MIB), &gc, &none), ReleaseCause::EmptyCache);
    }

    /// With the limit unknown, a request can only have been failing if it would have set a new
    /// high of reserved memory (the limit is at least every level reached) in a trace that ran
    /// out of memory, or if it exceeds the device.
    #[test]
    fn release_cause_with_an_unknown_limit() {
        let c = AllocatorConfig::default();
        let oom_trace = LimitFacts { limit: None, trace_has_oom: true, device_total: None };
        let below_peak = burst(800 * MIB, 1000 * MIB, true, true);
        let at_peak = burst(1000 * MIB, 1000 * MIB, true, true);
        assert_eq!(release_cause(&below_peak, seg(100 * MIB), &c, &oom_trace), ReleaseCause::EmptyCache);
        assert_eq!(release_cause(&at_peak, seg(100 * MIB), &c, &oom_trace), ReleaseCause::OomRetry);
        let no_oom = LimitFacts { limit: None, trace_has_oom: false, device_total: Some(1050 * MIB) };
        assert_eq!(release_cause(&at_peak, seg(20 * MIB), &c, &no_oom), ReleaseCause::EmptyCache);
        assert_eq!(release_cause(&at_peak, seg(100 * MIB), &c, &no_oom), ReleaseCause::OomRetry);
    }

    #[test]
    fn range_set_cuts_and_finds() {
        let mut s = RangeSet::default();
        let r = |end| Range { end, stream: 0, pool: Pool::Large, expandable: true, from_trace: false };
        s.add(100, r(200));
        assert_eq!(s.remove(120, 140), 20);
        assert_eq!(s.containing(110).map(|(a, _)| a), Some(100));
        assert!(s.containing(130).is_none());
        assert_eq!(s.containing(150).map(|(a, _)| a), Some(140));
        assert_eq!(s.remove(90, 300), 80);
        assert!(s.ranges.is_empty());
    }
}
