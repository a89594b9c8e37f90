//! One view across the ranks of a distributed job: each rank's trace (an alloctrace trace or a
//! PyTorch snapshot) side by side, which rank peaks and by how much, the call sites whose bytes
//! at the peak differ most between ranks, and the ranks' timelines aligned on iterations.
//!
//! * **Rank** of a trace: a `rank=R` / `rank R` note in its header, else `rank{R}`, `rank_R`
//!   or `rank-R` in the file name, else the device (`cuda{N}`, `cuda_N`, `device{N}`, `gpu{N}`)
//!   in the file name, else its position among the arguments.
//! * **Allocated** bytes are the blocks handed out; where the trace does not record block sizes
//!   (PyTorch snapshots record requests), the request rounded up to 512 bytes, as PyTorch's
//!   caching allocator rounds it.
//! * **Fragmentation at the peak**: the share of reserved bytes not allocated when reserved
//!   bytes first reached their peak.
//! * **Call sites** are named by their innermost user frame ([`crate::model::sites::site_of`]); a
//!   site's bytes on a rank are its live allocated bytes at that rank's peak of allocated bytes.
//! * **Iterations** come from the one rule of [`crate::model::iterations`] (`iteration` marks,
//!   else an annotation that repeats, names that say "iteration" preferred); else there are none
//!   and the timeline runs over the share of the trace's events. On the aligned axis,
//!   `k + f` is the fraction `f` (by events) of the way through iteration `k`; `[0, 1)` is what
//!   came before the first iteration.

use crate::model::iterations::{IterationFold, Iterations};
use crate::model::Trace;
use crate::source::summary::Peak;
use anyhow::Result;
use recorder::trace::{Event, Header};
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;

/// Points of each aligned timeline (maxima of equal runs of events).
pub const TIMELINE_POINTS: usize = 2000;
/// Call sites listed as differing between ranks.
pub const TOP_SITES: usize = 10;

/// Where a trace's rank came from.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RankSource {
    Header,
    FileName,
    Device,
    /// Its position among the arguments (nothing named a rank, or two traces named the same).
    Position,
}

/// The digits right after `key` (optionally after one of `_`, `-`, `:`, `=`, ` `) in `s`,
/// case-insensitive: `rank3`, `rank_3`, `rank-3`, `cuda:1`.
fn number_after(s: &str, key: &str) -> Option<u32> {
    let lower = s.to_ascii_lowercase();
    let mut from = 0;
    while let Some(p) = lower[from..].find(key) {
        let rest = &lower[from + p + key.len()..];
        let rest = rest.strip_prefix(['_', '-', ':', '=', ' ']).unwrap_or(rest);
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if !digits.is_empty() {
            return digits.parse().ok();
        }
        from += p + key.len();
    }
    None
}

/// A trace's rank from its header or file name (see the module documentation).
pub fn rank_of(path: &Path, header: &Header) -> Option<(u32, RankSource)> {
    if let Some(r) = header.notes.iter().find_map(|n| number_after(n, "rank")) {
        return Some((r, RankSource::Header));
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if let Some(r) = number_after(&name, "rank") {
        return Some((r, RankSource::FileName));
    }
    ["cuda", "device", "gpu"].iter().find_map(|k| number_after(&name, k)).map(|r| (r, RankSource::Device))
}

/// A request rounded as PyTorch rounds it to a block (512-byte multiples, at least 512): an
/// estimate of its block where the trace records no block sizes. The block that served it can
/// be larger (a free block not split), which only a replay tells.
fn rounded(requested: u64) -> u64 {
    requested.max(1).div_ceil(512).saturating_mul(512)
}

/// One rank's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RankRow {
    pub rank: u32,
    pub rank_source: RankSource,
    pub trace: String,
    /// `null`, or where the trace was damaged: its figures cover what came before.
    pub input_damage: Option<crate::model::Damage>,
    pub events: u64,
    pub peak_reserved: Peak,
    pub peak_allocated: Peak,
    /// Allocated bytes are the recorded block sizes (else requests rounded to 512 bytes).
    pub block_sizes_recorded: bool,
    pub ooms: u64,
    /// Share of reserved bytes not allocated at the peak of reserved bytes, as the replay under
    /// the recorded settings measures it (the request the peak's segment serves included):
    /// `frag --at peak`'s figure. (The what-if table's is at the OOM where the run has one.)
    pub fragmentation_at_peak: f64,
    /// Segment allocations and maps.
    pub device_allocs: u64,
    /// Segment frees and unmaps.
    pub device_frees: u64,
    pub iterations: usize,
    /// What the iterations were taken from: `iteration marks`, `the annotation "TEXT"`; `None`
    /// (JSON `null`) where no iterations were found.
    pub iterations_from: Option<String>,
    /// Live bytes by category at the peak of allocated bytes ([`crate::analysis::category`]); `null` when
    /// the trace gives no phases.
    pub categories_at_peak: Option<crate::analysis::category::ByCategory>,
}

