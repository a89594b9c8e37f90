//! The engine: malloc (best fit, split), free (merge), and the expandable-segment map path.

use super::block::{set_index, Arena, Block, PoolSets, State, NIL};
use super::config::{AllocatorConfig, MIN_BLOCK_SIZE, SMALL_SIZE};
use super::live::LiveMap;
use super::rounding::{allocation_size, page_size, pool_for, round_plain, round_size};
use super::stats::Stats;
use super::version::TorchVersion;
use super::{Allocation, FreeError, OutOfMemory, Released, Sink};
use crate::device::Device;
use crate::trace::{Event, Pool, ReleaseCause, NO_CALLSITE};
use std::collections::HashSet;

/// Requests this large fail at once ("Tried to allocate more than 1EB memory").
const MAX_REQUEST: u64 = 1 << 60;
/// Address space reserved per expandable segment when the device total is unknown.
const DEFAULT_VA_BYTES: u64 = 1 << 40;

/// An expandable segment: one reserved range per (stream, pool).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expandable {
    pub base: u64,
    pub bytes: u64,
}

/// PyTorch's caching allocator on one device. See the module documentation. A clone is an
/// independent copy of the cache (analyses resume replays from one).
#[derive(Clone)]
pub struct Engine<D: Device, S: Sink> {
    pub(crate) config: AllocatorConfig,
    /// `allowed_memory_maximum` (`set_per_process_memory_fraction`), when set.
    pub(crate) capacity: Option<u64>,
    pub(crate) device: D,
    pub(crate) sink: S,
    pub(crate) blocks: Arena,
    /// The free and unmapped sets, indexed by [`set_index`]: the default pools' two, then two
    /// per private pool.
    pub(crate) pools: Vec<PoolSets>,
    /// The private pools (owner `k` is `private[k - 1]`), and each one's owner by its id.
    pub(crate) private: Vec<PrivatePool>,
    private_owners: std::collections::HashMap<[u64; 2], u32>,
    /// The freeable private pools that may hold free blocks: what a cache release visits (a
    /// pool leaves when the release leaves it nothing free, and comes back when a block is freed
    /// into it), so that a release costs the pools it can free, not every pool ever made.
    pub(crate) freeable_owners: std::collections::BTreeSet<u32>,
    /// Allocated and pending-free blocks by address.
    pub(crate) live: LiveMap,
    pub(crate) pending: usize,
    /// What the program asked for, summed over the pending-free blocks.
    pub(crate) pending_requested: u64,
    /// The most that a device allocation has asked for: reserved bytes plus its size.
    pub(crate) demand_peak: u64,
    /// The most that a device allocation within the capacity asked for, and the least that one
    /// over it asked for: [`Engine::capacity_band`].
    demand_passed: u64,
    demand_refused: u64,
    /// Pending frees completed by a synchronization; their `free_completed` is still to come.
    pub(crate) completed_by_sync: HashSet<u64>,
    pub(crate) expandables: Vec<Option<Expandable>>,
    pub(crate) next_id: u64,
    pub(crate) stats: Stats,
    max_split_size: u64,
    /// No `roundup_power2_divisions`: every request rounds up to a multiple of 512.
    plain_rounding: bool,
    /// The PyTorch release whose allocator this engine follows.
    torch: TorchVersion,
    /// A device allocation that would pass the capacity fails at once, skipping the release of
    /// cached blocks and the retry: `throw_on_cudamalloc_oom:True` on PyTorch 2.12 or later.
    preempt_over_capacity: bool,
}

/// The default pools' sets of `pool`.
#[inline]
pub(crate) fn pool_index(pool: Pool) -> usize {
    set_index(0, pool)
}

/// A private memory pool: a CUDA graph's (`torch.cuda.graph`, `torch.compile`'s graph trees) or
/// a `torch.cuda.MemPool`. Its blocks come only from its own segments and return to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PrivatePool {
    /// PyTorch's `MempoolId_t`.
    pub id: [u64; 2],
    /// No graph or pool object uses it any more (PyTorch's `graph_pools_freeable`): a cache
    /// release frees its whole free segments too.
    pub freeable: bool,
}

