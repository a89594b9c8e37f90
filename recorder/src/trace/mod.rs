//! # The alloctrace trace format (`.atrace`), version 1
//!
//! This module documentation is the specification. A trace is a byte stream:
//!
//! ```text
//! offset 0                     8        10       12
//!        +---------------------+--------+--------+----------------+------------+-----+---------+
//!        | magic (8 bytes)     | version| flags  | header frame   | chunk frame| ... | trailer |
//!        | 89 41 54 52 43 0D 0A 1A  u16 LE  u16 LE |                |            |     | frame   |
//!        +---------------------+--------+--------+----------------+------------+-----+---------+
//! ```
//! * **magic** is `\x89ATRC\r\n\x1a` (the PNG trick: a high byte, CR LF and ^Z catch transfers
//!   that mangle binary files).
//! * **version** is [`FORMAT_VERSION`]. A reader accepts every version from 1 up to its own and
//!   refuses a newer one with an error naming both ([`TraceError::NewerVersion`]). **flags** are
//!   0; a reader refuses any other value (no flag is defined) and version 0.
//!
//! ## Frames
//! Everything after the 12-byte preamble is a sequence of frames:
//! ```text
//! +-------------+--------+---------------+---------------------------+
//! | len: u32 LE | kind u8| crc32: u32 LE | payload (len bytes)       |
//! +-------------+--------+---------------+---------------------------+
//!   crc32 (IEEE, crc32fast) covers the kind byte and the payload.
//! ```
//! Frame kinds: `1` header, `2` event chunk, `3` trailer. `len` is at most [`MAX_FRAME_BYTES`];
//! a larger value is corruption, so a hostile length never makes a reader allocate.
//!
//! * **Header frame** (exactly one, first): [`Header`] encoded with bincode 2, standard
//!   configuration (little endian, varint integers).
//! * **Chunk frame**: a self-contained batch of events.
//!   ```text
//!   +----------+----------------+-----------------+--------------------------------------+
//!   | codec u8 | count: varint  | raw_len: varint | body: raw_len bytes, zstd-compressed |
//!   +----------+----------------+-----------------+--------------------------------------+
//!   ```
//!   codec `0` = body stored as is, `1` = zstd. `raw_len` is at most [`MAX_CHUNK_RAW_BYTES`].
//!   The body is `count` [`Record`]s, each bincode-encoded (standard configuration) after the
//!   **delta transform** below. Chunks are independent: the delta state starts at zero in each,
//!   so a reader can decode any chunk alone and a damaged chunk loses only itself.
//! * **Trailer frame** (last): bincode [`Trailer`]: the number of events and chunks written and
//!   the number of events the writer had to drop. A trace without a trailer was cut short
//!   (a killed process): readers analyze every complete chunk and report it as truncated.
//!   Nothing follows the trailer: bytes after it (`cat a.atrace b.atrace`) make the trace
//!   corrupt at the first of them.
//!
//! ## Bounds
//! Every record and chunk is bounded, and a reader accepts exactly what a writer makes, so a
//! small hostile file cannot make a reader allocate much (memory per chunk decoded is at most
//! about [`MAX_CHUNK_RAW_BYTES`] plus 70 bytes per event and frame):
//!
//! | what | writer | reader |
//! |---|---|---|
//! | events per chunk | at most [`CHUNK_EVENTS`] | refuses more |
//! | chunk body | ends a chunk at [`WRITER_CHUNK_BYTES`] (plus one record) | refuses more than [`MAX_CHUNK_RAW_BYTES`] |
//! | frames per call site | cuts to [`MAX_CALLSITE_FRAMES`], the last a marker | refuses more |
//! | frames per chunk | ends a chunk before [`MAX_CHUNK_FRAMES`] | refuses more |
//! | a mark's text, a frame's file and function, header strings | cuts to [`MAX_TEXT_BYTES`] with a marker | refuses more |
//! | header lists (`command_line`, `notes`) | cuts to [`MAX_HEADER_ITEMS`] | refuses more |
//! | header `config` | must be what parsing its own configuration string gives | refuses anything else |
//! | frame payload | refuses to write more than [`MAX_FRAME_BYTES`] | refuses more |
//!
//! The writer and the reader encode and decode records with specialised code for the same
//! bytes (`encode.rs`, `decode.rs`), checked against bincode's own by property tests.
//!
//! ## Delta transform (applied per chunk before bincode, undone after decoding)
//! bincode's varint writes values below 251 in one byte, below 2^16 in three, below 2^32 in
//! five. Events of an allocator trace are close to their predecessors, so fields are stored as
//! differences (two's complement difference, zigzag-mapped: 0, -1, 1, -2, ... -> 0, 1, 2, 3, ...):
//!
//! | field | stored as |
//! |---|---|
//! | `time_ns` | difference to the previous record's time |
//! | every `addr` | difference to the previous address of any event in the chunk |
//! | `absorbed_addr` (merge) | difference to the same event's `addr` |
//! | `id` (alloc, frees) | difference to the previous id in the chunk |
//! | `block_bytes` (alloc) | difference to `requested_bytes` |
//! | `stream` | difference to the previous stream in the chunk |
//!
//! Worked example: two allocations 512 bytes apart at t=1000 ns and t=1250 ns, ids 7 and 8,
//! stream 0: the second is stored as `time 500 (zigzag of +250), id 2 (zigzag of +1),
//! addr 1024 (zigzag of +512)` = one byte, one byte, three bytes.
//!
//! ## Units and conventions
//! Sizes are bytes, times nanoseconds since [`Header::clock_origin_unix_ns`], streams the CUDA
//! stream handle as an integer. Call sites ([`Event::CallSite`]) are defined once, before their
//! first use, and referenced by id; id 0 means none. Ids need not be defined in increasing
//! order, nor every id used: a recorder that learns a call site's frames after the event that
//! uses it (the default back-end's stacks, resolved off PyTorch's allocator lock) writes the
//! definition just before the first event that uses it, at that event's time, in the same
//! chunk.
//!
//! ## Compatibility
//! Header fields are appended after `notes`, each written only when it (or a later one) is
//! known: [`Placement`], then `torch_version` (the PyTorch release, a string); a header without
//! them has the first version's bytes, and a reader fills what is missing with the defaults.
//! Event variants and fields are append-only (bincode numbers variants in declaration order);
//! the golden-bytes test `golden_bytes_are_stable` pins the encoding. Any change that alters
//! existing bytes must bump [`FORMAT_VERSION`].

