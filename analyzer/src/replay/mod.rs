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

pub mod progress;

use crate::model::Trace;
pub use crate::model::{Capacity, CapacitySource, Damage};
use crate::source::tracefile;
use anyhow::{Context, Result};
use recorder::device::SimDevice;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::version::TorchVersion;
use recorder::engine::{Engine, NullSink, Sink, Stats};
use recorder::trace::{Event, Header, Record, RecordedPools, ReleaseCause, Source, TraceWriter};
use serde::Serialize;
use std::collections::HashSet;
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
    /// Stop after the record with this index (an observer that needs nothing later): the
    /// result then describes the run up to there.
    pub stop_after: Option<u64>,
    /// Go on past a request that fails where the recorded run served it, when the failed block
    /// is a scratch buffer the program frees before its next request (cuDNN's workspace):
    /// PyTorch's cuDNN convolutions catch that error and try a plan with a smaller workspace
    /// (`try_plans` in `aten/src/ATen/native/cudnn/Conv_v8.cpp`). The replay goes on without the
    /// block; the smaller workspace is not in the trace. Counted in
    /// [`ReplayResult::scratch_failures_skipped`].
    pub past_caught_scratch: bool,
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

/// Why a failure in a replay, at a request the recorded run served, may not have ended the
/// program. What a program does after it catches an out-of-memory error is not in the trace
/// (it asks for other things: a smaller batch, a plan with a smaller workspace), so a replay
/// that fails there cannot tell whether the job would have completed.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MayBeCaught {
    /// The trace holds an out-of-memory error that the program caught and went on from: it
    /// catches them.
    ProgramCatches,
    /// The failed request was a scratch buffer, freed before the program's next request, as a
    /// cuDNN workspace is: PyTorch's cuDNN convolutions catch the error of a workspace that
    /// cannot be had and try the next plan, which asks for another workspace (`try_plans` and
    /// `generate_and_filter_plans` in `aten/src/ATen/native/cudnn/Conv_v8.cpp`).
    ScratchBuffer,
}

impl MayBeCaught {
    /// In a sentence, after "the replay runs out of memory at a request ...".
    pub fn text(self) -> &'static str {
        match self {
            MayBeCaught::ProgramCatches => {
                "the program catches out-of-memory errors (the trace holds one it went on from), and what it asks \
for after catching one is not in the trace"
            }
            MayBeCaught::ScratchBuffer => {
                "that request was a scratch buffer freed before the next request, as cuDNN's workspace is; PyTorch's \
cuDNN convolutions catch such an error and try a plan with another workspace, which the trace does not hold"
            }
        }
    }
}

/// How far a replay gets, against what the trace recorded.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    /// The trace ends without an OOM, and the replay served every request.
    Completes,
    /// The trace ends without an OOM, and the replay ran out of memory.
    RunsOutOfMemory,
    /// The trace ends in an OOM, and the replay fails at the same request.
    FailsWhereRecorded,
    /// The trace ends in an OOM, and the replay fails at an earlier request.
    FailsEarlier,
    /// The trace ends in an OOM, and the replay serves that request: the rest of the job (the
    /// requests the program would have made next) is not in the trace.
    GetsPastFailure,
    /// The trace is cut short (damaged), and the replay served every request read: what came
    /// after the damage is unknown.
    ReachesDamage,
    /// The replay ran out of memory at a request the recorded run served, and the program may
    /// have caught that error and gone on (see [`MayBeCaught`]): whether the job
    /// got further cannot be told from the trace.
    CannotTell,
}

impl Reach {
    /// How far `r`, a replay of `trace`, got.
    pub fn of(trace: &Trace, r: &ReplayResult) -> Reach {
        match (trace.facts.fatal_oom().map(|o| o.event), r.oom_event()) {
            (Some(f), Some(e)) if e >= f => Reach::FailsWhereRecorded,
            (_, Some(_)) if r.failure_may_be_caught.is_some() => Reach::CannotTell,
            (Some(_), Some(_)) => Reach::FailsEarlier,
            (Some(_), None) => Reach::GetsPastFailure,
            (None, Some(_)) => Reach::RunsOutOfMemory,
            (None, None) if trace.damage().is_some() => Reach::ReachesDamage,
            (None, None) => Reach::Completes,
        }
    }
    /// Whether the replay got at least as far as the recorded run.
    pub fn at_least_as_far(self) -> bool {
        !matches!(self, Reach::FailsEarlier | Reach::RunsOutOfMemory | Reach::CannotTell)
    }
    /// Whether the replay served a request the recorded run failed.
    pub fn gets_past(self) -> bool {
        matches!(self, Reach::GetsPastFailure)
    }
    /// The column of a table (at most 12 characters).
    pub fn short(self) -> &'static str {
        match self {
            Reach::Completes => "completes",
            Reach::RunsOutOfMemory => "oom",
            Reach::FailsWhereRecorded => "fails there",
            Reach::FailsEarlier => "fails sooner",
            Reach::GetsPastFailure => "gets past",
            Reach::ReachesDamage => "to damage",
            Reach::CannotTell => "cannot tell",
        }
    }
    /// In a sentence.
    pub fn text(self) -> &'static str {
        match self {
            Reach::Completes => "completes",
            Reach::RunsOutOfMemory => "runs out of memory",
            Reach::FailsWhereRecorded => "fails at the request where the recorded run failed",
            Reach::FailsEarlier => "fails earlier than the recorded run",
            Reach::GetsPastFailure => "gets past the request that failed; the rest of the job is not in the trace",
            Reach::ReachesDamage => "serves every request up to the damage; the rest of the trace is unknown",
            Reach::CannotTell => {
                "runs out of memory at a request the recorded run served, an error the program may have caught and \
gone on from: the trace cannot tell whether the job would have got further"
            }
        }
    }
}

impl std::fmt::Display for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.short())
    }
}

/// Where a replay placed segments by the driver's rule ([`ReplayResult::segments_placed_by_rule`]):
/// how many, against those at recorded addresses, in the words every output uses; `None` where
/// the rule placed none.
pub fn placed_by_rule(at_recorded_addresses: u64, placed_by_rule: u64) -> Option<String> {
    (placed_by_rule > 0).then(|| {
        format!(
            "{at_recorded_addresses} of {} segments at the recorded addresses; {placed_by_rule} of sizes the recorded \
run did not ask for there placed by a rule for where the CUDA driver puts them",
            at_recorded_addresses + placed_by_rule
        )
    })
}

/// What follows from segments placed by the driver's rule, and how far it went in the truth
/// table's runs (`docs/fidelity.md`): said by every output that names such segments.
pub const PLACED_BY_RULE_MISS: &str =
    "best fit breaks ties between free blocks of one size by address, so the figures \
can differ from a real run under these settings (peak reserved by up to 6.8% in docs/fidelity.md)";

