//! The recorder: the engine running on a device, safe to call from many threads, writing every
//! decision to a trace on disk while the program runs.
//!
//! ```text
//!  thread A ─┐                      ┌──────── Lock ──────────┐
//!  thread B ─┼─ malloc/free/mark ──▶│ Engine<D, RecSink>     │   bounded queue of batches
//!  thread C ─┘   (clock read        │   RecSink: Batch words ┼──▶ try_send ──▶ writer thread
//!                 outside the lock) └────────────────────────┘   (full: wait a little,      │ encode
//!                                                                  then drop + count)       ▼
//!                                                        compression thread ◀── chunks ── TraceWriter
//!                                                               │ zstd, frame, write
//!                                                               ▼ file
//! ```
//! The critical section is the engine call plus a few words pushed into a preallocated batch
//! (`batch.rs`); every event of one call carries the time read before the lock (a time stamp
//! counter read where reliable, converted by the writer: `clock.rs`). The lock (`lock.rs`) is
//! taken with one atomic exchange and released with a plain store. A full batch goes to the
//! writer with `try_send`: the allocating thread never blocks on I/O; when the queue is full
//! it gives the writer a little time, then drops the batch and counts it (the trace gets an
//! [`Event::Dropped`] and its trailer the count), and the summary says how long it waited. The
//! writer flushes a chunk at least every `flush_interval` (100 ms) while events are pending,
//! taking the partly filled batch itself, so after `kill -9` the trace reads up to its last
//! flushed chunk, about one interval behind.
//!
//! Generic over [`Device`]: on a `SimDevice` it runs in CI, on a `CudaDevice` on a GPU.

mod batch;
mod clock;
pub(crate) mod lock;
pub mod replay;
pub mod shim;
pub mod sites;
mod writer;

pub use clock::ClockSource;

pub use writer::WriterOutcome;

use crate::device::Device;
use crate::engine::config::AllocatorConfig;
use crate::engine::{Allocation, Engine, FreeError, OutOfMemory, Released, SegmentView, Sink, Stats};
use crate::trace::{Event, Frame, Header, MarkKind, Source, NO_CALLSITE};
use batch::Batch;
use lock::{Guard, Lock};
use std::cell::Cell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use writer::{Msg, Writer};

/// How to record: where, under which allocator settings, and the writer's knobs.
#[derive(Clone, Debug)]
pub struct RecorderOptions {
    pub path: PathBuf,
    /// The allocator settings as a `PYTORCH_CUDA_ALLOC_CONF` string (kept in the header).
    pub alloc_conf: String,
    /// Cap on reserved memory (PyTorch's memory fraction); `None` = the device's size.
    pub capacity_bytes: Option<u64>,
    /// For the header: the device's name and size, when the device does not say.
    pub device_name: String,
    pub device_total_bytes: u64,
    pub command_line: Vec<String>,
    pub notes: Vec<String>,
    /// Events per batch handed to the writer.
    pub batch_events: usize,
    /// Batches the queue holds before new ones are dropped.
    pub queue_batches: usize,
    /// The writer flushes at least this often while events are pending.
    pub flush_interval: Duration,
    /// When the queue is full (the writer is starved of CPU), an allocating thread yields its
    /// time slice for at most this long before dropping the batch. Zero: drop at once.
    pub full_queue_yield: Duration,
    /// Timestamps from the time stamp counter where it is reliable (see [`ClockSource`]);
    /// false: always `CLOCK_MONOTONIC`.
    pub use_tsc: bool,
    /// The device and rank the trace is of (the header's placement).
    pub placement: crate::trace::Placement,
    /// The PyTorch release of the traced program (`torch.__version__`), when known: the header
    /// keeps it and the engine follows that release's allocator.
    pub torch_version: Option<crate::engine::version::TorchVersion>,
    /// Call sites resolved after their events (the default back-end's Python stacks): the
    /// writer writes each one's definition before its first use ([`sites`]).
    pub sites: Option<Arc<sites::SiteTable>>,
}

impl RecorderOptions {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RecorderOptions {
            path: path.into(),
            alloc_conf: String::new(),
            capacity_bytes: None,
            device_name: String::new(),
            device_total_bytes: 0,
            command_line: Vec::new(),
            notes: Vec::new(),
            batch_events: 4096,
            queue_batches: 64,
            flush_interval: Duration::from_millis(100),
            full_queue_yield: FULL_QUEUE_YIELD,
            use_tsc: true,
            placement: crate::trace::Placement::default(),
            torch_version: None,
            sites: None,
        }
    }
}