mod background;
mod decode;
mod encode;
mod event;
mod header;
mod pools;

pub use event::*;
pub use header::*;
pub use pools::{Burst, Observed, RecordedPools};

use bincode::config::{self, Configuration, Limit, LittleEndian, Varint};
use bincode::{Decode, Encode};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// First eight bytes of every trace.
pub const MAGIC: [u8; 8] = *b"\x89ATRC\r\n\x1a";
/// The version this build writes, and the newest it reads.
pub const FORMAT_VERSION: u16 = 1;
/// Largest frame payload a reader accepts: a chunk body of [`MAX_CHUNK_RAW_BYTES`] stored as
/// is, or compressed (zstd's worst case adds a little), with its head.
pub const MAX_FRAME_BYTES: u32 = (32 << 20) + (1 << 16);
/// Largest decompressed chunk body a reader accepts: twice what a writer makes (a chunk ends
/// once its body reaches [`WRITER_CHUNK_BYTES`], and one record adds at most a call site of
/// [`MAX_CALLSITE_FRAMES`] frames of [`MAX_TEXT_BYTES`] strings, about 8 MiB).
pub const MAX_CHUNK_RAW_BYTES: u64 = 32 << 20;
/// A writer ends a chunk once its body holds this many bytes.
pub const WRITER_CHUNK_BYTES: u64 = 8 << 20;
/// A writer starts a new chunk after this many events; a reader refuses a chunk of more.
pub const CHUNK_EVENTS: usize = 1 << 16;
/// Most call-site frames in one chunk: a writer ends a chunk before a call site would pass it,
/// and a reader refuses more. (A frame takes 3 bytes stored and about 60 decoded, so without
/// this a chunk of empty frames would decode to twenty times its size.)
pub const MAX_CHUNK_FRAMES: u64 = 1 << 18;
/// Bytes of the preamble (magic, version, flags).
pub const PREAMBLE_BYTES: u64 = 12;
/// Bytes of a frame's head (len, kind, crc).
pub const FRAME_HEAD_BYTES: u64 = 9;

const KIND_HEADER: u8 = 1;
const KIND_CHUNK: u8 = 2;
const KIND_TRAILER: u8 = 3;
const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;
const ZSTD_LEVEL: i32 = 3;

type Cfg = Configuration<LittleEndian, Varint, Limit<{ 64 << 20 }>>;
fn cfg() -> Cfg {
    config::standard().with_limit::<{ 64 << 20 }>()
}

/// The last frame of a complete trace.
#[derive(Encode, Decode, serde::Serialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Trailer {
    pub events: u64,
    pub chunks: u64,
    /// Events the writer could not write (disk full, buffer overflow).
    pub dropped_events: u64,
}

/// Errors of reading or writing a trace. Offsets are bytes from the start of the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("not an alloctrace trace: {}", foreign_start(found))]
    NotATrace { found: Vec<u8> },
    #[error(
        "trace format version {found} is newer than this alloctrace supports (version {supported}); upgrade alloctrace"
    )]
    NewerVersion { found: u16, supported: u16 },
    #[error("corrupt trace at byte {offset}: {reason}")]
    Corrupt { offset: u64, reason: String },
    #[error("trace is truncated at byte {offset}: {reason}")]
    Truncated { offset: u64, reason: String },
    #[error("cannot encode trace record: {0}")]
    Encode(String),
}

/// What the first bytes of a file that is not a trace are, as far as that helps the user.
fn foreign_start(found: &[u8]) -> String {
    match found {
        [] => "the file is empty (byte 0)".into(),
        [0x80, proto @ 2..=5, ..] => format!(
            "byte 0 starts a Python pickle (protocol {proto}); a PyTorch memory snapshot becomes a trace with \
             `alloctrace import torch SNAPSHOT.pickle -o OUT.atrace`"
        ),
        _ if MAGIC.starts_with(found) => {
            format!("the file ends at byte {} inside the 8-byte magic {MAGIC:02x?}", found.len())
        }
        // `torch.save` writes a zip: a checkpoint, not a memory snapshot.
        [b'P', b'K', 3, 4, ..] => "byte 0 starts a zip archive, as torch.save writes a checkpoint; the commands read \
             an alloctrace trace or a PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot writes)"
            .into(),
        _ => format!(
            "byte 0 starts with {found:02x?}, expected the magic {MAGIC:02x?}; the commands read an alloctrace trace \
             or a PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot writes)"
        ),
    }
}

