//! Leaks: what is still live at the end, what grows from one iteration to the next, and which
//! live blocks keep reserved memory from being released.
//!
//! Call sites are named by their innermost *user* frame ([`crate::model::sites`]): frames from
//! the Python standard library, site-packages and PyTorch's own sources are skipped, so a tensor
//! made inside `torch/nn/modules/linear.py` for `out = m(x)` is charged to the line `out = m(x)`.
//!
//! Growth is measured at the same phase of successive iterations. The iterations come from
//! `Mark{Iteration}` events, else an annotation that repeats (e.g. PyTorch's
//! `Optimizer.zero_grad ... START`), by the one rule of [`crate::model::iterations`]; else from
//! the period of the request stream. The period is found
//! by autocorrelation of the allocation signatures (call site, size): the smallest shift `p` at
//! which `sig[i] == sig[i + p]` for nearly as many `i` as the best shift. Worked example: the
//! stream `a b c a b c a b c` matches itself everywhere at shifts 3 and 6; the smallest, 3, is
//! the period. Live bytes per call site are sampled before every `p`-th allocation from the
//! first position where the pattern repeats.
//!
//! Retention: a segment can go back to the device only when every block in it is free. A graph
//! call site -> segment (petgraph), whose edges carry the site's live blocks in the segment,
//! answers which blocks pin which segments, and what `empty_cache()` would free now, and if a
//! call site released its blocks.
//!
//! Memory: live allocations, call sites, one sample of per-site live bytes per iteration, and
//! (for the period search only) one signature per allocation, at most [`MAX_SIGNATURES`].

use crate::model::iterations::{IterationFold, IterationSource, Iterations};
use crate::model::layout::LayoutMeasures;
use crate::model::sites::{Site, Sites};
use crate::model::{Damage, Trace};
use crate::replay::{replay_observed, EngineView, LiveMap, ReplayOptions};
use anyhow::{bail, Result};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction;
use recorder::engine::SegmentView;
use recorder::trace::{Event, Record};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Allocation signatures kept for the period search (16 bytes each, plus 8 for the index).
pub const MAX_SIGNATURES: usize = 1 << 20;
/// The autocorrelation looks at this many signatures (from the start).
pub const PERIOD_WINDOW: usize = 20_000;
/// A period is accepted when at least this share of signatures repeat at that shift.
pub const PERIOD_MIN_SCORE: f64 = 0.6;
/// A period of the request stream is taken as an iteration only when it covers at least this
/// many allocations, not all alike: a stream of equal single allocations repeats with period 1,
/// and 460 of them are not 460 iterations.
pub const MIN_PERIOD_ALLOCS: usize = 3;
/// Growth is a leak only over at least this many whole iterations (steps between samples), and
/// rising in most of them.
pub const MIN_GROWTH_INTERVALS: usize = 3;

/// Live allocations of one site.
#[derive(Debug, Clone, Serialize)]
pub struct SiteLive {
    pub site: Site,
    pub count: u64,
    pub requested_bytes: u64,
    /// Events since the oldest of them was allocated.
    pub oldest_age_events: u64,
    pub oldest_age_ns: u64,
}

/// Growth of one site per iteration.
#[derive(Debug, Clone, Serialize)]
pub struct SiteGrowth {
    pub site: Site,
    /// Median change of its live bytes from one iteration to the next.
    #[serde(serialize_with = "crate::model::units::whole_bytes")]
    pub per_iteration_bytes: f64,
    pub per_iteration_count: f64,
    /// Intervals in which its live bytes rose.
    pub rising_intervals: usize,
    pub intervals: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Growth {
    /// Where the iterations came from.
    pub source: String,
    /// Event indices at which live bytes were sampled (same phase of successive iterations).
    pub boundaries: Vec<u64>,
    /// Live requested bytes at each boundary.
    pub live_bytes: Vec<u64>,
    /// What live bytes grow by from one iteration to the next ([`growth_step`]).
    #[serde(serialize_with = "crate::model::units::whole_bytes")]
    pub per_iteration_bytes: f64,
    /// Sites whose live bytes grew, largest growth first.
    pub sites: Vec<SiteGrowth>,
    /// Live bytes added in the first iteration beyond the steady median: one-time state (the
    /// optimizer's state made on its first step, lazily built caches), not a leak.
    pub one_time_bytes: u64,
}

/// Steady growth is told over at least this many iterations ([`Growth::is_steady`]).
pub const MIN_STEADY_ITERATIONS: usize = 3;

impl Growth {
    /// The iterations the growth is measured over: the steps between its samples.
    pub fn iterations(&self) -> usize {
        self.live_bytes.len().saturating_sub(1)
    }

    /// The share of the iterations in which live bytes rose.
    pub fn rising_share(&self) -> f64 {
        if self.live_bytes.len() < 2 {
            return 0.0;
        }
        let up = self.live_bytes.windows(2).filter(|w| w[1] > w[0]).count();
        up as f64 / (self.live_bytes.len() - 1) as f64
    }

    /// Growth that is steady: live bytes rise in at least three iterations of four, over three
    /// iterations at least, by a positive amount per iteration (a leak, or growth the program
    /// lets go by the end), not one-time state or noise. Two iterations cannot tell growth from
    /// state that an optimizer's first step makes once. The one rule for "memory grows every
    /// iteration", in every output.
    pub fn is_steady(&self) -> bool {
        self.iterations() >= MIN_STEADY_ITERATIONS && self.per_iteration_bytes > 0.0 && self.rising_share() >= 0.75
    }

