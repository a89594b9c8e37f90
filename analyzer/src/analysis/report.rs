//! `alloctrace report`'s analysis: everything a report shows, computed once, as a plan: one read,
//! the folds, then one replay of the recorded run that carries every analysis watching it, beside
//! the other what-if replays; then one replay up to the moments those found, to take the layout
//! there; then the interpreters ([`findings`]). [`crate::render::report`] renders the result.
//!
//! The pictures are drawn by a [`Painter`] that the renderer gives: each as soon as its data is
//! ready, beside the replays still running, so that drawing and rasterizing take no time of
//! their own. Nothing depends on the clock or the trace's path (only its file name), so a report
//! is a pure function of the trace.

use crate::analysis::capacity_search::LONG_TRACE_EVENTS;
use crate::analysis::explain::{ExplainOptions, ExplainReport};
use crate::analysis::frag::{FragOptions, FragReport};
use crate::analysis::leaks::{LeaksOptions, LeaksReport};
use crate::analysis::moment::At;
use crate::analysis::picture::{self, FragData, SegmentsData, StackedData, TimelineData, WhatifData, XAxis};
use crate::analysis::whatif::{whatif_observed, Whatif, WhatifOptions};
use crate::model::escape::{report_code as code, report_text as prose};
use crate::model::units::{fmt_bytes, fmt_need, pct};
use crate::model::Trace;
use crate::replay::{Outcome, Reach, ReplayResult};
use crate::source::summary::Summary;
use anyhow::Result;
use serde::Serialize;

/// Where the trace came from and under which settings it ran.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub source: &'static str,
    pub device_name: String,
    pub device_total_bytes: u64,
    pub alloc_conf: String,
    /// The capacity every analysis of the report ran under (`null`: none), and where it came from.
    pub capacity_bytes: Option<u64>,
    pub capacity_source: crate::model::CapacitySource,
    pub trace_tool_version: String,
    pub report_tool_version: &'static str,
    pub command_line: Vec<String>,
    pub notes: Vec<String>,
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Info,
    Warning,
    Problem,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Info => "info",
            Verdict::Warning => "warning",
            Verdict::Problem => "problem",
        }
    }
}

/// One finding: a named measure, its value, what it means, and a verdict. Its texts are the
/// report's inline markup (code spans, `**bold**`, backslash escapes, see [`crate::model::escape`]);
/// `summary.json` carries them as plain text ([`crate::model::escape::report_plain`]).
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub id: &'static str,
    #[serde(serialize_with = "crate::model::escape::serialize_report_plain")]
    pub title: String,
    pub verdict: Verdict,
    /// The measure, e.g. "14.3%".
    #[serde(serialize_with = "crate::model::escape::serialize_report_plain")]
    pub value: String,
    /// What the measure is, in plain words.
    #[serde(serialize_with = "crate::model::escape::serialize_report_plain")]
    pub definition: String,
    /// What it says about this run.
    #[serde(serialize_with = "crate::model::escape::serialize_report_plain")]
    pub explanation: String,
}

/// The layout at the picture's moment.
#[derive(Debug, Clone, Serialize)]
pub struct LayoutAt {
    pub moment: String,
    pub event: u64,
    pub segments: u64,
    pub reserved_bytes: u64,
    pub free_bytes: u64,
    pub largest_free_bytes: u64,
    pub failed_request_bytes: Option<u64>,
}

/// `summary.json`, and everything the documents are rendered from.
#[derive(Debug, Clone, Serialize)]
pub struct Report<P> {
    pub trace: String,
    pub environment: Environment,
    pub summary: Summary,
    /// The replay under the recorded settings and capacity.
    pub replay: ReplayResult,
    pub layout: Option<LayoutAt>,
    pub findings: Vec<Finding>,
    pub whatif: Whatif,
    /// Why the what-if table has no smallest capacities (a long trace), if so: the report's
    /// markup, plain text in `summary.json`.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "plain_option")]
    pub capacity_search_note: Option<String>,
    /// Drawn by the [`Painter`] given to [`build`], in the order the documents show them.
    pub pictures: Vec<P>,
    /// `alloctrace explain`: the OOM (or peak) diagnosed, with advice backed by replays.
    pub explain: Option<ExplainReport>,
    /// `alloctrace frag`: fragmentation four ways.
    pub frag: Option<FragReport>,
    /// `alloctrace leaks`: what is live at the end, growth per iteration, retention.
    pub leaks: Option<LeaksReport>,
    /// Analyses that failed on this trace, with why (the rest of the report stands).
    pub analysis_errors: Vec<String>,
    /// What the memory is for ([`crate::analysis::category`]); `null` when the trace has no phases.
    pub categories: Option<crate::analysis::category::Categories>,
    /// `alloctrace ranks`, when the report was given one trace per rank (this one the peaking rank's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<crate::analysis::ranks::RanksReport>,
}

