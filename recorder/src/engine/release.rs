//! Giving cached memory back: `release_cached_blocks` (empty_cache and the OOM retry),
//! `release_available_cached_blocks` (max_split_size), garbage collection, and unmapping
//! free pages of expandable segments.

use super::block::{set_index, Block, State, NIL};
use super::core::{pool_index, Engine};
use super::rounding::page_size;
use super::{Released, Sink};
use crate::device::Device;
use crate::trace::{Event, Pool, ReleaseCause};

impl<D: Device, S: Sink> Engine<D, S> {
    /// `cudaFree` of a whole free segment (no prev, no next, not expandable).
    fn release_block(&mut self, idx: u32) -> u64 {
        let b = &self.blocks[idx];
        debug_assert!(!b.is_split() && !b.is_expandable() && b.state == State::Free);
        let (addr, size, stream, pool) = (b.addr, b.size, b.stream, b.pool);
        self.pools[b.set()].free.remove(&b.free_key(idx));
        self.blocks.remove(idx);
        self.device.free_segment(addr, size);
        self.stats.num_device_free += 1;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size);
        if size >= self.config.max_split_size.unwrap_or(u64::MAX) {
            self.stats.oversize_segments.decrease(1);
        }
        self.sink.event(Event::SegmentFree { addr, bytes: size, stream, pool });
        size
    }

    /// Completes pending frees, frees every whole free segment and unmaps the whole free pages
    /// of expandable segments: in the default pools (large, then small), then in each freeable
    /// private pool (small, then large), in PyTorch's order. Emits `CacheRelease { cause }`.
    pub(crate) fn release_cached_blocks(&mut self, cause: ReleaseCause) -> Released {
        self.synchronize_and_free_events();
        let freeable: Vec<u32> = self.freeable_owners.iter().copied().collect();
        let mut sets = vec![set_index(0, Pool::Large), set_index(0, Pool::Small)];
        sets.extend(freeable.iter().flat_map(|&o| [set_index(o, Pool::Small), set_index(o, Pool::Large)]));
        let released = self.release_sets(&sets);
        self.forget_emptied(&freeable);
        self.sink.event(Event::CacheRelease { cause, bytes: released.bytes, segments: released.segments });
        released
    }

    /// Releases the private pool `pool_id` alone, as PyTorch's `emptyCache(mempool_id)` does when
    /// a `torch.cuda.MemPool` is deleted: the pool becomes freeable and its whole free segments
    /// (small, then large) go back to the device. Its pending frees are not waited for. Emits
    /// `CacheRelease { EmptyCache }` when anything was released.
    pub fn release_pool(&mut self, pool_id: [u64; 2]) -> Released {
        let Some(owner) = self.owner_of(pool_id) else {
            return Released::default();
        };
        self.private[owner as usize - 1].freeable = true;
        self.freeable_owners.insert(owner);
        let released = self.release_sets(&[set_index(owner, Pool::Small), set_index(owner, Pool::Large)]);
        self.forget_emptied(&[owner]);
        if released.segments > 0 {
            self.sink.event(Event::CacheRelease {
                cause: ReleaseCause::EmptyCache,
                bytes: released.bytes,
                segments: released.segments,
            });
        }
        released
    }

    /// Freeable pools with no free block left leave the set a release visits (their unmapped
    /// ranges are not what a release frees).
    fn forget_emptied(&mut self, owners: &[u32]) {
        for &o in owners {
            let empty = |p: Pool| {
                let s = &self.pools[set_index(o, p)];
                s.free.is_empty()
            };
            if empty(Pool::Small) && empty(Pool::Large) {
                self.freeable_owners.remove(&o);
            }
        }
    }

    /// `release_blocks` of each of these free sets, in order.
    fn release_sets(&mut self, sets: &[usize]) -> Released {
        let mut released = Released::default();
        for &set in sets {
            let keys: Vec<_> = self.pools[set].free.iter().collect();
            let mut to_unmap = Vec::new();
            for (_, _, _, idx) in keys {
                let b = &self.blocks[idx];
                if b.is_expandable() {
                    to_unmap.push(idx);
                } else if !b.is_split() {
                    released.bytes += self.release_block(idx);
                    released.segments += 1;
                }
            }
            for idx in to_unmap {
                let bytes = self.unmap_block(idx);
                if bytes > 0 {
                    released.bytes += bytes;
                    released.segments += 1;
                }
                self.release_expandable_segment(idx);
            }
        }
        released
    }

    /// max_split_size only: free the smallest whole oversize block of this stream that covers
    /// `max(rounded, max_split_size)`, else oversize blocks from the largest down until that
    /// much is freed. True when enough was freed.
    pub(crate) fn release_available_cached_blocks(&mut self, set: usize, stream: u64, rounded: u64) -> bool {
        let Some(msplit) = self.config.max_split_size else {
            return false;
        };
        let key_size = rounded.max(msplit);
        let sets = &self.pools[set];
        let hit = sets.free.at_least(stream, key_size).next();
        let single = hit.filter(|k| k.0 == stream && !self.blocks[k.3].is_expandable());
        let mut released = Released::default();
        let ok = if let Some(k) = single {
            if self.blocks[k.3].is_split() {
                // Oversize blocks are never split off in practice; freeing a piece of a live
                // segment is impossible, so this counts as nothing released.
                false
            } else {
                released.bytes += self.release_block(k.3);
                released.segments += 1;
                true
            }
        } else {
            let mut victims = Vec::new();
            let mut total = 0u64;
            for k in sets.free.below_size_rev(stream, key_size) {
                if total >= key_size || k.1 < msplit || k.0 != stream {
                    break;
                }
                let b = &self.blocks[k.3];
                if !b.is_expandable() && !b.is_split() {
                    victims.push(k.3);
                    total += k.1;
                }
            }
            for idx in victims {
                released.bytes += self.release_block(idx);
                released.segments += 1;
            }
            total >= key_size
        };
        if released.bytes > 0 {
            self.sink.event(Event::CacheRelease {
                cause: ReleaseCause::Oversize,
                bytes: released.bytes,
                segments: released.segments,
            });
        }
        ok
    }

    /// `garbage_collect_cached_blocks`: when reserved memory is above `threshold * capacity`,
    /// free whole large-pool segments at least as old as the average, repeatedly, until the
    /// excess is reclaimed or nothing more can be freed.
    pub(crate) fn garbage_collect(&mut self) {
        let Some(gc_threshold) = self.capacity.and_then(|cap| self.config.gc_trigger_bytes(cap)) else {
            return;
        };
        let total = self.stats.reserved_bytes.all.current;
        if total <= gc_threshold {
            return;
        }
        let target = total - gc_threshold;
        let large = pool_index(Pool::Large);
        let calls = self.pools[large].gc_calls;
        let age = |b: &Block| calls - b.gc_count_base;
        let (mut total_age, mut count) = (0u64, 0u64);
        for k in self.pools[large].free.iter() {
            let b = &self.blocks[k.3];
            if !b.is_split() {
                total_age += age(b);
                count += 1;
            }
        }
        let mut released = Released::default();
        let mut freed = true;
        while released.bytes < target && freed && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed = false;
            let keys: Vec<_> = self.pools[large].free.iter().collect();
            for (_, _, _, idx) in keys {
                let b = &self.blocks[idx];
                if !b.is_split() && !b.is_expandable() && age(b) as f64 >= threshold_age {
                    freed = true;
                    total_age -= age(b);
                    count -= 1;
                    released.bytes += self.release_block(idx);
                    released.segments += 1;
                }
            }
        }
        if released.bytes > 0 {
            self.sink.event(Event::CacheRelease {
                cause: ReleaseCause::GarbageCollection,
                bytes: released.bytes,
                segments: released.segments,
            });
        }
    }

    /// Unmaps the whole pages inside a free expandable block; a partial head or tail page stays
    /// as a free mapped block. Returns the bytes unmapped.
    fn unmap_block(&mut self, idx: u32) -> u64 {
        let b = &self.blocks[idx];
        let (addr, size, stream, pool, owner, set, seg) =
            (b.addr, b.size, b.stream, b.pool, b.owner, b.set(), b.expandable);
        let Some(es) = self.expandables[seg as usize] else {
            return 0;
        };
        let page = page_size(&self.config, pool);
        let begin = es.base + (addr - es.base).div_ceil(page) * page;
        let end = es.base + (addr + size - es.base) / page * page;
        if begin >= end {
            return 0;
        }
        let sets = &mut self.pools[set];
        sets.free.remove(&b.free_key(idx));
        let gc_calls = sets.gc_calls;
        if begin > addr {
            let mut head = Block::new(addr, begin - addr, stream, pool, owner, State::Free);
            head.expandable = seg;
            head.prev = self.blocks[idx].prev;
            head.next = idx;
            head.gc_count_base = gc_calls;
            let h = self.blocks.insert(head);
            if self.blocks[h].prev != NIL {
                let p = self.blocks[h].prev;
                self.blocks[p].next = h;
            }
            self.blocks[idx].prev = h;
            let key = self.blocks[h].free_key(h);
            self.pools[set].free.insert(key);
        }
        if end < addr + size {
            let mut tail = Block::new(end, addr + size - end, stream, pool, owner, State::Free);
            tail.expandable = seg;
            tail.prev = idx;
            tail.next = self.blocks[idx].next;
            tail.gc_count_base = gc_calls;
            let t = self.blocks.insert(tail);
            if self.blocks[t].next != NIL {
                let n = self.blocks[t].next;
                self.blocks[n].prev = t;
            }
            self.blocks[idx].next = t;
            let key = self.blocks[t].free_key(t);
            self.pools[set].free.insert(key);
        }
        let bytes = end - begin;
        {
            let b = &mut self.blocks[idx];
            b.addr = begin;
            b.size = bytes;
            b.state = State::Unmapped;
        }
        self.device.unmap(begin, bytes);
        let (prev, next) = (self.blocks[idx].prev, self.blocks[idx].next);
        self.try_merge_blocks(idx, prev);
        self.try_merge_blocks(idx, next);
        let b = &self.blocks[idx];
        self.pools[set].unmapped.insert((stream, b.addr, idx));
        self.stats.reserved_bytes.decrease(pool, bytes);
        self.stats.num_device_free += 1;
        self.sink.event(Event::SegmentUnmap { addr: begin, bytes, stream, pool });
        bytes
    }

    /// Gives the address range back once an expandable segment is entirely unmapped.
    fn release_expandable_segment(&mut self, idx: u32) {
        let b = &self.blocks[idx];
        if b.state != State::Unmapped || b.is_split() {
            return;
        }
        let (stream, addr, set, seg) = (b.stream, b.addr, b.set(), b.expandable);
        if let Some(es) = self.expandables[seg as usize].take() {
            self.pools[set].unmapped.remove(&(stream, addr, idx));
            self.blocks.remove(idx);
            self.device.release_address_space(es.base, es.bytes);
        }
    }
}
