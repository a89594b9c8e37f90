//! Replays a trace's requests through the recorder's engine on a simulated device.
//!
//! Only the program's requests drive the engine: `alloc`, `free_requested`, `free_completed`,
//! the failed request of an `oom`, and `empty_cache()` releases. Everything else the source
//! allocator did (segments, splits, merges, its own OOM-path releases) is what the replay
//! recomputes, under the recorded configuration or any other.
//!
//! The simulated device hands out the recorded segment addresses, in order, while the replay
//! asks for segments of the recorded sizes (under the recorded configuration, always; under
//! another, until its segments part ways with the recorded run's), so the engine's
//! lowest-address tie-breaks make the choices the real run's driver addresses made. The
//! driver's addresses follow from the sequence of segment calls, not from the policy, so they
//! carry over to another policy for as long as its calls are the same.

use crate::model::Trace;
pub use crate::model::{Capacity, CapacitySource, Damage};
use crate::tracefile;
use anyhow::{Context, Result};
use recorder::device::SimDevice;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::{Engine, NullSink, Sink, Stats};
use recorder::trace::{Event, Header, Record, ReleaseCause, Source, TraceWriter};
use serde::Serialize;
use std::ops::ControlFlow;
use std::path::PathBuf;

/// Total memory assumed for the simulated device when neither the trace nor the caller knows
/// it: it only sizes expandable segments' address reservations.
pub const DEFAULT_DEVICE_BYTES: u64 = 80 << 30;

/// How to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// The allocator configuration; `None` = the one recorded in the trace.
    pub config: Option<AllocatorConfig>,
    /// The capacity limit; `None` = the trace's own (none if it has none).
    pub capacity_bytes: Option<u64>,
    /// Use no capacity limit even if the trace has one.
    pub unlimited: bool,
    /// Write the simulated run as a full trace here.
    pub output: Option<PathBuf>,
}

/// How a replay ended.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Outcome {
    Ok,
    Oom {
        /// Index (in the input trace) of the request that failed.
        event: u64,
        time_ns: u64,
        requested_bytes: u64,
        /// The segment size the allocator tried to get.
        alloc_bytes: u64,
        stream: u64,
        reserved_bytes: u64,
        allocated_bytes: u64,
    },
}

/// Writes an [`Outcome`] as JSON v1 does, beside the other fields of its struct (with
/// `#[serde(flatten, serialize_with = ...)]`): `"outcome": "ok" | "oom"`, `"oom_event"` (the
/// index of the failed request, `null` when none failed) and `"oom"` (its figures, or `null`).
pub fn outcome_fields<S: serde::Serializer>(o: &Outcome, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(3))?;
    match o {
        Outcome::Ok => {
            m.serialize_entry("outcome", "ok")?;
            m.serialize_entry("oom_event", &None::<u64>)?;
            m.serialize_entry("oom", &None::<u64>)?;
        }
        Outcome::Oom { event, .. } => {
            m.serialize_entry("outcome", "oom")?;
            m.serialize_entry("oom_event", event)?;
            m.serialize_entry("oom", o)?;
        }
    }
    m.end()
}

/// What a replay computed.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayResult {
    #[serde(flatten, serialize_with = "outcome_fields")]
    pub outcome: Outcome,
    /// The configuration replayed, as a `PYTORCH_CUDA_ALLOC_CONF` string.
    pub alloc_conf: String,
    pub capacity_bytes: Option<u64>,
    pub capacity_source: CapacitySource,
    pub used_recorded_addresses: bool,
    pub events: u64,
    pub requests: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub peak_requested_bytes: u64,
    pub peak_active_bytes: u64,
    pub peak_inactive_split_bytes: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub num_sync_all_streams: u64,
    pub end_allocated_bytes: u64,
    pub end_reserved_bytes: u64,
    /// Allocated bytes when reserved bytes first reached their peak.
    pub allocated_at_peak_reserved_bytes: u64,
    /// Frees of blocks the replay does not know (e.g. allocated before a truncated trace began).
    pub anomalies: u64,
    /// How far the replay got against the recorded run (for a trace that ends in an OOM, never
    /// "completes").
    pub reach: crate::outcome::Reach,
    /// Recorded OOMs the program caught and went on from, which the replay went on past.
    pub caught_recorded_ooms: u64,
    /// False when the input was damaged: the replay covers what came before the damage.
    pub complete: bool,
    /// The input trace was damaged; the replay covers what came before the damage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_damage: Option<Damage>,
}

