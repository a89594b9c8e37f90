//! The records of a trace: one [`Record`] per allocator event, each with a timestamp.
//!
//! bincode numbers enum variants in declaration order, so **variants and fields are
//! append-only**: a new event kind goes at the end of [`Event`], and the golden-bytes test in
//! `trace::tests` fails if an existing encoding changes.

use bincode::{Decode, Encode};
use serde::Serialize;

/// Sentinel for "no call site recorded".
pub const NO_CALLSITE: u32 = 0;

/// Which of the allocator's two default pools a block or segment belongs to.
///
/// Requests of at most 1 MiB (after rounding) go to the small pool (2 MiB segments), larger
/// ones to the large pool.
#[derive(Encode, Decode, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Pool {
    Small,
    Large,
}

impl Pool {
    pub fn as_str(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
        }
    }
}

/// Why cached (free, reserved) memory was given back to the device.
#[derive(Encode, Decode, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseCause {
    /// `torch.cuda.empty_cache()` or the recorder's `empty_cache`: a request of the program.
    EmptyCache,
    /// The last resort of a failing allocation: release every cached segment, then retry.
    OomRetry,
    /// `garbage_collection_threshold`: old, whole free segments released on a miss.
    GarbageCollection,
    /// `max_split_size_mb`: oversize free blocks released on a failing allocation.
    Oversize,
}

impl ReleaseCause {
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseCause::EmptyCache => "empty_cache",
            ReleaseCause::OomRetry => "oom_retry",
            ReleaseCause::GarbageCollection => "garbage_collection",
            ReleaseCause::Oversize => "oversize",
        }
    }
}

/// What a [`Event::Mark`] labels.
#[derive(Encode, Decode, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum MarkKind {
    /// A phase of the program ("forward", "backward", "optimizer", ...).
    Phase,
    /// The start of a training or inference iteration.
    Iteration,
    /// Free text, e.g. a PyTorch `record_function` range (`external_annotations`).
    Annotation,
}

impl MarkKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MarkKind::Phase => "phase",
            MarkKind::Iteration => "iteration",
            MarkKind::Annotation => "annotation",
        }
    }
}

/// One stack frame of a call site.
#[derive(Encode, Decode, Serialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub file: String,
    pub line: u32,
    pub function: String,
}

/// One timestamped event.
#[derive(Encode, Decode, Serialize, Clone, Debug, PartialEq)]
pub struct Record {
    /// Nanoseconds since the header's clock origin.
    pub time_ns: u64,
    pub event: Event,
}

/// Every event an allocator trace can hold. Sizes are bytes; addresses are device virtual
/// addresses; `stream` is the CUDA stream handle as an integer (0 = the legacy default stream).
///
/// Append-only: see the module documentation.
#[derive(Encode, Decode, Serialize, Clone, Debug, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A program asked for memory and got the block at `addr`.
    Alloc {
        /// Unique per trace, assigned in order of allocation from 1.
        id: u64,
        addr: u64,
        /// The bytes the program asked for.
        requested_bytes: u64,
        /// The block the allocator handed out (rounded, maybe with unsplit slack); 0 = unknown.
        block_bytes: u64,
        stream: u64,
        pool: Pool,
        /// An id defined by an earlier [`Event::CallSite`], or [`NO_CALLSITE`].
        callsite: u32,
    },
    /// The program released the block (`free`). It may stay unusable until its stream work
    /// completes ([`Event::FreeCompleted`]).
    FreeRequested { id: u64, addr: u64, callsite: u32 },
    /// The block is back in the cache and may be reused.
    FreeCompleted { id: u64, addr: u64 },
    /// A segment was allocated from the device (`cudaMalloc`).
    SegmentAlloc { addr: u64, bytes: u64, stream: u64, pool: Pool },
    /// A segment was returned to the device (`cudaFree`).
    SegmentFree { addr: u64, bytes: u64, stream: u64, pool: Pool },
    /// Expandable segments: physical pages mapped at `addr`.
    SegmentMap { addr: u64, bytes: u64, stream: u64, pool: Pool },
    /// Expandable segments: physical pages unmapped at `addr`.
    SegmentUnmap { addr: u64, bytes: u64, stream: u64, pool: Pool },
    /// The free block `[addr, addr + bytes + remainder_bytes)` was split: `[addr, addr + bytes)`
    /// is handed out, `[addr + bytes, ...)` of `remainder_bytes` stays free.
    Split { addr: u64, bytes: u64, remainder_bytes: u64 },
    /// Two adjacent free blocks became one: the block at `addr` absorbed its neighbour at
    /// `absorbed_addr`; `bytes` is the size of the merged block.
    Merge { addr: u64, absorbed_addr: u64, bytes: u64 },
    /// Cached memory was given back to the device. Written after the segment frees and unmaps
    /// it caused, with their total.
    CacheRelease { cause: ReleaseCause, bytes: u64, segments: u32 },
    /// An allocation failed for good.
    Oom {
        /// The bytes the program asked for (rounded when the source only knows that).
        requested_bytes: u64,
        /// The segment size the allocator tried to obtain.
        alloc_bytes: u64,
        /// Free device memory per the driver at that moment; 0 = unknown.
        device_free_bytes: u64,
        reserved_bytes: u64,
        allocated_bytes: u64,
        /// The capacity limit in force; 0 = none.
        limit_bytes: u64,
        stream: u64,
    },
    /// A label from the program: phase, iteration or annotation.
    Mark { kind: MarkKind, text: String },
    /// Defines call site `id` (innermost frame first). Written once, before its first use.
    CallSite { id: u32, frames: Vec<Frame> },
    /// A PyTorch `snapshot` entry: total active bytes at that moment.
    Snapshot { active_bytes: u64 },
    /// The driver's view of device memory (`cuMemGetInfo`): what the whole process and other
    /// processes hold is `total - free`.
    DeviceMemInfo { free_bytes: u64, total_bytes: u64 },
    /// The recorder could not write `events` events (full disk, unwritable path, full buffer).
    Dropped { events: u64 },
    /// The segment just allocated or mapped at `addr` (the event before this one) belongs to a
    /// private memory pool, not to the default pool its `pool` field names: a CUDA graph's pool
    /// or a `torch.cuda.MemPool`. `pool_id` is PyTorch's `MempoolId_t` (graph captures number
    /// the first half, `MemPool`s the second). Traces without private pools have none of these,
    /// and a trace written before this kind existed reads as before.
    SegmentPool { addr: u64, pool_id: [u64; 2] },
}

