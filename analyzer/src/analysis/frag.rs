//! Fragmentation, measured four ways, over time and at one moment, with the segment map that
//! shows why a request did not fit.
//!
//! The layout comes from a replay under the recorded settings and capacity
//! ([`crate::replay::replay_observed`]). For imported and recorded traces the replay reuses the
//! recorded segment addresses, so its best-fit tie-breaks make the real run's choices; for a
//! simulated trace (or one with split/merge events written by alloctrace's own engine) the
//! replay recomputes the same layout deterministically. The source's own split/merge events
//! are not read: the engine recomputes them.
//!
//! The four measures (the names used in the literature and in PyTorch):
//! 1. **reserved vs allocated**: `1 - allocated / reserved`, and `reserved - allocated` bytes
//!    (PyTorch's "reserved by PyTorch but unallocated").
//! 2. **contiguity**: `1 - largest free block / total free` (TensorFlow's BFC measure): near 1,
//!    free memory exists only in pieces too small for a large request.
//! 3. **internal vs external**: internal = rounding slack inside allocated blocks (block bytes
//!    minus requested bytes); external = free blocks inside segments. Both as a share of reserved.
//! 4. **gap to an offline plan**: `1 - offline plan / peak reserved`, where the plan knows every
//!    lifetime in advance ([`crate::analysis::whatif::bounds`], greedy by size).
//!
//! Cost: the over-time figures are taken after every request from the byte figures the engine
//! keeps as it goes ([`recorder::engine::Occupancy`]: constant time, where a walk of the layout
//! costs a visit per block), so they are exact at any size. The layout itself is walked only
//! at the chosen moment and at the peak (a second replay that stops at the peak). Memory is
//! bounded by the layout (the live blocks and segments), plus one copy of it for the moment.

use crate::analysis::moment::{At, Moments};
use crate::analysis::whatif;
use crate::model::layout::{ratio_complement, LayoutMeasures};
use crate::model::Trace;
use crate::replay::{replay_observed, EngineView, OomMoment, Outcome, ReplayOptions, ReplayResult};
use anyhow::{bail, Result};
use recorder::engine::SegmentView;
use recorder::trace::{Event, Pool, Record, ReleaseCause};
use serde::Serialize;

/// One measure, defined, over time and at the moment.
#[derive(Debug, Clone, Serialize)]
pub struct Measure {
    pub name: &'static str,
    pub definition: &'static str,
    /// At the chosen moment, in [0, 1].
    pub at_moment: f64,
    /// The bytes behind it at the moment.
    pub at_moment_bytes: u64,
    /// At the peak of reserved bytes.
    pub at_peak: f64,
    /// Mean over the sampled events.
    pub mean: f64,
    pub max: f64,
    /// Index of the event where `max` was first reached.
    pub max_event: u64,
}

/// A run of equal consecutive blocks in a segment.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BlockRun {
    /// `allocated`, `free` or `pending_free`.
    pub state: &'static str,
    pub bytes: u64,
    pub count: u64,
}

/// One segment of the map.
#[derive(Debug, Clone, Serialize)]
pub struct SegmentMap {
    pub addr: u64,
    pub bytes: u64,
    pub pool: Pool,
    /// The private pool (CUDA graph, MemPool) the segment belongs to; absent for the default.
    #[serde(skip_serializing_if = "is_default_pool")]
    pub pool_id: [u64; 2],
    pub stream: u64,
    pub is_expandable: bool,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    pub largest_free_bytes: u64,
    pub blocks: Vec<BlockRun>,
}

fn is_default_pool(id: &[u64; 2]) -> bool {
    *id == [0, 0]
}

impl SegmentMap {
    /// The segment belongs to a private pool (a CUDA graph's, a MemPool's), whose free blocks
    /// serve only that pool's requests.
    pub fn in_private_pool(&self) -> bool {
        !is_default_pool(&self.pool_id)
    }
}