/// A call site's live allocated bytes at each rank's peak (in the order of `ranks`).
#[derive(Debug, Clone, Serialize)]
pub struct SiteSpread {
    /// The call site, in the one shape of every output (matched across the ranks by label).
    pub site: crate::model::sites::Site,
    pub bytes: Vec<u64>,
    /// Largest minus smallest.
    pub spread_bytes: u64,
}

/// A rank's allocated bytes over aligned iterations: `(x, bytes)`, see the module documentation.
#[derive(Debug, Clone, Serialize)]
pub struct AlignedTimeline {
    pub rank: u32,
    pub points: Vec<(f64, u64)>,
}

/// The cross-rank view.
#[derive(Debug, Clone, Serialize)]
pub struct RanksReport {
    /// In rank order.
    pub ranks: Vec<RankRow>,
    /// The rank with the highest peak of reserved bytes (the first such).
    pub peaking_rank: u32,
    /// Its trace's position among the traces given.
    #[serde(skip)]
    pub peaking_index: usize,
    /// Highest peak over the median peak, of reserved and of allocated bytes.
    pub skew_reserved: f64,
    pub skew_allocated: f64,
    /// Call sites whose bytes at the peak differ most between ranks, largest spread first.
    pub differing_sites: Vec<SiteSpread>,
    /// True when every rank's timeline is aligned on iterations.
    pub aligned_on_iterations: bool,
    pub timelines: Vec<AlignedTimeline>,
}

/// One rank, analysed.
struct RankData {
    /// Position among the traces given.
    position: usize,
    row: RankRow,
    /// label -> (the site, its bytes at the peak)
    sites_at_peak: HashMap<String, (crate::model::sites::Site, u64)>,
    timeline: Vec<(f64, u64)>,
}

/// The iteration anchors (event indices) of a trace and where they came from
/// ([`crate::model::iterations`]).
fn anchors(fold: &IterationFold) -> (Vec<u64>, Option<String>) {
    match fold.iterations() {
        Some(Iterations { source, starts }) => (starts, Some(source.to_string())),
        None => (Vec::new(), None),
    }
}

/// The aligned coordinate of event `i` (see the module documentation).
fn aligned_x(i: u64, anchors: &[u64], events: u64) -> f64 {
    let k = anchors.partition_point(|&a| a <= i);
    let start = if k == 0 { 0 } else { anchors[k - 1] };
    let end = anchors.get(k).copied().unwrap_or(events.max(start + 1));
    k as f64 + (i - start) as f64 / (end - start).max(1) as f64
}

