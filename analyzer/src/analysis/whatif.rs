//! What-if: the same request stream under several allocator policies, side by side, with the
//! smallest capacity each needs, the bound no allocator can beat (the peak of live requested
//! bytes) and an offline plan for reference.
//!
//! Each policy row is the recorded configuration with one knob changed. Rows run in parallel
//! (rayon), each replay streaming the trace from disk, so memory stays bounded.
//!
//! The smallest capacity is found by bisection between the peak of live requested bytes (no
//! capacity below it can work: reserved >= allocated >= requested) and the unlimited run's
//! peak reserved (which is known to work: a cap the run never reaches changes nothing), to a
//! resolution of [`CAPACITY_RESOLUTION`]. Completion is not strictly monotonic in the capacity
//! (a tighter cap can trigger cache flushes that help), so the figure is the boundary that
//! bisection finds, checked to complete.

use crate::analysis::outcome::{JobPrediction, Reach};
use crate::model::{Damage, OutcomeKind, Policy, Trace};
use crate::replay::{EngineView, ReplayOptions, ReplayResult};
use anyhow::Result;
use rayon::prelude::*;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::{round_plain, round_size};
use recorder::trace::{Event, Pool, Record};
use serde::Serialize;

use crate::analysis::capacity_search::{
    min_capacity, CAPACITY_RESOLUTION, LONG_TRACE_EVENTS, LONG_TRACE_PROBES, RESUME_LEVELS,
};
/// The offline plan costs about (allocations) x (blocks live at once) comparisons; above this
/// many it is skipped.
pub const OFFLINE_PLAN_MAX_WORK: u64 = 100_000_000;
/// Lifetimes are kept for at most this many allocations.
pub const OFFLINE_PLAN_MAX_ALLOCS: usize = 200_000;
/// Typical cost of one `cudaMalloc`/`cudaFree` on an H100 (anchors: 38-53 us).
pub const DEVICE_CALL_US: f64 = 45.0;