impl ReplayResult {
    pub fn is_oom(&self) -> bool {
        matches!(self.outcome, Outcome::Oom { .. })
    }
    /// `1 - allocated / reserved` where it matters: at the OOM, else when reserved bytes first
    /// reached their peak (the ratio of the two peaks, taken at different moments, can read 0).
    pub fn fragmentation_where_it_matters(&self) -> f64 {
        let (allocated, reserved) = match self.outcome {
            Outcome::Oom { reserved_bytes, allocated_bytes, .. } => (allocated_bytes, reserved_bytes),
            Outcome::Ok => (self.allocated_at_peak_reserved_bytes, self.peak_reserved_bytes),
        };
        if reserved == 0 {
            0.0
        } else {
            1.0 - allocated.min(reserved) as f64 / reserved as f64
        }
    }
    pub fn outcome_kind(&self) -> crate::model::OutcomeKind {
        match self.outcome {
            Outcome::Ok => crate::model::OutcomeKind::Ok,
            Outcome::Oom { .. } => crate::model::OutcomeKind::Oom,
        }
    }
    /// Index of the request that failed, if one did.
    pub fn oom_event(&self) -> Option<u64> {
        match self.outcome {
            Outcome::Ok => None,
            Outcome::Oom { event, .. } => Some(event),
        }
    }
}

/// The live allocations of a replay: trace `id` -> address in the replay. (Fx hashing: ids
/// are small integers, and SipHash cost more than the engine's own work per request.)
pub type LiveMap = rustc_hash::FxHashMap<u64, u64>;

/// What an observer of a replay can see of the engine after each record.
pub trait EngineView {
    fn stats(&self) -> &Stats;
    /// The current layout: segments and their blocks in address order.
    fn segments(&self) -> Vec<recorder::engine::SegmentView>;
    /// The measures of the current layout ([`crate::frag::LayoutMeasures::of`] of
    /// [`EngineView::segments`], without building them).
    fn layout(&self) -> crate::frag::LayoutMeasures;
    fn config(&self) -> &AllocatorConfig;
    fn capacity(&self) -> Option<u64>;
}

impl<S: Sink> EngineView for Engine<SimDevice, S> {
    fn stats(&self) -> &Stats {
        Engine::stats(self)
    }
    fn segments(&self) -> Vec<recorder::engine::SegmentView> {
        Engine::segments(self)
    }
    fn layout(&self) -> crate::frag::LayoutMeasures {
        let mut m = crate::frag::LayoutMeasures::default();
        self.visit_blocks(|starts, b| m.add(starts, b));
        m.finish();
        m
    }
    fn config(&self) -> &AllocatorConfig {
        Engine::config(self)
    }
    fn capacity(&self) -> Option<u64> {
        Engine::capacity(self)
    }
}

/// Called after each record of a replay with the record's index, the record, the engine, and
/// the live allocations (trace `id` -> address in the replay).
pub type Observer<'a> = dyn FnMut(u64, &Record, &dyn EngineView, &LiveMap) + 'a;

/// Reads the trace at `path` and replays it (for callers with one replay to make).
pub fn replay_file(path: &std::path::Path, opts: &ReplayOptions) -> Result<ReplayResult> {
    replay(&Trace::open(path)?, opts)
}

/// Replays `trace`.
pub fn replay(trace: &Trace, opts: &ReplayOptions) -> Result<ReplayResult> {
    replay_observed(trace, opts, &mut |_, _, _, _| {})
}

/// What a replay starts from: the configuration, capacity and device it runs under.
struct Setup {
    config: AllocatorConfig,
    capacity: Capacity,
    device: SimDevice,
    used_hints: bool,
}

fn setup(trace: &Trace, opts: &ReplayOptions) -> Setup {
    let header = &trace.header;
    let config = opts.config.clone().unwrap_or_else(|| header.config.clone());
    let capacity = trace.capacity(opts.capacity_bytes, opts.unlimited);
    let device_total = if header.device_total_bytes > 0 { header.device_total_bytes } else { DEFAULT_DEVICE_BYTES };
    let mut device = SimDevice::new(Some(device_total.max(capacity.bytes.unwrap_or(0))));
    let used_hints = header.source != Source::Simulated;
    if used_hints {
        device = device
            .with_segment_hints(trace.facts.segments.clone())
            .with_reserve_hints(trace.facts.reservations.clone());
    }
    Setup { config, capacity, device, used_hints }
}