/// Why a recorder could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error(transparent)]
    Conf(#[from] crate::engine::config::ConfError),
    #[error("cannot start the trace writer thread: {0}")]
    Thread(std::io::Error),
}

/// What a finished recording left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    pub path: PathBuf,
    /// Events the engine and recorder produced.
    pub events: u64,
    pub writer: WriterOutcome,
    /// Frees of addresses the engine did not know (ignored).
    pub free_errors: u64,
    /// Nanoseconds allocating threads waited for the writer to make room (it could not keep
    /// up with them); zero when recording never slowed the program down this way.
    pub waited_ns: u64,
}

impl RecordSummary {
    /// One line for people: where, how many events, what was lost and why.
    pub fn describe(&self) -> String {
        let w = &self.writer;
        let mut s = format!(
            "{}: {} events written, {} bytes ({:.1} bytes/event)",
            self.path.display(),
            w.events_written,
            w.trace_bytes,
            w.trace_bytes as f64 / w.events_written.max(1) as f64
        );
        if w.events_dropped > 0 {
            s += &format!(", {} events DROPPED", w.events_dropped);
        }
        if let Some(e) = &w.error {
            s += &format!(", write error: {e}");
        }
        if !w.complete {
            s += ", trace incomplete";
        }
        if self.waited_ns > 0 {
            s += &format!(", allocations waited {:.1} ms for the writer", self.waited_ns as f64 / 1e6);
        }
        s
    }
}

/// An interned call site, from [`Recorder::callsite`] or [`Recorder::tag`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CallSite(pub u32);

impl CallSite {
    pub const NONE: CallSite = CallSite(NO_CALLSITE);
}

thread_local! {
    static CURRENT_SITE: Cell<u32> = const { Cell::new(NO_CALLSITE) };
}

/// Restores the thread's previous call site when dropped; see [`Recorder::scope`].
pub struct SiteScope {
    prev: u32,
}

impl Drop for SiteScope {
    fn drop(&mut self) {
        CURRENT_SITE.with(|c| c.set(self.prev));
    }
}

/// State shared by the recorder, its sink and its writer.
pub(crate) struct Shared {
    pub dropped: AtomicU64,
    /// Nanoseconds allocating threads spent waiting for room in the writer's queue.
    pub waited_ns: AtomicU64,
    pub clock: clock::Clock,
    /// The trace writer's count of events whose chunk never reached the file (set once the
    /// file is open).
    pub lost: std::sync::OnceLock<Arc<AtomicU64>>,
    /// Records the writer added (call-site definitions written before their first use).
    pub added: AtomicU64,
}

/// How long an allocating thread yields to a starved writer before dropping a batch (default).
pub const FULL_QUEUE_YIELD: Duration = Duration::from_millis(20);

/// The engine's event sink inside the recorder: a batch being filled.
pub struct RecSink {
    /// The clock's ticks at entry to the current call; the writer converts them to ns.
    now_ticks: u64,
    buf: Batch,
    batch: usize,
    tx: SyncSender<Msg>,
    spare: Receiver<Batch>,
    shared: Arc<Shared>,
    /// Events handed to the writer (or dropped on the way).
    handed: u64,
    closed: bool,
    full_queue_yield: Duration,
}

impl RecSink {
    /// Starts a call: its events happen at `ticks`.
    #[inline]
    fn set_time(&mut self, ticks: u64) {
        self.now_ticks = ticks;
        if !self.closed {
            self.buf.time(ticks);
        }
    }

    /// An empty batch (a recycled one when the writer has returned some), at the current time.
    fn next_batch(&mut self) -> Batch {
        let mut next = self.spare.try_recv().unwrap_or_else(|_| Batch::with_capacity(self.batch));
        next.time(self.now_ticks);
        next
    }

    /// Events produced so far: handed over, or in the batch being filled.
    fn produced(&self) -> u64 {
        self.handed + self.buf.len() as u64
    }

