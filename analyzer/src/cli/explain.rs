//! `alloctrace explain`: its arguments, handed to the library's command.

use super::args::RunArgs;
use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// The OOM doctor: why the run ran out of memory, and what to change.
#[derive(ClapArgs)]
#[command(
    long_about = "Explain the first out-of-memory of a trace (or its peak, when there is none).\n\n\
The trace is replayed under its recorded settings and capacity to rebuild the layout at the \
failure. PyTorch's OOM message is restated with each number explained (requested, the segment \
the allocator tried to get, capacity, allocated, reserved, reserved but unallocated, the largest \
free block, what the CUDA context and other processes hold when the trace knows it), then a \
verdict with its reason: true exhaustion (live tensors alone exceed the limit), fragmentation \
(enough free bytes, but no block large enough), cache not released, or steady growth (a leak).\n\n\
Evidence comes from replays at the same capacity: which allocator settings would have \
completed, the smallest capacity each needs, and, for fragmentation, a replay of the code \
change that allocates long-lived tensors before temporaries. Each setting gets one decision, \
which the what-if table, the advice, the report and the JSON all show:\n\
  advised       the whole job is in the trace (a complete run, or one recorded past its limit \
with `alloctrace record --capacity`) and its replay under the setting completes at the limit;\n\
  worth trying  the trace stops at the failure (a snapshot taken at the OOM) and the setting's \
replay serves the request that failed; the rest of the job is not in the trace, so it is at most \
predicted (from a repeated iteration) and never said to fit; or the whole job completes at the \
limit but the search for its smallest capacity finds it failing at a larger one, so where its blocks \
land decides it (the driver's placement of segments, which the trace tells only for the recorded \
settings);\n\
  not advised   its replay fails there too.\n\n\
The text fits a screen: the verdict, the fix and its evidence, what is worth trying. \
--verbose adds the figures, call sites, the what-if table, growth and patterns.",
    after_help = "Examples:\n  alloctrace explain traces/frag_oom.default.atrace\n  \
alloctrace explain snap.pickle --capacity 6GiB --verbose\n  \
alloctrace explain traces/leak_list_append.default.atrace --json"
)]
pub struct Args {
    /// A trace (.atrace) or a PyTorch memory snapshot (.pickle).
    pub trace: PathBuf,
    #[command(flatten)]
    pub run: RunArgs,
    /// Everything behind the verdict: the figures of the moment, call sites, categories, the
    /// what-if table, growth, the prediction's basis and the patterns.
    #[arg(long, short)]
    pub verbose: bool,
    #[command(flatten)]
    pub repeats: super::args::Repeats,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::explain::run(
            &cmd::explain::ExplainCmdOptions {
                trace: self.trace,
                facts: self.run.facts(),
                repeats: self.repeats.iterations,
                json: self.json.json,
                verbose: self.verbose,
            },
            out,
        )
    }
}
