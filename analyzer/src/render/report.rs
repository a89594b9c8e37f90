//! `alloctrace report`: one trace's findings as a document to paste into a ticket
//! (`report.md`), a self-contained page (`report.html`, pictures inline, no network), and
//! everything machine-readable (`summary.json`).
//!
//! [`build`] computes (summary fold, replay, what-if, segment map, pictures); [`Report`] only
//! renders. The document is a small list of [`Block`]s rendered twice, so the Markdown and the
//! HTML can never say different things. Nothing depends on the clock or the trace's path
//! (only its file name), so a report is a pure function of the trace: `reports/` is checked
//! against a fresh run by the test suite.

use crate::analysis::capacity_search::LONG_TRACE_EVENTS;
use crate::analysis::explain::{ExplainOptions, ExplainReport};
use crate::analysis::frag::{FragOptions, FragReport};
use crate::analysis::leaks::{LeaksOptions, LeaksReport};
use crate::analysis::moment::At;
use crate::analysis::picture::{self, XAxis};
use crate::analysis::whatif::{whatif_observed, Whatif, WhatifOptions};
use crate::model::output::document::Block;
use crate::model::units::{fmt_bytes, fmt_need, fmt_ns};
use crate::model::Trace;
use crate::render::plot;
use crate::replay::{Outcome, Reach, ReplayResult};
use crate::source::summary::Summary;
use anyhow::{Context, Result};
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

/// A picture of the report: an SVG, and the same picture as a PNG beside it.
#[derive(Debug, Clone, Serialize)]
pub struct Picture {
    /// The SVG's file name, e.g. `timeline.svg`.
    pub file: String,
    /// The PNG's file name, e.g. `timeline.png`.
    pub png_file: String,
    /// The title and the caption are the report's markup; `summary.json` has them as plain text.
    #[serde(serialize_with = "crate::model::escape::serialize_report_plain")]
    pub title: String,
    #[serde(serialize_with = "crate::model::escape::serialize_report_plain")]
    pub caption: String,
    #[serde(skip)]
    pub svg: String,
    /// The SVG rasterised with the embedded font ([`crate::render::raster`]).
    #[serde(skip)]
    pub png: Vec<u8>,
}

impl Picture {
    fn new(file: &str, title: String, caption: String, svg: String) -> Picture {
        let png_file = format!("{}.png", file.trim_end_matches(".svg"));
        Picture { file: file.into(), png_file, title, caption, svg, png: Vec::new() }
    }

    /// Draws the PNG from the SVG.
    fn rasterize(&mut self) -> Result<()> {
        self.png = crate::render::raster::png_of_svg(&self.svg)
            .with_context(|| format!("cannot draw {} as a PNG", self.file))?;
        Ok(())
    }

    /// [`Picture::new`], rasterized.
    fn drawn(file: &str, title: String, caption: String, svg: String) -> Result<Picture> {
        let mut p = Picture::new(file, title, caption, svg);
        p.rasterize()?;
        Ok(p)
    }
}

/// How `report.md` shows its pictures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PictureLinks {
    /// The PNG beside the report, linked to its SVG (attach the PNGs with the Markdown).
    #[default]
    Files,
    /// The PNGs inside the Markdown as `data:` URIs: one file that shows its pictures wherever
    /// Markdown renders `data:` images (editors, GitLab, most wikis; GitHub drops them).
    Inline,
}