/// Replays `trace`, calling `observer` after every record. The observer is not called for
/// records after an OOM that ended the replay.
pub fn replay_observed(trace: &Trace, opts: &ReplayOptions, observer: &mut Observer<'_>) -> Result<ReplayResult> {
    let Setup { config, capacity: cap, device, used_hints } = setup(trace, opts);
    let capacity = cap.bytes;
    let header = &trace.header;
    let path = &trace.path;
    match &opts.output {
        None => {
            let engine = Engine::new(config, capacity, device, NullSink);
            run(trace, engine, used_hints, cap.source, &mut |_, _| Ok(()), observer)
        }
        Some(out) => {
            let mut h = header.clone();
            h.source = Source::Simulated;
            h.tool_version = env!("CARGO_PKG_VERSION").to_string();
            h.alloc_conf = config.to_string();
            h.config = config.clone();
            h.capacity_bytes = capacity.unwrap_or(0);
            h.notes.push(format!(
                "replayed from {} under `{}`{}",
                path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                h.alloc_conf,
                capacity.map(|c| format!(" with capacity {c} bytes")).unwrap_or_default()
            ));
            crate::output::refuse_input(out, &[path])?;
            let pending = crate::output::Pending::new(out)?;
            let mut writer = TraceWriter::create(pending.temp_path(), &h)
                .with_context(|| format!("cannot write {}", out.display()))?;
            let engine = Engine::new(config, capacity, device, Vec::<Event>::with_capacity(64));
            let result = run(
                trace,
                engine,
                used_hints,
                cap.source,
                &mut |time_ns, events: &mut Vec<Event>| {
                    for event in events.drain(..) {
                        writer.write(&Record { time_ns, event })?;
                    }
                    Ok(())
                },
                observer,
            )?;
            writer.finish().with_context(|| format!("cannot write {}", out.display()))?;
            pending.commit()?;
            Ok(result)
        }
    }
}

/// Takes the engine's events after each request, stamped with the request's time.
type Drain<'a, S> = dyn FnMut(u64, &mut S) -> Result<(), recorder::trace::TraceError> + 'a;

/// One replay in progress: the engine and what it has seen of the trace.
#[derive(Clone)]
struct Replaying<S: Sink> {
    engine: Engine<SimDevice, S>,
    /// Trace id -> address in the replay.
    live: LiveMap,
    outcome: Outcome,
    requests: u64,
    anomalies: u64,
    /// Set at the first OOM the program did not survive: it stopped there.
    stopped: bool,
    /// Index of the trace's last allocation: a recorded OOM before it was caught by the program.
    last_alloc: Option<u64>,
    /// Allocated bytes when reserved bytes first reached their peak.
    allocated_at_peak: u64,
    peak_seen: u64,
}

impl<S: Sink + ForwardEvents> Replaying<S> {
    fn new(engine: Engine<SimDevice, S>) -> Self {
        Replaying {
            engine,
            live: LiveMap::default(),
            outcome: Outcome::Ok,
            requests: 0,
            anomalies: 0,
            stopped: false,
            last_alloc: None,
            allocated_at_peak: 0,
            peak_seen: 0,
        }
    }

    /// Goes on past the recorded OOMs that the program survived (see [`Facts::survived`]).
    ///
    /// [`Facts::survived`]: crate::model::Facts::survived
    fn continuing(mut self, trace: &Trace) -> Self {
        self.last_alloc = trace.facts.last_alloc;
        self
    }

