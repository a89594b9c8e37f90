//! What a replay can know about a job, and what it can predict.
//!
//! A trace that ends in an out-of-memory error is a prefix: the program's requests after the
//! failed one were never made. A replay of it under another setting can only say how far that
//! setting gets ([`Reach`]): it fails where the recorded run failed, it fails earlier, or it
//! serves the failed request and the rest of the job is unknown. It never "completes".
//!
//! The rest of the job can be predicted when the trace shows iterations and at least one whole
//! iteration precedes the failure ([`predict`]): the request stream up to the end of the last
//! whole iteration, then that iteration repeated ([`DEFAULT_REPEATS`] times unless asked
//! otherwise), is replayed under each setting. Blocks the repeated iteration frees that were
//! made before it are matched, by requested size, with the blocks the previous repetition left
//! live (the iteration's carry-over: gradients, the next batch); a free with no match is
//! dropped, so the block stays live (growth is never hidden). The answer is a prediction from
//! the repeated iteration, worded as one.

use crate::model::{CapacitySource, Policy, Trace};
use crate::replay::{replay, ReplayOptions};
use anyhow::Result;
use recorder::engine::config::AllocatorConfig;
use recorder::trace::{Event, Record, ReleaseCause};
use serde::Serialize;
use std::collections::{HashMap, HashSet, VecDeque};

/// Iterations appended after the last whole one when the caller does not say.
pub const DEFAULT_REPEATS: u32 = 3;

pub use crate::replay::Reach;

/// What alloctrace says of one setting at the capacity compared. Decided once, here, from how
/// far its replay got ([`Reach`]); the what-if table, `explain`'s advice, the report's fix line
/// and the JSON all render this one decision.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The settings the trace was recorded under: what the others are compared with.
    Recorded,
    /// The whole job is in the trace (it ends without an out-of-memory error: a complete run, or
    /// one recorded past the limit) and its replay under this setting completes at the capacity:
    /// advised wherever the recorded settings run out of memory there.
    Fits,
    /// The whole job is in the trace, and its replay under this setting runs out of memory at the
    /// capacity.
    DoesNotFit,
    /// The trace ends in an out-of-memory error and this setting's replay serves the request that
    /// failed, or the whole job completes at the capacity only by where its blocks land
    /// ([`crate::analysis::whatif::PolicyRow::fits_by_placement`]): worth trying. Whether the rest of the job fits is not in the trace (at most
    /// predicted), so it is never said to fit.
    WorthTrying,
    /// The trace ends in an out-of-memory error and this setting's replay fails at that request or
    /// earlier: it would not have helped.
    DoesNotHelp,
    /// The replay cannot tell (a failure the program may have caught, or a damaged trace).
    CannotTell,
    /// The limit was not recorded, and the trace allows a range of them
    /// ([`crate::model::Capacity::range`]): at the least of them, where the table's replays ran,
    /// this setting's replay fails at the request that failed (or earlier), yet the capacity
    /// search finds it getting past that request from a limit inside the range. Whether it helps
    /// depends on the real limit: worth trying, ordered among the others by what it needs.
    LimitDecides,
}