#[derive(Debug, Clone)]
pub struct WhatifOptions {
    /// The capacity compared at (resolved by [`Trace::capacity`]).
    pub capacity: crate::model::Capacity,
    /// Search the smallest capacity each policy needs.
    pub search_capacity: bool,
    /// For a trace that ends in an OOM: iterations appended to predict the rest of the job
    /// ([`crate::analysis::outcome::predict`]).
    pub repeats: u32,
    /// Only the rows' replays at the capacity, for a picture of them: no prediction of the
    /// whole job, and no second replay of a row that may have failed on a scratch buffer
    /// (`past_caught_scratch`), which only decide what the table advises.
    pub rows_only: bool,
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyRow {
    /// Short name: `recorded`, or the knob that was changed.
    pub policy: Policy,
    /// The full configuration replayed.
    pub alloc_conf: String,
    /// `ok` or `oom` at the given capacity (unlimited when none was given).
    pub outcome: OutcomeKind,
    /// How far the replay got against the recorded run: for a trace that ends in an OOM, never
    /// "completes".
    pub reach: Reach,
    /// Where the reach is `cannot_tell`: why (the replay's, as `replay --json` gives it).
    pub failure_may_be_caught: Option<crate::replay::MayBeCaught>,
    /// What alloctrace says of this setting at the capacity compared (from `reach`): the one
    /// decision that the advice, the report and the JSON render.
    pub decision: crate::analysis::outcome::Decision,
    /// Where the replay could not tell because a scratch buffer (cuDNN's workspace) failed: the
    /// workspace requests that fail at the capacity when the replay goes on without them, which
    /// PyTorch's cuDNN catches before trying a plan with a smaller workspace; set where that
    /// replay serves every request (or gets past the recorded failure). Such a setting is then
    /// worth trying; the recorded settings' row keeps its decision.
    #[serde(skip_serializing_if = "crate::model::units::is_zero")]
    pub scratch_failures_skipped: u64,
    /// The whole job's replay completes at the capacity, yet the capacity search found it failing
    /// at a limit at least as large ([`crate::analysis::capacity_search::failed_at_or_above`]). A
    /// run that completes at one limit and fails at a larger one completes by where its blocks
    /// land, which depends on where the CUDA driver places segments: the trace tells that only
    /// for the settings it was recorded under. Such a setting is worth trying, not advised (on a
    /// timm ViT under AMP, one such "fit" ran out of memory in real PyTorch, and none of the
    /// others did).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fits_by_placement: bool,
    pub oom_event: Option<u64>,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// `1 - allocated / reserved` at the OOM, else when reserved bytes first reached their peak.
    pub fragmentation: f64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub num_alloc_retries: u64,
    /// As the row's replay says them ([`ReplayResult::segments_placed_by_rule`]): segments placed
    /// at a recorded address, and of sizes the recorded run did not ask for, by the driver's rule.
    pub segments_at_recorded_addresses: u64,
    pub segments_placed_by_rule: u64,
    /// Smallest capacity at which the trace completes (None when not searched).
    pub min_capacity_bytes: Option<u64>,
    /// How close the search came to the boundary: 2 MiB, or coarser on long traces.
    pub min_capacity_resolution_bytes: Option<u64>,
    /// Set when this setting is the same run as an earlier row's on this trace (a split size
    /// that no block of the trace can reach, or power-of-two divisions that no request does:
    /// [`AllocatorConfig::same_run`]): that row's
    /// policy. The figures are that row's replay, made once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_as: Option<String>,
    /// Why, where [`PolicyRow::same_as`] is set.
    #[serde(skip)]
    pub same_because: Option<recorder::engine::config::SameRun>,
}

/// What the request stream itself needs: the bound no allocator can beat, and references.
#[derive(Debug, Clone, Serialize)]
pub struct Bounds {
    /// Peak of the bytes the program asked for and still held: no allocator needs less.
    pub live_requested_peak_bytes: u64,
    /// The trace ends in a failed request, and the peak and the plan count it (the program
    /// needs it to go on).
    pub includes_failed_request: bool,
    /// Peak with every request a `cudaMalloc` of its own size, to 512 bytes (no caching at all:
    /// PyTorch's `uncached_allocate` ignores the settings' rounding).
    pub no_caching_peak_bytes: u64,
    pub no_caching_device_calls: u64,
    /// An offline plan that knows every lifetime in advance (greedy by size, Pisarchyk & Lee
    /// 2020): a good static placement of all blocks in one arena. A heuristic, not a bound: a
    /// policy can need a little less.
    pub offline_plan_bytes: Option<u64>,
    pub offline_plan_note: Option<String>,
    /// Events in the trace.
    pub events: u64,
    /// The largest request of the trace, a failed one included: it decides which settings
    /// are the same run as another ([`AllocatorConfig::same_run_as`]).
    pub largest_request_bytes: u64,
    /// No capacity below this completes the trace, under any setting: the blocks live at once
    /// need that much in segments (`HeldFloor`). `None` where the trace records an OOM (a
    /// replay may then go on past a failed request).
    #[serde(skip)]
    pub held_floor_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Whatif {
    pub trace: String,
    /// Set when the trace's requests were predicted rather than recorded: what made them.
    pub predicted: Option<String>,
    /// True for a predicted trace whose note names memory it does not predict (cuDNN
    /// workspaces): its peaks are lower bounds, and no row is said to fit (`cannot_tell`).
    pub lower_bound: bool,
    pub capacity_bytes: Option<u64>,
    pub capacity_source: crate::model::CapacitySource,
    pub rows: Vec<PolicyRow>,
    pub bounds: Bounds,
    /// The no-caching row at the capacity, decided once ([`Whatif::no_caching`]).
    pub no_caching: NoCachingRow,
    /// Set when the trace is truncated or corrupt: the rows cover the events before the damage.
    pub input_damage: Option<Damage>,
    /// For a trace that ends in an OOM: whether the whole job fits under each policy, predicted
    /// from a repeated iteration, or why the trace cannot tell.
    pub prediction: Option<JobPrediction>,
    /// False when the input was damaged (see `input_damage`).
    pub complete: bool,
    /// Each row's setting and the row whose replay it is.
    #[serde(skip)]
    pub replays: Rows,
}

/// The rows other than the recorded settings whose replay completes at the capacity compared,
/// or, for a trace that ends in an OOM, gets past the request that failed: the settings that
/// would have let the run go on (at least that far).
pub fn completing(rows: &[PolicyRow]) -> impl Iterator<Item = &PolicyRow> {
    rows.iter().filter(|r| !r.policy.is_recorded() && matches!(r.reach, Reach::Completes | Reach::GetsPastFailure))
}

/// The policies compared: the recorded configuration with one knob changed each.
pub fn policies(recorded: &AllocatorConfig, with_capacity: bool) -> Vec<(Policy, AllocatorConfig)> {
    let mut rows = vec![(Policy::Recorded, recorded.clone())];
    let mut push = |name: &str, f: &dyn Fn(&mut AllocatorConfig)| {
        let mut c = recorded.clone();
        f(&mut c);
        if c != *recorded {
            rows.push((Policy::Knob(name.to_string()), c));
        }
    };
    push("expandable_segments:True", &|c| c.expandable_segments = true);
    push("expandable_segments:False", &|c| c.expandable_segments = false);
    for mb in [64u64, 128, 512] {
        push(&format!("max_split_size_mb:{mb}"), &|c| c.max_split_size = Some(mb << 20));
    }
    for d in [4u32, 8] {
        push(&format!("roundup_power2_divisions:{d}"), &|c| c.roundup_power2_divisions = [d; 16]);
    }
    // Settings that round requests by powers of two are also tried without it: one division
    // (PyTorch takes only powers of two, and rounds a request with one division as with none,
    // to 512 bytes), the default's rounding.
    if !recorded.rounds_plainly_up_to(u64::MAX) {
        push("roundup_power2_divisions:1", &|c| c.roundup_power2_divisions = [1; 16]);
    }
    if with_capacity {
        push("garbage_collection_threshold:0.6", &|c| c.garbage_collection_threshold = Some(0.6));
    }
    rows
}

fn row_of(
    trace: &Trace,
    policy: &Policy,
    r: &ReplayResult,
    (min_capacity, resolution): (Option<u64>, Option<u64>),
    capacity: Option<u64>,
) -> PolicyRow {
    use crate::analysis::outcome::Decision;
    let decision = match Decision::of(policy, Reach::of(trace, r)) {
        // A predicted stream that leaves out what its note names is a lower bound: completing
        // at the capacity does not say the step fits.
        Decision::Fits if trace.predicted_lower_bound() => Decision::CannotTell,
        d => d,
    };
    // The search saw a failure at or above the capacity the row's replay ran at. Only where the
    // search ran (`explain` and `report` skip it on traces of more than a million events;
    // `whatif` runs it unless `--no-search`).
    let cap = r.capacity_bytes.or(capacity);
    let fits_by_placement = decision == Decision::Fits
        && min_capacity.zip(cap).is_some_and(|(least, cap)| {
            crate::analysis::capacity_search::failed_at_or_above((least, resolution.unwrap_or(0)), cap)
        });

    PolicyRow {
        policy: policy.clone(),
        alloc_conf: r.alloc_conf.clone(),
        outcome: r.outcome_kind(),
        reach: Reach::of(trace, r),
        failure_may_be_caught: r.failure_may_be_caught,
        decision: if fits_by_placement { Decision::WorthTrying } else { decision },
        scratch_failures_skipped: 0,
        fits_by_placement,
        oom_event: match r.outcome {
            crate::replay::Outcome::Oom { event, .. } => Some(event),
            crate::replay::Outcome::Ok => None,
        },
        peak_reserved_bytes: r.peak_reserved_bytes,
        peak_allocated_bytes: r.peak_allocated_bytes,
        fragmentation: r.fragmentation_where_it_matters(),
        num_device_alloc: r.num_device_alloc,
        num_device_free: r.num_device_free,
        num_alloc_retries: r.num_alloc_retries,
        segments_at_recorded_addresses: r.segments_at_recorded_addresses,
        segments_placed_by_rule: r.segments_placed_by_rule,
        min_capacity_bytes: min_capacity,
        min_capacity_resolution_bytes: resolution,
        same_as: None,
        same_because: None,
    }
}

/// The what-if table of `trace` (see the module documentation).
pub fn whatif(trace: &Trace, opts: &WhatifOptions) -> Result<Whatif> {
    let bar = crate::replay::progress::replays(trace);
    let result = whatif_inner::<()>(trace, opts, &bar, None);
    bar.finish_and_clear();
    Ok(result?.0)
}

/// Like [`whatif`], with `observe` called after every record of each policy's replay at the
/// given capacity (one state per replay, made by `state`), so that a caller can draw the
/// policies over time from the same replays. Returns the table and, per row, the state and the
/// replay's result (row 0 is the recorded configuration; `state` is given the row). A row that
/// is the same run as an earlier one ([`PolicyRow::same_as`]) has no state: it would be the
/// earlier row's, which [`Whatif::replayed_by`] names.
///
/// `ready` is called with a row's state once its run at the capacity is over, with the run's
/// result, the table's bounds and its [`Rows`], beside the row's capacity search, so that what a caller does
/// there runs meanwhile. It is called only there: not without a search, nor where the replays
/// must take turns for memory ([`crate::replay::concurrent_replays`]). The caller then does
/// that work after the table.
pub fn whatif_observed<T: Send>(
    trace: &Trace,
    opts: &WhatifOptions,
    state: &(dyn Fn(usize) -> T + Sync),
    observe: &RowObserver<'_, T>,
    ready: &RowReady<'_, T>,
) -> Result<Table<T>> {
    // One bar for the whole comparison: its total is the replays planned (each policy at the
    // capacity, then its capacity search), and it moves with each one.
    let bar = crate::replay::progress::replays(trace);
    let result = whatif_inner(trace, opts, &bar, Some((state, observe, ready)));
    bar.finish_and_clear();
    result
}

/// The table, and each row's observer state (where observed, and the row's own replay) and
/// replay at the capacity.
pub type Table<T> = (Whatif, Vec<(Option<T>, ReplayResult)>);

/// One group's run: each member row's observer state, the replay, and the smallest capacity
/// (with the resolution reached) where searched.
type GroupRun<T> = (Vec<(usize, Option<T>)>, ReplayResult, Option<(u64, u64)>);

/// What a row's observer is shown: its state, then what a [`crate::replay::Observer`] is shown.
pub type RowObserver<'a, T> = dyn Fn(&mut T, u64, &Record, &dyn EngineView, &crate::replay::LiveMap) + Sync + 'a;

/// What is done with a row's state once its run at the capacity is over (see [`whatif_observed`]).
pub type RowReady<'a, T> = dyn Fn(usize, &mut T, &ReplayResult, &Bounds, &Rows) + Sync + 'a;

/// The rows of a what-if table as they are known before its replays: each row's setting, the row
/// whose replay it is (itself, or the earlier row it is the same run as, [`PolicyRow::same_as`]),
/// and the capacity. What is drawn from the runs at the capacity needs no more of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    pub names: Vec<String>,
    pub replayed_by: Vec<usize>,
    pub capacity_bytes: Option<u64>,
}

impl Rows {
    /// How many runs at the capacity the table makes: one per row that is its own replay.
    pub fn replays(&self) -> usize {
        self.replayed_by.iter().enumerate().filter(|&(k, &by)| k == by).count()
    }
}

/// A state per row, the observer that draws it and what is done once the row's run is over
/// (see [`whatif_observed`]).
type Observing<'a, T> = (&'a (dyn Fn(usize) -> T + Sync), &'a RowObserver<'a, T>, &'a RowReady<'a, T>);

