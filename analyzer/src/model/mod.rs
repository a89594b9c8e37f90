//! The model every command works from: a [`Trace`] read once, and the typed vocabulary the
//! analyses share ([`Capacity`] and where it came from, [`Policy`], [`OutcomeKind`],
//! [`Damage`]).
//!
//! [`Trace::open`] reads the file once. In that pass it folds the facts that every analysis
//! needs (the summary, the recorded segment addresses that replays reuse, the recorded OOMs and
//! the capacity they imply) and keeps the records in memory while they fit in
//! [`RECORDS_BUDGET_BYTES`]. Every later pass ([`Trace::scan`], the replays) then runs over
//! memory; above the budget a pass streams the file again, so memory stays bounded whatever
//! the trace's size.

pub mod escape;
pub mod fold;
pub mod ids;
pub mod iterations;
pub mod layout;
pub mod output;
pub mod sites;
pub mod streams;
pub mod units;
pub mod wrap;

pub use fold::Fold;

use crate::source::summary::{Summary, SummaryFold};
use crate::source::tracefile::{self, Scanned};
use anyhow::Result;
use recorder::trace::{Event, Header, Record, TraceEnd};
use serde::{Serialize, Serializer};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

/// The name of a trace in every output: its file name (the path when it has none).
pub fn trace_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

/// Records are kept in memory up to about this many bytes; a larger trace is streamed from
/// disk again for each pass.
pub const RECORDS_BUDGET_BYTES: usize = 96 << 20;

/// Decoded records take at least this many times their file's bytes: a record is 64 bytes in
/// memory and about 8 in a file (8.5 to 18 times on every shipped trace and fixture of 64 KiB or
/// more, and on the synthetic benchmark traces; text in marks and call sites takes its own length
/// or more decoded). A file larger than the budget divided by this is streamed from the start:
/// its records would pass the budget anyway, and keeping them until they did made the read's
/// memory peak at the budget.
pub const RECORDS_PER_FILE_BYTE: u64 = 8;

/// Where a capacity came from.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// No limit.
    None,
    /// The caller's `--capacity`.
    Given,
    /// The limit recorded in the trace's header.
    Recorded,
    /// Inferred from the trace's first OOM, which had no limit: the device itself was full, so
    /// the allocator could have had what it held then plus what the device had left
    /// (`reserved + device_free`). The CUDA context and other processes held the rest.
    InferredFromOom,
    /// Inferred from the trace's first OOM, which had no recorded limit although the device
    /// still had room for the segment: a limit below the device was in force (a memory
    /// fraction). It lay at or above the peak reserved before the OOM and below what the failed
    /// segment would have made; the replay takes the lower end ([`Capacity::range`]).
    InferredLimit,
}

impl CapacitySource {
    /// Where the limit came from, in a few words.
    pub fn text(self) -> &'static str {
        match self {
            CapacitySource::Given => "given",
            CapacitySource::Recorded => "recorded",
            CapacitySource::None => "none",
            CapacitySource::InferredFromOom => "inferred: the device was full",
            CapacitySource::InferredLimit => "inferred: the least the trace allows",
        }
    }
    /// True when the limit was known (given or recorded), not inferred.
    pub fn is_known(self) -> bool {
        match self {
            CapacitySource::Given | CapacitySource::Recorded => true,
            CapacitySource::None | CapacitySource::InferredFromOom | CapacitySource::InferredLimit => false,
        }
    }
}

/// The capacity an analysis runs under, and where it came from. The one place a limit is
/// resolved: [`Trace::capacity`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// `None` = no limit.
    pub bytes: Option<u64>,
    pub source: CapacitySource,
    /// For [`CapacitySource::InferredLimit`]: the limit was at least the first value and below
    /// the second.
    pub range: Option<(u64, u64)>,
}

impl Capacity {
    pub const NONE: Capacity = Capacity { bytes: None, source: CapacitySource::None, range: None };

    pub fn given(bytes: u64) -> Capacity {
        Capacity { bytes: Some(bytes), source: CapacitySource::Given, range: None }
    }