    /// The growth up to `event` (a failure part way through the trace): the samples at or before
    /// it, and the growth per iteration over them; `None` where fewer than three remain. The
    /// sites keep their figures over the whole trace.
    pub fn before(self, event: u64) -> Option<Growth> {
        let n = self.boundaries.partition_point(|&b| b <= event);
        if n == self.boundaries.len() {
            return Some(self);
        }
        if n < 3 {
            return None;
        }
        let live_bytes = self.live_bytes[..n].to_vec();
        let per_iteration_bytes = total_step(&live_bytes);
        Some(Growth { boundaries: self.boundaries[..n].to_vec(), live_bytes, per_iteration_bytes, ..self })
    }
}

/// A live block and the segment it keeps.
#[derive(Debug, Clone, Serialize)]
pub struct PinningBlock {
    pub site: Site,
    pub block_bytes: u64,
    pub requested_bytes: u64,
    pub segment_addr: u64,
    pub segment_bytes: u64,
    /// The only live block in its segment: freeing it alone would make the segment releasable.
    pub alone: bool,
}

/// What a site's live blocks keep reserved.
#[derive(Debug, Clone, Serialize)]
pub struct SitePin {
    pub site: Site,
    pub blocks: u64,
    pub block_bytes: u64,
    pub segments_touched: u64,
    /// Segments whose every live block comes from this site.
    pub segments_pinned: u64,
    pub pinned_segment_bytes: u64,
    /// What `empty_cache()` would free if this site released its blocks.
    pub empty_cache_if_released_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Retention {
    pub event: u64,
    /// Which moment `event` is: `oom` (the OOM moment, where the replay has one), `end` (the
    /// replay's last event), `event` (the one asked for) or, in `explain`, `peak`.
    pub moment: &'static str,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// Whole free segments: what `empty_cache()` frees now.
    pub empty_cache_now_bytes: u64,
    /// Sites ranked by the reserved bytes they alone pin.
    pub sites: Vec<SitePin>,
    /// Live blocks ranked by the segment bytes they pin alone, then by segment size.
    pub blocks: Vec<PinningBlock>,
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LeaksReport {
    pub trace: String,
    pub events: u64,
    pub live_at_end_count: u64,
    pub live_at_end_bytes: u64,
    /// Live allocations at the end grouped by site, most bytes first.
    pub live_at_end: Vec<SiteLive>,
    pub growth: Option<Growth>,
    pub growth_note: Option<String>,
    pub retention: Retention,
    pub input_damage: Option<Damage>,
}

#[derive(Debug, Clone, Default)]
pub struct LeaksOptions {
    /// Event after which to analyse retention; `None` = the end (or the replay's OOM).
    pub at_event: Option<u64>,
}

/// What the first pass collects.
struct Pass1<'a> {
    /// The trace's call sites ([`crate::model::Facts::sites`]).
    sites: &'a Sites,
    /// id -> (site, requested, event, time)
    live: crate::model::ids::IdMap<(usize, u64, u64, u64)>,
    /// (event index, call site, requested bytes) per allocation, capped.
    signatures: Vec<(u64, u32, u64)>,
    events: u64,
    last_time_ns: u64,
    damage: Option<Damage>,
}

fn pass1(trace: &Trace) -> Result<Pass1<'_>> {
    let mut p = Pass1::new(trace);
    let scanned = trace.scan(|i, r| p.observe(i, r))?;
    p.events = scanned.events;
    Ok(p)
}

impl<'a> Pass1<'a> {
    fn new(trace: &'a Trace) -> Pass1<'a> {
        Pass1 {
            sites: &trace.facts.sites,
            live: Default::default(),
            signatures: Vec::new(),
            events: 0,
            last_time_ns: 0,
            damage: trace.damage(),
        }
    }

    #[inline]
    fn observe(&mut self, i: u64, r: &Record) {
        let p = self;
        p.last_time_ns = r.time_ns;
        match &r.event {
            Event::Alloc { id, requested_bytes, callsite, .. } => {
                p.live.insert(*id, (p.sites.of(*callsite), *requested_bytes, i, r.time_ns));
                if p.signatures.len() < MAX_SIGNATURES {
                    p.signatures.push((i, *callsite, *requested_bytes));
                }
            }
            Event::FreeCompleted { id, .. } => {
                p.live.remove(id);
            }
            Event::FreeRequested { .. }
            | Event::Mark { .. }
            | Event::CallSite { .. }
            | Event::SegmentAlloc { .. }
            | Event::SegmentFree { .. }
            | Event::SegmentMap { .. }
            | Event::SegmentUnmap { .. }
            | Event::Split { .. }
            | Event::Merge { .. }
            | Event::CacheRelease { .. }
            | Event::Oom { .. }
            | Event::Snapshot { .. }
            | Event::DeviceMemInfo { .. }
            | Event::Dropped { .. }
            | Event::SegmentPool { .. } => {}
        }
    }
}

/// [`fold`]'s first pass, for a pass over the records that carries other folds too: feed it
/// every record, then [`LeaksFold::finish`].
pub struct LeaksFold<'a>(Pass1<'a>);

impl crate::model::Fold for LeaksFold<'_> {
    #[inline]
    fn observe(&mut self, i: u64, r: &Record) {
        self.0.observe(i, r)
    }
}

impl<'a> LeaksFold<'a> {
    pub fn new(trace: &'a Trace) -> Self {
        LeaksFold(Pass1::new(trace))
    }
    /// The folds, after `events` records (the growth's pass, where the trace has iterations).
    pub fn finish(mut self, trace: &Trace, events: u64) -> Result<LeaksFolds> {
        self.0.events = events;
        folds_of(trace, self.0)
    }
}

