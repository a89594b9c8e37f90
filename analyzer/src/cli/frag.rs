//! `alloctrace frag`: its arguments, handed to the library's command.

use super::args::RunArgs;
use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// Fragmentation four ways, over time and at one moment, with the segment map.
#[derive(ClapArgs)]
#[command(
    long_about = "Measure fragmentation four ways, each named and defined in the output:\n  \
1. reserved vs allocated: 1 - allocated / reserved (PyTorch's \"reserved but unallocated\");\n  \
2. contiguity: 1 - largest free block / total free (why a request fails although memory is free);\n  \
3. internal (rounding slack inside blocks) vs external (free blocks inside segments);\n  \
4. the gap between peak reserved and an offline plan that knows every lifetime in advance.\n\n\
Each is summarised over the run (mean, max, value at peak reserved) and shown at one moment \
(--at): peak reserved, the first out-of-memory, the end, or an event index. At that moment a \
segment map lists every segment with its allocated and free blocks and its largest free block, \
so you can see why a request did not fit: a 1 GiB tensor needs one contiguous block.\n\n\
The layout comes from replaying the trace under its recorded settings and capacity; for \
imported and recorded traces the replay reuses the recorded segment addresses, so blocks sit \
where they sat in the real run.",
    after_help = "Examples:\n  alloctrace frag traces/frag_oom.default.atrace --at oom\n  \
alloctrace frag traces/gpt2_train.default.atrace --json"
)]
pub struct Args {
    /// A trace (.atrace) or a PyTorch memory snapshot (.pickle).
    pub trace: PathBuf,
    #[command(flatten)]
    pub run: RunArgs,
    /// The moment to show: peak (peak reserved), oom (the out-of-memory that ended the run), end, or an
    /// event index. Default: oom where the replay at the capacity runs out of memory, else peak.
    #[arg(long)]
    pub at: Option<analyzer::analysis::moment::At>,
    /// Lines of the segment map to print (segments of the same shape share a line). Where more
    /// shapes than that hold segments, those with the largest free blocks are printed.
    #[arg(long, default_value_t = 10)]
    pub max_segments: usize,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::frag::run(
            &cmd::frag::FragCmdOptions {
                trace: self.trace,
                facts: self.run.facts(),
                at: self.at,
                max_segments: self.max_segments,
                json: self.json.json,
            },
            out,
        )
    }
}