    #[cold]
    fn hand_over(&mut self) {
        if self.closed {
            // After `finish` (which set `batch` to 0, so every event comes here) events are
            // not recorded.
            self.buf.clear();
            return;
        }
        self.handed += self.buf.len() as u64;
        let next = self.next_batch();
        let full = std::mem::replace(&mut self.buf, next);
        // Soft backpressure: when the queue is full the writer is starved of CPU (allocating
        // threads outnumber the cores), so give it the core in short sleeps, for at most
        // `full_queue_yield` in all, before dropping the batch. The allocating thread never waits for
        // I/O, and never long; a job whose writer keeps up never gets here.
        let mut msg = Msg::Batch(full);
        let mut since: Option<std::time::Instant> = None;
        loop {
            match self.tx.try_send(msg) {
                Err(TrySendError::Full(m))
                    if since.get_or_insert_with(std::time::Instant::now).elapsed() < self.full_queue_yield =>
                {
                    msg = m;
                    // A short sleep, not `yield_now`: with more allocating threads than cores,
                    // yielding threads are rescheduled at once and the writer still starves.
                    std::thread::sleep(Duration::from_micros(50));
                    continue;
                }
                Ok(()) => {}
                Err(TrySendError::Full(Msg::Batch(v)) | TrySendError::Disconnected(Msg::Batch(v))) => {
                    self.shared.dropped.fetch_add(v.len() as u64, Ordering::Relaxed);
                }
                Err(_) => {}
            }
            // Sent or dropped: the time this thread spent waiting is the program's.
            if let Some(t) = since {
                self.shared.waited_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            return;
        }
    }

    fn take(&mut self) -> Batch {
        self.handed += self.buf.len() as u64;
        let next = self.next_batch();
        std::mem::replace(&mut self.buf, next)
    }
}

impl Sink for RecSink {
    #[inline(always)]
    fn event(&mut self, event: Event) {
        self.buf.push(event);
        if self.buf.len() >= self.batch {
            self.hand_over();
        }
    }
}

struct Inner<D: Device> {
    engine: Engine<D, RecSink>,
    sites: HashMap<Vec<Frame>, u32>,
    free_errors: u64,
    /// A caller's state kept under the recorder's lock ([`Recorder::with_state`]), and the
    /// type of the boxed value: comparing it with the wanted type is one comparison of two
    /// values, where `downcast_mut` asks the box through its vtable (an indirect call, a fifth
    /// of the default back-end's own time per event).
    state: Option<(Box<dyn std::any::Any + Send>, std::any::TypeId)>,
}

/// Writes events from inside [`Recorder::with_state`], at the time that call was given.
pub struct Emit<'a>(&'a mut RecSink);

impl Emit<'_> {
    #[inline(always)]
    pub fn event(&mut self, event: Event) {
        self.0.event(event);
    }
}

/// The engine on a device, recording to a trace. See the module documentation.
pub struct Recorder<D: Device + Send + 'static> {
    inner: Arc<Lock<Inner<D>>>,
    shared: Arc<Shared>,
    tx: SyncSender<Msg>,
    writer: Mutex<Option<JoinHandle<WriterOutcome>>>,
    path: PathBuf,
}

