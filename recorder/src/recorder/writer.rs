//! The background writer: takes batches of records off a bounded queue and writes them to the
//! trace, so that allocating threads never wait for I/O.
//!
//! It flushes a chunk at least every `flush_interval` while events are pending (pulling the
//! partly filled batch out of the recorder itself), so a killed process loses at most about one
//! interval of events. A write error ends writing but not the program: from then on every event
//! is counted as dropped and the summary says why.

use super::batch::{Batch, Decoded};
use super::clock::TickConverter;
use super::sites::{SiteGate, SiteTable};
use super::Shared;
use crate::trace::{Event, Header, HotEvent, Record, TraceWriter};
use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) enum Msg {
    Batch(Batch),
    /// Write everything handed over so far, flush, then answer.
    Flush(SyncSender<()>),
    Shutdown,
}

/// How writing ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterOutcome {
    pub events_written: u64,
    /// Events lost: full queue, I/O error, unwritable path.
    pub events_dropped: u64,
    /// Bytes of complete frames on disk.
    pub trace_bytes: u64,
    /// The first I/O error, when writing failed.
    pub error: Option<String>,
    /// True when the trailer was written (the trace is complete).
    pub complete: bool,
    /// Events written with no call site because their call site's definition did not come in
    /// time (call sites resolved after their events; see `sites.rs`).
    pub callsites_unresolved: u64,
}

impl WriterOutcome {
    /// After a write error the counts kept while writing are estimates (a failed flush may
    /// still have put part of its chunks in the file, and the bytes of frames buffered at the
    /// failure never arrived): read the file back and count what a reader gets, so that the
    /// summary says exactly what the trace holds. `produced` is every event the recorder made.
    pub(crate) fn count_what_the_file_holds(&mut self, path: &std::path::Path, produced: u64) {
        let mut held = 0u64;
        if let Ok(mut r) = crate::trace::TraceReader::open(path) {
            for rec in r.by_ref() {
                // The writer's own loss reports are not events of the program.
                if !matches!(rec.event, Event::Dropped { .. }) {
                    held += 1;
                }
            }
        }
        self.events_written = held;
        self.events_dropped = produced.saturating_sub(held);
        self.trace_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
        self.complete = false;
    }
}

/// See [`Writer::pull`].
pub(crate) type Pull = Box<dyn Fn(&Receiver<Msg>) -> (Vec<Msg>, Batch) + Send>;

pub(crate) struct Writer {
    pub path: PathBuf,
    pub header: Header,
    pub rx: Receiver<Msg>,
    pub spare: SyncSender<Batch>,
    pub shared: Arc<Shared>,
    pub flush_interval: Duration,
    /// Drains the queue, then, if the recorder's lock is free (so no batch can be handed over
    /// meanwhile), takes the partly filled batch. Writing the drained messages first, then the
    /// partial batch, keeps the trace in the order the events happened.
    pub pull: Pull,
    /// Call sites resolved after their events ([`super::sites`]): each is written before its
    /// first use in this trace.
    pub sites: Option<Arc<SiteTable>>,
}

struct State {
    out: Option<TraceWriter<BufWriter<File>>>,
    /// Turns the records' clock ticks into nanoseconds.
    ticks: TickConverter,
    written: u64,
    /// Drops already reported in the trace.
    reported_dropped: u64,
    error: Option<String>,
    dirty: bool,
    bytes: u64,
    /// Events counted in `written` whose chunk never reached the file (the trace writer counts).
    lost: Option<Arc<AtomicU64>>,
    gate: Option<SiteGate>,
}

impl State {
    fn fail(&mut self, e: impl std::fmt::Display) {
        if self.error.is_none() {
            self.error = Some(e.to_string());
        }
        if let Some(w) = self.out.take() {
            self.bytes = w.bytes_written();
        }
    }
}