/// The period of a signature sequence and where it starts repeating: `(period, start)`.
pub fn detect_period<T: Eq + std::hash::Hash>(sig: &[T]) -> Option<(usize, usize)> {
    let n = sig.len().min(PERIOD_WINDOW);
    if n < 6 {
        return None;
    }
    // Each signature as a small number, in order of first appearance: scoring a period compares
    // two slices of numbers, which the compiler vectorizes (the window's scores are about n^2/3
    // comparisons).
    let mut ids: HashMap<&T, u32> = HashMap::new();
    let s: Vec<u32> = sig[..n]
        .iter()
        .map(|t| {
            let next = ids.len() as u32;
            *ids.entry(t).or_insert(next)
        })
        .collect();
    let scores: Vec<(usize, f64)> = (1..=n / 3)
        .map(|p| {
            let matches: usize = s[..n - p].iter().zip(&s[p..]).map(|(a, b)| usize::from(a == b)).sum();
            (p, matches as f64 / (n - p) as f64)
        })
        .collect();
    let best = scores.iter().map(|&(_, x)| x).fold(0.0, f64::max);
    if best < PERIOD_MIN_SCORE {
        return None;
    }
    let (period, _) = *scores.iter().find(|&&(_, x)| x >= best - 0.05)?;
    // The first position from which one whole period repeats exactly, with different requests
    // in it: a run of alike requests (blocks rebuilt from a snapshot's segments where its ring
    // buffer dropped the oldest entries) repeats at every period and is not the pattern. Where
    // only such runs repeat, the first of them (the caller finds it too much alike).
    let repeats = |i: usize| s[i..i + period] == s[i + period..i + 2 * period];
    let alike = |i: usize| all_alike(&s[i..i + period]);
    let positions = 0..n.saturating_sub(2 * period);
    let start =
        positions.clone().find(|&i| repeats(i) && !alike(i)).or_else(|| positions.clone().find(|&i| repeats(i)))?;
    Some((period, start))
}

/// Whether every request of `s` is the same one: a run of alike requests repeats at any period
/// and is no pattern of an iteration.
fn all_alike<T: PartialEq>(s: &[T]) -> bool {
    s.iter().all(|x| s.first() == Some(x))
}

/// When the repetition at `period` is an inner loop: the allocation (index into `sig`) at the
/// start of each outer iteration.
///
/// A loop over batches of varying shapes whose body runs an inner loop (a model's layers)
/// repeats with the inner loop's period, in stretches: the layers of one batch repeat exactly,
/// then the next batch's sizes differ, and the repetition breaks until its layers repeat
/// again. Each stretch where the pattern repeats for at least a whole period is one outer
/// iteration, when the stretches differ from one to the next (other shapes); stretches alike
/// are one loop interrupted (a stray allocation) and are joined. Worked example, inner period
/// 2: `e a b a b a b | e c d c d c d | e f g f g f g` repeats in three stretches of other sizes:
/// three iterations, not nine. `None` with fewer than 3 such stretches.
pub fn outer_loop<T: PartialEq>(sig: &[T], period: usize) -> Option<Vec<usize>> {
    if period == 0 || sig.len() <= period {
        return None;
    }
    // Stretches [a, b) where sig[i] == sig[i + period], at least one period long.
    let mut stretches: Vec<(usize, usize)> = Vec::new();
    let mut from: Option<usize> = None;
    for i in 0..=sig.len() - period {
        let repeats = i < sig.len() - period && sig[i] == sig[i + period];
        match (repeats, from) {
            (true, None) => from = Some(i),
            (false, Some(a)) => {
                if i - a >= period {
                    stretches.push((a, i));
                }
                from = None;
            }
            _ => {}
        }
    }
    let mut starts: Vec<usize> = Vec::new();
    let mut previous: Option<usize> = None;
    // A run of alike requests repeats at every period and is no iteration (blocks rebuilt from a
    // snapshot's segments where its ring buffer dropped the oldest entries).
    for (a, _) in stretches.into_iter().filter(|&(a, _)| !all_alike(&sig[a..a + period])) {
        // The same pattern as the previous stretch, at any phase.
        let same = previous.is_some_and(|b| (0..period).any(|k| sig[a..a + period] == sig[b + k..b + k + period]));
        if !same {
            starts.push(a);
        }
        previous = Some(a);
    }
    (starts.len() >= 3).then_some(starts)
}

/// The iteration boundaries (event indices) and where they came from, or why there are none.
type Boundaries = (Option<(String, Vec<u64>)>, Option<String>);

/// [`boundaries`] where the marks or a repeated annotation decide them (the one rule of every
/// analysis, folded when the trace was read): no fold of the records needed. `None` where the
/// period of the request stream must decide.
fn boundaries_by_marks(iterations: &IterationFold) -> Option<Boundaries> {
    match iterations.iterations() {
        Some(Iterations { source: IterationSource::Marks, starts }) if starts.len() < 3 => Some((
            None,
            Some(format!(
                "{}: too few to measure growth (at least 3)",
                crate::model::units::count(starts.len() as u64, "iteration mark")
            )),
        )),
        Some(Iterations { source: IterationSource::Marks, starts }) => {
            Some((Some((IterationSource::Marks.to_string(), starts)), None))
        }
        Some(Iterations { source: IterationSource::Annotation(text), starts }) if starts.len() >= 3 => {
            let source = IterationSource::Annotation(text);
            Some((Some((format!("{source}, which repeats {} times", starts.len()), starts)), None))
        }
        // Fewer than three from annotations: the period of the request stream.
        _ => None,
    }
}

