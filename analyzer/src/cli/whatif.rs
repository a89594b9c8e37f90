//! `alloctrace whatif`: its arguments, handed to the library's command.

use super::args::RunArgs;
use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// Compare allocator policies on the same request stream, with the smallest capacity each needs.
#[derive(ClapArgs)]
#[command(
    long_about = "Replay the trace under several allocator policies side by side (the recorded \
settings, expandable segments, max_split_size_mb, roundup_power2_divisions, a GC threshold when \
a capacity is given, and no caching at all), with the peak of live requested bytes (no allocator \
needs less) and, for reference, an offline plan that knows every lifetime in advance (greedy by \
size: a heuristic, which a policy can beat by a little). For each policy: \
peak reserved, fragmentation, device calls, the outcome at the capacity, and the smallest capacity \
at which the run completes.",
    after_help = "Example:\n  alloctrace whatif traces/gpt2_train.default.atrace --capacity 5.5GiB"
)]
pub struct Args {
    /// A trace (.atrace) or a PyTorch memory snapshot (.pickle).
    pub trace: PathBuf,
    #[command(flatten)]
    pub run: RunArgs,
    /// Skip the search for the smallest capacity of each policy (faster on huge traces).
    #[arg(long)]
    pub no_search: bool,
    #[command(flatten)]
    pub repeats: super::args::Repeats,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        let capacity_bytes = self.run.capacity;
        cmd::whatif::run(
            &cmd::whatif::WhatifCmdOptions {
                trace: self.trace,
                facts: self.run.facts(),
                capacity_bytes,
                search_capacity: !self.no_search,
                repeats: self.repeats.iterations,
                json: self.json.json,
            },
            out,
        )
    }
}