/// The table, with each policy's run at the capacity observed from the start (`observing`: a
/// whole replay each, all from one read of the trace) or, with nothing to observe, resumed from
/// the unlimited run that the capacity search replays anyway (see [`crate::replay::Resumable`]).
fn whatif_inner<T: Send>(
    trace: &Trace,
    opts: &WhatifOptions,
    bar: &indicatif::ProgressBar,
    observing: Option<Observing<'_, T>>,
) -> Result<Table<T>> {
    // The bounds are a fold of their own: the capacity search needs them first (its lower bound
    // and floor); a table without a search folds them beside its replays.
    let searched_bounds = opts.search_capacity.then(|| bounds(trace, &trace.header.config)).transpose()?;
    // garbage_collection_threshold acts only under a memory fraction.
    let list = policies(&trace.header.config, crate::analysis::outcome::memory_fraction(trace, opts.capacity.bytes));
    let max_probes = if trace.events > LONG_TRACE_EVENTS { LONG_TRACE_PROBES } else { 16 };
    bar.set_length(list.len() as u64 * if opts.search_capacity { 1 + max_probes as u64 } else { 1 });
    let given = opts.capacity.bytes.filter(|_| opts.capacity.source == crate::model::CapacitySource::Given);
    let at_cap_options = |config: &AllocatorConfig| ReplayOptions {
        config: Some(config.clone()),
        // A given capacity is passed on; the trace's own is resolved again by the replay (to the
        // same value), which then says where it came from.
        capacity_bytes: given,
        unlimited: opts.capacity.bytes.is_none(),
        ..Default::default()
    };
    // Settings that are one run on this trace (a split size no block reaches, divisions no
    // request reaches) are replayed once:
    // each row names the row it is replayed with, and that replay observes every state of its
    // group.
    let largest_request_bytes = trace.facts.largest_request_bytes;
    let same_as = same_runs(&list, largest_request_bytes);
    let replays = Rows {
        names: list.iter().map(|(p, _)| p.name().to_string()).collect(),
        replayed_by: (0..list.len()).map(|k| same_as[k].unwrap_or(k)).collect(),
        capacity_bytes: opts.capacity.bytes,
    };
    let groups: Vec<(usize, Vec<usize>)> = (0..list.len())
        .filter(|&k| same_as[k].is_none())
        .map(|k| (k, (0..list.len()).filter(|&m| m == k || same_as[m] == Some(k)).collect()))
        .collect();
    // One state per replay: the group's first row observes it; the rows that are the same run
    // would observe the same states, and get none (their callers take the first row's).
    let states_of = |lead: usize, members: &[usize]| -> Vec<(usize, Option<T>)> {
        members.iter().map(|&m| (m, observing.filter(|_| m == lead).map(|o| o.0(m)))).collect()
    };
    let ready_all = |sts: &mut [(usize, Option<T>)], r: &ReplayResult| {
        if let Some((_, _, ready)) = observing {
            for (m, st) in sts.iter_mut() {
                if let Some(st) = st.as_mut() {
                    ready(*m, st, r, searched_bounds.as_ref().expect("bounds are folded first for a search"), &replays)
                }
            }
        }
    };
    let observe_all =
        |sts: &mut [(usize, Option<T>)], i: u64, rec: &Record, view: &dyn EngineView, live: &crate::replay::LiveMap| {
            if let Some((_, observe, _)) = observing {
                for st in sts.iter_mut().filter_map(|(_, st)| st.as_mut()) {
                    observe(st, i, rec, view, live)
                }
            }
        };
    // Without a search: every policy at the capacity, from one read of the trace.
    let (done, bounds): (Vec<GroupRun<T>>, Bounds) = if !opts.search_capacity {
        let mut states: Vec<Vec<(usize, Option<T>)>> =
            groups.iter().map(|(k, members)| states_of(*k, members)).collect();
        let runs: Vec<(ReplayOptions, Box<crate::replay::Observer<'_>>)> = groups
            .iter()
            .zip(states.iter_mut())
            .map(|((k, _), sts)| {
                let observe_all = &observe_all;
                let observer: Box<crate::replay::Observer<'_>> =
                    Box::new(move |i, rec, view, live| observe_all(sts, i, rec, view, live));
                (at_cap_options(&list[*k].1), observer)
            })
            .collect();
        // The bounds' fold rides the replays' pass, where its state (one per live allocation)
        // fits beside theirs; else it is a pass of its own, after them.
        let (results, bounds) = if crate::replay::concurrent_replays(trace) > runs.len() {
            let mut fold = BoundsFold::new(trace, &trace.header.config);
            let results = crate::replay::replay_many_with(trace, runs, &mut [&mut fold])?;
            (results, fold.finish(trace.events))
        } else {
            let results = crate::replay::replay_many(trace, runs)?;
            (results, bounds(trace, &trace.header.config)?)
        };
        bar.inc(list.len() as u64);
        (states.into_iter().zip(results).map(|(sts, r)| (sts, r, None)).collect(), bounds)
    } else {
        let bounds = searched_bounds.as_ref().expect("bounds are folded first for a search");
        // With a search, the policies in parallel: each policy's unlimited run, saved at a few
        // levels for the probes to resume from, shows the observer the run at the capacity for
        // as long as the two are the same run; the run at the capacity goes on from there (see
        // `crate::replay::Resumable`), then the probes.
        // Within the memory the replays may keep together: the policies in turns of as many
        // as fit, each probing one capacity at a time when they do not all fit at once.
        let at_once = crate::replay::concurrent_replays(trace);
        // The searches still running share the threads: each round of one takes as many levels
        // as its share allows, more as others end.
        let searching = std::sync::atomic::AtomicUsize::new(0);
        // What is done with a row once its run at the capacity is over runs beside its search
        // where one more replay fits beside the table's.
        let ready_beside = at_once > groups.len();
        let ahead = || {
            if at_once < groups.len() {
                1
            } else {
                crate::analysis::capacity_search::levels_ahead(searching.load(std::sync::atomic::Ordering::Relaxed))
            }
        };
        // The run at the capacity and the search resume from the same saves, side by side where
        // the replays of both fit beside each other's in every group at once; the search does not
        // wait for the run (its answer does not depend on it), and what is done with the row
        // once its run is over goes on beside the search.
        let side_by_side = at_once >= 2 * groups.len();
        let run_group = |(k, members): &(usize, Vec<usize>)| {
            let config = &list[*k].1;
            bar.inc(members.len() as u64);
            let mut sts = states_of(*k, members);
            let (unlimited, from, seen) = crate::replay::resumable_watched(
                trace,
                config,
                bounds.live_requested_peak_bytes,
                RESUME_LEVELS,
                crate::replay::saved_blocks_share(at_once.min(groups.len())),
                Some((opts.capacity.bytes, &mut |i, rec, view, live| observe_all(&mut sts, i, rec, view, live))),
            )?;
            let from = from.as_ref();
            let at_capacity = |sts: &mut [(usize, Option<T>)]| -> Result<ReplayResult> {
                let mut observe = |i: u64, rec: &Record, view: &dyn EngineView, live: &crate::replay::LiveMap| {
                    observe_all(sts, i, rec, view, live)
                };
                match from {
                    Some(from) => crate::replay::replay_resumed_watched(
                        trace,
                        from,
                        opts.capacity.bytes,
                        opts.capacity.source,
                        &mut observe,
                        seen,
                    ),
                    // Nothing saved (garbage collection with expandable segments): a whole replay.
                    None => crate::replay::replay_observed(trace, &at_cap_options(config), &mut observe),
                }
            };
            let max_probes = if trace.events > LONG_TRACE_EVENTS { LONG_TRACE_PROBES } else { u32::MAX };
            let search = || {
                let min = min_capacity(
                    trace,
                    config,
                    false,
                    from,
                    bounds.live_requested_peak_bytes,
                    bounds.held_floor_bytes,
                    unlimited.peak_reserved_bytes.max(CAPACITY_RESOLUTION),
                    max_probes,
                    &ahead,
                    &|| bar.inc(members.len() as u64),
                );
                searching.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                min
            };
            let (r, min) = if side_by_side {
                let (r, min) = rayon::join(
                    || {
                        let r = at_capacity(&mut sts)?;
                        if ready_beside && observing.is_some() {
                            crate::replay::beside_searches(|| ready_all(&mut sts, &r));
                        }
                        Ok::<_, anyhow::Error>(r)
                    },
                    search,
                );
                (r?, min?)
            } else {
                let r = at_capacity(&mut sts)?;
                let min = if ready_beside && observing.is_some() {
                    rayon::join(search, || crate::replay::beside_searches(|| ready_all(&mut sts, &r))).0?
                } else {
                    search()?
                };
                (r, min)
            };
            Ok((sts, r, min))
        };
        let mut done = Vec::with_capacity(groups.len());
        for turn in groups.chunks(at_once) {
            searching.store(turn.len(), std::sync::atomic::Ordering::Relaxed);
            let ran: Result<Vec<GroupRun<T>>> = turn.par_iter().map(run_group).collect();
            done.extend(ran?);
        }
        (done, searched_bounds.expect("bounds are folded first for a search"))
    };
    let mut rows: Vec<Option<(PolicyRow, Option<T>, ReplayResult)>> = (0..list.len()).map(|_| None).collect();
    for (sts, r, min) in done {
        for (m, st) in sts {
            let mut row = row_of(trace, &list[m].0, &r, (min.map(|m| m.0), min.map(|m| m.1)), opts.capacity.bytes);
            let mut r = r.clone();
            if let Some(k) = same_as[m] {
                // The figures are the group's run; the setting is the row's own.
                row.same_as = Some(list[k].0.name().to_string());
                row.same_because = list[k].1.same_run(&list[m].1, largest_request_bytes);
                row.alloc_conf = list[m].1.to_string();
                r.alloc_conf = row.alloc_conf.clone();
            }
            rows[m] = Some((row, st, r));
        }
    }
    let mut table = Vec::new();
    let mut runs = Vec::new();
    for (row, st, r) in rows.into_iter().map(|x| x.expect("every row is in one group")) {
        table.push(row);
        runs.push((st, r));
    }
    limit_decides(&mut table, &opts.capacity);
    finish(trace, opts, (&list, &same_as), replays, table, bounds, runs)
}

/// Where the limit was not recorded and the trace allows a range of them (the table's replays
/// ran at the least), a row whose replay fails there, yet which the capacity search finds
/// getting past the failure from a limit inside the range, and below the one from which the
/// recorded settings do, is for the real limit to decide ([`Decision::LimitDecides`]). One that
/// gets past only where the recorded settings do too would not have helped.
fn limit_decides(table: &mut [PolicyRow], capacity: &crate::model::Capacity) {
    use crate::analysis::outcome::Decision;
    let Some((_, high)) = capacity.range else { return };
    let recorded = table.iter().find(|r| r.policy.is_recorded()).and_then(|r| r.min_capacity_bytes).unwrap_or(high);
    for row in table.iter_mut().filter(|r| r.decision == Decision::DoesNotHelp) {
        if row.min_capacity_bytes.is_some_and(|m| m < high.min(recorded)) {
            row.decision = Decision::LimitDecides;
        }
    }
}

/// The no-caching row at the capacity compared ([`Whatif::no_caching`]).
#[derive(Debug, Clone, Serialize)]
pub struct NoCachingRow {
    /// How far it gets where it fits under the capacity: it completes, or on a trace that stops at
    /// its failure gets past it; `None` where it does not fit (where it fails is not computed).
    pub reach: Option<Reach>,
    /// The trace stops at a failure (the outcome of a run that does not fit is then "fails").
    #[serde(skip)]
    stops_at_failure: bool,
    /// Its peak reserved where it fits under the capacity; `None` where it does not (its need,
    /// the peak with no limit, is its min capacity).
    pub peak_reserved_bytes: Option<u64>,
    pub min_capacity_bytes: u64,
    /// Whether the limit compared holds without caching ([`LimitWithoutCaching`]).
    pub limit: LimitWithoutCaching,
}

/// Whether a limit holds without caching. PyTorch applies its memory fraction
/// (`set_per_process_memory_fraction`) only on the caching path: with
/// `PYTORCH_NO_CUDA_MEMORY_CACHING=1` each request goes straight to `cudaMalloc`
/// (`uncached_allocate` in `CUDACachingAllocator.cpp`), which no fraction checks, so only the
/// device's own memory bounds the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitWithoutCaching {
    /// No limit is compared.
    NoLimit,
    /// The limit is the device's own memory (inferred from an OOM where the device was full).
    Holds,
    /// The limit is a memory fraction (recorded, or inferred below the device): PyTorch does not
    /// apply it without caching.
    Ignored,
    /// A given limit: it holds where it is the device's memory, not where it is a fraction.
    IgnoredIfFraction,
}

