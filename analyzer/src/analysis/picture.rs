//! What the pictures draw, as plain data: memory over time, the call sites over time, the
//! segment map at a moment, the what-if policies over time, fragmentation over time. Each
//! `*_data` function replays or scans the trace once (streaming, memory bounded by the
//! picture's columns); the `*Track`s and watches are the same computations as observers of a
//! replay that another analysis drives (the report's). `render::plot` only draws this data.

use crate::analysis::moment::At;
use crate::analysis::moment::{Moment, MomentKind, Moments};
use crate::analysis::timeline::{Downsampled, Mode, Timeline};
use crate::analysis::whatif::{whatif_observed, WhatifOptions};
use crate::model::layout::LayoutMeasures;
use crate::model::units::fmt_bytes;
use crate::model::Trace;
use crate::replay::{replay_observed, EngineView, ReplayOptions, ReplayResult};
use anyhow::{anyhow, Result};
use recorder::engine::SegmentView;
use recorder::trace::{Event, MarkKind, Record};
use std::collections::HashMap;

/// Columns of downsampling: about one per pixel of the plotting area.
pub const COLUMNS: usize = 1100;
/// Bands of the stacked call-site picture (the rest is "other").
pub const TOP_CALLSITES: usize = 8;

/// What the x axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum XAxis {
    /// Nanoseconds since the trace's clock origin (drawn in ms or s).
    Time,
    /// The index of the event in the trace.
    Event,
}

fn x_of(x: XAxis, index: u64, time_ns: u64) -> u64 {
    match x {
        XAxis::Time => time_ns,
        XAxis::Event => index,
    }
}

// ---------------------------------------------------------------------------------------------
// Data

/// Memory over time under the recorded settings.
#[derive(Debug, Clone)]
pub struct TimelineData {
    pub trace: String,
    pub device: String,
    pub x: XAxis,
    /// Series: allocated, reserved, active, requested bytes.
    pub series: Downsampled,
    /// (x, bytes) where reserved first reached its peak.
    pub peak_reserved: (u64, u64),
    pub peak_allocated: (u64, u64),
    /// (x, requested bytes) of each failed allocation.
    pub ooms: Vec<(u64, u64)>,
    /// (x, label) of phase, iteration and annotation marks.
    pub marks: Vec<(u64, String)>,
    pub capacity_bytes: Option<u64>,
    pub events: u64,
}

fn device_text(h: &recorder::trace::Header) -> String {
    match (h.device_name.is_empty(), h.device_total_bytes) {
        (true, 0) => String::new(),
        (false, 0) => h.device_name.clone(),
        (_, t) => format!("{} {}", h.device_name, fmt_bytes(t)).trim().to_string(),
    }
}

/// Memory over time. A trace that records block sizes and segments (written by the recorder or
/// by a replay) already holds the four counters: they are folded straight from its events, at
/// the cost of reading it. Otherwise (PyTorch snapshots record only requests) the trace is
/// replayed under its recorded settings, which costs the engine's time per request.
pub fn timeline_data(trace: &Trace, x: XAxis, columns: usize) -> Result<TimelineData> {
    match timeline_recorded(trace, x, columns)? {
        Some(d) => Ok(d),
        None => timeline_replayed(trace, x, columns),
    }
}

/// Whether the trace's own records hold the four counters ([`timeline_recorded`]): every
/// allocation with its block size, and segments where there are allocations. The summary's
/// counts say so before any read (PyTorch snapshots record requests only: they are replayed).
pub fn timeline_foldable(trace: &Trace) -> bool {
    let s = &trace.summary;
    s.count("alloc") == 0 || (s.peak_allocated.is_some() && s.count("segment_alloc") + s.count("segment_map") > 0)
}

/// Folds the counters the trace records; `None` where it cannot ([`timeline_foldable`]).
pub fn timeline_recorded(trace: &Trace, x: XAxis, columns: usize) -> Result<Option<TimelineData>> {
    let Some(mut fold) = TimelineFold::new(trace, x, columns) else { return Ok(None) };
    let scanned = trace.scan(|i, r| fold.observe(i, r))?;
    Ok(Some(fold.finish(trace, scanned.events)))
}