    /// Replays one record (a request) or skips it (the source allocator's own decisions).
    fn step(&mut self, index: u64, r: &Record) {
        let engine = &mut self.engine;
        match &r.event {
            Event::Alloc { id, requested_bytes, stream, callsite, .. } => {
                self.requests += 1;
                match engine.malloc(*requested_bytes, *stream, *callsite) {
                    Ok(a) => {
                        self.live.insert(*id, a.addr);
                        let st = engine.stats();
                        if st.reserved_bytes.all.current > self.peak_seen {
                            self.peak_seen = st.reserved_bytes.all.current;
                            self.allocated_at_peak = st.allocated_bytes.all.current;
                        }
                    }
                    Err(oom) => {
                        self.outcome = oom_outcome(index, r.time_ns, *stream, &oom);
                        self.stopped = true;
                    }
                }
            }
            Event::FreeRequested { id, .. } => match self.live.get(id) {
                Some(&addr) => {
                    if engine.free_requested(addr).is_err() {
                        self.anomalies += 1;
                    }
                }
                None => self.anomalies += 1,
            },
            Event::FreeCompleted { id, .. } => match self.live.remove(id) {
                Some(addr) => {
                    // A completion without a request: the source freed in one step.
                    if engine.free_completed(addr).is_err() && engine.free(addr).is_err() {
                        self.anomalies += 1;
                    }
                }
                None => self.anomalies += 1,
            },
            Event::Oom { requested_bytes, stream, .. } => {
                // The request that failed in the recorded run: does it fail here too?
                self.requests += 1;
                let caught = self.last_alloc.is_some_and(|a| a > index);
                match engine.malloc(*requested_bytes, *stream, 0) {
                    // The program caught the recorded OOM and went on without the block (cuDNN
                    // trying a smaller workspace): the engine counted the OOM; go on too.
                    Err(_) if caught => {}
                    Err(oom) => {
                        self.outcome = oom_outcome(index, r.time_ns, *stream, &oom);
                        self.stopped = true;
                    }
                    // Served here; the program, which got nothing there, made its next requests
                    // without it.
                    Ok(a) if caught => {
                        let _ = engine.free(a.addr);
                    }
                    Ok(_) => {}
                }
            }
            Event::CacheRelease { cause: ReleaseCause::EmptyCache, .. } => {
                engine.empty_cache();
            }
            Event::Mark { .. } | Event::CallSite { .. } => engine.sink_mut().forward(&r.event),
            // The source allocator's own decisions: recomputed, not replayed.
            Event::CacheRelease { .. }
            | Event::SegmentAlloc { .. }
            | Event::SegmentFree { .. }
            | Event::SegmentMap { .. }
            | Event::SegmentUnmap { .. }
            | Event::Split { .. }
            | Event::Merge { .. }
            | Event::Snapshot { .. }
            | Event::DeviceMemInfo { .. }
            | Event::Dropped { .. }
            | Event::SegmentPool { .. } => {}
        }
    }

    fn result(&self, used_hints: bool, capacity_source: CapacitySource, trace: &Trace) -> ReplayResult {
        let engine = &self.engine;
        let st: &Stats = engine.stats();
        let mut r = ReplayResult {
            outcome: self.outcome.clone(),
            alloc_conf: engine.config().to_string(),
            capacity_bytes: engine.capacity(),
            capacity_source,
            used_recorded_addresses: used_hints,
            events: trace.events,
            requests: self.requests,
            peak_allocated_bytes: st.allocated_bytes.all.peak,
            peak_reserved_bytes: st.reserved_bytes.all.peak,
            peak_requested_bytes: st.requested_bytes.all.peak,
            peak_active_bytes: st.active_bytes.all.peak,
            peak_inactive_split_bytes: st.inactive_split_bytes.all.peak,
            num_alloc_retries: st.num_alloc_retries,
            num_ooms: st.num_ooms,
            num_device_alloc: st.num_device_alloc,
            num_device_free: st.num_device_free,
            num_sync_all_streams: st.num_sync_all_streams,
            end_allocated_bytes: st.allocated_bytes.all.current,
            end_reserved_bytes: st.reserved_bytes.all.current,
            allocated_at_peak_reserved_bytes: self.allocated_at_peak,
            anomalies: self.anomalies,
            reach: crate::outcome::Reach::Completes,
            caught_recorded_ooms: match &self.outcome {
                Outcome::Ok => trace.facts.caught_ooms() as u64,
                Outcome::Oom { event, .. } => trace
                    .facts
                    .recorded_ooms
                    .iter()
                    .filter(|o| o.event < *event && trace.facts.survived(o.event))
                    .count() as u64,
            },
            complete: trace.damage().is_none(),
            input_damage: trace.damage(),
        };
        r.reach = crate::outcome::Reach::of(trace, &r);
        r
    }
}