/// Picks the iteration boundaries (event indices) and says where they came from.
fn boundaries(iterations: &IterationFold, p: &Pass1) -> Boundaries {
    if let Some(b) = boundaries_by_marks(iterations) {
        return b;
    }
    let found = iterations.iterations();
    // What the marks gave, where they gave too few iterations (the notes below say it).
    let too_few = found.as_ref().map(|it| {
        format!(
            "{} from {}, too few to measure growth (at least 3)",
            crate::model::units::count(it.starts.len() as u64, "iteration"),
            it.source
        )
    });
    let marked = too_few.clone().unwrap_or_else(|| "no iteration marks and no repeated annotation".into());
    let unmarked = too_few.clone().unwrap_or_else(|| "no iteration marks".into());
    let sig: Vec<(u32, u64)> = p.signatures.iter().map(|&(_, c, b)| (c, b)).collect();
    match detect_period(&sig) {
        Some((period, start))
            if period < MIN_PERIOD_ALLOCS || all_alike(&sig[start..(start + period).min(sig.len())]) =>
        {
            (
                None,
                Some(format!(
                    "{marked}; the allocation pattern repeats every {period} allocation(s), \
too few, or too much alike, to be an iteration (at least {MIN_PERIOD_ALLOCS} different requests)"
                )),
            )
        }
        Some((period, start)) => {
            if let Some(runs) = outer_loop(&sig, period) {
                let source = format!(
                    "an outer loop: a pattern of {period} allocation(s) (call site and size) repeats in {} stretches, each \
with other sizes (an inner loop, such as a model's layers, run for every batch of other shapes, and once to build the \
model); {unmarked}",
                    runs.len()
                );
                return (Some((source, runs.iter().map(|&k| p.signatures[k].0).collect())), None);
            }
            let b: Vec<u64> = (start..p.signatures.len()).step_by(period).map(|k| p.signatures[k].0).collect();
            if b.len() >= 3 {
                let source = format!(
                    "a repeating pattern of {period} allocation(s) (call site and size) from allocation {start}; {unmarked}"
                );
                (Some((source, b)), None)
            } else {
                (
                    None,
                    Some(format!("the allocation pattern repeats every {period} allocations, but fewer than 3 times")),
                )
            }
        }
        None => (
            None,
            Some(match too_few {
                Some(t) => format!("{t}, and no periodic allocation pattern"),
                None => "no iteration marks, no repeated annotation and no periodic allocation pattern".into(),
            }),
        ),
    }
}

/// Samples live requested bytes per site before each boundary event.
fn growth(trace: &Trace, p: &Pass1, source: String, bounds: Vec<u64>) -> Result<Growth> {
    let mut live: crate::model::ids::IdMap<(usize, u64)> = Default::default();
    let mut per_site: Vec<(i64, i64)> = vec![(0, 0); p.sites.sites.len()];
    let mut samples: Vec<Vec<(i64, i64)>> = Vec::with_capacity(bounds.len());
    let mut next = 0usize;
    trace.scan(|i, r| {
        while next < bounds.len() && bounds[next] == i {
            samples.push(per_site.clone());
            next += 1;
        }
        match &r.event {
            Event::Alloc { id, requested_bytes, callsite, .. } => {
                let s = p.sites.of(*callsite);
                live.insert(*id, (s, *requested_bytes));
                per_site[s].0 += 1;
                per_site[s].1 += *requested_bytes as i64;
            }
            Event::FreeCompleted { id, .. } => {
                if let Some((s, b)) = live.remove(id) {
                    per_site[s].0 -= 1;
                    per_site[s].1 -= b as i64;
                }
            }
            _ => {}
        }
    })?;
    let bounds: Vec<u64> = bounds[..samples.len()].to_vec();
    let mut sites: Vec<SiteGrowth> = (0..p.sites.sites.len())
        .filter_map(|s| {
            let bytes: Vec<i64> = samples.iter().map(|v| v[s].1).collect();
            let counts: Vec<i64> = samples.iter().map(|v| v[s].0).collect();
            // The first step is left out when there are enough (one-time state: an optimizer's
            // first step, a lazily built cache). Growth must rise in most of the rest, over at
            // least MIN_GROWTH_INTERVALS of them, and persist: the net change over the window at
            // least half of what the median step adds (live bytes that only oscillate, as with a
            // batch size that varies, have a positive median step but no net growth).
            let window = growth_window(&bytes);
            let intervals = window.len().saturating_sub(1);
            let rising = window.windows(2).filter(|w| w[1] > w[0]).count();
            let per_iteration_bytes = growth_step(window);
            let net = window.last().copied().unwrap_or(0) - window.first().copied().unwrap_or(0);
            let persists = 2.0 * net as f64 >= per_iteration_bytes * intervals as f64;
            (per_iteration_bytes > 0.0 && intervals >= MIN_GROWTH_INTERVALS && 2 * rising > intervals && persists).then(
                || SiteGrowth {
                    site: p.sites.sites[s].clone(),
                    per_iteration_bytes,
                    per_iteration_count: median_step(&counts),
                    rising_intervals: rising,
                    intervals,
                },
            )
        })
        .collect();
    sites.sort_by(|a, b| b.per_iteration_bytes.total_cmp(&a.per_iteration_bytes).then(a.site.cmp(&b.site)));
    let live_bytes: Vec<u64> =
        samples.iter().map(|v| v.iter().fold(0u64, |a, x| a.saturating_add(x.1.max(0) as u64))).collect();
    let (per_iteration_bytes, one_time_bytes) = total_growth(&live_bytes);
    Ok(Growth { source, boundaries: bounds, live_bytes, per_iteration_bytes, sites, one_time_bytes })
}

