//! Which requests of a recorded trace went to a private memory pool.
//!
//! A trace names a private pool only where a segment is made: [`Event::SegmentPool`] follows
//! the segment's `segment_alloc` (or `segment_map`). PyTorch hands out a private pool's blocks
//! only from that pool's segments, so a recorded allocation belongs to the pool of the segment
//! its address falls in. A replay asks [`RecordedPools::pool_of`] for each allocation and sends
//! the request to that pool ([`Engine::malloc_in`]) instead of the default pools: CUDA graph
//! captures (`torch.cuda.graph`, `torch.compile(mode="reduce-overhead")`) and
//! `torch.cuda.use_mem_pool` then replay as they ran.
//!
//! A private segment freed in the recording shows that nothing used its pool any more. PyTorch
//! frees such segments in two ways, and the run of segment frees around it tells which:
//! - a cache release (`empty_cache()`, the OOM path) frees the default pools' whole segments
//!   first, then those of every freeable private pool: a private segment freed after a default
//!   one in the same run is [`Observed::PoolFreeable`], and the replay marks the pool freeable
//!   ([`Engine::set_pool_freeable`]) for the cache release that ends the run;
//! - deleting a `torch.cuda.MemPool` empties that pool alone, at once: a private segment freed
//!   with no default segment before it in the run is [`Observed::PoolEmptied`], and the replay
//!   releases that pool there ([`Engine::release_pool`]).
//!
//! When a pool became unused (its graph deleted) before the release that freed its segments,
//! the trace does not say: a replay that releases the cache earlier keeps the pool's segments.
//!
//! [`Engine::malloc_in`]: crate::engine::Engine::malloc_in
//! [`Engine::set_pool_freeable`]: crate::engine::Engine::set_pool_freeable
//! [`Engine::release_pool`]: crate::engine::Engine::release_pool

use super::Event;
use crate::device::Device;
use crate::engine::{Allocation, Engine, OutOfMemory, Sink};
use std::collections::BTreeMap;

/// The private segments of the recording, live at the point the replay has read to.
#[derive(Clone, Debug, Default)]
pub struct RecordedPools {
    /// Start address -> (end address, pool id), private segments only.
    segments: BTreeMap<u64, (u64, [u64; 2])>,
    /// The last segment allocated or mapped (start, bytes): a `segment_pool` names its pool.
    last_segment: Option<(u64, u64)>,
    /// A default-pool segment was freed in the current run of segment frees.
    default_freed: bool,
}

/// What [`RecordedPools::observe`] learned from a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    Nothing,
    /// A segment of this private pool was given back by a cache release of the whole cache:
    /// nothing used the pool any more.
    PoolFreeable([u64; 2]),
    /// A segment of this private pool was given back by a release of that pool alone.
    PoolEmptied([u64; 2]),
}

impl RecordedPools {
    /// Follows the recording's segments; call it for every record, in order.
    #[inline]
    pub fn observe(&mut self, event: &Event) -> Observed {
        if !matches!(event, Event::SegmentFree { .. } | Event::SegmentUnmap { .. }) {
            self.default_freed = false;
        }
        match *event {
            Event::SegmentAlloc { addr, bytes, .. } | Event::SegmentMap { addr, bytes, .. } => {
                // Whatever the recording had at these addresses before is gone.
                if !self.segments.is_empty() {
                    self.forget(addr, addr.saturating_add(bytes));
                }
                self.last_segment = Some((addr, bytes));
            }
            Event::SegmentPool { addr, pool_id } => {
                if let Some((start, bytes)) = self.last_segment.take() {
                    if start == addr && pool_id != [0, 0] {
                        self.segments.insert(start, (start.saturating_add(bytes), pool_id));
                    }
                }
            }
            Event::SegmentFree { addr, .. } => match self.segments.remove(&addr) {
                Some((_, pool_id)) => return self.released(pool_id),
                None => self.default_freed = true,
            },
            // Pages of an expandable segment: the rest of the segment (and its address range,
            // which a later mapping of the same pool reuses) stays the pool's.
            Event::SegmentUnmap { addr, .. } => match self.pool_of(addr) {
                Some(pool_id) => return self.released(pool_id),
                None => self.default_freed = true,
            },
            _ => {}
        }
        Observed::Nothing
    }

    /// [`RecordedPools::observe`], and what it learned applied to the replaying engine.
    #[inline]
    pub fn follow<D: Device, S: Sink>(&mut self, event: &Event, engine: &mut Engine<D, S>) {
        match self.observe(event) {
            Observed::Nothing => {}
            Observed::PoolFreeable(pool_id) => engine.set_pool_freeable(pool_id),
            Observed::PoolEmptied(pool_id) => {
                engine.release_pool(pool_id);
            }
        }
    }

