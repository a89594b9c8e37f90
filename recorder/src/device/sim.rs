//! The simulated device: capacity-limited, deterministic addresses, optional address hints.
//!
//! Segments come from a first-fit address allocator starting at [`SEGMENT_BASE`], 2 MiB
//! aligned; address-space reservations (expandable segments) from another at [`VA_BASE`].
//! Physical memory (segments plus mapped pages) may not exceed the capacity.
//!
//! **Hints** reproduce a recorded run's addresses, and with them its lowest-address
//! tie-breaks. `with_segment_hints` takes the recorded `(addr, bytes)` segment allocations in
//! order. Rule: `alloc_segment(bytes)` looks at the first [`HINT_LOOKAHEAD`] queued hints and
//! takes the first one of the same size whose range is free (it leaves the queue); hints it
//! passed over stay queued, so a replay that allocates an extra segment or skips one falls
//! back into step. With no usable hint the segment comes from the first-fit allocator in a
//! region above every hinted address, so fallback and hinted segments never collide.
//! `with_reserve_hints` does the same for reservations, by address only (sizes differ
//! between a real GPU and a replay).

use super::Device;
use std::collections::{BTreeMap, VecDeque};

/// Where segments start without hints.
pub const SEGMENT_BASE: u64 = 0x7f00_0000_0000;
/// Where address-space reservations start.
pub const VA_BASE: u64 = 0x2_0000_0000;
/// Alignment of every address handed out.
pub const ALIGN: u64 = 2 << 20;
/// How many queued hints `alloc_segment` considers.
pub const HINT_LOOKAHEAD: usize = 16;

/// A capacity-limited device with deterministic addresses.
#[derive(Debug, Default, Clone)]
pub struct SimDevice {
    capacity: Option<u64>,
    used: u64,
    segments: BTreeMap<u64, u64>,
    reservations: BTreeMap<u64, u64>,
    segment_hints: VecDeque<(u64, u64)>,
    reserve_hints: VecDeque<u64>,
    fallback_base: u64,
    /// No segment fits below this address above `fallback_base`: every hole there was filled
    /// (none has opened since), so first fit starts here. Without it, a trace that keeps a
    /// segment per stream (one stream per allocation) paid a walk of every live segment for
    /// each new one.
    packed: u64,
    /// The same for reservations, above [`VA_BASE`].
    packed_va: u64,
    /// Segments placed at a hinted address.
    pub hints_used: u64,
    /// Segments placed by the fallback allocator while hints were given.
    pub hints_missed: u64,
    /// Recorded events and whether a query has seen them: a simulated stream finishes its
    /// work between the first query of an event and the second, so callers see both states.
    events: BTreeMap<u64, bool>,
    next_event: u64,
}

impl SimDevice {
    /// A device with `capacity` bytes of physical memory; `None` = unlimited.
    pub fn new(capacity: Option<u64>) -> Self {
        SimDevice { capacity, fallback_base: SEGMENT_BASE, ..Default::default() }
    }

    /// Recorded segment allocations `(addr, bytes)` in order; see the module documentation.
    pub fn with_segment_hints(mut self, hints: Vec<(u64, u64)>) -> Self {
        let top = hints.iter().map(|&(a, b)| a + b).max().unwrap_or(0);
        self.fallback_base = self.fallback_base.max(top.div_ceil(1 << 30) << 30);
        self.segment_hints = hints.into();
        self
    }

    /// Recorded base addresses of expandable segments' reservations, in order.
    pub fn with_reserve_hints(mut self, hints: Vec<u64>) -> Self {
        self.reserve_hints = hints.into();
        self
    }

    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }
    /// Physical bytes in use: segments plus mapped pages.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }
    /// Live segments `(addr, bytes)` in address order.
    pub fn live_segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segments.iter().map(|(&a, &b)| (a, b))
    }

    fn fits(&self, bytes: u64) -> bool {
        self.capacity.is_none_or(|c| self.used + bytes <= c)
    }

    fn range_is_free(&self, addr: u64, bytes: u64) -> bool {
        let clash = |m: &BTreeMap<u64, u64>| m.range(..addr + bytes).next_back().is_some_and(|(&a, &b)| a + b > addr);
        !clash(&self.segments) && !clash(&self.reservations)
    }
}

