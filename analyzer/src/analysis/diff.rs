//! `alloctrace diff`: two runs compared ("what changed between these two commits"): peaks,
//! OOMs, and per call site the bytes live at the peak and the number of allocations.
//!
//! Call sites are matched across the two traces by their label (see
//! [`crate::model::sites::site_of`]: the user's frame and the innermost function), not by their
//! ids, which each trace numbers on its own. "Bytes at the peak" are the live requested bytes
//! of a call site at the moment the trace's total of live requested bytes first peaked.

use crate::model::sites::LiveBySite;
use crate::model::Trace;
use crate::replay::{replay, ReplayOptions};
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;

/// One side of a diff.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub trace: String,
    pub alloc_conf: String,
    /// The limit the replay ran under (`None`: none), and where it came from.
    pub capacity_bytes: Option<u64>,
    pub capacity_source: crate::model::CapacitySource,
    pub events: u64,
    pub allocations: u64,
    /// OOM events in the trace.
    pub recorded_ooms: u64,
    /// Peaks as recorded in the trace.
    pub recorded_peak_reserved_bytes: u64,
    pub peak_requested_bytes: u64,
    /// Peaks of a replay under the trace's own settings and capacity.
    pub replayed_peak_reserved_bytes: u64,
    pub replayed_peak_allocated_bytes: u64,
    /// `ok`, or `oom` with the event index of the failed request.
    pub replayed_outcome: crate::model::OutcomeKind,
    /// The request that failed in the replay, if one did.
    pub replayed_oom_event: Option<u64>,
    pub has_callsites: bool,
    /// `null`, or where the trace was damaged: its figures cover what came before.
    pub input_damage: Option<crate::model::Damage>,
}

/// A call site's change.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CallsiteDelta {
    /// The call site, in the one shape of every output (matched across the traces by label).
    pub callsite: crate::model::sites::Site,
    pub a_bytes_at_peak: u64,
    pub b_bytes_at_peak: u64,
    pub delta_bytes_at_peak: i64,
    pub a_allocations: u64,
    pub b_allocations: u64,
    pub delta_allocations: i64,
}

/// The differences B - A of the headline figures.
#[derive(Debug, Clone, Serialize)]
pub struct Deltas {
    pub recorded_peak_reserved_bytes: i64,
    pub peak_requested_bytes: i64,
    pub replayed_peak_reserved_bytes: i64,
    pub replayed_peak_allocated_bytes: i64,
    pub recorded_ooms: i64,
    pub allocations: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub a: Side,
    pub b: Side,
    pub deltas: Deltas,
    /// Largest changes first (by |delta bytes at peak|, then |delta allocations|, then name).
    pub callsites: Vec<CallsiteDelta>,
}

/// Per call-site figures of one trace.
#[derive(Debug, Default)]
struct SiteFigures {
    /// label -> (the site, bytes at the peak, allocations)
    by_label: BTreeMap<String, (crate::model::sites::Site, u64, u64)>,
    has_callsites: bool,
}

fn sites(trace: &Trace) -> Result<SiteFigures> {
    let mut f = LiveBySite::new(&trace.facts.sites);
    let mut at_peak: Vec<u64> = Vec::new();
    let mut peak = 0u64;
    trace.scan(|_, r| {
        f.observe(&r.event);
        if f.total > peak {
            peak = f.total;
            at_peak.clone_from(&f.current);
        }
    })?;
    at_peak.resize(f.sites.len(), 0);
    let mut by_label = BTreeMap::new();
    for (l, site) in f.sites.sites.iter().enumerate() {
        if f.allocations.get(l).is_some_and(|&n| n > 0) {
            by_label.insert(site.label.clone(), (site.clone(), at_peak[l], f.allocations[l]));
        }
    }
    Ok(SiteFigures { by_label, has_callsites: f.sites.any_defined() })
}