impl SegmentMap {
    pub fn of(s: &SegmentView) -> Self {
        let mut runs: Vec<BlockRun> = Vec::new();
        let (mut allocated, mut free, mut largest) = (0, 0, 0);
        for b in &s.blocks {
            let state = if b.allocated {
                allocated += b.bytes;
                "allocated"
            } else if b.pending_free {
                "pending_free"
            } else {
                free += b.bytes;
                largest = largest.max(b.bytes);
                "free"
            };
            match runs.last_mut() {
                Some(r) if r.state == state && r.bytes == b.bytes => r.count += 1,
                _ => runs.push(BlockRun { state, bytes: b.bytes, count: 1 }),
            }
        }
        SegmentMap {
            addr: s.addr,
            bytes: s.bytes,
            pool: s.pool,
            pool_id: s.pool_id,
            stream: s.stream,
            is_expandable: s.is_expandable,
            allocated_bytes: allocated,
            free_bytes: free,
            largest_free_bytes: largest,
            blocks: runs,
        }
    }

    /// Same shape (size, pool, stream, block runs): consecutive such segments print as one line.
    pub fn same_shape(&self, o: &SegmentMap) -> bool {
        self.bytes == o.bytes
            && self.pool == o.pool
            && self.stream == o.stream
            && self.is_expandable == o.is_expandable
            && self.blocks == o.blocks
    }
}

/// The request that failed at an OOM moment, and whether any free block could hold it.
#[derive(Debug, Clone, Serialize)]
pub struct FailedRequest {
    pub event: u64,
    pub requested_bytes: u64,
    /// The segment size the allocator tried to get from the device.
    pub alloc_bytes: u64,
    pub largest_free_bytes: u64,
    /// Capacity minus reserved: what the device could still give (None: no limit known).
    pub headroom_bytes: Option<u64>,
}

/// The moment shown in detail.
#[derive(Debug, Clone, Serialize)]
pub struct Moment {
    pub at: At,
    pub event: u64,
    /// The replay stopped at this event, out of memory ([`crate::analysis::moment`]).
    pub replay_stopped: bool,
    pub time_ns: u64,
    pub measures: LayoutMeasures,
    pub failed_request: Option<FailedRequest>,
    pub segments: Vec<SegmentMap>,
}

