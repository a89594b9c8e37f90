//! The smallest capacity at which a request stream completes under a configuration: bisection
//! between a lower bound and the unlimited run's peak reserved, each probe a replay (resumed from
//! a save of the unlimited run where one is given). A replay at one capacity also tells the
//! outcome at every capacity in its band, where the run makes the same choices
//! ([`crate::replay::ReplayResult::capacity_band`]): a probe that a band holds is not replayed.
//! Used by the what-if table and by the prediction of a whole job; it depends on the replay
//! alone.

use crate::model::Trace;
use crate::replay::{replay, ReplayOptions, Save};
use anyhow::Result;
use rayon::prelude::*;
use recorder::engine::config::AllocatorConfig;
use std::collections::HashMap;

/// Capacities are searched to this resolution.
pub const CAPACITY_RESOLUTION: u64 = 2 << 20;
/// Above this many events a trace is long: each policy's capacity search stops after
/// [`LONG_TRACE_PROBES`] replays, and the resolution it reached is reported.
pub const LONG_TRACE_EVENTS: u64 = 1_000_000;
pub const LONG_TRACE_PROBES: u32 = 6;
/// Saves of the unlimited run that capacity probes resume from ([`crate::replay::Resumable`]).
pub const RESUME_LEVELS: u64 = 16;

