//! `alloctrace report TRACE... -o DIR`: report.md, report.html, summary.json and the pictures.
//! With several traces (one per rank), the report is of the rank that peaks, with a section
//! across the ranks ([`crate::analysis::ranks`]).

use super::{exit, write_json};
use crate::render::report::{build, PictureLinks, ReportOptions};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

pub struct ReportCmdOptions {
    /// One trace, or one per rank.
    pub traces: Vec<PathBuf>,
    /// What the user says about the run (limit, settings, device of a snapshot).
    pub facts: crate::source::input::RunFacts,
    pub output: PathBuf,
    pub search_capacity: bool,
    pub json: bool,
    /// Write into a folder that holds other files than a previous report's.
    pub force: bool,
    /// report.md with its PNGs inline (`data:` URIs) rather than as files beside it.
    pub inline_pictures: bool,
}

pub fn run(opts: &ReportCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let inputs: Vec<&std::path::Path> = opts.traces.iter().map(|p| p.as_path()).collect();
    crate::model::output::check_report_dir(&opts.output, &inputs, opts.force)?;
    anyhow::ensure!(!opts.traces.is_empty(), "give a trace, or one per rank");
    // Several ranks: the cross-rank view, and the report is of the rank that peaks.
    let ranks = if opts.traces.len() > 1 {
        let traces = opts.traces.iter().map(|p| super::open_any(p, None, 0)).collect::<Result<Vec<_>>>()?;
        Some(crate::analysis::ranks::analyze(&traces)?)
    } else {
        None
    };
    let subject = match &ranks {
        Some(r) => &opts.traces[r.peaking_index],
        None => &opts.traces[0],
    };
    let trace = match super::open_analysable(subject, &opts.facts, opts.json, out)? {
        Ok(trace) => trace,
        Err(code) => return Ok(code),
    };
    let mut report =
        build(&trace, &ReportOptions { search_capacity: opts.search_capacity, search_long_traces: false })?;
    if let Some(mut r) = ranks {
        // The traces by file name, as the report names its own: a report is a function of the
        // traces, not of where they lie.
        for row in &mut r.ranks {
            row.trace = crate::model::trace_name(std::path::Path::new(&row.trace));
        }
        report.add_ranks(r)?;
    }
    let links = if opts.inline_pictures { PictureLinks::Inline } else { PictureLinks::Files };
    let files = crate::model::output::write_report(&opts.output, &inputs, &report.files(links)?)?;
    if opts.json {
        write_json(out, &report)?;
    } else {
        for f in &report.findings {
            writeln!(out, "{:<8} {}: {}", f.verdict.as_str(), f.title, f.value)?;
        }
        for f in &files {
            writeln!(out, "wrote {}", f.display())?;
        }
    }
    if let Some(w) = &report.replay.input_damage {
        crate::model::escape::warn(w);
        return Ok(exit::PARTIAL);
    }
    Ok(exit::OK)
}