/// What a replay computed.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayResult {
    #[serde(flatten, serialize_with = "outcome_fields")]
    pub outcome: Outcome,
    /// The configuration replayed, as a `PYTORCH_CUDA_ALLOC_CONF` string.
    pub alloc_conf: String,
    /// The PyTorch release whose allocator the replay followed, e.g. "2.12".
    pub torch_version: String,
    /// Neither the trace nor the caller named a release: the replay followed the one the engine
    /// was checked against ([`TorchVersion::MODELLED`]).
    pub torch_version_assumed: bool,
    pub capacity_bytes: Option<u64>,
    pub capacity_source: CapacitySource,
    pub used_recorded_addresses: bool,
    /// Where [`ReplayResult::used_recorded_addresses`]: the segments placed at a recorded
    /// address, and those of a size the recorded run did not ask for there, which the driver's
    /// rule placed (`recorder::device::placement`): ties between free blocks of one size among
    /// those can go otherwise than in a real run under these settings. 0 and 0 otherwise, and
    /// with expandable segments (their reservations take the recorded addresses in order).
    pub segments_at_recorded_addresses: u64,
    pub segments_placed_by_rule: u64,
    pub events: u64,
    pub requests: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub peak_requested_bytes: u64,
    pub peak_active_bytes: u64,
    pub peak_inactive_split_bytes: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// Device allocations refused at once because they would pass the memory fraction
    /// (`throw_on_cudamalloc_oom`, PyTorch 2.12 and later).
    pub num_oom_rejections: u64,
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
    pub reach: Reach,
    /// Recorded OOMs the program caught and went on from, which the replay went on past.
    pub caught_recorded_ooms: u64,
    /// The replay ran out of memory at a request the recorded run served, and the program may
    /// have caught that error and gone on with requests the trace does not hold: the outcome of
    /// the whole run cannot be told (see [`MayBeCaught`]). `None` when the failure was final.
    pub failure_may_be_caught: Option<MayBeCaught>,
    /// False when the input was damaged: the replay covers what came before the damage.
    pub complete: bool,
    /// The input trace was damaged; the replay covers what came before the damage (`null` in
    /// JSON where it was not, as in every output).
    pub input_damage: Option<Damage>,
    /// Scratch buffers whose request failed and that the replay went on without
    /// ([`ReplayOptions::past_caught_scratch`]); 0 otherwise.
    #[serde(skip_serializing_if = "crate::model::units::is_zero")]
    pub scratch_failures_skipped: u64,
    /// The capacities `[low, high)` under which the replay makes the same run, to the same
    /// outcome (see [`recorder::engine::Engine::capacity_band`]); `None` where a capacity also
    /// sets when the garbage collector runs. A capacity search takes the outcome of every
    /// capacity in the band from this one replay.
    #[serde(skip)]
    pub capacity_band: Option<(u64, u64)>,
}