    /// The capacity a result ran under, from its figures (its range is not kept with them).
    pub fn of(bytes: Option<u64>, source: CapacitySource) -> Capacity {
        Capacity { bytes, source, range: None }
    }

    /// The capacity in a few words, as every command and document says it: "no limit", else
    /// its bytes and where they came from ("8.00 GiB (recorded)").
    pub fn text(&self) -> String {
        match self.bytes {
            None => crate::model::units::fmt_limit(None),
            Some(c) => format!("{} ({})", crate::model::units::fmt_bytes(c), self.source.text()),
        }
    }

    /// Where the limit is inferred as a range, its least raised to `least` (kept inside the
    /// range): the limit at which the recorded run replays as recorded ([`Trace::least_limit`]).
    pub fn raised_to(self, least: Option<u64>) -> Capacity {
        match (self.source, self.range, least) {
            (CapacitySource::InferredLimit, Some((low, high)), Some(l)) => {
                let low = l.clamp(low, high.saturating_sub(1).max(low));
                Capacity { bytes: Some(low), range: Some((low, high)), ..self }
            }
            _ => self,
        }
    }

    /// For an inferred capacity: what it rests on, and how to give the real one.
    pub fn note(&self) -> Option<String> {
        let b = crate::model::units::fmt_bytes;
        match (self.source, self.bytes) {
            (CapacitySource::InferredLimit, Some(c)) => Some(format!(
                "no limit was recorded, but the run ran out of memory while the device still had room: a lower limit \
                 (a memory fraction?) was in force, {}{}. The figures assume {}, the least; give the real limit with \
                 --capacity LIMIT for answers at it.",
                if self.range.is_some() { "from " } else { "at least " },
                match self.range {
                    Some((_, high)) => format!("{} to under {}", b(c), b(high)),
                    None => b(c),
                },
                b(c)
            )),
            (CapacitySource::InferredFromOom, Some(c)) => Some(format!(
                "no limit was recorded and the device itself was full: the allocator could have had {} (reserved + \
                 device free at the OOM); the CUDA context and other processes held the rest",
                b(c)
            )),
            _ => None,
        }
    }
}

/// How a replay ended, as the JSON says it: `"ok"` or `"oom"`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    Ok,
    Oom,
}

impl OutcomeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Ok => "ok",
            OutcomeKind::Oom => "oom",
        }
    }
}

impl std::fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A what-if policy: the recorded configuration, or the recorded one with one knob changed
/// (named by the knob, as `PYTORCH_CUDA_ALLOC_CONF` writes it). Serialized as that name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Policy {
    Recorded,
    Knob(String),
}

