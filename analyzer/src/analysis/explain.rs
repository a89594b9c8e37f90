//! The OOM doctor: for the first out-of-memory of a trace (or its peak, when there is none),
//! PyTorch's message restated with every figure explained, a verdict with its reason, the call
//! sites holding memory, what-if evidence at the same capacity, and advice that the evidence
//! supports, each with the figure that justifies it.
//!
//! Verdicts, checked in this order:
//! - **true exhaustion**: live bytes plus the request exceed the capacity; no allocator could
//!   have served it. It becomes **steady growth** when live bytes rise every iteration (see
//!   [`crate::analysis::leaks`]) by enough to account for the shortfall.
//! - **cache not released**: the request would fit after giving whole free segments back.
//! - **fragmentation**: enough free bytes in total (free inside segments + what the capacity
//!   still allows) but no free block large enough.
//!
//! Advice is never a rule of thumb: a setting is advised only when its replay at the same
//! capacity completes, a capacity only as the smallest one a replay completes at, and a code
//! change only with a replay or a figure that shows it helps. The one code change that is
//! replayed: allocating the tensors that are still live at the OOM before the temporaries of
//! the same stretch of allocations ([`group_long_lived`]), which keeps temporaries in segments
//! of their own so that freeing them frees whole segments.
//!
//! The replay stops at the first OOM; later `oom` events of the trace are listed with their
//! recorded figures. Memory: the layout at the moment, live allocations, call sites.

use crate::analysis::advice::{Advice, Fix, WorthTrying};
use crate::analysis::leaks::{self, Growth, Held, SitePin};
use crate::analysis::outcome::JobPrediction;
use crate::analysis::whatif::{self, PolicyRow, Whatif, WhatifOptions};
use crate::model::layout::LayoutMeasures;
use crate::model::sites::Sites;
use crate::model::units::{fmt_bytes, fmt_need};
pub use crate::model::RecordedOom;
use crate::model::{CapacitySource, Damage, Trace};
use crate::replay::{replay, replay_observed, EngineView, LiveMap, Outcome, Reach, ReplayOptions, ReplayResult};
use anyhow::{Context, Result};
use recorder::trace::{Event, Record, Source, TraceWriter};
use serde::Serialize;
use std::collections::HashMap;

/// The figures of the moment.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub event: u64,
    pub time_ns: u64,
    /// The failed request (0 at a peak).
    pub requested_bytes: u64,
    /// The segment size the allocator tried to get for it.
    pub alloc_bytes: u64,
    pub capacity_bytes: Option<u64>,
    pub allocated_bytes: u64,
    pub live_requested_bytes: u64,
    pub reserved_bytes: u64,
    pub reserved_unallocated_bytes: u64,
    /// Reserved bytes in private pools (CUDA graphs, MemPools), which serve only their own
    /// pool's requests; absent when none.
    #[serde(skip_serializing_if = "crate::model::units::is_zero")]
    pub private_pool_bytes: u64,
    pub largest_free_bytes: u64,
    /// Whole free segments (what `empty_cache()` gives back).
    pub releasable_bytes: u64,
    /// Capacity minus reserved.
    pub headroom_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    pub device_free_bytes: Option<u64>,
    /// Device memory held by the CUDA context and other processes: total - free - reserved.
    pub held_outside_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    TrueExhaustion,
    Fragmentation,
    CacheNotReleased,
    SteadyGrowth,
    /// No out-of-memory: the peak is described instead.
    NoOom,
}

impl VerdictKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictKind::TrueExhaustion => "true exhaustion",
            VerdictKind::Fragmentation => "fragmentation",
            VerdictKind::CacheNotReleased => "cache not released",
            VerdictKind::SteadyGrowth => "steady growth (a leak)",
            VerdictKind::NoOom => "no out-of-memory",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    pub reason: String,
}

/// A replay of a code change.
#[derive(Debug, Clone, Serialize)]
pub struct Experiment {
    pub name: &'static str,
    pub description: String,
    /// The replay served every request of the trace.
    pub completes: bool,
    /// How far it got against the recorded run: on a trace that stops at the failure, serving
    /// every request gets past it, and the rest of the job is not in the trace.
    pub reach: Reach,
    pub peak_reserved_bytes: u64,
}