impl ReplayResult {
    pub fn is_oom(&self) -> bool {
        matches!(self.outcome, Outcome::Oom { .. })
    }
    /// Allocated and reserved bytes where fragmentation matters: at the OOM, else when reserved
    /// bytes first reached their peak (the two peaks, taken at different moments, say nothing
    /// of each other).
    pub fn allocated_and_reserved_where_it_matters(&self) -> (u64, u64) {
        match self.outcome {
            Outcome::Oom { reserved_bytes, allocated_bytes, .. } => (allocated_bytes, reserved_bytes),
            Outcome::Ok => (self.allocated_at_peak_reserved_bytes, self.peak_reserved_bytes),
        }
    }
    /// PyTorch's "reserved but unallocated" as a share of reserved, where it matters: measure 1
    /// of [`crate::model::layout::LayoutMeasures`] at the OOM, else at peak reserved.
    pub fn fragmentation_where_it_matters(&self) -> f64 {
        let (allocated, reserved) = self.allocated_and_reserved_where_it_matters();
        crate::model::layout::ratio_complement(allocated, reserved)
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

/// The out-of-memory moment of a replay, decided here for every analysis that looks at it (the
/// diagnosis, the fragmentation and retention at the OOM, the segment map `--at oom`): the first
/// record where the engine failed a request that the program did not catch, or the trace's
/// fatal recorded OOM (which a replay under another setting may serve). A recorded OOM that the
/// program caught and went on from is not the moment: the replay goes on past it, as the
/// program did (see [`ReplayResult::caught_recorded_ooms`]).
///
/// Fed by an observer after each record the replay took ([`OomMoment::observe`]).
#[derive(Debug, Clone, Default)]
pub struct OomMoment {
    ooms_seen: u64,
    at: Option<u64>,
}

impl OomMoment {
    /// After record `i`: whether the replay stopped here, out of memory (the engine failed a
    /// request that was not a caught recorded OOM), and whether `i` is the OOM moment (true at
    /// most once).
    pub fn observe(&mut self, trace: &Trace, i: u64, r: &Record, view: &dyn EngineView) -> OomAt {
        let ooms = view.stats().num_ooms;
        let failed_here = ooms > self.ooms_seen;
        self.ooms_seen = ooms;
        let caught = matches!(r.event, Event::Oom { .. }) && trace.facts.survived(i);
        let stopped = failed_here && !caught;
        let fatal_recorded = trace.facts.fatal_oom().is_some_and(|o| o.event == i);
        let moment = self.at.is_none() && (stopped || fatal_recorded);
        if moment {
            self.at = Some(i);
        }
        OomAt { stopped, moment }
    }
    /// The moment's event, once observed.
    pub fn event(&self) -> Option<u64> {
        self.at
    }
    /// Why a replay of `trace` that ran to its end has no OOM moment, for `--at oom`.
    pub fn missing(trace: &Trace) -> String {
        let caught: Vec<String> =
            trace.facts.recorded_ooms.iter().filter(|o| o.caught).map(|o| o.event.to_string()).collect();
        match caught.first() {
            None => format!("{}: no out-of-memory in the trace or its replay (try --at peak)", trace.path.display()),
            Some(first) => format!(
                "{}: no out-of-memory ends the run (the program caught the one{} at event {} and went on); try \
                 --at peak or --at {first}",
                trace.path.display(),
                if caught.len() > 1 { "s" } else { "" },
                caught.join(", "),
            ),
        }
    }
}

/// What [`OomMoment::observe`] found at one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomAt {
    /// The replay failed a request here and stops.
    pub stopped: bool,
    /// This record is the OOM moment.
    pub moment: bool,
}

/// The live allocations of a replay: trace `id` -> address in the replay. (Hashed as ids are
/// everywhere, [`crate::model::ids`]: SipHash cost more than the engine's own work per request.)
pub type LiveMap = crate::model::ids::IdMap<u64>;

/// What an observer of a replay can see of the engine after each record.
pub trait EngineView {
    fn stats(&self) -> &Stats;
    /// The current layout: segments and their blocks in address order.
    fn segments(&self) -> Vec<recorder::engine::SegmentView>;
    /// The measures of the current layout ([`crate::model::layout::LayoutMeasures::of`] of
    /// [`EngineView::segments`], without building them).
    fn layout(&self) -> crate::model::layout::LayoutMeasures;
    /// The byte figures of [`EngineView::layout`] that the engine keeps as it goes: constant
    /// time, where the layout walks every block.
    fn occupancy(&self) -> recorder::engine::Occupancy;
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
    fn layout(&self) -> crate::model::layout::LayoutMeasures {
        let mut m = crate::model::layout::LayoutMeasures::default();
        self.visit_blocks(|starts, b| m.add(starts, b));
        m.finish();
        m
    }
    fn occupancy(&self) -> recorder::engine::Occupancy {
        Engine::occupancy(self)
    }
    fn config(&self) -> &AllocatorConfig {
        Engine::config(self)
    }
    fn capacity(&self) -> Option<u64> {
        Engine::capacity(self)
    }
}

/// Called after each record of a replay (on the replay loop's threads: several jobs run in
/// parallel) with the record's index, the record, the engine, and
/// the live allocations (trace `id` -> address in the replay).
pub type Observer<'a> = dyn FnMut(u64, &Record, &dyn EngineView, &LiveMap) + Send + 'a;

/// Reads the trace at `path` and replays it (for callers with one replay to make).
#[track_caller]
pub fn replay_file(path: &std::path::Path, opts: &ReplayOptions) -> Result<ReplayResult> {
    replay(&Trace::open(path)?, opts)
}

/// Replays `trace`.
#[track_caller]
pub fn replay(trace: &Trace, opts: &ReplayOptions) -> Result<ReplayResult> {
    replay_observed(trace, opts, &mut |_, _, _, _| {})
}

/// What a replay starts from: the configuration, capacity and device it runs under, and the
/// PyTorch release whose allocator it follows (the trace's; 2.11 when it names none).
struct Setup {
    config: AllocatorConfig,
    capacity: Capacity,
    device: SimDevice,
    used_hints: bool,
    torch: TorchVersion,
}

impl Setup {
    fn engine<S: Sink>(&self, capacity: Option<u64>, device: SimDevice, sink: S) -> Engine<SimDevice, S> {
        Engine::new(self.config.clone(), capacity, device, sink).with_torch_version(self.torch)
    }
}

fn setup(trace: &Trace, opts: &ReplayOptions) -> Result<Setup> {
    let header = &trace.header;
    let config = opts.config.clone().unwrap_or_else(|| header.config.clone());
    let torch = TorchVersion::from_header(&header.torch_version).unwrap_or_default();
    let mut capacity = trace.capacity(opts.capacity_bytes, opts.unlimited);
    // `per_process_memory_fraction` in the settings: the cap PyTorch computes from the device's
    // total, unless a capacity was given or recorded.
    if let Some(f) = config.memory_fraction() {
        if !opts.unlimited && !matches!(capacity.source, CapacitySource::Given | CapacitySource::Recorded) {
            anyhow::ensure!(
                header.device_total_bytes > 0,
                "{}: per_process_memory_fraction:{f} is a share of the device's memory, which the trace does not \
                 record; give the limit in bytes with --capacity",
                trace.path.display()
            );
            if let Some(c) = torch.fraction_cap(f, header.device_total_bytes) {
                capacity = Capacity::given(c);
            }
        }
    }
    let device_total = device_total(header);
    let mut device = SimDevice::new(Some(device_total.max(capacity.bytes.unwrap_or(0))));
    let used_hints = header.source != Source::Simulated;
    if used_hints {
        device = device
            .with_segment_hints(trace.facts.segments.clone())
            .with_reserve_hints(trace.facts.reservations.clone());
    }
    Ok(Setup { config, capacity, device, used_hints, torch })
}

/// The device a replay simulates: the trace's, or [`DEFAULT_DEVICE_BYTES`] where it has none.
fn device_total(header: &Header) -> u64 {
    if header.device_total_bytes > 0 {
        header.device_total_bytes
    } else {
        DEFAULT_DEVICE_BYTES
    }
}

/// Replays `trace`, calling `observer` after every record. The observer is not called for
/// records after an OOM that ended the replay.
#[track_caller]
pub fn replay_observed(trace: &Trace, opts: &ReplayOptions, observer: &mut Observer<'_>) -> Result<ReplayResult> {
    let s = setup(trace, opts)?;
    let (cap, used_hints) = (s.capacity, s.used_hints);
    let config = s.config.clone();
    let device = s.device.clone();
    let capacity = cap.bytes;
    let header = &trace.header;
    let path = &trace.path;
    match &opts.output {
        None => {
            let engine = s.engine(capacity, device, NullSink);
            run(trace, engine, used_hints, cap.source, opts, &mut |_, _| Ok(()), observer)
        }
        Some(out) => {
            let mut h = header.clone();
            h.source = Source::Simulated;
            h.tool_version = env!("CARGO_PKG_VERSION").to_string();
            h.alloc_conf = config.to_string();
            h.config = config.clone();
            h.capacity_bytes = capacity.unwrap_or(0);
            h.torch_version = s.torch.to_string();
            h.notes.push(format!(
                "replayed from {} under `{}`{}, as PyTorch {}'s allocator",
                crate::model::trace_name(path),
                h.alloc_conf,
                capacity.map(|c| format!(" with capacity {c} bytes")).unwrap_or_default(),
                s.torch
            ));
            crate::model::output::check_output_file(out, &[path], crate::model::output::Kind::Trace)?;
            let pending = crate::model::output::Pending::new(out)?;
            let mut writer = TraceWriter::create(pending.temp_path(), &h)
                .with_context(|| format!("cannot write {}", out.display()))?;
            let engine = s.engine(capacity, device, Vec::<Event>::with_capacity(64));
            let result = run(
                trace,
                engine,
                used_hints,
                cap.source,
                opts,
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
type Drain<'a, S> = dyn FnMut(u64, &mut S) -> Result<(), recorder::trace::TraceError> + Send + 'a;

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
    /// A request the recorded run served failed here (trace id): the records after it are read,
    /// without replaying them, only up to the program's next request, to see whether the
    /// failed block was a scratch buffer (freed before that request).
    failed_alloc: Option<u64>,
    /// The failed request was freed before the program's next request.
    failed_scratch: bool,
    /// Go on past a failed scratch buffer ([`ReplayOptions::past_caught_scratch`]).
    past_scratch: bool,
    /// Failed scratch buffers gone on past: their frees are not requests to replay.
    skipped_scratch: HashSet<u64>,
    /// Index of the trace's last allocation: a recorded OOM before it was caught by the program.
    /// The trace's last request ([`crate::model::Facts::survived`]'s rule).
    last_request: Option<u64>,
    /// Allocated bytes when reserved bytes first reached their peak.
    allocated_at_peak: u64,
    peak_seen: u64,
    /// The recording's private pools (CUDA graphs, `MemPool`s): where each request goes.
    pools: RecordedPools,
    /// Stream-ordered frees the recorded run completed in a row (trace ids), not applied yet:
    /// when segment releases and an out-of-memory retry's release follow them, they were the
    /// work of that release's `synchronize_and_free_events`, inside the next `malloc` after its
    /// cache search and its first device allocation had failed (PyTorch's `malloc` runs
    /// `process_events` first, which found their events not done). They are applied after that
    /// request (the replay's own release completes them if it gets there too), any other
    /// completions at the next record.
    held: Vec<u64>,
    held_state: Held,
    /// The trace id of the previous record when it was a `FreeRequested`: a completion right
    /// after its own request is a free without stream uses, never held.
    just_requested: Option<u64>,
}

/// Where the held completions stand ([`Replaying::held`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Held {
    /// Completions in a row.
    #[default]
    Completions,
    /// Segment releases followed them.
    Released,
    /// The release was an out-of-memory retry: they wait for the request it served.
    UntilRequest,
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
            failed_alloc: None,
            failed_scratch: false,
            past_scratch: false,
            skipped_scratch: HashSet::new(),
            last_request: None,
            allocated_at_peak: 0,
            peak_seen: 0,
            pools: RecordedPools::default(),
            held: Vec::new(),
            held_state: Held::Completions,
            just_requested: None,
        }
    }

    /// Applies a stream-ordered free's completion (trace id).
    fn complete(&mut self, id: u64) {
        match self.live.remove(&id) {
            Some(addr) => {
                // A completion without a request: the source freed in one step.
                if self.engine.free_completed(addr).is_err() && self.engine.free(addr).is_err() {
                    self.anomalies += 1;
                }
            }
            None if self.skipped_scratch.contains(&id) => {}
            None => self.anomalies += 1,
        }
    }

    fn release_held(&mut self) {
        for id in std::mem::take(&mut self.held) {
            self.complete(id);
        }
        self.held_state = Held::Completions;
    }

    /// Routes a record through the held completions: true when the record was held (a
    /// completion) and is done with; the completions that this record shows were not a
    /// release's synchronization are applied first.
    fn hold(&mut self, event: &Event) -> bool {
        let just_requested = std::mem::replace(
            &mut self.just_requested,
            match event {
                Event::FreeRequested { id, .. } => Some(*id),
                _ => None,
            },
        );
        if let Event::FreeCompleted { id, .. } = event {
            if self.held_state != Held::Completions || just_requested == Some(*id) {
                self.release_held();
            }
            if just_requested == Some(*id) {
                return false;
            }
            self.held.push(*id);
            return true;
        }
        if self.held.is_empty() {
            return false;
        }
        let keep = match (self.held_state, event) {
            (Held::Completions | Held::Released, Event::SegmentFree { .. } | Event::SegmentUnmap { .. }) => {
                self.held_state = Held::Released;
                true
            }
            (Held::Released, Event::CacheRelease { cause: ReleaseCause::OomRetry, .. }) => {
                self.held_state = Held::UntilRequest;
                true
            }
            // The request's own segment, and what the recording says of it, before its alloc.
            (
                Held::UntilRequest,
                Event::SegmentAlloc { .. }
                | Event::SegmentMap { .. }
                | Event::SegmentPool { .. }
                | Event::Split { .. }
                | Event::Merge { .. }
                | Event::CallSite { .. }
                | Event::DeviceMemInfo { .. },
            ) => true,
            // The request: replayed, then the completions (in `step`).
            (Held::UntilRequest, Event::Alloc { .. } | Event::Oom { .. }) => true,
            _ => false,
        };
        if !keep {
            self.release_held();
        }
        false
    }

    /// Goes on past the recorded OOMs that the program survived (see [`Facts::survived`]).
    ///
    /// [`Facts::survived`]: crate::model::Facts::survived
    fn continuing(mut self, trace: &Trace) -> Self {
        self.last_request = trace.facts.last_request;
        self
    }

    /// What a copy of this state holds, in blocks: the segments, the blocks in use and the free
    /// blocks inside segments (what [`SAVED_BLOCKS`] counts).
    fn blocks(&self) -> usize {
        let st = self.engine.stats();
        let n = st.segment.all.current + st.active.all.current + st.inactive_split.all.current;
        usize::try_from(n).unwrap_or(usize::MAX).max(self.live.len())
    }

    /// True once the replay has failed (an observer sees nothing after the failed request).
    fn failed(&self) -> bool {
        self.stopped || self.failed_alloc.is_some()
    }

    /// Replays one record (a request) or skips it (the source allocator's own decisions).
    fn step(&mut self, index: u64, r: &Record) {
        if let Some(failed) = self.failed_alloc {
            // After a failed request: is the program's next request the failed block's free? (A
            // completion alone is the free of a source that frees in one step; another block's
            // completion is another stream's work finishing, not a request.)
            match &r.event {
                // A scratch buffer that the program catches the failure of: go on without it.
                Event::FreeRequested { id, .. } | Event::FreeCompleted { id, .. }
                    if *id == failed && self.past_scratch =>
                {
                    self.skipped_scratch.insert(failed);
                    self.failed_alloc = None;
                    self.outcome = Outcome::Ok;
                }
                Event::FreeRequested { id, .. } => {
                    self.failed_scratch = *id == failed;
                    self.stopped = true;
                }
                Event::FreeCompleted { id, .. } if *id == failed => {
                    self.failed_scratch = true;
                    self.stopped = true;
                }
                Event::Alloc { .. } | Event::Oom { .. } => self.stopped = true,
                Event::FreeCompleted { .. }
                | Event::CacheRelease { .. }
                | Event::Mark { .. }
                | Event::CallSite { .. }
                | Event::SegmentAlloc { .. }
                | Event::SegmentFree { .. }
                | Event::SegmentMap { .. }
                | Event::SegmentUnmap { .. }
                | Event::Split { .. }
                | Event::Merge { .. }
                | Event::Snapshot { .. }
                | Event::DeviceMemInfo { .. }
                | Event::SegmentPool { .. }
                | Event::Dropped { .. } => {}
            }
            return;
        }
        if self.hold(&r.event) {
            return;
        }
        let syncs = self.engine.stats().num_sync_all_streams;
        self.step_record(index, r);
        if self.held_state == Held::UntilRequest && matches!(r.event, Event::Alloc { .. } | Event::Oom { .. }) {
            if self.engine.stats().num_sync_all_streams != syncs {
                // The replay's own release completed them (its address may serve this request
                // now): nothing is left to complete.
                for id in std::mem::take(&mut self.held) {
                    self.live.remove(&id);
                }
            }
            self.release_held();
        }
    }

    fn step_record(&mut self, index: u64, r: &Record) {
        /// After a request served: the allocated bytes at the first peak of reserved bytes.
        fn note_peak<S: Sink>(engine: &Engine<SimDevice, S>, peak_seen: &mut u64, allocated_at_peak: &mut u64) {
            let st = engine.stats();
            if st.reserved_bytes.all.current > *peak_seen {
                *peak_seen = st.reserved_bytes.all.current;
                *allocated_at_peak = st.allocated_bytes.all.current;
            }
        }
        let engine = &mut self.engine;
        let pools_only = self.pools.follow(&r.event, engine);
        match &r.event {
            Event::Alloc { id, addr, requested_bytes, stream, callsite, .. } => {
                self.requests += 1;
                match self.pools.malloc(engine, *addr, *requested_bytes, *stream, *callsite) {
                    Ok(a) => {
                        self.live.insert(*id, a.addr);
                        note_peak(engine, &mut self.peak_seen, &mut self.allocated_at_peak);
                    }
                    Err(oom) => {
                        self.outcome = oom_outcome(index, r.time_ns, *stream, &oom);
                        self.failed_alloc = Some(*id);
                    }
                }
            }
            Event::FreeRequested { id, .. } => match self.live.get(id) {
                Some(&addr) => {
                    if engine.free_requested(addr).is_err() {
                        self.anomalies += 1;
                    }
                }
                None if self.skipped_scratch.contains(id) => {}
                None => self.anomalies += 1,
            },
            Event::FreeCompleted { id, .. } => self.complete(*id),
            Event::Oom { requested_bytes, stream, .. } => {
                // The request that failed in the recorded run: does it fail here too?
                self.requests += 1;
                let caught = crate::model::went_on_after(self.last_request, index);
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
                        note_peak(engine, &mut self.peak_seen, &mut self.allocated_at_peak);
                        let _ = engine.free(a.addr);
                    }
                    Ok(_) => note_peak(engine, &mut self.peak_seen, &mut self.allocated_at_peak),
                }
            }
            // A MemPool's own release was replayed by `follow`.
            Event::CacheRelease { cause: ReleaseCause::EmptyCache, .. } if !pools_only => {
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
            torch_version: engine.torch_version().to_string(),
            torch_version_assumed: TorchVersion::from_header(&trace.header.torch_version).is_none(),
            capacity_bytes: engine.capacity(),
            capacity_source,
            used_recorded_addresses: used_hints,
            segments_at_recorded_addresses: if used_hints { engine.device().hints_used } else { 0 },
            segments_placed_by_rule: if used_hints { engine.device().placed_by_rule } else { 0 },
            events: trace.events,
            requests: self.requests,
            peak_allocated_bytes: st.allocated_bytes.all.peak,
            peak_reserved_bytes: st.reserved_bytes.all.peak,
            peak_requested_bytes: st.requested_bytes.all.peak,
            peak_active_bytes: st.active_bytes.all.peak,
            peak_inactive_split_bytes: st.inactive_split_bytes.all.peak,
            num_alloc_retries: st.num_alloc_retries,
            num_ooms: st.num_ooms,
            num_oom_rejections: st.num_oom_rejections,
            num_device_alloc: st.num_device_alloc,
            num_device_free: st.num_device_free,
            num_sync_all_streams: st.num_sync_all_streams,
            end_allocated_bytes: st.allocated_bytes.all.current,
            end_reserved_bytes: st.reserved_bytes.all.current,
            allocated_at_peak_reserved_bytes: self.allocated_at_peak,
            anomalies: self.anomalies,
            reach: Reach::Completes,
            caught_recorded_ooms: match &self.outcome {
                Outcome::Ok => trace.facts.caught_ooms() as u64,
                Outcome::Oom { event, .. } => {
                    trace.facts.recorded_ooms.iter().filter(|o| o.event < *event && o.caught).count() as u64
                }
            },
            failure_may_be_caught: match self.failed_alloc {
                None => None,
                Some(_) if trace.facts.caught_ooms() > 0 => Some(MayBeCaught::ProgramCatches),
                Some(_) if self.failed_scratch => Some(MayBeCaught::ScratchBuffer),
                Some(_) => None,
            },
            complete: trace.damage().is_none(),
            input_damage: trace.damage(),
            scratch_failures_skipped: self.skipped_scratch.len() as u64,
            capacity_band: engine.capacity_band().map(|(low, high)| {
                // The simulated device is as large as the trace's, or as the capacity where that
                // is larger: above the trace's device, the device refuses by the capacity too.
                let device = device_total(&trace.header);
                match engine.capacity() {
                    Some(c) if c > device => (c, c + 1),
                    _ => (low, high.min(device + 1)),
                }
            }),
        };
        r.reach = Reach::of(trace, &r);
        r
    }
}