fn run<S: Sink + ForwardEvents>(
    trace: &Trace,
    engine: Engine<SimDevice, S>,
    used_hints: bool,
    capacity_source: CapacitySource,
    drain: &mut Drain<'_, S>,
    observer: &mut Observer<'_>,
) -> Result<ReplayResult> {
    let mut rp = Replaying::new(engine).continuing(trace);
    let mut error: Option<anyhow::Error> = None;
    trace.scan_chunks(|first, chunk| {
        for (k, r) in chunk.iter().enumerate() {
            let index = first + k as u64;
            rp.step(index, r);
            observer(index, r, &rp.engine, &rp.live);
            if error.is_none() {
                if let Err(e) = drain(r.time_ns, rp.engine.sink_mut()) {
                    error = Some(e.into());
                    rp.stopped = true;
                }
            }
            if rp.stopped {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    if let Some(e) = error {
        return Err(e.context("cannot write the simulated trace"));
    }
    Ok(rp.result(used_hints, capacity_source, trace))
}

/// An observer that may run on another thread (see [`replay_many`]).
pub type SendObserver<'a> = dyn FnMut(u64, &Record, &dyn EngineView, &LiveMap) + Send + 'a;

/// Several replays of one trace (different settings or capacities) driven by one read of it:
/// each decoded chunk is fed to every replay, in parallel. The results are in the order of
/// `runs`. Writing a replay's output (`ReplayOptions::output`) is not supported here.
pub fn replay_many(trace: &Trace, runs: Vec<(ReplayOptions, Box<SendObserver<'_>>)>) -> Result<Vec<ReplayResult>> {
    use rayon::prelude::*;
    struct One<'a> {
        rp: Replaying<NullSink>,
        observer: Box<SendObserver<'a>>,
        used_hints: bool,
        capacity_source: CapacitySource,
    }
    let mut all: Vec<One<'_>> = Vec::with_capacity(runs.len());
    for (opts, observer) in runs {
        anyhow::ensure!(opts.output.is_none(), "replay_many does not write simulated traces");
        let s = setup(trace, &opts);
        all.push(One {
            rp: Replaying::new(Engine::new(s.config, s.capacity.bytes, s.device, NullSink)).continuing(trace),
            observer,
            used_hints: s.used_hints,
            capacity_source: s.capacity.source,
        });
    }
    trace.scan_chunks(|first, chunk| {
        let work = |one: &mut One<'_>| {
            for (k, r) in chunk.iter().enumerate() {
                if one.rp.stopped {
                    break;
                }
                let index = first + k as u64;
                one.rp.step(index, r);
                (one.observer)(index, r, &one.rp.engine, &one.rp.live);
            }
        };
        if all.len() > 1 {
            all.par_iter_mut().for_each(work);
        } else {
            all.iter_mut().for_each(work);
        }
        if all.iter().all(|one| one.rp.stopped) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    Ok(all.iter().map(|one| one.rp.result(one.used_hints, one.capacity_source, trace)).collect())
}

fn oom_outcome(index: u64, time_ns: u64, stream: u64, oom: &recorder::engine::OutOfMemory) -> Outcome {
    Outcome::Oom {
        event: index,
        time_ns,
        requested_bytes: oom.requested_bytes,
        alloc_bytes: oom.alloc_bytes,
        stream,
        reserved_bytes: oom.reserved_bytes,
        allocated_bytes: oom.allocated_bytes,
    }
}

/// Sinks that can carry the input's marks and call sites into a replay's output.
pub trait ForwardEvents {
    fn forward(&mut self, e: &Event);
}
impl ForwardEvents for NullSink {
    #[inline(always)]
    fn forward(&mut self, _e: &Event) {}
}
impl ForwardEvents for Vec<Event> {
    fn forward(&mut self, e: &Event) {
        self.push(e.clone());
    }
}

/// The header of a trace, for commands that need only that.
pub fn read_header(path: &std::path::Path) -> Result<Header> {
    Ok(tracefile::open(path)?.header().clone())
}

/// Replays of one configuration at many capacities that share the unlimited run's prefix.
///
/// Under a limit `C`, the engine makes the same choices as with no limit until the first
/// request for which the unlimited run's reserved bytes go above `C` (the limit is only read
/// when a segment is asked for; the garbage collector, which reads it all along, is excluded).
/// So the unlimited run is replayed once, saved before the events where its reserved bytes
/// first pass each of a few levels, and a replay at `C` resumes from the save of the highest
/// level at or below `C` instead of starting over: the capacity search then costs little more
/// than the events after the run first needs more than `C`.
///
/// Worked example: the unlimited run reserves 1, 2, 3, 4 GiB at events 10, 20, 30, 40; levels
/// 1.5 and 2.5 GiB are saved before events 20 and 30. A replay at 2.7 GiB resumes before
/// event 30 (it first matters at event 30, where 3 GiB > 2.7 GiB).
pub struct Resumable {
    config: AllocatorConfig,
    /// The unlimited run's device (probes above its size take another one: no resuming).
    device_bytes: u64,
    /// (level, event index, the replay's state before that event), levels ascending.
    saves: Vec<(u64, u64, Replaying<NullSink>)>,
    used_hints: bool,
}

/// The unlimited run of `config`, and [`Resumable`] saves at `levels` reserved levels evenly
/// spread from `lower` to the run's peak reserved. Two passes: one finds where reserved bytes
/// first pass each level, one saves the state there.
pub fn resumable(
    trace: &Trace,
    config: &AllocatorConfig,
    lower: u64,
    levels: u64,
) -> Result<(ReplayResult, Option<Resumable>)> {
    let opts = ReplayOptions { config: Some(config.clone()), unlimited: true, ..Default::default() };
    if config.garbage_collection_threshold.is_some_and(|t| t > 0.0) || levels == 0 {
        return Ok((replay(trace, &opts)?, None));
    }
    // Without expandable segments the device's size only matters once the limit is passed
    // (segments are reserved bytes, and the limit is checked first), so the saved run takes a
    // device without a limit and serves every capacity. Expandable segments size their
    // address reservations from the device: there the run keeps the trace's device, and serves
    // the capacities up to its size.
    let s = setup(trace, &opts);
    let device = if config.expandable_segments {
        s.device
    } else {
        let mut d = SimDevice::new(None);
        if s.used_hints {
            d = d.with_segment_hints(trace.facts.segments.clone()).with_reserve_hints(trace.facts.reservations.clone());
        }
        d
    };
    let device_bytes = device.capacity().unwrap_or(u64::MAX);
    let fresh = || Replaying::new(Engine::new(s.config.clone(), None, device.clone(), NullSink));
    // Pass 1: the unlimited run, and each new peak of reserved bytes (event, bytes).
    let mut peaks: Vec<(u64, u64)> = Vec::new();
    let mut rp = fresh();
    trace.scan_chunks(|first, chunk| {
        for (k, r) in chunk.iter().enumerate() {
            let index = first + k as u64;
            rp.step(index, r);
            let reserved = rp.engine.stats().reserved_bytes.all.current;
            if peaks.last().is_none_or(|&(_, b)| reserved > b) {
                peaks.push((index, reserved));
            }
            if rp.stopped {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    let unlimited = rp.result(s.used_hints, CapacitySource::None, trace);
    let upper = unlimited.peak_reserved_bytes;
    // Each level, and the first event at which reserved bytes go above it.
    let mut plan: Vec<(u64, u64)> = Vec::new();
    for k in 0..levels {
        let level = lower + (upper.saturating_sub(lower)) / levels * k;
        let Some(&(event, _)) = peaks.iter().find(|&&(_, b)| b > level) else { break };
        if plan.last().is_none_or(|&(_, e)| e < event) {
            plan.push((level, event));
        } else if let Some(last) = plan.last_mut() {
            // Two levels first passed at one event: keep the higher level.
            last.0 = level;
        }
    }
    // Pass 2: the same run, saved before each planned event.
    let mut rp = fresh();
    let mut saves = Vec::with_capacity(plan.len());
    let mut next = 0usize;
    trace.scan_chunks(|first, chunk| {
        for (k, r) in chunk.iter().enumerate() {
            let index = first + k as u64;
            while next < plan.len() && plan[next].1 == index {
                saves.push((plan[next].0, index, rp.clone()));
                next += 1;
            }
            if next == plan.len() {
                return ControlFlow::Break(());
            }
            rp.step(index, r);
            if rp.stopped {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    Ok((unlimited, Some(Resumable { config: config.clone(), device_bytes, saves, used_hints: s.used_hints })))
}

/// The replay of the [`Resumable`] configuration at `capacity`, resumed from the latest save
/// that is valid for it (see [`Resumable`]); from the start when none is.
pub fn replay_resumed(trace: &Trace, from: &Resumable, capacity: u64) -> Result<ReplayResult> {
    let save = from.saves.iter().rev().find(|(level, _, _)| *level <= capacity);
    let Some((_, start, state)) = save.filter(|_| capacity <= from.device_bytes) else {
        let opts =
            ReplayOptions { config: Some(from.config.clone()), capacity_bytes: Some(capacity), ..Default::default() };
        return replay(trace, &opts);
    };
    let mut rp = state.clone();
    rp.engine.set_capacity(Some(capacity));
    let start = *start;
    trace.scan_chunks(|first, chunk| {
        let end = first + chunk.len() as u64;
        if end <= start {
            return ControlFlow::Continue(());
        }
        let skip = start.saturating_sub(first) as usize;
        for (k, r) in chunk.iter().enumerate().skip(skip) {
            rp.step(first + k as u64, r);
            if rp.stopped {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    Ok(rp.result(from.used_hints, CapacitySource::Given, trace))
}