impl Experiment {
    /// What the replay with the change did, in the words every output uses.
    pub fn outcome(&self) -> &'static str {
        match (self.completes, self.reach) {
            (false, _) => "still runs out of memory",
            (true, Reach::GetsPastFailure) => "gets past the request that failed",
            (true, Reach::ReachesDamage) => "serves every request read before the damage",
            (true, _) => "completes",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ExplainReport {
    pub trace: String,
    /// Set when the trace's requests were predicted rather than recorded: what made them.
    pub predicted: Option<String>,
    /// For a predicted trace that runs out of memory: where the failing request is in the step
    /// (its iteration, phase and call site: the module or autograd node and the operator).
    pub predicted_where: Option<String>,
    pub alloc_conf: String,
    /// The capacity of the replay explained (also in `figures`), and where it came from.
    pub capacity_bytes: Option<u64>,
    pub capacity_source: CapacitySource,
    /// `oom` or `peak`.
    pub moment: &'static str,
    /// The replay's outcome (JSON: `outcome`, `oom_event`, `oom`).
    #[serde(flatten, serialize_with = "crate::replay::outcome_fields")]
    pub replay_outcome: Outcome,
    /// How far the replay gets against the recorded run (as a what-if row's `reach`): on a
    /// trace that stops at its failure, a replay that serves the request `gets_past_failure`.
    pub reach: Reach,
    pub recorded_ooms: Vec<RecordedOom>,
    pub figures: Figures,
    /// PyTorch's OOM message with these figures (at an OOM).
    pub pytorch_message: Option<String>,
    /// What the message leaves out for want of figures the trace does not hold, if anything.
    pub pytorch_message_note: Option<String>,
    /// Set when the capacity was not recorded but inferred: how, and what to do for the real one.
    pub capacity_note: Option<String>,
    pub verdict: Verdict,
    /// When the limit was not recorded but the trace bounds it (an OOM while the device had
    /// room): the verdict at every limit the trace allows, in ranges, and above them.
    pub verdict_by_limit: Option<Vec<LimitVerdict>>,
    /// What the memory live at the moment is for (parameters, activations...); `null` when the
    /// trace has no phases ([`crate::analysis::category`]).
    pub categories: Option<crate::analysis::category::AtMoment>,
    /// Call sites holding memory at the moment, most bytes first.
    pub top_sites: Vec<SitePin>,
    pub growth: Option<Growth>,
    /// What-if rows at the same capacity (unlimited when there is none).
    pub whatif: Vec<PolicyRow>,
    /// Why the smallest capacities are missing from `whatif` (a long trace), if they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_search_note: Option<String>,
    pub offline_plan_bytes: Option<u64>,
    pub live_requested_peak_bytes: u64,
    pub experiments: Vec<Experiment>,
    pub advice: Vec<Advice>,
    /// The first thing to change ([`Fix`]), if anything.
    pub fix: Option<Fix>,
    /// Settings that get past the failure where the rest of the job is not in the trace, fewest
    /// bytes predicted first.
    pub worth_trying: Vec<WorthTrying>,
    /// Changes that the evidence rules out, with why (e.g. the setting PyTorch's message suggests).
    pub not_advised: Vec<String>,
    /// Settings the trace cannot judge, with why (their replay fails where the program may have
    /// caught the failure).
    pub cannot_tell: Vec<String>,
    /// For a trace that ends in an OOM: whether the whole job fits under each setting,
    /// predicted from a repeated iteration, or why the trace cannot tell.
    pub prediction: Option<JobPrediction>,
    /// `torch.cuda.empty_cache()` in the loop: the run replayed without those calls.
    pub empty_cache_calls: Option<crate::analysis::patterns::EmptyCacheCalls>,
    /// Blocks freed but held back for other streams (record_stream), over the trace.
    pub held_for_streams: Option<crate::analysis::patterns::HeldForStreams>,
    /// False when the input is partial (truncated or corrupt): the figures cover what was read.
    pub complete: bool,
    pub input_damage: Option<Damage>,
}

impl ExplainReport {
    /// The advice said beside the fix ("also"): not the fix itself, nor the whole job's capacity
    /// under the setting that the first pick worth trying names, whose sentence already says the
    /// same figure from the same prediction.
    pub fn also(&self) -> impl Iterator<Item = &Advice> {
        let restated = |a: &Advice| {
            a.kind == "capacity"
                && self.fix.as_ref().is_some_and(|f| f.strength == "worth_trying" && f.setting == a.setting)
                && self.worth_trying.first().is_some_and(|w| w.predicted_needs_bytes.is_some())
        };
        self.advice.iter().filter(move |a| self.fix.as_ref().is_none_or(|f| f.text != a.text) && !restated(a))
    }
}

/// The moment captured in the replay.
struct Capture {
    event: u64,
    time_ns: u64,
    held: Held,
    /// Live blocks made before the first iteration (model weights, buffers), by site label.
    from_before_iterations: HashMap<String, u64>,
    /// The allocations the program still held: made and not freed (the free neither asked for
    /// nor completed). The reordering experiment ([`group_long_lived`]) moves these ahead.
    held_ids: crate::model::ids::IdSet,
}

/// Options of [`explain_with`].
#[derive(Debug, Clone, Default)]
pub struct ExplainOptions<'a> {
    /// Search each policy's smallest capacity. `None`: only on traces of at most
    /// [`crate::analysis::capacity_search::LONG_TRACE_EVENTS`] events (the search replays each policy several times).
    pub search_capacity: Option<bool>,
    /// A what-if table already computed for this trace (as `report` does). Used when it was
    /// computed at the same capacity and with the same search; otherwise ignored.
    pub whatif: Option<&'a Whatif>,
    /// The growth per iteration already computed for this trace ([`leaks::analyze`]'s).
    pub growth: Option<Option<Growth>>,
    /// Iterations appended to predict the rest of a job that ran out of memory (`None`:
    /// [`crate::analysis::outcome::DEFAULT_REPEATS`]).
    pub repeats: Option<u32>,
}

/// Explains the trace at `path`. On a long trace (more than [`crate::analysis::capacity_search::LONG_TRACE_EVENTS`]
/// events) the smallest capacity of each policy is not searched, so the advice that rests on it
/// (the capacity to give the process, a setting that runs in less memory) is left out and
/// [`ExplainReport::capacity_search_note`] says so; [`explain_with`] can ask for the search.
pub fn explain(trace: &Trace) -> Result<ExplainReport> {
    explain_with(trace, &ExplainOptions::default())
}

/// Where the request at `event` is: its iteration (by the one rule,
/// [`crate::model::iterations`]: the last iteration mark's text, or the iteration's number where
/// a repeated annotation says where they start), the last phase mark before it and its call
/// site, e.g. `iteration 1, backward, backward MmBackward0 (aten.mm.default)`.
fn request_context(trace: &Trace, event: u64) -> Result<Option<String>> {
    use crate::model::iterations::IterationSource;
    use recorder::trace::MarkKind;
    let (mut mark, mut phase, mut site) = (None, None, None);
    let sites = &trace.facts.sites;
    trace.scan(|i, r| {
        if i > event {
            return;
        }
        match &r.event {
            Event::Mark { kind: MarkKind::Iteration, text } => mark = Some(text.clone()),
            Event::Mark { kind: MarkKind::Phase, text } => phase = Some(text.clone()),
            // A predicted call site is the module or autograd node, and the operator.
            Event::Alloc { callsite, .. } if i == event => {
                site = Some(sites.of(*callsite)).filter(|&s| s != 0).map(|s| sites.label(s).to_string())
            }
            _ => {}
        }
    })?;
    let iteration = trace.facts.iterations.iterations().and_then(|it| {
        let k = it.starts.partition_point(|&s| s <= event);
        match it.source {
            _ if k == 0 => None,
            IterationSource::Marks => mark,
            IterationSource::Annotation(_) => Some(format!("iteration {k}")),
        }
    });
    let parts: Vec<String> = [iteration, phase, site].into_iter().flatten().collect();
    Ok((!parts.is_empty()).then(|| parts.join(", ")))
}

pub fn explain_with(trace: &Trace, opts: &ExplainOptions<'_>) -> Result<ExplainReport> {
    let first_iteration = first_iteration(trace);
    let search = searches(trace, opts);
    let capacity = trace.default_capacity();
    // The layout is copied once, at the moment: the replay under the recorded settings takes
    // the OOM and finds the peak's event; only a run without an OOM replays again, up to its
    // peak, to take the layout there.
    let second_of = |first: &ExplainWatch| -> Result<Option<ExplainWatch>> {
        let Some(peak) = first.peak_to_take() else { return Ok(None) };
        let mut second = ExplainWatch::new(trace, first_iteration, Some(peak));
        let o = ReplayOptions { stop_after: Some(peak), ..Default::default() };
        replay_observed(trace, &o, &mut |i, r, view, live| second.observe(trace, i, r, view, live))?;
        Ok(Some(second.replayed()))
    };
    // The patterns need only `result`: they go beside the replay to the peak and the prelude.
    let prelude_of = |first: ExplainWatch, result: &ReplayResult, growth: Option<Option<Growth>>| {
        let first = first.replayed();
        let (prelude, patterns) = crate::replay::join_within(
            trace,
            || second_of(&first).and_then(|second| explain_prelude(trace, growth, result.clone(), first, second)),
            || crate::analysis::patterns::of_run(trace, result),
        );
        Ok(prelude?.with_patterns(patterns?))
    };
    if let Some(given) = reusable(opts.whatif, capacity.bytes, search) {
        let mut first = ExplainWatch::new(trace, first_iteration, None);
        let result = replay_observed(trace, &ReplayOptions::default(), &mut |i, r, view, live| {
            first.observe(trace, i, r, view, live)
        })?;
        let o = ExplainOptions { whatif: Some(given), ..opts.clone() };
        return explain_finish(trace, prelude_of(first, &result, opts.growth.clone())?, &o);
    }
    // Without a what-if table given, the replay under the recorded settings is the table's own
    // row (one replay fewer). What needs only that replay (the second replay, the growth, the
    // verdict and the experiments) runs beside the table's capacity searches where the table
    // calls it there; else after the table, with the growth's folds beside the table.
    /// Row 0's watch, until the prelude is made from it.
    struct Row0 {
        watching: Option<ExplainWatch>,
        found: Option<Result<ExplainPrelude>>,
    }
    let row0 = std::sync::Mutex::new(Some(Row0 {
        watching: Some(ExplainWatch::new(trace, first_iteration, None)),
        found: None,
    }));
    let table = || {
        whatif::whatif_observed(
            trace,
            &WhatifOptions {
                capacity,
                search_capacity: search,
                repeats: opts.repeats.unwrap_or(crate::analysis::outcome::DEFAULT_REPEATS),
                rows_only: false,
            },
            &|k| if k == 0 { row0.lock().ok().and_then(|mut w| w.take()) } else { None },
            &|w: &mut Option<Row0>, i, r, view, live| {
                if let Some(w) = w.as_mut().and_then(|w| w.watching.as_mut()) {
                    w.observe(trace, i, r, view, live)
                }
            },
            &|_, w, result, _, _| {
                if let Some(w) = w.as_mut() {
                    w.found = w.watching.take().map(|first| prelude_of(first, result, opts.growth.clone()));
                }
            },
        )
    };
    let growth = || -> Result<Option<Growth>> {
        match opts.growth.clone() {
            Some(g) => Ok(g),
            None => Ok(leaks::growth_only(trace)?.0),
        }
    };
    // The growth's folds go beside a table that does not search (its rows' watches then finish
    // with the table); side by side unless one replay's state is all the memory replays may keep.
    let (table, growth) = if search {
        (table(), None)
    } else {
        let (t, g) = crate::replay::join_within(trace, table, growth);
        (t, Some(g))
    };
    let (table, mut runs) = table?;
    let (row, result) = runs.swap_remove(0);
    let row = row.flatten().expect("row 0 is the recorded configuration, and it is watched");
    let prelude = match (row.found, row.watching) {
        (Some(prelude), _) => prelude,
        (None, Some(first)) => {
            let growth = match growth {
                Some(g) => Some(g?),
                None => opts.growth.clone(),
            };
            prelude_of(first, &result, growth)
        }
        (None, None) => unreachable!("row 0's watch makes its prelude once"),
    };
    finish(trace, prelude?, &table, search)
}

/// Whether `explain` searches each setting's smallest capacity: as asked, else on traces of at
/// most [`crate::analysis::capacity_search::LONG_TRACE_EVENTS`] events.
fn searches(trace: &Trace, opts: &ExplainOptions<'_>) -> bool {
    opts.search_capacity.unwrap_or(trace.events <= crate::analysis::capacity_search::LONG_TRACE_EVENTS)
}

/// A what-if table given to `explain` ([`ExplainOptions::whatif`]), where it answers what
/// `explain` would compute: at the same capacity, and searched exactly when `search` asks.
fn reusable(w: Option<&Whatif>, capacity: Option<u64>, search: bool) -> Option<&Whatif> {
    let searched = |w: &Whatif| w.rows.iter().all(|r| r.min_capacity_bytes.is_some());
    w.filter(|w| w.capacity_bytes == capacity && searched(w) == search)
}

/// Where the first iteration starts (marks or a repeated annotation): blocks made before it and
/// still live are the model's weights and buffers, never advised to be freed.
pub fn first_iteration(trace: &Trace) -> Option<u64> {
    trace.facts.iterations.iterations().and_then(|it| it.starts.first().copied())
}

/// What `explain` watches in the replay under the recorded settings and capacity: the OOM (the
/// replay's own failure, or the recorded one that ended the run), else the peak of reserved
/// memory, and the layout with the live blocks' sites at that moment. The layout at the peak is
/// taken by a second watch, given the peak the first found ([`ExplainWatch::peak_to_take`]), on
/// a replay that may stop there.
pub struct ExplainWatch {
    first_iteration: Option<u64>,
    /// The recorded OOM that ended the run (those the program caught are replayed past).
    fatal_recorded: Option<u64>,
    peak_at: Option<u64>,
    /// Live trace ids -> call site id, and those made before the first iteration.
    callsite_of: crate::model::ids::CallsiteOf,
    early: crate::model::ids::IdSet,
    /// Allocations whose free the program asked for (not yet completed, or completed and held
    /// back by the replay): with `asked_last`, the last one asked, which is nearly always
    /// completed by the next record (kept apart from the set, so that such a free costs no
    /// insertion). Ids the replay has since let go of are dropped whenever the set outgrows the
    /// live allocations, so that it stays about their size.
    asked: crate::model::ids::IdSet,
    asked_last: Option<u64>,
    at_oom: Option<Capture>,
    at_peak: Option<Capture>,
    peak_event: Option<u64>,
    peak_reserved: u64,
    ooms_seen: u64,
    /// Another watch on the same replay takes the layout at [`ExplainWatch::peak_at`]: the
    /// capture leaves it out, and [`ExplainWatch::give_layout`] hands it over after the replay,
    /// so that a layout of millions of blocks is not held twice while the engine's state is.
    layout_elsewhere: bool,
}

impl ExplainWatch {
    /// `peak_at`: the event whose layout to take (the peak a first watch found).
    pub fn new(trace: &Trace, first_iteration: Option<u64>, peak_at: Option<u64>) -> Self {
        ExplainWatch {
            first_iteration,
            // Under the trace's own capacity a replay that serves the recorded failure differs
            // from the run, and the failure is what to explain; under a given one the replay is
            // the answer: where it serves the request, that limit gets past the failure.
            fatal_recorded: trace
                .facts
                .fatal_oom()
                .map(|o| o.event)
                .filter(|_| trace.default_capacity().source != crate::model::CapacitySource::Given),
            peak_at,
            callsite_of: Default::default(),
            early: Default::default(),
            asked: Default::default(),
            asked_last: None,
            at_oom: None,
            at_peak: None,
            peak_event: None,
            peak_reserved: 0,
            ooms_seen: 0,
            layout_elsewhere: false,
        }
    }