/// What a job does after each record the driver stepped it over. `failed` says whether the
/// replay had failed before that record (an observer sees nothing after the failed request).
/// `Break` ends the job there.
type After<'a, S> = dyn FnMut(u64, &Record, &mut Replaying<S>, bool) -> ControlFlow<()> + Send + 'a;

/// One replay that [`drive`] steps over the records `from..to`: its state, and its duty after
/// each record (observe, write the simulated run, save checkpoints, stop early).
struct Job<'r, 'a, S: Sink> {
    rp: &'r mut Replaying<S>,
    /// The first record replayed (a resumed replay starts after its save).
    from: u64,
    /// The job ends before this record (`u64::MAX`: at the end of the trace).
    to: u64,
    after: &'r mut After<'a, S>,
    done: bool,
}

impl<'r, 'a, S: Sink> Job<'r, 'a, S> {
    fn new(rp: &'r mut Replaying<S>, after: &'r mut After<'a, S>) -> Self {
        Job { rp, from: 0, to: u64::MAX, after, done: false }
    }
    fn range(mut self, from: u64, to: u64) -> Self {
        (self.from, self.to) = (from, to);
        self
    }
}

/// The replay loop: one read of `trace` steps every job over its records, in order (the jobs in
/// parallel when there are several), until each has reached its end, stopped at an OOM the
/// program did not survive, or ended itself. Records before the earliest job's start are not
/// decoded.
///
/// Every replay in the analyzer is a job of this loop: a plain replay ([`replay_observed`]),
/// several settings or capacities at once ([`replay_many`]), the unlimited run that saves
/// checkpoints ([`resumable_watched`]) and a run resumed from one ([`replay_resumed_watched`]).
#[track_caller]
fn drive<S: Sink + ForwardEvents + Send>(trace: &Trace, jobs: &mut [Job<'_, '_, S>]) -> Result<()> {
    drive_with(trace, jobs, &mut [])
}