/// Memory over time as it is drawn, whether folded from the records ([`TimelineFold`]) or watched
/// in a replay ([`TimelineTrack`]): the four series, their peaks, the OOMs and the marks.
struct TimelineSeries {
    x: XAxis,
    tl: Timeline,
    peak_r: (u64, u64),
    peak_a: (u64, u64),
    ooms: Vec<(u64, u64)>,
    marks: Vec<(u64, String)>,
}

impl TimelineSeries {
    fn new(x: XAxis, columns: usize) -> Self {
        TimelineSeries {
            x,
            tl: Timeline::new(&["allocated", "reserved", "active", "requested"], columns, Mode::Envelope),
            peak_r: (0, 0),
            peak_a: (0, 0),
            ooms: Vec::new(),
            marks: Vec::new(),
        }
    }

    /// Allocated, reserved, active and requested bytes at `xv`.
    #[inline]
    fn push(&mut self, xv: u64, [allocated, reserved, active, requested]: [u64; 4]) {
        self.tl.push(xv, &[allocated as f64, reserved as f64, active as f64, requested as f64]);
        if reserved > self.peak_r.1 {
            self.peak_r = (xv, reserved);
        }
        if allocated > self.peak_a.1 {
            self.peak_a = (xv, allocated);
        }
    }

    fn mark(&mut self, xv: u64, kind: MarkKind, text: &str) {
        if let Some(label) = mark_label(kind, text) {
            self.marks.push((xv, label));
        }
    }

    fn data(self, trace: &Trace, capacity_bytes: Option<u64>, events: u64) -> TimelineData {
        TimelineData {
            trace: trace.name(),
            device: device_text(&trace.header),
            x: self.x,
            series: self.tl.finish(),
            peak_reserved: self.peak_r,
            peak_allocated: self.peak_a,
            ooms: self.ooms,
            marks: self.marks,
            capacity_bytes,
            events,
        }
    }
}

/// The fold of [`timeline_recorded`], for a pass that carries other folds too.
pub struct TimelineFold {
    series: TimelineSeries,
    /// Allocated, reserved, active and requested bytes.
    now: [u64; 4],
    /// id -> (block bytes, requested bytes, free requested)
    live: crate::model::ids::IdMap<(u64, u64, bool)>,
}

impl crate::model::Fold for TimelineFold {
    #[inline]
    fn observe(&mut self, i: u64, r: &Record) {
        TimelineFold::observe(self, i, r)
    }
}

impl TimelineFold {
    /// `None` where the trace's records do not hold the counters ([`timeline_foldable`]).
    pub fn new(trace: &Trace, x: XAxis, columns: usize) -> Option<TimelineFold> {
        timeline_foldable(trace).then(|| TimelineFold {
            series: TimelineSeries::new(x, columns),
            now: [0; 4],
            live: Default::default(),
        })
    }

    #[inline]
    pub fn observe(&mut self, i: u64, r: &Record) {
        let [allocated, reserved, active, requested] = &mut self.now;
        let xv = x_of(self.series.x, i, r.time_ns);
        match &r.event {
            Event::Alloc { id, requested_bytes, block_bytes, .. } => {
                self.live.insert(*id, (*block_bytes, *requested_bytes, false));
                // Saturating: hostile sizes near 2^64 must not wrap.
                *allocated = allocated.saturating_add(*block_bytes);
                *active = active.saturating_add(*block_bytes);
                *requested = requested.saturating_add(*requested_bytes);
            }
            Event::FreeRequested { id, .. } => {
                if let Some(b) = self.live.get_mut(id) {
                    if !b.2 {
                        b.2 = true;
                        *allocated = allocated.saturating_sub(b.0);
                    }
                }
            }
            Event::FreeCompleted { id, .. } => {
                if let Some((block, req, freed)) = self.live.remove(id) {
                    if !freed {
                        *allocated = allocated.saturating_sub(block);
                    }
                    *active = active.saturating_sub(block);
                    *requested = requested.saturating_sub(req);
                }
            }
            Event::SegmentAlloc { bytes, .. } | Event::SegmentMap { bytes, .. } => {
                *reserved = reserved.saturating_add(*bytes);
            }
            Event::SegmentFree { bytes, .. } | Event::SegmentUnmap { bytes, .. } => {
                *reserved = reserved.saturating_sub(*bytes)
            }
            Event::Oom { requested_bytes, .. } => self.series.ooms.push((xv, *requested_bytes)),
            Event::Mark { kind, text } => self.series.mark(xv, *kind, text),
            Event::Split { .. }
            | Event::Merge { .. }
            | Event::CacheRelease { .. }
            | Event::CallSite { .. }
            | Event::Snapshot { .. }
            | Event::DeviceMemInfo { .. }
            | Event::Dropped { .. }
            | Event::SegmentPool { .. } => {}
        }
        self.series.push(xv, self.now);
    }