    /// Replays the recorded allocation at `addr`: in the pool it was served from.
    #[inline]
    pub fn malloc<D: Device, S: Sink>(
        &self,
        engine: &mut Engine<D, S>,
        addr: u64,
        requested_bytes: u64,
        stream: u64,
        callsite: u32,
    ) -> Result<Allocation, OutOfMemory> {
        match self.pool_of(addr) {
            Some(pool_id) => engine.malloc_in(pool_id, requested_bytes, stream, callsite),
            None => engine.malloc(requested_bytes, stream, callsite),
        }
    }

    fn released(&self, pool_id: [u64; 2]) -> Observed {
        if self.default_freed {
            Observed::PoolFreeable(pool_id)
        } else {
            Observed::PoolEmptied(pool_id)
        }
    }

    /// The private pool of a recorded allocation at `addr`; `None` for the default pools.
    #[inline]
    pub fn pool_of(&self, addr: u64) -> Option<[u64; 2]> {
        if self.segments.is_empty() {
            return None;
        }
        let (_, &(end, pool_id)) = self.segments.range(..=addr).next_back()?;
        (addr < end).then_some(pool_id)
    }

    /// Cuts `[start, end)` out of the private ranges (the parts outside it stay).
    fn forget(&mut self, start: u64, end: u64) {
        let gone: Vec<(u64, u64, [u64; 2])> = self
            .segments
            .range(..end)
            .rev()
            .take_while(|(_, &(e, _))| e > start)
            .map(|(&s, &(e, p))| (s, e, p))
            .collect();
        for (s, e, p) in gone {
            self.segments.remove(&s);
            if s < start {
                self.segments.insert(s, (start, p));
            }
            if e > end {
                self.segments.insert(end, (e, p));
            }
        }
    }

    /// True once the recording has shown a private pool.
    pub fn any(&self) -> bool {
        !self.segments.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Pool;

    #[test]
    fn allocations_in_a_private_segment_belong_to_its_pool() {
        let mut p = RecordedPools::default();
        let seg = |addr, bytes| Event::SegmentAlloc { addr, bytes, stream: 0, pool: Pool::Large };
        assert_eq!(p.observe(&seg(0x1000, 0x100)), Observed::Nothing);
        assert_eq!(p.observe(&seg(0x4000, 0x200)), Observed::Nothing);
        p.observe(&Event::SegmentPool { addr: 0x4000, pool_id: [1, 0] });
        assert_eq!(p.pool_of(0x1000), None);
        assert_eq!(p.pool_of(0x4000), Some([1, 0]));
        assert_eq!(p.pool_of(0x41ff), Some([1, 0]));
        assert_eq!(p.pool_of(0x4200), None);
        assert_eq!(p.pool_of(0x3fff), None);
        let free = Event::SegmentFree { addr: 0x4000, bytes: 0x200, stream: 0, pool: Pool::Large };
        assert_eq!(p.observe(&free), Observed::PoolEmptied([1, 0]));
        assert_eq!(p.pool_of(0x4000), None);
        let free_default = Event::SegmentFree { addr: 0x1000, bytes: 0x100, stream: 0, pool: Pool::Large };
        assert_eq!(p.observe(&free_default), Observed::Nothing);
    }

    #[test]
    fn a_segment_pool_names_only_the_segment_just_made() {
        let mut p = RecordedPools::default();
        p.observe(&Event::SegmentAlloc { addr: 0x1000, bytes: 0x100, stream: 0, pool: Pool::Small });
        // Another address, or a second note for the same segment, is ignored.
        p.observe(&Event::SegmentPool { addr: 0x2000, pool_id: [2, 0] });
        p.observe(&Event::SegmentPool { addr: 0x1000, pool_id: [2, 0] });
        assert_eq!(p.pool_of(0x1000), None);
        assert!(!p.any());
    }

    #[test]
    fn mapped_ranges_of_a_pool_stay_its_own_when_pages_are_unmapped_and_mapped_again() {
        let mut p = RecordedPools::default();
        let map = |addr, bytes| Event::SegmentMap { addr, bytes, stream: 0, pool: Pool::Large };
        p.observe(&map(0x10_000, 0x4_000));
        p.observe(&Event::SegmentPool { addr: 0x10_000, pool_id: [1, 0] });
        let unmap = Event::SegmentUnmap { addr: 0x11_000, bytes: 0x1_000, stream: 0, pool: Pool::Large };
        assert_eq!(p.observe(&unmap), Observed::PoolEmptied([1, 0]));
        p.observe(&map(0x11_000, 0x1_000));
        p.observe(&Event::SegmentPool { addr: 0x11_000, pool_id: [1, 0] });
        for a in [0x10_000, 0x11_000, 0x12_000, 0x13_fff] {
            assert_eq!(p.pool_of(a), Some([1, 0]), "{a:#x}");
        }
        // A default-pool mapping over part of it takes that part only.
        p.observe(&map(0x12_000, 0x1_000));
        assert_eq!(p.pool_of(0x12_000), None);
        assert_eq!(p.pool_of(0x11_fff), Some([1, 0]));
        assert_eq!(p.pool_of(0x13_000), Some([1, 0]));
    }
}