/// The data of one of a report's pictures.
pub enum PictureData<'a> {
    /// Memory over time.
    Timeline(&'a TimelineData),
    /// Live bytes by call site.
    Callsites(&'a StackedData),
    /// The segment map at the OOM or the peak.
    Segments(&'a SegmentsData),
    /// Reserved bytes under each what-if policy.
    Whatif(&'a WhatifData),
    /// Fragmentation over time.
    Frag(&'a FragData),
    /// Live bytes by category.
    Categories(&'a crate::analysis::category::Categories),
}

/// Draws a report's pictures: the renderer's part of [`build`], which calls it as soon as a
/// picture's data is ready, from any thread.
pub trait Painter: Sync {
    type Picture: Send;
    /// The picture of `data`, drawn but perhaps not finished (the SVG without its raster).
    fn draw(&self, data: PictureData<'_>) -> Result<Self::Picture>;
    /// Finishes a picture (its raster); nothing where it is finished already.
    fn finish(&self, picture: &mut Self::Picture) -> Result<()>;
}

/// A picture drawn and finished.
fn drawn<P: Painter>(painter: &P, data: PictureData<'_>) -> Result<P::Picture> {
    let mut p = painter.draw(data)?;
    painter.finish(&mut p)?;
    Ok(p)
}

/// An optional text of the report's markup as plain text (see [`Finding`]).
fn plain_option<S: serde::Serializer>(s: &Option<String>, ser: S) -> std::result::Result<S::Ok, S::Error> {
    match s {
        Some(s) => crate::model::escape::serialize_report_plain(s, ser),
        None => ser.serialize_none(),
    }
}

/// Options of [`build`].
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// Search each policy's smallest capacity (slower on huge traces).
    pub search_capacity: bool,
    /// Search it on long traces too (more than [`crate::analysis::capacity_search::LONG_TRACE_EVENTS`] events),
    /// where it costs several replays per policy; otherwise the report says it was skipped.
    pub search_long_traces: bool,
}

/// Computes everything a report shows.
///
/// The what-if replays also draw the what-if picture, and the recorded policy's replay is the
/// report's replay; the analyses (`explain`, `frag`, `leaks`) and the pictures run
/// concurrently, and `explain` reuses the what-if table and `leaks`' growth.
pub fn build<P: Painter>(trace: &Trace, opts: &ReportOptions, painter: &P) -> Result<Report<P::Picture>> {
    let name = trace.name();
    let summary = trace.summary.clone();
    let h = &trace.header;
    let environment = Environment {
        source: h.source.as_str(),
        device_name: h.device_name.clone(),
        device_total_bytes: h.device_total_bytes,
        alloc_conf: h.alloc_conf.clone(),
        capacity_bytes: trace.default_capacity().bytes,
        capacity_source: trace.default_capacity().source,
        trace_tool_version: h.tool_version.clone(),
        report_tool_version: env!("CARGO_PKG_VERSION"),
        command_line: h.command_line.clone(),
        notes: h.notes.clone(),
    };
    let long = trace.events > LONG_TRACE_EVENTS;
    let search = opts.search_capacity && (!long || opts.search_long_traces);
    let capacity_search_note = (opts.search_capacity && !search).then(|| {
        format!(
            "The trace is long ({} events): the smallest capacity of each policy was not searched (it takes several \
             replays per policy); {} searches it.",
            trace.events,
            code(&format!("alloctrace whatif {name}"))
        )
    });

    // The plan: one read, the folds, then one replay of the recorded run that carries every
    // analysis watching it (the what-if table's row under the recorded settings), beside the
    // other what-if replays; then one replay up to the moments those found, to take the layout
    // there; then the interpreters. Each analysis keeps the same watch as its own command.
    let first_iteration = crate::analysis::explain::first_iteration(trace);
    let leaks_opts = LeaksOptions::default();
    // The moment of `frag` is the OOM where the run has one, else the peak: a watch made for
    // the OOM serves both, and the run's outcome picks one.
    let frag_opts = FragOptions { at: crate::analysis::moment::At::Oom };
    // Taken by the recorded settings' row (row 0) of the what-if table.
    let recorded = std::sync::Mutex::new(Some((
        Drawing {
            frag_track: picture::FragTrack::new(XAxis::Time, picture::COLUMNS),
            timeline: (!picture::timeline_foldable(trace))
                .then(|| picture::TimelineTrack::new(XAxis::Time, picture::COLUMNS)),
        },
        Watches {
            moment: picture::MomentTrack::taking_the_oom_layout(),
            held: crate::analysis::leaks::HeldWatch::new(leaks_opts.at_event, trace.events),
            explain: crate::analysis::explain::ExplainWatch::new(trace, first_iteration, None),
            frag: crate::analysis::frag::FragWatch::new(trace, &frag_opts)?,
        },
    )));
    // The runs at the capacity that have ended (row, its track, whether it ran out of memory
    // and its peak reserved), and the what-if picture drawn from them once all have: beside
    // the capacity searches, where the table calls its rows ready there.
    type AtCapacity = Vec<(usize, picture::WhatifTrack, (bool, u64))>;
    let at_capacity: std::sync::Mutex<AtCapacity> = std::sync::Mutex::new(Vec::new());
    let whatif_drawn: std::sync::Mutex<Option<Result<P::Picture>>> = std::sync::Mutex::new(None);
    let (whatif_run, folded) = crate::replay::join_within(
        trace,
        || {
            whatif_observed(
                trace,
                &WhatifOptions {
                    capacity: trace.default_capacity(),
                    search_capacity: search,
                    repeats: crate::analysis::outcome::DEFAULT_REPEATS,
                    rows_only: false,
                },
                &|k| {
                    let (drawing, watches) = match k {
                        0 => recorded.lock().ok().and_then(|mut w| w.take()).unzip(),
                        _ => (None, None),
                    };
                    ReportTrack {
                        whatif: picture::WhatifTrack::new(picture::COLUMNS),
                        drawing,
                        watches,
                        found: None,
                        drawn: None,
                    }
                },
                &|t, i, rec, view, live| {
                    t.whatif.observe(XAxis::Time, i, rec, view);
                    if let Some(d) = t.drawing.as_mut() {
                        d.observe(i, rec, view);
                    }
                    if let Some(w) = t.watches.as_mut() {
                        w.observe(trace, i, rec, view, live);
                    }
                },
                // The analyses that need only the recorded run go on beside the capacity searches
                // where the table calls them there.
                &|k, t, replay, bounds, rows| {
                    // The what-if picture, once every setting's run at the capacity is over.
                    let all = at_capacity.lock().ok().and_then(|mut at| {
                        at.push((k, t.whatif.clone(), (replay.is_oom(), replay.peak_reserved_bytes)));
                        (at.len() == rows.replays()).then(|| std::mem::take(&mut *at))
                    });
                    if let Some(all) = all {
                        let track = |k: usize| all.iter().find(|a| a.0 == k).map(|a| &a.1);
                        let result = |k: usize| all.iter().find(|a| a.0 == k).map_or((false, 0), |a| a.2);
                        let wd = picture::whatif_data_of(name.clone(), XAxis::Time, rows, result, track);
                        let drawn = drawn(painter, PictureData::Whatif(&wd));
                        if let Ok(mut w) = whatif_drawn.lock() {
                            *w = Some(drawn);
                        }
                    }
                    if let Some(w) = t.watches.take() {
                        t.found = Some(analyse_recorded(
                            trace,
                            w,
                            replay,
                            bounds,
                            first_iteration,
                            &leaks_opts,
                            None,
                            painter,
                        ));
                    }
                    if let Some(d) = t.drawing.take() {
                        t.drawn = Some(draw_recorded(trace, d, replay, painter));
                    }
                },
            )
        },
        || -> Result<Folded<P::Picture>> {
            // One pass carries the folds of the records: memory over time where the records
            // hold its counters, the first pass of live bytes by call site (drawn only where
            // the trace names call sites), and `leaks`' folds where the table does not call the
            // analyses of the recorded run beside its searches (which make them there).
            let mut timeline = picture::TimelineFold::new(trace, XAxis::Time, picture::COLUMNS);
            let mut by_site =
                (trace.summary.count("callsite") > 0).then(|| crate::model::sites::LiveBySite::new(&trace.facts.sites));
            let mut leaks = (!search).then(|| crate::analysis::leaks::LeaksFold::new(trace));
            // Each fold keeps a state per live allocation, beside the table's replays (one per
            // setting, and the bounds that may ride them): where the three do not fit beside
            // those within the memory replays may keep (`concurrent_replays`), a pass each.
            let table_states = crate::analysis::whatif::policies(&trace.header.config, true).len() + 1;
            let together = crate::replay::concurrent_replays(trace) >= table_states + 3;
            {
                use crate::model::Fold;
                let mut folds: Vec<&mut dyn Fold> = Vec::new();
                folds.extend(timeline.as_mut().map(|f| f as &mut dyn Fold));
                folds.extend(by_site.as_mut().map(|f| f as &mut dyn Fold));
                folds.extend(leaks.as_mut().map(|f| f as &mut dyn Fold));
                trace.fold_each(together, &mut folds)?;
            }
            let events = trace.events;
            let timeline = timeline.map(|f| drawn(painter, PictureData::Timeline(&f.finish(trace, events))));
            let stacked =
                by_site.map(|f| picture::stacked_data_from(trace, XAxis::Time, picture::COLUMNS, f)).transpose()?;
            Ok((
                timeline.transpose()?,
                stacked
                    .filter(|st| st.has_callsites)
                    .map(|st| drawn(painter, PictureData::Callsites(&st)))
                    .transpose()?,
                leaks.map(|f| f.finish(trace, events)),
            ))
        },
    );
    let (mut wi, runs) = whatif_run?;
    wi.trace = name.clone();
    type Tracks<P> = Vec<Option<ReportTrack<P>>>;
    let (mut tracks, results): (Tracks<P::Picture>, Vec<ReplayResult>) = runs.into_iter().unzip();
    let replay = results[0].clone();
    let row0 = tracks[0].as_mut().expect("row 0 is the recorded configuration, replayed");
    let drawn = match row0.drawn.take() {
        Some(drawn) => drawn?,
        None => {
            draw_recorded(trace, row0.drawing.take().expect("row 0 is the recorded configuration"), &replay, painter)?
        }
    };
    let (beside, watches) = (row0.found.take(), row0.watches.take());
    let (timeline_folded, callsites_picture, leaks_folds) = folded?;
    let timeline = match (timeline_folded, drawn.timeline) {
        (Some(tl), _) => tl,
        (None, Some(tl)) => tl,
        (None, None) => anyhow::bail!("{}: the timeline was neither folded nor watched", trace.path.display()),
    };
    let whatif = match whatif_drawn.into_inner().ok().flatten() {
        Some(drawn) => drawn?,
        None => {
            let result = |k: usize| (results[k].is_oom(), results[k].peak_reserved_bytes);
            let track = |k: usize| tracks[k].as_ref().map(|t| &t.whatif);
            painter.draw(PictureData::Whatif(&picture::whatif_data_of(
                name.clone(),
                XAxis::Time,
                &wi.replays,
                result,
                track,
            )))?
        }
    };

    // The pictures drawn beside the table come finished; the rest are finished below. The
    // segment map goes after memory over time (and live bytes by call site), before the what-if
    // picture.
    let mut pictures = vec![timeline];
    pictures.extend(callsites_picture);
    let segments_at = pictures.len();
    pictures.push(whatif);
    pictures.push(drawn.frag);
    let mut analysis_errors = Vec::new();
    let categories = category_section(trace, &mut pictures, &mut analysis_errors, painter)?;
    let finish = |pictures: &mut [P::Picture]| -> Result<()> {
        use rayon::prelude::*;
        pictures.par_iter_mut().try_for_each(|p| painter.finish(p))
    };
    // While the pictures drawn so far are finished: the analyses of the recorded run where
    // the table did not make them beside its searches, then `explain`'s advice, which rests on
    // the table.
    let (drawn, found) = crate::replay::join_within(
        trace,
        || finish(&mut pictures),
        || -> Result<(Found<P::Picture>, ExplainFinished)> {
            let mut found = match (beside, watches) {
                (Some(found), _) => found?,
                (None, Some(w)) => {
                    analyse_recorded(trace, w, &replay, &wi.bounds, first_iteration, &leaks_opts, leaks_folds, painter)?
                }
                (None, None) => unreachable!("row 0 is the recorded configuration, and it is watched"),
            };
            // `explain` searches capacities exactly when the report did, so that it reuses the
            // report's what-if table (and `--no-search` searches nowhere).
            let o = ExplainOptions { search_capacity: Some(search), whatif: Some(&wi), ..Default::default() };
            let finished =
                found.explained.take().map(|p| crate::analysis::explain::explain_finish(trace, p, &o)).transpose();
            Ok((found, finished))
        },
    );
    drawn?;
    let (Found { seg, segments_picture, mut frag, mut leaks, mut errors, .. }, finished) = found?;
    let mut explained = match finished {
        Ok(x) => x,
        Err(e) => {
            errors.push(format!("explain: {e:#}"));
            None
        }
    };
    // The analyses' errors first, then the categories'.
    errors.append(&mut analysis_errors);
    let analysis_errors = errors;
    let layout = match seg {
        Ok(seg) => Some(LayoutAt {
            moment: seg.moment.clone(),
            event: seg.event,
            segments: seg.segments.len() as u64,
            reserved_bytes: seg.reserved_bytes(),
            free_bytes: seg.free_bytes(),
            largest_free_bytes: seg.largest_free_bytes(),
            failed_request_bytes: seg.failed_request_bytes,
        }),
        // A trace that never reserves anything has no map to draw.
        Err(_) => None,
    };
    if let Some(p) = segments_picture.transpose()? {
        pictures.insert(segments_at, p);
    }

    if let Some(x) = explained.as_mut() {
        x.trace = name.clone();
    }
    if let Some(x) = frag.as_mut() {
        x.trace = name.clone();
    }
    if let Some(x) = leaks.as_mut() {
        x.trace = name.clone();
    }

    let verdict = explained.as_ref().map(|x| &x.verdict);
    let mut findings = findings(&summary, &replay, layout.as_ref(), &wi, verdict);
    if let Some(l) = &leaks {
        let steady = verdict.is_some_and(|v| v.kind == crate::analysis::explain::VerdictKind::SteadyGrowth);
        refine_live_at_end(&mut findings, l, steady);
    }
    Ok(Report {
        trace: name,
        environment,
        summary,
        replay,
        layout,
        findings,
        whatif: wi,
        capacity_search_note,
        pictures,
        explain: explained,
        frag,
        leaks,
        analysis_errors,
        categories,
        ranks: None,
    })
}

/// What the memory is for, and its stacked timeline (a picture), where the trace has phases.
fn category_section<P: Painter>(
    trace: &Trace,
    pictures: &mut Vec<P::Picture>,
    errors: &mut Vec<String>,
    painter: &P,
) -> Result<Option<crate::analysis::category::Categories>> {
    if !crate::analysis::category::by_default(trace) {
        return Ok(None);
    }
    let c = match crate::analysis::category::analyze(trace) {
        Ok(Some(c)) => c,
        Ok(None) => return Ok(None),
        Err(e) => {
            errors.push(format!("categories: {e:#}"));
            return Ok(None);
        }
    };
    pictures.push(painter.draw(PictureData::Categories(&c))?);
    Ok(Some(c))
}

/// `explain`'s diagnosis finished from the what-if table, or why it could not be.
type ExplainFinished = Result<Option<ExplainReport>>;

/// What [`build`] observes in each what-if replay.
struct ReportTrack<P> {
    whatif: picture::WhatifTrack,
    /// Only in the recorded configuration's replay: what the pictures draw from it.
    drawing: Option<Drawing>,
    /// Only in the recorded configuration's replay, until its analyses take them.
    watches: Option<Watches>,
    /// What the analyses found from the recorded configuration's replay ([`analyse_recorded`]).
    found: Option<Result<Found<P>>>,
    /// The pictures drawn from it ([`draw_recorded`]), where the table's callback made them.
    drawn: Option<Result<DrawnRecorded<P>>>,
}

/// What [`analyse_recorded`] finds from the recorded run's watches: the segment map's data and
/// the analyses (`explain` up to its advice, which needs the table), with the errors of those
/// that failed.
struct Found<P> {
    seg: Result<picture::SegmentsData>,
    /// The segment map drawn and rasterized, where there is one.
    segments_picture: Option<Result<P>>,
    explained: Option<crate::analysis::explain::ExplainPrelude>,
    frag: Option<FragReport>,
    leaks: Option<LeaksReport>,
    errors: Vec<String>,
}

/// What the report folds from the records beside the what-if table: the timeline (where the
/// trace's own counters give it), live bytes by call site, and `leaks`' folds.
type Folded<P> = (Option<P>, Option<P>, Option<Result<crate::analysis::leaks::LeaksFolds>>);

/// The analyses that need only the replay under the recorded settings (`replay`, watched by
/// `w`): where the run has no OOM, one more replay up to the latest moment whose layout they
/// take (the peak's, for the segment map, explain and frag; at an OOM the watches took it), then
/// leaks (from `leaks_folds` where they were made beside the table), explain's findings before
/// its advice, and frag; explain's patterns beside all of it.
#[allow(clippy::too_many_arguments)]
fn analyse_recorded<P: Painter>(
    trace: &Trace,
    mut w: Watches,
    replay: &ReplayResult,
    bounds: &crate::analysis::whatif::Bounds,
    first_iteration: Option<u64>,
    leaks_opts: &LeaksOptions,
    leaks_folds: Option<Result<crate::analysis::leaks::LeaksFolds>>,
    painter: &P,
) -> Result<Found<P::Picture>> {
    // Explain's patterns need only `replay`: they go beside everything else.
    let (found, patterns) = crate::replay::join_within(
        trace,
        || -> Result<Found<P::Picture>> {
            // What the watches kept per live allocation is let go before the second replay.
            w.explain = w.explain.replayed();
            w.held = w.held.replayed();
            let mut errors = Vec::new();
            let mut keep = |what: &str, r: Result<()>| {
                if let Err(e) = r {
                    errors.push(format!("{what}: {e:#}"));
                }
            };
            let at = if replay.is_oom() { At::Oom } else { At::Peak };
            let frag_watch = if replay.is_oom() { w.frag } else { w.frag.at_peak() };
            // The segment map: at an OOM the recorded run took the layout as it passed; at the peak
            // (known only at the run's end) the replay below takes it.
            let taken = if at == At::Oom { w.moment.oom_segments(trace) } else { None };
            let mut seg = match taken {
                Some(taken) => Ok(SegmentMap::Taken(taken)),
                None => w.moment.moment(trace, at).map(|m| SegmentMap::Watching(picture::SegmentsWatch::new(m))),
            };
            let seg_target = match &seg {
                Ok(SegmentMap::Watching(s)) => Some(s.target()),
                _ => None,
            };
            // Where the segment map and `explain` take the layout at one moment, the map's copy
            // serves both.
            let mut explain_second = w.explain.peak_to_take().map(|p| {
                let e = crate::analysis::explain::ExplainWatch::new(trace, first_iteration, Some(p));
                if seg_target == Some(p) {
                    e.layout_taken_elsewhere()
                } else {
                    e
                }
            });
            let frag_peak = frag_watch.peak_to_take();
            let mut frag_segments: Vec<recorder::engine::SegmentView> = Vec::new();
            let stop = [seg_target, w.explain.peak_to_take(), frag_peak].into_iter().flatten().max();
            let held = w.held;
            let (leaks, second) = crate::replay::join_within(
                trace,
                || match leaks_folds {
                    Some(folds) => {
                        crate::analysis::leaks::check_at_event(trace, leaks_opts)?;
                        crate::analysis::leaks::finish(trace, folds?, held)
                    }
                    None => crate::analysis::leaks::analyze_watched(trace, leaks_opts, Some(held)),
                },
                || -> Result<()> {
                    let Some(stop) = stop else { return Ok(()) };
                    let o = crate::replay::ReplayOptions { stop_after: Some(stop), ..Default::default() };
                    crate::replay::replay_observed(trace, &o, &mut |i, r, view, live| {
                        if let Ok(SegmentMap::Watching(s)) = seg.as_mut() {
                            s.observe(i, r, view);
                        }
                        if let Some(e) = explain_second.as_mut() {
                            e.observe(trace, i, r, view, live);
                        }
                        // The segment map's layout serves frag too where they are one moment.
                        if frag_peak == Some(i) && frag_peak != seg_target {
                            frag_segments = view.segments();
                        }
                    })?;
                    Ok(())
                },
            );
            second?;
            let (mut explained, mut frag, mut leaks_report) = (None, None, None);
            let seg = seg.and_then(|s| match s {
                SegmentMap::Taken(taken) => Ok(taken),
                SegmentMap::Watching(s) => s.finish(trace),
            });
            if let (Some(e), Ok(s)) = (explain_second.as_mut(), seg.as_ref()) {
                e.give_layout(s.segments.clone());
            }
            // Under a limit the run fails part way: its growth is over the iterations before the
            // failure, as explain measures it (one growth in the document).
            keep(
                "leaks",
                leaks.map(|mut x: LeaksReport| {
                    if let Some(e) = replay.oom_event() {
                        x.growth = x.growth.take().and_then(|g| g.before(e));
                    }
                    leaks_report = Some(x)
                }),
            );
            // Explain's findings, frag, and the segment map's picture (drawn and rasterized here, off
            // the what-if table's path where the table calls these analyses beside its searches).
            let ((ex, fr), segments_picture) = crate::replay::join_within(
                trace,
                || {
                    crate::replay::join_within(
                        trace,
                        || {
                            let growth = leaks_report.as_ref().map(|l: &LeaksReport| l.growth.clone());
                            crate::analysis::explain::explain_prelude(
                                trace,
                                growth,
                                replay.clone(),
                                w.explain,
                                explain_second.map(|e| e.replayed()),
                            )
                        },
                        || {
                            let peak_layout: &[recorder::engine::SegmentView] = match (&seg, frag_peak) {
                                (Ok(s), Some(p)) if s.event == p => &s.segments,
                                _ => &frag_segments,
                            };
                            frag_watch.finish(trace, replay.clone(), peak_layout, bounds)
                        },
                    )
                },
                || seg.as_ref().ok().map(|s| drawn(painter, PictureData::Segments(s))),
            );
            keep("explain", ex.map(|x| explained = Some(x)));
            keep("frag", fr.map(|x| frag = Some(x)));
            Ok(Found { seg, segments_picture, explained, frag, leaks: leaks_report, errors })
        },
        || crate::analysis::patterns::of_run(trace, replay),
    );
    let mut found = found?;
    match patterns {
        Ok(p) => found.explained = found.explained.map(|e| e.with_patterns(p)),
        Err(e) => {
            if found.explained.take().is_some() {
                found.errors.push(format!("explain: {e:#}"));
            }
        }
    }
    Ok(found)
}

/// The segment map of [`analyse_recorded`]: taken by the recorded run, or to take by a replay.
enum SegmentMap {
    Taken(picture::SegmentsData),
    Watching(picture::SegmentsWatch),
}

/// The pictures of the replay under the recorded settings, drawn and rasterized as soon as that
/// replay ends (beside the capacity searches): fragmentation over time, and memory over time
/// where the trace's own counters could not give it.
struct DrawnRecorded<P> {
    timeline: Option<P>,
    frag: P,
}

fn draw_recorded<P: Painter>(
    trace: &Trace,
    drawing: Drawing,
    replay: &ReplayResult,
    painter: &P,
) -> Result<DrawnRecorded<P::Picture>> {
    let timeline = drawing
        .timeline
        .map(|track| drawn(painter, PictureData::Timeline(&track.finish(trace, replay))))
        .transpose()?;
    let frag = drawn(painter, PictureData::Frag(&drawing.frag_track.finish(trace.name())))?;
    Ok(DrawnRecorded { timeline, frag })
}

/// What the pictures of fragmentation and memory over time draw from the replay under the
/// recorded settings.
struct Drawing {
    frag_track: picture::FragTrack,
    /// Only where the trace's own figures cannot be folded ([`picture::timeline_foldable`]).
    timeline: Option<picture::TimelineTrack>,
}

impl Drawing {
    fn observe(&mut self, i: u64, r: &recorder::trace::Record, view: &dyn crate::replay::EngineView) {
        self.frag_track.observe(i, r, view);
        if let Some(t) = self.timeline.as_mut() {
            t.observe(i, r, view);
        }
    }
}

/// The analyses' watches of the replay under the recorded settings: the segment map's moment,
/// and the watches of `leaks`, `explain` and `frag`.
struct Watches {
    moment: picture::MomentTrack,
    held: crate::analysis::leaks::HeldWatch,
    explain: crate::analysis::explain::ExplainWatch,
    frag: crate::analysis::frag::FragWatch,
}

impl Watches {
    fn observe(
        &mut self,
        trace: &Trace,
        i: u64,
        r: &recorder::trace::Record,
        view: &dyn crate::replay::EngineView,
        live: &crate::replay::LiveMap,
    ) {
        self.moment.observe(trace, i, r, view);
        self.held.observe(trace, i, r, view, live);
        self.explain.observe(trace, i, r, view, live);
        self.frag.observe(trace, i, r, view);
    }
}

/// Live iterations rising: the share of successive iterations whose live bytes went up.
/// Turns "still live at the end" into a leak verdict with the growth per iteration.
/// `steady_verdict`: explain's verdict is the growth (then the finding says so too, whatever its
/// size per iteration).
fn refine_live_at_end(findings: &mut [Finding], l: &LeaksReport, steady_verdict: bool) {
    let Some(f) = findings.iter_mut().find(|f| f.id == "live_at_end") else { return };
    let top = l.live_at_end.first().map(|s| {
        format!(
            " The most bytes still live come from {} ({} blocks, {}).",
            crate::model::escape::report_text(&s.site.label),
            s.count,
            fmt_bytes(s.requested_bytes)
        )
    });
    match &l.growth {
        Some(g) if g.is_steady() && (g.per_iteration_bytes >= (1 << 20) as f64 || steady_verdict) => {
            // Growth that the program let go of by the end raises the peak but is no leak.
            let released = l.live_at_end_count == 0;
            f.verdict = if released { Verdict::Warning } else { Verdict::Problem };
            f.title = if released {
                "Memory grows every iteration (released by the end)".into()
            } else {
                "Memory grows every iteration (a leak)".into()
            };
            f.value = format!("{} per iteration", crate::model::units::fmt_delta(g.per_iteration_bytes.round() as i64));
            let site = g.sites.first().map(|s| {
                format!(
                    " The growth comes mostly from {} ({} per iteration).",
                    code(&s.site.label),
                    crate::model::units::fmt_delta(s.per_iteration_bytes.round() as i64)
                )
            });
            f.explanation = format!(
                "Live bytes rose in {:.0}% of {} iterations (iterations from {}).{}{}{}",
                g.rising_share() * 100.0,
                g.iterations(),
                g.source,
                site.unwrap_or_default(),
                top.unwrap_or_default(),
                if released {
                    " Nothing is live at the end of the trace: the program let the growth go, so it raised the \
                     peak but did not leak."
                } else {
                    ""
                }
            );
        }
        Some(g) if l.live_at_end_count > 0 && g.iterations() < crate::analysis::leaks::MIN_STEADY_ITERATIONS => {
            f.explanation = format!(
                "{} (iterations from {}) are too few to tell growth from state made once, as an optimizer's first \
step makes it ({} per iteration over them).{}",
                crate::model::units::count(g.iterations() as u64, "iteration"),
                g.source,
                crate::model::units::fmt_delta(g.per_iteration_bytes.round() as i64),
                top.clone().unwrap_or_default()
            );
        }
        Some(g) if l.live_at_end_count > 0 => {
            f.explanation = format!(
                "Live bytes do not grow steadily from one iteration to the next ({} per iteration, iterations \
                 from {}), so these look like long-lived state, not a leak.{}",
                crate::model::units::fmt_delta(g.per_iteration_bytes.round() as i64),
                g.source,
                top.unwrap_or_default()
            );
        }
        _ if l.live_at_end_count > 0 => {
            f.explanation = format!(
                "{}{}",
                l.growth_note.as_deref().map(prose).unwrap_or_else(|| "No iterations found to measure growth.".into()),
                top.unwrap_or_default()
            );
        }
        _ => {}
    }
}

/// The findings computable from the summary, the replay, the layout and the what-if table.
/// `verdict` is the diagnosis of the OOM (`explain`'s), which the OOM finding states rather than
/// classifying the OOM again.
pub fn findings(
    s: &Summary,
    r: &ReplayResult,
    layout: Option<&LayoutAt>,
    w: &Whatif,
    verdict: Option<&crate::analysis::explain::Verdict>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let fragmentation_caused_it =
        verdict.is_some_and(|v| v.kind == crate::analysis::explain::VerdictKind::Fragmentation);
    // 1. Did it run out of memory?
    match &r.outcome {
        Outcome::Oom { event, requested_bytes, reserved_bytes, allocated_bytes, .. } => {
            // The one diagnosis (explain's verdict), not a second classification.
            let why = match verdict {
                Some(v) if v.kind != crate::analysis::explain::VerdictKind::NoOom => {
                    format!(" Diagnosis: {}: {}.", v.kind.as_str(), prose(&v.reason))
                }
                _ => String::new(),
            };
            // What would have helped, from the what-if table at the same limit: a whole job that
            // completes, or a replay that gets past the failure where the trace stops there.
            let with = |reach: Reach| -> Vec<String> {
                crate::analysis::whatif::completing(&w.rows)
                    .filter(|row| !row.alloc_conf.is_empty() && row.reach == reach)
                    .map(|row| code(&row.alloc_conf))
                    .collect()
            };
            let (mut whole, mut past) = (with(Reach::Completes), with(Reach::GetsPastFailure));
            // The no-caching row of the same table, as it decides it.
            let none = w.no_caching();
            let uncached = match none.limit_aside() {
                Some(aside) => format!(
                    "no caching (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`, a device call per request; {aside}: see the \
                     what-if table)"
                ),
                None => "no caching (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`, a device call per request)".to_string(),
            };
            match none.reach {
                Some(Reach::Completes) => whole.push(uncached),
                Some(Reach::GetsPastFailure) => past.push(uncached),
                _ => {}
            }
            let remedy = if why.is_empty() {
                String::new()
            } else if whole.is_empty() && past.is_empty() {
                " None of the settings tried gets past the request that failed under this limit: what would is a \
                 change to the program (what it holds, or the order it allocates in: see the advice), or more memory."
                    .to_string()
            } else {
                let mut s = String::new();
                if !whole.is_empty() {
                    s += &format!(" Under this limit the whole job, replayed, completes with {}.", whole.join(", "));
                }
                if !past.is_empty() {
                    s += &format!(
                        " Under this limit the replay gets past the request that failed with {}; the rest of the job \
                         is not in the trace (see the what-if table and its prediction).",
                        past.join(", ")
                    );
                }
                s
            };
            out.push(Finding {
                id: "oom",
                title: "Out of memory".into(),
                verdict: Verdict::Problem,
                value: format!("request of {} at event {event}", fmt_bytes(*requested_bytes)),
                definition: "A request the allocator could not serve from its cache nor from the device, even after \
                             releasing every cached segment."
                    .into(),
                explanation: format!(
                    "Replayed under the recorded settings, the request failed with {} reserved and {} allocated.{why}{remedy}",
                    fmt_bytes(*reserved_bytes),
                    fmt_bytes(*allocated_bytes)
                ),
            });
        }
        // The recorded run failed but its replay did not: say both, never "none".
        Outcome::Ok if s.num_ooms > 0 => out.push(Finding {
            id: "oom",
            title: "Out of memory".into(),
            verdict: Verdict::Warning,
            value: format!("{} recorded, none in the replay", s.num_ooms),
            definition: "A request the allocator could not serve.".into(),
            explanation: format!(
                "The trace records {} out-of-memory error(s), but all {} requests succeeded when replayed under the \
                 recorded settings{}: the limit the run had is not known exactly; give it with `--capacity` to \
                 import or replay at it.",
                s.num_ooms,
                r.requests,
                r.capacity_bytes.map(|c| format!(" and a limit of {}", fmt_bytes(c))).unwrap_or_default()
            ),
        }),
        Outcome::Ok => out.push(Finding {
            id: "oom",
            title: "Out of memory".into(),
            verdict: Verdict::Ok,
            value: "none".into(),
            definition: "A request the allocator could not serve.".into(),
            explanation: format!("All {} requests succeeded in the replay under the recorded settings.", r.requests),
        }),
    }
    // 2. Reserved vs allocated (definition 1), where it matters: the figure of the what-if
    // table's recorded row and of the fragmentation section at the same moment.
    let frag = r.fragmentation_where_it_matters();
    let (allocated, reserved) = r.allocated_and_reserved_where_it_matters();
    let verdict = if frag < 0.10 {
        Verdict::Ok
    } else if frag < 0.25 {
        Verdict::Warning
    } else {
        Verdict::Problem
    };
    let moment = if r.is_oom() { "at the OOM" } else { "at peak reserved" };
    out.push(Finding {
        id: "reserved_vs_allocated",
        title: format!("Reserved but unallocated memory {moment}"),
        verdict,
        value: pct(frag),
        definition: "1 - allocated / reserved at the OOM, or when reserved memory peaked in a run without one: \
                     the share of the memory taken from the device that no tensor held then (cached, or slack in \
                     rounded blocks). nvidia-smi shows reserved."
            .into(),
        explanation: format!(
            "Reserved {}, allocated {} {moment}: {} held by the cache beyond what tensors used. Under 10% is \
             normal for a caching allocator; above 25% the cache costs real capacity.",
            fmt_bytes(reserved),
            fmt_bytes(allocated),
            fmt_bytes(crate::model::layout::reserved_unallocated(reserved, allocated))
        ),
    });
    // 3. Contiguity at the moment of the segment map (definition 2).
    if let Some(l) = layout {
        // Measure 2 of the layout ([`crate::model::layout::LayoutMeasures::contiguity`]): the
        // largest free block is one a request outside a private pool could get.
        let c = crate::model::layout::contiguity(l.largest_free_bytes, l.free_bytes);
        // Where the diagnosis is fragmentation, the pieces caused the OOM, whatever their share.
        let caused = l.failed_request_bytes.is_some() && fragmentation_caused_it;
        let verdict = if caused {
            Verdict::Problem
        } else if l.free_bytes < (64 << 20) || c < 0.5 {
            Verdict::Ok
        } else if l.failed_request_bytes.is_some() {
            Verdict::Problem
        } else {
            Verdict::Warning
        };
        out.push(Finding {
            id: "free_memory_in_pieces",
            title: if l.failed_request_bytes.is_some() {
                "Free memory in pieces at the OOM".to_string()
            } else {
                "Free memory in pieces at peak reserved".to_string()
            },
            verdict,
            value: pct(c),
            definition: "1 - largest free block / total free memory in the cache (TensorFlow's measure): 0% means \
                         all free cached memory is one block; near 100% means it is scattered in small pieces that \
                         a large request cannot use."
                .into(),
            explanation: format!(
                "{} segments, {} reserved, {} free in the cache, the largest free block {}{}.",
                l.segments,
                fmt_bytes(l.reserved_bytes),
                fmt_bytes(l.free_bytes),
                fmt_bytes(l.largest_free_bytes),
                match l.failed_request_bytes.filter(|_| caused) {
                    Some(f) => format!("; the request that failed needed one block of {}", fmt_bytes(f)),
                    None => String::new(),
                }
            ),
        });
    }
    // 4. Gap to what no allocator can beat (definition 4), and the best policy.
    let b = &w.bounds;
    // Ties go to the row listed first (the table's order), as in `explain`'s advice.
    let best = w
        .rows
        .iter()
        .enumerate()
        .filter(|(_, row)| row.outcome == crate::model::OutcomeKind::Ok || row.min_capacity_bytes.is_some())
        .min_by_key(|(i, row)| (row.min_capacity_bytes.unwrap_or(row.peak_reserved_bytes), *i))
        .map(|(_, row)| row);
    let recorded = w.rows.first();
    let need = |row: &crate::analysis::whatif::PolicyRow| row.min_capacity_bytes.unwrap_or(row.peak_reserved_bytes);
    if let (Some(rec), Some(best)) = (recorded, best) {
        let floor = b.live_requested_peak_bytes;
        let gap = if floor == 0 { 0.0 } else { need(rec) as f64 / floor as f64 - 1.0 };
        let verdict = if gap < 0.10 {
            Verdict::Ok
        } else if gap < 0.30 {
            Verdict::Warning
        } else {
            Verdict::Problem
        };
        let advice = if best.policy != rec.policy && need(best) < need(rec) {
            format!(
                " Of the policies tried, {} needs the least: {} ({} less).",
                if best.alloc_conf.is_empty() { "the default policy".into() } else { code(&best.alloc_conf) },
                fmt_need(need(best)),
                fmt_bytes(need(rec) - need(best))
            )
        } else {
            // The what-if table shows no caching too: where it needs less, say so beside.
            let none = w.no_caching();
            let uncached = (none.min_capacity_bytes < need(rec)).then(|| {
                format!(
                    " Without caching the run needs {}, at the cost of a device call for every allocation and free \
({} here).",
                    fmt_need(none.min_capacity_bytes),
                    b.no_caching_device_calls
                )
            });
            format!(
                " None of the other allocator settings tried needs less than the recorded settings.{}",
                uncached.unwrap_or_default()
            )
        };
        out.push(Finding {
            id: "gap_to_plan",
            title: "Memory needed vs the least any allocator needs".into(),
            verdict,
            value: pct(gap),
            definition: "How much more the recorded settings need (smallest capacity at which the run completes, \
                         else peak reserved) than the peak of live requested bytes, which no allocator can beat. An \
                         offline plan that knows every lifetime in advance (greedy by size) is quoted for reference."
                .into(),
            explanation: format!(
                "The recorded settings need {}; the requests themselves need at least {} (the peak of live \
                 requested bytes{}){}.{advice}",
                crate::model::units::fmt_need(need(rec)),
                fmt_bytes(floor),
                if b.includes_failed_request { ", with the request that failed" } else { "" },
                b.offline_plan_bytes
                    .map(|p| format!("; an offline plan that knows every lifetime packs them into {}", fmt_bytes(p)))
                    .unwrap_or_default()
            ),
        });
    }
    // 5. What was still live at the end.
    out.push(Finding {
        id: "live_at_end",
        title: "Still allocated at the end of the trace".into(),
        verdict: if s.end_live_blocks == 0 { Verdict::Ok } else { Verdict::Info },
        value: format!("{} blocks, {}", s.end_live_blocks, fmt_bytes(s.end_requested_bytes)),
        definition: "Blocks allocated and never freed before the trace ended. Model weights and optimizer state \
                     normally are; a count that grows with every iteration is a leak."
            .into(),
        explanation: if s.end_live_blocks == 0 {
            "Every block allocated was freed before the trace ended.".into()
        } else {
            "Whether these are a leak: see the leak analysis below.".into()
        },
    });
    // 6. Trust in the trace itself.
    if s.dropped_events > 0 || s.anomalies > 0 || r.input_damage.is_some() {
        out.push(Finding {
            id: "trace_quality",
            title: "Trace completeness".into(),
            verdict: Verdict::Warning,
            value: format!("{} dropped, {} anomalies", s.dropped_events, s.anomalies),
            definition: "Events the recorder could not write, and frees of blocks the trace never allocated.".into(),
            explanation: r.input_damage.as_ref().map(|d| d.to_string()).unwrap_or_else(|| "Figures may be low.".into()),
        });
    }
    out
}