    /// Another watch on the same replay takes the layout at the peak this one takes
    /// ([`ExplainWatch::give_layout`] hands it over).
    pub fn layout_taken_elsewhere(mut self) -> Self {
        self.layout_elsewhere = true;
        self
    }

    /// The layout at the peak, taken by another watch on the same replay.
    pub fn give_layout(&mut self, segments: Vec<recorder::engine::SegmentView>) {
        if let Some(c) = self.at_peak.as_mut().filter(|_| self.layout_elsewhere) {
            c.held.segments = segments;
        }
    }

    /// The replay is over: what was kept per live allocation is let go (the captures stay).
    pub fn replayed(mut self) -> Self {
        self.callsite_of = Default::default();
        self.early = Default::default();
        self.asked = Default::default();
        self.asked_last = None;
        self
    }

    /// The event whose layout a second watch must take: the peak, where the run had no OOM.
    pub fn peak_to_take(&self) -> Option<u64> {
        self.peak_event.filter(|_| self.at_oom.is_none())
    }

    pub fn observe(&mut self, trace: &Trace, i: u64, r: &Record, view: &dyn EngineView, live: &LiveMap) {
        match &r.event {
            Event::Alloc { id, callsite, .. } => {
                self.callsite_of.alloc(*id, *callsite);
                if self.first_iteration.is_some_and(|f| i < f) {
                    self.early.insert(*id);
                }
                // An id used again is a new allocation.
                if !self.asked.is_empty() {
                    self.asked.remove(id);
                }
                if self.asked_last == Some(*id) {
                    self.asked_last = None;
                }
            }
            Event::FreeRequested { id, .. } => {
                if let Some(before) = self.asked_last.replace(*id) {
                    self.asked.insert(before);
                }
            }
            Event::FreeCompleted { id, .. } => {
                self.callsite_of.free(*id);
                self.early.remove(id);
                if self.asked_last == Some(*id) {
                    self.asked_last = None;
                } else if !self.asked.is_empty() {
                    self.asked.remove(id);
                }
                // A completion the replay holds back (it frees the block later): freed for the
                // program all the same.
                if live.contains_key(id) {
                    self.asked.insert(*id);
                    if self.asked.len() > 2 * live.len() + 1024 {
                        self.asked.retain(|id| live.contains_key(id));
                    }
                }
            }
            _ => {}
        }
        // The replay's own failure of a request (which ends it) or the recorded fatal one;
        // not a recorded OOM that the program caught.
        let failed_here = view.stats().num_ooms > self.ooms_seen;
        self.ooms_seen = view.stats().num_ooms;
        let caught = matches!(r.event, Event::Oom { .. }) && trace.facts.survived(i);
        if self.at_oom.is_none() && ((failed_here && !caught) || self.fatal_recorded == Some(i)) {
            self.at_oom = Some(self.capture(&trace.facts.sites, i, r, view, live, true));
        }
        let reserved = view.stats().reserved_bytes.all.current;
        if self.at_oom.is_none() && reserved > self.peak_reserved {
            self.peak_reserved = reserved;
            self.peak_event = Some(i);
        }
        if self.peak_at == Some(i) {
            self.at_peak = Some(self.capture(&trace.facts.sites, i, r, view, live, false));
        }
    }

