//! Blocks in an arena, linked per segment, and the ordered sets that index the free ones.
//!
//! ```text
//! segment 0x1000, 20 MiB:   [A alloc 4 MiB] <-> [B free 6 MiB] <-> [C alloc 10 MiB]
//! free set (stream, size, addr, idx): {(0, 6 MiB, 0x1000 + 4 MiB, B)}
//! ```
//! Blocks refer to each other by arena index (`u32`, [`NIL`] = none); a freed slot is reused.

use super::freeset::FreeSet;
use crate::trace::Pool;
use std::collections::BTreeSet;

pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Mapped, not allocated, in the pool's free set.
    Free,
    /// Handed out to the program.
    Allocated,
    /// Freed by the program, waiting for its stream work (`free_completed`).
    Pending,
    /// An unmapped range of an expandable segment, in the pool's unmapped set.
    Unmapped,
    /// Taken out of the free set by the allocation under way (not yet allocated).
    Taken,
    /// An empty arena slot.
    Dead,
}

#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub stream: u64,
    pub id: u64,
    /// The pool's `get_free_blocks` call count when the block last entered the free set.
    pub gc_count_base: u64,
    pub prev: u32,
    pub next: u32,
    /// Index of the expandable segment, or [`NIL`] for a `cudaMalloc` segment.
    pub expandable: u32,
    pub pool: Pool,
    /// The pool the block's segment belongs to: 0 for the device's default pools, `k` for the
    /// engine's `k`-th private pool (a CUDA graph's, a `torch.cuda.MemPool`).
    pub owner: u32,
    pub state: State,
}

impl Block {
    pub fn new(addr: u64, size: u64, stream: u64, pool: Pool, owner: u32, state: State) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            id: 0,
            gc_count_base: 0,
            prev: NIL,
            next: NIL,
            expandable: NIL,
            pool,
            owner,
            state,
        }
    }

    /// Index of the [`PoolSets`] that hold this block when it is free or unmapped.
    #[inline]
    pub fn set(&self) -> usize {
        set_index(self.owner, self.pool)
    }

    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    #[inline]
    pub fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }

    #[inline]
    pub fn free_key(&self, idx: u32) -> FreeKey {
        (self.stream, self.size, self.addr, idx)
    }
}

/// Key of the free set: PyTorch's `BlockComparatorSize` (stream, size, address), plus the index.
pub(crate) type FreeKey = (u64, u64, u64, u32);
/// Key of the unmapped set: `BlockComparatorAddress` (stream, address), plus the index.
pub(crate) type UnmappedKey = (u64, u64, u32);

#[derive(Default, Debug, Clone)]
pub(crate) struct Arena {
    blocks: Vec<Block>,
    empty: Vec<u32>,
}

impl Arena {
    #[inline]
    pub fn insert(&mut self, block: Block) -> u32 {
        if let Some(idx) = self.empty.pop() {
            self.blocks[idx as usize] = block;
            idx
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as u32
        }
    }

    #[inline]
    pub fn remove(&mut self, idx: u32) {
        self.blocks[idx as usize].state = State::Dead;
        self.empty.push(idx);
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &Block)> {
        self.blocks.iter().enumerate().filter(|(_, b)| b.state != State::Dead).map(|(i, b)| (i as u32, b))
    }
}

impl std::ops::Index<u32> for Arena {
    type Output = Block;
    #[inline]
    fn index(&self, idx: u32) -> &Block {
        &self.blocks[idx as usize]
    }
}

impl std::ops::IndexMut<u32> for Arena {
    #[inline]
    fn index_mut(&mut self, idx: u32) -> &mut Block {
        &mut self.blocks[idx as usize]
    }
}

/// Index of the sets of `pool` in pool `owner`: the default pools' small and large sets come
/// first, then two per private pool.
#[inline]
pub(crate) fn set_index(owner: u32, pool: Pool) -> usize {
    owner as usize * 2
        + match pool {
            Pool::Small => 0,
            Pool::Large => 1,
        }
}

/// One pool's sets (small or large, of the default pools or of a private pool).
#[derive(Default, Debug, Clone)]
pub(crate) struct PoolSets {
    pub free: FreeSet,
    pub unmapped: BTreeSet<UnmappedKey>,
    /// `get_free_blocks_call_count`, counted only while garbage collection is on.
    pub gc_calls: u64,
}
