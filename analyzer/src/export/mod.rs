//! Exports of a trace to the viewers people already use: PyTorch's memory_viz (a snapshot
//! pickle) and Perfetto / chrome://tracing (Chrome trace-event JSON).

pub mod memory_viz;
pub mod perfetto;
pub mod pickle;

/// Most bytes an export writes: a trace whose export would be larger (a small hostile trace can
/// claim millions of events) stops there with an error saying so, and nothing is left at the
/// output path. The largest shipped trace (319,682 events) exports to a 25 MB pickle.
pub const MAX_EXPORT_BYTES: u64 = 256 << 20;

/// A writer that refuses to pass [`MAX_EXPORT_BYTES`].
pub(crate) struct Bounded<W: std::io::Write> {
    inner: W,
    written: u64,
}

impl<W: std::io::Write> Bounded<W> {
    pub(crate) fn new(inner: W) -> Self {
        Bounded { inner, written: 0 }
    }

    pub(crate) fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: std::io::Write> std::io::Write for Bounded<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.written + buf.len() as u64 > MAX_EXPORT_BYTES {
            return Err(std::io::Error::other(crate::output::TooLarge(format!(
                "the export would pass {MAX_EXPORT_BYTES} bytes, the most an export writes; nothing was written"
            ))));
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