    /// The picture's data, after `events` records.
    pub fn finish(self, trace: &Trace, events: u64) -> TimelineData {
        self.series.data(trace, trace.stated_capacity(), events)
    }
}

/// The label of a mark on a timeline, or `None` for marks left out.
fn mark_label(kind: MarkKind, text: &str) -> Option<String> {
    let keep = match kind {
        MarkKind::Phase | MarkKind::Iteration => true,
        // PyTorch's record_function ranges come in START/END pairs: mark the starts.
        MarkKind::Annotation => !text.ends_with(" END"),
    };
    keep.then(|| text.trim_end_matches(" START").to_string())
}

/// Replays the trace under its recorded settings and folds the engine's four byte counters.
pub fn timeline_replayed(trace: &Trace, x: XAxis, columns: usize) -> Result<TimelineData> {
    let mut track = TimelineTrack::new(x, columns);
    let result = replay_observed(trace, &ReplayOptions::default(), &mut |i, r, view, _| track.observe(i, r, view))?;
    Ok(track.finish(trace, &result))
}

/// The timeline of a replay ([`timeline_replayed`]): the engine's four byte counters after each
/// record, the peaks, the OOMs and the marks.
pub struct TimelineTrack {
    series: TimelineSeries,
    seen_ooms: u64,
}

impl TimelineTrack {
    pub fn new(x: XAxis, columns: usize) -> Self {
        TimelineTrack { series: TimelineSeries::new(x, columns), seen_ooms: 0 }
    }

    pub fn observe(&mut self, i: u64, r: &Record, view: &dyn EngineView) {
        let xv = x_of(self.series.x, i, r.time_ns);
        let st = view.stats();
        self.series.push(
            xv,
            [
                st.allocated_bytes.all.current,
                st.reserved_bytes.all.current,
                st.active_bytes.all.current,
                st.requested_bytes.all.current,
            ],
        );
        let failed = st.num_ooms > self.seen_ooms;
        self.seen_ooms = st.num_ooms;
        match &r.event {
            Event::Oom { requested_bytes, .. } => {
                self.series.ooms.push((xv, *requested_bytes));
            }
            Event::Alloc { requested_bytes, .. } if failed => {
                self.series.ooms.push((xv, *requested_bytes));
            }
            Event::Mark { kind, text } => self.series.mark(xv, *kind, text),
            _ => {}
        }
    }

    /// The picture's data, from the replay this watched.
    pub fn finish(self, trace: &Trace, result: &ReplayResult) -> TimelineData {
        self.series.data(trace, result.capacity_bytes, result.events)
    }
}

/// Live requested bytes by call site over time.
#[derive(Debug, Clone)]
pub struct StackedData {
    pub trace: String,
    pub x: XAxis,
    /// Series: total, then one per band (top call sites, then "other").
    pub series: Downsampled,
    pub bands: Vec<String>,
    pub has_callsites: bool,
}

/// Two scans: the first finds each call site's largest live bytes, the second folds the top
/// [`TOP_CALLSITES`] of them (and the rest as "other").
pub fn stacked_data(trace: &Trace, x: XAxis, columns: usize) -> Result<StackedData> {
    // Pass 1: sites, and each site's peak of live requested bytes.
    let mut fold = crate::model::sites::LiveBySite::new(&trace.facts.sites);
    trace.scan(|_, r| fold.observe(&r.event))?;
    stacked_data_from(trace, x, columns, fold)
}