/// Lowest `ALIGN`ed address at or above `base` where `bytes` fit between the ranges of `live`,
/// and the start of the first hole the walk passed (too small for `bytes`), if any.
fn first_fit(live: &BTreeMap<u64, u64>, base: u64, bytes: u64) -> (u64, Option<u64>) {
    let mut cursor = base;
    let mut first_hole = None;
    if let Some((&a, &b)) = live.range(..base).next_back() {
        cursor = cursor.max((a + b).div_ceil(ALIGN) * ALIGN);
    }
    for (&a, &b) in live.range(base..) {
        if a >= cursor + bytes {
            break;
        }
        if a > cursor && first_hole.is_none() {
            first_hole = Some(cursor);
        }
        cursor = cursor.max((a + b).div_ceil(ALIGN) * ALIGN);
    }
    (cursor, first_hole)
}

impl Device for SimDevice {
    fn record_event(&mut self, _stream: u64) -> Option<u64> {
        self.next_event += 1;
        self.events.insert(self.next_event, false);
        Some(self.next_event)
    }

    fn event_done(&mut self, event: u64) -> bool {
        match self.events.get_mut(&event) {
            Some(seen) => std::mem::replace(seen, true),
            None => true,
        }
    }

    fn wait_event(&mut self, event: u64) {
        if let Some(seen) = self.events.get_mut(&event) {
            *seen = true;
        }
    }

    fn destroy_event(&mut self, event: u64) {
        self.events.remove(&event);
    }

    fn alloc_segment(&mut self, bytes: u64, _stream: u64) -> Option<u64> {
        if bytes == 0 || !self.fits(bytes) {
            return None;
        }
        let hinted =
            self.segment_hints.iter().take(HINT_LOOKAHEAD).position(|&(a, b)| b == bytes && self.range_is_free(a, b));
        let addr = match hinted {
            Some(i) => {
                self.hints_used += 1;
                self.segment_hints.remove(i).map(|(a, _)| a)?
            }
            None => {
                if !self.segment_hints.is_empty() {
                    self.hints_missed += 1;
                }
                let (addr, hole) = first_fit(&self.segments, self.fallback_base.max(self.packed), bytes);
                self.packed = hole.unwrap_or((addr + bytes).div_ceil(ALIGN) * ALIGN);
                addr
            }
        };
        self.segments.insert(addr, bytes);
        self.used += bytes;
        Some(addr)
    }

    fn free_segment(&mut self, addr: u64, bytes: u64) {
        if self.segments.remove(&addr).is_some() {
            self.packed = self.packed.min(addr);
            self.used -= bytes;
        }
    }

    fn reserve_address_space(&mut self, bytes: u64) -> Option<u64> {
        let addr = match self.reserve_hints.pop_front() {
            Some(a) if self.range_is_free(a, bytes) => a,
            _ => {
                let (addr, hole) = first_fit(&self.reservations, VA_BASE.max(self.packed_va), bytes);
                self.packed_va = hole.unwrap_or((addr + bytes).div_ceil(ALIGN) * ALIGN);
                addr
            }
        };
        self.reservations.insert(addr, bytes);
        Some(addr)
    }

    fn release_address_space(&mut self, addr: u64, _bytes: u64) {
        if self.reservations.remove(&addr).is_some() {
            self.packed_va = self.packed_va.min(addr);
        }
    }

    fn map(&mut self, _addr: u64, bytes: u64, _stream: u64) -> bool {
        if !self.fits(bytes) {
            return false;
        }
        self.used += bytes;
        true
    }

    fn unmap(&mut self, _addr: u64, bytes: u64) {
        self.used -= bytes.min(self.used);
    }

