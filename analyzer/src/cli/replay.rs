//! `alloctrace replay`: its arguments, handed to the library's command.

use super::args::{parse_capacity, parse_torch_version, CAPACITY_HELP, TORCH_VERSION_HELP};
use analyzer::cmd;
use anyhow::Result;
use clap::Args as ClapArgs;
use recorder::engine::config::{user_conf, AllocatorConfig};
use recorder::engine::version::TorchVersion;
use std::io::Write;
use std::path::PathBuf;

/// Replay a trace's requests through the allocator model under any settings and capacity.
#[derive(ClapArgs)]
#[command(
    long_about = "Replay the trace's requests (alloc, free, empty_cache) through alloctrace's model of \
PyTorch's caching allocator on a simulated device, under the recorded settings or others, with \
or without a memory limit. Reports the outcome (ok, or the request that ran out of memory), \
the peaks of allocated, reserved and requested bytes, and the allocator's counters.",
    after_help = "Examples:\n  alloctrace replay traces/gpt2_train.default.atrace\n  \
alloctrace replay traces/gpt2_train.default.atrace --conf expandable_segments:True --capacity 5.5GiB\n  \
alloctrace replay traces/resnet50_train.default.atrace --conf max_split_size_mb:64 -o sim.atrace"
)]
pub struct Args {
    /// A trace (.atrace) or a PyTorch memory snapshot (.pickle).
    pub trace: PathBuf,
    #[command(flatten)]
    pub device: super::args::Device,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Write the simulated run as a full trace (segments, splits, merges) here.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::replay::run(
            &cmd::replay::ReplayCmdOptions {
                trace: self.trace,
                device: self.device.device,
                replay: analyzer::replay::ReplayOptions {
                    config: self.policy.conf,
                    capacity_bytes: self.policy.capacity,
                    unlimited: self.policy.unlimited,
                    output: self.output,
                    ..Default::default()
                },
                torch_version: self.policy.torch_version,
                json: self.json.json,
            },
            out,
        )
    }
}

/// The settings, limit and PyTorch version a replay follows.
#[derive(ClapArgs)]
pub struct PolicyArgs {
    /// Allocator settings as PYTORCH_CUDA_ALLOC_CONF, e.g. "max_split_size_mb:64,expandable_segments:True".
    /// Default: the settings recorded in the trace.
    #[arg(long, value_parser = user_conf)]
    pub conf: Option<AllocatorConfig>,
    #[arg(long, value_parser = parse_capacity, conflicts_with = "unlimited", help = CAPACITY_HELP)]
    pub capacity: Option<u64>,
    /// Replay without any memory limit, even if the trace recorded one.
    #[arg(long)]
    pub unlimited: bool,
    #[arg(long, value_parser = parse_torch_version, help = TORCH_VERSION_HELP)]
    pub torch_version: Option<TorchVersion>,
}