fn analyse(trace: &Trace, position: u32) -> Result<RankData> {
    let (rank, rank_source) = rank_of(&trace.path, &trace.header).unwrap_or((position, RankSource::Position));
    // Pass 1: peaks, fragmentation at the peak, anchors, allocated bytes per run of events.
    let events = trace.events.max(1);
    let run = events.div_ceil(TIMELINE_POINTS as u64).max(1);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut allocated = 0u64;
    let mut live: crate::model::ids::IdMap<(u64, u32)> = Default::default();
    // The peak of reserved bytes is the summary's (one rule: the request its segment was for).
    let peak_reserved = trace.summary.peak_reserved;
    let mut peak_allocated = Peak::default();
    let mut block_sizes = false;
    let (mut device_allocs, mut device_frees, mut ooms) = (0u64, 0u64, 0u64);
    trace.scan(|i, r| {
        match &r.event {
            Event::Alloc { id, requested_bytes, block_bytes, callsite, .. } => {
                block_sizes |= *block_bytes > 0;
                let b = if *block_bytes > 0 { *block_bytes } else { rounded(*requested_bytes) };
                if let Some((old, _)) = live.insert(*id, (b, *callsite)) {
                    allocated -= old;
                }
                allocated += b;
            }
            // Allocated bytes fall when the program frees (PyTorch's `allocated_bytes`, and the
            // summary's peak), not when a free waiting for other streams completes.
            Event::FreeRequested { id, .. } => {
                if let Some((b, _)) = live.remove(id) {
                    allocated -= b;
                }
            }
            Event::SegmentAlloc { .. } | Event::SegmentMap { .. } => device_allocs += 1,
            Event::SegmentFree { .. } | Event::SegmentUnmap { .. } => device_frees += 1,
            Event::Oom { .. } => ooms += 1,
            _ => {}
        }
        if allocated > peak_allocated.bytes {
            peak_allocated = Peak { bytes: allocated, event: i, time_ns: r.time_ns };
        }
        let slot = (i / run) as usize;
        if slot >= runs.len() {
            runs.push((i, allocated));
        } else {
            runs[slot].1 = runs[slot].1.max(allocated);
        }
    })?;
    // Fragmentation has one measure: the replay's at its peak of reserved memory.
    let replayed = crate::replay::replay(trace, &crate::replay::ReplayOptions::default())?;
    let frag =
        crate::model::layout::ratio_complement(replayed.allocated_at_peak_reserved_bytes, replayed.peak_reserved_bytes);
    let (anchor_events, iterations_from) = anchors(&trace.facts.iterations);
    // Pass 2: live bytes per call site at the peak of allocated bytes.
    let sites = &trace.facts.sites;
    let mut live_sites: crate::model::ids::IdMap<(u64, usize)> = Default::default();
    trace.scan_chunks(|first, chunk| {
        for (k, r) in chunk.iter().enumerate() {
            if first + k as u64 > peak_allocated.event {
                return std::ops::ControlFlow::Break(());
            }
            match &r.event {
                Event::Alloc { id, requested_bytes, block_bytes, callsite, .. } => {
                    let b = if *block_bytes > 0 { *block_bytes } else { rounded(*requested_bytes) };
                    live_sites.insert(*id, (b, sites.of(*callsite)));
                }
                Event::FreeRequested { id, .. } => {
                    live_sites.remove(id);
                }
                _ => {}
            }
        }
        std::ops::ControlFlow::Continue(())
    })?;
    let mut sites_at_peak: HashMap<String, (crate::model::sites::Site, u64)> = HashMap::new();
    for (b, s) in live_sites.values() {
        let site = &sites.sites[*s];
        sites_at_peak.entry(site.label.clone()).or_insert_with(|| (site.clone(), 0)).1 += b;
    }
    let timeline = runs
        .iter()
        .map(|&(i, b)| {
            let x =
                if anchor_events.is_empty() { i as f64 / events as f64 } else { aligned_x(i, &anchor_events, events) };
            (x, b)
        })
        .collect();
    Ok(RankData {
        position: position as usize,
        row: RankRow {
            rank,
            rank_source,
            trace: trace.path.display().to_string(),
            input_damage: trace.damage(),
            events: trace.events,
            peak_reserved,
            peak_allocated,
            block_sizes_recorded: block_sizes,
            ooms,
            fragmentation_at_peak: frag,
            device_allocs,
            device_frees,
            iterations: anchor_events.len(),
            iterations_from,
            // As `summary` and `report` do: categories keep every allocation of the trace.
            categories_at_peak: match crate::analysis::category::by_default(trace) {
                true => crate::analysis::category::analyze(trace)?.map(|c| c.at_peak),
                false => None,
            },
        },
        sites_at_peak,
        timeline,
    })
}

fn median(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2] as f64
    } else {
        (v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0
    }
}

fn skew(v: Vec<u64>) -> f64 {
    let max = v.iter().copied().max().unwrap_or(0) as f64;
    let med = median(v);
    if med > 0.0 {
        max / med
    } else {
        1.0
    }
}