/// [`stacked_data`]'s second pass, from its first (`fold`, made over every record of `trace`,
/// maybe in a pass that carried other folds too).
pub fn stacked_data_from(
    trace: &Trace,
    x: XAxis,
    columns: usize,
    fold: crate::model::sites::LiveBySite<'_>,
) -> Result<StackedData> {
    let crate::model::sites::LiveBySite { sites, most: max, .. } = fold;
    let has_callsites = sites.any_defined();
    let labels: Vec<&str> = sites.sites.iter().map(|s| s.label.as_str()).collect();
    let mut order: Vec<usize> = (0..labels.len()).filter(|&l| max[l] > 0).collect();
    order.sort_by(|&a, &b| max[b].cmp(&max[a]).then_with(|| labels[a].cmp(labels[b])));
    order.truncate(TOP_CALLSITES);
    let other_band = order.len() + 1; // series index of "other"
    let mut band_of_label = vec![other_band; labels.len()];
    for (k, &l) in order.iter().enumerate() {
        band_of_label[l] = k + 1;
    }
    let mut bands: Vec<String> = order.iter().map(|&l| labels[l].to_string()).collect();
    bands.push("other".into());
    let mut names: Vec<&str> = vec!["total"];
    names.extend(bands.iter().map(|s| s.as_str()));
    let mut tl = Timeline::new(&names, columns, Mode::AtMaxOfFirst);
    // Pass 2.
    let mut values = vec![0f64; names.len()];
    let mut live: HashMap<u64, (usize, u64)> = HashMap::new();
    trace.scan(|i, r| {
        match &r.event {
            Event::Alloc { id, requested_bytes, callsite, .. } => {
                let b = band_of_label[sites.of(*callsite)];
                live.insert(*id, (b, *requested_bytes));
                values[b] += *requested_bytes as f64;
                values[0] += *requested_bytes as f64;
            }
            Event::FreeCompleted { id, .. } => {
                if let Some((b, bytes)) = live.remove(id) {
                    values[b] -= bytes as f64;
                    values[0] -= bytes as f64;
                }
            }
            _ => {}
        }
        tl.push(x_of(x, i, r.time_ns), &values);
    })?;
    Ok(StackedData { trace: trace.name(), x, series: tl.finish(), bands, has_callsites })
}

/// The segment map at one moment.
#[derive(Debug, Clone)]
pub struct SegmentsData {
    pub trace: String,
    /// In words, e.g. "peak reserved (event 546)".
    pub moment: String,
    pub event: u64,
    pub time_ns: u64,
    pub segments: Vec<SegmentView>,
    /// The request that failed, when the moment is an OOM.
    pub failed_request_bytes: Option<u64>,
    /// The streams' names (in the order the trace first used them up to the moment).
    pub streams: crate::model::streams::StreamNames,
}

impl SegmentsData {
    /// The measures of the layout: the one definition ([`LayoutMeasures`]) that `frag`, `explain`
    /// and the report's findings read.
    pub fn measures(&self) -> LayoutMeasures {
        LayoutMeasures::of(&self.segments)
    }
    pub fn reserved_bytes(&self) -> u64 {
        self.measures().reserved_bytes
    }
    /// Bytes in free blocks (not allocated, not waiting for a free to complete).
    pub fn free_bytes(&self) -> u64 {
        self.measures().free_bytes
    }
    /// The largest free block of the default pools (a private pool's serves only that pool).
    pub fn largest_free_bytes(&self) -> u64 {
        self.measures().largest_free_bytes
    }
}

/// Where the moment of a segment map falls: pass 1 of [`segments_data`], an observer of a
/// replay under the recorded settings ([`Moments`] decides it).
#[derive(Default)]
pub struct MomentTrack {
    moments: Moments,
    /// Where asked ([`MomentTrack::taking_the_oom_layout`]), the segment map at the OOM moment
    /// as a [`SegmentsWatch`] aimed at it would take it: that moment is known as the replay
    /// passes it, so no second replay is needed for it (a peak is known only at the end).
    at_oom: Option<OomLayout>,
}

/// The streams named up to the OOM moment, and the time and layout there once passed.
#[derive(Default)]
struct OomLayout {
    streams: crate::model::streams::StreamNames,
    taken: Option<(u64, Vec<SegmentView>)>,
}