/// What live bytes grow by per iteration ([`total_step`]), and the one-time state added in the
/// first iteration: where the first step is more than twice the steady rate of the steps after
/// it, it is one-time state (an optimizer's first step), and the rate is the steps' after it. On
/// a short run this matters: 64 MiB, 161 MiB, 161 MiB is 97 MiB made once, not a growth of
/// 48.5 MiB an iteration (the median of its two steps).
fn total_growth(live_bytes: &[u64]) -> (f64, u64) {
    let per_iteration = total_step(live_bytes);
    let [a, b, _, ..] = live_bytes else { return (per_iteration, 0) };
    let after: Vec<i64> = live_bytes[1..].iter().map(|&x| x as i64).collect();
    // On a long run this is `per_iteration` itself, which leaves the first step out already.
    let steady = growth_step(&after);
    let first = *b as f64 - *a as f64;
    if first > 2.0 * steady.max(0.0) {
        (steady, (first - steady.max(0.0)) as u64)
    } else {
        (per_iteration, 0)
    }
}

/// What the live bytes sampled at each iteration grow by per iteration: [`growth_step`] over
/// their [`growth_window`], as each site's growth is measured.
fn total_step(live_bytes: &[u64]) -> f64 {
    let live: Vec<i64> = live_bytes.iter().map(|&b| b as i64).collect();
    growth_step(growth_window(&live))
}

/// The samples growth is measured over: without the first step where there are enough (one-time
/// state: an optimizer's first step, a lazily built cache).
fn growth_window(v: &[i64]) -> &[i64] {
    if v.len() > MIN_GROWTH_INTERVALS + 1 {
        &v[1..]
    } else {
        v
    }
}

/// What live bytes grow by per iteration over `window`: the median step, so that a jump now and
/// then does not count as growth, but, where it is growth, no more than the trend (the
/// least-squares slope). Live bytes that rise by a large step most iterations and drop every few
/// (a sawtooth: a site that frees what it kept every eighth iteration) grow by the trend, about
/// 8 MiB an iteration, not by the 56 MiB rise; the slope, unlike the change from first to last,
/// does not swing with where in its cycle the window ends.
pub fn growth_step(window: &[i64]) -> f64 {
    let median = median_step(window);
    let n = window.len();
    // Only growth is capped: live bytes that do not grow keep their median step.
    if n < 2 || median <= 0.0 {
        return median;
    }
    let mid = (n - 1) as f64 / 2.0;
    let mean = window.iter().map(|&y| y as f64).sum::<f64>() / n as f64;
    let (mut cov, mut var) = (0.0, 0.0);
    for (i, &y) in window.iter().enumerate() {
        let dx = i as f64 - mid;
        cov += dx * (y as f64 - mean);
        var += dx * dx;
    }
    median.min(cov / var)
}

/// The median change from one sample to the next: a warm-up iteration (optimizer state made
/// on the first step) does not count as growth, a steady leak does.
pub fn median_step(v: &[i64]) -> f64 {
    let mut d: Vec<i64> = v.windows(2).map(|w| w[1] - w[0]).collect();
    if d.is_empty() {
        return 0.0;
    }
    d.sort_unstable();
    let n = d.len();
    if n % 2 == 1 {
        d[n / 2] as f64
    } else {
        (d[n / 2 - 1] + d[n / 2]) as f64 / 2.0
    }
}

/// The layout and the live blocks' sites at one moment of a replay.
pub struct Held {
    pub event: u64,
    pub segments: Vec<SegmentView>,
    /// Block address -> site index, for live (allocated or pending) blocks.
    pub site_of_block: HashMap<u64, usize>,
}

/// What `leaks` watches in the replay under the recorded settings: the layout and the live
/// blocks' call sites after `at` (without one: at the OOM the program did not survive, else at
/// the end).
pub struct HeldWatch {
    at: Option<u64>,
    events: u64,
    callsite_of: crate::model::ids::CallsiteOf,
    moments: crate::analysis::moment::Moments,
    held: Option<Taken>,
    /// Which moment the layout was taken at ([`Retention::moment`]).
    kind: &'static str,
}

/// The event, the segments, and each live block's address and call site id.
type Taken = (u64, Vec<SegmentView>, Vec<(u64, u32)>);

impl HeldWatch {
    pub fn new(at: Option<u64>, events: u64) -> Self {
        HeldWatch { at, events, callsite_of: Default::default(), moments: Default::default(), held: None, kind: "end" }
    }

    pub fn observe(&mut self, trace: &Trace, i: u64, r: &Record, view: &dyn EngineView, live: &LiveMap) {
        match &r.event {
            Event::Alloc { id, callsite, .. } => {
                self.callsite_of.alloc(*id, *callsite);
            }
            Event::FreeCompleted { id, .. } => {
                self.callsite_of.free(*id);
            }
            _ => {}
        }
        // Without a given event: at the OOM moment (not an OOM the program caught), else at the
        // end of the replay (`analysis::moment` decides both).
        let passing = self.moments.observe(trace, i, r, view);
        let kind = match self.at {
            Some(e) => (i == e).then_some("event"),
            None if passing.oom => Some("oom"),
            None => passing.end.then_some("end"),
        };
        if let Some(kind) = kind.filter(|_| self.held.is_none()) {
            let blocks = live.iter().map(|(id, addr)| (*addr, self.callsite_of.get(*id))).collect();
            self.held = Some((i, view.segments(), blocks));
            self.kind = kind;
        }
    }