impl TraceError {
    /// The byte offset of the damage, for corruption and truncation.
    pub fn offset(&self) -> Option<u64> {
        match self {
            TraceError::Corrupt { offset, .. } | TraceError::Truncated { offset, .. } => Some(*offset),
            TraceError::NotATrace { .. } => Some(0),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Delta transform
// ---------------------------------------------------------------------------------------------

#[inline]
fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}
#[inline]
fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Per-chunk state of the delta transform.
#[derive(Default, Clone)]
struct DeltaState {
    time: u64,
    addr: u64,
    id: u64,
    stream: u64,
}

#[inline(always)]
fn enc(prev: &mut u64, v: &mut u64) {
    let cur = *v;
    *v = zigzag(cur.wrapping_sub(*prev) as i64);
    *prev = cur;
}
#[inline(always)]
fn dec(prev: &mut u64, v: &mut u64) {
    let cur = prev.wrapping_add(unzigzag(*v) as u64);
    *v = cur;
    *prev = cur;
}

impl DeltaState {
    /// Rewrites `r` in place to its stored (`ENCODE`) or real (decode) form.
    #[inline]
    fn apply<const ENCODE: bool>(&mut self, r: &mut Record) {
        let f = if ENCODE { enc } else { dec };
        f(&mut self.time, &mut r.time_ns);
        match &mut r.event {
            Event::Alloc { id, addr, requested_bytes, block_bytes, stream, .. } => {
                f(&mut self.id, id);
                f(&mut self.addr, addr);
                let mut base = *requested_bytes;
                f(&mut base, block_bytes);
                f(&mut self.stream, stream);
            }
            Event::FreeRequested { id, addr, .. } | Event::FreeCompleted { id, addr } => {
                f(&mut self.id, id);
                f(&mut self.addr, addr);
            }
            Event::SegmentAlloc { addr, stream, .. }
            | Event::SegmentFree { addr, stream, .. }
            | Event::SegmentMap { addr, stream, .. }
            | Event::SegmentUnmap { addr, stream, .. } => {
                f(&mut self.addr, addr);
                f(&mut self.stream, stream);
            }
            Event::Split { addr, .. } | Event::SegmentPool { addr, .. } => f(&mut self.addr, addr),
            Event::Merge { addr, absorbed_addr, .. } => {
                f(&mut self.addr, addr);
                // On encode `addr` now holds its delta; use the real address kept in state.
                let mut base = self.addr;
                f(&mut base, absorbed_addr);
            }
            Event::Oom { stream, .. } => f(&mut self.stream, stream),
            Event::CacheRelease { .. }
            | Event::Mark { .. }
            | Event::CallSite { .. }
            | Event::Snapshot { .. }
            | Event::DeviceMemInfo { .. }
            | Event::Dropped { .. } => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

/// The fields of an event of the five kinds that make up almost every trace, for
/// [`TraceWriter::write_hot`]. The same fields as the [`Event`] variants of those names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotEvent {
    Alloc { id: u64, addr: u64, requested_bytes: u64, block_bytes: u64, stream: u64, pool: Pool, callsite: u32 },
    FreeRequested { id: u64, addr: u64, callsite: u32 },
    FreeCompleted { id: u64, addr: u64 },
    Split { addr: u64, bytes: u64, remainder_bytes: u64 },
    Merge { addr: u64, absorbed_addr: u64, bytes: u64 },
}

impl HotEvent {
    /// The hot form of `event`, if it is of one of the five kinds.
    #[inline]
    pub fn of(event: &Event) -> Option<HotEvent> {
        Some(match *event {
            Event::Alloc { id, addr, requested_bytes, block_bytes, stream, pool, callsite } => {
                HotEvent::Alloc { id, addr, requested_bytes, block_bytes, stream, pool, callsite }
            }
            Event::FreeRequested { id, addr, callsite } => HotEvent::FreeRequested { id, addr, callsite },
            Event::FreeCompleted { id, addr } => HotEvent::FreeCompleted { id, addr },
            Event::Split { addr, bytes, remainder_bytes } => HotEvent::Split { addr, bytes, remainder_bytes },
            Event::Merge { addr, absorbed_addr, bytes } => HotEvent::Merge { addr, absorbed_addr, bytes },
            _ => return None,
        })
    }

    pub fn into_event(self) -> Event {
        match self {
            HotEvent::Alloc { id, addr, requested_bytes, block_bytes, stream, pool, callsite } => {
                Event::Alloc { id, addr, requested_bytes, block_bytes, stream, pool, callsite }
            }
            HotEvent::FreeRequested { id, addr, callsite } => Event::FreeRequested { id, addr, callsite },
            HotEvent::FreeCompleted { id, addr } => Event::FreeCompleted { id, addr },
            HotEvent::Split { addr, bytes, remainder_bytes } => Event::Split { addr, bytes, remainder_bytes },
            HotEvent::Merge { addr, absorbed_addr, bytes } => Event::Merge { addr, absorbed_addr, bytes },
        }
    }
}

/// Writes a trace: preamble and header at creation, events in chunks, a trailer at `finish`.
///
/// Records are encoded as they arrive; a chunk frame is written every [`CHUNK_EVENTS`] events
/// and at every [`TraceWriter::flush`], so what was flushed survives a killed process.
pub struct TraceWriter<W: Write> {
    /// The output, unless a compression thread owns it.
    out: Option<W>,
    bg: Option<background::Compressor<W>>,
    /// Without a compression thread: events of chunks written since the last successful flush,
    /// and the count of lost events (shared with the compression thread).
    unflushed: Unflushed,
    body: Vec<u8>,
    count: u64,
    /// Call-site frames in the pending chunk.
    chunk_frames: u64,
    delta: DeltaState,
    trailer: Trailer,
    frame: Vec<u8>,
    compress: bool,
    level: i32,
    bytes_written: u64,
}

impl TraceWriter<BufWriter<File>> {
    /// Creates (truncates) `path` and writes the preamble and `header`.
    pub fn create(path: impl AsRef<Path>, header: &Header) -> Result<Self, TraceError> {
        let f = File::create(path)?;
        TraceWriter::new(BufWriter::with_capacity(1 << 20, f), header)
    }
}

impl<W: Write> TraceWriter<W> {
    /// Writes the preamble and `header`, its strings and lists cut as [`Header::bound`] says.
    /// Settings a reader would refuse ([`AllocatorConfig::check`](crate::engine::config::AllocatorConfig::check))
    /// are an error.
    pub fn new(mut out: W, header: &Header) -> Result<Self, TraceError> {
        header.config.check().map_err(|e| TraceError::Encode(format!("the header's allocator settings: {e}")))?;
        let mut header = header.clone();
        header.bound();
        let payload = bincode::encode_to_vec(&header, cfg()).map_err(|e| TraceError::Encode(e.to_string()))?;
        out.write_all(&MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        out.write_all(&0u16.to_le_bytes())?;
        let mut w = TraceWriter {
            out: Some(out),
            bg: None,
            unflushed: Unflushed::new(Arc::new(AtomicU64::new(0))),
            body: Vec::with_capacity(1 << 20),
            count: 0,
            chunk_frames: 0,
            delta: DeltaState::default(),
            trailer: Trailer::default(),
            frame: Vec::new(),
            compress: true,
            level: ZSTD_LEVEL,
            bytes_written: PREAMBLE_BYTES,
        };
        w.write_frame(KIND_HEADER, &payload)?;
        Ok(w)
    }

    /// Stores chunk bodies uncompressed (for tests and debugging).
    pub fn set_compression(&mut self, on: bool) {
        self.compress = on;
    }

    /// The zstd level of chunk bodies (default 3). A live recorder uses 1: about twice the
    /// speed for a slightly larger file. Readers do not care.
    pub fn set_compression_level(&mut self, level: i32) {
        self.level = level;
    }

    /// Counts events the caller could not hand over; the trailer says so.
    pub fn note_dropped(&mut self, events: u64) {
        self.trailer.dropped_events += events;
    }

    /// Appends one record.
    pub fn write(&mut self, record: &Record) -> Result<(), TraceError> {
        self.write_owned(record.clone())
    }

    /// Appends one record the caller no longer needs (no copy is made). A mark's text and a
    /// call site's frames are cut to what a reader accepts ([`Event::bound`]).
    #[inline]
    pub fn write_owned(&mut self, mut r: Record) -> Result<(), TraceError> {
        if let Some(hot) = HotEvent::of(&r.event) {
            return self.write_hot(r.time_ns, hot);
        }
        r.event.bound();
        if let Event::CallSite { frames, .. } = &r.event {
            // A call site that would pass the chunk's frame budget starts a new chunk.
            if self.chunk_frames + frames.len() as u64 > MAX_CHUNK_FRAMES {
                self.write_chunk()?;
            }
            self.chunk_frames += frames.len() as u64;
        }
        self.delta.apply::<true>(&mut r);
        encode::record(&mut self.body, &r);
        self.end_record()
    }

    /// Appends an event of the five kinds that make up almost every trace, from its fields:
    /// the delta transform and the encoding in one pass, with no [`Record`] built or dropped
    /// (a live recorder writes tens of millions a second).
    #[inline]
    pub fn write_hot(&mut self, time_ns: u64, event: HotEvent) -> Result<(), TraceError> {
        let (d, out) = (&mut self.delta, &mut self.body);
        // `stored(prev, v)`: the delta transform of one field, as `DeltaState::apply` does it.
        let stored = |prev: &mut u64, v: u64| {
            let mut v = v;
            enc(prev, &mut v);
            v
        };
        let t = stored(&mut d.time, time_ns);
        encode::u64v(out, t);
        match event {
            HotEvent::Alloc { id, addr, requested_bytes, block_bytes, stream, pool, callsite } => {
                let fields = [
                    0,
                    stored(&mut d.id, id),
                    stored(&mut d.addr, addr),
                    requested_bytes,
                    stored(&mut { requested_bytes }, block_bytes),
                    stored(&mut d.stream, stream),
                    pool as u64,
                    u64::from(callsite),
                ];
                fields.into_iter().for_each(|v| encode::u64v(out, v));
            }
            HotEvent::FreeRequested { id, addr, callsite } => {
                let fields = [1, stored(&mut d.id, id), stored(&mut d.addr, addr), u64::from(callsite)];
                fields.into_iter().for_each(|v| encode::u64v(out, v));
            }
            HotEvent::FreeCompleted { id, addr } => {
                let fields = [2, stored(&mut d.id, id), stored(&mut d.addr, addr)];
                fields.into_iter().for_each(|v| encode::u64v(out, v));
            }
            HotEvent::Split { addr, bytes, remainder_bytes } => {
                let fields = [7, stored(&mut d.addr, addr), bytes, remainder_bytes];
                fields.into_iter().for_each(|v| encode::u64v(out, v));
            }
            HotEvent::Merge { addr, absorbed_addr, bytes } => {
                let a = stored(&mut d.addr, addr);
                let fields = [8, a, stored(&mut { addr }, absorbed_addr), bytes];
                fields.into_iter().for_each(|v| encode::u64v(out, v));
            }
        }
        self.end_record()
    }

    #[inline]
    fn end_record(&mut self) -> Result<(), TraceError> {
        self.count += 1;
        if self.count as usize >= CHUNK_EVENTS || self.body.len() as u64 >= WRITER_CHUNK_BYTES {
            self.write_chunk()?;
        }
        Ok(())
    }

    /// Writes the pending events as a chunk and flushes the underlying writer.
    pub fn flush(&mut self) -> Result<(), TraceError> {
        self.write_chunk()?;
        if let Some(bg) = &mut self.bg {
            return bg.flush();
        }
        self.flush_inline()
    }

    /// Flushes the output (without a compression thread); on failure the events that may not
    /// have reached it count as lost.
    fn flush_inline(&mut self) -> Result<(), TraceError> {
        if let Some(out) = &mut self.out {
            if let Err(e) = out.flush() {
                self.unflushed.failed();
                return Err(e.into());
            }
            self.unflushed.flushed();
        }
        Ok(())
    }

    /// Bytes written so far (complete frames only).
    pub fn bytes_written(&self) -> u64 {
        self.bg.as_ref().map_or(self.bytes_written, |bg| bg.bytes_written())
    }

    /// Events written with `Ok` whose chunk did not reach the output (a write error: the
    /// chunks since the last successful flush and any after it).
    pub fn events_lost(&self) -> u64 {
        self.unflushed.lost.load(Ordering::Relaxed)
    }

    /// The counter behind [`TraceWriter::events_lost`], readable after [`TraceWriter::finish`]
    /// (which may lose the last chunks).
    pub fn lost_counter(&self) -> Arc<AtomicU64> {
        self.unflushed.lost.clone()
    }

    /// Writes the last chunk and the trailer, flushes, and returns the underlying writer.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.write_chunk()?;
        let payload = bincode::encode_to_vec(&self.trailer, cfg()).map_err(|e| TraceError::Encode(e.to_string()))?;
        if let Some(mut bg) = self.bg.take() {
            bg.frame(KIND_TRAILER, payload);
            return bg.finish();
        }
        if let Err(e) = self.write_frame(KIND_TRAILER, &payload) {
            self.unflushed.failed();
            return Err(e);
        }
        self.flush_inline()?;
        Ok(self.out.take().expect("the output is here without a compression thread"))
    }

    fn write_chunk(&mut self) -> Result<(), TraceError> {
        if self.count == 0 {
            return Ok(());
        }
        if let Some(bg) = &mut self.bg {
            let next = bg.chunk(self.count, std::mem::take(&mut self.body))?;
            self.body = next;
        } else {
            self.unflushed.wrote(self.count);
            let written = chunk_payload(self.count, &self.body, self.compress, self.level)
                .and_then(|payload| self.write_frame(KIND_CHUNK, &payload));
            if let Err(e) = written {
                self.unflushed.failed();
                return Err(e);
            }
            self.body.clear();
        }
        self.trailer.events += self.count;
        self.trailer.chunks += 1;
        self.count = 0;
        self.chunk_frames = 0;
        self.delta = DeltaState::default();
        Ok(())
    }

    fn write_frame(&mut self, kind: u8, payload: &[u8]) -> Result<(), TraceError> {
        let out = self.out.as_mut().expect("frames are written here only without a compression thread");
        self.bytes_written += frame_bytes(out, &mut self.frame, kind, payload)?;
        Ok(())
    }
}

impl<W: Write + Send + 'static> TraceWriter<W> {
    /// From now on chunks are compressed and written by a thread of their own, so that this
    /// writer spends its time encoding (a live recorder must keep up with the program). Frames
    /// still go out in order; [`TraceWriter::flush`] waits for them; a write error shows at the
    /// next chunk, flush or finish, and [`TraceWriter::events_lost`] counts what it cost.
    /// When the thread cannot start, nothing changes and the error says why.
    pub fn compress_in_background(&mut self) -> Result<(), TraceError> {
        if let Some(out) = self.out.take() {
            match background::Compressor::start(
                out,
                self.bytes_written,
                self.compress,
                self.level,
                self.unflushed.lost.clone(),
            ) {
                Ok(bg) => self.bg = Some(bg),
                Err((out, e)) => {
                    self.out = Some(out);
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// Events of chunks written since the last successful flush, which a write error may have kept
/// out of the file, and the counter they go to when it does.
pub(crate) struct Unflushed {
    events: u64,
    pub lost: Arc<AtomicU64>,
}

impl Unflushed {
    pub fn new(lost: Arc<AtomicU64>) -> Self {
        Unflushed { events: 0, lost }
    }

    pub fn wrote(&mut self, events: u64) {
        self.events += events;
    }

    /// A flush succeeded: everything written is in the file.
    pub fn flushed(&mut self) {
        self.events = 0;
    }

    /// Writing failed: nothing since the last flush is known to be in the file.
    pub fn failed(&mut self) {
        let events = std::mem::take(&mut self.events);
        self.lose(events);
    }

    /// Events that never went out.
    pub fn lose(&self, events: u64) {
        self.lost.fetch_add(events, Ordering::Relaxed);
    }
}

/// A chunk frame's payload: codec, count, raw length, body (zstd-compressed unless `compress`
/// is off).
fn chunk_payload(count: u64, body: &[u8], compress: bool, level: i32) -> Result<Vec<u8>, TraceError> {
    // What the reader would refuse is never written (the bounds above keep it from happening).
    if count > CHUNK_EVENTS as u64 || body.len() as u64 > MAX_CHUNK_RAW_BYTES {
        return Err(TraceError::Encode(format!(
            "a chunk of {count} events in {} bytes passes the reader's limits ({CHUNK_EVENTS} events, {MAX_CHUNK_RAW_BYTES} bytes)",
            body.len()
        )));
    }
    let mut payload = Vec::with_capacity(body.len() / 3 + 16);
    let compressed = if compress { Some(zstd::bulk::compress(body, level)?) } else { None };
    payload.push(if compressed.is_some() { CODEC_ZSTD } else { CODEC_RAW });
    push_varint(&mut payload, count);
    push_varint(&mut payload, body.len() as u64);
    payload.extend_from_slice(compressed.as_deref().unwrap_or(body));
    Ok(payload)
}

/// Writes one frame (length, kind, CRC, payload) using `frame` as scratch; returns its size.
fn frame_bytes<W: Write>(out: &mut W, frame: &mut Vec<u8>, kind: u8, payload: &[u8]) -> Result<u64, TraceError> {
    if payload.len() as u64 > MAX_FRAME_BYTES as u64 {
        return Err(TraceError::Encode(format!(
            "a frame of {} bytes passes the reader's limit of {MAX_FRAME_BYTES}",
            payload.len()
        )));
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&[kind]);
    h.update(payload);
    frame.clear();
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.push(kind);
    frame.extend_from_slice(&h.finalize().to_le_bytes());
    out.write_all(frame)?;
    out.write_all(payload)?;
    Ok(FRAME_HEAD_BYTES + payload.len() as u64)
}

fn push_varint(out: &mut Vec<u8>, v: u64) {
    // The same varint bincode uses, so the whole format has one integer encoding.
    bincode::encode_into_std_write(v, out, config::standard()).expect("writing to a Vec cannot fail");
}

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

/// How a read ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TraceEnd {
    /// Not read to the end yet.
    Reading,
    /// The trailer was read and agrees with what was read.
    Complete { trailer: Trailer },
    /// The trace stops early (no trailer): a killed process or a cut file.
    Truncated { offset: u64, reason: String },
    /// A frame failed its check; nothing after `offset` was read.
    Corrupt { offset: u64, reason: String },
}

impl TraceEnd {
    /// True when the trace was damaged (truncated or corrupt).
    pub fn is_partial(&self) -> bool {
        matches!(self, TraceEnd::Truncated { .. } | TraceEnd::Corrupt { .. })
    }
    pub fn describe(&self) -> String {
        match self {
            TraceEnd::Reading => "not fully read".into(),
            TraceEnd::Complete { .. } => "complete".into(),
            TraceEnd::Truncated { offset, reason } => format!("truncated at byte {offset}: {reason}"),
            TraceEnd::Corrupt { offset, reason } => format!("corrupt at byte {offset}: {reason}"),
        }
    }
}

/// Reads a trace chunk by chunk. Memory is bounded by one chunk, whatever the trace's size.
///
/// Iterating yields records until the trailer or the first damage; [`TraceReader::end`] then
/// says which. Errors in the preamble or header are returned by [`TraceReader::new`].
pub struct TraceReader<R: Read> {
    input: R,
    header: Header,
    version: u16,
    offset: u64,
    end: TraceEnd,
    events_read: u64,
    chunks_read: u64,
    payload: Vec<u8>,
    decoder: ChunkDecoder,
    /// Decoded records of the current chunk, in reverse order (popped from the back).
    pending: Vec<Record>,
}

impl TraceReader<BufReader<File>> {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let f = File::open(path)?;
        TraceReader::new(BufReader::with_capacity(1 << 20, f))
    }
}

enum FrameRead {
    Frame(u8, u64),
    Eof,
}

impl<R: Read> TraceReader<R> {
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut pre = [0u8; PREAMBLE_BYTES as usize];
        let n = read_full(&mut input, &mut pre)?;
        if n < 8 || pre[..8] != MAGIC {
            return Err(TraceError::NotATrace { found: pre[..n.min(8)].to_vec() });
        }
        if n < pre.len() {
            return Err(TraceError::Truncated { offset: n as u64, reason: "the preamble is incomplete".into() });
        }
        let version = u16::from_le_bytes([pre[8], pre[9]]);
        if version > FORMAT_VERSION {
            return Err(TraceError::NewerVersion { found: version, supported: FORMAT_VERSION });
        }
        if version == 0 {
            return Err(TraceError::Corrupt {
                offset: 8,
                reason: "format version 0 does not exist (versions start at 1)".into(),
            });
        }
        let flags = u16::from_le_bytes([pre[10], pre[11]]);
        if flags != 0 {
            return Err(TraceError::Corrupt {
                offset: 10,
                reason: format!("unknown flags 0x{flags:04x} (no flag is defined; the field is 0)"),
            });
        }
        let mut r = TraceReader {
            input,
            header: Header::new(Source::Recorded),
            version,
            offset: PREAMBLE_BYTES,
            end: TraceEnd::Reading,
            events_read: 0,
            chunks_read: 0,
            payload: Vec::new(),
            decoder: ChunkDecoder::default(),
            pending: Vec::new(),
        };
        match r.read_frame()? {
            FrameRead::Frame(KIND_HEADER, at) => r.header = decode_header(&r.payload, at)?,
            FrameRead::Frame(k, at) => {
                return Err(TraceError::Corrupt {
                    offset: at,
                    reason: format!("expected the header frame, found frame kind {k}"),
                })
            }
            FrameRead::Eof => {
                return Err(TraceError::Truncated { offset: r.offset, reason: "the header frame is missing".into() })
            }
        }
        Ok(r)
    }

    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The format version of the file (at most [`FORMAT_VERSION`]).
    pub fn version(&self) -> u16 {
        self.version
    }
    /// How the read ended; [`TraceEnd::Reading`] until the iterator returned `None`.
    pub fn end(&self) -> &TraceEnd {
        &self.end
    }
    /// Records yielded so far.
    pub fn events_read(&self) -> u64 {
        self.events_read
    }
    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads one frame into `self.payload`; returns its kind and start offset.
    fn read_frame(&mut self) -> Result<FrameRead, TraceError> {
        let at = self.offset;
        let mut head = [0u8; FRAME_HEAD_BYTES as usize];
        let n = read_full(&mut self.input, &mut head)?;
        if n == 0 {
            return Ok(FrameRead::Eof);
        }
        if n < head.len() {
            return Err(TraceError::Truncated { offset: at, reason: format!("frame head cut after {n} of 9 bytes") });
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let kind = head[4];
        let crc = u32::from_le_bytes([head[5], head[6], head[7], head[8]]);
        if !(KIND_HEADER..=KIND_TRAILER).contains(&kind) {
            return Err(TraceError::Corrupt { offset: at, reason: format!("unknown frame kind {kind}") });
        }
        if len > MAX_FRAME_BYTES {
            return Err(TraceError::Corrupt {
                offset: at,
                reason: format!("frame length {len} exceeds the limit {MAX_FRAME_BYTES}"),
            });
        }
        self.payload.clear();
        let got = (&mut self.input).take(len as u64).read_to_end(&mut self.payload)?;
        if got < len as usize {
            return Err(TraceError::Truncated {
                offset: at,
                reason: format!("frame of {len} bytes cut after {got} bytes"),
            });
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&[kind]);
        h.update(&self.payload);
        if h.finalize() != crc {
            return Err(TraceError::Corrupt { offset: at, reason: "frame checksum mismatch".into() });
        }
        self.offset += FRAME_HEAD_BYTES + len as u64;
        Ok(FrameRead::Frame(kind, at))
    }

    /// Decodes the next chunk into `out` (cleared first). Returns false at the end of the trace
    /// or at the first damage; see [`TraceReader::end`].
    pub fn next_chunk(&mut self, out: &mut Vec<Record>) -> bool {
        out.clear();
        loop {
            let Some(raw) = self.next_raw_chunk() else { return false };
            if let Err(e) = self.decoder.decode(&raw, out) {
                out.clear();
                self.fail(e);
                return false;
            }
            if !out.is_empty() {
                return true;
            }
        }
    }

    /// Records `e` as the end of the read.
    pub fn fail(&mut self, e: TraceError) {
        self.end = end_of(e, self.offset);
    }

    /// Reads the next chunk frame, checksummed but not decoded, so that chunks can be decoded
    /// on other threads ([`ChunkDecoder`]). Returns `None` at the trailer or at the first damage
    /// of the framing; see [`TraceReader::end`]. (A chunk that later fails to decode is damage
    /// too: the caller stops there.)
    pub fn next_raw_chunk(&mut self) -> Option<RawChunk> {
        if self.end != TraceEnd::Reading {
            return None;
        }
        match self.next_raw_inner() {
            Ok(c) => c,
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    fn next_raw_inner(&mut self) -> Result<Option<RawChunk>, TraceError> {
        loop {
            let (kind, at) = match self.read_frame()? {
                FrameRead::Eof => {
                    return Err(TraceError::Truncated {
                        offset: self.offset,
                        reason: "no trailer: the writer did not finish (killed process?)".into(),
                    })
                }
                FrameRead::Frame(k, at) => (k, at),
            };
            match kind {
                KIND_CHUNK => {
                    let (count, _) = chunk_head(at, &self.payload)?;
                    self.chunks_read += 1;
                    self.events_read += count;
                    if count == 0 {
                        continue;
                    }
                    return Ok(Some(RawChunk { offset: at, count, payload: std::mem::take(&mut self.payload) }));
                }
                KIND_TRAILER => {
                    let t = decode_trailer(&self.payload, at)?;
                    if t.events != self.events_read || t.chunks != self.chunks_read {
                        return Err(TraceError::Corrupt {
                            offset: at,
                            reason: format!(
                                "trailer counts {} events in {} chunks, but {} in {} were read",
                                t.events, t.chunks, self.events_read, self.chunks_read
                            ),
                        });
                    }
                    let mut next = [0u8; 1];
                    if read_full(&mut self.input, &mut next)? > 0 {
                        return Err(TraceError::Corrupt {
                            offset: self.offset,
                            reason: "data after the trailer (a trace ends with its trailer; were files concatenated?)"
                                .into(),
                        });
                    }
                    self.end = TraceEnd::Complete { trailer: t };
                    return Ok(None);
                }
                _ => return Err(TraceError::Corrupt { offset: at, reason: "a second header frame".into() }),
            }
        }
    }

    /// Reads the remaining records into a vector (tests and small traces).
    pub fn read_all(&mut self) -> Vec<Record> {
        let mut all = Vec::new();
        let mut chunk = Vec::new();
        while self.next_chunk(&mut chunk) {
            all.append(&mut chunk);
        }
        all
    }
}

/// The end state for a read that stopped with `e` at `offset`.
pub fn end_of(e: TraceError, offset: u64) -> TraceEnd {
    match e {
        TraceError::Truncated { offset, reason } => TraceEnd::Truncated { offset, reason },
        TraceError::Corrupt { offset, reason } => TraceEnd::Corrupt { offset, reason },
        other => TraceEnd::Truncated { offset, reason: other.to_string() },
    }
}

/// A chunk frame, checksummed, not yet decoded.
#[derive(Debug)]
pub struct RawChunk {
    /// Byte offset of the frame in the file.
    pub offset: u64,
    /// Events in the chunk, as its head says.
    pub count: u64,
    payload: Vec<u8>,
}

/// Parses a chunk's head: (event count, bytes of the count after the codec byte).
fn chunk_head(at: u64, p: &[u8]) -> Result<(u64, usize), TraceError> {
    if p.is_empty() {
        return Err(TraceError::Corrupt { offset: at, reason: "empty chunk".into() });
    }
    let (count, n) = varint(&p[1..], at + FRAME_HEAD_BYTES + 1, "the chunk's event count")?;
    if count > CHUNK_EVENTS as u64 {
        return Err(TraceError::Corrupt {
            offset: at,
            reason: format!("chunk claims {count} events; a writer puts at most {CHUNK_EVENTS} in a chunk"),
        });
    }
    Ok((count, n))
}

/// A bincode varint at the start of `p` and its length; `offset` is where `p` starts in the file.
fn varint(p: &[u8], offset: u64, what: &str) -> Result<(u64, usize), TraceError> {
    let corrupt = |reason: String| TraceError::Corrupt { offset, reason };
    let width = match p.first() {
        None => return Err(corrupt(format!("{what} is missing"))),
        Some(&b) if b <= 250 => return Ok((b as u64, 1)),
        Some(251) => 2,
        Some(252) => 4,
        Some(253) => 8,
        Some(&b) => return Err(corrupt(format!("{what} starts with byte {b}, which no integer starts with"))),
    };
    let bytes = p.get(1..1 + width).ok_or_else(|| corrupt(format!("{what} is cut short")))?;
    let mut v = [0u8; 8];
    v[..width].copy_from_slice(bytes);
    Ok((u64::from_le_bytes(v), 1 + width))
}

/// What went wrong in a bincode decode, in words (bincode's own messages name its internals).
fn decode_problem(e: &bincode::error::DecodeError) -> String {
    use bincode::error::DecodeError as D;
    match e {
        D::UnexpectedEnd { .. } => "is cut short (the frame ends inside it)".into(),
        D::LimitExceeded => "is longer than the 64 MiB limit".into(),
        D::InvalidIntegerType { .. } => "is not a valid integer".into(),
        D::UnexpectedVariant { found, .. } => format!("has unknown value {found}"),
        D::Utf8 { .. } => "is not valid UTF-8".into(),
        D::InvalidBooleanValue(b) => format!("is {b}, not a boolean (0 or 1)"),
        D::OutsideUsizeRange(n) => format!("claims a length of {n}"),
        D::ArrayLengthMismatch { required, found } => format!("holds {found} items, {required} expected"),
        _ => "does not decode".into(),
    }
}

/// Decodes the fields of a frame's payload one by one, so that an error names the field and its
/// byte offset in the file. `$at` is the frame's offset. Fields after `;` were appended in a
/// later version: a payload that ends before them gives their defaults. Gives the value and
/// each decoded field's name and byte offset in the file.
macro_rules! decode_fields {
    ($payload:expr, $at:expr, $what:literal, $ty:ident { $($field:ident),* $(,)? }) => {
        decode_fields!($payload, $at, $what, $ty { $($field),* ; })
    };
    ($payload:expr, $at:expr, $what:literal, $ty:ident { $($field:ident),* ; $($later:ident),* $(,)? }) => {{
        let payload: &[u8] = $payload;
        let start = $at + FRAME_HEAD_BYTES;
        let mut pos = 0usize;
        let mut offsets: Vec<(&'static str, u64)> = Vec::new();
        let value = $ty {
            $($field: {
                offsets.push((stringify!($field), start + pos as u64));
                let (v, n) = bincode::decode_from_slice(&payload[pos..], cfg()).map_err(|e| TraceError::Corrupt {
                    offset: start + pos as u64,
                    reason: format!(concat!($what, " field `", stringify!($field), "` {}"), decode_problem(&e)),
                })?;
                pos += n;
                v
            },)*
            $($later: if pos == payload.len() {
                Default::default()
            } else {
                offsets.push((stringify!($later), start + pos as u64));
                let (v, n) = bincode::decode_from_slice(&payload[pos..], cfg()).map_err(|e| TraceError::Corrupt {
                    offset: start + pos as u64,
                    reason: format!(concat!($what, " field `", stringify!($later), "` {}"), decode_problem(&e)),
                })?;
                pos += n;
                v
            },)*
        };
        if pos != payload.len() {
            return Err(TraceError::Corrupt {
                offset: start + pos as u64,
                reason: format!(concat!("{} bytes after the ", $what, "'s last field"), payload.len() - pos),
            });
        }
        (value, offsets)
    }};
}

/// The header frame's payload; its allocator settings are checked as a command line's are.
fn decode_header(payload: &[u8], at: u64) -> Result<Header, TraceError> {
    let (h, offsets) = decode_fields!(
        payload,
        at,
        "header",
        Header {
            tool_version,
            source,
            device_name,
            device_total_bytes,
            alloc_conf,
            config,
            capacity_bytes,
            clock_origin_unix_ns,
            pid,
            command_line,
            notes;
            placement,
            torch_version,
        }
    );
    check_header_bounds(&h, &offsets)?;
    if let Err(e) = h.config.check() {
        return Err(TraceError::Corrupt {
            offset: at,
            reason: format!("header field `config` holds allocator settings that are refused: {e}"),
        });
    }
    Ok(h)
}

/// A header holds what a writer stores ([`Header::bound`]): texts of at most [`MAX_TEXT_BYTES`]
/// and lists of at most [`MAX_HEADER_ITEMS`]. Anything longer was not written by alloctrace, and
/// is refused at the field's offset before an analysis carries it into every output.
fn check_header_bounds(h: &Header, offsets: &[(&'static str, u64)]) -> Result<(), TraceError> {
    let at = |name: &str| offsets.iter().find(|f| f.0 == name).map_or(0, |f| f.1);
    let refuse = |name: &str, reason: String| TraceError::Corrupt {
        offset: at(name),
        reason: format!("header field `{name}` {reason}, more than a writer stores"),
    };
    for (name, text) in
        [("tool_version", &h.tool_version), ("device_name", &h.device_name), ("alloc_conf", &h.alloc_conf)]
    {
        if text.len() > MAX_TEXT_BYTES {
            return Err(refuse(name, format!("holds {} bytes (at most {MAX_TEXT_BYTES})", text.len())));
        }
    }
    for (name, list) in [("command_line", &h.command_line), ("notes", &h.notes)] {
        if list.len() > MAX_HEADER_ITEMS {
            return Err(refuse(name, format!("holds {} items (at most {MAX_HEADER_ITEMS})", list.len())));
        }
        if let Some((i, s)) = list.iter().enumerate().find(|(_, s)| s.len() > MAX_TEXT_BYTES) {
            return Err(refuse(name, format!("holds an item {i} of {} bytes (at most {MAX_TEXT_BYTES})", s.len())));
        }
    }
    Ok(())
}

fn decode_trailer(payload: &[u8], at: u64) -> Result<Trailer, TraceError> {
    Ok(decode_fields!(payload, at, "trailer", Trailer { events, chunks, dropped_events }).0)
}

/// Decodes chunks into records, keeping its buffers between chunks. One per thread.
#[derive(Default)]
pub struct ChunkDecoder {
    zstd: Option<zstd::bulk::Decompressor<'static>>,
    raw: Vec<u8>,
}

impl ChunkDecoder {
    /// Decodes `chunk`, appending its records to `out`.
    pub fn decode(&mut self, chunk: &RawChunk, out: &mut Vec<Record>) -> Result<(), TraceError> {
        self.decode_in_pieces(chunk, usize::MAX, out, &mut |_| ControlFlow::Continue(())).map(|_| ())
    }

    /// Decodes `chunk` `piece` records at a time, appending them to `buf` and calling `f` with
    /// `buf` after each piece; `buf` is cleared after each piece but the last, which it holds on
    /// return. Stops when `f` breaks, and says whether it did. Pieces before a record that does
    /// not decode have been handed to `f` when the error comes back: a reader that must not see
    /// part of a damaged chunk knows where the damage starts (the first read of the trace found
    /// it) and stops before it.
    pub fn decode_in_pieces(
        &mut self,
        chunk: &RawChunk,
        piece: usize,
        buf: &mut Vec<Record>,
        f: &mut dyn FnMut(&mut Vec<Record>) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, TraceError> {
        let at = chunk.offset;
        let corrupt = |reason: String| TraceError::Corrupt { offset: at, reason };
        let p = &chunk.payload;
        let (count, n1) = chunk_head(at, p)?;
        let codec = p[0];
        let (raw_len, n2) = varint(&p[1 + n1..], at + FRAME_HEAD_BYTES + 1 + n1 as u64, "the chunk's body length")?;
        if raw_len > MAX_CHUNK_RAW_BYTES {
            return Err(corrupt(format!(
                "chunk body of {raw_len} bytes exceeds the limit of {MAX_CHUNK_RAW_BYTES} (a writer ends a chunk at {WRITER_CHUNK_BYTES})"
            )));
        }
        // Every record takes at least two bytes, so a count above raw_len / 2 is a lie.
        if count > raw_len / 2 + 1 {
            return Err(corrupt(format!("chunk claims {count} events in {raw_len} bytes")));
        }
        let body = &p[1 + n1 + n2..];
        let raw: &[u8] = match codec {
            CODEC_RAW => body,
            CODEC_ZSTD => {
                if self.zstd.is_none() {
                    self.zstd = Some(zstd::bulk::Decompressor::new()?);
                }
                self.raw.clear();
                self.raw.reserve(raw_len as usize);
                let d = self.zstd.as_mut().expect("set above");
                let n = d
                    .decompress_to_buffer(body, &mut self.raw)
                    .map_err(|e| corrupt(format!("chunk does not decompress: {e}")))?;
                if n as u64 != raw_len {
                    return Err(corrupt(format!("chunk decompressed to {n} bytes, expected {raw_len}")));
                }
                &self.raw
            }
            c => return Err(corrupt(format!("unknown chunk codec {c}"))),
        };
        if raw.len() as u64 != raw_len {
            return Err(corrupt(format!("chunk body is {} bytes, expected {raw_len}", raw.len())));
        }
        let piece = piece.max(1);
        buf.reserve((count as usize).min(piece));
        let mut delta = DeltaState::default();
        let mut dec = decode::Decoder::new(raw);
        for i in 0..count {
            let at_byte = dec.pos;
            let mut r = dec.record().map_err(|e| {
                corrupt(format!("event {i} of the chunk (at byte {at_byte} of its body) does not decode: {e}"))
            })?;
            delta.apply::<false>(&mut r);
            buf.push(r);
            if buf.len() >= piece && i + 1 < count {
                let flow = f(buf);
                buf.clear();
                if flow.is_break() {
                    return Ok(flow);
                }
            }
        }
        if dec.pos != raw.len() {
            return Err(corrupt(format!("{} bytes left over after {count} events", raw.len() - dec.pos)));
        }
        Ok(f(buf))
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        if self.pending.is_empty() {
            let mut chunk = std::mem::take(&mut self.pending);
            if !self.next_chunk(&mut chunk) {
                return None;
            }
            chunk.reverse();
            self.pending = chunk;
        }
        self.pending.pop()
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