impl Policy {
    pub fn name(&self) -> &str {
        match self {
            Policy::Recorded => "recorded",
            Policy::Knob(k) => k,
        }
    }
    pub fn is_recorded(&self) -> bool {
        matches!(self, Policy::Recorded)
    }
    /// The knob's name without its value (`expandable_segments` for `expandable_segments:True`).
    pub fn knob(&self) -> Option<&str> {
        match self {
            Policy::Recorded => None,
            Policy::Knob(k) => Some(k.split(':').next().unwrap_or(k)),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

impl Serialize for Policy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A trace that was damaged (truncated or corrupt): where, and what was kept. Serialized as
/// its one-line warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The file, as the user named it.
    pub path: String,
    /// Byte offset of the damage.
    pub offset: u64,
    /// What is wrong there, as [`TraceEnd::describe`] says it.
    pub what: String,
    /// Events before the damage, which the analyses cover.
    pub events_kept: u64,
}

impl Damage {
    pub fn of(path: &Path, end: &TraceEnd, events: u64) -> Option<Damage> {
        match end {
            TraceEnd::Truncated { offset, .. } | TraceEnd::Corrupt { offset, .. } => Some(Damage {
                path: path.display().to_string(),
                offset: *offset,
                what: end.describe(),
                events_kept: events,
            }),
            TraceEnd::Complete { .. } | TraceEnd::Reading => None,
        }
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}; analyzed the {} events before the damage", self.path, self.what, self.events_kept)
    }
}

impl Serialize for Damage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// An `oom` event as the trace recorded it.
#[derive(Debug, Clone, Serialize)]
pub struct RecordedOom {
    pub event: u64,
    pub requested_bytes: u64,
    pub alloc_bytes: u64,
    /// `None` = unknown (the format's 0).
    pub device_free_bytes: Option<u64>,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// `None` = no limit recorded (the format's 0).
    pub limit_bytes: Option<u64>,
    /// The program caught this error and went on: a later request was made
    /// ([`Facts::survived`], decided once the whole trace is read).
    pub caught: bool,
}

/// What the first pass over a trace folds, besides the summary.
#[derive(Debug, Default, Clone)]
pub struct Facts {
    /// Recorded segment addresses and sizes, in order (replays hand them out again).
    pub segments: Vec<(u64, u64)>,
    /// Start of the first expandable reservation.
    pub reservations: Vec<u64>,
    /// Every recorded OOM, in order.
    pub recorded_ooms: Vec<RecordedOom>,
    /// The last `device_mem_info` before the first recorded OOM: (free, total).
    pub mem_info: Option<(u64, u64)>,
    /// Capacity a first OOM with no limit implies, when the device itself was full.
    pub oom_capacity: Option<u64>,
    /// For a first OOM with no recorded limit while the device had room for the segment: the
    /// limit in force was at least the first value (the peak reserved up to the OOM) and below
    /// the second (reserved at the OOM plus the failed segment).
    pub limit_range: Option<(u64, u64)>,
    /// Index of the last allocation request.
    pub last_alloc: Option<u64>,
    /// Index of the last request of any kind, served or failed (an OOM before it was caught: the
    /// program went on and asked again).
    pub last_request: Option<u64>,
    /// The trace's iteration and annotation marks: its iterations, by the one rule of
    /// [`iterations`] (`iterations.iterations()`).
    pub iterations: iterations::IterationFold,
    /// The trace's call sites, named by the one rule and interned once ([`sites`]): every
    /// analysis names an allocation's site `sites.label(sites.of(callsite))`.
    pub sites: sites::Sites,
    /// Cache releases the program asked for (`empty_cache()`, a MemPool's deletion among them):
    /// the most calls of `empty_cache()` the trace can hold.
    pub empty_cache_releases: u64,
    /// Frees that waited: the program's free of a block (`free_requested`) not completed by the
    /// next record (PyTorch records both under one lock when no other stream used the block).
    /// None waited in a trace where this is 0: no block was held back for another stream.
    pub waited_frees: u64,
    /// The streams the trace's allocations, segments and OOMs name, numbered in the order it
    /// first uses them: every output numbers a stream so ([`streams`]; the segment map at a
    /// moment names, in its note, only the streams used up to that moment).
    pub streams: streams::StreamNames,
    /// The largest request, served or failed (an allocation's or an OOM's requested bytes).
    pub largest_request_bytes: u64,
}

/// Whether a trace whose last request is `last_request` went on after the recorded OOM at
/// `event` ([`Facts::survived`]'s rule, for a replay that keeps only that index).
pub fn went_on_after(last_request: Option<u64>, event: u64) -> bool {
    last_request.is_some_and(|a| a > event)
}

impl Facts {
    pub fn first_oom(&self) -> Option<u64> {
        self.recorded_ooms.first().map(|o| o.event)
    }
    /// Whether the program went on after the recorded OOM at `event` (it caught the error, as
    /// cuDNN does when it shrinks its workspace): a later request was made, served or not (cuDNN
    /// may try several smaller workspaces, each failing, before the request that ends the run).
    pub fn survived(&self, event: u64) -> bool {
        went_on_after(self.last_request, event)
    }
    /// The recorded OOM that ended the run: the last one, when no request follows it.
    pub fn fatal_oom(&self) -> Option<&RecordedOom> {
        self.recorded_ooms.last().filter(|o| !o.caught)
    }
    /// Recorded OOMs the program caught and went on from.
    pub fn caught_ooms(&self) -> usize {
        self.recorded_ooms.iter().filter(|o| o.caught).count()
    }
}

#[derive(Default)]
struct FactsFold {
    facts: Facts,
    reserved: u64,
    peak_reserved: u64,
    /// The block whose free the previous record asked for.
    asked: Option<u64>,
    /// The stream of the previous record that named one (most records name the stream before).
    last_stream: Option<u64>,
}

impl FactsFold {
    /// The facts, once every record has been folded.
    fn finish(mut self) -> Facts {
        let last_request = self.facts.last_request;
        for o in &mut self.facts.recorded_ooms {
            o.caught = went_on_after(last_request, o.event);
        }
        self.facts
    }