impl LimitWithoutCaching {
    pub fn of(source: crate::model::CapacitySource) -> Self {
        use crate::model::CapacitySource::*;
        match source {
            None => LimitWithoutCaching::NoLimit,
            InferredFromOom => LimitWithoutCaching::Holds,
            Recorded | InferredLimit => LimitWithoutCaching::Ignored,
            Given => LimitWithoutCaching::IgnoredIfFraction,
        }
    }
}

impl NoCachingRow {
    /// Its outcome in the table's words.
    pub fn outcome(&self) -> &'static str {
        match (self.reach, self.stops_at_failure) {
            (Some(r), _) => r.short(),
            (None, true) => "fails",
            (None, false) => "oom",
        }
    }

    /// The same in a few words, for a sentence that names the row among others.
    pub fn limit_aside(&self) -> Option<&'static str> {
        match self.limit {
            LimitWithoutCaching::NoLimit | LimitWithoutCaching::Holds => None,
            LimitWithoutCaching::Ignored => {
                Some("PyTorch does not apply this limit, a memory fraction, without caching")
            }
            LimitWithoutCaching::IgnoredIfFraction => {
                Some("where this limit is a memory fraction, PyTorch does not apply it without caching")
            }
        }
    }

    /// Where the limit compared may not hold without caching: what that means for the row, in
    /// the words every output uses. `None` where it holds or no limit is compared.
    pub fn limit_note(&self, capacity_bytes: u64) -> Option<String> {
        let cap = crate::model::units::fmt_bytes(capacity_bytes);
        let need = crate::model::units::fmt_need(self.min_capacity_bytes);
        let which = match self.limit {
            LimitWithoutCaching::NoLimit | LimitWithoutCaching::Holds => return None,
            LimitWithoutCaching::Ignored => format!("the limit of {cap} here, a memory fraction,"),
            LimitWithoutCaching::IgnoredIfFraction => {
                format!("where the limit of {cap} is a memory fraction (set_per_process_memory_fraction), it")
            }
        };
        Some(format!(
            "PyTorch does not apply its memory fraction without caching (each request goes straight to cudaMalloc), \
so {which} does not bound the process: it takes what it needs ({need}), and the no-caching row is what a device of \
{cap} would do."
        ))
    }
}