/// Smallest capacity (to [`CAPACITY_RESOLUTION`]) at which `config` completes the trace.
/// `probed` is called after each replay (for progress). At most `max_probes` replays: the
/// result is then a capacity known to complete, within the returned resolution of the boundary.
/// `None` when no capacity completes (a request near 2^64 bytes fails under any limit): that
/// is a finding about the trace, not an error.
///
/// `floor`, where given, is a capacity below which no replay can complete (the blocks live at
/// once need more: [`crate::analysis::whatif::Bounds::held_floor_bytes`]). The bisection takes those
/// capacities as failed without replaying them, and the floor itself is replayed first: where
/// it completes it is the answer, to the resolution, which on a trace that keeps a segment per
/// stream the bisection would reach only after replaying nearly the whole trace at each of some
/// twenty capacities.
///
/// `ahead` levels of the bisection are replayed at once (1: one probe at a time; 2: the middle
/// and both capacities that could come next, 3 probes; ...), for threads that would otherwise
/// wait: the probes the bisection then takes are the ones it would have made one at a time,
/// so the answer does not depend on `ahead`. `ahead` is asked before each round: threads that
/// other searches have let go of serve the rounds of those still running.
///
/// `past_caught_scratch`: each probe goes on past a failed scratch buffer
/// ([`ReplayOptions::past_caught_scratch`]), where `from` does not say it already.
#[allow(clippy::too_many_arguments)]
pub fn min_capacity(
    trace: &Trace,
    config: &AllocatorConfig,
    past_caught_scratch: bool,
    from: Option<&crate::replay::Resumable>,
    lower: u64,
    floor: Option<u64>,
    upper: u64,
    max_probes: u32,
    ahead: &(dyn Fn() -> u32 + Sync),
    probed: &(dyn Fn() + Sync),
) -> Result<Option<(u64, u64)>> {
    let r = CAPACITY_RESOLUTION;
    let completes = |from: Option<&crate::replay::Resumable>, cap: u64| -> Result<(Known, Option<Save>)> {
        let (r, save) = match from {
            Some(from) => crate::replay::replay_resumed_shared(
                trace,
                from,
                Some(cap),
                crate::model::CapacitySource::Given,
                &mut |_, _, _, _| {},
                None,
            )?,
            None => {
                let o = ReplayOptions {
                    config: Some(config.clone()),
                    capacity_bytes: Some(cap),
                    past_caught_scratch,
                    ..Default::default()
                };
                (replay(trace, &o)?, None)
            }
        };
        let (low, high) = r.capacity_band.unwrap_or((cap, cap + 1));
        Ok((Known { low, high, completes: !r.is_oom() }, save))
    };
    // Invariant: `hi` completes; `lo` fails (or is the lower bound). `upper` is the peak reserved
    // of an unlimited run, which usually completes as a limit too, but a limit can change the run
    // (pages mapped in another order, the OOM path's releases): check it, and step up until a
    // limit completes, so the answer is always a limit that was replayed and completed.
    let mut hi = upper.div_ceil(r) * r;
    let mut lo = (lower / r * r).min(hi);
    let mut probes = 0;
    let mut step = r;
    let mid = |lo: u64, hi: u64| (lo + (hi - lo) / 2) / r * r;
    // The next `depth` levels of the bisection from (lo, hi): every capacity it could probe.
    let tree = |lo: u64, hi: u64, depth: u32| -> Vec<u64> {
        let mut tree: Vec<u64> = Vec::new();
        let mut level = vec![(lo, hi)];
        for _ in 0..depth {
            let mut next = Vec::new();
            for &(l, h) in &level {
                if h - l > r {
                    let m = mid(l, h);
                    tree.push(m);
                    next.push((l, m));
                    next.push((m, h));
                }
            }
            level = next;
        }
        tree.sort_unstable();
        tree.dedup();
        tree
    };
    // Whether each capacity replayed so far completes (a replay at a capacity is one run, from
    // a save or not), and with it every capacity in its band, which makes the same run: the
    // bisection takes its probes from here. Each probe is the one that it would replay one at a
    // time, so the answer is the same; a probe whose band holds it is not replayed.
    let mut outcome: HashMap<u64, bool> = HashMap::new();
    let mut bands: Vec<Known> = Vec::new();
    let known = |outcome: &HashMap<u64, bool>, bands: &[Known], cap: u64| -> Option<bool> {
        outcome.get(&cap).copied().or_else(|| bands.iter().find(|k| k.low <= cap && cap < k.high).map(|k| k.completes))
    };
    // Below the floor every capacity fails: known without a replay. (A floor above `hi`, the
    // unlimited run's peak, would be wrong: it is then not used.)
    let floor = floor.map(|f| f.div_ceil(r).saturating_mul(r)).filter(|&f| f > lo && f <= hi);
    let known_to_fail = |cap: u64| floor.is_some_and(|f| cap < f);
    let probe_all = |caps: Vec<u64>, outcome: &mut HashMap<u64, bool>, bands: &mut Vec<Known>| -> Result<()> {
        let results: Vec<(u64, Known, Option<Save>)> =
            caps.par_iter().map(|&cap| completes(from, cap).map(|(k, save)| (cap, k, save))).collect::<Result<_>>()?;
        for (cap, k, save) in results {
            outcome.insert(cap, k.completes);
            if k.high - k.low > 1 {
                bands.push(k);
            }
            if let (Some(from), Some(save)) = (from, save) {
                from.keep(save);
            }
        }
        Ok(())
    };
    if let Some(f) = floor {
        // The floor first, alone: where it completes, every other probe would be wasted (on a
        // trace with a segment per stream, each a replay of millions of segments). Where it
        // fails, it fails at the first request that needs more, which comes early: a replay
        // resumed near the floor.
        probe_all(vec![f], &mut outcome, &mut bands)?;
        if outcome[&f] {
            // The floor completes and nothing below it can: the smallest capacity.
            return Ok(Some((f, r)));
        }
    }
    // The first levels of the bisection are replayed beside `upper`, which nearly always
    // completes: they are the probes that come next (no deeper than the probes left to take:
    // the levels below would go unused).
    let mut caps = vec![hi];
    caps.extend(tree(lo, hi, ahead().max(1).min(max_probes)).into_iter().filter(|&c| !known_to_fail(c)));
    caps.retain(|&c| known(&outcome, &bands, c).is_none());
    caps.dedup();
    loop {
        probed();
        probe_all(std::mem::take(&mut caps), &mut outcome, &mut bands)?;
        // `hi` was replayed, or an earlier replay's band (the floor's) holds it and it was not.
        if known(&outcome, &bands, hi).expect("each capacity probed is replayed or in a band") {
            break;
        }
        probes += 1;
        lo = hi;
        let Some(next) = hi.checked_add(step) else { return Ok(None) };
        hi = next;
        step = step.saturating_mul(2);
        caps.push(hi);
    }
    while hi - lo > r && probes < max_probes {
        let caps: Vec<u64> = tree(lo, hi, ahead().max(1).min(max_probes - probes))
            .into_iter()
            .filter(|&c| known(&outcome, &bands, c).is_none() && !known_to_fail(c))
            .collect();
        probe_all(caps, &mut outcome, &mut bands)?;
        // The bisection, one probe at a time, over the results at hand.
        while hi - lo > r && probes < max_probes {
            let m = mid(lo, hi);
            let replayed = outcome.contains_key(&m);
            let Some(ok) = known(&outcome, &bands, m).or_else(|| known_to_fail(m).then_some(false)) else { break };
            probed();
            // Probes count the replays: a capacity known from another's band is free.
            if replayed {
                probes += 1;
            }
            if ok {
                hi = mid(lo, hi);
            } else {
                lo = mid(lo, hi);
            }
        }
    }
    Ok(Some((hi, (hi - lo).max(r))))
}

