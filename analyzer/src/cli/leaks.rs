//! `alloctrace leaks`: its arguments, handed to the library's command.

use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// Live allocations at the end, growth per iteration by call site, and what pins reserved memory.
#[derive(ClapArgs)]
#[command(
    long_about = "Find leaks and what they cost.\n\n\
Live at the end: allocations never freed, grouped by call site (the innermost frame of your \
code; frames inside torch and site-packages are skipped), with their count, bytes and age.\n\n\
Growth: live bytes compared at the same phase of successive iterations. Iterations come from \
iteration marks, else from an annotation that repeats (e.g. Optimizer.zero_grad), else from \
the repeating pattern of allocations (call site and size). Call sites whose live bytes rise \
every iteration are reported as \"+N allocations, +X per iteration from FILE:LINE\".\n\n\
Retention: a segment goes back to the device only when every block in it is free, so one \
small live tensor can pin a 20 MiB segment. At the end of the run (at its out-of-memory where \
it ends in one; or --at EVENT) this lists what empty_cache() would free now, and what it would free if a call site released its blocks.",
    after_help = "Example:\n  alloctrace leaks traces/leak_list_append.default.atrace"
)]
pub struct Args {
    /// A trace (.atrace) or a PyTorch memory snapshot (.pickle).
    pub trace: PathBuf,
    #[command(flatten)]
    pub run: super::args::RunArgs,
    /// Analyse retention after this event index instead of at the end (or the out-of-memory).
    #[arg(long)]
    pub at: Option<u64>,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::leaks::run(
            &cmd::leaks::LeaksCmdOptions {
                trace: self.trace,
                facts: self.run.facts(),
                at_event: self.at,
                json: self.json.json,
            },
            out,
        )
    }
}
