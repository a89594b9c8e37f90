//! Exports of a trace to the viewers people already use: PyTorch's memory_viz (a snapshot
//! pickle) and Perfetto / chrome://tracing (Chrome trace-event JSON).

pub mod memory_viz;
pub mod perfetto;
pub mod pickle;

/// Most bytes an export writes: a trace whose export would be larger (a small hostile trace can
/// claim millions of events) stops there with an error saying so, and nothing is left at the
/// output path. The largest shipped trace (319,682 events) exports to a 25 MB pickle.
pub const MAX_EXPORT_BYTES: u64 = 256 << 20;

/// Writes an export to `output`: `write` renders it into a writer that refuses to pass
/// [`MAX_EXPORT_BYTES`], which goes to a temporary file renamed into place once complete (see
/// [`crate::model::output`]): an export that fails leaves nothing, and never touches a file already
/// there. The exporters themselves take a trace and a writer, never a path.
pub fn to_file<T>(
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
pub(crate) struct Bounded<W: std::io::Write> {
    inner: W,
    written: u64,
    /// A write failed (the bound, or the file's own error).
    failed: bool,
}

impl<W: std::io::Write> Bounded<W> {
    pub(crate) fn new(inner: W) -> Self {
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
