//! `alloctrace export TRACE --format memory-viz|perfetto -o OUT`: the trace in a format that
//! other viewers open.

use super::{exit, write_json};
use crate::model::units::fmt_bytes;
use crate::render::export::{memory_viz, perfetto};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

/// The formats `export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A PyTorch memory snapshot pickle (memory_viz, `_memory_viz.py`).
    MemoryViz,
    /// Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing).
    Perfetto,
}

pub struct ExportCmdOptions {
    pub trace: PathBuf,
    pub format: Format,
    pub output: PathBuf,
    /// Perfetto: time buckets per counter track.
    pub buckets: usize,
    pub json: bool,
}

pub fn run(opts: &ExportCmdOptions, out: &mut dyn Write) -> Result<i32> {
    crate::model::output::refuse_input(&opts.output, &[&opts.trace])?;
    // Any input every command takes: a trace, or a PyTorch snapshot imported in memory.
    let trace = crate::source::input::open_any(&opts.trace, None)?;
    let bytes = |p: &PathBuf| file_bytes(p);
    let damage = match opts.format {
        Format::MemoryViz => {
            let s = crate::render::export::to_file(&opts.output, |w| memory_viz::export(&trace, w))?;
            if opts.json {
                write_json(out, &Written::of(&opts.output, &s))?;
            } else {
                writeln!(
                    out,
                    "wrote {} ({}): a PyTorch memory snapshot of {} trace entries, {} segments and {} live blocks at the end",
                    opts.output.display(),
                    fmt_bytes(bytes(&opts.output)),
                    s.entries,
                    s.segments,
                    s.live_blocks
                )?;
                writeln!(
                    out,
                    "open it at https://pytorch.org/memory_viz, or: python -m torch.cuda._memory_viz trace_plot {} -o plot.html",
                    opts.output.display()
                )?;
            }
            s.damage
        }
        Format::Perfetto => {
            let s = crate::render::export::to_file(&opts.output, |w| {
                perfetto::export(&trace, w, &perfetto::PerfettoOptions { buckets: opts.buckets })
            })?;
            if opts.json {
                write_json(out, &Written::of(&opts.output, &s))?;
            } else {
                writeln!(
                    out,
                    "wrote {} ({}): {} counter samples of {} events ({} stream{}), {} instant events, {} iteration slices; peak reserved {}",
                    opts.output.display(),
                    fmt_bytes(bytes(&opts.output)),
                    s.counter_events,
                    s.events,
                    s.streams,
                    if s.streams == 1 { "" } else { "s" },
                    s.instant_events,
                    s.slices,
                    fmt_bytes(s.peak_reserved_bytes)
                )?;
                writeln!(out, "open it at https://ui.perfetto.dev or chrome://tracing")?;
            }
            s.damage
        }
    };
    match damage {
        Some(w) => {
            eprintln!("alloctrace: warning: {w}");
            Ok(exit::PARTIAL)
        }
        None => Ok(exit::OK),
    }
}

fn file_bytes(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// `--json` of either format: the file written and its size, beside the format's own figures.
#[derive(serde::Serialize)]
struct Written<'a, S: serde::Serialize> {
    output: String,
    output_bytes: u64,
    #[serde(flatten)]
    stats: &'a S,
}

impl<'a, S: serde::Serialize> Written<'a, S> {
    fn of(output: &std::path::Path, stats: &'a S) -> Self {
        Written { output: output.display().to_string(), output_bytes: file_bytes(output), stats }
    }
}