/// Names of the event kinds, in declaration order; `Event::kind_index` indexes it.
pub const EVENT_KIND_NAMES: [&str; NUM_EVENT_KINDS] = [
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "split",
    "merge",
    "cache_release",
    "oom",
    "mark",
    "callsite",
    "snapshot",
    "device_mem_info",
    "dropped",
    "segment_pool",
];

impl Event {
    /// Position of this kind in [`EVENT_KIND_NAMES`].
    pub fn kind_index(&self) -> usize {
        match self {
            Event::Alloc { .. } => 0,
            Event::FreeRequested { .. } => 1,
            Event::FreeCompleted { .. } => 2,
            Event::SegmentAlloc { .. } => 3,
            Event::SegmentFree { .. } => 4,
            Event::SegmentMap { .. } => 5,
            Event::SegmentUnmap { .. } => 6,
            Event::Split { .. } => 7,
            Event::Merge { .. } => 8,
            Event::CacheRelease { .. } => 9,
            Event::Oom { .. } => 10,
            Event::Mark { .. } => 11,
            Event::CallSite { .. } => 12,
            Event::Snapshot { .. } => 13,
            Event::DeviceMemInfo { .. } => 14,
            Event::Dropped { .. } => 15,
            Event::SegmentPool { .. } => 16,
        }
    }

    /// The kind's stable name, as `dump` and `--json` print it.
    pub fn kind_name(&self) -> &'static str {
        EVENT_KIND_NAMES[self.kind_index()]
    }
}

/// Number of distinct event kinds.
pub const NUM_EVENT_KINDS: usize = 17;

/// Longest string a writer stores in a record ([`Event::Mark`] text, a [`Frame`]'s file and
/// function) or in a header field. Longer ones are cut by [`bounded_text`].
pub const MAX_TEXT_BYTES: usize = 4096;
/// Most frames a writer stores in one [`Event::CallSite`]; a reader refuses more. Deeper stacks
/// keep their innermost frames and end with a marker frame saying how many were cut.
pub const MAX_CALLSITE_FRAMES: usize = 1024;

/// `s` itself when it fits in [`MAX_TEXT_BYTES`], else its start (cut at a character boundary)
/// followed by a marker with the original length, `MAX_TEXT_BYTES` in all.
pub fn bounded_text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.len() <= MAX_TEXT_BYTES {
        return std::borrow::Cow::Borrowed(s);
    }
    let marker = format!("...[truncated: {} bytes]", s.len());
    let mut cut = MAX_TEXT_BYTES - marker.len();
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    std::borrow::Cow::Owned(format!("{}{marker}", &s[..cut]))
}

/// Cuts `s` in place as [`bounded_text`] does; returns whether it was cut.
pub fn bound_text(s: &mut String) -> bool {
    match bounded_text(s) {
        std::borrow::Cow::Borrowed(_) => false,
        std::borrow::Cow::Owned(b) => {
            *s = b;
            true
        }
    }
}

/// The last frame of a call site cut to [`MAX_CALLSITE_FRAMES`]: how many frames it lost.
pub fn frames_cut_marker(dropped: usize) -> Frame {
    Frame { file: "...".into(), line: 0, function: format!("[truncated: {dropped} more frames]") }
}

/// Cuts `frames` to [`MAX_CALLSITE_FRAMES`] (the innermost kept, the last one a marker) and
/// every string in them to [`MAX_TEXT_BYTES`]; returns whether anything was cut.
pub fn bound_frames(frames: &mut Vec<Frame>) -> bool {
    let mut cut = false;
    if frames.len() > MAX_CALLSITE_FRAMES {
        let dropped = frames.len() - (MAX_CALLSITE_FRAMES - 1);
        frames.truncate(MAX_CALLSITE_FRAMES - 1);
        frames.push(frames_cut_marker(dropped));
        cut = true;
    }
    for f in frames.iter_mut() {
        cut |= bound_text(&mut f.file);
        cut |= bound_text(&mut f.function);
    }
    cut
}

impl Event {
    /// Cuts the strings and frames of a mark or call site to what a writer stores (see
    /// [`MAX_TEXT_BYTES`], [`MAX_CALLSITE_FRAMES`]); returns whether anything was cut.
    pub fn bound(&mut self) -> bool {
        match self {
            Event::Mark { text, .. } => bound_text(text),
            Event::CallSite { frames, .. } => bound_frames(frames),
            _ => false,
        }
    }
}
