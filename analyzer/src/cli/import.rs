//! `alloctrace import`: its arguments, handed to the library's command.

use super::args::{parse_capacity, parse_torch_version};
use analyzer::cmd;
use analyzer::model::units::parse_bytes;
use anyhow::Result;
use clap::{Args as ClapArgs, ValueEnum};
use recorder::engine::version::TorchVersion;
use std::io::Write;
use std::path::PathBuf;

/// Convert a foreign trace (a PyTorch memory snapshot) into an .atrace file.
#[derive(ClapArgs)]
#[command(
    long_about = "Convert a PyTorch memory snapshot into an alloctrace trace.\n\n\
Make a snapshot in your script with\n  torch.cuda.memory._record_memory_history(max_entries=1_000_000)\n  ...\n  \
torch.cuda.memory._dump_snapshot(\"snap.pickle\")\n\
Every trace entry becomes an event; stack frames become call sites; empty_cache() calls are \
inferred from bursts of segment frees. If the snapshot's ring buffer dropped its oldest \
entries, the state before the first entry is reconstructed from its segments.",
    after_help = "Example:\n  alloctrace import torch snap.pickle -o snap.atrace --capacity 2GiB"
)]
pub struct Args {
    #[arg(value_enum)]
    pub format: ImportFormat,
    /// The snapshot file (a Python pickle; no Python is needed).
    pub snapshot: PathBuf,
    /// Where to write the trace.
    #[arg(short, long)]
    pub output: PathBuf,
    /// The memory limit the program ran under (snapshots don't record it), e.g. 2GiB.
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// Which device's trace to import.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Device name to record in the header, e.g. "NVIDIA H100 80GB HBM3".
    #[arg(long)]
    pub device_name: Option<String>,
    /// Total device memory to record in the header, e.g. 80GiB.
    #[arg(long, value_parser = parse_bytes)]
    pub device_memory: Option<u64>,
    /// The PyTorch release that wrote the snapshot, e.g. 2.12 (snapshots do not name it);
    /// replays follow its allocator.
    #[arg(long, value_parser = parse_torch_version)]
    pub torch_version: Option<TorchVersion>,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        let ImportFormat::Torch = self.format;
        cmd::import::run(
            &cmd::import::ImportCmdOptions {
                snapshot: self.snapshot,
                output: self.output,
                import: analyzer::source::import::torch::ImportOptions {
                    device: self.device,
                    capacity_bytes: self.capacity,
                    device_name: self.device_name,
                    device_total_bytes: self.device_memory,
                    torch_version: self.torch_version,
                    releases_limit: None,
                },
                json: self.json.json,
            },
            out,
        )
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ImportFormat {
    /// A PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot).
    Torch,
}
