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
//! frees such segments in two ways, and the run of segment frees that a `cache_release` closes
//! tells which ([`Burst`]):
//! - a release of the whole cache (`empty_cache()`, the OOM path) frees the default pools'
//!   whole segments first, then those of every unused private pool: a private segment freed
//!   after a default one is its pool's, unused; the replay marks the pool freeable
//!   ([`Engine::set_pool_freeable`]) before its own release of the whole cache;
//! - deleting a `torch.cuda.MemPool` empties that pool alone: private segments freed with no
//!   default one before them, in an `empty_cache` run, are released there, pool by pool
//!   ([`Engine::release_pool`]), and where that is all the run freed, the replay does not
//!   release the whole cache ([`Burst::pools_only`]).
//!
//! When a pool became unused (its graph deleted) before the release that freed its segments,
//! the trace does not say: a replay that releases the cache earlier keeps the pool's segments.
//!
//! [`Engine::malloc_in`]: crate::engine::Engine::malloc_in
//! [`Engine::set_pool_freeable`]: crate::engine::Engine::set_pool_freeable
//! [`Engine::release_pool`]: crate::engine::Engine::release_pool

use super::{Event, ReleaseCause};
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
    /// The current run of segment frees (a release still to be closed by its `cache_release`).
    burst: Burst,
}

/// A run of segment frees, as the `cache_release` that closes it finds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Burst {
    /// Private pools whose segments went before any default-pool segment, in order.
    pub emptied: Vec<[u64; 2]>,
    /// Private pools whose segments went after a default-pool one.
    pub freeable: Vec<[u64; 2]>,
    /// A default-pool segment went.
    pub default_freed: bool,
}

impl Burst {
    /// The release of private pools alone, as deleting a `torch.cuda.MemPool` makes
    /// (`emptyCache(pool)`): an `empty_cache` that freed private segments and nothing of the
    /// default pools. A replay releases those pools, not the whole cache. (A program's
    /// `empty_cache()` that found only unused graph pools to free reads the same; under the
    /// recorded settings it freed nothing else either.)
    pub fn pools_only(&self, cause: ReleaseCause) -> bool {
        cause == ReleaseCause::EmptyCache && !self.emptied.is_empty() && !self.default_freed && self.freeable.is_empty()
    }

    /// Nothing freed in this run yet.
    #[inline]
    fn is_empty(&self) -> bool {
        !self.default_freed && self.emptied.is_empty() && self.freeable.is_empty()
    }

    fn note(list: &mut Vec<[u64; 2]>, pool_id: [u64; 2]) {
        if !list.contains(&pool_id) {
            list.push(pool_id);
        }
    }
}

/// What [`RecordedPools::observe`] learned from a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    Nothing,
    /// The segment just made (`bytes`) belongs to this private pool.
    PrivateMade {
        pool_id: [u64; 2],
        bytes: u64,
    },
    /// `bytes` of this private pool's segments went back to the device.
    PrivateFreed {
        pool_id: [u64; 2],
        bytes: u64,
    },
}