impl Whatif {
    /// The no-caching row, decided once for every output ([`no_caching_row`]).
    pub fn no_caching(&self) -> &NoCachingRow {
        &self.no_caching
    }

    /// The row whose replay row `k` is: itself, or the earlier row it is the same run as
    /// ([`PolicyRow::same_as`]).
    pub fn replayed_by(&self, k: usize) -> usize {
        self.replays.replayed_by[k]
    }

    /// One sentence per setting whose whole job completes at the capacity by where its blocks
    /// land ([`PolicyRow::fits_by_placement`]): every output says it in these words.
    pub fn placement_notes(&self) -> Vec<String> {
        let cap = self.capacity_bytes.map(crate::model::units::fmt_bytes).unwrap_or_default();
        self.rows
            .iter()
            .filter(|r| r.fits_by_placement)
            .map(|r| {
                format!(
                    "{}: the whole job completes at {cap}, yet fails at larger limits (it completes from {}): where its \
blocks land decides it, and that depends on where the CUDA driver places segments, which this trace tells only for the \
recorded settings. Worth trying, not advised; a trace recorded under it would tell.",
                    r.policy.name(),
                    r.min_capacity_bytes.map(crate::model::units::fmt_need).unwrap_or_default()
                )
            })
            .collect()
    }

    /// Where rows placed segments of sizes the recorded run did not ask for by the rule for where
    /// the CUDA driver puts them ([`PolicyRow::segments_placed_by_rule`]): one sentence naming
    /// them, in the words every output uses.
    pub fn placed_by_rule_notes(&self) -> Vec<String> {
        let rows: Vec<String> = self
            .rows
            .iter()
            .filter(|r| r.same_as.is_none() && r.segments_placed_by_rule > 0)
            .map(|r| {
                format!(
                    "{} ({} of {} segments)",
                    r.policy.name(),
                    r.segments_placed_by_rule,
                    r.segments_placed_by_rule + r.segments_at_recorded_addresses
                )
            })
            .collect();
        if rows.is_empty() {
            return Vec::new();
        }
        vec![format!(
            "{}: segments of sizes the recorded run did not ask for are placed by a rule for where the CUDA driver \
puts them, not at recorded addresses; {}. A trace recorded under the setting would tell.",
            rows.join(", "),
            crate::replay::PLACED_BY_RULE_MISS
        )]
    }

    /// One sentence per row that other rows are the same run as ([`PolicyRow::same_as`]): which
    /// rows, and why they cannot differ on this trace. Every output says it in these words.
    pub fn same_run_notes(&self) -> Vec<String> {
        let mut twins: Vec<(&str, &str, Vec<&str>)> = Vec::new();
        for r in &self.rows {
            if let Some(t) = &r.same_as {
                let why = r.same_because.map_or("", |w| w.why());
                match twins.iter_mut().find(|(name, w, _)| name == t && *w == why) {
                    Some((_, _, rows)) => rows.push(r.policy.name()),
                    None => twins.push((t, why, vec![r.policy.name()])),
                }
            }
        }
        twins
            .into_iter()
            .map(|(twin, why, rows)| {
                format!(
                    "{}: the same run as {twin} on this trace ({why}: the largest request is {}), replayed once.",
                    rows.join(", "),
                    crate::model::units::fmt_bytes(self.bounds.largest_request_bytes)
                )
            })
            .collect()
    }
}

/// For each policy, the first earlier one that is the same run on a trace whose largest request
/// is `largest_request` bytes ([`AllocatorConfig::same_run_as`]), if any.
pub fn same_runs(list: &[(Policy, AllocatorConfig)], largest_request: u64) -> Vec<Option<usize>> {
    let mut same: Vec<Option<usize>> = Vec::with_capacity(list.len());
    for (k, (_, config)) in list.iter().enumerate() {
        let first = (0..k).find(|&j| same[j].is_none() && list[j].1.same_run_as(config, largest_request));
        same.push(first);
    }
    same
}

/// The table from its rows: the prediction of the whole job, and the trace's figures.
fn finish<T>(
    trace: &Trace,
    opts: &WhatifOptions,
    (list, same_as): (&[(Policy, AllocatorConfig)], &[Option<usize>]),
    replays: Rows,
    table: Vec<PolicyRow>,
    bounds: Bounds,
    runs: Vec<(Option<T>, ReplayResult)>,
) -> Result<Table<T>> {
    let mut table = table;
    if !opts.rows_only {
        past_caught_scratch(trace, opts, list, &mut table)?;
    }
    let past: Vec<bool> = table.iter().map(|r| r.reach.gets_past()).collect();
    let past_from: Vec<Option<u64>> = table.iter().map(|r| r.min_capacity_bytes).collect();
    let prediction = if opts.rows_only {
        None
    } else {
        crate::analysis::outcome::predict(trace, list, &past, &past_from, same_as, &opts.capacity, opts.repeats)?
    };
    let no_caching = no_caching_row(&bounds, opts.capacity, prediction.is_some());
    let w = Whatif {
        trace: trace.path.display().to_string(),
        predicted: trace.predicted().map(str::to_string),
        lower_bound: trace.predicted_lower_bound(),
        capacity_bytes: opts.capacity.bytes,
        capacity_source: opts.capacity.source,
        rows: table,
        bounds,
        no_caching,
        complete: trace.damage().is_none(),
        input_damage: trace.damage(),
        prediction,
        replays,
    };
    Ok((w, runs))
}

/// The no-caching row. Without caching, reserved memory is the live blocks' rounded bytes, so the
/// run fails at the capacity exactly where that peak passes it. A run that fails is not replayed
/// up to its failure: its peak there is not shown, its need is (the min capacity).
fn no_caching_row(bounds: &Bounds, capacity: crate::model::Capacity, stops_at_failure: bool) -> NoCachingRow {
    let fits = capacity.bytes.is_none_or(|c| bounds.no_caching_peak_bytes <= c);
    NoCachingRow {
        reach: fits.then_some(if stops_at_failure { Reach::GetsPastFailure } else { Reach::Completes }),
        stops_at_failure,
        peak_reserved_bytes: fits.then_some(bounds.no_caching_peak_bytes),
        min_capacity_bytes: bounds.no_caching_peak_bytes,
        limit: LimitWithoutCaching::of(if capacity.bytes.is_some() {
            capacity.source
        } else {
            crate::model::CapacitySource::None
        }),
    }
}

/// The rows that cannot tell because a scratch buffer failed at the capacity (a cuDNN
/// workspace, which PyTorch's cuDNN convolutions catch before trying a plan with a smaller one):
/// each replayed again going on without such buffers ([`ReplayOptions::past_caught_scratch`]).
/// Where that replay serves every request, or gets past the recorded failure, the setting is
/// worth trying: the smaller workspaces cuDNN would fall back to are not in the trace, so it is
/// never said to fit. The recorded settings' row keeps its decision and gets only the count
/// (`scratch_failures_skipped`): what a largest-batch search reads as "may fit".
fn past_caught_scratch(
    trace: &Trace,
    opts: &WhatifOptions,
    list: &[(Policy, AllocatorConfig)],
    table: &mut [PolicyRow],
) -> Result<()> {
    let given = opts.capacity.bytes.filter(|_| opts.capacity.source == crate::model::CapacitySource::Given);
    table.par_iter_mut().zip(list.par_iter()).try_for_each(|(row, (policy, config))| -> Result<()> {
        let cannot_tell = if policy.is_recorded() {
            row.reach == Reach::CannotTell
        } else {
            row.decision == crate::analysis::outcome::Decision::CannotTell
        };
        if !cannot_tell {
            return Ok(());
        }
        let o = ReplayOptions {
            config: Some(config.clone()),
            capacity_bytes: given,
            unlimited: opts.capacity.bytes.is_none(),
            past_caught_scratch: true,
            ..Default::default()
        };
        let r = crate::replay::replay(trace, &o)?;
        if r.scratch_failures_skipped > 0 && matches!(r.reach, Reach::Completes | Reach::GetsPastFailure) {
            if !policy.is_recorded() {
                row.decision = crate::analysis::outcome::Decision::WorthTrying;
            }
            row.scratch_failures_skipped = r.scratch_failures_skipped;
        }
        Ok(())
    })
}

