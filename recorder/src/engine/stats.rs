//! `torch.cuda.memory_stats()`: the same counters, updated at the same moments.

use crate::trace::Pool;
use serde::Serialize;

/// One statistic: `increase` raises `current` (and `peak`, `allocated`), `decrease` lowers
/// `current` and raises `freed`.
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }

    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        self.current -= amount;
        self.freed += amount;
    }

    /// `reset_peak_memory_stats`.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// A statistic for all memory and for each pool (`.all`, `.small_pool`, `.large_pool`).
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray {
    pub all: Stat,
    pub small_pool: Stat,
    pub large_pool: Stat,
}

impl StatArray {
    #[inline]
    pub fn increase(&mut self, pool: Pool, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(pool).increase(amount);
    }

    #[inline]
    pub fn decrease(&mut self, pool: Pool, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(pool).decrease(amount);
    }

    pub fn pool(&self, pool: Pool) -> &Stat {
        match pool {
            Pool::Small => &self.small_pool,
            Pool::Large => &self.large_pool,
        }
    }

    #[inline]
    fn pool_mut(&mut self, pool: Pool) -> &mut Stat {
        match pool {
            Pool::Small => &mut self.small_pool,
            Pool::Large => &mut self.large_pool,
        }
    }

    fn reset_peak(&mut self) {
        self.all.reset_peak();
        self.small_pool.reset_peak();
        self.large_pool.reset_peak();
    }
}

/// The allocator's statistics, named as in `torch.cuda.memory_stats()`.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Live allocations (count), changed at alloc / free_requested.
    pub allocation: StatArray,
    /// `cudaMalloc` segments (expandable memory is not counted).
    pub segment: StatArray,
    /// Allocated or pending-free blocks, changed at alloc / free_completed.
    pub active: StatArray,
    /// Free blocks inside split (partly used) segments, expandable memory excluded.
    pub inactive_split: StatArray,
    /// Bytes of allocated blocks (rounded block sizes), changed at alloc / free_requested.
    pub allocated_bytes: StatArray,
    /// Bytes obtained from the device: segment alloc/free, page map/unmap.
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    /// Bytes the program asked for (unrounded), changed at alloc / free_completed.
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    /// Last-resort retries: release every cached segment, then allocate again.
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_sync_all_streams: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// Device allocations refused at once because they would pass the memory fraction
    /// (PyTorch 2.12 and later, with `throw_on_cudamalloc_oom:True`).
    pub num_oom_rejections: u64,
}

impl Stats {
    /// `torch.cuda.reset_peak_memory_stats`.
    pub fn reset_peak(&mut self) {
        for s in [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ] {
            s.reset_peak();
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut a = StatArray::default();
        a.increase(Pool::Small, 10);
        a.increase(Pool::Large, 5);
        a.decrease(Pool::Small, 10);
        assert_eq!(a.all, Stat { current: 5, peak: 15, allocated: 15, freed: 10 });
        assert_eq!(a.small_pool, Stat { current: 0, peak: 10, allocated: 10, freed: 10 });
        assert_eq!(a.pool(Pool::Large).current, 5);
        a.reset_peak();
        assert_eq!(a.all.peak, 5);
    }
}
