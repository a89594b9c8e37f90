//! `alloctrace synth`: its arguments, handed to the library's command.

use analyzer::cmd;
use analyzer::model::units::parse_bytes;
use anyhow::Result;
use clap::Args as ClapArgs;
use recorder::engine::config::{user_conf, AllocatorConfig};
use std::io::Write;
use std::path::PathBuf;

/// Generate a deterministic synthetic training-loop trace of any size (for benchmarks and tests).
#[derive(ClapArgs)]
#[command(
    long_about = "Generate a deterministic, seeded synthetic trace that looks like a training job: \
parameters, then iterations of forward activations and temporaries (small and large pools), \
backward in reverse, optimizer temporaries, a data-loader stream, iteration marks and call sites. \
On demand, a leak (a tensor kept per iteration) and fragmentation (interleaved long- and \
short-lived blocks). Requests go through the allocator model, so the trace holds every segment, \
split and merge event. The same seed gives the same bytes.",
    after_help = "Examples:\n  alloctrace synth --events 10000000 --seed 1 -o big.atrace\n  \
alloctrace synth --events 200000 --leak-bytes-per-iter 8MiB --fragment -o leaky.atrace"
)]
pub struct Args {
    /// Number of events to generate (at least; an iteration is finished).
    #[arg(long, default_value_t = 1_000_000)]
    pub events: u64,
    /// The seed of the random sizes and lifetimes: the same seed and options give the same bytes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The trace to write (an existing file is replaced only if it is a trace).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Allocator settings of the synthetic run.
    #[arg(long, value_parser = user_conf)]
    pub conf: Option<AllocatorConfig>,
    /// Layers of the synthetic model.
    #[arg(long, default_value_t = 24)]
    pub layers: u32,
    /// Streams (the first is the compute stream; others load data).
    #[arg(long, default_value_t = 2)]
    pub streams: u32,
    /// Keep this many bytes per iteration alive forever (a leak), e.g. 8MiB.
    #[arg(long, value_parser = parse_bytes, default_value = "0")]
    pub leak_bytes_per_iter: u64,
    /// Interleave long- and short-lived blocks to fragment segments.
    #[arg(long)]
    pub fragment: bool,
    /// A trace shaped like a real one: sizes from bytes to tens of MiB, 4 streams, thousands
    /// of segments, cache flushes and retries near the limit, and a final out-of-memory.
    #[arg(long)]
    pub realistic: bool,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::synth::run(
            &analyzer::source::synth::SynthOptions {
                events: self.events,
                seed: self.seed,
                output: self.output,
                config: self.conf.unwrap_or_default(),
                layers: self.layers,
                streams: self.streams,
                leak_bytes_per_iter: self.leak_bytes_per_iter,
                fragment: self.fragment,
                realistic: self.realistic,
            },
            self.json.json,
            out,
        )
    }
}