/// Computes the two bounds and the no-caching row from the request stream.
pub fn bounds(trace: &Trace, config: &AllocatorConfig) -> Result<Bounds> {
    let mut fold = BoundsFold::new(trace, config);
    let scanned = trace.scan(|i, r| fold.observe(i, r))?;
    Ok(fold.finish(scanned.events))
}

/// The fold of [`bounds`], for a pass that carries it beside other work (a table's replays).
pub struct BoundsFold<'a> {
    trace: &'a Trace,
    config: &'a AllocatorConfig,
    /// id -> (index into lifetimes)
    open: crate::model::ids::IdMap<usize>,
    /// (start, end, rounded bytes)
    lifetimes: Vec<(u64, u64, u64)>,
    live_req: u64,
    peak_req: u64,
    live_rounded: u64,
    peak_rounded: u64,
    /// id -> (requested bytes, stream, still counted by the floor: until its free request)
    req_of: crate::model::ids::IdMap<(u64, u64, bool)>,
    allocs: u64,
    too_many: bool,
    peak_live_blocks: u64,
    /// The failed request of a recorded OOM is a request too (it has no id and is never freed).
    next_oom_id: u64,
    floor: HeldFloor,
}

impl crate::model::Fold for BoundsFold<'_> {
    #[inline]
    fn observe(&mut self, i: u64, r: &Record) {
        BoundsFold::observe(self, i, r)
    }
}

impl<'a> BoundsFold<'a> {
    pub fn new(trace: &'a Trace, config: &'a AllocatorConfig) -> Self {
        BoundsFold {
            trace,
            config,
            open: Default::default(),
            lifetimes: Vec::new(),
            live_req: 0,
            peak_req: 0,
            live_rounded: 0,
            peak_rounded: 0,
            req_of: Default::default(),
            allocs: 0,
            too_many: false,
            peak_live_blocks: 0,
            next_oom_id: u64::MAX,
            floor: HeldFloor::default(),
        }
    }

    #[inline]
    pub fn observe(&mut self, i: u64, r: &Record) {
        let f = self;
        // (id, bytes, the stream of a block the program got)
        let request = match &r.event {
            Event::Alloc { id, requested_bytes, stream, .. } => Some((*id, *requested_bytes, Some(*stream))),
            // A recorded OOM the program caught gave it nothing: not a request it held.
            Event::Oom { .. } if f.trace.facts.survived(i) => {
                f.floor.oom = true;
                None
            }
            Event::Oom { requested_bytes, .. } => {
                f.floor.oom = true;
                f.next_oom_id -= 1;
                Some((f.next_oom_id, *requested_bytes, None))
            }
            Event::FreeRequested { id, .. } => {
                if let Some((req, stream, held)) = f.req_of.get_mut(id) {
                    if std::mem::take(held) {
                        f.floor.free(*stream, *req);
                    }
                }
                None
            }
            Event::FreeCompleted { id, .. } => {
                if let Some((req, stream, held)) = f.req_of.remove(id) {
                    f.live_req = f.live_req.saturating_sub(req);
                    f.live_rounded = f.live_rounded.saturating_sub(round_plain(req));
                    if held {
                        f.floor.free(stream, req);
                    }
                }
                if let Some(k) = f.open.remove(id) {
                    f.lifetimes[k].1 = i;
                }
                None
            }
            _ => None,
        };
        if let Some((id, requested_bytes, stream)) = request {
            let rounded = round_size(f.config, requested_bytes);
            f.allocs += 1;
            // Saturating: a hostile request near 2^64 must not wrap the sums.
            f.live_req = f.live_req.saturating_add(requested_bytes);
            // Without caching, PyTorch hands each request to cudaMalloc as asked
            // (`uncached_allocate(size)`): no setting's rounding, only the device's 512 bytes.
            f.live_rounded = f.live_rounded.saturating_add(round_plain(requested_bytes));
            f.peak_req = f.peak_req.max(f.live_req);
            f.peak_rounded = f.peak_rounded.max(f.live_rounded);
            if let Some(stream) = stream {
                f.floor.alloc(stream, requested_bytes);
            }
            if let Some((req, stream, true)) =
                f.req_of.insert(id, (requested_bytes, stream.unwrap_or(0), stream.is_some()))
            {
                // An id used twice (a damaged trace): the first block is gone.
                f.floor.free(stream, req);
            }
            f.peak_live_blocks = f.peak_live_blocks.max(f.req_of.len() as u64);
            if f.lifetimes.len() < OFFLINE_PLAN_MAX_ALLOCS {
                f.open.insert(id, f.lifetimes.len());
                f.lifetimes.push((i, u64::MAX, rounded));
            } else {
                f.too_many = true;
            }
        }
    }

    /// The bounds, after `events` records.
    pub fn finish(self, events: u64) -> Bounds {
        let BoundsFold { mut lifetimes, allocs, peak_live_blocks, too_many, .. } = self;
        for l in &mut lifetimes {
            if l.1 == u64::MAX {
                l.1 = events;
            }
        }
        let work = allocs.saturating_mul(peak_live_blocks);
        let (offline_plan_bytes, offline_plan_note) = if too_many {
            (None, Some(format!("skipped: more than {OFFLINE_PLAN_MAX_ALLOCS} allocations")))
        } else if work > OFFLINE_PLAN_MAX_WORK {
            (
                None,
                Some(format!(
                    "skipped: {allocs} allocations with up to {peak_live_blocks} live at once would take about \
                     {work} comparisons (the limit is {OFFLINE_PLAN_MAX_WORK})"
                )),
            )
        } else {
            (Some(greedy_by_size(&mut lifetimes)), None)
        };
        Bounds {
            live_requested_peak_bytes: self.peak_req,
            includes_failed_request: self.next_oom_id != u64::MAX,
            no_caching_peak_bytes: self.peak_rounded,
            no_caching_device_calls: 2 * allocs,
            offline_plan_bytes,
            offline_plan_note,
            events,
            largest_request_bytes: self.trace.facts.largest_request_bytes,
            held_floor_bytes: self.floor.peak(),
        }
    }
}

/// The least a device must hold for the blocks a trace keeps live, under any setting: PyTorch
/// serves a block from a segment of its own stream and pool (small: at most 1 MiB after
/// rounding), and every segment, or mapped part of an expandable one, is a whole number of
/// 2 MiB ([`SEGMENT_GRANULE`]). So at each moment reserved memory is at least, summed over the
/// (stream, pool) pairs, the live blocks' rounded bytes rounded up to 2 MiB. A block counts
/// from its allocation to its free request (a replay may complete the free then, never
/// sooner); sizes take the plain 512-byte rounding, which no setting rounds below.
///
/// Worked example: two 512-byte blocks live on streams 1 and 2 need two small segments: 4 MiB,
/// though 1 KiB is allocated; a 3 MiB block beside them on stream 1 adds 4 MiB (a large
/// segment of its own): the floor is 8 MiB.
///
/// A replay under a capacity below the floor fails at the latest where the floor peaks, so a
/// capacity search need not replay those capacities ([`crate::analysis::capacity_search::min_capacity`]).
/// On a trace that gives every allocation its own stream the floor is the answer: each probe
/// below it would have replayed the whole trace to learn that.
#[derive(Default)]
struct HeldFloor {
    /// Rounded live bytes per (stream, pool), but for the group last changed.
    groups: rustc_hash::FxHashMap<(u64, Pool), u64>,
    /// The group last changed, kept out of the map: the next event is nearly always on it.
    last: Option<((u64, Pool), u64)>,
    held: u64,
    peak: u64,
    /// A recorded OOM: the floor says nothing (see [`Bounds::held_floor_bytes`]).
    oom: bool,
}