impl<D: Device, S: Sink> Engine<D, S> {
    /// An empty cache. `capacity_bytes` is the cap on reserved memory (PyTorch's memory
    /// fraction); `None` = only the device limits it.
    pub fn new(config: AllocatorConfig, capacity_bytes: Option<u64>, device: D, sink: S) -> Self {
        let max_split_size = config.max_split_size.unwrap_or(u64::MAX);
        let plain_rounding = config.roundup_power2_divisions.iter().all(|&d| d <= 1);
        Engine {
            config,
            capacity: capacity_bytes,
            device,
            sink,
            blocks: Arena::default(),
            pools: vec![PoolSets::default(), PoolSets::default()],
            private: Vec::new(),
            private_owners: std::collections::HashMap::new(),
            freeable_owners: std::collections::BTreeSet::new(),
            live: LiveMap::default(),
            pending: 0,
            pending_requested: 0,
            demand_peak: 0,
            demand_passed: 0,
            demand_refused: u64::MAX,
            completed_by_sync: HashSet::new(),
            expandables: Vec::new(),
            next_id: 1,
            stats: Stats::default(),
            max_split_size,
            plain_rounding,
            torch: TorchVersion::MODELLED,
            preempt_over_capacity: false,
        }
        .with_torch_version(TorchVersion::MODELLED)
    }

    /// The engine follows the allocator of PyTorch `version` where releases differ (see
    /// [`super::version`]); [`TorchVersion::MODELLED`] unless set.
    pub fn with_torch_version(mut self, version: TorchVersion) -> Self {
        self.torch = version;
        self.preempt_over_capacity = version.preempts_fraction_oom() && self.config.throw_on_cudamalloc_oom();
        self
    }

    /// The PyTorch release whose allocator this engine follows.
    pub fn torch_version(&self) -> TorchVersion {
        self.torch
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }
    /// `reset_peak_memory_stats`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }
    /// The most that a device allocation has asked for so far: reserved bytes plus the size of
    /// the segment (or of the pages) it asked for, as the memory fraction checks it. A run under
    /// any capacity at or above this has made the same choices as this one (the capacity is
    /// read only there, and by the garbage collector). With expandable segments it can exceed
    /// the peak of reserved bytes: the check counts the whole size, the mapping only the pages
    /// missing.
    pub fn demand_peak(&self) -> u64 {
        self.demand_peak
    }

    /// The capacities `[low, high)` under which the run so far made the same choices as under
    /// its own: every device allocation it asked for within its capacity asked for at most
    /// `low`, and every one it was refused asked for at least `high` (the device refusing
    /// nothing more than it did). The capacity is read only there and by the garbage
    /// collector: `None` with `garbage_collection_threshold`, whose trigger is a share of it.
    pub fn capacity_band(&self) -> Option<(u64, u64)> {
        let collects = self.config.garbage_collection_threshold.is_some_and(|t| t > 0.0);
        (!collects).then_some((self.demand_passed, self.demand_refused))
    }

