//! The caching allocator engine: PyTorch's CUDA caching allocator policy (2.11, and the differences
//! of 2.9 to 2.13 that [`version`] lists), pure.
//!
//! [`Engine`] decides where every block goes: size rounding ([`round_size`]), the pool, best
//! fit per stream, splitting and merging, the OOM path (garbage collection, oversize release,
//! release everything and retry), and expandable segments. It gets memory from a [`Device`](crate::device::Device)
//! and reports every decision to a [`Sink`] as trace [`Event`]s. No I/O, no CUDA: the recorder
//! on a GPU and a what-if replay on a [`crate::device::SimDevice`] run this same code.
//!
//! Stream-ordered frees are driven by the caller: [`Engine::free_requested`] makes a block
//! unallocated but not reusable, [`Engine::free_completed`] returns it to the cache (PyTorch
//! polls CUDA events at the start of `malloc`; here the caller says when the work is done).

mod block;
pub mod config;
mod core;
mod freeset;
mod live;
mod release;
mod rounding;
mod stats;
pub mod version;
mod view;

pub use self::core::Engine;
pub use rounding::{allocation_size, page_size, pool_for, round_plain, round_size, roundup_power2_next_division};
pub use stats::{Stat, StatArray, Stats};
pub use view::{BlockView, Occupancy, SegmentView};

use crate::trace::{Event, Pool};

/// Where the engine's events go. A no-op sink costs nothing: calls are inlined away.
pub trait Sink {
    fn event(&mut self, event: Event);
}

/// Discards every event.
#[derive(Default, Debug, Clone, Copy)]
pub struct NullSink;

impl Sink for NullSink {
    #[inline(always)]
    fn event(&mut self, event: Event) {
        // Dropping an `Event` is an out-of-line call (17 instructions) even for the variants
        // that own nothing; inlined, the variant is known and this folds away. Exhaustive, so
        // that a new variant must say whether it owns heap memory.
        let owns_heap = match &event {
            Event::Mark { .. } | Event::CallSite { .. } => true,
            Event::Alloc { .. }
            | Event::FreeRequested { .. }
            | Event::FreeCompleted { .. }
            | Event::SegmentAlloc { .. }
            | Event::SegmentFree { .. }
            | Event::SegmentMap { .. }
            | Event::SegmentUnmap { .. }
            | Event::Split { .. }
            | Event::Merge { .. }
            | Event::CacheRelease { .. }
            | Event::Oom { .. }
            | Event::Snapshot { .. }
            | Event::DeviceMemInfo { .. }
            | Event::Dropped { .. }
            | Event::SegmentPool { .. } => false,
        };
        if owns_heap {
            drop(event);
        } else {
            std::mem::forget(event);
        }
    }
}

impl Sink for Vec<Event> {
    #[inline]
    fn event(&mut self, event: Event) {
        self.push(event);
    }
}

/// A successful `malloc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The `id` of the [`Event::Alloc`], sequential from 1.
    pub id: u64,
    pub addr: u64,
    /// The block handed out: the rounded size, or more when the remainder was not split off.
    pub block_bytes: u64,
    pub pool: Pool,
}

/// A failed `malloc`, with the numbers PyTorch puts in its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "out of memory: tried to allocate {alloc_bytes} bytes (request {requested_bytes}, rounded {rounded_bytes}); \
     reserved {reserved_bytes}, allocated {allocated_bytes}, capacity {capacity_bytes:?}, device free {device_free_bytes:?}"
)]
pub struct OutOfMemory {
    pub requested_bytes: u64,
    pub rounded_bytes: u64,
    /// The segment size the allocator tried to obtain.
    pub alloc_bytes: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub capacity_bytes: Option<u64>,
    pub device_free_bytes: Option<u64>,
}

/// A free the engine refuses. The engine's state is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FreeError {
    #[error("free of {0:#x}, which is not the address of a live allocation")]
    UnknownAddress(u64),
    #[error("second free of {0:#x}")]
    DoubleFree(u64),
    #[error("free_completed of {0:#x}, which was not free_requested")]
    NotRequested(u64),
}

/// What a cache release gave back to the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub bytes: u64,
    /// Segments freed plus ranges unmapped.
    pub segments: u32,
}

/// A small deterministic generator (xorshift64) for the engine's randomized tests.
#[cfg(test)]
pub(crate) fn test_rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}