impl Decision {
    /// The decision for `policy`, whose replay got as far as `reach`.
    pub fn of(policy: &Policy, reach: Reach) -> Decision {
        if policy.is_recorded() {
            return Decision::Recorded;
        }
        match reach {
            Reach::Completes => Decision::Fits,
            Reach::RunsOutOfMemory => Decision::DoesNotFit,
            Reach::GetsPastFailure => Decision::WorthTrying,
            Reach::FailsWhereRecorded | Reach::FailsEarlier => Decision::DoesNotHelp,
            Reach::CannotTell | Reach::ReachesDamage => Decision::CannotTell,
        }
    }
    /// In a table's column.
    pub fn short(self) -> &'static str {
        match self {
            Decision::Recorded => "recorded",
            Decision::Fits => "fits",
            Decision::DoesNotFit => "does not fit",
            Decision::WorthTrying => "worth trying",
            Decision::DoesNotHelp => "not advised",
            Decision::CannotTell => "cannot tell",
            Decision::LimitDecides => "by limit",
        }
    }
    /// What [`Decision::short`] means, for a table's legend.
    pub fn meaning(self) -> &'static str {
        match self {
            Decision::Recorded => "the settings the trace was recorded under",
            Decision::Fits => "the whole job is in the trace and completes (advised where the recorded settings fail)",
            Decision::DoesNotFit => "the whole job is in the trace and runs out of memory",
            Decision::WorthTrying => {
                "gets past the failure, the rest of the job not in the trace, or completes here only by where its \
blocks land (said below)"
            }
            Decision::DoesNotHelp => "fails at the request that failed, or sooner",
            Decision::CannotTell => "fails at a request the recorded run served, which the program may catch",
            Decision::LimitDecides => {
                "the limit was not recorded: fails at the least the trace allows, gets past the failure from its min \
capacity, a limit the trace allows: worth trying"
            }
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The prediction for one setting.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyPrediction {
    pub policy: Policy,
    /// The extended job fits under this setting at the capacity compared. Never where the
    /// iterations differ in size: later ones may be larger than any the trace holds, so the
    /// extended job is then a lower bound; nor where it completes at the capacity only by where
    /// its blocks land ([`PolicyPrediction::fits_by_placement`]).
    pub fits: bool,
    /// The extended job completes at the capacity, yet the capacity search failed at a limit at
    /// least as large ([`crate::analysis::whatif::PolicyRow::fits_by_placement`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fits_by_placement: bool,
    /// The smallest capacity (2 MiB steps) at which the extended job fits under this setting
    /// (where iterations differ in size, the least the job needs).
    pub needs_bytes: Option<u64>,
}

/// What the trace says of the whole job.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "prediction", rename_all = "snake_case")]
pub enum JobPrediction {
    /// Predicted from the last whole iteration before the failure, repeated.
    FromRepeatedIteration {
        /// Where the iterations came from.
        iterations_from: String,
        /// The repeated iteration: events `[first, end)`.
        iteration_events: (u64, u64),
        /// Where the iterations differ in size: how, and that the largest was repeated.
        #[serde(skip_serializing_if = "Option::is_none")]
        varying: Option<String>,
        /// Whole iterations before the failure.
        whole_iterations: usize,
        repeats: u32,
        /// When the repeated iteration is the first: the blocks it kept, taken as one-time state
        /// (made once, not in every repetition).
        one_time_blocks: u64,
        one_time_bytes: u64,
        /// Out-of-memory errors the program caught before the failure: where there are any, the
        /// extended job's replays go on past a failed scratch buffer, as PyTorch's cuDNN tries a
        /// plan with a smaller workspace ([`crate::replay::ReplayOptions::past_caught_scratch`]).
        #[serde(skip_serializing_if = "is_zero")]
        caught_ooms: usize,
        policies: Vec<PolicyPrediction>,
        /// Where the limit was not recorded: the limits `[low, high)` the trace allows, the
        /// capacity compared being the least ([`crate::model::Capacity::range`]).
        #[serde(skip_serializing_if = "Option::is_none")]
        limit_range: Option<(u64, u64)>,
    },
    /// The trace cannot tell what the rest of the job needs.
    CannotTell { reason: String },
}

/// What a whole-job prediction says under one setting at the capacity compared: decided once
/// ([`JobPrediction::outlook`]), worded the same by every output ([`Outlook::clause`],
/// [`Outlook::short`]). Each holds the bytes the job is predicted to need (2 MiB steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outlook {
    /// Predicted to fit at the capacity.
    Fits(Option<u64>),
    /// The extended job completes at the capacity only by where its blocks land.
    ByPlacement(Option<u64>),
    /// The figure holds only if later iterations ask no more than those before the failure,
    /// which the trace cannot tell (one whole iteration, or iterations of different sizes):
    /// never said to fit, whatever the figure.
    IfAlike(u64),
    /// [`Outlook::IfAlike`] with a figure above the capacity: said beside it, so that a setting
    /// worth trying for the failure is not read as fitting the whole job.
    IfAlikeOverLimit(u64),
    /// Predicted to need more than the capacity.
    MoreThanLimit(u64),
    /// The limit was not recorded, and the figure lies inside the range the trace allows
    /// ([`crate::model::Capacity::range`]): predicted to fit if the real limit is at least that.
    WithinRange(u64),
    /// Predicted not to fit at the capacity, though the least capacity found is below it (where
    /// its blocks land decides it).
    Needs(u64),
    /// Predicted to run out of memory later, at any capacity searched.
    RunsOutLater,
}

