//! Opening and streaming a trace file: errors that name the file, a progress bar on a terminal,
//! and decoding on a second thread so that analyses fold records while the next chunk decodes.
//!
//! Memory is bounded by a few chunks whatever the trace's size.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use recorder::trace::{Header, Record, TraceEnd, TraceError, TraceReader};
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a complete scan of a trace saw, besides what the fold computed.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub path: PathBuf,
    pub header: Header,
    pub events: u64,
    pub end: TraceEnd,
}

impl Scanned {
    /// A one-line warning when the trace was damaged: which file, where, and what was kept.
    pub fn damage_warning(&self) -> Option<String> {
        self.end.is_partial().then(|| {
            format!(
                "{}: {}; analyzed the {} events before the damage",
                self.path.display(),
                self.end.describe(),
                self.events
            )
        })
    }
}

/// Counts bytes read, for the progress bar.
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Opens a trace and reads its header; errors name the file (and the byte offset, if any).
pub fn open(path: &Path) -> Result<TraceReader<BufReader<File>>> {
    TraceReader::open(path).map_err(|e| open_error(path, e))
}

fn open_error(path: &Path, e: TraceError) -> anyhow::Error {
    match e {
        TraceError::Io(io) => anyhow::Error::new(io).context(format!("cannot read {}", path.display())),
        other => anyhow::anyhow!("{}: {other}", path.display()),
    }
}

/// A progress bar over `total` bytes, drawn only when stderr is a terminal.
pub fn byte_progress(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Reads the whole trace at `path`, calling `fold(index, record)` for every record in order.
/// Decoding runs on a second thread, a few chunks ahead.
pub fn scan(path: &Path, mut fold: impl FnMut(u64, &Record)) -> Result<Scanned> {
    scan_chunks(path, |first, chunk| {
        for (i, r) in chunk.iter().enumerate() {
            fold(first + i as u64, r);
        }
    })
}

/// Like [`scan`], one decoded chunk at a time (`first` = index of its first record).
pub fn scan_chunks(path: &Path, mut fold: impl FnMut(u64, &[Record])) -> Result<Scanned> {
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let total = file.metadata().map(|m| m.len()).unwrap_or(0);
    let count = Arc::new(AtomicU64::new(0));
    let input = Counting { inner: BufReader::with_capacity(1 << 20, file), count: count.clone() };
    let mut reader = TraceReader::new(input).map_err(|e| open_error(path, e))?;
    let header = reader.header().clone();
    let bar = byte_progress(total, "reading");
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Record>>(3);
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<Record>>();
    let (events, end) = std::thread::scope(|s| {
        let decoder = s.spawn(move || {
            loop {
                let mut buf = back_rx.try_recv().unwrap_or_default();
                if !reader.next_chunk(&mut buf) {
                    break;
                }
                if tx.send(buf).is_err() {
                    break;
                }
            }
            reader.end().clone()
        });
        let mut events = 0u64;
        for chunk in rx {
            fold(events, &chunk);
            events += chunk.len() as u64;
            bar.set_position(count.load(Ordering::Relaxed));
            let _ = back_tx.send(chunk);
        }
        let end =
            decoder.join().unwrap_or_else(|_| TraceEnd::Corrupt { offset: 0, reason: "decoder thread failed".into() });
        (events, end)
    });
    bar.finish_and_clear();
    Ok(Scanned { path: path.to_path_buf(), header, events, end })
}