/// Gap to the offline plan (measure 4).
#[derive(Debug, Clone, Serialize)]
pub struct PlanGap {
    pub peak_reserved_bytes: u64,
    pub live_requested_peak_bytes: u64,
    pub offline_plan_bytes: Option<u64>,
    /// `1 - offline plan / peak reserved`, clamped to [0, 1].
    pub gap: Option<f64>,
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FragReport {
    pub trace: String,
    pub alloc_conf: String,
    pub capacity_bytes: Option<u64>,
    pub capacity_source: crate::model::CapacitySource,
    /// The replay's outcome (JSON: `outcome`, `oom_event`, `oom`).
    #[serde(flatten, serialize_with = "crate::replay::outcome_fields")]
    pub replay_outcome: Outcome,
    pub used_recorded_addresses: bool,
    /// As `replay`'s ([`crate::replay::ReplayResult::segments_placed_by_rule`]).
    pub segments_at_recorded_addresses: u64,
    pub segments_placed_by_rule: u64,
    pub events: u64,
    /// Events at which the over-time figures were taken: every request.
    pub samples: u64,
    pub measures: Vec<Measure>,
    pub plan: PlanGap,
    pub moment: Moment,
    pub peak_event: u64,
    pub anomalies: u64,
    pub input_damage: Option<crate::model::Damage>,
    /// Index of the first `oom` event the trace recorded, if any.
    pub recorded_oom_event: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct FragOptions {
    pub at: At,
}

/// Running mean / max of one measure.
#[derive(Debug, Clone, Copy, Default)]
struct Running {
    sum: f64,
    max: f64,
    max_event: u64,
}

impl Running {
    fn offer(&mut self, v: f64, event: u64) {
        self.sum += v;
        if v > self.max {
            self.max = v;
            self.max_event = event;
        }
    }
}

/// The layout at one moment, as an observer captured it.
#[derive(Debug, Clone)]
pub struct Captured {
    pub event: u64,
    pub time_ns: u64,
    pub segments: Vec<SegmentView>,
}

/// Is this record a request that changes the layout?
pub fn is_request(e: &Event) -> bool {
    matches!(
        e,
        Event::Alloc { .. }
            | Event::FreeRequested { .. }
            | Event::FreeCompleted { .. }
            | Event::Oom { .. }
            | Event::CacheRelease { cause: ReleaseCause::EmptyCache, .. }
    )
}

pub fn analyze(trace: &Trace, opts: &FragOptions) -> Result<FragReport> {
    analyze_with(trace, opts, None)
}

/// [`analyze`], with the trace's [`whatif::Bounds`] when they are already computed.
pub fn analyze_with(trace: &Trace, opts: &FragOptions, bounds: Option<&whatif::Bounds>) -> Result<FragReport> {
    watch_and_finish(trace, FragWatch::new(trace, opts)?, false, bounds)
}

/// [`analyze`] at the moment that matters, as every command decides it: the out-of-memory error
/// the replay under the trace's settings and capacity ran into, else the peak of reserved memory.
pub fn analyze_where_it_matters(trace: &Trace, bounds: Option<&whatif::Bounds>) -> Result<FragReport> {
    watch_and_finish(trace, FragWatch::new(trace, &FragOptions { at: At::Oom })?, true, bounds)
}

/// Replays with `watch`; `peak_unless_oom`: a watch made for the OOM turns to the peak where the
/// replay completes.
fn watch_and_finish(
    trace: &Trace,
    mut watch: FragWatch,
    peak_unless_oom: bool,
    bounds: Option<&whatif::Bounds>,
) -> Result<FragReport> {
    // The bounds, where the caller has none, are a fold of their own: beside the replay.
    let (result, computed) = crate::replay::join_within(
        trace,
        || replay_observed(trace, &ReplayOptions::default(), &mut |i, r, view, _| watch.observe(trace, i, r, view)),
        || bounds.is_none().then(|| whatif::bounds(trace, &trace.header.config)).transpose(),
    );
    let (result, computed) = (result?, computed?);
    let bounds = bounds.or(computed.as_ref()).expect("the bounds are given or folded beside the replay");
    if peak_unless_oom && !result.is_oom() {
        watch = watch.at_peak();
    }
    // The segments at the peak, where the peak is the moment: from a second replay that stops
    // there (copying the segments at every new peak of the first one cost more than the replay).
    let peak_segments = match watch.peak_to_take() {
        Some(peak_event) => {
            let o = ReplayOptions { stop_after: Some(peak_event), ..Default::default() };
            let mut taken = Vec::new();
            replay_observed(trace, &o, &mut |i, _, view: &dyn EngineView, _| {
                if i == peak_event {
                    taken = view.segments();
                }
            })?;
            taken
        }
        None => Vec::new(),
    };
    watch.finish(trace, result, &peak_segments, bounds)
}

/// What `frag` watches in the replay under the recorded settings: the four measures at every
/// request, the peak of reserved memory (with the measures there) and the layout at the moment
/// asked for. The layout at the peak is taken by a replay that stops there
/// ([`FragWatch::peak_to_take`]) and handed to [`FragWatch::finish`].
pub struct FragWatch {
    at: At,
    moments: Moments,
    runs: [Running; 4],
    samples: u64,
    peak: Option<(u64, u64)>,
    moment: Option<Captured>,
    last_seen: Option<(u64, u64)>,
    peak_m: LayoutMeasures,
}

impl FragWatch {
    pub fn new(trace: &Trace, opts: &FragOptions) -> Result<Self> {
        let events = trace.events;
        if let At::Event(e) = opts.at {
            if e >= events {
                bail!("{}: event {e} is past the end (the trace has {} events)", trace.path.display(), events);
            }
        }
        Ok(FragWatch {
            at: opts.at,
            moments: Moments::default(),
            runs: [Running::default(); 4],
            samples: 0,
            peak: None,
            moment: None,
            last_seen: None,
            peak_m: LayoutMeasures::default(),
        })
    }

    /// A watch made for the OOM serves the peak too (the peak's layout is taken afterwards):
    /// for a caller that learns only after the replay which moment it wants.
    pub fn at_peak(mut self) -> Self {
        if self.at == At::Oom {
            self.at = At::Peak;
            self.moment = None;
        }
        self
    }

    /// The event whose layout [`FragWatch::finish`] needs, where the moment is the peak.
    pub fn peak_to_take(&self) -> Option<u64> {
        self.peak.filter(|_| self.at == At::Peak).map(|p| p.0)
    }

    pub fn observe(&mut self, trace: &Trace, i: u64, r: &Record, view: &dyn EngineView) {
        self.last_seen = Some((i, r.time_ns));
        let passing = self.moments.observe(trace, i, r, view);
        let want_moment = self.moment.is_none() && passing.is(self.at, i);
        if passing.peak {
            self.peak = Some((i, r.time_ns));
            // The four measures at the peak need only the figures the engine keeps (constant
            // time); the segments themselves only where the peak is the moment drawn.
            self.peak_m = LayoutMeasures::of_occupancy(&view.occupancy());
        }
        if is_request(&r.event) {
            // The measures over time, at every request, from the figures the engine keeps.
            let m = LayoutMeasures::of_occupancy(&view.occupancy());
            self.samples += 1;
            for (k, v) in
                [m.reserved_vs_allocated(), m.contiguity(), m.internal(), m.external()].into_iter().enumerate()
            {
                self.runs[k].offer(v, i);
            }
        }
        if want_moment {
            self.moment = Some(Captured { event: i, time_ns: r.time_ns, segments: view.segments() });
        }
    }

    /// The report, from the replay this watched (`result`) and the segments at the peak where
    /// the peak is the moment.
    pub fn finish(
        self,
        trace: &Trace,
        result: ReplayResult,
        peak_segments: &[SegmentView],
        bounds: &whatif::Bounds,
    ) -> Result<FragReport> {
        let FragWatch { at, runs, samples, peak, moment, last_seen, peak_m, moments, .. } = self;
        let stopped_at = moments.stopped_at();
        finish(trace, at, result, (runs, samples, peak, moment, last_seen, peak_m, stopped_at), peak_segments, bounds)
    }
}

/// What [`FragWatch`] saw: the measures' runs, the samples, the peak, the moment, the last
/// event, the measures at the peak, and the event the replay stopped at, out of memory.
type Watched =
    ([Running; 4], u64, Option<(u64, u64)>, Option<Captured>, Option<(u64, u64)>, LayoutMeasures, Option<u64>);

fn finish(
    trace: &Trace,
    at: At,
    result: ReplayResult,
    (runs, samples, peak, moment, last_seen, peak_m, stopped_at): Watched,
    peak_segments: &[SegmentView],
    bounds: &whatif::Bounds,
) -> Result<FragReport> {
    let path = &trace.path;
    let first_oom = trace.facts.fatal_oom().map(|o| o.event);
    let (peak_event, peak_time_ns) = peak.unwrap_or((0, 0));
    // The layout at the peak is borrowed (a caller may hold it for other uses too).
    let (moment_event, moment_time_ns, moment_segments): (u64, u64, std::borrow::Cow<'_, [SegmentView]>) =
        match (at, moment) {
            (At::Peak, _) => (peak_event, peak_time_ns, std::borrow::Cow::Borrowed(peak_segments)),
            (_, Some(m)) => (m.event, m.time_ns, std::borrow::Cow::Owned(m.segments)),
            (At::Oom, None) => bail!("{}", OomMoment::missing(trace)),
            (At::End, None) | (At::Event(_), None) => {
                // The replay stopped (at an OOM) before the requested event.
                let (e, t) = last_seen.unwrap_or((0, 0));
                bail!(
                    "{}: the replay stopped at event {e} ({} ns) before the requested moment; try --at oom",
                    path.display(),
                    t
                )
            }
        };
    let mm = LayoutMeasures::of(&moment_segments);
    let failed_request = match result.outcome {
        Outcome::Oom { event, requested_bytes, alloc_bytes, .. } if event == moment_event => Some(FailedRequest {
            event,
            requested_bytes,
            alloc_bytes,
            largest_free_bytes: mm.largest_free_bytes,
            headroom_bytes: result.capacity_bytes.map(|c| c.saturating_sub(mm.reserved_bytes)),
        }),
        _ => None,
    };
    let n = samples.max(1) as f64;
    let defs: [(&str, &str, f64, u64, f64); 4] = [
        (
            "reserved_vs_allocated",
            "1 - allocated / reserved: share of reserved memory that no live block holds",
            mm.reserved_vs_allocated(),
            mm.reserved_unallocated_bytes(),
            peak_m.reserved_vs_allocated(),
        ),
        (
            "contiguity",
            "1 - largest free block / total free: near 1, free memory is only in pieces",
            mm.contiguity(),
            mm.largest_free_bytes,
            peak_m.contiguity(),
        ),
        (
            "internal",
            "rounding slack inside allocated blocks (block - requested), share of reserved",
            mm.internal(),
            mm.internal_bytes,
            peak_m.internal(),
        ),
        (
            "external",
            "free blocks inside segments (cached, not handed out), share of reserved",
            mm.external(),
            mm.free_bytes,
            peak_m.external(),
        ),
    ];
    let measures = defs
        .iter()
        .zip(runs.iter())
        .map(|(&(name, definition, at_moment, at_moment_bytes, at_peak), r)| Measure {
            name,
            definition,
            at_moment,
            at_moment_bytes,
            at_peak,
            mean: r.sum / n,
            max: r.max,
            max_event: r.max_event,
        })
        .collect();
    let plan = PlanGap {
        peak_reserved_bytes: result.peak_reserved_bytes,
        live_requested_peak_bytes: bounds.live_requested_peak_bytes,
        offline_plan_bytes: bounds.offline_plan_bytes,
        gap: bounds.offline_plan_bytes.map(|p| ratio_complement(p, result.peak_reserved_bytes)),
        note: bounds.offline_plan_note.clone().or_else(|| {
            result
                .is_oom()
                .then(|| "the plan includes the request that failed (the program needs it to go on)".to_string())
        }),
    };
    Ok(FragReport {
        trace: path.display().to_string(),
        alloc_conf: result.alloc_conf.clone(),
        capacity_bytes: result.capacity_bytes,
        capacity_source: result.capacity_source,
        replay_outcome: result.outcome.clone(),
        used_recorded_addresses: result.used_recorded_addresses,
        segments_at_recorded_addresses: result.segments_at_recorded_addresses,
        segments_placed_by_rule: result.segments_placed_by_rule,
        events: result.events,
        samples,
        measures,
        plan,
        moment: Moment {
            at,
            event: moment_event,
            replay_stopped: stopped_at == Some(moment_event),
            time_ns: moment_time_ns,
            measures: mm,
            failed_request,
            segments: moment_segments.iter().map(SegmentMap::of).collect(),
        },
        peak_event,
        anomalies: result.anomalies,
        input_damage: result.input_damage.clone(),
        recorded_oom_event: first_oom,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use recorder::engine::BlockView;

    fn seg(addr: u64, blocks: &[(u64, bool, u64)]) -> SegmentView {
        let mut a = addr;
        let blocks: Vec<BlockView> = blocks
            .iter()
            .map(|&(bytes, allocated, requested)| {
                let b = BlockView {
                    addr: a,
                    bytes,
                    allocated,
                    requested_bytes: requested,
                    pending_free: false,
                    in_private_pool: false,
                };
                a += bytes;
                b
            })
            .collect();
        SegmentView {
            addr,
            bytes: blocks.iter().map(|b| b.bytes).sum(),
            pool: Pool::Large,
            pool_id: [0, 0],
            stream: 0,
            is_expandable: false,
            blocks,
        }
    }

    /// The figures the engine keeps equal those of a walk of its blocks, after every record of
    /// every shipped trace (both configurations of each): the over-time measures are exact.
    #[test]
    fn occupancy_equals_the_walk_on_every_shipped_trace() {
        let paths = crate::shipped_traces();
        let mut checked = 0u64;
        for p in &paths {
            let trace = Trace::open(p).unwrap();
            for conf in [None, Some("expandable_segments:True,max_split_size_mb:64")] {
                let o = ReplayOptions {
                    config: conf.map(|c| recorder::engine::config::AllocatorConfig::parse(c).unwrap()),
                    ..Default::default()
                };
                replay_observed(&trace, &o, &mut |i, _, view: &dyn EngineView, _| {
                    let walk = view.layout();
                    let quick = LayoutMeasures::of_occupancy(&view.occupancy());
                    let fields = |m: &LayoutMeasures| {
                        [
                            m.reserved_bytes,
                            m.allocated_bytes,
                            m.requested_bytes,
                            m.pending_free_bytes,
                            m.free_bytes,
                            m.internal_bytes,
                            m.largest_free_bytes,
                        ]
                    };
                    assert_eq!(fields(&quick), fields(&walk), "{} ({conf:?}) after event {i}", p.display());
                    checked += 1;
                })
                .unwrap();
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    #[test]
    fn measures_of_a_checkerboard() {
        // Two 20 MiB segments: A F A F A, and one wholly free.
        let mib = 1 << 20;
        let s1 = seg(
            0,
            &[(4 * mib, true, 4 * mib - 100), (4 * mib, false, 0), (4 * mib, true, 4 * mib), (8 * mib, false, 0)],
        );
        let s2 = seg(1 << 30, &[(20 * mib, false, 0)]);
        let m = LayoutMeasures::of(&[s1.clone(), s2]);
        assert_eq!(m.reserved_bytes, 40 * mib);
        assert_eq!(m.allocated_bytes, 8 * mib);
        assert_eq!(m.free_bytes, 32 * mib);
        assert_eq!(m.largest_free_bytes, 20 * mib);
        assert_eq!(m.internal_bytes, 100);
        assert_eq!(m.releasable_bytes, 20 * mib);
        assert!((m.reserved_vs_allocated() - 0.8).abs() < 1e-9);
        assert!((m.contiguity() - (1.0 - 20.0 / 32.0)).abs() < 1e-9);
        // reserved = allocated + free (no pending blocks here).
        assert_eq!(m.allocated_bytes + m.free_bytes, m.reserved_bytes);
        let map = SegmentMap::of(&s1);
        assert_eq!(map.blocks.len(), 4);
        assert_eq!(map.largest_free_bytes, 8 * mib);
    }

    #[test]
    fn equal_blocks_compress_into_runs() {
        let s = seg(0, &[(4, true, 4), (4, true, 4), (4, false, 0), (4, true, 4)]);
        let map = SegmentMap::of(&s);
        assert_eq!(
            map.blocks,
            vec![
                BlockRun { state: "allocated", bytes: 4, count: 2 },
                BlockRun { state: "free", bytes: 4, count: 1 },
                BlockRun { state: "allocated", bytes: 4, count: 1 }
            ]
        );
    }
}
