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
    /// For a PyTorch snapshot: the device whose history to read.
    pub device: usize,
    pub format: Format,
    pub output: PathBuf,
    /// Perfetto: time buckets per counter track.
    pub buckets: usize,
    pub json: bool,
}

pub fn run(opts: &ExportCmdOptions, out: &mut dyn Write) -> Result<i32> {
    let kind = match opts.format {
        Format::MemoryViz => crate::model::output::Kind::Pickle,
        Format::Perfetto => crate::model::output::Kind::Perfetto,
    };
    crate::model::output::check_output_file(&opts.output, &[&opts.trace], kind)?;
    crate::model::output::refuse_misnamed(&opts.output, kind)?;
    // Any input every command takes: a trace, or a PyTorch snapshot imported in memory.
    let trace = super::open_any(&opts.trace, None, opts.device)?;
    let bytes = |p: &PathBuf| file_bytes(p);
    let damage = match opts.format {
        Format::MemoryViz => {
            let s = to_file(&opts.output, |w| memory_viz::export(&trace, w))?;
            if opts.json {
                write_json(out, &Written::of(&opts.output, &s))?;
            } else {
                // Lines that fit a screen, continued two spaces in.
                let out = &mut crate::model::wrap::ScreenWriter::new(out);
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
                    "open it at https://pytorch.org/memory_viz, or run (one line):\n  python -m torch.cuda._memory_viz trace_plot {} -o plot.html",
                    opts.output.display()
                )?;
            }
            if s.private_pool_segments_freed > 0 {
                crate::model::escape::warn(format!(
                    "{}: {} segment(s) of private pools (CUDA graphs, MemPools) were freed before the end; a snapshot \
                     names the pool only of the segments it holds at the end, so a re-import counts those as the \
                     default pools' (the .atrace keeps them)",
                    opts.output.display(),
                    s.private_pool_segments_freed
                ));
            }
            s.damage
        }
        Format::Perfetto => {
            let s = to_file(&opts.output, |w| {
                perfetto::export(&trace, w, &perfetto::PerfettoOptions { buckets: opts.buckets })
            })?;
            if opts.json {
                write_json(out, &Written::of(&opts.output, &s))?;
            } else {
                let out = &mut crate::model::wrap::ScreenWriter::new(out);
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
            crate::model::escape::warn(w);
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

/// Most bytes an export writes: a trace whose export would be larger (a small hostile trace can
/// claim millions of events) stops there with an error saying so, and nothing is left at the
/// output path. The largest shipped trace (319,682 events) exports to a 25 MB pickle.
pub const MAX_EXPORT_BYTES: u64 = 256 << 20;

/// Writes an export to `output`: `write` renders it into a writer that refuses to pass
/// [`MAX_EXPORT_BYTES`], which goes to a temporary file renamed into place once complete (see
/// [`crate::model::output`]): an export that fails leaves nothing, and never touches a file already
/// there. The exporters themselves take a trace and a writer, never a path.
fn to_file<T>(
    output: &std::path::Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    use anyhow::Context;
    let mut pending = crate::model::output::Pending::new(output)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, Bounded::new(pending.file()));
    let cannot = || format!("cannot write {}", output.display());
    // An error of the output (a full disk, the bound) names the output; one of the input (a
    // trace that cannot be read) is the input's own.
    let written = match write(&mut out) {
        Err(e) if out.get_ref().failed => return Err(e.context(cannot())),
        r => r?,
    };
    // Flushed into the file, and the file onto the disk, before it takes the output's name.
    out.into_inner().map_err(|e| e.into_error()).and_then(|b| b.into_inner().sync_all()).with_context(cannot)?;
    pending.commit()?;
    Ok(written)
}

/// A writer that refuses to pass [`MAX_EXPORT_BYTES`].
struct Bounded<W: std::io::Write> {
    inner: W,
    written: u64,
    /// A write failed (the bound, or the file's own error).
    failed: bool,
}

impl<W: std::io::Write> Bounded<W> {
    fn new(inner: W) -> Self {
        Bounded { inner, written: 0, failed: false }
    }

    fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: std::io::Write> std::io::Write for Bounded<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.written + buf.len() as u64 > MAX_EXPORT_BYTES {
            self.failed = true;
            return Err(std::io::Error::other(crate::model::output::TooLarge(format!(
                "the export would pass {MAX_EXPORT_BYTES} bytes, the most an export writes; nothing was written"
            ))));
        }
        let n = self.inner.write(buf).inspect_err(|_| self.failed = true)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().inspect_err(|_| self.failed = true)
    }
}
