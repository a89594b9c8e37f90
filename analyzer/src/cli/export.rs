//! `alloctrace export`: its arguments, handed to the library's command.

use analyzer::cmd;
use anyhow::Result;
use clap::{Args as ClapArgs, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

/// Write the trace for another viewer: PyTorch's memory_viz (a snapshot pickle) or Perfetto.
#[derive(ClapArgs)]
#[command(
    long_about = "Write the trace in a format that another viewer opens.\n\n\
memory-viz: a PyTorch memory snapshot pickle (what torch.cuda.memory._dump_snapshot writes), for \
https://pytorch.org/memory_viz and `python -m torch.cuda._memory_viz`. Every allocation, free, \
segment and OOM becomes a trace entry, call sites become frames, marks become \
external_annotations, and `segments` holds the state at the end. `alloctrace import torch` reads \
it back (pass the memory limit with --capacity: snapshots do not hold it).\n\n\
perfetto: Chrome trace-event JSON for https://ui.perfetto.dev and chrome://tracing: counter \
tracks of reserved, allocated and active bytes (all streams, and per stream when there are \
several), instant events for OOMs, cache releases and marks, and a slice per iteration. \
Counters are downsampled per time bucket keeping each bucket's lowest and highest values, so \
every peak is kept and the file stays small on any number of events.",
    after_help = "Examples:\n  alloctrace export traces/gpt2_train.default.atrace --format memory-viz -o gpt2.pickle\n  \
alloctrace export traces/gpt2_train.default.atrace --format perfetto -o gpt2.json"
)]
pub struct Args {
    /// A trace (.atrace) or a PyTorch memory snapshot (.pickle).
    pub trace: PathBuf,
    #[command(flatten)]
    pub device: super::args::Device,
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Where to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Perfetto: time buckets per counter track (each keeps its lowest and highest values).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(2..=10_000_000))]
    pub buckets: u64,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::export::run(
            &cmd::export::ExportCmdOptions {
                trace: self.trace,
                device: self.device.device,
                format: match self.format {
                    ExportFormat::MemoryViz => cmd::export::Format::MemoryViz,
                    ExportFormat::Perfetto => cmd::export::Format::Perfetto,
                },
                output: self.output,
                buckets: self.buckets as usize,
                json: self.json.json,
            },
            out,
        )
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    /// A PyTorch memory snapshot pickle (pytorch.org/memory_viz, torch.cuda._memory_viz).
    MemoryViz,
    /// Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing).
    Perfetto,
}