/// One trace's side: its call sites' figures (a fold) and its replay, side by side where two
/// replays of it fit in memory together ([`crate::replay::join_within`]).
fn side(trace: &Trace) -> Result<(SiteFigures, Side)> {
    let (sites, r) = crate::replay::join_within(trace, || sites(trace), || replay(trace, &ReplayOptions::default()));
    let (sites, r) = (sites?, r?);
    let s = &trace.summary;
    let has_callsites = sites.has_callsites;
    let side = Side {
        trace: trace.path.display().to_string(),
        alloc_conf: trace.header.alloc_conf.clone(),
        capacity_bytes: r.capacity_bytes,
        capacity_source: r.capacity_source,
        events: s.events,
        allocations: s.count("alloc"),
        recorded_ooms: s.num_ooms,
        recorded_peak_reserved_bytes: s.peak_reserved.bytes,
        peak_requested_bytes: s.peak_requested.bytes,
        replayed_peak_reserved_bytes: r.peak_reserved_bytes,
        replayed_peak_allocated_bytes: r.peak_allocated_bytes,
        replayed_outcome: r.outcome_kind(),
        replayed_oom_event: r.oom_event(),
        has_callsites,
        input_damage: trace.damage(),
    };
    Ok((sites, side))
}

fn d(a: u64, b: u64) -> i64 {
    b as i64 - a as i64
}

/// Compares the traces at `a` and `b`.
pub fn diff(a: &Trace, b: &Trace) -> Result<Diff> {
    // The two sides at once where four replays of each fit in memory together (each side makes
    // a replay and a fold beside it); else one after the other.
    let at_once = crate::replay::concurrent_replays(a) >= 4 && crate::replay::concurrent_replays(b) >= 4;
    let (sa, sb) = if at_once { rayon::join(|| side(a), || side(b)) } else { (side(a), side(b)) };
    let ((sa, a), (sb, b)) = (sa?, sb?);
    let mut labels: Vec<&String> = sa.by_label.keys().chain(sb.by_label.keys()).collect();
    labels.sort();
    labels.dedup();
    let mut callsites: Vec<CallsiteDelta> = labels
        .into_iter()
        .map(|l| {
            let (sa, sb) = (sa.by_label.get(l), sb.by_label.get(l));
            let (ab, an) = sa.map_or((0, 0), |x| (x.1, x.2));
            let (bb, bn) = sb.map_or((0, 0), |x| (x.1, x.2));
            CallsiteDelta {
                callsite: sa.or(sb).map(|x| x.0.clone()).expect("a label of one side"),
                a_bytes_at_peak: ab,
                b_bytes_at_peak: bb,
                delta_bytes_at_peak: d(ab, bb),
                a_allocations: an,
                b_allocations: bn,
                delta_allocations: d(an, bn),
            }
        })
        .collect();
    callsites.sort_by(|x, y| {
        y.delta_bytes_at_peak
            .unsigned_abs()
            .cmp(&x.delta_bytes_at_peak.unsigned_abs())
            .then(y.delta_allocations.unsigned_abs().cmp(&x.delta_allocations.unsigned_abs()))
            .then(x.callsite.label.cmp(&y.callsite.label))
    });
    let deltas = Deltas {
        recorded_peak_reserved_bytes: d(a.recorded_peak_reserved_bytes, b.recorded_peak_reserved_bytes),
        peak_requested_bytes: d(a.peak_requested_bytes, b.peak_requested_bytes),
        replayed_peak_reserved_bytes: d(a.replayed_peak_reserved_bytes, b.replayed_peak_reserved_bytes),
        replayed_peak_allocated_bytes: d(a.replayed_peak_allocated_bytes, b.replayed_peak_allocated_bytes),
        recorded_ooms: d(a.recorded_ooms, b.recorded_ooms),
        allocations: d(a.allocations, b.allocations),
    };
    Ok(Diff { a, b, deltas, callsites })
}
