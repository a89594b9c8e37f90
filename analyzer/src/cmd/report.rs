//! `alloctrace report TRACE -o DIR`: report.md, report.html, summary.json and the pictures.

use super::{exit, write_json};
use crate::report::{build, PictureLinks, ReportOptions};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

pub struct ReportCmdOptions {
    pub trace: PathBuf,
    /// What the user says about the run (limit, settings, device of a snapshot).
    pub facts: crate::input::RunFacts,
    pub output: PathBuf,
    pub search_capacity: bool,
    pub json: bool,
    /// Write into a folder that holds other files than a previous report's.
    pub force: bool,
    /// report.md with its PNGs inline (`data:` URIs) rather than as files beside it.
    pub inline_pictures: bool,
}

pub fn run(opts: &ReportCmdOptions, out: &mut dyn Write) -> Result<i32> {
    crate::output::check_report_dir(&opts.output, opts.force)?;
    let trace = match super::open_analysable(&opts.trace, &opts.facts, out)? {
        Ok(trace) => trace,
        Err(code) => return Ok(code),
    };
    let report = build(&trace, &ReportOptions { search_capacity: opts.search_capacity, search_long_traces: false })?;
    let links = if opts.inline_pictures { PictureLinks::Inline } else { PictureLinks::Files };
    let files = report.write_with(&opts.output, &[&opts.trace], links)?;
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
        eprintln!("alloctrace: warning: {}", crate::escape::terminal(&w.to_string()));
        return Ok(exit::PARTIAL);
    }
    Ok(exit::OK)
}