impl Outlook {
    /// The clause every sentence about the whole job under a setting uses.
    pub fn clause(self) -> String {
        let b = crate::model::units::fmt_need;
        match self {
            Outlook::Fits(Some(n)) => format!("the rest of the job is predicted to fit (about {})", b(n)),
            Outlook::Fits(None) => "the rest of the job is predicted to fit".into(),
            Outlook::ByPlacement(n) => format!(
                "the whole job completes at this limit only by where its blocks land{}",
                n.map(|n| format!(" (it needs {} at larger limits)", b(n))).unwrap_or_default()
            ),
            Outlook::IfAlike(n) => {
                format!("the whole job needs about {} if later iterations ask no more than those before", b(n))
            }
            Outlook::IfAlikeOverLimit(n) => {
                format!("the whole job needs about {}, over the limit, if later iterations ask no more", b(n))
            }
            Outlook::MoreThanLimit(n) => {
                format!("the whole job is predicted to need about {}, more than the limit", b(n))
            }
            Outlook::WithinRange(n) => {
                format!("the whole job is predicted to need about {}: enough if the real limit is at least that", b(n))
            }
            Outlook::Needs(n) => format!(
                "the whole job is predicted to run out of memory at this limit, though it fits in about {} (where its \
blocks land decides it)",
                b(n)
            ),
            Outlook::RunsOutLater => "the whole job is predicted to run out of memory later".into(),
        }
    }

    /// The same, for a table's cell.
    pub fn short(self) -> String {
        let b = crate::model::units::fmt_need;
        match self {
            Outlook::Fits(Some(n)) => format!("predicted to fit, about {}", b(n)),
            Outlook::Fits(None) => "predicted to fit".into(),
            Outlook::ByPlacement(_) => "fits only by where blocks land".into(),
            Outlook::IfAlike(n) => format!("about {} if later iterations ask no more", b(n)),
            Outlook::IfAlikeOverLimit(n) => format!("about {}, more than the limit, if iterations stay alike", b(n)),
            Outlook::MoreThanLimit(n) => format!("about {}, more than the limit", b(n)),
            Outlook::WithinRange(n) => format!("about {}, if the real limit is that or more", b(n)),
            Outlook::Needs(n) => format!("runs out here; fits in about {}", b(n)),
            Outlook::RunsOutLater => "runs out later".into(),
        }
    }
}

impl JobPrediction {
    /// What the prediction says under `q`'s setting at `capacity`: the one decision every
    /// output words ([`Outlook`]). Where the limit was not recorded, a figure inside the range
    /// the trace allows (`limit_range`; `capacity` is the least of it) is over no limit the real
    /// run can have had for sure.
    pub fn outlook(&self, q: &PolicyPrediction, capacity: Option<u64>) -> Outlook {
        let alike_unknown = self.alike_unknown();
        let range = match self {
            JobPrediction::FromRepeatedIteration { limit_range, .. } => *limit_range,
            JobPrediction::CannotTell { .. } => None,
        };
        let within = |n: u64| range.is_some_and(|(low, high)| low <= n && n < high);
        match (q.fits, q.fits_by_placement, q.needs_bytes) {
            (true, _, n) => Outlook::Fits(n),
            (false, true, n) => Outlook::ByPlacement(n),
            (false, false, Some(n)) if alike_unknown && !within(n) && capacity.is_some_and(|c| n > c) => {
                Outlook::IfAlikeOverLimit(n)
            }
            (false, false, Some(n)) if alike_unknown => Outlook::IfAlike(n),
            (false, false, Some(n)) if within(n) => Outlook::WithinRange(n),
            (false, false, Some(n)) if capacity.is_none_or(|c| n > c) => Outlook::MoreThanLimit(n),
            (false, false, Some(n)) => Outlook::Needs(n),
            (false, false, None) => Outlook::RunsOutLater,
        }
    }

    /// Whether the figures hold only if later iterations ask no more than those before the
    /// failure, which the trace cannot tell: one whole iteration, or iterations of different
    /// sizes ([`Outlook::IfAlike`] for every setting).
    pub fn alike_unknown(&self) -> bool {
        matches!(self, JobPrediction::FromRepeatedIteration { varying: Some(_), .. })
    }

    /// The prediction for `policy`, if one was made.
    pub fn of(&self, policy: &Policy) -> Option<&PolicyPrediction> {
        match self {
            JobPrediction::FromRepeatedIteration { policies, .. } => policies.iter().find(|p| &p.policy == policy),
            JobPrediction::CannotTell { .. } => None,
        }
    }
    /// One line saying what was predicted, and from what.
    pub fn basis(&self) -> String {
        self.basis_with(true)
    }

