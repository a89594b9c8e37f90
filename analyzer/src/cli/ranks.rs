//! `alloctrace ranks`: its arguments, handed to the library's command.

use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// One view across the ranks of a distributed job: per-rank peaks, the peaking rank, the call sites that differ.
#[derive(ClapArgs)]
#[command(
    long_about = "One view across ranks: give one trace or PyTorch snapshot (.pickle) per rank. A table \
per rank (peak reserved and allocated with their event and time, OOMs, fragmentation at the peak, \
device calls), the rank that peaks, the skew between ranks (highest peak / median peak), the call \
sites whose live bytes at each rank's peak differ most, and (with -o) a picture: per-rank peak bars \
and the ranks' allocated bytes aligned on iterations, not wall time. A trace's rank comes from a \
`rank=R` note in its header, else `rank{R}`, `rank_R` or the device (`cuda{N}`) in its file name, \
else its position.",
    after_help = "Example:\n  alloctrace ranks snapshot_rank0.pickle snapshot_rank1.pickle -o ranks.svg\n  \
alloctrace ranks run.rank_0.atrace run.rank_1.atrace run.rank_2.atrace --json"
)]
pub struct Args {
    /// One trace or snapshot per rank of the job, in rank order.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Write the picture (SVG) here.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::ranks::run(
            &cmd::ranks::RanksCmdOptions { traces: self.traces, output: self.output, json: self.json.json },
            out,
        )
    }
}