impl Writer {
    pub fn run(self) -> WriterOutcome {
        let mut st = State {
            out: None,
            ticks: self.shared.clock.converter(),
            written: 0,
            reported_dropped: 0,
            error: None,
            dirty: false,
            bytes: 0,
            lost: None,
            gate: self.sites.clone().map(SiteGate::new),
        };
        match TraceWriter::create(&self.path, &self.header) {
            Ok(mut w) => {
                // A live job: compression speed matters more than a few percent of size.
                w.set_compression_level(1);
                // Compression on a thread of its own: this one only encodes, so it keeps up
                // with faster programs. Without that thread it compresses inline.
                let _ = w.compress_in_background();
                st.bytes = w.bytes_written();
                st.lost = Some(w.lost_counter());
                let _ = self.shared.lost.set(w.lost_counter());
                st.out = Some(w);
            }
            Err(e) => st.fail(format!("cannot create {}: {e}", self.path.display())),
        }
        let mut last_flush = Instant::now();
        let mut acks = Vec::new();
        let mut shutdown = false;
        while !shutdown {
            let wait = self.flush_interval.saturating_sub(last_flush.elapsed());
            let mut pull_now = last_flush.elapsed() >= self.flush_interval;
            match self.rx.recv_timeout(wait) {
                Ok(Msg::Batch(v)) => self.write_batch(&mut st, v),
                Ok(Msg::Flush(ack)) => {
                    acks.push(ack);
                    pull_now = true;
                }
                Ok(Msg::Shutdown) | Err(RecvTimeoutError::Disconnected) => {
                    shutdown = true;
                    pull_now = true;
                }
                Err(RecvTimeoutError::Timeout) => pull_now = true,
            }
            if pull_now || last_flush.elapsed() >= self.flush_interval {
                let (drained, partial) = (self.pull)(&self.rx);
                for m in drained {
                    match m {
                        Msg::Batch(v) => self.write_batch(&mut st, v),
                        Msg::Flush(ack) => acks.push(ack),
                        Msg::Shutdown => shutdown = true,
                    }
                }
                self.write_batch(&mut st, partial);
                self.flush(&mut st);
                last_flush = Instant::now();
                for ack in acks.drain(..) {
                    let _ = ack.send(());
                }
            }
        }
        self.report_drops(&mut st);
        let complete = match st.out.take() {
            Some(w) => match w.finish() {
                Ok(mut f) => {
                    use std::io::Write;
                    let _ = f.flush();
                    st.bytes = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(st.bytes);
                    true
                }
                Err(e) => {
                    st.fail(e);
                    false
                }
            },
            None => false,
        };
        let lost = st.lost.as_ref().map_or(0, |l| l.load(Ordering::Relaxed)).min(st.written);
        WriterOutcome {
            events_written: st.written - lost,
            events_dropped: self.shared.dropped.load(Ordering::Relaxed) + lost,
            trace_bytes: st.bytes,
            error: st.error,
            complete,
            callsites_unresolved: st.gate.as_ref().map_or(0, |g| g.unresolved),
        }
    }

    fn write_batch(&self, st: &mut State, mut v: Batch) {
        if v.is_empty() {
            return;
        }
        match st.out.as_mut() {
            Some(w) => {
                st.ticks.calibrate();
                let (ticks, n, gate) = (&mut st.ticks, v.len() as u64, &mut st.gate);
                let (mut written, mut failed, mut defined) = (0u64, None, 0u64);
                v.decode(
                    |t| ticks.convert(t),
                    |time_ns, e| {
                        if failed.is_none() {
                            let r = match e {
                                Decoded::Hot(mut h) => {
                                    // A call site resolved after the event: its definition
                                    // first, at the event's time.
                                    if let (Some(g), Some(site)) = (gate.as_mut(), hot_site(&mut h)) {
                                        let (def, id) = g.admit(*site);
                                        *site = id;
                                        if let Some(frames) = def {
                                            let event = Event::CallSite { id, frames: frames.to_vec() };
                                            if let Err(e) = w.write_owned(Record { time_ns, event }) {
                                                failed = Some(e);
                                                return;
                                            }
                                            defined += 1;
                                        }
                                    }
                                    w.write_hot(time_ns, h)
                                }
                                Decoded::Other(event) => w.write_owned(Record { time_ns, event }),
                            };
                            // A failing record is already in the chunk that failed, and counted
                            // with its events as lost by the trace writer.
                            written += 1;
                            if let Err(e) = r {
                                failed = Some(e);
                            }
                        }
                    },
                );
                // Definitions the writer added are records of the trace too: counted as made,
                // so that written and dropped still add up to every event.
                self.shared.added.fetch_add(defined, Ordering::Relaxed);
                st.written += written + defined;
                if let Some(e) = failed {
                    self.shared.dropped.fetch_add(n - written, Ordering::Relaxed);
                    st.fail(e);
                }
                st.dirty = true;
            }
            None => {
                self.shared.dropped.fetch_add(v.len() as u64, Ordering::Relaxed);
            }
        }
        v.clear();
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.spare.try_send(v) {}
        self.report_drops(st);
    }

    /// Writes an `Event::Dropped` for drops not yet in the trace.
    fn report_drops(&self, st: &mut State) {
        let dropped = self.shared.dropped.load(Ordering::Relaxed);
        let new = dropped - st.reported_dropped;
        if new == 0 {
            return;
        }
        if let Some(w) = st.out.as_mut() {
            let time_ns = st.ticks.monotone(self.shared.clock.now_ns());
            w.note_dropped(new);
            if let Err(e) = w.write(&Record { time_ns, event: Event::Dropped { events: new } }) {
                st.fail(e);
            }
            st.dirty = true;
        }
        st.reported_dropped = dropped;
    }

    fn flush(&self, st: &mut State) {
        if !st.dirty {
            return;
        }
        if let Some(w) = st.out.as_mut() {
            match w.flush() {
                Ok(()) => st.bytes = w.bytes_written(),
                Err(e) => st.fail(e),
            }
        }
        st.dirty = false;
    }
}

/// The call site an event names, where it names one.
fn hot_site(h: &mut HotEvent) -> Option<&mut u32> {
    match h {
        HotEvent::Alloc { callsite, .. } | HotEvent::FreeRequested { callsite, .. } => Some(callsite),
        _ => None,
    }
}