/// `summary.json`, and everything the documents are rendered from.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
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
    pub pictures: Vec<Picture>,
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
pub fn build(trace: &Trace, opts: &ReportOptions) -> Result<Report> {
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
    let whatif_drawn: std::sync::Mutex<Option<Result<Picture>>> = std::sync::Mutex::new(None);
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
                        let drawn = whatif_picture(&wd).and_then(|mut p| p.rasterize().map(|()| p));
                        if let Ok(mut w) = whatif_drawn.lock() {
                            *w = Some(drawn);
                        }
                    }
                    if let Some(w) = t.watches.take() {
                        t.found = Some(analyse_recorded(trace, w, replay, bounds, first_iteration, &leaks_opts, None));
                    }
                    if let Some(d) = t.drawing.take() {
                        t.drawn = Some(draw_recorded(trace, d, replay));
                    }
                },
            )
        },
        || -> Result<Folded> {
            // Live bytes by call site are drawn only where the trace names call sites.
            let callsites = trace.summary.count("callsite") > 0;
            let timeline =
                picture::timeline_recorded(trace, XAxis::Time, picture::COLUMNS)?.map(|tl| timeline_picture(&tl));
            let stacked =
                if callsites { Some(picture::stacked_data(trace, XAxis::Time, picture::COLUMNS)?) } else { None };
            Ok((
                timeline.transpose()?,
                stacked.filter(|st| st.has_callsites).map(|st| callsites_picture(&st)).transpose()?,
                // `leaks`' folds of the records, where the table does not call the analyses of
                // the recorded run beside its searches (which make them there).
                (!search).then(|| crate::analysis::leaks::fold(trace)),
            ))
        },
    );
    let (mut wi, runs) = whatif_run?;
    wi.trace = name.clone();
    let (mut tracks, results): (Vec<Option<ReportTrack>>, Vec<ReplayResult>) = runs.into_iter().unzip();
    let replay = results[0].clone();
    let row0 = tracks[0].as_mut().expect("row 0 is the recorded configuration, replayed");
    let drawn = match row0.drawn.take() {
        Some(drawn) => drawn?,
        None => draw_recorded(trace, row0.drawing.take().expect("row 0 is the recorded configuration"), &replay)?,
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
            whatif_picture(&picture::whatif_data_of(name.clone(), XAxis::Time, &wi.replays, result, track))?
        }
    };

    // The pictures drawn beside the table come rasterized; the rest are rasterized below.
    let mut pictures = vec![timeline];
    pictures.extend(callsites_picture);
    pictures.push(whatif);
    pictures.push(drawn.frag);
    let mut analysis_errors = Vec::new();
    let categories = category_section(trace, &mut pictures, &mut analysis_errors)?;
    let rasterize = |pictures: &mut [Picture]| -> Result<()> {
        use rayon::prelude::*;
        pictures.par_iter_mut().filter(|p| p.png.is_empty()).try_for_each(Picture::rasterize)
    };
    // While the pictures drawn so far are rasterized: the analyses of the recorded run where
    // the table did not make them beside its searches, then `explain`'s advice, which rests on
    // the table.
    let (drawn, found) = crate::replay::join_within(
        trace,
        || rasterize(&mut pictures),
        || -> Result<(Found, Result<Option<ExplainReport>>)> {
            let mut found = match (beside, watches) {
                (Some(found), _) => found?,
                (None, Some(w)) => {
                    analyse_recorded(trace, w, &replay, &wi.bounds, first_iteration, &leaks_opts, leaks_folds)?
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
        // After memory over time (and live bytes by call site), before the what-if picture.
        let at = pictures.iter().position(|p| p.file == "whatif.svg").unwrap_or(pictures.len());
        pictures.insert(at, p);
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
fn category_section(
    trace: &Trace,
    pictures: &mut Vec<Picture>,
    errors: &mut Vec<String>,
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
    pictures.push(Picture::new(
        "categories.svg",
        "Live bytes by category".into(),
        format!(
            "Live allocated bytes stacked by what they are for (phases from {}); the black line is the peak of \
             allocated bytes. Each point is the highest total in its stretch of events.",
            c.phases_from
        ),
        crate::render::plot::render_categories(&c, "Live bytes by category")?,
    ));
    Ok(Some(c))
}

/// What [`build`] observes in each what-if replay.
struct ReportTrack {
    whatif: picture::WhatifTrack,
    /// Only in the recorded configuration's replay: what the pictures draw from it.
    drawing: Option<Drawing>,
    /// Only in the recorded configuration's replay, until its analyses take them.
    watches: Option<Watches>,
    /// What the analyses found from the recorded configuration's replay ([`analyse_recorded`]).
    found: Option<Result<Found>>,
    /// The pictures drawn from it ([`draw_recorded`]), where the table's callback made them.
    drawn: Option<Result<DrawnRecorded>>,
}

/// What [`analyse_recorded`] finds from the recorded run's watches: the segment map's data and
/// the analyses (`explain` up to its advice, which needs the table), with the errors of those
/// that failed.
struct Found {
    seg: Result<picture::SegmentsData>,
    /// The segment map drawn and rasterized, where there is one.
    segments_picture: Option<Result<Picture>>,
    explained: Option<crate::analysis::explain::ExplainPrelude>,
    frag: Option<FragReport>,
    leaks: Option<LeaksReport>,
    errors: Vec<String>,
}

/// What the report folds from the records beside the what-if table: the timeline (where the
/// trace's own counters give it), live bytes by call site, and `leaks`' folds.
type Folded = (Option<Picture>, Option<Picture>, Option<Result<crate::analysis::leaks::LeaksFolds>>);

/// The analyses that need only the replay under the recorded settings (`replay`, watched by
/// `w`): where the run has no OOM, one more replay up to the latest moment whose layout they
/// take (the peak's, for the segment map, explain and frag; at an OOM the watches took it), then
/// leaks (from `leaks_folds` where they were made beside the table), explain's findings before
/// its advice, and frag; explain's patterns beside all of it.
fn analyse_recorded(
    trace: &Trace,
    mut w: Watches,
    replay: &ReplayResult,
    bounds: &crate::analysis::whatif::Bounds,
    first_iteration: Option<u64>,
    leaks_opts: &LeaksOptions,
    leaks_folds: Option<Result<crate::analysis::leaks::LeaksFolds>>,
) -> Result<Found> {
    // Explain's patterns need only `replay`: they go beside everything else.
    let (found, patterns) = crate::replay::join_within(
        trace,
        || -> Result<Found> {
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
                            frag_watch.finish(trace, replay.clone(), peak_layout, Some(bounds))
                        },
                    )
                },
                || seg.as_ref().ok().map(segments_picture),
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

/// The segment map at its moment, drawn and rasterized.
fn segments_picture(seg: &picture::SegmentsData) -> Result<Picture> {
    Picture::drawn(
        "segments.svg",
        format!("Segments at {}", seg.moment),
        format!(
            "One row per segment: allocated blocks in blue, free (cached) blocks in grey, the largest free block in \
             orange; at an OOM the failed request is the vermillion (red-orange) bar, to the same scale.{}",
            seg.streams.handles_note().map(|n| format!(" Rows name their stream; {n}.")).unwrap_or_default()
        ),
        plot::render_segments(seg)?,
    )
}

/// Memory over time, drawn and rasterized.
fn timeline_picture(tl: &picture::TimelineData) -> Result<Picture> {
    Picture::drawn(
        "timeline.svg",
        "Memory over time".into(),
        "Reserved (segments the allocator holds from the device), allocated (blocks handed to tensors), active \
         and requested bytes, replayed under the recorded settings. The gap between reserved and allocated is \
         cached memory."
            .into(),
        plot::render_timeline(tl)?,
    )
}

/// Live bytes by call site, drawn and rasterized.
fn callsites_picture(st: &picture::StackedData) -> Result<Picture> {
    Picture::drawn(
        "timeline-callsites.svg",
        "Live bytes by call site".into(),
        format!(
            "Live requested bytes stacked by call site (the top {}, the rest as \"other\"). The top edge is the true \
             peak of each pixel column.",
            picture::TOP_CALLSITES
        ),
        plot::render_stacked(st)?,
    )
}

/// The pictures of the replay under the recorded settings, drawn and rasterized as soon as that
/// replay ends (beside the capacity searches): fragmentation over time, and memory over time
/// where the trace's own counters could not give it.
struct DrawnRecorded {
    timeline: Option<Picture>,
    frag: Picture,
}

/// The what-if picture (not rasterized).
fn whatif_picture(wd: &picture::WhatifData) -> Result<Picture> {
    Ok(Picture::new(
        "whatif.svg",
        "Reserved bytes under each policy".into(),
        "The same requests replayed under each what-if policy; the grey line is the live requested bytes, which \
         no allocator can go below, and the dashed line the capacity limit."
            .into(),
        plot::render_whatif(wd)?,
    ))
}

fn draw_recorded(trace: &Trace, drawing: Drawing, replay: &ReplayResult) -> Result<DrawnRecorded> {
    let timeline = drawing.timeline.map(|track| timeline_picture(&track.finish(trace, replay))).transpose()?;
    let fd = drawing.frag_track.finish(trace.name());
    let frag = Picture::drawn(
        "frag.svg",
        "Fragmentation over time".into(),
        "Blue: the share of reserved memory no tensor holds. Orange: how broken up the free memory is (0% = all \
         free memory in one block)."
            .into(),
        plot::render_frag(&fd)?,
    )?;
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

fn pct(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
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
            fmt_bytes(reserved.saturating_sub(allocated))
        ),
    });
    // 3. Contiguity at the moment of the segment map (definition 2).
    if let Some(l) = layout {
        // Measure 2 of the layout ([`crate::model::layout::LayoutMeasures::contiguity`]): the
        // largest free block is one a request outside a private pool could get.
        let c = crate::model::layout::ratio_complement(l.largest_free_bytes, l.free_bytes);
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
                    " (no caching needs {}, at the cost of a device call for every allocation and free: {} here)",
                    fmt_need(none.min_capacity_bytes),
                    b.no_caching_device_calls
                )
            });
            format!(
                " None of the other settings tried needs less than the recorded settings{}.",
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

impl Report {
    /// The document, once, for both renderings.
    pub fn blocks(&self) -> Vec<Block> {
        let e = &self.environment;
        let s = &self.summary;
        let r = &self.replay;
        let mut d = vec![Block::Heading(1, format!("Memory report: {}", code(&self.trace)))];
        // First screen: the verdict and the fix, the picture that shows it, then the findings.
        self.verdict_blocks(&mut d);
        let lead = self.lead_picture();
        if let Some(i) = lead {
            d.push(Block::Picture(i));
            d.push(Block::Para(format!("*{}.* {}", self.pictures[i].title, self.pictures[i].caption)));
        }
        d.push(Block::Heading(2, "Findings".into()));
        d.push(Block::Table(
            vec!["verdict".into(), "finding".into(), "value".into()],
            self.findings
                .iter()
                .map(|f| vec![f.verdict.as_str().to_string(), f.title.clone(), f.value.clone()])
                .collect(),
        ));
        for f in &self.findings {
            d.push(Block::Heading(3, format!("{} ({})", f.title, f.verdict.as_str())));
            d.push(Block::Para(format!("**What it is.** {}", f.definition)));
            d.push(Block::Para(format!("**In this run.** {}", f.explanation)));
        }
        d.push(Block::Heading(2, "Environment".into()));
        let or_unknown = |v: &str| if v.is_empty() { "unknown".to_string() } else { v.to_string() };
        let mut env = vec![
            vec!["device".into(), crate::model::escape::report_text(&or_unknown(&e.device_name))],
            vec![
                "device memory".into(),
                if e.device_total_bytes > 0 { fmt_bytes(e.device_total_bytes) } else { "unknown".into() },
            ],
            vec![
                "allocator settings".into(),
                if e.alloc_conf.is_empty() { "(defaults)".into() } else { code(&e.alloc_conf) },
            ],
            vec![
                "capacity limit".into(),
                crate::model::Capacity { bytes: e.capacity_bytes, source: e.capacity_source, range: None }.text(),
            ],
            vec!["trace source".into(), e.source.into()],
            vec!["written by".into(), format!("alloctrace {}", e.trace_tool_version)],
            vec!["report by".into(), format!("alloctrace {}", e.report_tool_version)],
        ];
        if !e.command_line.is_empty() {
            env.push(vec!["command".into(), code(&e.command_line.join(" "))]);
        }
        for n in &e.notes {
            env.push(vec!["note".into(), crate::model::escape::report_text(n)]);
        }
        d.push(Block::Table(vec!["".into(), "".into()], env));

        d.push(Block::Heading(2, "Summary".into()));
        let peak = |p: &crate::source::summary::Peak| {
            format!("{} at event {} ({})", fmt_bytes(p.bytes), p.event, fmt_ns(p.time_ns))
        };
        let rows = vec![
            vec!["events".into(), format!("{} over {}", s.events, fmt_ns(s.duration_ns))],
            vec!["peak reserved (recorded)".into(), peak(&s.peak_reserved)],
            vec!["peak requested (recorded)".into(), peak(&s.peak_requested)],
            vec![
                "peak allocated".into(),
                match &s.peak_allocated {
                    Some(p) => peak(p),
                    None => {
                        format!("{} (replayed; the trace records no block sizes)", fmt_bytes(r.peak_allocated_bytes))
                    }
                },
            ],
            vec!["peak reserved (replayed)".into(), fmt_bytes(r.peak_reserved_bytes)],
            vec!["OOMs (recorded / replayed)".into(), format!("{} / {}", s.num_ooms, r.num_ooms)],
            vec![
                "device calls (recorded)".into(),
                format!("{} allocations, {} frees", s.num_device_alloc, s.num_device_free),
            ],
            vec!["alloc retries (replayed)".into(), r.num_alloc_retries.to_string()],
            vec![
                "live at the end".into(),
                format!("{} blocks, {} reserved", s.end_live_blocks, fmt_bytes(s.end_reserved_bytes)),
            ],
        ];
        d.push(Block::Table(vec!["measure".into(), "value".into()], rows));

        self.deeper_blocks(&mut d);
        self.category_blocks(&mut d);
        if let Some(r) = &self.ranks {
            d.extend(ranks_blocks(r));
        }

        d.push(Block::Heading(2, "What if: other allocator settings".into()));
        let w = &self.whatif;
        let cap = w.capacity_bytes.map(fmt_bytes).unwrap_or_else(|| "unlimited".into());
        let prefix = w.prediction.is_some();
        d.push(Block::Para(format!(
            "The same requests replayed under each policy at capacity {cap}. *Fragmentation* is 1 - allocated / \
             reserved at the OOM, else at peak reserved; *min capacity* is the smallest limit at which the {} (2 MiB \
             steps). A limit above it can still fail (other limits mean other segments and other pieces): replay the \
             exact limit to check it.{}",
            if prefix { "replay gets past the request that failed" } else { "run completes" },
            if prefix {
                " The trace ends in an out-of-memory error: a replay fails there, fails sooner, or gets past the \
                 request that failed, and the rest of the job is not in the trace."
            } else {
                ""
            }
        )));
        if let Some(p) = &w.prediction {
            d.push(Block::Para(format!("**The whole job.** {}.", p.basis())));
        }
        if let Some(n) = &self.capacity_search_note {
            d.push(Block::Para(n.clone()));
        }
        let mut rows: Vec<Vec<String>> = w
            .rows
            .iter()
            .map(|row| {
                vec![
                    code(&row.policy.to_string()),
                    row.reach.to_string(),
                    // The one decision, as the what-if table, explain and the advice give it.
                    row.decision.short().to_string(),
                    fmt_bytes(row.peak_reserved_bytes),
                    pct(row.fragmentation),
                    (row.num_device_alloc + row.num_device_free).to_string(),
                    row.min_capacity_bytes.map(fmt_need).unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        let b = &w.bounds;
        let none = w.no_caching();
        rows.push(vec![
            "no caching (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`)".into(),
            none.outcome().into(),
            "-".into(),
            none.peak_reserved_bytes.map(fmt_bytes).unwrap_or_else(|| "-".into()),
            none.peak_reserved_bytes.map(|_| pct(0.0)).unwrap_or_else(|| "-".into()),
            b.no_caching_device_calls.to_string(),
            fmt_need(none.min_capacity_bytes),
        ]);
        d.push(Block::Table(
            ["policy", "outcome", "decision", "peak reserved", "fragmentation", "device calls", "min capacity"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            rows,
        ));
        let caching_note = w.capacity_bytes.and_then(|c| none.limit_note(c)).map(|n| format!("No caching: {n}"));
        for note in w.placement_notes().into_iter().chain(w.same_run_notes()).chain(caching_note) {
            d.push(Block::Para(prose(&note)));
        }
        d.push(Block::Para(format!(
            "No allocator needs less than the peak of live requested bytes, {}{}. For reference, an offline plan \
             that knows every lifetime in advance (greedy by size; a heuristic, not a bound) needs {}.",
            fmt_bytes(b.live_requested_peak_bytes),
            if b.includes_failed_request { " (with the request that failed)" } else { "" },
            match (b.offline_plan_bytes, &b.offline_plan_note) {
                (Some(p), _) => fmt_bytes(p),
                (None, Some(n)) => n.clone(),
                (None, None) => "not computed".into(),
            }
        )));

        d.push(Block::Heading(2, "Pictures".into()));
        for (i, p) in self.pictures.iter().enumerate().filter(|(i, _)| Some(*i) != lead) {
            d.push(Block::Heading(3, p.title.clone()));
            d.push(Block::Picture(i));
            d.push(Block::Para(p.caption.clone()));
        }
        // Given one trace per rank, the report was made from all of them.
        let traces = match &self.ranks {
            Some(r) => r.ranks.iter().map(|row| row.trace.as_str()).collect::<Vec<_>>().join(" "),
            None => self.trace.clone(),
        };
        d.push(Block::Para(format!(
            "Made with {}; regenerate any picture with `alloctrace plot`.",
            code(&format!("alloctrace report {traces}"))
        )));
        d
    }

    /// Adds the section across ranks (this report being of the peaking rank's trace) and its picture.
    pub fn add_ranks(&mut self, mut ranks: crate::analysis::ranks::RanksReport) -> Result<()> {
        // The traces by file name, as the report names its own: a report is a function of the
        // traces, not of where they lie.
        for row in &mut ranks.ranks {
            row.trace = crate::model::trace_name(std::path::Path::new(&row.trace));
        }
        let mut picture = Picture::new(
            "ranks.svg",
            "Across the ranks".into(),
            ranks_caption(&ranks),
            crate::render::plot::render_ranks(&ranks)?,
        );
        picture.png = crate::render::raster::png_of_svg(&picture.svg).context("cannot draw ranks.svg as a PNG")?;
        self.pictures.push(picture);
        self.ranks = Some(ranks);
        Ok(())
    }

    /// The section on what the memory is for.
    fn category_blocks(&self, d: &mut Vec<Block>) {
        let Some(c) = &self.categories else { return };
        d.push(Block::Heading(2, "What the memory is for".into()));
        d.push(Block::Para(format!(
            "Each allocation gets a category from the phase that allocated it (phases from {}; {} forward passes) \
             and its lifetime. At {} (event {}): {}.",
            c.phases_from,
            c.forward_passes,
            c.peak_words(),
            c.peak_event,
            c.at_peak.shares_text()
        )));
        let total = c.at_peak.total().max(1) as f64;
        let rows = crate::analysis::category::shown(c.max.unknown)
            .map(|k| {
                vec![
                    k.as_str().to_string(),
                    fmt_bytes(c.at_peak.get(k)),
                    pct(c.at_peak.get(k) as f64 / total),
                    fmt_bytes(c.max.get(k)),
                    c.allocations.get(k).to_string(),
                ]
            })
            .collect();
        d.push(Block::Table(
            ["category", "at the peak", "share", "most at any moment", "allocations"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            rows,
        ));
        if let Some(k) = &c.checkpointing {
            d.push(Block::Para(format!(
                "**Activation checkpointing, estimated.** The {}.",
                crate::analysis::category::checkpoint_text(k)
            )));
        }
    }

    /// The verdict and the fix, as `explain` states them (its diagnosis and its first advice,
    /// with the figure that backs it); where `explain` could not run, the problems found.
    fn verdict_blocks(&self, d: &mut Vec<Block>) {
        let Some(x) = &self.explain else {
            let problems: Vec<String> = self
                .findings
                .iter()
                .filter(|f| f.verdict == Verdict::Problem)
                .map(|f| format!("**{}**: {}", f.title, f.value))
                .collect();
            d.push(Block::Para(if problems.is_empty() {
                "No problem found by the checks below.".to_string()
            } else {
                format!("Problems: {}.", problems.join("; "))
            }));
            return;
        };
        d.push(Block::Para(format!("**Verdict: {}.** {}.", x.verdict.kind.as_str(), prose(&x.verdict.reason))));
        match &x.fix {
            Some(fix) => {
                let setting = fix
                    .setting
                    .as_ref()
                    .filter(|s| !fix.text.contains(s.as_str()))
                    .map(|s| format!(" ({})", code(s)))
                    .unwrap_or_default();
                let label = match fix.strength {
                    "proven" => "Fix",
                    "worth_trying" => "Worth trying first",
                    _ => "Suggestion",
                };
                d.push(Block::Para(format!(
                    "**{label}:** {}{setting}. *Evidence:* {}.",
                    prose(&fix.text),
                    prose(&fix.evidence)
                )));
                if x.advice.len() + x.worth_trying.len() > 1 {
                    d.push(Block::Para(
                        "More advice, what is worth trying, what was not advised and why: see *Why* below.".into(),
                    ));
                }
            }
            None => d.push(Block::Para("**Fix:** none that the evidence supports (see *Why* below).".into())),
        }
    }

    /// The picture shown under the verdict: the segment map at an OOM, else memory over time.
    fn lead_picture(&self) -> Option<usize> {
        let oom = self.replay.is_oom();
        let find = |f: &str| self.pictures.iter().position(|p| p.file == f);
        if oom {
            find("segments.svg").or_else(|| find("timeline.svg"))
        } else {
            find("timeline.svg")
        }
    }

    /// The sections of `explain`, `frag` and `leaks`.
    fn deeper_blocks(&self, d: &mut Vec<Block>) {
        d.push(Block::Heading(2, "Why: explain, fragmentation, leaks".into()));
        for e in &self.analysis_errors {
            d.push(Block::Note(format!("**Not analysed.** {}", prose(e))));
        }
        if let Some(x) = &self.explain {
            d.push(Block::Heading(3, format!("Diagnosis: {}", x.verdict.kind.as_str())));
            d.push(Block::Para(prose(&x.verdict.reason)));
            if let Some(m) = &x.pytorch_message {
                d.push(Block::Para("What PyTorch's out-of-memory message would have said:".into()));
                d.push(Block::Code(m.clone()));
            }
            if !x.advice.is_empty() {
                d.push(Block::Table(
                    vec!["advice".into(), "evidence".into()],
                    x.advice
                        .iter()
                        .map(|a| {
                            let text = match &a.setting {
                                Some(s) if !a.text.contains(s.as_str()) => format!("{} ({})", prose(&a.text), code(s)),
                                _ => prose(&a.text),
                            };
                            vec![text, prose(&a.evidence)]
                        })
                        .collect(),
                ));
            }
            if !x.experiments.is_empty() {
                d.push(Block::Table(
                    vec!["experiment (replayed)".into(), "outcome".into(), "peak reserved".into()],
                    x.experiments
                        .iter()
                        .map(|e| vec![e.description.clone(), e.reach.short().into(), fmt_bytes(e.peak_reserved_bytes)])
                        .collect(),
                ));
            }
            if !x.worth_trying.is_empty() {
                d.push(Block::Para(
                    "Worth trying (a replay shows each may get through: it gets past the request that failed, or \
through the cuDNN workspaces that fail; none is proven to fit):"
                        .into(),
                ));
                d.push(Block::Table(
                    vec!["setting".into(), "peak reserved to the failure".into(), "whole job, predicted".into()],
                    x.worth_trying
                        .iter()
                        .map(|w| {
                            vec![
                                code(&w.setting),
                                fmt_bytes(w.peak_reserved_bytes),
                                w.predicted_needs_bytes
                                    .map(|n| format!("about {}", fmt_bytes(n)))
                                    .unwrap_or("-".into()),
                            ]
                        })
                        .collect(),
                ));
            }
            for n in &x.not_advised {
                d.push(Block::Para(format!("Not advised: {}", prose(n))));
            }
            for n in &x.cannot_tell {
                d.push(Block::Para(format!("Cannot tell: {}", prose(n))));
            }
            // The patterns explain found, where its advice does not already state them.
            let patterns =
                [x.empty_cache_calls.as_ref().map(|e| e.text()), x.held_for_streams.as_ref().map(|h| h.text())];
            for p in patterns.into_iter().flatten() {
                if !x.advice.iter().any(|a| a.evidence.contains(&p)) {
                    d.push(Block::Para(format!("Pattern: {}.", prose(&p))));
                }
            }
        }
        if let Some(f) = &self.frag {
            d.push(Block::Heading(3, "Fragmentation, four ways".into()));
            d.push(Block::Table(
                ["measure", "what it is", "at the moment", "at peak reserved", "mean", "max"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                f.measures
                    .iter()
                    .map(|m| {
                        vec![
                            m.name.to_string(),
                            m.definition.to_string(),
                            format!("{} ({})", pct(m.at_moment), fmt_bytes(m.at_moment_bytes)),
                            pct(m.at_peak),
                            pct(m.mean),
                            format!("{} at event {}", pct(m.max), m.max_event),
                        ]
                    })
                    .collect(),
            ));
        }
        if let Some(l) = &self.leaks {
            d.push(Block::Heading(3, "Leaks".into()));
            d.push(Block::Para(format!(
                "{} allocations ({}) are still live at the end of the trace.",
                l.live_at_end_count,
                fmt_bytes(l.live_at_end_bytes)
            )));
            if !l.live_at_end.is_empty() {
                d.push(Block::Table(
                    vec!["still live, by call site".into(), "blocks".into(), "requested bytes".into()],
                    l.live_at_end
                        .iter()
                        .take(8)
                        .map(|s| vec![code(&s.site.label), s.count.to_string(), fmt_bytes(s.requested_bytes)])
                        .collect(),
                ));
            }
            match &l.growth {
                Some(g) => {
                    d.push(Block::Para(format!(
                        "Growth: {} live per iteration over {} iterations (iterations from {}).",
                        crate::model::units::fmt_delta(g.per_iteration_bytes.round() as i64),
                        g.iterations(),
                        g.source
                    )));
                    let growing: Vec<Vec<String>> = g
                        .sites
                        .iter()
                        .filter(|s| s.per_iteration_bytes > 0.0)
                        .take(5)
                        .map(|s| {
                            vec![
                                code(&s.site.label),
                                crate::model::units::fmt_delta(s.per_iteration_bytes.round() as i64),
                                format!("{} of {}", s.rising_intervals, s.intervals),
                            ]
                        })
                        .collect();
                    if !growing.is_empty() {
                        d.push(Block::Table(
                            vec!["growing call site".into(), "per iteration".into(), "iterations rising".into()],
                            growing,
                        ));
                    }
                }
                None => {
                    if let Some(n) = &l.growth_note {
                        d.push(Block::Para(format!("Growth: {}", prose(n))));
                    }
                }
            }
            d.push(Block::Para(format!(
                "Retention at event {}: `empty_cache()` would give back {} now.",
                l.retention.event,
                fmt_bytes(l.retention.empty_cache_now_bytes)
            )));
        }
    }

    /// GitHub-flavoured Markdown; pictures are the PNG files next to it, each linked to its SVG.
    pub fn markdown(&self) -> String {
        self.markdown_with(PictureLinks::Files)
    }

    /// GitHub-flavoured Markdown, with the pictures as files or inline.
    pub fn markdown_with(&self, links: PictureLinks) -> String {
        let mut out = String::new();
        for b in self.blocks() {
            match b {
                Block::Heading(level, text) => {
                    out.push_str(&"#".repeat(level as usize));
                    out.push(' ');
                    out.push_str(&crate::model::escape::report_markdown(&text));
                    out.push_str("\n\n");
                }
                // Prose wrapped at 100 columns (a soft line break renders as a space).
                Block::Para(text) => {
                    let md = crate::model::escape::report_markdown(&text);
                    out.push_str(&crate::model::wrap::lines(&md, crate::model::wrap::WIDTH, true).join("\n"));
                    out.push_str("\n\n");
                }
                Block::Note(text) => {
                    let md = crate::model::escape::report_markdown(&text);
                    for l in crate::model::wrap::lines(&md, crate::model::wrap::WIDTH - 2, true) {
                        out.push_str("> ");
                        out.push_str(&l);
                        out.push('\n');
                    }
                    out.push('\n');
                }
                Block::Code(text) => {
                    // A fence longer than any backtick run in the text, which cannot close it.
                    let text: String = text.lines().map(|l| crate::model::escape::terminal(l) + "\n").collect();
                    let fence = "`".repeat(3.max(text.split(|c| c != '`').map(str::len).max().unwrap_or(0) + 1));
                    out.push_str(&format!("{fence}text\n{text}{fence}\n\n"));
                }
                Block::Table(head, rows) => {
                    let cell = |s: &str| crate::model::escape::report_markdown(s);
                    out.push_str(&format!("| {} |\n", head.iter().map(|h| cell(h)).collect::<Vec<_>>().join(" | ")));
                    out.push_str(&format!("|{}\n", "---|".repeat(head.len())));
                    for row in rows {
                        out.push_str(&format!("| {} |\n", row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")));
                    }
                    out.push('\n');
                }
                Block::Picture(i) => {
                    let p = &self.pictures[i];
                    let alt = crate::model::escape::report_markdown(&p.title);
                    match links {
                        PictureLinks::Files => out.push_str(&format!("[![{alt}]({})]({})\n\n", p.png_file, p.file)),
                        PictureLinks::Inline => {
                            use base64::Engine as _;
                            let data = base64::engine::general_purpose::STANDARD.encode(&p.png);
                            out.push_str(&format!("![{alt}](data:image/png;base64,{data})\n\n"));
                        }
                    }
                }
            }
        }
        out
    }

    /// One self-contained page: styles and pictures inline, no scripts, no network.
    pub fn html(&self) -> String {
        let mut out = String::new();
        out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
        out.push_str(&format!("<title>Memory report: {}</title>\n", escape(&self.trace)));
        out.push_str(
            "<style>\nbody{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1240px;margin:2em auto;\
             padding:0 1em;color:#1f2328;line-height:1.5}\ntable{border-collapse:collapse;margin:1em 0}\n\
             th,td{border:1px solid #d0d7de;padding:4px 10px;text-align:left}\nth{background:#f6f8fa}\n\
             code{background:#f6f8fa;padding:1px 4px;border-radius:4px}\n\
             pre{background:#f6f8fa;padding:.8em;overflow-x:auto;white-space:pre-wrap}\n\
             blockquote{border-left:4px solid #d29922;background:#fff8c5;margin:1em 0;padding:.5em 1em}\n\
             figure{margin:1em 0}\nfigure svg{max-width:100%;height:auto;border:1px solid #d0d7de}\n\
             .problem{color:#cf222e;font-weight:600}.warning{color:#9a6700;font-weight:600}\
             .ok{color:#1a7f37}.info{color:#0969da}\n</style>\n</head>\n<body>\n",
        );
        for b in self.blocks() {
            match b {
                Block::Heading(level, text) => out.push_str(&format!("<h{level}>{}</h{level}>\n", inline(&text))),
                Block::Para(text) => out.push_str(&format!("<p>{}</p>\n", inline(&text))),
                Block::Note(text) => out.push_str(&format!("<blockquote>{}</blockquote>\n", inline(&text))),
                Block::Code(text) => out.push_str(&format!("<pre>{}</pre>\n", escape(&text))),
                Block::Table(head, rows) => {
                    out.push_str("<table>\n");
                    if head.iter().any(|h| !h.is_empty()) {
                        out.push_str("<tr>");
                        for h in head {
                            out.push_str(&format!("<th>{}</th>", inline(&h)));
                        }
                        out.push_str("</tr>\n");
                    }
                    for row in rows {
                        out.push_str("<tr>");
                        for c in row {
                            let class = match c.as_str() {
                                "problem" | "warning" | "ok" | "info" => format!(" class=\"{c}\""),
                                _ => String::new(),
                            };
                            out.push_str(&format!("<td{class}>{}</td>", inline(&c)));
                        }
                        out.push_str("</tr>\n");
                    }
                    out.push_str("</table>\n");
                }
                Block::Picture(i) => {
                    let p = &self.pictures[i];
                    let svg = p.svg.trim_start_matches(|c: char| c != '<');
                    let svg =
                        if svg.starts_with("<?xml") { svg.split_once("?>").map(|x| x.1).unwrap_or(svg) } else { svg };
                    out.push_str(&format!("<figure id=\"{}\">\n{}\n</figure>\n", escape(&p.file), svg.trim()));
                }
            }
        }
        out.push_str("</body>\n</html>\n");
        out
    }

    /// `summary.json`.
    pub fn json(&self) -> Result<String> {
        let mut s = serde_json::to_string_pretty(&crate::model::output::json::V1::of(self))?;
        s.push('\n');
        Ok(s)
    }

    /// The report's files, by name: `report.md` (its pictures as files or inline), `report.html`,
    /// `summary.json`, and each picture as SVG and PNG, for [`crate::model::output::write_report`].
    pub fn files(&self, links: PictureLinks) -> Result<Vec<(String, Vec<u8>)>> {
        let mut files: Vec<(String, Vec<u8>)> = vec![
            ("report.md".into(), self.markdown_with(links).into_bytes()),
            ("report.html".into(), self.html().into_bytes()),
            ("summary.json".into(), self.json()?.into_bytes()),
        ];
        for p in &self.pictures {
            files.push((p.file.clone(), p.svg.clone().into_bytes()));
            files.push((p.png_file.clone(), p.png.clone()));
        }
        Ok(files)
    }
}

pub use crate::model::output::MAX_REPORT_FILE_BYTES;

/// A sentence of an analysis (a verdict's reason, advice and its evidence, a growth note) as
/// text of the report: it quotes call sites and settings from the trace as they are, so none of
/// its characters is the report's markup (see [`crate::model::escape::report_text`]).
fn prose(s: &str) -> String {
    crate::model::escape::report_text(s)
}

/// A string from a trace as a code span of the report's text (see [`crate::model::escape::report_code`]).
fn code(s: &str) -> String {
    crate::model::escape::report_code(s)
}

/// An optional text of the report's markup as plain text (see [`Finding`]).
fn plain_option<S: serde::Serializer>(s: &Option<String>, ser: S) -> std::result::Result<S::Ok, S::Error> {
    match s {
        Some(s) => crate::model::escape::serialize_report_plain(s, ser),
        None => ser.serialize_none(),
    }
}

/// Escapes text for HTML (see [`crate::model::escape`]).
pub fn escape(s: &str) -> String {
    crate::model::escape::html(s).into_owned()
}

/// Escapes text and turns `code`, **bold** and *emphasis* into HTML.
fn inline(s: &str) -> String {
    crate::model::escape::report_html(s)
}

// ---------------------------------------------------------------------------------------------
// The section across ranks

/// The report's section across the ranks: the table, the peaking rank and skew, the differing
/// call sites (its picture is among the report's pictures).
fn ranks_blocks(rep: &crate::analysis::ranks::RanksReport) -> Vec<Block> {
    use crate::model::units::{fmt_bytes, fmt_ns};
    let mut d = vec![Block::Heading(
        2,
        format!("Across the ranks ({})", crate::model::units::count(rep.ranks.len() as u64, "trace")),
    )];
    let peak = rep.ranks.iter().find(|r| r.rank == rep.peaking_rank);
    if let Some(p) = peak {
        d.push(Block::Para(format!(
            "Rank {} peaks: {} reserved at its peak, {:.2}x the median of the ranks' peaks of reserved bytes ({:.2}x \
             of allocated bytes). The sections above are of its trace, `{}`.",
            p.rank,
            fmt_bytes(p.peak_reserved.bytes),
            rep.skew_reserved,
            rep.skew_allocated,
            p.trace
        )));
    }
    let mut head: Vec<String> =
        ["rank", "trace", "peak reserved", "peak allocated", "OOMs", "fragmentation at the peak"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    head.extend(["device calls", "iterations"].iter().map(|s| s.to_string()));
    let rows = rep
        .ranks
        .iter()
        .map(|r| {
            vec![
                r.rank.to_string(),
                crate::model::escape::report_code(&r.trace),
                format!(
                    "{} at event {} ({})",
                    fmt_bytes(r.peak_reserved.bytes),
                    r.peak_reserved.event,
                    fmt_ns(r.peak_reserved.time_ns)
                ),
                format!(
                    "{} at event {} ({})",
                    fmt_bytes(r.peak_allocated.bytes),
                    r.peak_allocated.event,
                    fmt_ns(r.peak_allocated.time_ns)
                ),
                r.ooms.to_string(),
                format!("{:.1}%", r.fragmentation_at_peak * 100.0),
                (r.device_allocs + r.device_frees).to_string(),
                match &r.iterations_from {
                    Some(from) => format!("{} ({from})", r.iterations),
                    None => "none found".to_string(),
                },
            ]
        })
        .collect();
    d.push(Block::Table(head, rows));
    if rep.ranks.iter().any(|r| r.categories_at_peak.is_some()) {
        let unknown = rep.ranks.iter().filter_map(|r| r.categories_at_peak.map(|c| c.unknown)).max().unwrap_or(0);
        let shown: Vec<_> = crate::analysis::category::shown(unknown).collect();
        let mut head = vec!["rank".to_string()];
        head.extend(shown.iter().map(|c| c.as_str().to_string()));
        let rows = rep
            .ranks
            .iter()
            .map(|r| {
                let mut row = vec![r.rank.to_string()];
                match &r.categories_at_peak {
                    Some(c) => row.extend(shown.iter().map(|&k| fmt_bytes(c.get(k)))),
                    None => row.extend(shown.iter().map(|_| "-".to_string())),
                }
                row
            })
            .collect();
        d.push(Block::Para("Bytes by category at each rank's peak of allocated bytes:".into()));
        d.push(Block::Table(head, rows));
    }
    if rep.differing_sites.is_empty() {
        d.push(Block::Para("The ranks hold the same bytes per call site at their peaks.".into()));
    } else {
        d.push(Block::Para("The call sites whose live bytes at each rank's peak differ most between ranks:".into()));
        let mut head = vec!["call site".to_string()];
        head.extend(rep.ranks.iter().map(|r| format!("rank {}", r.rank)));
        head.push("spread".into());
        let rows = rep
            .differing_sites
            .iter()
            .map(|s| {
                let mut row = vec![crate::model::escape::report_code(&s.site.label)];
                row.extend(s.bytes.iter().map(|b| fmt_bytes(*b)));
                row.push(fmt_bytes(s.spread_bytes));
                row
            })
            .collect();
        d.push(Block::Table(head, rows));
    }
    d
}

/// The caption of the ranks picture ([`crate::render::plot::render_ranks`]).
fn ranks_caption(rep: &crate::analysis::ranks::RanksReport) -> String {
    if rep.aligned_on_iterations {
        "Per-rank peaks of reserved and allocated bytes, and each rank's allocated bytes with the timelines aligned \
         on iteration starts."
    } else {
        "Per-rank peaks of reserved and allocated bytes, and each rank's allocated bytes over the share of its \
         events (no iterations found in every trace)."
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::inline;

    #[test]
    fn inline_markup() {
        assert_eq!(inline("**a** `x<y` *b* c&d"), "<strong>a</strong> <code>x&lt;y</code> <em>b</em> c&amp;d");
    }
}
