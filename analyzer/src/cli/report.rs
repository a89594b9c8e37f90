//! `alloctrace report`: its arguments, handed to the library's command.

use super::args::RunArgs;
use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// Write a report to paste into a ticket: report.md, report.html, summary.json, SVGs and PNGs.
#[derive(ClapArgs)]
#[command(
    long_about = "Write a report of the trace into a directory: report.md (GitHub-flavoured Markdown to \
paste into an issue: the verdict and the fix first, the pictures as PNG files beside it, or inline \
with --inline-pictures), report.html (one self-contained page with the pictures inline; opens \
offline), summary.json (every figure, machine-readable), and each picture as SVG and PNG (drawn \
with an embedded font, so the same on every machine).\n\n\
The report states the environment (device, capacity limit, allocator settings, versions), the \
summary figures, findings with verdicts (out of memory, reserved-but-unallocated memory, free \
memory in pieces, memory needed beyond the live bytes, a leak or what is still live at the end), each \
defined in plain words; the diagnosis and advice of `explain`, the four fragmentation measures \
of `frag` and the leak analysis of `leaks`; the what-if table of other allocator settings; and \
the pictures of `plot`; where the trace has phases, what the memory is for (bytes by category \
at the peak and over time, and an estimate of activation checkpointing). Nothing in it depends on \
the clock or where the trace lies, so the same trace gives the same files.\n\n\
With several traces (one per rank of a distributed job), the report is of the rank that peaks, \
with a section across the ranks (`alloctrace ranks`) and its picture.",
    after_help = "Example:\n  alloctrace report traces/frag_oom.default.atrace -o report/\n  \
open report/report.html"
)]
pub struct Args {
    /// The trace, or one trace per rank.
    #[arg(required = true)]
    pub trace: Vec<PathBuf>,
    #[command(flatten)]
    pub run: RunArgs,
    /// The directory to write into (created if missing).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Skip the search for the smallest capacity of each policy (faster on huge traces).
    #[arg(long)]
    pub no_search: bool,
    /// Write into a folder that is neither empty nor an earlier report (recognised by its
    /// summary.json); files there with a report's names are replaced.
    #[arg(long)]
    pub force: bool,
    /// Print summary.json to stdout as well.
    #[arg(long)]
    pub json: bool,
    /// Put the PNGs inside report.md as data: URIs (one file that shows its pictures in
    /// editors, GitLab and most wikis; GitHub drops data: images, so there attach the PNGs).
    #[arg(long)]
    pub inline_pictures: bool,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::report::run(
            &cmd::report::ReportCmdOptions {
                traces: self.trace,
                facts: self.run.facts(),
                output: self.output,
                search_capacity: !self.no_search,
                json: self.json,
                force: self.force,
                inline_pictures: self.inline_pictures,
            },
            out,
        )
    }
}