    /// The replay is over: the map of live allocations' call sites is let go (the layout taken
    /// keeps its blocks' own).
    pub fn replayed(mut self) -> Self {
        self.callsite_of = Default::default();
        self
    }

    /// The layout taken, its blocks named by `sites` (the trace's sites).
    pub fn finish(self, trace: &Trace) -> Result<Held> {
        let sites = &trace.facts.sites;
        match self.held {
            Some((event, segments, blocks)) => Ok(Held {
                event,
                segments,
                site_of_block: blocks.into_iter().map(|(addr, cs)| (addr, sites.of(cs))).collect(),
            }),
            // A trace with no events (one damaged before its first frame ended): nothing is held.
            None if self.events == 0 => Ok(Held { event: 0, segments: Vec::new(), site_of_block: HashMap::new() }),
            None => bail!(
                "{}: the replay stopped (out of memory) before event {}",
                trace.path.display(),
                self.at.unwrap_or(self.events.saturating_sub(1))
            ),
        }
    }
}

/// How many of the blocks pinning segments [`retention`] lists.
const PINNING_BLOCKS: usize = 20;

#[derive(Debug, Clone)]
enum Node {
    Site,
    Segment { bytes: u64 },
}

/// An edge site -> segment: the live blocks of that site in that segment.
#[derive(Debug, Clone, Copy, Default)]
struct Holds {
    blocks: u64,
    bytes: u64,
}

/// Which live blocks pin which segments, from the graph call site -> segment, whose edges carry
/// the site's live blocks in the segment. A segment is pinned by a site when that site is its
/// only incoming edge. Walks each live block once: a layout of millions of blocks costs one
/// edge per (site, segment) pair, not a node per block.
pub fn retention(held: &Held, sites: &Sites, moment: &'static str) -> Retention {
    let mut g: DiGraph<Node, Holds> = DiGraph::new();
    let mut site_nodes: BTreeMap<usize, NodeIndex> = BTreeMap::new();
    let mut unattributed_pending = 0u64;
    // The most striking blocks first: a block alone in a big segment, small blocks before large
    // ones (then by segment address, then by a block's place in the walk below). Only the first
    // `PINNING_BLOCKS` are kept as the layout is walked: a layout of millions of live blocks
    // costs no more than that list.
    type Key = (std::cmp::Reverse<bool>, std::cmp::Reverse<u64>, u64, usize);
    // (key, site, block bytes, requested bytes, segment address, segment bytes)
    let mut top: std::collections::BinaryHeap<(Key, usize, u64, u64, u64, u64)> = std::collections::BinaryHeap::new();
    let mut order = 0usize;
    let mut empty_cache_now_bytes = 0u64;
    // This segment's edges, by site; and where each site's edge of the segment being walked is
    // in `edges` (segment number, index): constant time a block, however many sites share one
    // segment (an expandable segment holds every block of its stream).
    let mut edges: Vec<(usize, Holds)> = Vec::new();
    let mut slot: Vec<(usize, usize)> = vec![(usize::MAX, 0); sites.sites.len().max(1)];
    // A private pool's segments stay while its graph or MemPool lives, whatever their blocks:
    // neither `empty_cache()` nor freeing those blocks gives them back.
    for (seg_no, s) in held.segments.iter().filter(|s| !s.kept_by_private_pool()).enumerate() {
        let sn = g.add_node(Node::Segment { bytes: s.bytes });
        let in_seg = s.blocks.iter().filter(|b| b.allocated || b.pending_free).count();
        if in_seg == 0 {
            empty_cache_now_bytes += s.bytes;
            continue;
        }
        edges.clear();
        // The blocks from the segment's end to its start, the order the walk has always had.
        for b in s.blocks.iter().rev().filter(|b| b.allocated || b.pending_free) {
            let site = match held.site_of_block.get(&b.addr) {
                Some(&site) => site,
                None => {
                    unattributed_pending += 1;
                    0
                }
            };
            if site >= slot.len() {
                slot.resize(site + 1, (usize::MAX, 0));
            }
            match slot[site] {
                (seg, k) if seg == seg_no => {
                    edges[k].1.blocks += 1;
                    edges[k].1.bytes += b.bytes;
                }
                _ => {
                    slot[site] = (seg_no, edges.len());
                    edges.push((site, Holds { blocks: 1, bytes: b.bytes }));
                }
            }
            let key =
                (std::cmp::Reverse(in_seg == 1), std::cmp::Reverse(s.bytes.saturating_sub(b.bytes)), s.addr, order);
            order += 1;
            let entry = (key, site, b.bytes, b.requested_bytes, s.addr, s.bytes);
            if top.len() < PINNING_BLOCKS {
                top.push(entry);
            } else if top.peek().is_some_and(|t| key < t.0) {
                top.pop();
                top.push(entry);
            }
        }
        // The order of a segment's edges changes no figure: each site's are summed.
        for &(site, h) in &edges {
            let site_node = *site_nodes.entry(site).or_insert_with(|| g.add_node(Node::Site));
            g.add_edge(site_node, sn, h);
        }
    }
    let seg_bytes = |sn: NodeIndex| match g[sn] {
        Node::Segment { bytes } => bytes,
        Node::Site => 0,
    };
    let mut site_pins: Vec<SitePin> = site_nodes
        .iter()
        .map(|(&site, &node)| {
            let (mut blocks, mut block_bytes, mut touched, mut pinned, mut pinned_bytes) =
                (0u64, 0u64, 0u64, 0u64, 0u64);
            for e in g.edges_directed(node, Direction::Outgoing) {
                let sn = petgraph::visit::EdgeRef::target(&e);
                let h = e.weight();
                blocks += h.blocks;
                block_bytes += h.bytes;
                touched += 1;
                // Every live block of the segment comes from this site.
                if g.neighbors_directed(sn, Direction::Incoming).count() == 1 {
                    pinned += 1;
                    pinned_bytes += seg_bytes(sn);
                }
            }
            SitePin {
                site: sites.sites[site].clone(),
                blocks,
                block_bytes,
                segments_touched: touched,
                segments_pinned: pinned,
                pinned_segment_bytes: pinned_bytes,
                empty_cache_if_released_bytes: empty_cache_now_bytes + pinned_bytes,
            }
        })
        .collect();
    site_pins
        .sort_by(|a, b| b.pinned_segment_bytes.cmp(&a.pinned_segment_bytes).then(b.block_bytes.cmp(&a.block_bytes)));
    let blocks: Vec<PinningBlock> = top
        .into_sorted_vec()
        .into_iter()
        .map(|((alone, ..), site, block_bytes, requested, addr, bytes)| PinningBlock {
            site: sites.sites[site].clone(),
            block_bytes,
            requested_bytes: requested,
            segment_addr: addr,
            segment_bytes: bytes,
            alone: alone.0,
        })
        .collect();
    let lm = LayoutMeasures::of(&held.segments);
    let expandable = held.segments.iter().any(|s| s.is_expandable);
    let mut notes = Vec::new();
    if expandable {
        notes.push("expandable segments: empty_cache() unmaps whole free pages inside partly used ranges too; the figures count whole ranges only".to_string());
    }
    if unattributed_pending > 0 {
        notes.push(format!("{unattributed_pending} live blocks have no known allocation (charged to no call site)"));
    }
    Retention {
        event: held.event,
        moment,
        reserved_bytes: lm.reserved_bytes,
        allocated_bytes: lm.allocated_bytes,
        empty_cache_now_bytes,
        sites: site_pins,
        blocks,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    }
}