impl MomentTrack {
    /// A track that also takes the segment map at the OOM moment ([`MomentTrack::oom_segments`]).
    pub fn taking_the_oom_layout() -> Self {
        MomentTrack { at_oom: Some(OomLayout::default()), ..Default::default() }
    }

    pub fn observe(&mut self, trace: &Trace, i: u64, r: &Record, view: &dyn EngineView) {
        let passing = self.moments.observe(trace, i, r, view);
        if let Some(l) = self.at_oom.as_mut().filter(|l| l.taken.is_none()) {
            if let Some(s) = crate::model::streams::stream_of(&r.event) {
                l.streams.observe(s);
            }
            if passing.oom {
                l.taken = Some((r.time_ns, view.segments()));
            }
        }
    }

    /// The segment map at the OOM moment, where this track took it
    /// ([`MomentTrack::taking_the_oom_layout`]) and the replay had one: what
    /// [`segments_data_at`] gives at that moment.
    pub fn oom_segments(&mut self, trace: &Trace) -> Option<SegmentsData> {
        let (event, moment, failed_request_bytes) = self.moment(trace, At::Oom).ok()?;
        let l = self.at_oom.take()?;
        let (time_ns, segments) = l.taken?;
        Some(SegmentsData {
            trace: trace.name(),
            moment,
            event,
            time_ns,
            segments,
            failed_request_bytes,
            streams: l.streams,
        })
    }

    /// The event, the words for the moment, and the failed request at an OOM.
    pub fn moment(&self, trace: &Trace, at: At) -> Result<(u64, String, Option<u64>)> {
        let Moment { event: i, kind } = self.moments.resolve(trace, at)?;
        Ok(match kind {
            MomentKind::Event => (i, format!("after event {i}"), None),
            MomentKind::Peak { reserved_bytes } => {
                (i, format!("peak reserved {} (event {i})", fmt_bytes(reserved_bytes)), None)
            }
            // A replay that runs out of memory stops there: its end is the failure.
            MomentKind::End { stopped: true } => {
                (i, format!("end of the replay, at its out-of-memory (event {i})"), None)
            }
            MomentKind::End { stopped: false } => (i, format!("end (event {i})"), None),
            MomentKind::Oom { requested_bytes } => (
                i,
                format!("out of memory: request of {} (event {i})", fmt_bytes(requested_bytes)),
                Some(requested_bytes),
            ),
        })
    }
}

/// Replays under the recorded settings and takes the layout at `at`.
pub fn segments_data(trace: &Trace, at: At) -> Result<SegmentsData> {
    let opts = ReplayOptions::default();
    // Pass 1 (except for a given event): find the event; at an OOM, take the layout there too.
    let mut track = if at == At::Oom { MomentTrack::taking_the_oom_layout() } else { MomentTrack::default() };
    if !matches!(at, At::Event(_)) {
        replay_observed(trace, &opts, &mut |i, r, view, _| track.observe(trace, i, r, view))?;
    }
    if let Some(taken) = track.oom_segments(trace).filter(|_| at == At::Oom) {
        return Ok(taken);
    }
    segments_data_at(trace, track.moment(trace, at)?)
}

/// Pass 2 of [`segments_data`]: replays up to the moment and takes the layout there.
pub fn segments_data_at(trace: &Trace, moment: (u64, String, Option<u64>)) -> Result<SegmentsData> {
    let mut watch = SegmentsWatch::new(moment);
    let opts = ReplayOptions { stop_after: Some(watch.target), ..Default::default() };
    replay_observed(trace, &opts, &mut |i, r, view, _| watch.observe(i, r, view))?;
    watch.finish(trace)
}

/// What [`segments_data_at`] watches in a replay under the recorded settings: the layout at the
/// moment, and the streams the trace used up to it.
pub struct SegmentsWatch {
    target: u64,
    moment: String,
    failed: Option<u64>,
    taken: Option<(u64, Vec<SegmentView>)>,
    streams: crate::model::streams::StreamNames,
}