    #[inline]
    fn record(&mut self, i: u64, r: &Record) {
        let p = &mut self.facts;
        if let Some(id) = self.asked.take() {
            if !matches!(r.event, Event::FreeCompleted { id: done, .. } if done == id) {
                p.waited_frees += 1;
            }
        }
        if let Some(s) = streams::stream_of(&r.event).filter(|&s| self.last_stream != Some(s)) {
            self.last_stream = Some(s);
            p.streams.observe(s);
        }
        match &r.event {
            Event::Mark { .. } => p.iterations.observe(i, &r.event),
            Event::CallSite { id, frames } => p.sites.define(*id, frames),
            _ => {}
        }
        match r.event {
            Event::Alloc { requested_bytes, .. } => {
                p.largest_request_bytes = p.largest_request_bytes.max(requested_bytes);
                p.last_alloc = Some(i);
                p.last_request = Some(i);
            }
            Event::SegmentAlloc { addr, bytes, .. } => {
                p.segments.push((addr, bytes));
                self.reserved = self.reserved.saturating_add(bytes);
                self.peak_reserved = self.peak_reserved.max(self.reserved);
            }
            Event::SegmentMap { addr, bytes, .. } => {
                if p.reservations.is_empty() {
                    p.reservations.push(addr);
                }
                self.reserved = self.reserved.saturating_add(bytes);
                self.peak_reserved = self.peak_reserved.max(self.reserved);
            }
            Event::SegmentFree { bytes, .. } | Event::SegmentUnmap { bytes, .. } => {
                self.reserved = self.reserved.saturating_sub(bytes)
            }
            Event::FreeRequested { id, .. } => self.asked = Some(id),
            Event::CacheRelease { cause: recorder::trace::ReleaseCause::EmptyCache, .. } => p.empty_cache_releases += 1,
            Event::DeviceMemInfo { free_bytes, total_bytes } if p.recorded_ooms.is_empty() => {
                p.mem_info = Some((free_bytes, total_bytes))
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
                if p.recorded_ooms.is_empty() && limit_bytes == 0 && device_free_bytes > 0 {
                    if device_free_bytes < alloc_bytes {
                        // The device itself was full.
                        p.oom_capacity = Some(reserved_bytes.saturating_add(device_free_bytes));
                    } else {
                        let low = self.peak_reserved.max(reserved_bytes);
                        p.limit_range =
                            Some((low, reserved_bytes.saturating_add(alloc_bytes).max(low.saturating_add(1))));
                    }
                }
                p.last_request = Some(i);
                p.largest_request_bytes = p.largest_request_bytes.max(requested_bytes);
                p.recorded_ooms.push(RecordedOom {
                    event: i,
                    requested_bytes,
                    alloc_bytes,
                    device_free_bytes: (device_free_bytes > 0).then_some(device_free_bytes),
                    reserved_bytes,
                    allocated_bytes,
                    limit_bytes: (limit_bytes > 0).then_some(limit_bytes),
                    caught: false,
                });
            }
            _ => {}
        }
    }
}

/// The bytes a record holds in memory: itself and its text or frames (a mark of 4 KiB weighs
/// 4 KiB, not the size of a record), which [`RECORDS_BUDGET_BYTES`] counts.
fn record_bytes(r: &Record) -> usize {
    let heap = match &r.event {
        Event::Mark { text, .. } => text.capacity(),
        Event::CallSite { frames, .. } => {
            frames.iter().map(|f| std::mem::size_of_val(f) + f.file.capacity() + f.function.capacity()).sum()
        }
        _ => 0,
    };
    std::mem::size_of::<Record>() + heap
}

/// What reading a trace folds (its summary and facts), fed record by record: for a trace made
/// by this process ([`Trace::from_records`], [`Trace::written`]).
pub struct ReadFolds {
    summary: SummaryFold,
    facts: FactsFold,
    events: u64,
}

impl Default for ReadFolds {
    fn default() -> Self {
        ReadFolds { summary: SummaryFold::new(), facts: FactsFold::default(), events: 0 }
    }
}

impl ReadFolds {
    pub fn record(&mut self, r: &Record) {
        self.summary.record(self.events, r);
        self.facts.record(self.events, r);
        self.events += 1;
    }

