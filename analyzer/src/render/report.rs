//! `alloctrace report`: one trace's findings as a document to paste into a ticket
//! (`report.md`), a self-contained page (`report.html`, pictures inline, no network), and
//! everything machine-readable (`summary.json`).
//!
//! [`crate::analysis::report`] computes; this module draws its pictures ([`ReportPainter`]) and
//! renders. The document is a small list of [`Block`]s rendered twice, so the Markdown and the
//! HTML can never say different things.

use crate::analysis::picture;
pub use crate::analysis::report::{Environment, Finding, LayoutAt, ReportOptions, Verdict};
use crate::analysis::report::{Painter, PictureData};
use crate::model::output::document::Block;
use crate::model::units::{fmt_bytes, fmt_need, fmt_ns, pct};
use crate::model::Trace;
use crate::render::plot;
use anyhow::{Context, Result};
use serde::Serialize;

/// `summary.json`, and everything the documents are rendered from: the report's analysis with
/// its pictures drawn.
pub type Report = crate::analysis::report::Report<Picture>;

/// Computes everything a report shows ([`crate::analysis::report::build`]), its pictures drawn
/// as SVG and PNG.
pub fn build(trace: &Trace, opts: &ReportOptions) -> Result<Report> {
    crate::analysis::report::build(trace, opts, &ReportPainter)
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

/// Draws the report's pictures: each as an SVG with its title and caption, finished by its PNG.
pub struct ReportPainter;

impl Painter for ReportPainter {
    type Picture = Picture;

    fn draw(&self, data: PictureData<'_>) -> Result<Picture> {
        match data {
            PictureData::Timeline(tl) => timeline_picture(tl),
            PictureData::Callsites(st) => callsites_picture(st),
            PictureData::Segments(seg) => segments_picture(seg),
            PictureData::Whatif(wd) => whatif_picture(wd),
            PictureData::Frag(fd) => Ok(Picture::new(
                "frag.svg",
                "Fragmentation over time".into(),
                "Blue: the share of reserved memory no tensor holds. Orange: how broken up the free memory is (0% = \
                 all free memory in one block)."
                    .into(),
                plot::render_frag(fd)?,
            )),
            PictureData::Categories(c) => categories_picture(c),
        }
    }

    fn finish(&self, p: &mut Picture) -> Result<()> {
        if p.png.is_empty() {
            p.rasterize()?;
        }
        Ok(())
    }
}

/// The segment map at its moment, drawn.
fn segments_picture(seg: &picture::SegmentsData) -> Result<Picture> {
    Ok(Picture::new(
        "segments.svg",
        format!("Segments at {}", seg.moment),
        format!(
            "One row per segment: allocated blocks in blue, free (cached) blocks in grey, the largest free block in \
             orange; at an OOM the failed request is the vermillion (red-orange) bar, to the same scale.{}",
            seg.streams.handles_note().map(|n| format!(" Rows name their stream; {n}.")).unwrap_or_default()
        ),
        plot::render_segments(seg)?,
    ))
}

/// Memory over time, drawn.
fn timeline_picture(tl: &picture::TimelineData) -> Result<Picture> {
    Ok(Picture::new(
        "timeline.svg",
        "Memory over time".into(),
        "Reserved (segments the allocator holds from the device), allocated (blocks handed to tensors), active \
         and requested bytes, replayed under the recorded settings. The gap between reserved and allocated is \
         cached memory."
            .into(),
        plot::render_timeline(tl)?,
    ))
}

/// Live bytes by call site, drawn.
fn callsites_picture(st: &picture::StackedData) -> Result<Picture> {
    Ok(Picture::new(
        "timeline-callsites.svg",
        "Live bytes by call site".into(),
        format!(
            "Live requested bytes stacked by call site (the top {}, the rest as \"other\"). The top edge is the true \
             peak of each pixel column.",
            picture::TOP_CALLSITES
        ),
        plot::render_stacked(st)?,
    ))
}

/// The what-if picture, drawn.
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

/// Live bytes by category, drawn.
fn categories_picture(c: &crate::analysis::category::Categories) -> Result<Picture> {
    Ok(Picture::new(
        "categories.svg",
        "Live bytes by category".into(),
        format!(
            "Live allocated bytes stacked by what they are for (phases from {}); the black line is the peak of \
             allocated bytes. Each point is the highest total in its stretch of events.",
            crate::analysis::category::phases_from_text(c.phases_from)
        ),
        plot::render_categories(c, "Live bytes by category")?,
    ))
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
            vec!["capacity limit".into(), crate::model::Capacity::of(e.capacity_bytes, e.capacity_source).text()],
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
        let cap = match w.capacity_bytes {
            Some(_) => {
                format!("at capacity {}", crate::model::Capacity::of(w.capacity_bytes, w.capacity_source).text())
            }
            None => format!("with {}", crate::model::units::fmt_limit(None)),
        };
        let prefix = w.prediction.is_some();
        d.push(Block::Para(format!(
            "The same requests replayed under each policy {cap}. *Fragmentation* is 1 - allocated / \
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
        for note in w
            .placement_notes()
            .into_iter()
            .chain(w.placed_by_rule_notes())
            .chain(w.same_run_notes())
            .chain(caching_note)
        {
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
        // With the limit where it was given: without it, the command would replay at another.
        let given = match (self.replay.capacity_source, self.replay.capacity_bytes) {
            (crate::model::CapacitySource::Given, Some(c)) => format!(" --capacity {c}"),
            _ => String::new(),
        };
        d.push(Block::Para(format!(
            "Made with {}; regenerate any picture with `alloctrace plot`.",
            code(&format!("alloctrace report {traces}{given}"))
        )));
        d
    }

    /// Adds the section across ranks (this report being of the peaking rank's trace) and its picture.
    pub fn add_ranks(&mut self, ranks: crate::analysis::ranks::RanksReport) -> Result<()> {
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
            crate::analysis::category::phases_from_text(c.phases_from),
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
                                w.whole_job_short.clone().unwrap_or("-".into()),
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
            // A trace that stops at its failure ends there: what is live is what the job held when
            // it failed, not what it leaked.
            let at_failure = self.whatif.prediction.is_some();
            d.push(Block::Heading(
                3,
                if at_failure { "Still live at the failure, and growth".into() } else { "Leaks".into() },
            ));
            d.push(Block::Para(format!(
                "{} allocations ({}) are still live at the end of the trace{}.",
                l.live_at_end_count,
                fmt_bytes(l.live_at_end_bytes),
                if at_failure { ", where it failed: the job held them then, which is no leak by itself" } else { "" }
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
                        "Growth: {} live per iteration over {} iterations (iterations from {}){}.",
                        crate::model::units::fmt_delta(g.per_iteration_bytes.round() as i64),
                        g.iterations(),
                        g.source,
                        if g.iterations() < crate::analysis::leaks::MIN_STEADY_ITERATIONS {
                            ": too few to tell growth from state made once"
                        } else {
                            ""
                        }
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
                crate::model::units::pct(r.fragmentation_at_peak),
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
