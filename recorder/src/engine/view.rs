//! The current layout, for fragmentation analysis and tests (like a snapshot's `segments`).

use super::block::{Block, State, NIL};
use super::core::Engine;
use super::Sink;
use crate::device::Device;
use crate::trace::Pool;
use serde::Serialize;

/// One block of a [`SegmentView`].
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockView {
    pub addr: u64,
    pub bytes: u64,
    /// Handed out and not yet freed by the program.
    pub allocated: bool,
    /// The program's request for an allocated or pending block; 0 for a free block.
    pub requested_bytes: u64,
    /// Freed by the program, waiting for `free_completed` (PyTorch `active_pending_free`).
    pub pending_free: bool,
    /// In a private pool's segment (CUDA graph, MemPool): free, it serves only that pool's
    /// requests, and `empty_cache()` gives its segment back only once the pool is unused (which
    /// a replay learns only at the release that frees it: until then the pool counts as used).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub in_private_pool: bool,
}

/// A segment: a `cudaMalloc` segment, or one contiguous mapped range of an expandable segment.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct SegmentView {
    pub addr: u64,
    pub bytes: u64,
    pub pool: Pool,
    /// PyTorch's id of the private pool the segment belongs to (a CUDA graph's, a MemPool's);
    /// `[0, 0]` for the default pools.
    pub pool_id: [u64; 2],
    pub stream: u64,
    pub is_expandable: bool,
    /// In address order, covering `[addr, addr + bytes)` exactly.
    pub blocks: Vec<BlockView>,
}

impl BlockView {
    /// The view of a mapped block (the one definition for [`Engine::segments`] and
    /// [`Engine::visit_blocks`]).
    #[inline]
    fn of(b: &Block) -> BlockView {
        let allocated = matches!(b.state, State::Allocated | State::Taken);
        let pending_free = b.state == State::Pending;
        BlockView {
            addr: b.addr,
            bytes: b.size,
            allocated,
            requested_bytes: if allocated || pending_free { b.requested } else { 0 },
            pending_free,
            in_private_pool: b.owner != 0,
        }
    }
}

impl SegmentView {
    /// The segment belongs to a private pool, which keeps it while the pool is in use.
    pub fn kept_by_private_pool(&self) -> bool {
        self.pool_id != [0, 0]
    }
}

impl<D: Device, S: Sink> Engine<D, S> {
    /// Every segment in address order with its blocks.
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for (idx, head) in self.blocks.iter() {
            if head.prev != NIL {
                continue;
            }
            let mut cur = idx;
            let mut seg: Option<SegmentView> = None;
            while cur != NIL {
                let b = &self.blocks[cur];
                if b.state == State::Unmapped {
                    out.extend(seg.take());
                } else {
                    let s = seg.get_or_insert_with(|| SegmentView {
                        addr: b.addr,
                        bytes: 0,
                        pool: b.pool,
                        pool_id: self.pool_id(b.owner),
                        stream: b.stream,
                        is_expandable: b.is_expandable(),
                        blocks: Vec::new(),
                    });
                    s.bytes += b.size;
                    s.blocks.push(BlockView::of(b));
                }
                cur = b.next;
            }
            out.extend(seg);
        }
        out.sort_by_key(|s| s.addr);
        out
    }
}

impl<D: Device, S: Sink> Engine<D, S> {
    /// The blocks of [`Engine::segments`] without building the segments (no allocation, not in
    /// address order): `f(starts_segment, block)` for every block, each segment's blocks in
    /// address order, `starts_segment` true for a segment's first block.
    pub fn visit_blocks(&self, mut f: impl FnMut(bool, &BlockView)) {
        for (idx, head) in self.blocks.iter() {
            if head.prev != NIL {
                continue;
            }
            let mut cur = idx;
            let mut starts = true;
            while cur != NIL {
                let b = &self.blocks[cur];
                if b.state == State::Unmapped {
                    starts = true;
                } else {
                    f(starts, &BlockView::of(b));
                    starts = false;
                }
                cur = b.next;
            }
        }
    }
}

/// The byte figures of the layout that the engine keeps up to date as it goes, so that they
/// cost constant time to read (a walk of the blocks, [`Engine::visit_blocks`], gives the same
/// figures in time linear in the blocks).
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    pub reserved_bytes: u64,
    /// Allocated blocks (rounded sizes).
    pub allocated_bytes: u64,
    /// What the program asked for, for the allocated blocks.
    pub requested_bytes: u64,
    /// Freed by the program, waiting for stream work.
    pub pending_free_bytes: u64,
    /// Free blocks inside segments.
    pub free_bytes: u64,
    /// The largest free block of the default pools: the biggest request outside a capture the
    /// cache could serve (a private pool's free blocks serve only that pool).
    pub largest_free_bytes: u64,
}

impl<D: Device, S: Sink> Engine<D, S> {
    /// The current [`Occupancy`], in constant time.
    pub fn occupancy(&self) -> Occupancy {
        let st = &self.stats;
        let reserved = st.reserved_bytes.all.current;
        let allocated = st.allocated_bytes.all.current;
        let active = st.active_bytes.all.current;
        Occupancy {
            reserved_bytes: reserved,
            allocated_bytes: allocated,
            requested_bytes: st.requested_bytes.all.current.saturating_sub(self.pending_requested),
            pending_free_bytes: active.saturating_sub(allocated),
            free_bytes: reserved.saturating_sub(active),
            largest_free_bytes: self.pools[..2].iter().map(|p| p.free.largest()).max().unwrap_or(0),
        }
    }
}