/// What one replay at a capacity tells: the run completes or not, and so does every capacity in
/// `[low, high)` (its [`crate::replay::ReplayResult::capacity_band`]).
#[derive(Clone, Copy)]
struct Known {
    low: u64,
    high: u64,
    completes: bool,
}

/// Whether a search that found `(least, resolution)` ([`min_capacity`]'s answer) saw a run fail
/// at a limit at or above `capacity`: the largest limit below its answer known to fail lies
/// `resolution` below it. A run that completes at `capacity` then completes by where its blocks
/// land ([`crate::analysis::whatif::PolicyRow::fits_by_placement`]).
pub fn failed_at_or_above((least, resolution): (u64, u64), capacity: u64) -> bool {
    least.saturating_sub(resolution) >= capacity
}

/// How many levels of a capacity search to replay at once when `searches` run side by side on
/// this many threads: enough probes to use the threads that would otherwise wait.
pub fn levels_ahead(searches: usize) -> u32 {
    let spare = rayon::current_num_threads() / searches.max(1);
    // Levels d take 2^d - 1 probes.
    let mut d = 1;
    while (1usize << (d + 1)) - 1 <= spare && d < 4 {
        d += 1;
    }
    d
}

/// Where the limit was not recorded but inferred from the failure as a range
/// ([`crate::model::CapacitySource::InferredLimit`]): the least limit at which the replay under
/// the recorded settings makes the recorded run up to its failure, where that is above the
/// least of the range. The range is read from the figures at the failure; a limit below this one
/// fails a request the recorded run served (a replay there diagnoses a failure that never
/// happened), so the real limit was at least this. `None` where the least of the range does, or
/// where nothing in the range does (the range then stands as read). Each probe is a replay; a
/// replay's band ([`crate::replay::ReplayResult::capacity_band`]) gives the exact least limit
/// of the run it made. `read_at(limit)` gives the trace as read under that limit where reading
/// depends on it (a snapshot's cache releases are told apart by the limit), `None` where the
/// trace is the same.
pub fn least_implied_limit(trace: &Trace, read_at: &dyn Fn(u64) -> Result<Option<Trace>>) -> Result<Option<u64>> {
    let capacity = trace.default_capacity();
    let (Some((low, high)), crate::model::CapacitySource::InferredLimit) = (capacity.range, capacity.source) else {
        return Ok(None);
    };
    let Some(fatal) = trace.facts.fatal_oom().map(|o| o.event) else { return Ok(None) };
    // Up to the recorded failure as recorded: no failure before it (recorded failures the
    // program caught are gone past, as every replay does). The trace as read is read under the
    // least limit already.
    let reaches = |cap: u64| -> Result<(bool, Option<(u64, u64)>)> {
        let read = if cap == low { None } else { read_at(cap)? };
        let r =
            replay(read.as_ref().unwrap_or(trace), &ReplayOptions { capacity_bytes: Some(cap), ..Default::default() })?;
        Ok((r.oom_event().is_none_or(|e| e >= fatal), r.capacity_band))
    };
    if reaches(low)?.0 {
        return Ok(None);
    }
    // Bisection: `lo` fails earlier, `hi` reaches the failure.
    let (mut lo, mut hi) = (low, high.saturating_sub(1));
    let (ok, mut band) = reaches(hi)?;
    if !ok {
        return Ok(None);
    }
    while hi - lo > CAPACITY_RESOLUTION {
        let mid = lo + (hi - lo) / 2;
        match reaches(mid)? {
            (true, b) => {
                hi = mid;
                band = b;
            }
            (false, _) => lo = mid,
        }
    }
    // The least limit of the run the replay at `hi` made (the same run, to the same outcome).
    Ok(Some(band.map_or(hi, |(from, _)| from.clamp(lo + 1, hi))))
}