    /// [`JobPrediction::basis`] without what it took as one-time state: for a text short of room.
    pub fn basis_short(&self) -> String {
        self.basis_with(false)
    }

    fn basis_with(&self, one_time: bool) -> String {
        match self {
            JobPrediction::FromRepeatedIteration {
                iterations_from,
                iteration_events,
                whole_iterations,
                repeats,
                one_time_blocks,
                one_time_bytes,
                varying,
                caught_ooms,
                ..
            } => {
                // How a failed cuDNN workspace is taken: said in full only, as the one-time state.
                let caught = if one_time && *caught_ooms > 0 {
                    format!(
                        "; the program caught {} before the failure, so a scratch buffer that fails (a cuDNN \
workspace) is gone past, as cuDNN then tries a plan with a smaller one, which the trace does not hold",
                        crate::model::units::count(*caught_ooms as u64, "out-of-memory error")
                    )
                } else {
                    String::new()
                };
                let once = if one_time && *one_time_blocks > 0 {
                    format!(
                        "; it is the first whole iteration to keep memory, and the {one_time_blocks} blocks ({}) it kept are taken as one-time \
state (an optimizer's first step, caches), made once",
                        crate::model::units::fmt_bytes(*one_time_bytes)
                    )
                } else {
                    String::new()
                };
                match varying {
                    Some(v) => format!(
                        "predicted by repeating an iteration {repeats} more times after the last whole one before the \
failure (iterations from {iterations_from}; {whole_iterations} whole before the failure): {v}{once}{caught}"
                    ),
                    None => format!(
                        "predicted by repeating the last whole iteration before the failure (events {}..{}, \
iterations from {iterations_from}; {whole_iterations} whole before the failure) {repeats} more times{once}{caught}",
                        iteration_events.0, iteration_events.1
                    ),
                }
            }
            JobPrediction::CannotTell { reason } => {
                format!("the trace cannot tell what the rest of the job needs: {reason}")
            }
        }
    }
}