    /// The capture at record `i`; `held`: with the allocations the program still held (at an
    /// OOM, for the reordering experiment).
    #[allow(clippy::too_many_arguments)]
    fn capture(&self, sites: &Sites, i: u64, r: &Record, view: &dyn EngineView, live: &LiveMap, held: bool) -> Capture {
        let site = |id: &u64| sites.of(self.callsite_of.get(*id));
        let mut from_before_iterations: HashMap<String, u64> = HashMap::new();
        for id in live.keys().filter(|id| self.early.contains(id)) {
            *from_before_iterations.entry(sites.label(site(id)).to_string()).or_default() += 1;
        }
        let held_ids = if held {
            live.keys().copied().filter(|id| !self.asked.contains(id) && self.asked_last != Some(*id)).collect()
        } else {
            Default::default()
        };
        Capture {
            from_before_iterations,
            held_ids,
            event: i,
            time_ns: r.time_ns,
            held: Held {
                event: i,
                segments: if self.layout_elsewhere { Vec::new() } else { view.segments() },
                site_of_block: live.iter().map(|(id, addr)| (*addr, site(id))).collect(),
            },
        }
    }
}

/// What `explain` finds from the replay under the recorded settings alone, before the what-if
/// table: the figures at the moment, the verdict, the call sites pinning memory, the growth, and
/// the experiments (each a replay of its own). [`explain_finish`] adds the advice, which rests on
/// the table. Made apart so that it can run while the table's capacity searches do.
pub struct ExplainPrelude {
    result: ReplayResult,
    /// How far the replay gets against the recorded run, decided once for the verdict and the
    /// report.
    reach: Reach,
    recorded_ooms: Vec<crate::model::RecordedOom>,
    is_oom: bool,
    figures: Figures,
    from_before_iterations: HashMap<String, u64>,
    top_sites: Vec<SitePin>,
    growth: Option<Growth>,
    verdict: Verdict,
    verdict_by_limit: Option<Vec<LimitVerdict>>,
    grouped: Option<Experiment>,
    empty_cache_calls: Option<crate::analysis::patterns::EmptyCacheCalls>,
    held_for_streams: Option<crate::analysis::patterns::HeldForStreams>,
    predicted_where: Option<String>,
    categories: Option<crate::analysis::category::AtMoment>,
}

/// The report of `explain` from its [`ExplainPrelude`]: the advice, from the what-if table
/// given in `opts` where it was made at the same capacity and with the same search (else one is
/// made).
pub fn explain_finish(trace: &Trace, p: ExplainPrelude, opts: &ExplainOptions<'_>) -> Result<ExplainReport> {
    let search = searches(trace, opts);
    match reusable(opts.whatif, p.result.capacity_bytes, search) {
        Some(w) => finish(trace, p, w, search),
        None => {
            let w = table_for(trace, opts, &p.result, search)?;
            finish(trace, p, &w, search)
        }
    }
}

/// The what-if table `explain` advises from, at the capacity of the replay `result`.
fn table_for(trace: &Trace, opts: &ExplainOptions<'_>, result: &ReplayResult, search: bool) -> Result<Whatif> {
    let source = result.capacity_source;
    let capacity = trace.capacity(result.capacity_bytes.filter(|_| source == CapacitySource::Given), false);
    whatif::whatif(
        trace,
        &WhatifOptions {
            capacity,
            search_capacity: search,
            repeats: opts.repeats.unwrap_or(crate::analysis::outcome::DEFAULT_REPEATS),
            rows_only: false,
        },
    )
}

/// [`ExplainPrelude`] from the watches of the replay under the recorded settings: `first` over
/// the whole run (`result`), `second` up to the peak where `first` found no OOM; `growth`: the
/// growth per iteration where already computed.
///
/// The program's patterns are not in it: they need only `result`, so callers make them beside
/// the whole prelude ([`crate::analysis::patterns::of_run`]) and give them with
/// [`ExplainPrelude::with_patterns`].
pub fn explain_prelude(
    trace: &Trace,
    growth: Option<Option<Growth>>,
    result: ReplayResult,
    first: ExplainWatch,
    second: Option<ExplainWatch>,
) -> Result<ExplainPrelude> {
    let header = &trace.header;
    let recorded_ooms = trace.facts.recorded_ooms.clone();
    let mem_info = trace.facts.mem_info; // the last DeviceMemInfo before the first recorded OOM
    let at_oom = first.at_oom;
    let at_peak = second.and_then(|s| s.at_peak);
    let sites = &trace.facts.sites;
    let is_oom = at_oom.is_some();
    let cap = at_oom.or(at_peak).unwrap_or(Capture {
        event: 0,
        time_ns: 0,
        held: Held { event: 0, segments: Vec::new(), site_of_block: HashMap::new() },
        from_before_iterations: HashMap::new(),
        held_ids: Default::default(),
    });
    let lm = LayoutMeasures::of(&cap.held.segments);
    let capacity = result.capacity_bytes;
    let recorded_here = recorded_ooms.iter().find(|o| o.event == cap.event);
    let (requested_bytes, alloc_bytes) = match (&result.outcome, recorded_here) {
        (Outcome::Oom { requested_bytes, alloc_bytes, .. }, _) => (*requested_bytes, *alloc_bytes),
        (Outcome::Ok, Some(o)) => (o.requested_bytes, o.alloc_bytes),
        (Outcome::Ok, None) => (0, 0),
    };
    let device_total = (header.device_total_bytes > 0)
        .then_some(header.device_total_bytes)
        .or(mem_info.map(|m| m.1).filter(|&t| t > 0));
    let device_free = recorded_here.and_then(|o| o.device_free_bytes).or(mem_info.map(|m| m.0));
    let figures = Figures {
        event: cap.event,
        time_ns: cap.time_ns,
        requested_bytes,
        alloc_bytes,
        capacity_bytes: capacity,
        allocated_bytes: lm.allocated_bytes,
        live_requested_bytes: lm.requested_bytes,
        reserved_bytes: lm.reserved_bytes,
        reserved_unallocated_bytes: lm.reserved_unallocated_bytes(),
        private_pool_bytes: cap.held.segments.iter().filter(|s| s.kept_by_private_pool()).map(|s| s.bytes).sum(),
        largest_free_bytes: lm.largest_free_bytes,
        releasable_bytes: lm.releasable_bytes,
        headroom_bytes: capacity.map(|c| c.saturating_sub(lm.reserved_bytes)),
        device_total_bytes: device_total,
        device_free_bytes: device_free,
        held_outside_bytes: match (device_total, device_free) {
            (Some(t), Some(f)) => Some(t.saturating_sub(f).saturating_sub(lm.reserved_bytes)),
            _ => None,
        },
    };

    let mut retention = leaks::retention(&cap.held, sites, if is_oom { "oom" } else { "peak" });
    retention.sites.sort_by(|a, b| b.block_bytes.cmp(&a.block_bytes).then(a.site.cmp(&b.site)));
    let top_sites: Vec<SitePin> = retention.sites.iter().take(10).cloned().collect();
    // Growth with the verdict, and the reordering experiment where it is fragmentation.
    let growth = match growth {
        Some(g) => g,
        None => leaks::growth_only(trace)?.0,
    };
    // At an OOM, the growth that led to it: the iterations before the failure, not those the
    // trace holds after it (a whole trace replayed under a smaller limit fails part way).
    let growth = if is_oom { growth.and_then(|g| g.before(figures.event)) } else { growth };
    let reach = Reach::of(trace, &result);
    let gets_past =
        (!is_oom && reach == Reach::GetsPastFailure).then(|| trace.facts.fatal_oom().map(|o| o.event)).flatten();
    let cut_after = trace.damage().map(|_| trace.events);
    let mut verdict = verdict(is_oom, gets_past, cut_after, &figures, growth.as_ref(), &lm, &trace.header.config);
    if !is_oom && trace.predicted_lower_bound() {
        // Completing is not fitting when the prediction leaves memory out.
        verdict.reason = format!(
            "the predicted requests complete, but the prediction is a lower bound (it leaves out \
memory its note names), so this does not say the step fits; {}",
            verdict.reason.replacen("the run completed. At", "at", 1)
        );
    }
    // The reordering experiment answers fragmentation at an OOM only.
    let grouped = if is_oom && verdict.kind == VerdictKind::Fragmentation {
        group_long_lived(trace, cap.event, &cap.held_ids)?
    } else {
        None
    };
    // An unknown limit is never a confident verdict: with the range of limits the trace allows,
    // the verdict at each (see [`verdict_by_limit`]); otherwise it holds only at the limit assumed.
    let range = trace.default_capacity().range.filter(|_| result.capacity_source == CapacitySource::InferredLimit);
    let verdict_by_limit = match (is_oom, range) {
        (true, Some(range)) if !result.capacity_source.is_known() => {
            verdict_by_limit(&figures, growth.as_ref(), &lm, range, &header.config)
        }
        _ => None,
    };
    if is_oom && !result.capacity_source.is_known() {
        if let Some(v) = &verdict_by_limit {
            // The headline is the verdict over the widest part of the range the trace allows, told
            // at the least limit of that part.
            let widest = v
                .iter()
                .filter_map(|l| Some((l.kind?, l.from_bytes, l.to_bytes?)))
                .max_by_key(|&(_, from, to)| (to - from, std::cmp::Reverse(from)));
            let at = match widest {
                Some((kind, from, _)) if kind != verdict.kind => {
                    let g = Figures {
                        capacity_bytes: Some(from),
                        headroom_bytes: Some(from.saturating_sub(figures.reserved_bytes)),
                        ..figures.clone()
                    };
                    verdict = self::verdict(true, None, None, &g, growth.as_ref(), &lm, &trace.header.config);
                    from
                }
                _ => capacity.unwrap_or(0),
            };
            // Told where the headline holds: where that is above the limit assumed, the figures
            // and the replays (at the least limit the trace allows) are said to be elsewhere.
            let assumed = capacity.unwrap_or(0);
            let at_text = if at == assumed {
                format!("At {}", fmt_bytes(at))
            } else {
                format!("At {}, the least with this verdict (the replays assume {})", fmt_bytes(at), fmt_bytes(assumed))
            };
            // The ranges start at the least limit the trace allows and end where the request gets
            // its segment: they say the range.
            verdict.reason = format!("the limit was not recorded: {}. {at_text}: {}", limits_text(v), verdict.reason);
        } else if let Some(c) = capacity {
            // How the limit was inferred, as the capacity's note says it.
            let how = match result.capacity_source {
                CapacitySource::InferredFromOom => "the device itself was full: the most the allocator could have had",
                _ => "inferred, the least it can have been",
            };
            verdict.reason = format!(
                "if the limit was {} (not recorded: {how}; pass --capacity for the real one): {}",
                fmt_bytes(c),
                verdict.reason
            );
        }
    }
    let predicted_where = match (trace.predicted(), is_oom) {
        (Some(_), true) => request_context(trace, figures.event)?,
        _ => None,
    };
    let categories = crate::analysis::category::at_moment(trace, figures.event)?;
    Ok(ExplainPrelude {
        result,
        reach,
        recorded_ooms,
        is_oom,
        figures,
        from_before_iterations: cap.from_before_iterations,
        top_sites,
        growth,
        verdict,
        verdict_by_limit,
        grouped,
        empty_cache_calls: None,
        held_for_streams: None,
        predicted_where,
        categories,
    })
}

impl ExplainPrelude {
    /// The prelude with the program's patterns ([`crate::analysis::patterns::of_run`] of the
    /// same run), which its advice reads.
    pub fn with_patterns(self, (empty_cache_calls, held_for_streams): crate::analysis::patterns::Patterns) -> Self {
        ExplainPrelude { empty_cache_calls, held_for_streams, ..self }
    }
}

/// The report of `explain`: the prelude's findings and the advice, which rests on the what-if
/// table `w` (searched for the smallest capacities where `search`).
fn finish(trace: &Trace, p: ExplainPrelude, w: &Whatif, search: bool) -> Result<ExplainReport> {
    let ExplainPrelude {
        result,
        reach,
        recorded_ooms,
        is_oom,
        figures,
        from_before_iterations,
        top_sites,
        growth,
        verdict,
        verdict_by_limit,
        grouped,
        empty_cache_calls,
        held_for_streams,
        predicted_where,
        categories,
    } = p;
    let capacity_search_note = (!search).then(|| {
        format!(
            "smallest capacities not searched: the trace is long ({} events), and the search replays each policy \
several times; `alloctrace whatif` searches them",
            trace.events
        )
    });

    // Made above where the verdict is fragmentation at an OOM.
    let experiments: Vec<Experiment> = grouped.into_iter().collect();
    let crate::analysis::advice::SettingsAdvice { mut advice, worth_trying, mut not_advised, cannot_tell } =
        advise(&figures, &verdict, &w.rows, w.prediction.as_ref(), &experiments, &top_sites, growth.as_ref(), is_oom);
    // Never "free the weights": blocks alive from before the first iteration.
    if let Some(top) = top_sites.first() {
        let early = from_before_iterations.get(&top.site.label).copied().unwrap_or(0);
        let before = advice.len();
        advice.retain(|a| !(early > 0 && a.kind == "code" && a.text.starts_with("free the ")));
        if advice.len() < before {
            not_advised.push(format!(
                "freeing the blocks from {}: {early} of its {} live blocks were made before the first iteration (the \
model's weights and buffers), which the program needs",
                top.site.label, top.blocks
            ));
        }
    }
    if let Some(e) = &empty_cache_calls {
        if e.keeps_memory_down() {
            not_advised.push(format!(
                "removing the torch.cuda.empty_cache() calls: {}. They keep the memory held down, at the cost of device \
calls; the trace cannot tell whether they are the program's or PyTorch's own (torch.cuda.graph calls it before each \
capture)",
                e.text()
            ));
        } else if !e.without_fails && e.device_calls_without < e.device_calls_with {
            advice.push(Advice {
                kind: "code",
                setting: None,
                text: "remove the torch.cuda.empty_cache() calls (and the gc.collect() beside them): the allocator \
reuses its cached segments without them"
                    .into(),
                evidence: e.text(),
                proven: true,
            });
        }
    }
    if let Some(h) = held_for_streams.as_ref().filter(|h| h.raised_the_peak()) {
        advice.push(Advice {
            kind: "code",
            setting: None,
            text: "blocks used on another stream wait for it: synchronize that stream (or the device) sooner, or let \
the consuming stream allocate the tensors it uses, instead of record_stream on tensors made elsewhere"
                .into(),
            evidence: h.text(),
            proven: false,
        });
    }
    order_advice(&mut advice, verdict.kind);
    // PyTorch names the limit ("X allowed") only when one was set; an inferred one is not known.
    let message = is_oom.then(|| {
        let known = result.capacity_source.is_known();
        pytorch_message(&Figures { capacity_bytes: figures.capacity_bytes.filter(|_| known), ..figures.clone() })
    });
    Ok(ExplainReport {
        trace: trace.path.display().to_string(),
        predicted: trace.predicted().map(str::to_string),
        predicted_where,
        alloc_conf: result.alloc_conf.clone(),
        capacity_bytes: result.capacity_bytes,
        capacity_source: result.capacity_source,
        moment: if is_oom { "oom" } else { "peak" },
        replay_outcome: result.outcome.clone(),
        reach,
        recorded_ooms,
        pytorch_message: message.as_ref().map(|m| m.0.clone()),
        pytorch_message_note: message.and_then(|m| m.1).map(str::to_string),
        capacity_note: trace.default_capacity().note(),
        categories,
        figures,
        verdict,
        verdict_by_limit,
        top_sites,
        growth,
        whatif: w.rows.clone(),
        capacity_search_note,
        offline_plan_bytes: w.bounds.offline_plan_bytes,
        live_requested_peak_bytes: w.bounds.live_requested_peak_bytes,
        experiments,
        fix: Fix::of(&advice, &worth_trying),
        advice,
        worth_trying,
        not_advised,
        cannot_tell,
        prediction: w.prediction.clone(),
        empty_cache_calls,
        held_for_streams,
        complete: result.input_damage.is_none(),
        input_damage: result.input_damage.clone(),
    })
}

/// The share of the live bytes that growth over the run accounts for.
fn growth_share(g: &Growth, allocated: u64) -> f64 {
    let total = g.per_iteration_bytes.max(0.0) * g.iterations() as f64;
    if allocated == 0 {
        0.0
    } else {
        total / allocated as f64
    }
}

/// `gets_past`: the replay served the request at which the recorded run failed (this event), and
/// the trace stops there. `cut_after`: the input is damaged (a killed recorder leaves a trace
/// without its trailer) and this many events were read before the damage.
#[allow(clippy::too_many_arguments)]
fn verdict(
    is_oom: bool,
    gets_past: Option<u64>,
    cut_after: Option<u64>,
    f: &Figures,
    growth: Option<&Growth>,
    lm: &LayoutMeasures,
    config: &recorder::engine::config::AllocatorConfig,
) -> Verdict {
    let b = fmt_bytes;
    if !is_oom {
        let head = match gets_past {
            Some(e) => format!(
                "the replay serves the request at which the recorded run failed (event {e}); the rest of the job is \
not in the trace. At"
            ),
            None => match cut_after {
                // What came after the damage is not known: the run may have failed there.
                Some(n) => format!(
                    "the {n} events read before the damage complete; what came after them (a killed job's end, an \
out-of-memory error) is not in the file. At"
                ),
                None => "the run completed. At".to_string(),
            },
        };
        let mut reason = format!(
            "{head} peak reserved ({} at event {}), {} is allocated and {} is reserved but unallocated ({:.1}%), the \
largest free block being {}",
            b(f.reserved_bytes),
            f.event,
            b(f.allocated_bytes),
            b(f.reserved_unallocated_bytes),
            100.0 * lm.reserved_vs_allocated(),
            b(f.largest_free_bytes)
        );
        if f.private_pool_bytes > 0 {
            reason.push_str(&format!(
                "; {} of the reserved memory is in private pools (CUDA graphs, MemPools), which serve only their own \
pool's requests",
                b(f.private_pool_bytes)
            ));
        }
        if let Some(g) = growth.filter(|g| g.is_steady() && !g.sites.is_empty()) {
            reason.push_str(&format!(
                "; live bytes grow by {} per iteration ({})",
                b(g.per_iteration_bytes as u64),
                g.sites[0].site.label
            ));
        }
        return Verdict { kind: VerdictKind::NoOom, reason };
    }
    let limit = f.capacity_bytes.or(f.device_total_bytes.map(|t| t.saturating_sub(f.held_outside_bytes.unwrap_or(0))));
    let needed = f.allocated_bytes.saturating_add(f.requested_bytes);
    if let Some(limit) = limit.filter(|&l| needed > l) {
        if let Some(g) = growth.filter(|g| g.is_steady() && !g.sites.is_empty()) {
            let share = growth_share(g, f.allocated_bytes);
            if share >= 0.25 {
                return Verdict {
                    kind: VerdictKind::SteadyGrowth,
                    reason: format!(
                        "live bytes ({}) plus the request ({}) exceed the limit ({}), and live bytes grew by {} per \
iteration over {} iterations ({:.0}% of what is live), mostly from {}",
                        b(f.allocated_bytes),
                        b(f.requested_bytes),
                        b(limit),
                        b(g.per_iteration_bytes as u64),
                        g.iterations(),
                        100.0 * share.min(1.0),
                        g.sites[0].site.label
                    ),
                };
            }
        }
        // Live blocks rounded by powers of two hold more than the program asked for: where what
        // it asked for, plus the request, is within the limit, another rounding may serve it.
        let asked = f.live_requested_bytes.saturating_add(f.requested_bytes);
        let reason = if !config.rounds_plainly_up_to(u64::MAX) && asked <= limit {
            format!(
                "live bytes ({}) plus the request ({}) = {} exceed the limit ({}); the program asked for {} of \
those live bytes, which with the request come to {}, within the limit: the rounding of roundup_power2_divisions \
adds {}",
                b(f.allocated_bytes),
                b(f.requested_bytes),
                b(needed),
                b(limit),
                b(f.live_requested_bytes),
                b(asked),
                b(f.allocated_bytes.saturating_sub(f.live_requested_bytes))
            )
        } else {
            format!(
                "live bytes ({}) plus the request ({}) = {} exceed the limit ({}): no allocator could serve it",
                b(f.allocated_bytes),
                b(f.requested_bytes),
                b(needed),
                b(limit)
            )
        };
        return Verdict { kind: VerdictKind::TrueExhaustion, reason };
    }
    // The request fits under the limit in bytes, but the cause that explains the most bytes is
    // the growth: a job whose live bytes grow every iteration is a leak even where its last
    // request failed for want of a contiguous block.
    if let Some(g) = growth.filter(|g| g.is_steady() && !g.sites.is_empty()) {
        let share = growth_share(g, f.allocated_bytes);
        let grown = (share.min(1.0) * f.allocated_bytes as f64) as u64;
        if share >= 0.25 && grown > f.reserved_unallocated_bytes {
            return Verdict {
                kind: VerdictKind::SteadyGrowth,
                reason: format!(
                    "live bytes grew by {} per iteration over {} iterations ({:.0}% of the {} live at the failure), \
mostly from {}: more than the {} free inside segments; the {} request failed when it needed a new segment",
                    b(g.per_iteration_bytes as u64),
                    g.iterations(),
                    100.0 * share.min(1.0),
                    b(f.allocated_bytes),
                    g.sites[0].site.label,
                    b(f.reserved_unallocated_bytes),
                    b(f.requested_bytes)
                ),
            };
        }
    }
    let headroom = f.headroom_bytes.unwrap_or(0);
    if f.releasable_bytes > 0 && f.releasable_bytes + headroom >= f.alloc_bytes {
        return Verdict {
            kind: VerdictKind::CacheNotReleased,
            reason: format!(
                "whole free segments hold {} and the limit allows {} more: releasing the cache would have made room \
for the {} segment",
                b(f.releasable_bytes),
                b(headroom),
                b(f.alloc_bytes)
            ),
        };
    }
    // Fragmentation is free memory in pieces: where what is free inside segments could not hold
    // the request even in one piece, and all that is free, inside segments and under the limit,
    // is less than the segment the allocator asks the device for, memory is used up at the size
    // the allocator asks for.
    if f.reserved_unallocated_bytes < f.requested_bytes && f.reserved_unallocated_bytes + headroom < f.alloc_bytes {
        return Verdict {
            kind: VerdictKind::TrueExhaustion,
            reason: format!(
                "live bytes plus the request ({}) come within {} of the limit{}, but only {} is free inside segments, \
less than the {} request even in one piece, and the allocator asks the device for a {} segment for it, more than \
is free in all: memory is used up at the size the allocator asks for",
                b(needed),
                b(headroom),
                limit.map(|l| format!(" ({})", b(l))).unwrap_or_default(),
                b(f.reserved_unallocated_bytes),
                b(f.requested_bytes),
                b(f.alloc_bytes)
            ),
        };
    }
    Verdict {
        kind: VerdictKind::Fragmentation,
        reason: format!(
            "live bytes plus the request ({}) fit within the limit{}, and {} is free in total ({} free inside segments + \
{} the limit still allows), but the request needs one contiguous block of {} and the largest free block is {}; \
no segment is wholly free, so releasing the cache frees {}",
            b(needed),
            limit.map(|l| format!(" ({})", b(l))).unwrap_or_default(),
            b(f.reserved_unallocated_bytes + headroom),
            b(f.reserved_unallocated_bytes),
            b(headroom),
            b(f.requested_bytes),
            b(f.largest_free_bytes),
            b(f.releasable_bytes)
        ),
    }
}

/// The verdict over a range of limits.
#[derive(Debug, Clone, Serialize)]
pub struct LimitVerdict {
    /// The limits `[from, to)` this holds at; `to` is `None` for every limit above `from`.
    pub from_bytes: u64,
    pub to_bytes: Option<u64>,
    /// `None` above the range the trace allows: there the failed request would have been
    /// served, and what the run did next is not in the trace.
    pub kind: Option<VerdictKind>,
}

/// The verdict at each limit in `[low, high)`, the limits a trace that ran out of memory with
/// no recorded limit allows (see [`crate::model::CapacitySource::InferredLimit`]), and above.
///
/// Under every such limit the replay up to the failure is the same (reserved bytes never went
/// above `low` before it, and the limit is read only when a segment is asked for), so the
/// layout at the failure is too; only the verdict's comparisons with the limit change. They
/// change where the limit reaches live bytes plus the request (below: no allocator could
/// serve it), where all that is free, inside segments and under the limit, first holds the
/// segment asked for (below: memory is used up at that size), and where releasing the cache
/// would have made room for the segment. Worked
/// example (the textbook fragmentation OOM): 920 MiB live, a 1 GiB request, 920 MiB free in
/// 4 MiB pieces, range [1.80 GiB, 2.80 GiB): true exhaustion under 1.90 GiB, fragmentation
/// from 1.90 GiB, and from 2.80 GiB the segment is had.
///
/// `None` with `garbage_collection_threshold`, which reads the limit all along (the layout
/// itself depends on it).
pub fn verdict_by_limit(
    f: &Figures,
    growth: Option<&Growth>,
    lm: &LayoutMeasures,
    (low, high): (u64, u64),
    config: &recorder::engine::config::AllocatorConfig,
) -> Option<Vec<LimitVerdict>> {
    if config.garbage_collection_threshold.is_some_and(|t| t > 0.0) || high <= low {
        return None;
    }
    let at = |limit: u64| {
        let g = Figures {
            capacity_bytes: Some(limit),
            headroom_bytes: Some(limit.saturating_sub(f.reserved_bytes)),
            ..f.clone()
        };
        verdict(true, None, None, &g, growth, lm, config).kind
    };
    let needed = f.allocated_bytes.saturating_add(f.requested_bytes);
    let cache = f.reserved_bytes.saturating_sub(f.releasable_bytes).saturating_add(f.alloc_bytes);
    // Where what is free inside segments and under the limit first holds the segment asked for
    // (the last test of `verdict` before fragmentation): below it, memory is used up at the size
    // the allocator asks for.
    let pieces = f.reserved_bytes.saturating_add(f.alloc_bytes).saturating_sub(f.reserved_unallocated_bytes);
    let mut cuts: Vec<u64> = [low, needed, pieces, cache].into_iter().filter(|&c| c >= low && c < high).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out: Vec<LimitVerdict> = Vec::new();
    for (k, &from) in cuts.iter().enumerate() {
        let kind = at(from);
        let to = cuts.get(k + 1).copied().unwrap_or(high);
        match out.last_mut() {
            Some(last) if last.kind == Some(kind) => last.to_bytes = Some(to),
            _ => out.push(LimitVerdict { from_bytes: from, to_bytes: Some(to), kind: Some(kind) }),
        }
    }
    // From where the failed request gets its segment: `high` where this OOM set the range; where
    // an earlier OOM did (a cuDNN workspace the program caught), this request needs more, and
    // the limit was under `high` all the same.
    out.push(LimitVerdict { from_bytes: high.max(cache), to_bytes: None, kind: None });
    Some(out)
}

/// [`verdict_by_limit`]'s ranges in words.
pub fn limits_text(v: &[LimitVerdict]) -> String {
    let b = fmt_bytes;
    v.iter()
        .map(|l| match (l.kind, l.to_bytes) {
            // A range narrower than the figures' precision reads as one limit, never as an empty range.
            (Some(k), Some(to)) if b(l.from_bytes) == b(to) => format!("{} at a limit of about {}", k.as_str(), b(to)),
            (Some(k), Some(to)) => format!("{} at any limit from {} to under {}", k.as_str(), b(l.from_bytes), b(to)),
            (Some(k), None) => format!("{} at any limit from {}", k.as_str(), b(l.from_bytes)),
            // A limit to give: rounded up, as every need is (`fmt_need`).
            (None, _) => format!(
                "at {} or above the failed request gets its segment, and what the run did next is not in the trace",
                fmt_need(l.from_bytes)
            ),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The link to the documentation that ends PyTorch's out-of-memory message, as it writes it: the
/// short text leaves it out.
pub const PYTORCH_MESSAGE_LINK: &str = "  See documentation for Memory Management  \
(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)";

/// Sizes as PyTorch's `c10::CachingAllocator::format_size` writes them in its messages: up to
/// 1024 bytes in bytes, then KiB up to 1 MiB, MiB up to 1 GiB (so 1 GiB reads "1024.00 MiB"),
/// else GiB, with two decimals.
pub fn format_size(size: u64) -> String {
    let s = size as f64;
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1 << 20 {
        format!("{:.2} KiB", s / 1024.0)
    } else if size <= 1 << 30 {
        format!("{:.2} MiB", s / 1048576.0)
    } else {
        format!("{:.2} GiB", s / 1073741824.0)
    }
}

/// PyTorch's out-of-memory message for these figures, as PyTorch 2.11's caching allocator
/// writes it (`c10/cuda/CUDACachingAllocator.cpp`, `malloc`): "Tried to allocate" names the
/// segment size it tried to get, the limit appears ("X allowed; ") only under a memory fraction.
/// The sentence on the device's total and free memory needs both; where the trace lacks one, the
/// message is given without that sentence, and the second value says so. NVML's per-process
/// line is not in any trace and is left out.
pub fn pytorch_message(f: &Figures) -> (String, Option<&'static str>) {
    let sz = format_size;
    let device = match (f.device_total_bytes, f.device_free_bytes) {
        (Some(t), Some(fr)) => Some(format!("GPU 0 has a total capacity of {} of which {} is free. ", sz(t), sz(fr))),
        _ => None,
    };
    let message = format!(
        "CUDA out of memory. Tried to allocate {}. {}{}Of the allocated memory {} is allocated by PyTorch, and {} is \
reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting \
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.{PYTORCH_MESSAGE_LINK}",
        sz(f.alloc_bytes),
        device.as_deref().unwrap_or(""),
        f.capacity_bytes.map(|c| format!("{} allowed; ", sz(c))).unwrap_or_default(),
        sz(f.allocated_bytes),
        sz(f.reserved_unallocated_bytes)
    );
    let left_out = device
        .is_none()
        .then_some("the trace does not hold the device's total and free memory, so the sentence on them is left out");
    (message, left_out)
}

/// Replays the code change "allocate the tensors still live at `oom_event` before the
/// temporaries": each maximal run of consecutive allocations (no free in between) before the
/// OOM is reordered so that the allocations still live at the OOM (`live`: made and not freed,
/// as the replay that failed there saw them, [`Capture::held_ids`]) come first. Live bytes at
/// the end of each run are unchanged, so the peak of live bytes is too. The replay does not
/// reuse recorded addresses (the order differs). `None` when no run has both kinds.
fn group_long_lived(trace: &Trace, oom_event: u64, live: &crate::model::ids::IdSet) -> Result<Option<Experiment>> {
    let mut h = trace.header.clone();
    h.source = Source::Simulated;
    h.notes.push("experiment: allocations live at the OOM moved ahead of the temporaries of their run".into());
    // The reordered trace: in memory when the trace is (no file), else a temporary file that is
    // streamed like the trace (memory stays bounded).
    enum Out {
        Memory(Vec<Record>),
        File(Box<TraceWriter<std::io::BufWriter<std::fs::File>>>, tempfile::TempPath),
    }
    let mut out = if trace.in_memory() {
        Out::Memory(Vec::new())
    } else {
        let temp =
            tempfile::Builder::new().prefix("alloctrace-grouped-").suffix(".atrace").tempfile()?.into_temp_path();
        let mut w = TraceWriter::create(&temp, &h).with_context(|| format!("cannot write {}", temp.display()))?;
        // Read once, by the replay just after: written fast (zstd level 1, as a live recorder
        // writes), its chunks compressed beside the reordering where a thread can start.
        w.set_compression_level(1);
        let _ = w.compress_in_background();
        Out::File(Box::new(w), temp)
    };
    let mut failed: Option<recorder::trace::TraceError> = None;
    // What a read of the written file would fold, folded as it is written.
    let mut read = crate::model::ReadFolds::default();
    let mut emit = |r: &Record| match &mut out {
        Out::Memory(v) => v.push(r.clone()),
        Out::File(w, _) => {
            read.record(r);
            if let Err(e) = w.write(r) {
                failed.get_or_insert(e);
            }
        }
    };
    let mut run: Vec<Record> = Vec::new();
    let mut changed = false;
    let flush = |run: &mut Vec<Record>, emit: &mut dyn FnMut(&Record), changed: &mut bool| {
        let is_live = |r: &Record| matches!(&r.event, Event::Alloc { id, .. } if live.contains(id));
        let is_alloc = |r: &Record| matches!(&r.event, Event::Alloc { .. });
        let others = run.iter().filter(|r| !is_alloc(r));
        let keep = run.iter().filter(|r| is_live(r));
        let temps = run.iter().filter(|r| is_alloc(r) && !is_live(r));
        let ordered: Vec<&Record> = others.chain(keep).chain(temps).collect();
        let allocs: Vec<&Record> = run.iter().filter(|r| is_alloc(r)).collect();
        let new_allocs: Vec<&Record> = ordered.iter().copied().filter(|r| is_alloc(r)).collect();
        if allocs.iter().zip(&new_allocs).any(|(a, b)| a != b) {
            *changed = true;
        }
        for r in ordered {
            emit(r);
        }
        run.clear();
    };
    trace.scan(|i, r| {
        let in_run_kind = matches!(
            r.event,
            Event::Alloc { .. } | Event::CallSite { .. } | Event::SegmentAlloc { .. } | Event::SegmentMap { .. }
        );
        if i < oom_event && in_run_kind {
            run.push(r.clone());
            return;
        }
        flush(&mut run, &mut emit, &mut changed);
        emit(r);
    })?;
    flush(&mut run, &mut emit, &mut changed);
    if let Some(e) = failed {
        return Err(anyhow::Error::new(e).context("cannot write the reordered trace"));
    }
    if !changed {
        return Ok(None);
    }
    // Replayed as a simulated trace (no recorded addresses: the order differs).
    let (reordered, _temp) = match out {
        Out::Memory(records) => (trace.derived(h, records), None),
        Out::File(w, temp) => {
            w.finish().context("cannot write the reordered trace")?;
            let mut t = Trace::written(&temp, h, read);
            t.given_capacity = trace.given_capacity;
            t.least_limit = trace.least_limit;
            (t, Some(temp))
        }
    };
    let r: ReplayResult = replay(&reordered, &ReplayOptions::default())?;
    Ok(Some(Experiment {
        name: "allocate long-lived tensors first",
        description: "in each stretch of allocations before the OOM, the tensors still live at the OOM are \
allocated before the temporaries (freed before it), so temporaries share segments only with temporaries"
            .into(),
        completes: !r.is_oom(),
        reach: Reach::of(trace, &r),
        peak_reserved_bytes: r.peak_reserved_bytes,
    }))
}

#[allow(clippy::too_many_arguments)]
fn advise(
    f: &Figures,
    v: &Verdict,
    rows: &[PolicyRow],
    prediction: Option<&JobPrediction>,
    experiments: &[Experiment],
    top: &[SitePin],
    growth: Option<&Growth>,
    is_oom: bool,
) -> crate::analysis::advice::SettingsAdvice {
    let b = fmt_bytes;
    let cap_text = crate::model::units::fmt_limit(f.capacity_bytes);
    let recorded = rows.iter().find(|r| r.policy.is_recorded());
    let crate::analysis::advice::SettingsAdvice { mut advice, worth_trying, not_advised, cannot_tell } = if is_oom {
        crate::analysis::advice::settings_at_oom(
            rows,
            prediction,
            f.capacity_bytes,
            &cap_text,
            v.kind == VerdictKind::Fragmentation,
        )
    } else {
        Default::default()
    };
    match v.kind {
        VerdictKind::Fragmentation => {
            for e in experiments.iter().filter(|e| e.completes) {
                // Only a call site the trace names is named.
                let site = top.first().filter(|s| s.site.is_known()).map(|s| s.site.label.clone()).unwrap_or_default();
                // Proven only where the trace is the whole job: on one that stops at the
                // failure, the reordered run gets past it, and the rest is not in the trace.
                let whole = e.reach == Reach::Completes;
                advice.push(Advice {
                    kind: "code",
                    setting: None,
                    text: format!(
                        "allocate the tensors you keep before the temporaries made in the same stretch of code (or \
copy the kept ones into one tensor, e.g. torch.stack, before freeing the temporaries){}",
                        if site.is_empty() { String::new() } else { format!("; the kept blocks come from {site}") }
                    ),
                    evidence: format!(
                        "replayed with that order the run {} at {cap_text} (peak reserved {}): freeing the \
temporaries then frees whole segments, which the allocator gives back before failing{}",
                        e.outcome(),
                        b(e.peak_reserved_bytes),
                        if whole { "" } else { "; whether the rest of the job fits is not in the trace" }
                    ),
                    proven: whole,
                });
            }
            if let Some(s) = top.first().filter(|s| s.segments_pinned > 0) {
                advice.push(Advice {
                    kind: "code",
                    setting: None,
                    text: if s.site.is_known() {
                        format!(
                            "free the {} blocks from {} before the {} request",
                            s.blocks,
                            s.site.label,
                            b(f.requested_bytes)
                        )
                    } else {
                        // Without call sites the blocks cannot be named: say how to name them.
                        format!(
                            "free the {} blocks ({}) live at the {} request sooner; the trace has no call sites to \
name them: record with torch.cuda.memory._record_memory_history(stacks=\"python\") or alloctrace record --stacks",
                            s.blocks,
                            b(s.block_bytes),
                            b(f.requested_bytes)
                        )
                    },
                    evidence: format!(
                        "those {} live blocks ({}) keep {} segments ({}) from being released; without them the cache \
release before an OOM would free {}",
                        s.blocks,
                        b(s.block_bytes),
                        s.segments_pinned,
                        b(s.pinned_segment_bytes),
                        b(s.empty_cache_if_released_bytes)
                    ),
                    proven: false,
                });
            }
        }
        VerdictKind::SteadyGrowth => {
            if let Some(g) = growth.filter(|g| !g.sites.is_empty()) {
                let sites: Vec<_> = g.sites.iter().take(3).collect();
                advice.push(Advice {
                    kind: "code",
                    setting: None,
                    text: format!(
                        "stop keeping references to tensors from {} across iterations (store `.item()` or \
`.detach()` values instead of tensors that hold their autograd graph)",
                        sites.iter().map(|s| s.site.label.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                    evidence: sites
                        .iter()
                        .map(|s| {
                            format!(
                                "{}: +{:.0} allocations, +{} live per iteration, rising in {} of {} steps between \
iterations",
                                s.site.label,
                                s.per_iteration_count,
                                b(s.per_iteration_bytes as u64),
                                s.rising_intervals,
                                s.intervals
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                    proven: false,
                });
            }
        }
        VerdictKind::CacheNotReleased => advice.push(Advice {
            kind: "code",
            setting: None,
            text: "call torch.cuda.empty_cache() before the large request (or in other processes sharing the GPU)"
                .into(),
            evidence: format!("whole free segments hold {} at the failure", b(f.releasable_bytes)),
            proven: false,
        }),
        VerdictKind::TrueExhaustion => {
            if let Some(s) = top.first() {
                advice.push(Advice {
                    kind: "code",
                    setting: None,
                    text: format!(
                        "reduce what {} holds (smaller batch, activation checkpointing, lower precision)",
                        s.site.label
                    ),
                    evidence: format!(
                        "it holds {} in {} blocks at the failure, the most of any call site",
                        b(s.block_bytes),
                        s.blocks
                    ),
                    proven: false,
                });
            }
        }
        VerdictKind::NoOom => {
            if let Some(g) = growth.filter(|g| !g.sites.is_empty()) {
                let s = &g.sites[0];
                advice.push(Advice {
                    kind: "code",
                    setting: None,
                    text: format!(
                        "check what keeps tensors from {} alive across iterations (a list of losses or outputs \
that still hold their autograd graph: store `.item()` or `.detach()` instead)",
                        s.site.label
                    ),
                    evidence: format!(
                        "+{} live per iteration from there, rising in {} of {} steps between iterations",
                        b(s.per_iteration_bytes as u64),
                        s.rising_intervals,
                        s.intervals
                    ),
                    proven: false,
                });
            }
            if let Some(r) = recorded.and_then(|r| r.min_capacity_bytes.map(|m| (m, r))) {
                let best = rows.iter().filter_map(|x| x.min_capacity_bytes.map(|m| (m, x))).min_by_key(|(m, _)| *m);
                if let Some((m, x)) = best.filter(|(m, x)| !x.policy.is_recorded() && (*m as f64) < 0.95 * r.0 as f64) {
                    // A trace that stops at its failure holds no more of the job: the replays get
                    // past that request from their smallest capacities, which says nothing of the
                    // rest (never "completes", never proven).
                    let prefix = prediction.is_some();
                    let (goal, through) = if prefix {
                        ("to get past the request that failed in less memory", "it gets past it from")
                    } else {
                        ("to run in less memory", "it completes in")
                    };
                    advice.push(Advice {
                        kind: "setting",
                        setting: Some(crate::analysis::advice::row_setting(x)),
                        text: format!(
                            "{goal}, set {} ({through} {}; at {cap_text} it reserves {}, {} device calls){}",
                            crate::analysis::advice::row_setting(x),
                            fmt_need(m),
                            b(x.peak_reserved_bytes),
                            x.num_device_alloc + x.num_device_free,
                            if prefix { "; the rest of the job is not in the trace" } else { "" }
                        ),
                        evidence: format!(
                            "the recorded settings {} {} (at {cap_text} they reserve {}, {} device calls); {} {} {}",
                            if prefix { "get past it from" } else { "need" },
                            fmt_need(r.0),
                            b(r.1.peak_reserved_bytes),
                            r.1.num_device_alloc + r.1.num_device_free,
                            x.policy,
                            if prefix { "from" } else { "needs" },
                            fmt_need(m)
                        ),
                        proven: !prefix,
                    });
                }
            }
        }
    }
    crate::analysis::advice::SettingsAdvice { advice, worth_trying, not_advised, cannot_tell }
}

/// The strongest advice first: what a replay proves before what is predicted or read off the
/// layout, and a change to the program or its settings before more memory. The report's fix line
/// is the first. Against a leak, the fix to the code comes first: more memory only lasts as long
/// as the run the trace holds.
fn order_advice(advice: &mut [Advice], verdict: VerdictKind) {
    if verdict == VerdictKind::SteadyGrowth {
        advice.sort_by_key(|a| a.kind == "capacity");
    } else {
        advice.sort_by_key(|a| (!a.proven, a.kind == "capacity"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The allocations the program held at an OOM, as the replay's watch takes them, are those
    /// the trace itself holds there: made before the failure, and neither freed nor asked to be.
    /// (The reordering experiment read them in a pass of its own before.)
    #[test]
    fn held_at_the_oom_as_the_trace_holds_them() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut checked = 0;
        let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("traces"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "atrace"))
            .collect();
        paths.push(root.join("traces/large/mixed_sizes_big.default.atrace"));
        // Real runs at 0.9x their peak: OOMs with frees that waited for another stream, caught
        // cuDNN workspace OOMs, batches of every length.
        for name in ["two_streams", "amp_adamw", "varlen_train", "empty_cache_loop"] {
            paths.push(root.join(format!("tests/fixtures/truth/{name}.default.0.90.atrace")));
        }
        paths.push(root.join("tests/fixtures/truth/oom_catch.default.atrace"));
        // An id used again after a free that was asked for and never completed (a damaged or
        // cut trace), then another free asked for, and the OOM: the new block is held.
        let dir = tempfile::tempdir().unwrap();
        let reused = dir.path().join("reused.atrace");
        {
            use recorder::trace::{Header, Pool, Source, TraceWriter};
            let mib = 1u64 << 20;
            let alloc = |id: u64, bytes: u64| Event::Alloc {
                id,
                addr: 0,
                requested_bytes: bytes,
                block_bytes: 0,
                stream: 0,
                pool: Pool::Large,
                callsite: 0,
            };
            let mut h = Header::new(Source::Simulated);
            h.capacity_bytes = 100 * mib;
            let mut w = TraceWriter::create(&reused, &h).unwrap();
            let events = [
                alloc(1, 2 * mib),
                Event::FreeRequested { id: 1, addr: 0, callsite: 0 },
                alloc(1, 2 * mib),
                alloc(2, 2 * mib),
                Event::FreeRequested { id: 2, addr: 0, callsite: 0 },
                Event::FreeCompleted { id: 2, addr: 0 },
                alloc(3, 200 * mib),
            ];
            for (t, event) in events.into_iter().enumerate() {
                w.write(&Record { time_ns: t as u64, event }).unwrap();
            }
            w.finish().unwrap();
        }
        paths.push(reused);
        for path in paths.into_iter().filter(|p| p.exists()) {
            let trace = Trace::open(&path).unwrap();
            let mut w = ExplainWatch::new(&trace, first_iteration(&trace), None);
            replay_observed(&trace, &ReplayOptions::default(), &mut |i, r, view, live| {
                w.observe(&trace, i, r, view, live)
            })
            .unwrap();
            let Some(at) = w.at_oom.as_ref() else { continue };
            let mut held = std::collections::HashSet::new();
            trace
                .scan(|i, r| {
                    if i >= at.event {
                        return;
                    }
                    match &r.event {
                        Event::Alloc { id, .. } => {
                            held.insert(*id);
                        }
                        Event::FreeCompleted { id, .. } | Event::FreeRequested { id, .. } => {
                            held.remove(id);
                        }
                        _ => {}
                    }
                })
                .unwrap();
            let taken: std::collections::HashSet<u64> = at.held_ids.iter().copied().collect();
            assert_eq!(taken, held, "{}", path.display());
            assert!(!held.is_empty(), "{}: OOM at {}, held {:?}, taken {:?}", path.display(), at.event, held, taken);
            checked += 1;
        }
        assert!(checked >= 7, "{checked} traces with an OOM");
    }

    /// The iteration of the failed request is the one rule's ([`crate::model::iterations`]):
    /// where a repeated annotation marks the steps (`ProfilerStep#N`, no iteration marks), its
    /// number; where iteration marks do, the last one's text; with a single iteration mark (the
    /// rule finds no iterations in one), none.
    #[test]
    fn the_failed_requests_iteration_is_the_one_rules() {
        use recorder::trace::{Header, MarkKind, Pool, Source};
        let alloc = |id: u64| Event::Alloc {
            id,
            addr: 0,
            requested_bytes: 1 << 20,
            block_bytes: 0,
            stream: 0,
            pool: Pool::Large,
            callsite: 0,
        };
        let mark = |kind: MarkKind, text: &str| Event::Mark { kind, text: text.into() };
        let context = |marks: [Event; 3]| {
            let [a, b, c] = marks;
            let events = vec![a, alloc(1), b, alloc(2), c, alloc(3), alloc(4)];
            let records: Vec<Record> =
                events.into_iter().enumerate().map(|(t, event)| Record { time_ns: t as u64, event }).collect();
            let trace = Trace::from_records(std::path::Path::new("t.atrace"), Header::new(Source::Simulated), records);
            request_context(&trace, 6).unwrap()
        };
        let step = |k: u32| mark(MarkKind::Annotation, &format!("ProfilerStep#{k}"));
        assert_eq!(context([step(1), step(2), step(3)]).as_deref(), Some("iteration 3"));
        let it = |t: &str| mark(MarkKind::Iteration, t);
        assert_eq!(context([it("step 0"), it("step 1"), it("step 2")]).as_deref(), Some("step 2"));
        let other = |t: &str| mark(MarkKind::Annotation, t);
        assert_eq!(context([it("step 0"), other("a"), other("b")]), None);
    }
}