impl SegmentsWatch {
    /// The moment as [`MomentTrack::moment`] gives it: its event, its words, the failed request.
    pub fn new((target, moment, failed): (u64, String, Option<u64>)) -> Self {
        SegmentsWatch { target, moment, failed, taken: None, streams: Default::default() }
    }

    /// The event whose layout this takes: a replay carrying it may stop there.
    pub fn target(&self) -> u64 {
        self.target
    }

    pub fn observe(&mut self, i: u64, r: &Record, view: &dyn EngineView) {
        if i <= self.target {
            if let Some(s) = crate::model::streams::stream_of(&r.event) {
                self.streams.observe(s);
            }
        }
        if i == self.target {
            self.taken = Some((r.time_ns, view.segments()));
        }
    }

    pub fn finish(self, trace: &Trace) -> Result<SegmentsData> {
        let target = self.target;
        let (time_ns, segments) =
            self.taken.ok_or_else(|| anyhow!("{}: the replay did not reach event {target}", trace.path.display()))?;
        Ok(SegmentsData {
            trace: trace.name(),
            moment: self.moment,
            event: target,
            time_ns,
            segments,
            failed_request_bytes: self.failed,
            streams: self.streams,
        })
    }
}

/// Reserved bytes over time under each what-if policy.
#[derive(Debug, Clone)]
pub struct WhatifData {
    pub trace: String,
    pub x: XAxis,
    /// (policy, series of reserved bytes, x of its OOM if any, peak reserved).
    pub policies: Vec<(String, Downsampled, Option<u64>, u64)>,
    /// Live requested bytes (the bound no allocator beats), from the recorded run.
    pub requested: Downsampled,
    pub capacity_bytes: Option<u64>,
}

/// One policy's series of [`WhatifData`], filled while its replay runs.
#[derive(Clone)]
pub struct WhatifTrack {
    tl: Timeline,
    last_x: u64,
}

impl WhatifTrack {
    pub fn new(columns: usize) -> Self {
        WhatifTrack { tl: Timeline::new(&["reserved", "requested"], columns, Mode::Envelope), last_x: 0 }
    }

    /// Called after each record of the replay.
    pub fn observe(&mut self, x: XAxis, i: u64, rec: &Record, view: &dyn EngineView) {
        let st = view.stats();
        self.last_x = x_of(x, i, rec.time_ns);
        self.tl.push(self.last_x, &[st.reserved_bytes.all.current as f64, st.requested_bytes.all.current as f64]);
    }
}

/// The picture's data from the what-if table's rows, each row's replay at the capacity
/// (`result(k)`: whether row `k`'s run ran out of memory, and its peak reserved bytes; asked only
/// of rows that are their own replay) and the tracks the replays drew (`track(k)`, likewise). A
/// row that is the same run as an earlier one is drawn from that row's run
/// ([`crate::analysis::whatif::Whatif::replayed_by`]).
pub fn whatif_data_of<'a>(
    trace_name: String,
    x: XAxis,
    rows: &crate::analysis::whatif::Rows,
    result: impl Fn(usize) -> (bool, u64),
    track: impl Fn(usize) -> Option<&'a WhatifTrack>,
) -> WhatifData {
    let policies: Vec<_> = rows
        .names
        .iter()
        .zip(&rows.replayed_by)
        .map(|(name, &by)| {
            let t = track(by).expect("a replayed row has its track");
            let (oom, peak_reserved) = result(by);
            (name.clone(), t.tl.clone().finish(), oom.then_some(t.last_x), peak_reserved)
        })
        .collect();
    let requested = policies[0].1.clone();
    WhatifData { trace: trace_name, x, policies, requested, capacity_bytes: rows.capacity_bytes }
}

/// The what-if picture of `trace`: the what-if table's rows at the trace's capacity (the same
/// settings, the same rule for the garbage-collection row, settings that are one run on this
/// trace replayed once), each row's reserved bytes over its replay.
pub fn whatif_data(trace: &Trace, x: XAxis, columns: usize) -> Result<WhatifData> {
    let capacity = trace.default_capacity();
    let opts = WhatifOptions { capacity, search_capacity: false, repeats: 1, rows_only: true };
    let (table, runs) = whatif_observed(
        trace,
        &opts,
        &|_| WhatifTrack::new(columns),
        &|t, i, rec, view, _| t.observe(x, i, rec, view),
        &|_, _, _, _, _| {},
    )?;
    let (tracks, results): (Vec<Option<WhatifTrack>>, Vec<ReplayResult>) = runs.into_iter().unzip();
    let result = |k: usize| (results[k].is_oom(), results[k].peak_reserved_bytes);
    Ok(whatif_data_of(trace.name(), x, &table.replays, result, |k| tracks[k].as_ref()))
}