/// The request stream up to `end`, then `[first, end)` repeated `repeats` times (see the module
/// documentation). The trace's own segment events stay in the prefix (replays reuse its
/// addresses); the repetitions carry only the program's requests, frees, marks and
/// `empty_cache()` calls.
///
/// With `first_iteration` (the repeated iteration is the job's first), the blocks it keeps that
/// no later free of the repetition takes back are taken as one-time state (the optimizer's
/// state made on its first step, lazily built caches) and made once, not in every repetition;
/// returns their count and bytes.
///
/// `last` is the last whole iteration before the failure, where the prefix ends. The iteration
/// repeated (`[first, end)`) is that one, or, where iterations differ in size, the largest: its
/// first repetition then takes over what the last one left live.
pub fn extend(
    trace: &Trace,
    (first, end): (u64, u64),
    last: (u64, u64),
    repeats: u32,
    first_iteration: bool,
) -> Result<(Trace, u64, u64)> {
    let mut prefix: Vec<Record> = Vec::new();
    let mut iteration: Vec<Record> = Vec::new();
    let mut size_of: crate::model::ids::IdMap<u64> = Default::default();
    let mut max_id = 0u64;
    // Blocks the last whole iteration made and left live at its end, in order.
    let mut last_made: Vec<u64> = Vec::new();
    let mut freed_by_prefix_end: HashSet<u64> = HashSet::new();
    trace.scan(|i, r| {
        match r.event {
            Event::Alloc { id, requested_bytes, .. } => {
                max_id = max_id.max(id);
                if i < last.1 {
                    size_of.insert(id, requested_bytes);
                }
                if (last.0..last.1).contains(&i) {
                    last_made.push(id);
                }
            }
            Event::FreeCompleted { id, .. } if i < last.1 => {
                freed_by_prefix_end.insert(id);
            }
            _ => {}
        }
        if i < last.1 {
            prefix.push(r.clone());
        }
        if (first..end).contains(&i) {
            iteration.push(r.clone());
        }
    })?;
    // The iteration's own blocks, in order; and which of them it leaves live (carry-out).
    let made: Vec<u64> =
        iteration.iter().filter_map(|r| if let Event::Alloc { id, .. } = r.event { Some(id) } else { None }).collect();
    let made_set: HashSet<u64> = made.iter().copied().collect();
    let mut freed: HashSet<u64> = iteration
        .iter()
        .filter_map(|r| if let Event::FreeCompleted { id, .. } = r.event { Some(id) } else { None })
        .collect();
    // One-time state: the kept blocks that the frees of blocks made before the iteration do not
    // take back in a repetition.
    let mut one_time: HashSet<u64> = HashSet::new();
    if first_iteration {
        let mut pool: HashMap<u64, VecDeque<u64>> = HashMap::new();
        for &id in made.iter().filter(|id| !freed.contains(id)) {
            pool.entry(size_of[&id]).or_default().push_back(id);
        }
        let mut seen: HashSet<u64> = HashSet::new();
        for r in &iteration {
            if let Event::FreeCompleted { id, .. } = r.event {
                if !made_set.contains(&id) && seen.insert(id) {
                    if let Some(q) = size_of.get(&id).and_then(|s| pool.get_mut(s)) {
                        q.pop_front();
                    }
                }
            }
        }
        one_time = pool.into_values().flatten().collect();
        // Not made again: as if freed within the iteration for the carry-over's bookkeeping.
        freed.extend(one_time.iter().copied());
    }
    let one_time_bytes: u64 = one_time.iter().map(|id| size_of[id]).sum();
    let span = iteration
        .last()
        .map(|r| r.time_ns)
        .unwrap_or(0)
        .saturating_sub(iteration.first().map(|r| r.time_ns).unwrap_or(0))
        + 1;
    let base_time = prefix.last().map(|r| r.time_ns).unwrap_or(0);
    let first_time = iteration.first().map(|r| r.time_ns).unwrap_or(0);
    // Carry-out of the previous repetition, by requested size: ids, oldest first.
    let carry_out = |ids: &dyn Fn(u64) -> u64| -> HashMap<u64, VecDeque<u64>> {
        let mut m: HashMap<u64, VecDeque<u64>> = HashMap::new();
        for &id in made.iter().filter(|id| !freed.contains(id)) {
            m.entry(size_of[&id]).or_default().push_back(ids(id));
        }
        m
    };
    let mut records = prefix;
    // What the last real iteration left live, for the first repetition's frees to take back.
    let mut previous = if (first, end) == last {
        carry_out(&|id| id)
    } else {
        let mut m: HashMap<u64, VecDeque<u64>> = HashMap::new();
        for &id in last_made.iter().filter(|id| !freed_by_prefix_end.contains(id)) {
            m.entry(size_of[&id]).or_default().push_back(id);
        }
        m
    };
    for j in 1..=u64::from(repeats) {
        let offset = (max_id + 1) * j;
        let new_id = |id: u64| id + offset;
        let mut taken: HashMap<u64, Option<u64>> = HashMap::new();
        // A block of the same requested size, else the oldest of any size (a batch whose size
        // varies), else none.
        let mut carried = |id: u64, previous: &mut HashMap<u64, VecDeque<u64>>| -> Option<u64> {
            *taken.entry(id).or_insert_with(|| {
                let same = size_of.get(&id).and_then(|s| previous.get_mut(s)?.pop_front());
                same.or_else(|| {
                    let oldest = previous.iter().filter_map(|(s, q)| q.front().map(|&x| (x, *s))).min()?;
                    previous.get_mut(&oldest.1)?.pop_front()
                })
            })
        };
        for r in &iteration {
            let time_ns = base_time + (r.time_ns - first_time) + span * (j - 1);
            let event = match &r.event {
                Event::Alloc { id, .. } if one_time.contains(id) => None,
                Event::Alloc { id, addr, requested_bytes, block_bytes, stream, pool, callsite } => Some(Event::Alloc {
                    id: new_id(*id),
                    addr: *addr,
                    requested_bytes: *requested_bytes,
                    block_bytes: *block_bytes,
                    stream: *stream,
                    pool: *pool,
                    callsite: *callsite,
                }),
                Event::FreeRequested { id, addr, callsite } => {
                    let to = if made_set.contains(id) { Some(new_id(*id)) } else { carried(*id, &mut previous) };
                    to.map(|id| Event::FreeRequested { id, addr: *addr, callsite: *callsite })
                }
                Event::FreeCompleted { id, addr } => {
                    let to = if made_set.contains(id) { Some(new_id(*id)) } else { carried(*id, &mut previous) };
                    to.map(|id| Event::FreeCompleted { id, addr: *addr })
                }
                e @ (Event::Oom { .. }
                | Event::Mark { .. }
                | Event::CallSite { .. }
                | Event::CacheRelease { cause: ReleaseCause::EmptyCache, .. }) => Some(e.clone()),
                _ => None,
            };
            if let Some(event) = event {
                records.push(Record { time_ns, event });
            }
        }
        previous = carry_out(&new_id);
    }
    let mut header = trace.header.clone();
    header.notes.push(format!("events {first}..{end} repeated {repeats} times after event {}", last.1));
    Ok((trace.derived(header, records), one_time.len() as u64, one_time_bytes))
}