/// Live allocations grouped by site, most bytes first.
fn live_by_site(p: &Pass1) -> Vec<SiteLive> {
    let mut by: BTreeMap<usize, SiteLive> = BTreeMap::new();
    for &(site, requested, event, time) in p.live.values() {
        let e = by.entry(site).or_insert_with(|| SiteLive {
            site: p.sites.sites[site].clone(),
            count: 0,
            requested_bytes: 0,
            oldest_age_events: 0,
            oldest_age_ns: 0,
        });
        e.count += 1;
        e.requested_bytes = e.requested_bytes.saturating_add(requested);
        e.oldest_age_events = e.oldest_age_events.max(p.events.saturating_sub(event + 1));
        e.oldest_age_ns = e.oldest_age_ns.max(p.last_time_ns.saturating_sub(time));
    }
    let mut v: Vec<SiteLive> = by.into_values().collect();
    v.sort_by(|a, b| b.requested_bytes.cmp(&a.requested_bytes).then(a.site.cmp(&b.site)));
    v
}

/// The growth analysis alone (two streaming passes, no replay): used by `explain`.
pub fn growth_only(trace: &Trace) -> Result<(Option<Growth>, Option<String>)> {
    // Where the marks decide the iterations, the growth's own pass is the only one: it needs the
    // trace's sites, not the first fold (which finds a period where no marks say).
    let by_marks = boundaries_by_marks(&trace.facts.iterations);
    let p = if by_marks.is_some() { Pass1::new(trace) } else { pass1(trace)? };
    match by_marks.unwrap_or_else(|| boundaries(&trace.facts.iterations, &p)) {
        (Some((source, b)), _) => Ok((Some(growth(trace, &p, source, b)?), None)),
        (None, note) => Ok((None, note)),
    }
}

pub fn analyze(trace: &Trace, opts: &LeaksOptions) -> Result<LeaksReport> {
    analyze_watched(trace, opts, None)
}

/// [`analyze`], with the layout already watched in a replay under the recorded settings (a
/// [`HeldWatch`] made for `opts.at_event` and the trace's events), as `report` does; `None`
/// replays for it.
pub fn analyze_watched(trace: &Trace, opts: &LeaksOptions, watched: Option<HeldWatch>) -> Result<LeaksReport> {
    check_at_event(trace, opts)?;
    // The replay first: its engine is gone before the folds below keep their own live blocks.
    let watched = match watched {
        Some(w) => w,
        None => {
            let mut w = HeldWatch::new(opts.at_event, trace.events);
            replay_observed(trace, &ReplayOptions::default(), &mut |i, r, view, live| {
                w.observe(trace, i, r, view, live)
            })?;
            w
        }
    };
    finish(trace, fold(trace)?, watched)
}

/// An event to analyse retention after must be in the trace.
pub fn check_at_event(trace: &Trace, opts: &LeaksOptions) -> Result<()> {
    match opts.at_event {
        Some(e) if e >= trace.events => {
            bail!("{}: event {e} is past the end (the trace has {} events)", trace.path.display(), trace.events)
        }
        _ => Ok(()),
    }
}