    fn trace(self, path: &Path, header: Header, records: Records) -> Trace {
        Trace {
            path: path.to_path_buf(),
            header,
            end: TraceEnd::Reading,
            events: self.events,
            summary: self.summary.finish(),
            facts: self.facts.finish(),
            given_capacity: None,
            least_limit: None,
            records,
            passes: Default::default(),
        }
    }
}

/// The records of a trace: in memory (the decoded chunks), or re-read from the file.
enum Records {
    InMemory(Vec<Vec<Record>>),
    Restream,
}

/// What a pass over a trace's records was for: a fold (no engine) or a replay (one read of the
/// records driving every job of [`crate::replay`]'s loop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PassKind {
    Fold,
    Replay,
}

/// One pass over a trace's records, named by its kind and by the analysis that asked for it
/// (the source file's name: `explain`, `frag`...). A command's passes are part of its design:
/// [`Trace::passes`] lists them, and a test holds `report`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pass {
    pub kind: PassKind,
    pub by: &'static str,
}

impl Pass {
    #[track_caller]
    fn here(kind: PassKind) -> Pass {
        let file = std::panic::Location::caller().file();
        let mut parts = file.rsplit(['/', '\\']);
        let name = parts.next().unwrap_or(file);
        // A module in a folder (`plot/mod.rs`) is named by its folder.
        let name = if name == "mod.rs" { parts.next().unwrap_or(name) } else { name };
        Pass { kind, by: name.strip_suffix(".rs").unwrap_or(name) }
    }
}

/// A trace, read once. See the module documentation.
pub struct Trace {
    pub path: PathBuf,
    pub header: Header,
    pub end: TraceEnd,
    /// Events up to any damage.
    pub events: u64,
    pub summary: Summary,
    pub facts: Facts,
    /// The limit the user gave for this run (`--capacity`), which every command then reports as
    /// given rather than recorded.
    pub given_capacity: Option<u64>,
    /// Where the limit is inferred as a range ([`CapacitySource::InferredLimit`]): the least limit
    /// at which the recorded run replays as recorded up to its failure, found by replays
    /// (`analysis::capacity_search::least_implied_limit`), which raises the least of the range.
    pub least_limit: Option<u64>,
    records: Records,
    /// The passes over the records since the trace was read (the read itself not counted).
    passes: std::sync::Mutex<Vec<Pass>>,
}

impl Trace {
    /// Reads the trace at `path` (once), keeping its records in memory under
    /// [`RECORDS_BUDGET_BYTES`].
    pub fn open(path: &Path) -> Result<Trace> {
        Self::open_with_budget(path, RECORDS_BUDGET_BYTES)
    }

    /// [`Trace::open`] with another memory budget for the records (0: always re-stream).
    pub fn open_with_budget(path: &Path, budget_bytes: usize) -> Result<Trace> {
        let mut summary = SummaryFold::new();
        let mut facts = FactsFold::default();
        let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let fits = file_bytes.saturating_mul(RECORDS_PER_FILE_BYTE) <= budget_bytes as u64;
        let mut kept: Option<Vec<Vec<Record>>> = fits.then(Vec::new);
        let mut bytes = 0usize;
        let scanned = tracefile::scan_chunks(path, |first, chunk| {
            for (k, r) in chunk.iter().enumerate() {
                let i = first + k as u64;
                summary.record(i, r);
                facts.record(i, r);
                if kept.is_some() {
                    bytes = bytes.saturating_add(record_bytes(r));
                }
            }
            if bytes > budget_bytes {
                kept = None;
            } else if let Some(k) = kept.as_mut() {
                k.push(chunk.to_vec());
            }
        })?;
        Ok(Trace {
            path: path.to_path_buf(),
            header: scanned.header,
            end: scanned.end,
            events: scanned.events,
            summary: summary.finish(),
            facts: facts.finish(),
            given_capacity: None,
            least_limit: None,
            records: match kept {
                Some(chunks) => Records::InMemory(chunks),
                None => Records::Restream,
            },
            passes: Default::default(),
        })
    }