    fn mem_info(&mut self) -> Option<(u64, u64)> {
        self.capacity.map(|c| (c.saturating_sub(self.used), c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn first_fit_is_deterministic_and_reuses_holes() {
        let mut d = SimDevice::new(Some(100 * MIB));
        let a = d.alloc_segment(20 * MIB, 0).unwrap();
        let b = d.alloc_segment(2 * MIB, 0).unwrap();
        assert_eq!(a, SEGMENT_BASE);
        assert_eq!(b, SEGMENT_BASE + 20 * MIB);
        d.free_segment(a, 20 * MIB);
        assert_eq!(d.alloc_segment(4 * MIB, 0), Some(SEGMENT_BASE));
        assert_eq!(d.used_bytes(), 6 * MIB);
    }

    /// Starting past the filled prefix places every segment where a walk from the base would.
    #[test]
    fn first_fit_from_the_filled_prefix_matches_a_walk_from_the_base() {
        let mut rnd = crate::engine::test_rng(0x9e37_79b9_7f4a_7c15);
        let mut d = SimDevice::new(None);
        let mut live: Vec<(u64, u64)> = Vec::new();
        for _ in 0..5000 {
            if !live.is_empty() && rnd().is_multiple_of(3) {
                let (a, b) = live.swap_remove(rnd() as usize % live.len());
                d.free_segment(a, b);
                continue;
            }
            let bytes = [2, 4, 20, 6][rnd() as usize % 4] * MIB;
            let want = first_fit(&d.segments, SEGMENT_BASE, bytes).0;
            let got = d.alloc_segment(bytes, 0).unwrap();
            assert_eq!(got, want);
            live.push((got, bytes));
            let va_bytes = [2, 8][rnd() as usize % 2] * MIB;
            let want = first_fit(&d.reservations, VA_BASE, va_bytes).0;
            let va = d.reserve_address_space(va_bytes).unwrap();
            assert_eq!(va, want);
            if rnd().is_multiple_of(2) {
                d.release_address_space(va, va_bytes);
            }
        }
    }

    #[test]
    fn capacity_limits_segments_and_maps() {
        let mut d = SimDevice::new(Some(10 * MIB));
        assert!(d.alloc_segment(8 * MIB, 0).is_some());
        assert!(d.alloc_segment(4 * MIB, 0).is_none());
        let va = d.reserve_address_space(1 << 30).unwrap();
        assert!(!d.map(va, 4 * MIB, 0));
        assert!(d.map(va, 2 * MIB, 0));
        assert_eq!(d.mem_info(), Some((0, 10 * MIB)));
        d.unmap(va, 2 * MIB);
        assert_eq!(d.mem_info(), Some((2 * MIB, 10 * MIB)));
    }

    #[test]
    fn hints_are_used_by_size_and_skipped_when_they_do_not_fit() {
        let hints = vec![(0x7f10_0000_0000, 20 * MIB), (0x7f00_0000_0000, 2 * MIB), (0x7f20_0000_0000, 20 * MIB)];
        let mut d = SimDevice::new(None).with_segment_hints(hints);
        // 2 MiB: the first hint has another size, the second matches.
        assert_eq!(d.alloc_segment(2 * MIB, 0), Some(0x7f00_0000_0000));
        assert_eq!(d.alloc_segment(20 * MIB, 0), Some(0x7f10_0000_0000));
        // No 12 MiB hint: fallback region above all hints.
        let f = d.alloc_segment(12 * MIB, 0).unwrap();
        assert!(f >= 0x7f20_0000_0000 + 20 * MIB);
        assert_eq!(d.hints_missed, 1);
        // A hint that overlaps a live segment is not used.
        let mut d =
            SimDevice::new(None).with_segment_hints(vec![(0x7f00_0000_0000, 4 * MIB), (0x7f00_0000_0000, 4 * MIB)]);
        assert_eq!(d.alloc_segment(4 * MIB, 0), Some(0x7f00_0000_0000));
        assert_ne!(d.alloc_segment(4 * MIB, 0), Some(0x7f00_0000_0000));
    }

    #[test]
    fn reserve_hints() {
        let mut d = SimDevice::new(None).with_reserve_hints(vec![0x3_0000_0000]);
        assert_eq!(d.reserve_address_space(1 << 30), Some(0x3_0000_0000));
        assert_eq!(d.reserve_address_space(1 << 30), Some(VA_BASE));
    }
}