/// Predicts, for a trace that ends in an OOM, whether the whole job fits under each setting at
/// `capacity`, and what it needs. `None` when the trace does not end in an OOM.
///
/// `past[k]` says whether the replay of policy `k` got past the failed request at `capacity`,
/// and `past_from[k]` from which capacity it does: the whole job fits only where its prefix
/// does, and needs at least that.
pub fn predict(
    trace: &Trace,
    policies: &[(Policy, AllocatorConfig)],
    past: &[bool],
    past_from: &[Option<u64>],
    same_as: &[Option<usize>],
    limit: &crate::model::Capacity,
    repeats: u32,
) -> Result<Option<JobPrediction>> {
    let capacity = limit.bytes;
    let Some(fatal) = trace.facts.fatal_oom().map(|o| o.event) else {
        return Ok(None);
    };
    let cannot = |reason: &str| Ok(Some(JobPrediction::CannotTell { reason: reason.into() }));
    let Some(crate::model::iterations::Iterations { source, starts: bounds }) =
        trace.facts.iterations.iterations_before(fatal)
    else {
        return cannot("no iteration marks and no repeated annotation before the failure");
    };
    let from = source.to_string();
    if bounds.len() < 2 {
        return cannot("no whole iteration precedes the failure");
    }
    let (first, end) = (bounds[bounds.len() - 2], bounds[bounds.len() - 1]);
    // The failure must lie inside an iteration like the repeated one: further from the last
    // boundary than one and a half iterations, the job has moved on to something else (a
    // validation loop after training) that the repeated iteration does not describe.
    if (fatal - end) * 2 > (end - first) * 3 {
        return cannot(&format!(
            "the failure (event {fatal}) comes {} events after the last iteration boundary, more than an iteration \
({} events): the job had moved on to work the iterations before it do not show",
            fatal - end,
            end - first
        ));
    }
    let whole_iterations = bounds.len() - 1;
    // Where iterations differ in size, the largest whole one is repeated, and the basis says so.
    let sizes = iteration_sizes(trace, &bounds, fatal)?;
    let (repeated, note) = match unlike_iterations(&sizes) {
        // One whole iteration, the first, which also makes one-time state (an optimizer's state,
        // caches): nothing shows whether the later ones ask for the same (a UNet whose resolution
        // varies per step asked for more, and ran out of memory where this one was predicted to
        // fit under every setting).
        None if whole_iterations == 1 => (
            (first, end),
            Some(
                "only one whole iteration precedes the failure: the figures hold if later ones ask no more, which \
the trace cannot tell, so no setting is predicted to fit"
                    .to_string(),
            ),
        ),
        None => ((first, end), None),
        Some(reason) => {
            let (failing, whole) = sizes.split_last().expect("two bounds at least");
            // The largest after the first (which also makes one-time state), where there are others.
            let skip = usize::from(whole.len() > 1);
            let k = (skip..whole.len()).max_by_key(|&k| (whole[k].1, whole[k].0, k)).expect("one whole iteration");
            let lower = failing.1 > whole[k].1 || failing.0 > whole[k].0;
            (
                (bounds[k], bounds[k + 1]),
                Some(format!(
                    "{reason}: the largest whole iteration (events {}..{}) is repeated, and the figures are the \
least the job needs, so no setting is predicted to fit{}",
                    bounds[k],
                    bounds[k + 1],
                    if lower { " (the iteration that failed asked for more still)" } else { "" }
                )),
            )
        }
    };
    // One-time state: what the repeated iteration keeps is made once (an optimizer's state on
    // its first step, lazily built caches) where it is the first whole iteration, or the first
    // to keep much: the whole iterations before it grew by less than half as much. Growth that
    // recurs is repeated (a leak is never hidden).
    let k = bounds.iter().position(|&b| b == repeated.0).expect("the repeated iteration starts at a bound");
    let grew = |j: usize| sizes[j].2;
    let one_time = k == 0 || (grew(k) > 0 && (0..k).all(|j| grew(j).saturating_mul(2) < grew(k)));
    let (extended, one_time_blocks, one_time_bytes) = extend(trace, repeated, (first, end), repeats.max(1), one_time)?;
    // Each policy on the extended job, in parallel: its unlimited run, saved for the run at the
    // capacity and the capacity search to resume from (see `crate::replay::Resumable`).
    use rayon::prelude::*;
    // A setting that is the same run as another on the trace ([`crate::analysis::whatif::same_runs`]) is
    // on the extended job too (the same requests, repeated): predicted once.
    let predicted = same_as.iter().filter(|s| s.is_none()).count();
    let ahead = crate::analysis::capacity_search::levels_ahead(predicted);
    let side_by_side = crate::replay::concurrent_replays(&extended) >= 2 * predicted;
    // A program that caught out-of-memory errors before the failure catches a failed cuDNN
    // workspace (`try_plans` in `aten/src/ATen/native/cudnn/Conv_v8.cpp` tries the next plan):
    // the extended job goes on past one, as the recorded run went on past its own.
    let caught_ooms = trace.facts.caught_ooms();
    let past_scratch = caught_ooms > 0;
    let mut out: Vec<Option<PolicyPrediction>> = policies
        .par_iter()
        .enumerate()
        .map(|(k, (policy, config))| -> Result<Option<PolicyPrediction>> {
            if same_as.get(k).copied().flatten().is_some() {
                return Ok(None);
            }
            let gets_past = past.get(k).copied().unwrap_or(false);
            let (unlimited, from) = crate::replay::resumable(
                &extended,
                config,
                0,
                crate::analysis::capacity_search::RESUME_LEVELS,
                crate::replay::saved_blocks_share(predicted),
            )?;
            let from = from.map(|f| f.going_past_caught_scratch(past_scratch));
            let from = from.as_ref();
            // The run at the capacity and the search side by side where their replays fit beside
            // each other's (they resume from the same saves, and neither waits for the other).
            let at_capacity = || -> Result<bool> {
                Ok(gets_past
                    && !match from {
                        Some(from) => crate::replay::replay_resumed_watched(
                            &extended,
                            from,
                            capacity,
                            crate::model::CapacitySource::Given,
                            &mut |_, _, _, _| {},
                            None,
                        )?
                        .is_oom(),
                        None => {
                            let at = ReplayOptions {
                                config: Some(config.clone()),
                                capacity_bytes: capacity,
                                unlimited: capacity.is_none(),
                                past_caught_scratch: past_scratch,
                                ..Default::default()
                            };
                            replay(&extended, &at)?.is_oom()
                        }
                    })
            };
            let search = || {
                if unlimited.is_oom() {
                    return Ok(None);
                }
                crate::analysis::capacity_search::min_capacity(
                    &extended,
                    config,
                    past_scratch,
                    from,
                    0,
                    None,
                    unlimited.peak_reserved_bytes,
                    12,
                    &|| ahead,
                    &|| (),
                )
            };
            let (fits, needs) = if side_by_side {
                let (fits, needs) = rayon::join(at_capacity, search);
                (fits?, needs?)
            } else {
                (at_capacity()?, search()?)
            };
            // Completing at the capacity while the search failed at a limit at least as large is
            // completing by where the blocks land: not a fit.
            let by_placement =
                needs.zip(capacity).is_some_and(|(m, c)| crate::analysis::capacity_search::failed_at_or_above(m, c));
            let needs = needs.map(|(n, _)| n.max(past_from.get(k).copied().flatten().unwrap_or(0)));
            Ok(Some(PolicyPrediction {
                policy: policy.clone(),
                fits: fits && note.is_none() && !by_placement,
                fits_by_placement: fits && by_placement,
                needs_bytes: needs,
            }))
        })
        .collect::<Result<_>>()?;
    for k in 0..out.len() {
        if let Some(j) = same_as.get(k).copied().flatten() {
            out[k] = out[j].clone().map(|p| PolicyPrediction { policy: policies[k].0.clone(), ..p });
        }
    }
    let out: Vec<PolicyPrediction> = out.into_iter().map(|p| p.expect("every setting is predicted")).collect();
    Ok(Some(JobPrediction::FromRepeatedIteration {
        iterations_from: from,
        iteration_events: repeated,
        varying: note,
        whole_iterations,
        repeats: repeats.max(1),
        one_time_blocks,
        one_time_bytes,
        caught_ooms,
        policies: out,
        limit_range: limit.range,
    }))
}