/// Fragmentation over time.
#[derive(Debug, Clone)]
pub struct FragData {
    pub trace: String,
    pub x: XAxis,
    /// `1 - allocated / reserved` at every event.
    pub unallocated: Downsampled,
    /// `1 - largest free block / total free` at every event.
    pub contiguity: Downsampled,
    pub samples: u64,
}

/// The observer of [`frag_data`]'s replay (under the recorded settings).
pub struct FragTrack {
    x: XAxis,
    un: Timeline,
    co: Timeline,
    samples: u64,
}

impl FragTrack {
    pub fn new(x: XAxis, columns: usize) -> Self {
        FragTrack {
            x,
            un: Timeline::new(&["1 - allocated / reserved"], columns, Mode::Envelope),
            co: Timeline::new(&["1 - largest free / total free"], columns, Mode::Envelope),
            samples: 0,
        }
    }

    pub fn observe(&mut self, i: u64, r: &Record, view: &dyn EngineView) {
        let xv = x_of(self.x, i, r.time_ns);
        // The one definition of the measures (`frag`'s), from the figures the engine keeps.
        let m = LayoutMeasures::of_occupancy(&view.occupancy());
        self.un.push(xv, &[m.reserved_vs_allocated()]);
        self.co.push(xv, &[m.contiguity()]);
        self.samples += 1;
    }

    /// The picture's data, titled with the trace's name ([`Trace::name`]).
    pub fn finish(self, trace_name: String) -> FragData {
        FragData {
            trace: trace_name,
            x: self.x,
            unallocated: self.un.finish(),
            contiguity: self.co.finish(),
            samples: self.samples,
        }
    }
}

/// Fragmentation over time under the recorded settings, at every event.
pub fn frag_data(trace: &Trace, x: XAxis, columns: usize) -> Result<FragData> {
    let mut t = FragTrack::new(x, columns);
    replay_observed(trace, &ReplayOptions::default(), &mut |i, r, view, _| t.observe(i, r, view))?;
    Ok(t.finish(trace.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The segment map the recorded run takes as it passes the OOM is the one a second replay
    /// up to that moment takes, on every shipped trace whose replay has an OOM moment (and on the
    /// truth fixtures of runs that ran out of memory).
    #[test]
    fn the_oom_layout_taken_in_passing_is_the_second_replays() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut paths: Vec<std::path::PathBuf> = Vec::new();
        for dir in ["traces", "traces/large", "tests/fixtures/truth"] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "atrace") {
                    paths.push(p);
                }
            }
        }
        let mut checked = 0;
        for p in paths {
            let trace = Trace::open(&p).unwrap();
            let mut track = MomentTrack::taking_the_oom_layout();
            replay_observed(&trace, &ReplayOptions::default(), &mut |i, r, view, _| track.observe(&trace, i, r, view))
                .unwrap();
            let Ok(moment) = track.moment(&trace, At::Oom) else {
                assert!(track.oom_segments(&trace).is_none(), "{}", p.display());
                continue;
            };
            let taken = track.oom_segments(&trace).unwrap();
            let replayed = segments_data_at(&trace, moment).unwrap();
            assert_eq!(
                (
                    &taken.moment,
                    taken.event,
                    taken.time_ns,
                    &taken.segments,
                    taken.failed_request_bytes,
                    &taken.streams
                ),
                (
                    &replayed.moment,
                    replayed.event,
                    replayed.time_ns,
                    &replayed.segments,
                    replayed.failed_request_bytes,
                    &replayed.streams
                ),
                "{}",
                p.display()
            );
            checked += 1;
        }
        assert!(checked >= 10, "{checked} traces with an OOM moment");
    }
}