/// The granule of segments and of expandable segments' pages: small segments are
/// `SMALL_BUFFER`, large ones a multiple of `ROUND_LARGE`, pages one of those or
/// `large_segment_size` (a multiple of 2 MiB): all whole multiples of this one.
const SEGMENT_GRANULE: u64 = recorder::engine::config::ROUND_LARGE;

impl HeldFloor {
    /// A block of `requested` bytes allocated on `stream`.
    fn alloc(&mut self, stream: u64, requested: u64) {
        self.change(stream, requested, true);
        self.peak = self.peak.max(self.held);
    }

    /// Its free request (or its completion, where no request came first).
    fn free(&mut self, stream: u64, requested: u64) {
        self.change(stream, requested, false);
    }

    fn change(&mut self, stream: u64, requested: u64, add: bool) {
        let bytes = recorder::engine::round_plain(requested);
        let key = (stream, recorder::engine::pool_for(bytes));
        let granules = |b: u64| b.div_ceil(SEGMENT_GRANULE).saturating_mul(SEGMENT_GRANULE);
        let group = match self.last.take() {
            Some((k, b)) if k == key => b,
            other => {
                // Back into the map (an empty group leaves it), and this one out of it.
                if let Some((k, b)) = other.filter(|&(_, b)| b > 0) {
                    self.groups.insert(k, b);
                }
                self.groups.remove(&key).unwrap_or(0)
            }
        };
        let changed = if add { group.saturating_add(bytes) } else { group.saturating_sub(bytes) };
        self.held = self.held.saturating_sub(granules(group)).saturating_add(granules(changed));
        self.last = Some((key, changed));
    }

    fn peak(&self) -> Option<u64> {
        (!self.oom).then_some(self.peak)
    }
}