    /// A trace made in memory (an experiment's reordered records), as if read from `path`.
    pub fn from_records(path: &Path, header: Header, records: Vec<Record>) -> Trace {
        let mut read = ReadFolds::default();
        for r in &records {
            read.record(r);
        }
        read.trace(path, header, Records::InMemory(vec![records]))
    }

    /// The capacity a trace of `records` under `header` runs under ([`Trace::default_capacity`]),
    /// folded from the records where they lie, without keeping them (an importer's, before it
    /// decides how to read them again).
    pub fn default_capacity_of(header: &Header, records: &[Record]) -> Capacity {
        let mut read = ReadFolds::default();
        for r in records {
            read.record(r);
        }
        read.trace(Path::new(""), header.clone(), Records::InMemory(Vec::new())).default_capacity()
    }

    /// The trace this process has just written to `path` (an experiment's reordered records,
    /// too many to keep), each record handed to `read` as it was written: what a read of the
    /// file would fold, without reading it. Its records are streamed from the file.
    pub fn written(path: &Path, header: Header, read: ReadFolds) -> Trace {
        read.trace(path, header, Records::Restream)
    }

    /// A trace derived from this one (reordered or extended records), keeping the limit the
    /// user gave.
    pub fn derived(&self, header: Header, records: Vec<Record>) -> Trace {
        Trace {
            given_capacity: self.given_capacity,
            least_limit: self.least_limit,
            ..Trace::from_records(&self.path, header, records)
        }
    }

    /// The file name, which reports show instead of the path.
    pub fn name(&self) -> String {
        trace_name(&self.path)
    }

    /// For a request stream that was predicted rather than recorded (`alloctrace.predict`), the
    /// note saying what made it.
    pub fn predicted(&self) -> Option<&str> {
        let prefix = crate::source::import::torch::PREDICTED_NOTE;
        self.header.notes.iter().find(|n| n.starts_with(prefix)).map(String::as_str)
    }

    /// True for a predicted trace whose step used something whose memory is not predicted
    /// (its note says so, see [`crate::source::import::torch::PREDICTED_LOWER_BOUND`]): its requests
    /// are a lower bound on the real ones, so a replay that completes does not say it fits.
    pub fn predicted_lower_bound(&self) -> bool {
        self.predicted().is_some_and(|n| n.contains(crate::source::import::torch::PREDICTED_LOWER_BOUND))
    }

    /// True when every pass runs over records in memory.
    pub fn in_memory(&self) -> bool {
        matches!(self.records, Records::InMemory(_))
    }

    /// The damage of a truncated or corrupt trace.
    pub fn damage(&self) -> Option<Damage> {
        Damage::of(&self.path, &self.end, self.events)
    }

    /// What a scan of the whole trace saw.
    pub fn scanned(&self) -> Scanned {
        Scanned { path: self.path.clone(), header: self.header.clone(), events: self.events, end: self.end.clone() }
    }

    /// The capacity a replay runs under: `unlimited`, else the `given` one, else the one the
    /// trace recorded, else one inferred from its first OOM (see [`CapacitySource`]).
    pub fn capacity(&self, given: Option<u64>, unlimited: bool) -> Capacity {
        if unlimited {
            return Capacity::NONE;
        }
        if let Some(c) = given.or(self.given_capacity) {
            return Capacity::given(c);
        }
        if self.header.capacity_bytes > 0 {
            return Capacity { bytes: Some(self.header.capacity_bytes), source: CapacitySource::Recorded, range: None };
        }
        match (self.facts.oom_capacity, self.facts.limit_range) {
            (Some(c), _) => Capacity { bytes: Some(c), source: CapacitySource::InferredFromOom, range: None },
            (None, Some((low, high))) => {
                Capacity { bytes: Some(low), source: CapacitySource::InferredLimit, range: Some((low, high)) }
                    .raised_to(self.least_limit)
            }
            (None, None) => Capacity::NONE,
        }
    }