impl RecordedPools {
    /// Follows the recording's segments; call it for every record, in order. A `cache_release`
    /// closes the run of segment frees: [`RecordedPools::end_burst`] (which
    /// [`RecordedPools::follow`] calls) reads it first, or it is forgotten here.
    #[inline]
    pub fn observe(&mut self, event: &Event) -> Observed {
        if !matches!(event, Event::SegmentFree { .. } | Event::SegmentUnmap { .. }) && !self.burst.is_empty() {
            self.burst = Burst::default();
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
                    if start == addr && pool_id != [0, 0] && bytes > 0 {
                        self.segments.insert(start, (start.saturating_add(bytes), pool_id));
                        return Observed::PrivateMade { pool_id, bytes };
                    }
                }
            }
            Event::SegmentFree { addr, bytes, .. } => match self.segments.remove(&addr) {
                Some((_, pool_id)) => return self.freed(pool_id, bytes),
                None => self.burst.default_freed = true,
            },
            // Pages of an expandable segment: the rest of the segment (and its address range,
            // which a later mapping of the same pool reuses) stays the pool's.
            Event::SegmentUnmap { addr, bytes, .. } => match self.pool_of(addr) {
                Some(pool_id) => return self.freed(pool_id, bytes),
                None => self.burst.default_freed = true,
            },
            _ => {}
        }
        Observed::Nothing
    }

    fn freed(&mut self, pool_id: [u64; 2], bytes: u64) -> Observed {
        let b = &mut self.burst;
        Burst::note(if b.default_freed { &mut b.freeable } else { &mut b.emptied }, pool_id);
        Observed::PrivateFreed { pool_id, bytes }
    }

    /// The run of segment frees that a `cache_release` closes, taken (call it at that record,
    /// before [`RecordedPools::observe`]).
    pub fn end_burst(&mut self) -> Burst {
        std::mem::take(&mut self.burst)
    }

    /// [`RecordedPools::observe`], and what it learned applied to the replaying engine. At a
    /// `cache_release`, the private pools its run of frees gave back: pools released alone (a
    /// MemPool deleted) are released there ([`Engine::release_pool`]); pools released by a
    /// release of the whole cache are marked freeable, so that the replay's own release frees
    /// them after the default pools, as PyTorch does. Returns true when the record is a release
    /// of private pools alone ([`Burst::pools_only`]): the replay must not release the whole
    /// cache there.
    #[inline]
    pub fn follow<D: Device, S: Sink>(&mut self, event: &Event, engine: &mut Engine<D, S>) -> bool {
        match *event {
            Event::CacheRelease { cause, .. } => {
                let burst = self.end_burst();
                Self::apply(&burst, Some(cause), engine);
                burst.pools_only(cause)
            }
            Event::SegmentFree { .. } | Event::SegmentUnmap { .. } => {
                self.observe(event);
                false
            }
            _ => {
                // A run of frees that no `cache_release` closed (a trace made without the
                // program's `empty_cache()` calls, to see what they cost): a pool emptied alone
                // is still released (deleting a MemPool is not such a call).
                if !self.burst.is_empty() {
                    let burst = self.end_burst();
                    Self::apply(&burst, None, engine);
                }
                self.observe(event);
                false
            }
        }
    }

    fn apply<D: Device, S: Sink>(burst: &Burst, cause: Option<ReleaseCause>, engine: &mut Engine<D, S>) {
        if matches!(cause, Some(ReleaseCause::Oversize | ReleaseCause::GarbageCollection)) {
            // PyTorch's own path inside a request, which the replay's engine takes itself.
            return;
        }
        for &pool_id in &burst.emptied {
            if matches!(cause, None | Some(ReleaseCause::EmptyCache)) {
                engine.release_pool(pool_id);
            } else {
                engine.set_pool_freeable(pool_id);
            }
        }
        for &pool_id in &burst.freeable {
            engine.set_pool_freeable(pool_id);
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
        let named = p.observe(&Event::SegmentPool { addr: 0x4000, pool_id: [1, 0] });
        assert_eq!(named, Observed::PrivateMade { pool_id: [1, 0], bytes: 0x200 });
        assert_eq!(p.pool_of(0x1000), None);
        assert_eq!(p.pool_of(0x4000), Some([1, 0]));
        assert_eq!(p.pool_of(0x41ff), Some([1, 0]));
        assert_eq!(p.pool_of(0x4200), None);
        assert_eq!(p.pool_of(0x3fff), None);
        let free = Event::SegmentFree { addr: 0x4000, bytes: 0x200, stream: 0, pool: Pool::Large };
        assert_eq!(p.observe(&free), Observed::PrivateFreed { pool_id: [1, 0], bytes: 0x200 });
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
        assert_eq!(p.observe(&unmap), Observed::PrivateFreed { pool_id: [1, 0], bytes: 0x1_000 });
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

    #[test]
    fn a_run_of_frees_tells_a_pool_released_alone_from_a_release_of_the_whole_cache() {
        let seg = |addr| Event::SegmentAlloc { addr, bytes: 0x100, stream: 0, pool: Pool::Large };
        let free = |addr| Event::SegmentFree { addr, bytes: 0x100, stream: 0, pool: Pool::Large };
        let mut p = RecordedPools::default();
        for (addr, pool_id) in [(0x1000, [0, 1]), (0x2000, [1, 0])] {
            p.observe(&seg(addr));
            p.observe(&Event::SegmentPool { addr, pool_id });
        }
        p.observe(&seg(0x3000));
        // A MemPool deleted: its segment alone.
        p.observe(&free(0x1000));
        let b = p.end_burst();
        assert_eq!(b, Burst { emptied: vec![[0, 1]], freeable: vec![], default_freed: false });
        assert!(b.pools_only(ReleaseCause::EmptyCache));
        assert!(!b.pools_only(ReleaseCause::OomRetry));
        // empty_cache(): the default pools' segment, then an unused graph pool's.
        p.observe(&free(0x3000));
        p.observe(&free(0x2000));
        let b = p.end_burst();
        assert_eq!(b, Burst { emptied: vec![], freeable: vec![[1, 0]], default_freed: true });
        assert!(!b.pools_only(ReleaseCause::EmptyCache));
        // Any other record ends a run.
        p.observe(&seg(0x5000));
        assert_eq!(p.end_burst(), Burst::default());
    }
}