/// Greedy by size (Pisarchyk & Lee 2020, "Efficient Memory Management for Deep Neural Net
/// Inference"): take blocks from the largest down; put each in the smallest gap, among the
/// blocks already placed that overlap it in time, that fits it (else after the highest).
///
/// Worked example: A = 4 bytes over [0,10), B = 2 over [0,5), C = 2 over [5,10). A goes at 0;
/// B overlaps A, goes at 4; C overlaps A but not B, so the gap above A at 4 fits: C at 4.
/// Arena = 6 bytes, where a first-come allocator without lifetimes might need 8.
pub fn greedy_by_size(lifetimes: &mut [(u64, u64, u64)]) -> u64 {
    lifetimes.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    // The naive form scans every placed block for each new one (O(n^2)). Only the placed
    // blocks that overlap the new one in time matter, in offset order (ties in any order: the
    // second of two blocks at one offset never opens a gap), so placed blocks are filed in time
    // buckets and the overlapping ones gathered from the buckets the new block spans; a block
    // spanning many buckets is kept in a list checked every time. Same placements, cost about
    // n x (blocks live at once) instead of n^2.
    let horizon = lifetimes.iter().map(|l| l.1).max().unwrap_or(0).max(1);
    let nb = (lifetimes.len() / 8).clamp(1, 4096) as u64;
    let width = horizon.div_ceil(nb).max(1);
    let bucket = |t: u64| ((t / width) as usize).min(nb as usize - 1);
    const LONG_BUCKETS: usize = 64;
    let mut buckets: Vec<Vec<u32>> = vec![Vec::new(); nb as usize];
    let mut long: Vec<u32> = Vec::new();
    // Placed blocks: (offset, size, start, end).
    let mut placed: Vec<(u64, u64, u64, u64)> = Vec::with_capacity(lifetimes.len());
    let mut seen: Vec<u32> = Vec::with_capacity(lifetimes.len());
    let mut near: Vec<(u64, u64)> = Vec::new();
    let mut arena = 0u64;
    for (query, &(start, end, size)) in lifetimes.iter().enumerate() {
        let stamp = query as u32 + 1;
        near.clear();
        let (b0, b1) = (bucket(start), bucket(end.saturating_sub(1).max(start)));
        let offer = |k: u32, near: &mut Vec<(u64, u64)>, seen: &mut Vec<u32>| {
            if seen[k as usize] == stamp {
                return;
            }
            seen[k as usize] = stamp;
            let (off, sz, s, e) = placed[k as usize];
            if !(s >= end || start >= e) {
                near.push((off, sz));
            }
        };
        for &k in &long {
            offer(k, &mut near, &mut seen);
        }
        for b in &buckets[b0..=b1] {
            for &k in b {
                offer(k, &mut near, &mut seen);
            }
        }
        near.sort_unstable();
        let mut prev_end = 0u64;
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        for &(off, sz) in &near {
            if off > prev_end {
                let gap = off - prev_end;
                if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, prev_end));
                }
            }
            prev_end = prev_end.max(off.saturating_add(sz));
        }
        let offset = best.map(|(_, o)| o).unwrap_or(prev_end);
        let k = placed.len() as u32;
        placed.push((offset, size, start, end));
        seen.push(0);
        if b1 - b0 + 1 > LONG_BUCKETS {
            long.push(k);
        } else {
            for b in &mut buckets[b0..=b1] {
                b.push(k);
            }
        }
        // Saturating: sizes near 2^64 from a hostile trace must not wrap the arena.
        arena = arena.max(offset.saturating_add(size));
    }
    arena
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CapacitySource;
    use proptest::prelude::*;

    /// A table without a search folds its bounds on its replays' pass: the same bounds as a pass
    /// of their own, on every shipped trace.
    #[test]
    fn bounds_folded_beside_the_replays_are_the_bounds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut checked = 0;
        for e in std::fs::read_dir(root.join("traces")).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_none_or(|x| x != "atrace") {
                continue;
            }
            let trace = Trace::open(&path).unwrap();
            let own = bounds(&trace, &trace.header.config).unwrap();
            let opts = WhatifOptions {
                capacity: trace.default_capacity(),
                search_capacity: false,
                repeats: 0,
                rows_only: true,
            };
            let w = whatif(&trace, &opts).unwrap();
            let json = |b: &Bounds| serde_json::to_value(b).unwrap();
            assert_eq!(json(&w.bounds), json(&own), "{}", path.display());
            checked += 1;
        }
        assert!(checked >= 10);
    }

    /// The reference: every placed block scanned for each new one.
    fn greedy_by_size_naive(lifetimes: &mut [(u64, u64, u64)]) -> u64 {
        lifetimes.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        // Placed blocks: (offset, size, start, end), kept sorted by offset.
        let mut placed: Vec<(u64, u64, u64, u64)> = Vec::with_capacity(lifetimes.len());
        let mut arena = 0u64;
        for &(start, end, size) in lifetimes.iter() {
            let mut prev_end = 0u64;
            let mut best: Option<(u64, u64)> = None; // (gap, offset)
            for &(off, sz, s, e) in &placed {
                if s >= end || start >= e {
                    continue; // disjoint in time
                }
                if off > prev_end {
                    let gap = off - prev_end;
                    if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                        best = Some((gap, prev_end));
                    }
                }
                prev_end = prev_end.max(off + sz);
            }
            let offset = best.map(|(_, o)| o).unwrap_or(prev_end);
            let pos = placed.partition_point(|p| p.0 < offset);
            placed.insert(pos, (offset, size, start, end));
            arena = arena.max(offset + size);
        }
        arena
    }

    /// The worked example of [`HeldFloor`]: 512-byte blocks on streams 1 and 2 take a small
    /// segment each; a 3 MiB block on stream 1 takes a large one of 4 MiB at least. Freeing
    /// the second small block lowers what is held, not the peak; an OOM makes the floor say
    /// nothing.
    #[test]
    fn held_floor_counts_a_segment_per_stream_and_pool() {
        let mut f = HeldFloor::default();
        f.alloc(1, 512);
        f.alloc(2, 512);
        assert_eq!(f.held, 4 << 20);
        f.alloc(1, 3 << 20);
        assert_eq!(f.held, 8 << 20);
        f.free(2, 512);
        assert_eq!((f.held, f.peak()), (6 << 20, Some(8 << 20)));
        // Small blocks on stream 1 count by their bytes: 2 MiB hold up to 2 MiB of them.
        f.alloc(1, 600 << 10);
        f.alloc(1, 400 << 10);
        f.alloc(1, 1 << 20);
        assert_eq!(f.held, 6 << 20);
        f.alloc(1, 100 << 10);
        assert_eq!(f.held, 8 << 20);
        f.oom = true;
        assert_eq!(f.peak(), None);
    }

    /// `bounds` counts a block from its allocation to its free request, and no floor where the
    /// trace records an OOM.
    #[test]
    fn bounds_hold_the_floor_until_the_free_request() {
        use recorder::trace::{Header, Pool, Source, TraceWriter};
        let write = |events: Vec<Event>| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.atrace");
            let mut w = TraceWriter::create(&path, &Header::new(Source::Recorded)).unwrap();
            for (i, event) in events.into_iter().enumerate() {
                w.write(&Record { time_ns: i as u64, event }).unwrap();
            }
            w.finish().unwrap();
            let trace = Trace::open(&path).unwrap();
            bounds(&trace, &trace.header.config).unwrap().held_floor_bytes
        };
        let alloc = |id, stream| Event::Alloc {
            id,
            addr: 0,
            requested_bytes: 512,
            block_bytes: 0,
            stream,
            pool: Pool::Small,
            callsite: 0,
        };
        // Block 1's free is requested before block 2 on another stream: one segment at a time,
        // though its completion comes later.
        let freed_first = vec![
            alloc(1, 1),
            Event::FreeRequested { id: 1, addr: 0, callsite: 0 },
            alloc(2, 2),
            Event::FreeCompleted { id: 1, addr: 0 },
        ];
        assert_eq!(write(freed_first.clone()), Some(2 << 20));
        let mut both = freed_first;
        both.swap(1, 2);
        assert_eq!(write(both.clone()), Some(4 << 20));
        both.push(Event::Oom {
            requested_bytes: 1,
            alloc_bytes: 2 << 20,
            device_free_bytes: 0,
            reserved_bytes: 0,
            allocated_bytes: 0,
            limit_bytes: 0,
            stream: 1,
        });
        assert_eq!(write(both), None);
    }

    proptest! {
        #[test]
        fn greedy_by_size_matches_the_naive_scan(
            blocks in proptest::collection::vec((0u64..2000, 1u64..400, 1u64..64), 0..300)
        ) {
            let mut a: Vec<(u64, u64, u64)> = blocks.iter().map(|&(s, len, sz)| (s, s + len, sz * 512)).collect();
            let mut b = a.clone();
            prop_assert_eq!(greedy_by_size(&mut a), greedy_by_size_naive(&mut b));
        }
    }

    #[test]
    fn greedy_by_size_worked_example() {
        let mut l = vec![(0, 10, 4), (0, 5, 2), (5, 10, 2)];
        assert_eq!(greedy_by_size(&mut l), 6);
    }

    #[test]
    fn greedy_by_size_disjoint_lifetimes_share_memory() {
        let mut l = vec![(0, 1, 100), (1, 2, 100), (2, 3, 100)];
        assert_eq!(greedy_by_size(&mut l), 100);
        // C [2,3) overlaps A but not B [1,2): it takes B's place above A.
        let mut l = vec![(0, 3, 100), (1, 2, 100), (2, 3, 50)];
        assert_eq!(greedy_by_size(&mut l), 200);
        // All three overlap at time 1: no sharing.
        let mut l = vec![(0, 3, 100), (1, 2, 100), (0, 3, 50)];
        assert_eq!(greedy_by_size(&mut l), 250);
    }

    /// Each policy's run at the capacity, shown to the observer first by the unlimited run and
    /// then resumed (what `whatif` and `report` do), is a whole replay at the capacity: the
    /// same rows, and the observer sees the same records with the same figures, on every
    /// shipped trace.
    #[test]
    fn resumed_runs_equal_whole_replays_on_every_shipped_trace() {
        let paths = crate::shipped_traces();
        type Seen = Vec<(u64, u64, u64, u64)>;
        let figures = |i: u64, view: &dyn EngineView| {
            let st = view.stats();
            (i, st.reserved_bytes.all.current, st.allocated_bytes.all.current, st.requested_bytes.all.current)
        };
        for p in &paths {
            let trace = Trace::open(p).unwrap();
            let opts = WhatifOptions {
                capacity: trace.default_capacity(),
                search_capacity: true,
                repeats: 1,
                rows_only: false,
            };
            let (w, runs) = whatif_observed(
                &trace,
                &opts,
                &|_| Seen::new(),
                &|seen, i, _, view, _| seen.push(figures(i, view)),
                &|_, _, _, _, _| {},
            )
            .unwrap();
            let list =
                policies(&trace.header.config, crate::analysis::outcome::memory_fraction(&trace, opts.capacity.bytes));
            assert_eq!(list.len(), runs.len());
            for (k, (((policy, config), (own, r)), row)) in list.iter().zip(&runs).zip(&w.rows).enumerate() {
                // A row that is the same run as an earlier one has no state of its own: the
                // earlier row's must be what a replay of this row's setting shows.
                assert_eq!(own.is_some(), row.same_as.is_none(), "row {k}");
                let seen = runs[w.replayed_by(k)].0.as_ref().expect("the replayed row's state");
                let whole_opts = ReplayOptions {
                    config: Some(config.clone()),
                    capacity_bytes: opts.capacity.bytes.filter(|_| opts.capacity.source == CapacitySource::Given),
                    unlimited: opts.capacity.bytes.is_none(),
                    ..Default::default()
                };
                let mut whole_seen = Seen::new();
                let whole = crate::replay::replay_observed(&trace, &whole_opts, &mut |i, _, view, _| {
                    whole_seen.push(figures(i, view))
                })
                .unwrap();
                let what = format!("{} under {}", p.display(), policy.name());
                assert_eq!(serde_json::to_value(r).unwrap(), serde_json::to_value(&whole).unwrap(), "{what}");
                assert_eq!(row.outcome, whole.outcome_kind(), "{what}");
                assert_eq!(row.peak_reserved_bytes, whole.peak_reserved_bytes, "{what}");
                assert!(seen == &whole_seen, "{what}: the observer saw other records or figures");
            }
        }
    }

    #[test]
    fn policies_change_one_knob() {
        let p = policies(&AllocatorConfig::default(), false);
        assert_eq!(p[0].0, Policy::Recorded);
        assert!(p.iter().any(|(n, c)| n.name() == "expandable_segments:True" && c.expandable_segments));
        assert!(!p.iter().any(|(n, _)| n.name().starts_with("garbage")), "GC needs a capacity");
        assert!(!p.iter().any(|(n, _)| n.name() == "expandable_segments:False"), "no row equal to the recorded one");
        assert!(policies(&AllocatorConfig::default(), true).iter().any(|(n, _)| n.name().starts_with("garbage")));
    }
}
