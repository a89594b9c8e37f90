//! `alloctrace diff`: its arguments, handed to the library's command.

use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// Compare two runs: peaks, OOMs, and per call site the bytes at the peak and allocation counts.
#[derive(ClapArgs)]
#[command(
    long_about = "Compare two traces, A then B (e.g. before and after a change, or a trace and its \
replay under other settings): peak reserved, requested and allocated bytes, OOMs, and per call \
site the live bytes at each trace's peak of requested bytes and the number of allocations, \
largest changes first. Call sites are matched by their frames, not their ids. With -o DIR, \
also timeline-overlay.svg (both runs' reserved and allocated bytes) and diff.json.",
    after_help = "Examples:\n  alloctrace diff traces/frag_oom.default.atrace traces/frag_oom.expandable.atrace\n  \
alloctrace replay traces/gpt2_train.default.atrace --conf expandable_segments:True -o sim.atrace\n  \
alloctrace diff traces/gpt2_train.default.atrace sim.atrace -o diff/"
)]
pub struct Args {
    /// The trace compared from (.atrace or .pickle): the before.
    pub a: PathBuf,
    /// The trace compared with it (.atrace or .pickle): the after.
    pub b: PathBuf,
    #[command(flatten)]
    pub device: super::args::Device,
    /// Write timeline-overlay.svg and diff.json into this directory.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::diff::run(
            &cmd::diff::DiffCmdOptions {
                a: self.a,
                b: self.b,
                device: self.device.device,
                output: self.output,
                json: self.json.json,
            },
            out,
        )
    }
}