    pub fn set_capacity(&mut self, capacity_bytes: Option<u64>) {
        self.capacity = capacity_bytes;
    }
    pub fn device(&self) -> &D {
        &self.device
    }
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }
    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }
    pub fn into_parts(self) -> (D, S) {
        (self.device, self.sink)
    }
    /// The block size a request of `bytes` gets before any slack (`round_size`).
    pub fn round_size(&self, bytes: u64) -> u64 {
        round_size(&self.config, bytes)
    }

    #[inline]
    pub(crate) fn gc_enabled(&self) -> bool {
        self.capacity.is_some() && self.config.garbage_collection_threshold.is_some_and(|t| t > 0.0)
    }

    /// PyTorch `malloc`: best fit in the cache, else a new segment, else the OOM path
    /// (garbage collection, oversize release, release everything and retry), else OOM.
    pub fn malloc(&mut self, requested_bytes: u64, stream: u64, callsite: u32) -> Result<Allocation, OutOfMemory> {
        self.malloc_owned(0, requested_bytes, stream, callsite)
    }

    /// `malloc` while a CUDA graph capture or `torch.cuda.use_mem_pool` directs this request to
    /// the private pool `pool_id` (PyTorch's `MempoolId_t`; `[0, 0]` is the default pools):
    /// best fit among that pool's free blocks, else a new segment of its own. As in PyTorch while
    /// a capture is under way, the OOM path does not release the cache (`release_cached_blocks`
    /// is skipped; the oversize release of max_split_size still runs, within the pool).
    pub fn malloc_in(
        &mut self,
        pool_id: [u64; 2],
        requested_bytes: u64,
        stream: u64,
        callsite: u32,
    ) -> Result<Allocation, OutOfMemory> {
        let owner = self.private_owner(pool_id);
        if owner != 0 && self.private[owner as usize - 1].freeable {
            self.private[owner as usize - 1].freeable = false;
            self.freeable_owners.remove(&owner);
        }
        self.malloc_owned(owner, requested_bytes, stream, callsite)
    }

    /// The owner number of the pool `pool_id`, made on first use.
    fn private_owner(&mut self, pool_id: [u64; 2]) -> u32 {
        if pool_id == [0, 0] {
            return 0;
        }
        if let Some(owner) = self.owner_of(pool_id) {
            return owner;
        }
        self.private.push(PrivatePool { id: pool_id, freeable: false });
        self.pools.push(PoolSets::default());
        self.pools.push(PoolSets::default());
        let owner = self.private.len() as u32;
        self.private_owners.insert(pool_id, owner);
        owner
    }

    /// Nothing uses the private pool `pool_id` any more (its graph was deleted, its `MemPool`
    /// released): the next cache release (`empty_cache`, or the OOM path's) frees its whole free
    /// segments, after the default pools', as PyTorch frees `graph_pools_freeable`. A later
    /// request to the pool makes it used again. Unknown pools are ignored.
    pub fn set_pool_freeable(&mut self, pool_id: [u64; 2]) {
        if let Some(owner) = self.owner_of(pool_id) {
            self.private[owner as usize - 1].freeable = true;
            self.freeable_owners.insert(owner);
        }
    }

    /// The owner number of a pool the engine knows.
    pub(crate) fn owner_of(&self, pool_id: [u64; 2]) -> Option<u32> {
        self.private_owners.get(&pool_id).copied()
    }

    /// The private pools the engine knows, with whether each is freeable.
    pub fn private_pools(&self) -> impl Iterator<Item = ([u64; 2], bool)> + '_ {
        self.private.iter().map(|p| (p.id, p.freeable))
    }

    /// PyTorch's id of the pool `owner` (`[0, 0]` for the default pools).
    #[inline]
    pub(crate) fn pool_id(&self, owner: u32) -> [u64; 2] {
        if owner == 0 {
            [0, 0]
        } else {
            self.private[owner as usize - 1].id
        }
    }

    /// After the event of a segment made (or pages mapped) at `addr`: the `segment_pool` that
    /// names its private pool, if it has one.
    #[inline]
    fn name_private_segment(&mut self, addr: u64, owner: u32) {
        if owner != 0 {
            self.sink.event(Event::SegmentPool { addr, pool_id: self.pool_id(owner) });
        }
    }

    #[inline]
    fn malloc_owned(
        &mut self,
        owner: u32,
        requested_bytes: u64,
        stream: u64,
        callsite: u32,
    ) -> Result<Allocation, OutOfMemory> {
        let rounded =
            if self.plain_rounding { round_plain(requested_bytes) } else { round_size(&self.config, requested_bytes) };
        let pool = pool_for(rounded);
        let alloc_bytes = allocation_size(&self.config, rounded);
        if requested_bytes >= MAX_REQUEST {
            return Err(self.oom(requested_bytes, rounded, alloc_bytes, stream));
        }
        let found = match self.get_free_block(set_index(owner, pool), stream, rounded) {
            Some(idx) => Some(idx),
            None => self.alloc_on_miss(owner, pool, stream, rounded, alloc_bytes),
        };
        let Some(idx) = found else {
            return Err(self.oom(requested_bytes, rounded, alloc_bytes, stream));
        };
        let split = self.should_split(idx, rounded);
        Ok(self.alloc_found_block(idx, rounded, requested_bytes, split, callsite))
    }

    fn alloc_on_miss(&mut self, owner: u32, pool: Pool, stream: u64, rounded: u64, alloc_bytes: u64) -> Option<u32> {
        if self.gc_enabled() {
            self.garbage_collect();
        }
        if let Some(idx) = self.alloc_block(owner, pool, stream, rounded, alloc_bytes, false) {
            return Some(idx);
        }
        if self.preempt_over_capacity
            && self.capacity.is_some_and(|cap| self.stats.reserved_bytes.all.current.saturating_add(alloc_bytes) > cap)
        {
            // PyTorch 2.12+ with throw_on_cudamalloc_oom: over the fraction, throw now; no
            // cached block is released and nothing is retried.
            self.stats.num_oom_rejections += 1;
            return None;
        }
        if self.release_available_cached_blocks(set_index(owner, pool), stream, rounded) {
            if let Some(idx) = self.alloc_block(owner, pool, stream, rounded, alloc_bytes, false) {
                return Some(idx);
            }
        }
        if owner != 0 {
            // A capture is under way: PyTorch does not release the cache then.
            return None;
        }
        self.release_cached_blocks(ReleaseCause::OomRetry);
        self.alloc_block(owner, pool, stream, rounded, alloc_bytes, true)
    }

    fn oom(&mut self, requested_bytes: u64, rounded: u64, alloc_bytes: u64, stream: u64) -> OutOfMemory {
        self.stats.num_ooms += 1;
        let device_free_bytes = self.device.mem_info().map(|(free, _)| free);
        let e = OutOfMemory {
            requested_bytes,
            rounded_bytes: rounded,
            alloc_bytes,
            reserved_bytes: self.stats.reserved_bytes.all.current,
            allocated_bytes: self.stats.allocated_bytes.all.current,
            capacity_bytes: self.capacity,
            device_free_bytes,
        };
        self.sink.event(Event::Oom {
            requested_bytes,
            alloc_bytes,
            device_free_bytes: device_free_bytes.unwrap_or(0),
            reserved_bytes: e.reserved_bytes,
            allocated_bytes: e.allocated_bytes,
            limit_bytes: self.capacity.unwrap_or(0),
            stream,
        });
        e
    }

    /// Best fit on the same stream, ties to the lowest address; the max_split_size rules turn
    /// a fit into a miss. The hit leaves the free set.
    #[inline]
    fn get_free_block(&mut self, set: usize, stream: u64, rounded: u64) -> Option<u32> {
        let gc = self.gc_enabled();
        let sets = &mut self.pools[set];
        if gc {
            sets.gc_calls += 1;
        }
        let (mut key, at) = sets.free.first_at_least(stream, rounded)?;
        let expandable = self.blocks[key.3].is_expandable() && self.config.expandable_segments;
        if expandable {
            // An expandable block counts as big as it can grow (plus an unmapped successor).
            let expandable_size = |blocks: &Arena, idx: u32| {
                let b = &blocks[idx];
                b.size + if b.next != NIL && blocks[b.next].state == State::Unmapped { blocks[b.next].size } else { 0 }
            };
            for next in sets.free.at_least(stream, rounded).skip(1) {
                if !self.blocks[key.3].is_expandable()
                    || expandable_size(&self.blocks, next.3) >= expandable_size(&self.blocks, key.3)
                {
                    break;
                }
                key = next;
            }
        }
        let size = key.1;
        let msplit = self.max_split_size;
        if rounded < msplit && size >= msplit {
            return None;
        }
        if rounded >= msplit && size >= rounded.saturating_add(self.config.max_non_split_rounding) {
            return None;
        }
        if expandable {
            sets.free.remove(&key);
        } else {
            sets.free.remove_at(at);
        }
        self.blocks[key.3].state = State::Taken;
        Some(key.3)
    }

    /// A new segment (or newly mapped pages) for the request; `None` when the capacity or the
    /// device refuses.
    fn alloc_block(
        &mut self,
        owner: u32,
        pool: Pool,
        stream: u64,
        rounded: u64,
        alloc_bytes: u64,
        retry: bool,
    ) -> Option<u32> {
        if retry {
            self.stats.num_alloc_retries += 1;
        }
        let demand = self.stats.reserved_bytes.all.current.saturating_add(alloc_bytes);
        self.demand_peak = self.demand_peak.max(demand);
        if self.capacity.is_some_and(|cap| demand > cap) {
            self.demand_refused = self.demand_refused.min(demand);
            return None;
        }
        self.demand_passed = self.demand_passed.max(demand);
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(owner, pool, stream, rounded);
        }
        let addr = self.device.alloc_segment(alloc_bytes, stream)?;
        let idx = self.blocks.insert(Block::new(addr, alloc_bytes, stream, pool, owner, State::Taken));
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, alloc_bytes);
        self.stats.num_device_alloc += 1;
        if alloc_bytes >= self.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.sink.event(Event::SegmentAlloc { addr, bytes: alloc_bytes, stream, pool });
        self.name_private_segment(addr, owner);
        Some(idx)
    }

    #[inline]
    fn should_split(&self, idx: u32, rounded: u64) -> bool {
        let b = &self.blocks[idx];
        let remaining = b.size - rounded;
        if b.pool == Pool::Small || self.config.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            rounded < self.max_split_size && remaining > SMALL_SIZE
        }
    }

    #[inline]
    fn alloc_found_block(&mut self, idx: u32, rounded: u64, requested: u64, split: bool, callsite: u32) -> Allocation {
        let (pool, owner, set, expandable, already_split) = {
            let b = &self.blocks[idx];
            (b.pool, b.owner, b.set(), b.is_expandable(), b.is_split())
        };
        let mut block = idx;
        if split {
            let remaining = idx;
            let r = &self.blocks[remaining];
            let mut new = Block::new(r.addr, rounded, r.stream, pool, owner, State::Taken);
            new.expandable = r.expandable;
            new.prev = r.prev;
            new.next = remaining;
            block = self.blocks.insert(new);
            let prev = self.blocks[block].prev;
            if prev != NIL {
                self.blocks[prev].next = block;
            }
            let gc_calls = self.pools[set].gc_calls;
            let r = &mut self.blocks[remaining];
            r.prev = block;
            r.addr += rounded;
            r.size -= rounded;
            r.state = State::Free;
            r.gc_count_base = gc_calls;
            let (key, remainder) = (r.free_key(remaining), r.size);
            self.pools[set].free.insert(key);
            if !expandable {
                if already_split {
                    self.stats.inactive_split_bytes.decrease(pool, rounded);
                } else {
                    self.stats.inactive_split_bytes.increase(pool, remainder);
                    self.stats.inactive_split.increase(pool, 1);
                }
            }
            self.sink.event(Event::Split { addr: self.blocks[block].addr, bytes: rounded, remainder_bytes: remainder });
        } else if already_split && !expandable {
            let size = self.blocks[idx].size;
            self.stats.inactive_split_bytes.decrease(pool, size);
            self.stats.inactive_split.decrease(pool, 1);
        }
        let id = self.next_id;
        self.next_id += 1;
        let b = &mut self.blocks[block];
        b.state = State::Allocated;
        b.requested = requested;
        b.id = id;
        let (addr, size, stream) = (b.addr, b.size, b.stream);
        self.live.insert(addr, block);
        if !self.completed_by_sync.is_empty() {
            self.completed_by_sync.remove(&addr);
        }
        let st = &mut self.stats;
        st.allocation.increase(pool, 1);
        st.allocated_bytes.increase(pool, size);
        st.active.increase(pool, 1);
        st.active_bytes.increase(pool, size);
        st.requested_bytes.increase(pool, requested);
        if size >= self.max_split_size {
            st.oversize_allocations.increase(1);
        }
        self.sink.event(Event::Alloc {
            id,
            addr,
            requested_bytes: requested,
            block_bytes: size,
            stream,
            pool,
            callsite,
        });
        Allocation { id, addr, block_bytes: size, pool }
    }

    /// `free_requested` + `free_completed`: the block goes back to the cache at once.
    pub fn free(&mut self, addr: u64) -> Result<(), FreeError> {
        // One map lookup where the two halves would take three.
        let Some(idx) = self.live.remove(addr) else {
            return Err(FreeError::UnknownAddress(addr));
        };
        if let Err(e) = self.mark_pending(idx, addr) {
            self.live.insert(addr, idx);
            return Err(e);
        }
        self.pending -= 1;
        self.pending_requested -= self.blocks[idx].requested;
        self.free_block(idx);
        Ok(())
    }

    /// The program released the block: it is no longer allocated but not reusable yet.
    pub fn free_requested(&mut self, addr: u64) -> Result<(), FreeError> {
        let Some(idx) = self.live.get(addr) else {
            return Err(FreeError::UnknownAddress(addr));
        };
        self.mark_pending(idx, addr)
    }

    /// The `free_requested` of the live block `idx` at `addr`.
    #[inline]
    fn mark_pending(&mut self, idx: u32, addr: u64) -> Result<(), FreeError> {
        let b = &mut self.blocks[idx];
        if b.state == State::Pending {
            return Err(FreeError::DoubleFree(addr));
        }
        b.state = State::Pending;
        let (pool, size, id) = (b.pool, b.size, b.id);
        self.pending += 1;
        self.pending_requested += b.requested;
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if size >= self.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        self.sink.event(Event::FreeRequested { id, addr, callsite: NO_CALLSITE });
        Ok(())
    }

    /// The block's stream work is done: it returns to the cache and merges with free
    /// neighbours. A block completed earlier by a synchronization (`empty_cache`) is accepted.
    pub fn free_completed(&mut self, addr: u64) -> Result<(), FreeError> {
        let Some(idx) = self.live.get(addr) else {
            if !self.completed_by_sync.is_empty() && self.completed_by_sync.remove(&addr) {
                return Ok(());
            }
            return Err(FreeError::UnknownAddress(addr));
        };
        if self.blocks[idx].state != State::Pending {
            return Err(FreeError::NotRequested(addr));
        }
        self.live.remove(addr);
        self.pending -= 1;
        self.pending_requested -= self.blocks[idx].requested;
        self.free_block(idx);
        Ok(())
    }

    /// Completes every pending free (`synchronize_and_free_events`).
    pub(crate) fn synchronize_and_free_events(&mut self) {
        self.stats.num_sync_all_streams += 1;
        self.device.synchronize();
        if self.pending == 0 {
            return;
        }
        let mut pending: Vec<(u64, u32)> =
            self.live.iter().filter(|&(_, i)| self.blocks[i].state == State::Pending).collect();
        pending.sort_unstable();
        for (addr, idx) in pending {
            self.live.remove(addr);
            self.pending -= 1;
            self.pending_requested -= self.blocks[idx].requested;
            self.completed_by_sync.insert(addr);
            self.free_block(idx);
        }
    }

    /// PyTorch `free_block`: back to the free set, merged with free neighbours.
    #[inline]
    pub(crate) fn free_block(&mut self, idx: u32) {
        let b = &mut self.blocks[idx];
        let (id, addr, size, requested, pool, expandable) =
            (b.id, b.addr, b.size, b.requested, b.pool, b.is_expandable());
        b.state = State::Free;
        self.sink.event(Event::FreeCompleted { id, addr });
        let (mut net_blocks, mut net_bytes) = (0i64, 0i64);
        for cand in [self.blocks[idx].prev, self.blocks[idx].next] {
            // Only a free neighbour merges (`idx` is mapped); most neighbours are not.
            if cand != NIL && self.blocks[cand].state == State::Free {
                let subsumed = self.try_merge_blocks(idx, cand);
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_free(idx);
        let b = &self.blocks[idx];
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        let st = &mut self.stats;
        if !expandable {
            apply(&mut st.inactive_split, pool, net_blocks);
            apply(&mut st.inactive_split_bytes, pool, net_bytes);
        }
        st.active.decrease(pool, 1);
        st.active_bytes.decrease(pool, size);
        st.requested_bytes.decrease(pool, requested);
    }

    #[inline(always)]
    pub(crate) fn insert_free(&mut self, idx: u32) {
        let b = &mut self.blocks[idx];
        let sets = &mut self.pools[b.set()];
        b.state = State::Free;
        b.gc_count_base = sets.gc_calls;
        sets.free.insert(b.free_key(idx));
        let owner = b.owner;
        if owner != 0 && self.private[owner as usize - 1].freeable {
            self.freeable_owners.insert(owner);
        }
    }

    /// Merges `src` into `dst` when `src` is a free neighbour in the same mapped state;
    /// returns the bytes absorbed. `dst` must not be in a set.
    #[inline(always)]
    pub(crate) fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let mapped = self.blocks[dst].state != State::Unmapped;
        let s = &self.blocks[src];
        let wanted = if mapped { State::Free } else { State::Unmapped };
        if s.state != wanted {
            return 0;
        }
        let (s_addr, s_size, s_prev, s_next, s_stream) = (s.addr, s.size, s.prev, s.next, s.stream);
        let sets = &mut self.pools[s.set()];
        if mapped {
            sets.free.remove(&(s_stream, s_size, s_addr, src));
        } else {
            sets.unmapped.remove(&(s_stream, s_addr, src));
        }
        let d_addr = self.blocks[dst].addr;
        if self.blocks[dst].prev == src {
            let d = &mut self.blocks[dst];
            d.addr = s_addr;
            d.prev = s_prev;
            if s_prev != NIL {
                self.blocks[s_prev].next = dst;
            }
        } else {
            let d = &mut self.blocks[dst];
            d.next = s_next;
            if s_next != NIL {
                self.blocks[s_next].prev = dst;
            }
        }
        self.blocks[dst].size += s_size;
        self.blocks.remove(src);
        if mapped {
            let (addr, absorbed_addr) = if s_addr < d_addr { (s_addr, d_addr) } else { (d_addr, s_addr) };
            self.sink.event(Event::Merge { addr, absorbed_addr, bytes: self.blocks[dst].size });
        }
        s_size
    }

    // ---- expandable segments ----

    fn try_allocate_expandable_block(&mut self, owner: u32, pool: Pool, stream: u64, rounded: u64) -> Option<u32> {
        let mut cand = self.find_expandable_block(owner, pool, stream, rounded)?;
        if self.blocks[cand].state == State::Unmapped {
            let size = self.blocks[cand].size.min(rounded);
            if !self.map_block(cand, size) {
                return None;
            }
        }
        while self.blocks[cand].size < rounded {
            let remaining = rounded - self.blocks[cand].size;
            let next = self.blocks[cand].next;
            if next == NIL || self.blocks[next].state != State::Unmapped {
                return None;
            }
            if !self.map_block(next, remaining.min(self.blocks[next].size)) {
                return None;
            }
            cand = next;
        }
        let b = &mut self.blocks[cand];
        b.state = State::Taken;
        let (key, set) = (b.free_key(cand), b.set());
        self.pools[set].free.remove(&key);
        Some(cand)
    }

    /// The lowest-address unmapped range of this stream (with the free block before it) with
    /// room for `size`; a new expandable segment when none has.
    fn find_expandable_block(&mut self, owner: u32, pool: Pool, stream: u64, size: u64) -> Option<u32> {
        let allocatable = |blocks: &Arena, i: u32| i != NIL && matches!(blocks[i].state, State::Free | State::Unmapped);
        for &(st, _, idx) in self.pools[set_index(owner, pool)].unmapped.range((stream, 0, 0)..) {
            if st != stream {
                break;
            }
            let mut c = idx;
            if allocatable(&self.blocks, self.blocks[c].prev) {
                c = self.blocks[c].prev;
            }
            let (mut bytes, mut b) = (0u64, c);
            while bytes < size && allocatable(&self.blocks, b) {
                bytes += self.blocks[b].size;
                b = self.blocks[b].next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        let page = page_size(&self.config, pool);
        let total = match self.device.mem_info() {
            Some((_, total)) => total,
            None => self.capacity.unwrap_or(DEFAULT_VA_BYTES / 9 * 8),
        };
        let mut reserve = total + total / 8;
        if self.torch.reserves_expandable_by_setting() {
            reserve = self.config.expandable_segments_reserve(total).unwrap_or(reserve);
        }
        let va_bytes = reserve.div_ceil(page).max(1) * page;
        let base = self.device.reserve_address_space(va_bytes)?;
        let seg = self.expandables.len() as u32;
        self.expandables.push(Some(Expandable { base, bytes: va_bytes }));
        let mut b = Block::new(base, va_bytes, stream, pool, owner, State::Unmapped);
        b.expandable = seg;
        let idx = self.blocks.insert(b);
        self.pools[set_index(owner, pool)].unmapped.insert((stream, base, idx));
        Some(idx)
    }

    /// Maps whole pages covering `[block.addr, block.addr + size)` of an unmapped block, merges
    /// the new range with free neighbours and puts it in the free set.
    fn map_block(&mut self, idx: u32, size: u64) -> bool {
        let b = &self.blocks[idx];
        let (pool, owner, set, stream, addr, seg) = (b.pool, b.owner, b.set(), b.stream, b.addr, b.expandable);
        let base = self.expandables[seg as usize].map_or(addr, |e| e.base);
        let page = page_size(&self.config, pool);
        let end = base + (addr + size - base).div_ceil(page) * page;
        let mapped = (end - addr).min(b.size);
        if mapped == 0 || !self.device.map(addr, mapped, stream) {
            return false;
        }
        self.pools[set].unmapped.remove(&(stream, addr, idx));
        if mapped < self.blocks[idx].size {
            let b = &self.blocks[idx];
            let mut rest = Block::new(addr + mapped, b.size - mapped, stream, pool, owner, State::Unmapped);
            rest.expandable = seg;
            rest.prev = idx;
            rest.next = b.next;
            let r = self.blocks.insert(rest);
            let next = self.blocks[idx].next;
            if next != NIL {
                self.blocks[next].prev = r;
            }
            self.blocks[idx].next = r;
            self.blocks[idx].size = mapped;
            self.pools[set].unmapped.insert((stream, addr + mapped, r));
        }
        self.blocks[idx].state = State::Free;
        self.stats.reserved_bytes.increase(pool, mapped);
        self.stats.num_device_alloc += 1;
        self.sink.event(Event::SegmentMap { addr, bytes: mapped, stream, pool });
        self.name_private_segment(addr, owner);
        let (prev, next) = (self.blocks[idx].prev, self.blocks[idx].next);
        self.try_merge_blocks(idx, prev);
        self.try_merge_blocks(idx, next);
        self.insert_free(idx);
        true
    }

    /// Every cached segment that is wholly free goes back to the device, free expandable
    /// pages are unmapped (`torch.cuda.empty_cache()`). Pending frees complete first.
    pub fn empty_cache(&mut self) -> Released {
        self.release_cached_blocks(ReleaseCause::EmptyCache)
    }
}

#[inline]
fn apply(stat: &mut super::stats::StatArray, pool: Pool, delta: i64) {
    if delta > 0 {
        stat.increase(pool, delta as u64);
    } else if delta < 0 {
        stat.decrease(pool, delta.unsigned_abs());
    }
}