/// A fold that rides a replay pass ([`drive_with`]): shown every record of the trace, beside
/// the jobs.
pub type Rider<'a> = dyn crate::model::Fold + Send + 'a;

/// [`drive`], with `riders` shown every record of the trace beside the jobs: the pass then
/// reads the trace from its start and to its end, whatever the jobs need, so that a fold of
/// the whole trace costs no read of its own.
#[track_caller]
fn drive_with<S: Sink + ForwardEvents + Send>(
    trace: &Trace,
    jobs: &mut [Job<'_, '_, S>],
    riders: &mut [&mut Rider<'_>],
) -> Result<()> {
    use rayon::prelude::*;
    let Some(from) = jobs.iter().map(|j| j.from).min() else { return Ok(()) };
    let from = if riders.is_empty() { from } else { 0 };
    trace.replay_pass(from, |first, chunk| {
        let step = |job: &mut Job<'_, '_, S>| {
            if job.done || job.rp.stopped {
                job.done = true;
                return;
            }
            let skip = usize::try_from(job.from.saturating_sub(first)).unwrap_or(usize::MAX);
            for (k, r) in chunk.iter().enumerate().skip(skip) {
                let index = first + k as u64;
                if index >= job.to {
                    job.done = true;
                    return;
                }
                let failed = job.rp.failed();
                job.rp.step(index, r);
                if (job.after)(index, r, job.rp, failed).is_break() || job.rp.stopped {
                    job.done = true;
                    return;
                }
            }
        };
        let step_all = |jobs: &mut [Job<'_, '_, S>]| {
            if jobs.iter().filter(|j| !j.done).count() > 1 {
                jobs.par_iter_mut().for_each(step);
            } else {
                jobs.iter_mut().for_each(step);
            }
        };
        if riders.is_empty() {
            step_all(jobs);
        } else {
            let ride = |riders: &mut [&mut Rider<'_>]| {
                for (k, r) in chunk.iter().enumerate() {
                    riders.iter_mut().for_each(|f| f.observe(first + k as u64, r));
                }
            };
            rayon::join(|| step_all(jobs), || ride(riders));
        }
        if riders.is_empty() && jobs.iter().all(|j| j.done) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    Ok(())
}

/// A plain replay from the start (the job of [`replay_observed`]): observes every record the
/// replay took, hands the engine's events to `drain`, and ends after `opts.stop_after`.
#[track_caller]
fn run<S: Sink + ForwardEvents + Send>(
    trace: &Trace,
    engine: Engine<SimDevice, S>,
    used_hints: bool,
    capacity_source: CapacitySource,
    opts: &ReplayOptions,
    drain: &mut Drain<'_, S>,
    observer: &mut Observer<'_>,
) -> Result<ReplayResult> {
    let stop_after = opts.stop_after;
    let mut rp = Replaying::new(engine).continuing(trace);
    rp.past_scratch = opts.past_caught_scratch;
    let mut error: Option<anyhow::Error> = None;
    let mut after = |index: u64, r: &Record, rp: &mut Replaying<S>, failed: bool| {
        if !failed {
            observer(index, r, &rp.engine, &rp.live);
        }
        if error.is_none() {
            if let Err(e) = drain(r.time_ns, rp.engine.sink_mut()) {
                error = Some(e.into());
                rp.stopped = true;
            }
        }
        if stop_after.is_some_and(|last| index >= last) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    drive(trace, &mut [Job::new(&mut rp, &mut after)])?;
    if let Some(e) = error {
        return Err(e.context("cannot write the simulated trace"));
    }
    Ok(rp.result(used_hints, capacity_source, trace))
}

/// Several replays of one trace (different settings or capacities) driven by one read of it:
/// each decoded chunk is fed to every replay, in parallel. The results are in the order of
/// `runs`. Writing a replay's output (`ReplayOptions::output`) is not supported here. Where
/// they do not all fit in the memory replays may keep together ([`concurrent_replays`]), they
/// run in turns of as many as fit, one read each, each turn's states let go before the next.
#[track_caller]
pub fn replay_many(trace: &Trace, runs: Vec<(ReplayOptions, Box<Observer<'_>>)>) -> Result<Vec<ReplayResult>> {
    replay_many_with(trace, runs, &mut [])
}

/// [`replay_many`], with `riders` carried by its (first) pass: folds of the whole trace that then
/// cost no read of their own ([`drive_with`]).
#[track_caller]
pub fn replay_many_with(
    trace: &Trace,
    runs: Vec<(ReplayOptions, Box<Observer<'_>>)>,
    riders: &mut [&mut Rider<'_>],
) -> Result<Vec<ReplayResult>> {
    let mut riders = Some(riders);
    // No more at once than there are runs: a trace with no live allocation allows any number.
    let at_once = concurrent_replays(trace).min(runs.len().max(1));
    let mut results = Vec::with_capacity(runs.len());
    let mut runs = runs.into_iter().peekable();
    while runs.peek().is_some() {
        let mut states: Vec<(Replaying<NullSink>, bool, CapacitySource)> = Vec::with_capacity(at_once);
        let mut duties: Vec<Box<After<'_, NullSink>>> = Vec::with_capacity(at_once);
        for (opts, mut observer) in runs.by_ref().take(at_once) {
            anyhow::ensure!(opts.output.is_none(), "replay_many does not write simulated traces");
            let s = setup(trace, &opts)?;
            let mut rp = Replaying::new(s.engine(s.capacity.bytes, s.device.clone(), NullSink)).continuing(trace);
            rp.past_scratch = opts.past_caught_scratch;
            states.push((rp, s.used_hints, s.capacity.source));
            duties.push(Box::new(move |index: u64, r: &Record, rp: &mut Replaying<NullSink>, failed: bool| {
                if !failed {
                    observer(index, r, &rp.engine, &rp.live);
                }
                ControlFlow::Continue(())
            }));
        }
        let mut jobs: Vec<Job<'_, '_, NullSink>> =
            states.iter_mut().zip(duties.iter_mut()).map(|((rp, _, _), after)| Job::new(rp, &mut **after)).collect();
        drive_with(trace, &mut jobs, riders.take().unwrap_or(&mut []))?;
        drop(jobs);
        results.extend(states.iter().map(|(rp, used_hints, source)| rp.result(*used_hints, *source, trace)));
    }
    Ok(results)
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

/// What a replay's state costs per allocation live in it, about: the engine's block and its
/// address map, and the replay's map of trace ids (one replay of `live10` ten times over, with
/// 6.5 M allocations live, is 939 MB resident).
pub const STATE_BYTES_PER_LIVE: u64 = 160;

/// What the replays that run at once may keep together ([`concurrent_replays`]).
pub const STATES_BUDGET_BYTES: u64 = 1 << 30;

/// How many replays of `trace` may run side by side within [`STATES_BUDGET_BYTES`], at least
/// one: a trace that keeps millions of allocations live is replayed one setting at a time, so
/// that its memory stays that of one replay.
pub fn concurrent_replays(trace: &Trace) -> usize {
    let per = trace.summary.peak_live_allocations.saturating_mul(STATE_BYTES_PER_LIVE).max(1);
    usize::try_from(STATES_BUDGET_BYTES / per).unwrap_or(usize::MAX).max(1)
}

/// The fewest threads on which [`beside_searches`] takes a pool of its own.
pub const BESIDE_FROM_THREADS: usize = 8;

/// Runs `f` on threads of its own, beside the capacity searches of a what-if table: the work
/// done with a row once its run at the capacity is over (the analyses of the recorded run, its
/// pictures, `explain`'s experiments).
///
/// On the searches' own threads that work stalled them: a thread that waits for its probes
/// takes up other work meanwhile, and where that was a long analysis (a whole replay of an
/// experiment) its search went on only once the analysis ended. The pool's threads are a
/// quarter of the searches' (2 to 4). On fewer than [`BESIDE_FROM_THREADS`] threads, or where the
/// pool cannot be made, `f` runs here: there the searches keep every core busy, and a pool beside
/// them only took turns with them (on 2 cores `report` and `whatif` were 20 to 30% slower).
pub fn beside_searches<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_num_threads() < BESIDE_FROM_THREADS {
        return f();
    }
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    let pool = POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads((rayon::current_num_threads() / 4).clamp(2, 4))
            .thread_name(|i| format!("alloctrace-beside-{i}"))
            .build()
            .ok()
    });
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// `rayon::join(a, b)` where `trace`'s replays may run side by side ([`concurrent_replays`]),
/// else `a` then `b`: analyses that each keep state per live allocation take turns.
pub fn join_within<A, B, RA, RB>(trace: &Trace, a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    if concurrent_replays(trace) > 1 {
        rayon::join(a, b)
    } else {
        (a(), b())
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

/// The blocks (segments, blocks in use, free blocks inside segments) that the saves of all the
/// [`Resumable`] runs held at once keep in all: each of `n` runs side by side keeps
/// `SAVED_BLOCKS / n` ([`saved_blocks_share`]), and a save that would pass its share is not
/// taken (probes then start from an earlier save, or from the start). A save copies the
/// replay's state, about 160 bytes a block (the blocks, and the maps from request and address
/// to block), so this is about 40 MiB. A small hostile trace can hold hundreds of thousands of
/// blocks (one segment per stream); a real one a few thousand: the 320k-event snapshot in
/// `traces/large/` 7,000 at most, so each of the six settings of its what-if table keeps about
/// six saves. Twice this budget made the what-if table on 10 M events pass 200 MB on a 16-core
/// host, and no command faster (`scripts/gpu/bench_saves_budget.sh`).
pub const SAVED_BLOCKS: usize = 1 << 18;

/// The share of [`SAVED_BLOCKS`] each of `runs` [`Resumable`] runs held side by side keeps.
pub fn saved_blocks_share(runs: usize) -> usize {
    SAVED_BLOCKS / runs.max(1)
}

/// Replays of one configuration at many capacities that share the unlimited run's prefix.
///
/// Under a limit `C`, the engine makes the same choices as with no limit until the first
/// request for which the unlimited run's device allocation asks for more than `C` (reserved
/// bytes plus the size asked for: [`Engine::demand_peak`]; the limit is only read there and by
/// the garbage collector, which frees nothing while reserved memory is below its trigger,
/// [`AllocatorConfig::gc_trigger_bytes`]). So the unlimited run is replayed once, saved after
/// the events where its peak demand first reaches each of a few levels, and a replay at `C`
/// resumes from the latest save whose peak is at or below `C` (and the trigger) instead of
/// starting over: the capacity search, and the run at the capacity compared, then cost little
/// more than the events after the run first needs more than `C`.
///
/// Worked example: the unlimited run asks for 1, 2, 3, 4 GiB in all at events 10, 20, 30, 40, with
/// levels 1.5 and 2.5 GiB; the saves are taken after events 20 (peak 2 GiB) and 30 (peak
/// 3 GiB). A replay at 2.7 GiB resumes after event 20 (it first matters at event 30, where
/// 3 GiB > 2.7 GiB).
pub struct Resumable {
    config: AllocatorConfig,
    /// The unlimited run's device (probes above its size take another one: no resuming).
    device_bytes: u64,
    /// The trace's device: a replay under any capacity runs on one this large at least, which
    /// refuses what does not fit as a limit would.
    device_total: u64,
    /// (level, event index, the replay's state before that event), levels ascending: the
    /// state serves every capacity at or above its level. Behind a lock so that replays at
    /// several capacities (a search's probes, the run at the capacity compared) resume from it
    /// at once and keep the saves they make on their way ([`Resumable::keep`]).
    saves: std::sync::RwLock<Vec<(u64, u64, Replaying<NullSink>)>>,
    /// The blocks its saves may hold in all (its share of [`SAVED_BLOCKS`]).
    saved_blocks: usize,
    /// Each new peak of the unlimited run's demand: (event index, bytes), ascending.
    peaks: Vec<(u64, u64)>,
    /// The unlimited run's result: the run under any capacity above its peak.
    end: Box<ReplayResult>,
    used_hints: bool,
    /// The replays resumed from it go on past a failed scratch buffer
    /// ([`ReplayOptions::past_caught_scratch`], [`Resumable::going_past_caught_scratch`]).
    past_caught_scratch: bool,
}

impl Resumable {
    /// The same saves, for replays that go on past a failed scratch buffer as the program's
    /// cuDNN would ([`ReplayOptions::past_caught_scratch`]): the unlimited run that made them
    /// never failed, so they serve such replays as they are.
    pub fn going_past_caught_scratch(mut self, yes: bool) -> Resumable {
        self.past_caught_scratch = yes;
        self
    }
}

/// The unlimited run of `config`, and [`Resumable`] saves at about `levels` levels of its
/// demand evenly spread from `lower` to its peak, in one pass.
///
/// The peak is not known until the end, so the levels start `estimate / levels` apart
/// (`estimate`: the recorded run's peak reserved, a good guess for every policy) and, when
/// more than twice `levels` saves are held, every other one is dropped and the spacing doubles.
/// A save is taken after the event at which the run's peak first reaches a level, and serves
/// every capacity at or above that peak (up to there a run under such a capacity is the
/// unlimited run).
#[track_caller]
pub fn resumable(
    trace: &Trace,
    config: &AllocatorConfig,
    lower: u64,
    levels: u64,
    saved_blocks: usize,
) -> Result<(ReplayResult, Option<Resumable>)> {
    let (r, from, _) = resumable_watched(trace, config, lower, levels, saved_blocks, None)?;
    Ok((r, from))
}

/// What [`resumable_watched`] shows its observer: the run under this capacity (`None`: no
/// limit but the device's), for as long as it is the unlimited run.
pub type Watch<'a> = (Option<u64>, &'a mut TailObserver<'a>);

/// An observer of a replay that may start part way ([`replay_resumed_watched`]): an
/// [`Observer`], shown the records from where it starts.
pub type TailObserver<'a> = Observer<'a>;

/// [`resumable`], showing `watch`'s observer the records of the run under its capacity for as
/// long as that run is the unlimited one (its demand has not gone above the capacity). Returns
/// the index of the last record shown (`None`: none could be, the run goes on from the start
/// in [`replay_resumed_watched`]).
#[track_caller]
pub fn resumable_watched(
    trace: &Trace,
    config: &AllocatorConfig,
    lower: u64,
    levels: u64,
    saved_blocks: usize,
    watch: Option<Watch<'_>>,
) -> Result<(ReplayResult, Option<Resumable>, Option<u64>)> {
    let opts = ReplayOptions { config: Some(config.clone()), unlimited: true, ..Default::default() };
    // Garbage collection acts under a limit only, and ages cached blocks by counting cache
    // lookups while it is on: the saved run counts them as under a limit that nothing reaches,
    // so that it is the run under a limit `C` for as long as reserved memory stays below the
    // collection's trigger (`threshold * C`). Expandable segments size their reservations from
    // the limit where the device does not say its size: there every limit is replayed whole.
    let gc = config.gc_trigger_bytes(u64::MAX).is_some();
    if (gc && config.expandable_segments) || levels == 0 {
        return Ok((replay(trace, &opts)?, None, None));
    }
    // Without expandable segments the device's size only matters once the limit is passed
    // (segments are reserved bytes, and the limit is checked first), so the saved run takes a
    // device without a limit and serves every capacity. Expandable segments size their
    // address reservations from the device: there the run keeps the trace's device, and serves
    // the capacities up to its size.
    let s = setup(trace, &opts)?;
    let device_total = s.device.capacity().unwrap_or(u64::MAX);
    let device = if config.expandable_segments {
        s.device.clone()
    } else {
        let mut d = SimDevice::new(None);
        if s.used_hints {
            d = d.with_segment_hints(trace.facts.segments.clone()).with_reserve_hints(trace.facts.reservations.clone());
        }
        d
    };
    let device_bytes = device.capacity().unwrap_or(u64::MAX);
    // The watched run is the unlimited one while its demand stays within this limit (above the
    // device of this run, another device: not the same run at all).
    let mut watch = watch.and_then(|(cap, observe)| {
        cap.is_none_or(|c| c <= device_bytes).then(|| (same_run_until(config, cap, device_total), observe))
    });
    let mut seen: Option<u64> = None;
    let mut rp = Replaying::new(s.engine(gc.then_some(u64::MAX), device, NullSink)).continuing(trace);
    let estimate = trace.summary.peak_reserved.bytes.max(lower);
    let mut step = (estimate.saturating_sub(lower) / levels).max(2 << 20);
    // (level line index, peak demand, event index, state after that event)
    let mut saves: Vec<(u64, u64, u64, Replaying<NullSink>)> = Vec::new();
    let mut next_line = 0u64;
    let mut peak = 0u64;
    let mut peaks: Vec<(u64, u64)> = Vec::new();
    let mut after = |index: u64, r: &Record, rp: &mut Replaying<NullSink>, failed: bool| {
        // What the limit is checked against (see `Engine::demand_peak`).
        let demand = rp.engine.demand_peak();
        if let Some((limit, observe)) = watch.as_mut().filter(|_| !failed) {
            if demand <= *limit {
                observe(index, r, &rp.engine, &rp.live);
                seen = Some(index);
            } else {
                watch = None;
            }
        }
        if rp.stopped || demand <= peak {
            return ControlFlow::Continue(());
        }
        peak = demand;
        peaks.push((index, peak));
        if peak < lower.saturating_add(next_line.saturating_mul(step)) {
            return ControlFlow::Continue(());
        }
        let line = (peak - lower) / step;
        let held: usize = saves.iter().map(|s| s.3.blocks()).sum();
        if held + rp.blocks() > saved_blocks {
            return ControlFlow::Continue(());
        }
        saves.push((line, peak, index, rp.clone()));
        next_line = line + 1;
        if saves.len() as u64 > 2 * levels {
            // Twice the spacing: keep the first save on each new line.
            step = step.saturating_mul(2);
            let mut kept: Vec<(u64, u64, u64, Replaying<NullSink>)> = Vec::with_capacity(levels as usize + 1);
            for (line, peak, index, state) in saves.drain(..) {
                let line = line / 2;
                if kept.last().is_none_or(|k| k.0 < line) {
                    kept.push((line, peak, index, state));
                }
            }
            saves = kept;
            next_line = saves.last().map_or(0, |k| k.0 + 1);
        }
        ControlFlow::Continue(())
    };
    drive(trace, &mut [Job::new(&mut rp, &mut after)])?;
    // The run counted garbage collection's lookups as under a limit: its result is unlimited.
    rp.engine.set_capacity(None);
    let unlimited = rp.result(s.used_hints, CapacitySource::None, trace);
    let saves = saves.into_iter().map(|(_, peak, index, state)| (peak, index + 1, state)).collect();
    // The state at the end is not kept: a run under a capacity above every peak is this run.
    drop(rp);
    let end = Box::new(unlimited.clone());
    Ok((
        unlimited,
        Some(Resumable {
            config: config.clone(),
            device_bytes,
            device_total,
            saves: std::sync::RwLock::new(saves),
            saved_blocks,
            peaks,
            end,
            used_hints: s.used_hints,
            past_caught_scratch: false,
        }),
        seen,
    ))
}

/// The replay of the [`Resumable`] configuration at `capacity`, resumed from the latest save
/// that is valid for it (see [`Resumable`]); from the start when none is.
///
/// The run first differs from the unlimited one at the first event where the unlimited run's
/// demand goes above `capacity` (known from its peaks). Where the latest save lies far
/// before that event, the unlimited run is replayed from it up to there once and saved too, so
/// that the next capacities near this one (a search narrowing down) start where they differ.
/// At or above the unlimited run's peak demand the run is the unlimited one: nothing is
/// replayed.
#[track_caller]
pub fn replay_resumed(trace: &Trace, from: &Resumable, capacity: u64, source: CapacitySource) -> Result<ReplayResult> {
    replay_resumed_watched(trace, from, Some(capacity), source, &mut |_, _, _, _| {}, None)
}

/// The demand up to which the run of `config` under `capacity` (`None`: no limit but the
/// device's) is the saved unlimited run of [`resumable_watched`]: the limit, or the device's size,
/// and with garbage collection its trigger under that limit
/// ([`AllocatorConfig::gc_trigger_bytes`]): below it no collection frees anything.
fn same_run_until(config: &AllocatorConfig, capacity: Option<u64>, device_total: u64) -> u64 {
    let limit = capacity.unwrap_or(u64::MAX).min(device_total);
    match capacity.and_then(|c| config.gc_trigger_bytes(c)) {
        Some(trigger) => limit.min(trigger),
        None => limit,
    }
}

/// A save that a resumed replay made on its way (see [`replay_resumed`]), for
/// [`Resumable::keep`]: its level, the event it was taken before, and the state.
pub struct Save(u64, u64, Replaying<NullSink>);

impl Resumable {
    /// Keeps `save` for the replays to come, unless the saves held would pass
    /// its share of [`SAVED_BLOCKS`] or one is held at that event already.
    pub fn keep(&self, save: Save) {
        let mut saves = self.saves.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let held: usize = saves.iter().map(|s| s.2.blocks()).sum();
        let at = saves.partition_point(|s| s.1 < save.1);
        if held + save.2.blocks() <= self.saved_blocks && saves.get(at).is_none_or(|s| s.1 != save.1) {
            saves.insert(at, (save.0, save.1, save.2));
        }
    }
}

/// [`replay_resumed`] at `capacity` (`None`: no limit but the device's), showing `observer`
/// the records after `after` (those [`resumable_watched`] has shown it already).
#[track_caller]
pub fn replay_resumed_watched(
    trace: &Trace,
    from: &Resumable,
    capacity: Option<u64>,
    source: CapacitySource,
    observer: &mut TailObserver<'_>,
    after: Option<u64>,
) -> Result<ReplayResult> {
    let (r, save) = replay_resumed_shared(trace, from, capacity, source, observer, after)?;
    if let Some(save) = save {
        from.keep(save);
    }
    Ok(r)
}

/// [`replay_resumed_watched`] that does not keep the save it made on its way, if any: it is
/// returned, for the caller to [`Resumable::keep`] when it will.
#[track_caller]
pub fn replay_resumed_shared(
    trace: &Trace,
    from: &Resumable,
    capacity: Option<u64>,
    source: CapacitySource,
    observer: &mut TailObserver<'_>,
    after: Option<u64>,
) -> Result<(ReplayResult, Option<Save>)> {
    let shown = |i: u64| after.is_none_or(|a| i > a);
    let limit = same_run_until(&from.config, capacity, from.device_total);
    // The peaks within the limit, then the first above it: where the runs differ.
    let within = from.peaks.partition_point(|&(_, bytes)| bytes <= limit);
    let differs_at = from.peaks.get(within).map(|&(event, _)| event);
    let saves = from.saves.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let resumable = capacity.is_none_or(|c| c <= from.device_bytes)
        && saves.first().is_some_and(|s| s.0 <= limit)
        // Without a limit, a run that outgrows the device needs the device's own refusals.
        && (capacity.is_some() || differs_at.is_none());
    if !resumable {
        drop(saves);
        let opts = ReplayOptions {
            config: Some(from.config.clone()),
            capacity_bytes: capacity,
            unlimited: capacity.is_none(),
            past_caught_scratch: from.past_caught_scratch,
            ..Default::default()
        };
        let mut r = replay_observed(trace, &opts, &mut |i, rec, view, live| {
            if shown(i) {
                observer(i, rec, view, live)
            }
        })?;
        r.capacity_source = source;
        return Ok((r, None));
    }
    let Some(differs_at) = differs_at else {
        let mut r = (*from.end).clone();
        r.capacity_bytes = capacity;
        r.capacity_source = source;
        return Ok((r, None));
    };
    // The latest save at or before the event where the runs differ (a save that another replay
    // kept meanwhile is the unlimited run's state too: any one before that event serves).
    let k = saves.partition_point(|s| s.1 <= differs_at) - 1;
    let (state, at) = (saves[k].2.clone(), saves[k].1);
    drop(saves);
    let (mut rp, start, save) = if differs_at - at > LAZY_SAVE_EVENTS {
        let (mut rp, start) = (state, at);
        replay_range(trace, &mut rp, start, differs_at, &mut |_, _, _, _| {})?;
        // Its level: the run's peak demand before the event where the runs differ (a save with
        // a level within the limit exists, so some peak is within it).
        let level = from.peaks[within - 1].1;
        let save = Save(level, differs_at, rp.clone());
        (rp, differs_at, Some(save))
    } else {
        (state, at, None)
    };
    rp.engine.set_capacity(capacity);
    rp.past_scratch = from.past_caught_scratch;
    replay_range(trace, &mut rp, start, u64::MAX, &mut |i, rec, view, live| {
        if shown(i) {
            observer(i, rec, view, live)
        }
    })?;
    Ok((rp.result(from.used_hints, source, trace), save))
}

/// A resumed replay makes a save of its own when the latest one lies more than this many events
/// before the event where it starts to differ (see [`replay_resumed`]).
const LAZY_SAVE_EVENTS: u64 = 2048;

/// Steps `rp` over the records `start..end` (or until it stops), showing each to `observer`.
#[track_caller]
fn replay_range(
    trace: &Trace,
    rp: &mut Replaying<NullSink>,
    start: u64,
    end: u64,
    observer: &mut Observer<'_>,
) -> Result<()> {
    let mut after = |index: u64, r: &Record, rp: &mut Replaying<NullSink>, failed: bool| {
        if !failed {
            observer(index, r, &rp.engine, &rp.live);
        }
        ControlFlow::Continue(())
    };
    drive(trace, &mut [Job::new(rp, &mut after).range(start, end)])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use recorder::trace::Pool;

    const MIB: u64 = 1 << 20;

    /// A recorded run (capacity 60 MiB): a 40 MiB block freed with a stream use (`record_stream`)
    /// and not yet done; the next 30 MiB request misses the cache (the block is still pending),
    /// its segment does not fit beside the 40 MiB one, and PyTorch's `release_cached_blocks`
    /// synchronizes (completing the block), frees its segment and retries.
    fn release_after_completion(cause: ReleaseCause) -> ReplayResult {
        let (s, a, b, c) = (7, 0x7f00_0000_0000, 0x7f00_0400_0000, 0x7f00_0800_0000);
        let mut h = Header::new(Source::Recorded);
        h.capacity_bytes = 60 * MIB;
        let events = [
            Event::SegmentAlloc { addr: a, bytes: 40 * MIB, stream: s, pool: Pool::Large },
            Event::Alloc {
                id: 1,
                addr: a,
                requested_bytes: 40 * MIB,
                block_bytes: 40 * MIB,
                stream: s,
                pool: Pool::Large,
                callsite: 0,
            },
            Event::FreeRequested { id: 1, addr: a, callsite: 0 },
            // Another stream's small tensor, while the block waits for its stream.
            Event::SegmentAlloc { addr: c, bytes: 2 * MIB, stream: s + 1, pool: Pool::Small },
            Event::Alloc {
                id: 3,
                addr: c,
                requested_bytes: 512,
                block_bytes: 512,
                stream: s + 1,
                pool: Pool::Small,
                callsite: 0,
            },
            Event::FreeCompleted { id: 1, addr: a },
            Event::SegmentFree { addr: a, bytes: 40 * MIB, stream: s, pool: Pool::Large },
            Event::CacheRelease { cause, bytes: 40 * MIB, segments: 1 },
            Event::SegmentAlloc { addr: b, bytes: 30 * MIB, stream: s, pool: Pool::Large },
            Event::Alloc {
                id: 2,
                addr: b,
                requested_bytes: 30 * MIB,
                block_bytes: 30 * MIB,
                stream: s,
                pool: Pool::Large,
                callsite: 0,
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.atrace");
        let mut w = TraceWriter::create(&path, &h).unwrap();
        for (i, event) in events.into_iter().enumerate() {
            w.write(&Record { time_ns: i as u64, event }).unwrap();
        }
        w.finish().unwrap();
        replay(&Trace::open(&path).unwrap(), &ReplayOptions::default()).unwrap()
    }

    /// The completion right before PyTorch's out-of-memory release was that release's
    /// synchronization, inside the next request after its cache search missed: the replay
    /// misses too, retries after its own release, and ends with PyTorch's 30 MiB segment.
    #[test]
    fn completions_of_an_out_of_memory_release_come_after_the_miss() {
        let r = release_after_completion(ReleaseCause::OomRetry);
        assert!(!r.is_oom());
        assert_eq!((r.num_alloc_retries, r.end_reserved_bytes, r.peak_reserved_bytes), (1, 32 * MIB, 42 * MIB));
        assert_eq!((r.end_allocated_bytes, r.anomalies), (30 * MIB + 512, 0));
        // The program's empty_cache(): the completion came first, then the release; the
        // request finds nothing cached and gets a new segment, with no retry.
        let r = release_after_completion(ReleaseCause::EmptyCache);
        assert_eq!((r.num_alloc_retries, r.end_reserved_bytes, r.end_allocated_bytes), (0, 32 * MIB, 30 * MIB + 512));
    }
}