    /// The limit stated for this run: given (`--capacity`) or recorded, never inferred.
    pub fn stated_capacity(&self) -> Option<u64> {
        let c = self.default_capacity();
        matches!(c.source, CapacitySource::Given | CapacitySource::Recorded).then_some(c.bytes).flatten()
    }

    /// The trace's own capacity (recorded or inferred; see [`Trace::capacity`]).
    pub fn default_capacity(&self) -> Capacity {
        self.capacity(None, false)
    }

    /// Calls `fold(index, record)` for every record in order.
    #[track_caller]
    pub fn scan(&self, mut fold: impl FnMut(u64, &Record)) -> Result<Scanned> {
        self.pass(Pass::here(PassKind::Fold), 0, |first, chunk| {
            for (k, r) in chunk.iter().enumerate() {
                fold(first + k as u64, r);
            }
            ControlFlow::Continue(())
        })
    }

    /// Shows every record to each of `folds`: in one pass where `together` (the folds' states fit
    /// beside each other), else in a pass each.
    #[track_caller]
    pub fn fold_each(&self, together: bool, folds: &mut [&mut dyn Fold]) -> Result<()> {
        if together {
            if !folds.is_empty() {
                self.scan(|i, r| folds.iter_mut().for_each(|f| f.observe(i, r)))?;
            }
        } else {
            for f in folds.iter_mut() {
                self.scan(|i, r| f.observe(i, r))?;
            }
        }
        Ok(())
    }

    /// Calls `fold(first, chunk)` for every chunk of records in order, until it breaks.
    #[track_caller]
    pub fn scan_chunks(&self, fold: impl FnMut(u64, &[Record]) -> ControlFlow<()>) -> Result<Scanned> {
        self.pass(Pass::here(PassKind::Fold), 0, fold)
    }

    /// The replay loop's pass ([`crate::replay`]): [`Trace::scan_chunks`] over the chunks that
    /// hold record `from` or later; those before are skipped (re-streamed from the file, they
    /// are read but not decoded).
    #[track_caller]
    pub(crate) fn replay_pass(
        &self,
        from: u64,
        fold: impl FnMut(u64, &[Record]) -> ControlFlow<()>,
    ) -> Result<Scanned> {
        self.pass(Pass::here(PassKind::Replay), from, fold)
    }

    /// The passes made over the records since the trace was read, in order.
    pub fn passes(&self) -> Vec<Pass> {
        self.passes.lock().map(|p| p.clone()).unwrap_or_default()
    }

    fn pass(&self, pass: Pass, from: u64, fold: impl FnMut(u64, &[Record]) -> ControlFlow<()>) -> Result<Scanned> {
        let n = match self.passes.lock() {
            Ok(mut p) => {
                p.push(pass);
                p.len()
            }
            Err(_) => 0,
        };
        let started = std::time::Instant::now();
        let first = log_passes().then(|| *FIRST_PASS.get_or_init(|| started));
        let scanned = self.pass_over(from, fold);
        if let Some(first) = first {
            eprintln!(
                "pass {n}: {:?} by {} from record {from}: {:.3} s (ends {:.3} s after the first pass began)",
                pass.kind,
                pass.by,
                started.elapsed().as_secs_f64(),
                first.elapsed().as_secs_f64()
            );
        }
        scanned
    }

    fn pass_over(&self, from: u64, mut fold: impl FnMut(u64, &[Record]) -> ControlFlow<()>) -> Result<Scanned> {
        match &self.records {
            Records::InMemory(chunks) => {
                let mut first = 0u64;
                for c in chunks {
                    let next = first + c.len() as u64;
                    if next > from && fold(first, c).is_break() {
                        break;
                    }
                    first = next;
                }
                Ok(self.scanned())
            }
            Records::Restream => {
                // The records the first read kept: a pass stops where it found damage.
                let events = self.events;
                tracefile::scan_chunks_from(&self.path, from, |first, chunk| {
                    let n = chunk.len().min(events.saturating_sub(first) as usize);
                    if n == 0 || fold(first, &chunk[..n]).is_break() || n < chunk.len() {
                        return ControlFlow::Break(());
                    }
                    ControlFlow::Continue(())
                })?;
                Ok(self.scanned())
            }
        }
    }
}

