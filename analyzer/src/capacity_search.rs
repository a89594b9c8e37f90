//! The smallest capacity at which a request stream completes under a configuration: bisection
//! between a lower bound and the unlimited run's peak reserved, each probe a replay (resumed from
//! a save of the unlimited run where one is given). Used by the what-if table and by the
//! prediction of a whole job; it depends on the replay alone.

use crate::model::Trace;
use crate::replay::{replay, ReplayOptions};
use anyhow::Result;
use recorder::engine::config::AllocatorConfig;

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
pub fn min_capacity(
    trace: &Trace,
    config: &AllocatorConfig,
    mut from: Option<&mut crate::replay::Resumable>,
    lower: u64,
    upper: u64,
    max_probes: u32,
    probed: &(dyn Fn() + Sync),
) -> Result<Option<(u64, u64)>> {
    let r = CAPACITY_RESOLUTION;
    let mut completes = |cap: u64| -> Result<bool> {
        probed();
        let r = match from.as_deref_mut() {
            Some(from) => crate::replay::replay_resumed(trace, from, cap, crate::model::CapacitySource::Given)?,
            None => {
                let o = ReplayOptions { config: Some(config.clone()), capacity_bytes: Some(cap), ..Default::default() };
                replay(trace, &o)?
            }
        };
        Ok(!r.is_oom())
    };
    // Invariant: `hi` completes; `lo` fails (or is the lower bound). `upper` is the peak reserved
    // of an unlimited run, which usually completes as a limit too, but a limit can change the run
    // (pages mapped in another order, the OOM path's releases): check it, and step up until a
    // limit completes, so the answer is always a limit that was replayed and completed.
    let mut hi = upper.div_ceil(r) * r;
    let mut lo = (lower / r * r).min(hi);
    let mut probes = 0;
    let mut step = r;
    while !completes(hi)? {
        probes += 1;
        lo = hi;
        let Some(next) = hi.checked_add(step) else { return Ok(None) };
        hi = next;
        step = step.saturating_mul(2);
    }
    while hi - lo > r && probes < max_probes {
        probes += 1;
        let mid = (lo + (hi - lo) / 2) / r * r;
        if completes(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some((hi, (hi - lo).max(r))))
}