/// What `leaks` folds from the trace's records alone: the live allocations at the end by site,
/// and the growth. What it kept per live allocation is let go here, so that the folds can be
/// made before or beside the replay the retention watch rides on ([`finish`] joins the two).
pub struct LeaksFolds {
    events: u64,
    live_at_end_count: u64,
    live_at_end_bytes: u64,
    live_at_end: Vec<SiteLive>,
    growth: Option<Growth>,
    growth_note: Option<String>,
    damage: Option<Damage>,
}

pub fn fold(trace: &Trace) -> Result<LeaksFolds> {
    folds_of(trace, pass1(trace)?)
}

fn folds_of(trace: &Trace, p: Pass1<'_>) -> Result<LeaksFolds> {
    let (growth, growth_note) = match boundaries(&trace.facts.iterations, &p) {
        (Some((source, b)), _) => (Some(self::growth(trace, &p, source, b)?), None),
        (None, note) => (None, note),
    };
    Ok(LeaksFolds {
        events: p.events,
        live_at_end_count: p.live.len() as u64,
        live_at_end_bytes: p.live.values().fold(0u64, |a, v| a.saturating_add(v.1)),
        live_at_end: live_by_site(&p),
        growth,
        growth_note,
        damage: p.damage.clone(),
    })
}

/// The report from the folds and the retention watch of a replay.
pub fn finish(trace: &Trace, f: LeaksFolds, watched: HeldWatch) -> Result<LeaksReport> {
    let kind = watched.kind;
    let held = watched.finish(trace)?;
    Ok(LeaksReport {
        trace: trace.path.display().to_string(),
        events: f.events,
        live_at_end_count: f.live_at_end_count,
        live_at_end_bytes: f.live_at_end_bytes,
        live_at_end: f.live_at_end,
        growth: f.growth,
        growth_note: f.growth_note,
        retention: retention(&held, &trace.facts.sites, kind),
        input_damage: f.damage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A jump in the first iteration and no change after is one-time state, whatever the number
    /// of iterations; a steady rise is growth (the DDP fixture's ranks: 64 MiB, then 161 MiB
    /// twice, read as +48.5 MiB per iteration).
    #[test]
    fn a_first_jump_then_flat_is_one_time_state() {
        const MIB: u64 = 1 << 20;
        assert_eq!(total_growth(&[64 * MIB, 161 * MIB, 161 * MIB]), (0.0, 97 * MIB));
        assert_eq!(total_growth(&[64 * MIB, 161 * MIB, 161 * MIB, 161 * MIB]), (0.0, 97 * MIB));
        assert_eq!(total_growth(&[0, 10 * MIB, 20 * MIB]), ((10 * MIB) as f64, 0));
        assert_eq!(total_growth(&[0, 100 * MIB, 110 * MIB, 120 * MIB]), ((10 * MIB) as f64, 90 * MIB));
        assert_eq!(total_growth(&[5 * MIB, 5 * MIB]), (0.0, 0));
    }

    #[test]
    fn period_of_a_repeating_stream_after_a_prologue() {
        let mut s = vec![9, 8, 7];
        for _ in 0..10 {
            s.extend([1, 2, 3, 2]);
        }
        assert_eq!(detect_period(&s), Some((4, 3)));
        assert_eq!(detect_period(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]), None);
    }

    #[test]
    fn an_inner_loop_in_batches_of_other_shapes_is_one_iteration_per_batch() {
        let mut s = Vec::new();
        for batch in 0..5u64 {
            s.push(1000);
            for _ in 0..6 {
                s.extend([10 * batch + 1, 10 * batch + 2, 10 * batch + 3]);
            }
            s.push(2000);
        }
        let (period, _) = detect_period(&s).unwrap();
        assert_eq!(period, 3, "the inner loop");
        let starts = outer_loop(&s, period).unwrap();
        assert_eq!(starts.len(), 5, "{starts:?}");
        // A plain loop (one stretch), and a loop with a stray allocation (stretches alike): no
        // outer loop.
        let plain: Vec<u64> = (0..30).map(|k| k % 4).collect();
        assert_eq!(outer_loop(&plain, 4), None);
        let mut stray: Vec<u64> = (0..40).map(|k| k % 4).collect();
        stray.insert(13, 99);
        stray.insert(29, 99);
        assert_eq!(outer_loop(&stray, 4), None);
    }

    #[test]
    fn growth_step_is_the_trend_of_a_sawtooth() {
        // +56 seven times, then -328: 64 every 8 steps, 8 a step, though the median step is 56.
        // The trend stays near 8 wherever the window ends in the cycle.
        for n in [20, 25, 30, 33] {
            let saw: Vec<i64> = (0..n).map(|k| 56 * (k % 8) + 64 * (k / 8)).collect();
            assert_eq!(median_step(&saw), 56.0);
            let g = growth_step(&saw);
            assert!((8.0..=12.0).contains(&g), "{n} samples: {g}");
        }
        // A steady leak and a warm-up jump are as the median has them.
        assert_eq!(growth_step(&[0, 12, 24, 36]), 12.0);
        assert_eq!(growth_step(&[0, 100, 100, 100]), 0.0);
    }

    #[test]
    fn median_step_ignores_a_warm_up_jump() {
        assert_eq!(median_step(&[0, 100, 100, 100]), 0.0);
        assert_eq!(median_step(&[0, 12, 24, 36]), 12.0);
        assert_eq!(median_step(&[5]), 0.0);
    }
}