/// The cross-rank view of these traces (one per rank).
pub fn analyze(traces: &[Trace]) -> Result<RanksReport> {
    let mut data = traces.iter().enumerate().map(|(k, t)| analyse(t, k as u32)).collect::<Result<Vec<_>>>()?;
    // Two traces that name the same rank: fall back to positions for all, which are distinct.
    let mut seen = std::collections::HashSet::new();
    if !data.iter().all(|d| seen.insert(d.row.rank)) {
        for (k, d) in data.iter_mut().enumerate() {
            d.row.rank = k as u32;
            d.row.rank_source = RankSource::Position;
        }
    }
    data.sort_by_key(|d| d.row.rank);
    let (peaking_rank, peaking_index) = data
        .iter()
        .max_by(|a, b| a.row.peak_reserved.bytes.cmp(&b.row.peak_reserved.bytes).then(b.row.rank.cmp(&a.row.rank)))
        .map(|d| (d.row.rank, d.position))
        .unwrap_or((0, 0));
    let skew_reserved = skew(data.iter().map(|d| d.row.peak_reserved.bytes).collect());
    let skew_allocated = skew(data.iter().map(|d| d.row.peak_allocated.bytes).collect());
    let labels: std::collections::BTreeSet<&String> = data.iter().flat_map(|d| d.sites_at_peak.keys()).collect();
    let mut differing_sites: Vec<SiteSpread> = labels
        .into_iter()
        .map(|l| {
            let bytes: Vec<u64> = data.iter().map(|d| d.sites_at_peak.get(l).map_or(0, |x| x.1)).collect();
            let spread_bytes = bytes.iter().max().unwrap_or(&0) - bytes.iter().min().unwrap_or(&0);
            let site = data.iter().find_map(|d| d.sites_at_peak.get(l)).map(|x| x.0.clone()).expect("a rank's label");
            SiteSpread { site, bytes, spread_bytes }
        })
        .filter(|s| s.spread_bytes > 0)
        .collect();
    differing_sites.sort_by(|a, b| b.spread_bytes.cmp(&a.spread_bytes).then(a.site.label.cmp(&b.site.label)));
    differing_sites.truncate(TOP_SITES);
    let aligned_on_iterations = data.iter().all(|d| d.row.iterations > 0);
    let timelines = data.iter().map(|d| AlignedTimeline { rank: d.row.rank, points: d.timeline.clone() }).collect();
    Ok(RanksReport {
        ranks: data.into_iter().map(|d| d.row).collect(),
        peaking_rank,
        peaking_index,
        skew_reserved,
        skew_allocated,
        differing_sites,
        aligned_on_iterations,
        timelines,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use recorder::trace::Source;

    #[test]
    fn ranks_from_names_and_header() {
        let h = Header::new(Source::Recorded);
        assert_eq!(rank_of(Path::new("run/snap_rank3.pickle"), &h), Some((3, RankSource::FileName)));
        assert_eq!(rank_of(Path::new("RANK_12.atrace"), &h), Some((12, RankSource::FileName)));
        assert_eq!(rank_of(Path::new("a/rank-1.pickle"), &h), Some((1, RankSource::FileName)));
        assert_eq!(rank_of(Path::new("mem_cuda:2.pickle"), &h), Some((2, RankSource::Device)));
        assert_eq!(rank_of(Path::new("gpu7.atrace"), &h), Some((7, RankSource::Device)));
        assert_eq!(rank_of(Path::new("ranked.atrace"), &h), None);
        assert_eq!(rank_of(Path::new("train.atrace"), &h), None);
        let mut h2 = h.clone();
        h2.notes.push("rank=5 of 8".into());
        assert_eq!(rank_of(Path::new("rank1.atrace"), &h2), Some((5, RankSource::Header)));
    }

    #[test]
    fn alignment_and_skew() {
        // Anchors at 10 and 20 of 30 events: before the first is [0, 1), then one unit each.
        assert_eq!(aligned_x(0, &[10, 20], 30), 0.0);
        assert_eq!(aligned_x(5, &[10, 20], 30), 0.5);
        assert_eq!(aligned_x(10, &[10, 20], 30), 1.0);
        assert_eq!(aligned_x(25, &[10, 20], 30), 2.5);
        assert_eq!(skew(vec![100, 300]), 1.5);
        assert_eq!(skew(vec![100, 100, 400]), 4.0);
        assert_eq!(rounded(1), 512);
        assert_eq!(rounded(513), 1024);
    }
}