/// Whether a replay at `capacity` runs under a memory fraction (a limit below the device),
/// the only case in which PyTorch's `garbage_collection_threshold` acts: not when there is no
/// limit, nor when the limit was inferred from a device that was itself full.
pub fn memory_fraction(trace: &Trace, capacity: Option<u64>) -> bool {
    capacity.is_some()
        && !(trace.default_capacity().source == CapacitySource::InferredFromOom && trace.facts.oom_capacity == capacity)
}

/// Each iteration's (largest request, total requested, live bytes it added) between the first
/// bound and the failure (served requests; the failing iteration, last, also counts the request
/// that failed). Live bytes are requested bytes allocated minus freed; an iteration that keeps
/// nothing adds 0.
fn iteration_sizes(trace: &Trace, bounds: &[u64], fatal: u64) -> Result<Vec<(u64, u64, u64)>> {
    let n = bounds.len();
    let mut per: Vec<(u64, u64, u64)> = vec![(0, 0, 0); n];
    let mut live: i64 = 0;
    let mut at_bound: Vec<i64> = vec![0; n];
    let mut size_of: crate::model::ids::IdMap<u64> = Default::default();
    let mut next = 0;
    trace.scan(|i, r| {
        while next < n && i >= bounds[next] {
            at_bound[next] = live;
            next += 1;
        }
        match r.event {
            Event::Alloc { id, requested_bytes, .. } => {
                live += requested_bytes as i64;
                size_of.insert(id, requested_bytes);
            }
            Event::FreeCompleted { id, .. } => live -= size_of.remove(&id).unwrap_or(0) as i64,
            _ => {}
        }
        if i < bounds[0] || i > fatal {
            return;
        }
        let k = bounds.partition_point(|&b| b <= i) - 1;
        let size = match r.event {
            Event::Alloc { requested_bytes, .. } => requested_bytes,
            Event::Oom { requested_bytes, .. } if i == fatal => requested_bytes,
            _ => return,
        };
        per[k].0 = per[k].0.max(size);
        per[k].1 = per[k].1.saturating_add(size);
    })?;
    for k in 0..n.saturating_sub(1) {
        per[k].2 = (at_bound[k + 1] - at_bound[k]).max(0) as u64;
    }
    Ok(per)
}