/// When the first pass began, for [`log_passes`]' timeline.
static FIRST_PASS: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Whether each pass is logged to stderr as it ends (`ALLOCTRACE_PASSES=1`): its number, kind,
/// the analysis that asked for it, the record it started from, its wall time and when it ended
/// after the first pass began (the command's timeline). For developers who want to see a
/// command's plan; the output of the command is unchanged.
fn log_passes() -> bool {
    static LOG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOG.get_or_init(|| std::env::var_os("ALLOCTRACE_PASSES").is_some_and(|v| !v.is_empty() && v != "0"))
}

/// Tests and callers compare with the wire names.
impl PartialEq<&str> for OutcomeKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<&str> for Policy {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace this process writes, folded record by record as it is written
    /// ([`Trace::written`]), is the trace a read of the file gives: the same summary and facts,
    /// and the same records streamed from the file, on every shipped trace.
    #[test]
    fn a_written_trace_folds_as_its_read() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(root.join("traces")).unwrap() {
            let src = e.unwrap().path();
            if src.extension().is_none_or(|x| x != "atrace") {
                continue;
            }
            let t = Trace::open(&src).unwrap();
            let path = dir.path().join("written.atrace");
            let mut w = recorder::trace::TraceWriter::create(&path, &t.header).unwrap();
            let mut read = ReadFolds::default();
            t.scan(|_, r| {
                read.record(r);
                w.write(r).unwrap();
            })
            .unwrap();
            w.finish().unwrap();
            let written = Trace::written(&path, t.header.clone(), read);
            let opened = Trace::open_with_budget(&path, 0).unwrap();
            let json = |s: &Summary| serde_json::to_string(s).unwrap();
            assert_eq!(json(&written.summary), json(&opened.summary), "{}", src.display());
            // The facts, but for the order of their hash maps.
            let facts = |f: &Facts| {
                format!(
                    "{:?}",
                    (
                        (&f.segments, &f.reservations, &f.recorded_ooms, f.mem_info, f.oom_capacity, f.limit_range),
                        (f.last_alloc, f.last_request, &f.iterations.iterations(), f.empty_cache_releases),
                        (f.waited_frees, f.streams.handles_note(), f.largest_request_bytes),
                        f.sites.sites.iter().map(|s| &s.label).collect::<Vec<_>>(),
                    )
                )
            };
            assert_eq!(facts(&written.facts), facts(&opened.facts), "{}", src.display());
            assert_eq!((written.events, written.damage().is_none()), (opened.events, true), "{}", src.display());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            written.scan(|_, r| a.push(r.clone())).unwrap();
            opened.scan(|_, r| b.push(r.clone())).unwrap();
            assert!(a == b, "{}", src.display());
        }
    }

    /// [`RECORDS_PER_FILE_BYTE`] holds on every shipped trace and fixture of 64 KiB or more
    /// (8.5 to 18 times there; in smaller files the header and the frames weigh more): a file
    /// past the budget over it could not keep its records within the budget.
    #[test]
    fn records_take_more_room_than_their_file_on_every_shipped_trace() {
        fn walk(d: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out)
                } else if p.extension().is_some_and(|x| x == "atrace") {
                    out.push(p)
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        walk(&root.join("traces"), &mut files);
        walk(&root.join("tests/fixtures"), &mut files);
        files.retain(|p| std::fs::metadata(p).unwrap().len() >= 64 << 10);
        assert!(files.len() >= 100, "{} traces of 64 KiB or more", files.len());
        for p in files {
            let file_bytes = std::fs::metadata(&p).unwrap().len();
            let mut bytes = 0u64;
            tracefile::scan(&p, |_, r| bytes += record_bytes(r) as u64).unwrap();
            assert!(
                bytes >= file_bytes * RECORDS_PER_FILE_BYTE,
                "{}: {bytes} bytes of records from a {file_bytes}-byte file",
                p.display()
            );
        }
    }
}