impl<D: Device + Send + 'static> Recorder<D> {
    /// Starts recording to `opts.path`. The trace file is created by the writer thread: an
    /// unwritable path does not stop the recorder (its events are counted as dropped and
    /// [`Recorder::finish`] says why).
    pub fn start(opts: RecorderOptions, mut device: D) -> Result<Self, StartError> {
        let config = AllocatorConfig::parse(&opts.alloc_conf)?;
        let clock = clock::Clock::start(opts.use_tsc);
        let unix_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        let mem = device.mem_info();
        let mut header = Header::new(Source::Recorded);
        header.device_name = opts.device_name.clone();
        header.device_total_bytes = mem.map(|(_, t)| t).unwrap_or(opts.device_total_bytes);
        header.alloc_conf = opts.alloc_conf.clone();
        header.config = config.clone();
        header.capacity_bytes = opts.capacity_bytes.unwrap_or(0);
        header.clock_origin_unix_ns = unix_ns;
        header.pid = std::process::id();
        header.command_line = opts.command_line.clone();
        header.notes = opts.notes.clone();
        header.placement = opts.placement;
        header.torch_version = opts.torch_version.map(|v| v.to_string()).unwrap_or_default();
        header.notes.push(format!("clock: {}", clock.source().describe()));

        let shared = Arc::new(Shared {
            dropped: AtomicU64::new(0),
            waited_ns: AtomicU64::new(0),
            clock,
            lost: std::sync::OnceLock::new(),
            added: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::sync_channel(opts.queue_batches.max(1));
        let (spare_tx, spare_rx) = mpsc::sync_channel(opts.queue_batches.max(1));
        let batch = opts.batch_events.max(1);
        let sink = RecSink {
            now_ticks: 0,
            buf: Batch::with_capacity(batch),
            batch,
            tx: tx.clone(),
            spare: spare_rx,
            shared: shared.clone(),
            handed: 0,
            closed: false,
            full_queue_yield: opts.full_queue_yield,
        };
        let mut engine = Engine::new(config, opts.capacity_bytes, device, sink)
            .with_torch_version(opts.torch_version.unwrap_or_default());
        if let Some((free_bytes, total_bytes)) = mem {
            engine.sink_mut().event(Event::DeviceMemInfo { free_bytes, total_bytes });
        }
        let inner = Arc::new(Lock::new(Inner { engine, sites: HashMap::new(), free_errors: 0, state: None }));
        let pull_from = Arc::downgrade(&inner);
        let w = Writer {
            path: opts.path.clone(),
            header,
            rx,
            spare: spare_tx,
            shared: shared.clone(),
            flush_interval: opts.flush_interval,
            sites: opts.sites.clone(),
            pull: Box::new(move |rx: &Receiver<Msg>| match pull_from.upgrade() {
                // `try_lock`: a thread that holds the lock may be waiting for room in the queue
                // (soft backpressure); then only drain the queue, which frees that room. The
                // partial batch is taken on a later pull, or handed over when it fills.
                Some(inner) => match inner.try_lock() {
                    Some(mut g) => {
                        let drained: Vec<Msg> = rx.try_iter().collect();
                        (drained, g.engine.sink_mut().take())
                    }
                    None => (rx.try_iter().collect(), Batch::default()),
                },
                None => (rx.try_iter().collect(), Batch::default()),
            }),
        };
        let handle = std::thread::Builder::new()
            .name("alloctrace-writer".into())
            .spawn(move || w.run())
            .map_err(StartError::Thread)?;
        Ok(Recorder { inner, shared, tx, writer: Mutex::new(Some(handle)), path: opts.path })
    }

    #[inline]
    fn enter(&self) -> Guard<'_, Inner<D>> {
        let now = self.shared.clock.ticks();
        let mut g = self.inner.lock();
        g.engine.sink_mut().set_time(now);
        g
    }

    /// Allocates `bytes` on `stream`, attributed to the thread's current call site
    /// ([`Recorder::scope`]).
    #[inline]
    pub fn malloc(&self, bytes: u64, stream: u64) -> Result<Allocation, OutOfMemory> {
        let site = CURRENT_SITE.with(|c| c.get());
        self.malloc_at(bytes, stream, CallSite(site))
    }

    /// Allocates `bytes` on `stream` from call site `site`.
    #[inline]
    pub fn malloc_at(&self, bytes: u64, stream: u64, site: CallSite) -> Result<Allocation, OutOfMemory> {
        let mut g = self.enter();
        let r = g.engine.malloc(bytes, stream, site.0);
        if r.is_err() {
            Self::oom_mem_info(&mut g);
        }
        r
    }

    #[cold]
    fn oom_mem_info(g: &mut Inner<D>) {
        if let Some((free_bytes, total_bytes)) = g.engine.device_mut().mem_info() {
            g.engine.sink_mut().event(Event::DeviceMemInfo { free_bytes, total_bytes });
        }
    }

    /// Frees the block at `addr` (back in the cache at once).
    #[inline]
    pub fn free(&self, addr: u64) -> Result<(), FreeError> {
        let mut g = self.enter();
        let r = g.engine.free(addr);
        if r.is_err() {
            g.free_errors += 1;
        }
        r
    }

    /// Stream-ordered free, first half: the block is no longer allocated, not yet reusable.
    pub fn free_requested(&self, addr: u64) -> Result<(), FreeError> {
        let mut g = self.enter();
        let r = g.engine.free_requested(addr);
        if r.is_err() {
            g.free_errors += 1;
        }
        r
    }

    /// Stream-ordered free, second half: the stream's work is done, the block is reusable.
    pub fn free_completed(&self, addr: u64) -> Result<(), FreeError> {
        let mut g = self.enter();
        let r = g.engine.free_completed(addr);
        if r.is_err() {
            g.free_errors += 1;
        }
        r
    }

    /// Releases every whole free segment and free expandable page (`torch.cuda.empty_cache()`).
    pub fn empty_cache(&self) -> Released {
        self.enter().engine.empty_cache()
    }

    /// Labels this moment of the trace (a phase, an iteration, free text).
    pub fn mark(&self, kind: MarkKind, text: &str) {
        self.enter().engine.sink_mut().event(Event::Mark { kind, text: text.to_string() });
    }

    /// Writes an event that did not come from the engine (the events of another allocator, e.g.
    /// PyTorch's own, forwarded as they happen), at the current time.
    pub fn record(&self, event: Event) {
        self.enter().engine.sink_mut().event(event);
    }

    /// Keeps `state` under the recorder's lock, for [`Recorder::with_state`] (replacing any
    /// earlier one).
    pub fn set_state(&self, state: Box<dyn std::any::Any + Send>) {
        // The boxed value's type, not the box's.
        let ty = (*state).type_id();
        self.inner.lock().state = Some((state, ty));
    }

    /// Runs `f` under the recorder's lock, on the state given to [`Recorder::set_state`] (`None`
    /// when there is none of type `T`), with an [`Emit`] that writes events at `ticks`: a
    /// reading of this recorder's clock the caller already has (a time stamp counter value,
    /// where [`Recorder::clock_source`] is [`ClockSource::Tsc`]), or, for `None`, now. One lock
    /// and at most one clock read for the state's update and its events: the default back-end
    /// forwards each of PyTorch's allocator events this way.
    #[inline]
    pub fn with_state<T: 'static, R>(
        &self,
        ticks: Option<u64>,
        f: impl FnOnce(&mut T, &mut Emit<'_>) -> R,
    ) -> Option<R> {
        let now = ticks.unwrap_or_else(|| self.shared.clock.ticks());
        let mut g = self.inner.lock();
        let Inner { engine, state, .. } = &mut *g;
        let (boxed, ty) = state.as_mut()?;
        if *ty != std::any::TypeId::of::<T>() {
            return None;
        }
        // SAFETY: `ty` is the type of the boxed value (taken from it in `set_state`), and it is
        // `T`: the pointer to the value is a valid `*mut T`, borrowed mutably through the guard.
        let state = unsafe { &mut *(boxed.as_mut() as *mut (dyn std::any::Any + Send) as *mut T) };
        let sink = engine.sink_mut();
        sink.set_time(now);
        Some(f(state, &mut Emit(sink)))
    }

    /// Before `fork`: takes the lock and keeps it, so that the child gets a consistent copy.
    /// Then exactly one of [`Recorder::after_fork_in_parent`] (in the parent) or
    /// [`Recorder::after_fork_in_child`] (in the child) must follow.
    pub fn before_fork(&self) {
        self.inner.lock_and_keep();
    }

    /// After `fork`, in the parent: gives the lock back.
    ///
    /// # Safety
    /// Only after [`Recorder::before_fork`], once.
    pub unsafe fn after_fork_in_parent(&self) {
        // SAFETY: `before_fork` kept the lock.
        unsafe { self.inner.force_unlock(|_| {}) };
    }

    /// After `fork`, in the child: the child records nothing. Its copy of the recorder has no
    /// writer thread, so handing it batches would only fill the queue and make every
    /// allocation wait for a writer that does not exist; events are discarded instead. The
    /// allocator keeps working (on the child's copy of its state). Gives the lock back.
    ///
    /// # Safety
    /// Only after [`Recorder::before_fork`], once, in the child.
    pub unsafe fn after_fork_in_child(&self) {
        // SAFETY: `before_fork` kept the lock (copied into the child taken).
        unsafe {
            self.inner.force_unlock(|g| {
                let s = g.engine.sink_mut();
                s.buf.clear();
                s.closed = true;
                s.batch = 0;
            })
        };
    }

    /// Interns a call site (innermost frame first); the first use writes its definition.
    pub fn callsite(&self, frames: Vec<Frame>) -> CallSite {
        let mut g = self.enter();
        if let Some(&id) = g.sites.get(&frames) {
            return CallSite(id);
        }
        let id = g.sites.len() as u32 + 1;
        g.sites.insert(frames.clone(), id);
        g.engine.sink_mut().event(Event::CallSite { id, frames });
        CallSite(id)
    }

    /// A call site named by a tag (one frame whose function is `name`). Intern once, keep the
    /// returned id: passing it is free.
    pub fn tag(&self, name: &str) -> CallSite {
        self.callsite(vec![Frame { file: String::new(), line: 0, function: name.to_string() }])
    }

    /// Makes `site` the call site of this thread's `malloc`s until the guard drops.
    pub fn scope(&self, site: CallSite) -> SiteScope {
        let prev = CURRENT_SITE.with(|c| c.replace(site.0));
        SiteScope { prev }
    }

    /// The allocator's statistics (`torch.cuda.memory_stats()` names).
    pub fn stats(&self) -> Stats {
        self.inner.lock().engine.stats().clone()
    }

    /// The cache's segments and blocks right now.
    pub fn segments(&self) -> Vec<SegmentView> {
        self.inner.lock().engine.segments()
    }

    /// Runs `f` on the device (e.g. to read a `CudaDevice`'s errors), under the lock.
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(self.inner.lock().engine.device_mut())
    }

    /// Events dropped so far (full queue, write errors, chunks that did not reach the file).
    /// After [`Recorder::finish`], the summary's count is the exact one.
    pub fn dropped_events(&self) -> u64 {
        let lost = self.shared.lost.get().map_or(0, |l| l.load(Ordering::Relaxed));
        self.shared.dropped.load(Ordering::Relaxed) + lost
    }

    /// Events produced so far (written, queued or dropped).
    pub fn produced_events(&self) -> u64 {
        self.inner.lock().engine.sink_mut().produced()
    }

    /// Frees of unknown addresses so far.
    pub fn free_errors(&self) -> u64 {
        self.inner.lock().free_errors
    }

    /// Nanoseconds since the trace's clock origin (the timestamps of its records).
    pub fn now_ns(&self) -> u64 {
        self.shared.clock.now_ns()
    }

    /// What the trace's timestamps were read from.
    pub fn clock_source(&self) -> ClockSource {
        self.shared.clock.source()
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Hands over the pending events and waits until the writer has written and flushed them.
    pub fn flush(&self) {
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        if self.tx.send(Msg::Flush(ack_tx)).is_ok() {
            let _ = ack_rx.recv();
        }
    }

    /// Writes the last events and the trailer and stops the writer. Later calls still allocate
    /// and free, but record nothing; a second `finish` returns the same outcome's counts with
    /// nothing more written.
    pub fn finish(&self) -> RecordSummary {
        let (produced, free_errors, last, handle) = {
            let mut g = self.inner.lock();
            // The writer's handle and the partial batch are taken in one critical section, so
            // that of two `finish` calls exactly one sends the batch and stops the writer.
            let handle = lock(&self.writer).take();
            let s = g.engine.sink_mut();
            // The partial batch leaves with the close: from now on every event goes to
            // `hand_over` (batch 0), which discards it.
            let last = (handle.is_some() && !s.closed).then(|| s.take());
            s.closed = true;
            s.batch = 0;
            (s.produced(), g.free_errors, last, handle)
        };
        let handle_was_running = handle.is_some();
        let writer = match handle {
            Some(h) => {
                // Queued behind every earlier batch, so the trace keeps the events' order.
                if let Some(last) = last {
                    let _ = self.tx.send(Msg::Batch(last));
                }
                let _ = self.tx.send(Msg::Shutdown);
                h.join().unwrap_or_else(|_| WriterOutcome {
                    error: Some("the trace writer thread panicked".into()),
                    ..Default::default()
                })
            }
            None => WriterOutcome { error: Some("already finished".into()), ..Default::default() },
        };
        let mut writer = writer;
        let produced = produced + self.shared.added.load(Ordering::Relaxed);
        if writer.error.is_some() && handle_was_running {
            writer.count_what_the_file_holds(&self.path, produced);
        }
        let waited_ns = self.shared.waited_ns.load(Ordering::Relaxed);
        RecordSummary { path: self.path.clone(), events: produced, writer, free_errors, waited_ns }
    }
}

impl<D: Device + Send + 'static> Drop for Recorder<D> {
    /// A recorder dropped without [`Recorder::finish`] finishes its trace.
    fn drop(&mut self) {
        if lock(&self.writer).is_some() {
            self.finish();
        }
    }
}

/// Locks, ignoring poisoning: a panic elsewhere must not stop every later allocation.
#[inline]
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