/// Why the last whole iteration would not stand for the rest of the job, if it would not, from
/// [`iteration_sizes`]: the whole iterations after the first (which makes one-time state: the
/// optimizer's first step, lazily built caches) must agree (else shapes vary from one step to
/// the next), and the iteration that failed must not have asked for more than the last whole
/// one.
fn unlike_iterations(per: &[(u64, u64, u64)]) -> Option<String> {
    let (failing, whole) = per.split_last().expect("two bounds at least");
    let steady = &whole[1.min(whole.len() - 1)..];
    let last = *whole.last().expect("one whole iteration at least");
    let close = |a: u64, b: u64| a.abs_diff(b) * 50 <= a.max(b);
    if steady.iter().any(|w| w.0 != last.0 || !close(w.1, last.1)) {
        return Some(format!(
            "the whole iterations differ in size (largest request {} to {})",
            crate::model::units::fmt_bytes(steady.iter().map(|w| w.0).min().unwrap_or(0)),
            crate::model::units::fmt_bytes(steady.iter().map(|w| w.0).max().unwrap_or(0))
        ));
    }
    let (larger_request, more_in_all) = (failing.0 > last.0, failing.1.saturating_mul(50) > last.1.saturating_mul(51));
    if larger_request || more_in_all {
        let b = crate::model::units::fmt_bytes;
        // Each comparison said where it holds: a larger request with less in all is not "more".
        let mut what = Vec::new();
        if larger_request {
            what.push(format!("made a larger request ({} against {})", b(failing.0), b(last.0)));
        }
        if more_in_all {
            what.push(format!("asked for more in all ({} against {})", b(failing.1), b(last.1)));
        }
        return Some(format!("the iteration that failed {} than the last whole one", what.join(" and ")));
    }
    None
}
