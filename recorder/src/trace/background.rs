//! Chunk compression on a thread of its own, for a writer that must keep up with a live
//! program ([`super::TraceWriter::compress_in_background`]).
//!
//! Compressing a chunk is about a third of the writer's work per event. A recorder's writer
//! hands each chunk body here and goes back to encoding; this thread compresses it, frames it
//! and writes it, in the order received, and hands the body's buffer back for reuse. A flush
//! waits until everything handed over is written and the file flushed, so a flushed trace is
//! still readable after `kill -9`. The first write error stops writing: the events of every
//! chunk written since the last successful flush (they may never have reached the file) and of
//! every later chunk are counted as lost, and the error is reported at the next chunk, flush or
//! finish.

use super::{chunk_payload, frame_bytes, TraceError, Unflushed, KIND_CHUNK};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

enum Job {
    Chunk { count: u64, body: Vec<u8> },
    Frame { kind: u8, payload: Vec<u8> },
    Flush(SyncSender<()>),
}

#[derive(Default)]
struct Shared {
    bytes_written: AtomicU64,
    failed: AtomicBool,
    error: Mutex<Option<String>>,
}

pub(super) struct Compressor<W> {
    tx: Option<SyncSender<Job>>,
    spare: Receiver<Vec<u8>>,
    handle: Option<JoinHandle<Option<W>>>,
    shared: Arc<Shared>,
    /// Events in chunks handed over since the last flush, lost if the thread dies (it cannot
    /// count them then).
    sent: Unflushed,
}

impl<W: Write + Send + 'static> Compressor<W> {
    /// Starts the thread and hands it `out`; when the thread cannot start, `out` comes back
    /// with the error.
    pub fn start(
        out: W,
        bytes_written: u64,
        compress: bool,
        level: i32,
        lost: Arc<AtomicU64>,
    ) -> Result<Self, (W, TraceError)> {
        // Two chunks in flight: enough to overlap, little memory.
        let (tx, rx) = mpsc::sync_channel::<Job>(2);
        let (spare_tx, spare) = mpsc::sync_channel(4);
        let shared = Arc::new(Shared { bytes_written: AtomicU64::new(bytes_written), ..Default::default() });
        let (sh, mut unflushed) = (shared.clone(), Unflushed::new(lost.clone()));
        let (out_tx, out_rx) = mpsc::sync_channel::<W>(1);
        let spawned = std::thread::Builder::new().name("alloctrace-compress".into()).spawn(move || {
            let Ok(mut out) = out_rx.recv() else { return None };
            let mut frame = Vec::new();
            let fail = |e: &dyn std::fmt::Display, unflushed: &mut Unflushed| {
                unflushed.failed();
                sh.failed.store(true, Ordering::Release);
                let mut slot = sh.error.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert_with(|| e.to_string());
            };
            for job in rx {
                let failed = sh.failed.load(Ordering::Acquire);
                match job {
                    Job::Chunk { count, mut body } => {
                        if failed {
                            unflushed.lose(count);
                        } else {
                            unflushed.wrote(count);
                            let written = chunk_payload(count, &body, compress, level)
                                .and_then(|p| frame_bytes(&mut out, &mut frame, KIND_CHUNK, &p));
                            match written {
                                Ok(n) => {
                                    sh.bytes_written.fetch_add(n, Ordering::Release);
                                }
                                Err(e) => fail(&e, &mut unflushed),
                            }
                        }
                        body.clear();
                        let _ = spare_tx.try_send(body);
                    }
                    Job::Frame { kind, payload } if !failed => {
                        match frame_bytes(&mut out, &mut frame, kind, &payload) {
                            Ok(n) => {
                                sh.bytes_written.fetch_add(n, Ordering::Release);
                            }
                            Err(e) => fail(&e, &mut unflushed),
                        }
                    }
                    Job::Frame { .. } => {}
                    Job::Flush(ack) => {
                        if !failed {
                            match out.flush() {
                                Ok(()) => unflushed.flushed(),
                                Err(e) => fail(&e, &mut unflushed),
                            }
                        }
                        let _ = ack.send(());
                    }
                }
            }
            Some(out)
        });
        let handle = match spawned {
            Ok(h) => h,
            Err(e) => return Err((out, TraceError::Io(e))),
        };
        if let Err(mpsc::SendError(out)) = out_tx.send(out) {
            return Err((out, gone()));
        }
        Ok(Compressor { tx: Some(tx), spare, handle: Some(handle), shared, sent: Unflushed::new(lost) })
    }
}

impl<W> Compressor<W> {
    /// The first write error, if writing failed.
    pub fn error(&self) -> Result<(), TraceError> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let e = self.shared.error.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default();
        Err(TraceError::Io(std::io::Error::other(e)))
    }

    /// Hands a chunk over; returns an empty buffer for the next one.
    pub fn chunk(&mut self, count: u64, body: Vec<u8>) -> Result<Vec<u8>, TraceError> {
        if let Err(e) = self.error() {
            // Writing has stopped: this chunk's events go nowhere.
            self.sent.lose(count);
            return Err(e);
        }
        if !self.send(Job::Chunk { count, body }) {
            self.sent.wrote(count);
            self.sent.failed();
            return Err(gone());
        }
        self.sent.wrote(count);
        Ok(self.spare.try_recv().unwrap_or_else(|_| Vec::with_capacity(1 << 20)))
    }

    pub fn frame(&mut self, kind: u8, payload: Vec<u8>) {
        self.send(Job::Frame { kind, payload });
    }

    /// Waits until everything handed over is written and the output flushed.
    pub fn flush(&mut self) -> Result<(), TraceError> {
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        if !self.send(Job::Flush(ack_tx)) || ack_rx.recv().is_err() {
            // The thread died (it cannot count what it lost): nothing sent since the last
            // flush is known to be in the file.
            self.sent.failed();
            return Err(gone());
        }
        // On a write error the thread has counted the lost events itself.
        self.sent.flushed();
        self.error()
    }

    /// False when the thread is gone (it panicked): nothing handed over since was written.
    fn send(&mut self, job: Job) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(job).is_ok())
    }

    pub fn bytes_written(&self) -> u64 {
        self.shared.bytes_written.load(Ordering::Acquire)
    }

    /// Writes what is pending, stops the thread and returns the output.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.flush()?;
        self.tx = None;
        let out = match self.handle.take().map(JoinHandle::join) {
            Some(Ok(Some(out))) => out,
            _ => return Err(TraceError::Io(std::io::Error::other("the trace compression thread panicked"))),
        };
        self.error()?;
        Ok(out)
    }
}

fn gone() -> TraceError {
    TraceError::Io(std::io::Error::other("the trace compression thread stopped"))
}
