//! `alloctrace plot`: its arguments, handed to the library's command.

use analyzer::cmd;
use anyhow::Result;
use clap::{Args as ClapArgs, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

/// Draw a picture of a trace as SVG (or PNG, for an output named .png): memory over time, the segment map, policies, fragmentation.
#[derive(ClapArgs)]
#[command(
    long_about = "Draw one picture of the trace as a deterministic SVG (same trace, same bytes).\n\n\
timeline: allocated, reserved, active and requested bytes over time, replayed under the recorded \
settings, with the peak, OOMs, marks (phases, iterations, annotations) and the capacity limit. \
Reserved is what the device gave the allocator; allocated is what tensors hold; the gap between \
them is cached memory. With --stacked: live requested bytes by call site (the top 8, the rest as \
\"other\").\n\n\
segments: the segment map at a moment (--at peak, oom, end or an event index): one row per \
segment, allocated blocks in blue, free ones in grey, the largest free block in orange, and at \
an OOM the failed request in red to the same scale: \"out of memory although memory is free\" \
means no free block is as large as the red bar.\n\n\
whatif: reserved bytes over time under each policy of `alloctrace whatif`, against the live \
requested bytes (no allocator needs less).\n\n\
frag: two fragmentation measures over time: 1 - allocated / reserved (cached memory no tensor \
uses) and 1 - largest free block / total free (how broken up the free memory is).\n\n\
Long traces are folded into one column per pixel keeping each column's minimum and maximum, \
so the true peak always shows.\n\n\
Every picture replays the trace under the run's facts: the trace's own limit and settings, or \
those given with --capacity, --conf and --torch-version (a snapshot stores neither limit nor \
settings), as `replay`, `frag` and `report` take them.",
    after_help = "Examples:\n  alloctrace plot traces/gpt2_train.default.atrace --kind timeline -o gpt2.svg\n  \
alloctrace plot traces/gpt2_train.default.atrace --kind timeline --stacked -o gpt2-sites.svg\n  \
alloctrace plot traces/frag_oom.default.atrace --kind segments --at oom -o oom.svg\n  \
alloctrace plot traces/gpt2_train.default.atrace --kind whatif --capacity 5.5GiB -o gpt2-5.5g.svg"
)]
pub struct Args {
    /// A trace (.atrace) or a PyTorch memory snapshot (.pickle).
    pub trace: PathBuf,
    #[command(flatten)]
    pub run: super::args::RunArgs,
    #[arg(long, value_enum, default_value = "timeline")]
    pub kind: PlotKind,
    /// Where to write the picture: an SVG, or a PNG where the name ends in .png.
    #[arg(short, long)]
    pub output: PathBuf,
    /// The moment of a segment map: peak (reserved), oom, end, or an event index.
    #[arg(long, default_value = "peak")]
    pub at: analyzer::analysis::moment::At,
    /// Timeline: live bytes by call site, stacked.
    #[arg(long)]
    pub stacked: bool,
    /// What the x axis counts.
    #[arg(long, value_enum, default_value = "time")]
    pub x: PlotX,
    #[command(flatten)]
    pub json: super::args::Json,
}

impl Args {
    pub fn run(self, out: &mut dyn Write) -> Result<i32> {
        cmd::plot::run(
            &cmd::plot::PlotCmdOptions {
                trace: self.trace,
                facts: self.run.facts(),
                kind: match self.kind {
                    PlotKind::Timeline => analyzer::cmd::plot::Kind::Timeline,
                    PlotKind::Segments => analyzer::cmd::plot::Kind::Segments,
                    PlotKind::Whatif => analyzer::cmd::plot::Kind::Whatif,
                    PlotKind::Frag => analyzer::cmd::plot::Kind::Frag,
                },
                output: self.output,
                at: self.at,
                stacked: self.stacked,
                x: match self.x {
                    PlotX::Time => analyzer::analysis::picture::XAxis::Time,
                    PlotX::Event => analyzer::analysis::picture::XAxis::Event,
                },
                json: self.json.json,
            },
            out,
        )
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum PlotKind {
    /// Memory over time.
    Timeline,
    /// The segment map at a moment.
    Segments,
    /// Reserved bytes per what-if policy over time.
    Whatif,
    /// Fragmentation measures over time.
    Frag,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum PlotX {
    /// Time since the trace's start.
    Time,
    /// Event index.
    Event,
}
