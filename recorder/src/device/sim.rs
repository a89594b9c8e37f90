//! The simulated device: capacity-limited, deterministic addresses, optional address hints.
//!
//! Segments go where the CUDA driver put them in the real runs (the `placement` module): a
//! segment that fits in no free run of the driver's 32 MiB-rounded ranges opens a new range at
//! the top of the highest free stretch below the top (the first range at
//! `SEGMENT_BASE - round_up(bytes, 32 MiB)`, or where a hint put it), later ones fill the
//! ranges' free runs lowest first, and a range whose segments are all freed goes back. Address-space reservations
//! (expandable segments) come from a first-fit allocator starting at [`VA_BASE`], 2 MiB aligned.
//! Physical memory (segments plus mapped pages) may not exceed the capacity.
//!
//! **Hints** reproduce a recorded run's addresses, and with them its lowest-address
//! tie-breaks. `with_segment_hints` takes the recorded `(addr, bytes)` segment allocations in
//! order. Rule: `alloc_segment(bytes)` looks at the first [`HINT_LOOKAHEAD`] queued hints and
//! takes the first one of the same size whose range is free (it leaves the queue); hints it
//! passed over stay queued, so a replay that allocates an extra segment or skips one falls
//! back into step. With no usable hint the segment goes where the driver would have put it,
//! given the segments placed so far, hinted ones included, and clear of the ranges of the
//! hints still queued: the recorded run's segments went there, and the replay's segments that
//! match them will ask for them later (segments of a caching allocator live long, so a segment
//! placed now is likely still there when any later hint comes up, not only one in the
//! look-ahead). Where no place clear of them turns up within [`KEEP_OFF_TRIES`] tries, it goes
//! where the driver would have put it regardless. It never overlaps a live segment.
//! `with_reserve_hints` does the same for reservations, by address only (sizes differ
//! between a real GPU and a replay).

use super::placement::Placement;
use super::Device;
use std::collections::{BTreeMap, VecDeque};

/// The top of the address space segments are placed below when no hint placed one before.
pub const SEGMENT_BASE: u64 = 0x7f00_0000_0000;
/// Where address-space reservations start.
pub const VA_BASE: u64 = 0x2_0000_0000;
/// Alignment of every address handed out.
pub const ALIGN: u64 = 2 << 20;
/// How many queued hints `alloc_segment` considers.
pub const HINT_LOOKAHEAD: usize = 16;
/// How many places a predicted segment tries before it gives up keeping off queued hints: a
/// bound on the cost per segment (each try is `O(log n)`). The real runs' replays need 122 at
/// most.
pub const KEEP_OFF_TRIES: usize = 256;

/// The address ranges of queued hints, which may overlap: the lowest start of one that
/// overlaps a given range in `O(log n)`. Every hint is known when the device is made and only
/// leaves afterwards, so the ranges sit in one array sorted by `(start, end)`, under a max tree
/// of their ends laid out in an array (an end of 0 is a range that left): a query walks
/// contiguous memory.
#[derive(Debug, Clone, Default)]
struct HintRanges {
    /// The ranges' starts, sorted (with their ends): leaf `i` of `tree`.
    starts: std::sync::Arc<[u64]>,
    /// `tree[width + i]` is range `i`'s end (0 once it left), and each node above holds the
    /// larger of its two children's; `tree[1]` is the root.
    tree: Vec<u64>,
    width: usize,
    /// The first leaf of each `(start, end)` not yet taken: equal ranges leave in any order.
    next: std::collections::HashMap<(u64, u64), usize>,
    /// The walks down made over these ranges (emptied when one leaves).
    walks: super::placement::WalkMemo,
}

impl HintRanges {
    fn new(hints: &[(u64, u64)]) -> Self {
        let mut ranges: Vec<(u64, u64)> = hints.iter().map(|&(a, b)| (a, a.saturating_add(b))).collect();
        ranges.sort_unstable();
        let width = ranges.len().next_power_of_two();
        let mut tree = vec![0; 2 * width];
        let mut next = std::collections::HashMap::new();
        for (i, &(start, end)) in ranges.iter().enumerate() {
            tree[width + i] = end;
            next.entry((start, end)).or_insert(i);
        }
        for i in (1..width).rev() {
            tree[i] = tree[2 * i].max(tree[2 * i + 1]);
        }
        HintRanges { starts: ranges.iter().map(|&(s, _)| s).collect(), tree, width, next, walks: Default::default() }
    }

    fn remove(&mut self, addr: u64, bytes: u64) {
        let end = addr.saturating_add(bytes);
        let Some(i) = self.next.get_mut(&(addr, end)) else { return };
        if self.starts.get(*i) != Some(&addr) || self.tree[self.width + *i] != end {
            return; // every range of this start and end has left
        }
        let mut node = self.width + *i;
        *i += 1;
        self.tree[node] = 0;
        self.walks.clear();
        while node > 1 {
            node /= 2;
            self.tree[node] = self.tree[2 * node].max(self.tree[2 * node + 1]);
        }
    }

    /// Whether a range overlaps `[from, to)`: if so, the lowest start of one that does, and the
    /// highest end of those that start below `to` (past `from`): `[from, to)` clears them all
    /// once below the one or above the other.
    #[cfg(test)]
    fn clash(&self, from: u64, to: u64) -> Option<(u64, u64)> {
        use super::placement::KeepOff;
        self.lowest_overlapping(from, to).map(|lowest| (lowest, self.max_end_before(to)))
    }
}

impl super::placement::KeepOff for HintRanges {
    fn lowest_overlapping(&self, from: u64, to: u64) -> Option<u64> {
        // The lowest-starting range that ends past `from`: down the left side while it holds one.
        if self.tree.get(1).is_none_or(|&m| m <= from) {
            return None;
        }
        let mut node = 1;
        while node < self.width {
            node = if self.tree[2 * node] > from { 2 * node } else { 2 * node + 1 };
        }
        let lowest = self.starts[node - self.width];
        (lowest < to).then_some(lowest)
    }

    fn walks(&self) -> Option<&super::placement::WalkMemo> {
        Some(&self.walks)
    }

    fn max_end_before(&self, to: u64) -> u64 {
        // Leaves `[0, n)` start below `to`: the maximum over that prefix, bottom up.
        let n = self.starts.partition_point(|&s| s < to);
        let (mut lo, mut hi, mut best) = (self.width, self.width + n, 0);
        while lo < hi {
            if lo & 1 == 1 {
                best = best.max(self.tree[lo]);
                lo += 1;
            }
            if hi & 1 == 1 {
                hi -= 1;
                best = best.max(self.tree[hi]);
            }
            lo /= 2;
            hi /= 2;
        }
        best
    }
}

/// A capacity-limited device with deterministic addresses.
#[derive(Debug, Default, Clone)]
pub struct SimDevice {
    capacity: Option<u64>,
    used: u64,
    segments: BTreeMap<u64, u64>,
    reservations: BTreeMap<u64, u64>,
    segment_hints: VecDeque<(u64, u64)>,
    /// The ranges of the queued segment hints, which a predicted segment keeps off.
    kept_off: HintRanges,
    reserve_hints: VecDeque<u64>,
    /// The driver's ranges, which place every segment no hint places.
    placement: Placement,
    /// No reservation fits below this address above [`VA_BASE`]: every hole there was filled
    /// (none has opened since), so first fit starts here. Without it, a trace that keeps a
    /// reservation per stream paid a walk of every live one for each new one.
    packed_va: u64,
    /// Segments placed at a hinted address.
    pub hints_used: u64,
    /// Segments placed by the fallback allocator while hints were given.
    pub hints_missed: u64,
    /// Segments no hint placed (placed by the driver's rule, [`Placement`]), hints queued or not.
    pub placed_by_rule: u64,
    /// Recorded events and whether a query has seen them: a simulated stream finishes its
    /// work between the first query of an event and the second, so callers see both states.
    events: BTreeMap<u64, bool>,
    next_event: u64,
}

impl SimDevice {
    /// A device with `capacity` bytes of physical memory; `None` = unlimited.
    pub fn new(capacity: Option<u64>) -> Self {
        SimDevice { capacity, ..Default::default() }
    }

    /// Recorded segment allocations `(addr, bytes)` in order; see the module documentation.
    pub fn with_segment_hints(mut self, hints: Vec<(u64, u64)>) -> Self {
        self.kept_off = HintRanges::new(&hints);
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
        !overlaps(&self.segments, addr, bytes) && !overlaps(&self.reservations, addr, bytes)
    }

    /// A place above every segment and clear of reservations, for when the driver's rule finds
    /// none (the address space below ran out, or a reservation is in the way).
    fn above_everything(&self, bytes: u64) -> Option<u64> {
        let highest = self.segments.last_key_value().map_or(SEGMENT_BASE, |(&a, &b)| a.saturating_add(b));
        let mut at = highest.max(SEGMENT_BASE).checked_next_multiple_of(ALIGN)?;
        while let Some((&a, &b)) = self.reservations.range(..at.checked_add(bytes)?).next_back() {
            if a + b <= at {
                break;
            }
            at = (a + b).checked_next_multiple_of(ALIGN)?;
        }
        Some(at)
    }
}

/// Whether `[addr, addr + bytes)` overlaps a range of `live` (or runs past the address space).
fn overlaps(live: &BTreeMap<u64, u64>, addr: u64, bytes: u64) -> bool {
    let Some(end) = addr.checked_add(bytes) else { return true };
    live.range(..end).next_back().is_some_and(|(&a, &b)| a + b > addr)
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
                let (a, b) = self.segment_hints.remove(i)?;
                self.kept_off.remove(a, b);
                a
            }
            None => {
                if !self.segment_hints.is_empty() {
                    self.hints_missed += 1;
                }
                // Keep off the ranges of the hints still queued: the recorded run's segments
                // went there, and the replay's will ask for them.
                let kept_off = &self.kept_off;
                let clear = (!self.segment_hints.is_empty())
                    .then(|| self.placement.predict_clear(bytes, SEGMENT_BASE, KEEP_OFF_TRIES, kept_off))
                    .flatten();
                let predicted = clear.or_else(|| self.placement.predict(bytes, SEGMENT_BASE));
                debug_assert!(
                    predicted.is_none_or(|a| !overlaps(&self.segments, a, bytes)),
                    "the driver's rule put {bytes} bytes at {predicted:x?} over a live segment"
                );
                predicted.filter(|&a| self.range_is_free(a, bytes)).or_else(|| self.above_everything(bytes))?
            }
        };
        debug_assert!(self.range_is_free(addr, bytes), "a segment of {bytes} bytes at {addr:#x} overlaps another");
        self.segments.insert(addr, bytes);
        self.placed_by_rule += u64::from(hinted.is_none());
        self.placement.place(&self.segments, addr, bytes, hinted.is_none());
        self.used += bytes;
        Some(addr)
    }

    fn free_segment(&mut self, addr: u64, bytes: u64) {
        if let Some(placed) = self.segments.remove(&addr) {
            self.placement.free(&self.segments, addr, placed);
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

    /// The hint ranges' answers against a walk of every queued range, as ranges leave in
    /// any order (equal ones included).
    #[test]
    fn hint_ranges_against_a_list() {
        let mut rnd = crate::engine::test_rng(0x9e37_79b9_7f4a_7c15);
        for n in [0usize, 1, 2, 3, 7, 64, 300] {
            let mut queued: Vec<(u64, u64)> = (0..n).map(|_| ((rnd() % 200) * 2, 2 + (rnd() % 40) * 2)).collect();
            let mut h = HintRanges::new(&queued);
            loop {
                for _ in 0..50 {
                    let from = rnd() % 500;
                    let to = from + 1 + rnd() % 60;
                    let overlapping = queued.iter().filter(|&&(a, b)| a < to && a + b > from);
                    let want = overlapping.map(|&(a, _)| a).min().map(|lowest| {
                        let top = queued.iter().filter(|&&(a, _)| a < to).map(|&(a, b)| a + b).max().unwrap();
                        (lowest, top)
                    });
                    assert_eq!(h.clash(from, to), want, "[{from}, {to}) against {queued:?}");
                }
                if queued.is_empty() {
                    break;
                }
                let (a, b) = queued.swap_remove((rnd() % queued.len() as u64) as usize);
                h.remove(a, b);
                // A range never queued, or one whose every copy left, changes nothing.
                h.remove(a + 1, b);
            }
        }
    }

    /// The walks down that the hint ranges remember give what a walk made afresh gives, through
    /// every try count (the walk's tries come out of the same count as the others'), as the
    /// ranges change (a range leaving forgets them) and the placement fills.
    #[test]
    fn remembered_walks_answer_as_fresh_ones() {
        struct Fresh<'a>(&'a HintRanges);
        impl super::super::placement::KeepOff for Fresh<'_> {
            fn lowest_overlapping(&self, from: u64, to: u64) -> Option<u64> {
                self.0.lowest_overlapping(from, to)
            }
            fn max_end_before(&self, to: u64) -> u64 {
                self.0.max_end_before(to)
            }
        }
        let mut rnd = crate::engine::test_rng(0x6a09_e667_f3bc_c908);
        let top = SEGMENT_BASE;
        let mut queued: Vec<(u64, u64)> =
            (0..120).map(|_| (top - (1 + rnd() % 400) * 2 * MIB, (1 + rnd() % 24) * 2 * MIB)).collect();
        let mut h = HintRanges::new(&queued);
        let mut segments = BTreeMap::new();
        let mut placement = Placement::default();
        let (mut placed, mut none) = (0, 0);
        for round in 0..200 {
            let asks: Vec<(u64, usize)> = (0..8)
                .map(|_| ((1 + rnd() % 40) * 2 * MIB, [1usize, 2, 3, 8, 40, KEEP_OFF_TRIES][(rnd() % 6) as usize]))
                .collect();
            // The same questions before and after a queued range leaves: what was remembered
            // over the ranges before must not answer after.
            for leaves in [false, true] {
                if leaves && !queued.is_empty() {
                    let (a, b) = queued.swap_remove((rnd() % queued.len() as u64) as usize);
                    h.remove(a, b);
                }
                for &(bytes, tries) in &asks {
                    let fresh = placement.predict_clear(bytes, top, tries, &Fresh(&h));
                    // Twice: made (or remembered from before), then remembered.
                    assert_eq!(placement.predict_clear(bytes, top, tries, &h), fresh, "round {round}");
                    assert_eq!(placement.predict_clear(bytes, top, tries, &h), fresh, "round {round}, remembered");
                    if fresh.is_some() {
                        placed += 1;
                    } else {
                        none += 1;
                    }
                }
            }
            // The placement fills and empties.
            let bytes = (1 + rnd() % 16) * 2 * MIB;
            if let Some(a) = placement.predict(bytes, top).filter(|&a| !overlaps(&segments, a, bytes)) {
                segments.insert(a, bytes);
                placement.place(&segments, a, bytes, true);
            }
            if round % 3 == 0 && !segments.is_empty() {
                let k = *segments.keys().nth((rnd() % segments.len() as u64) as usize).unwrap();
                let b = segments.remove(&k).unwrap();
                placement.free(&segments, k, b);
            }
        }
        // Both ends were met: a place found, and the tries running out or the space below.
        assert!(placed > 100 && none > 100, "{placed} placed, {none} not");
    }

    #[test]
    fn placement_is_deterministic_and_reuses_holes() {
        let t = SEGMENT_BASE;
        let mut d = SimDevice::new(Some(100 * MIB));
        // 20 MiB opens a 32 MiB range below the top; 2 MiB fills its free tail.
        let a = d.alloc_segment(20 * MIB, 0).unwrap();
        let b = d.alloc_segment(2 * MIB, 0).unwrap();
        assert_eq!(a, t - 32 * MIB);
        assert_eq!(b, t - 12 * MIB);
        // The range keeps the 2 MiB segment: the hole the 20 left is its lowest free run.
        d.free_segment(a, 20 * MIB);
        assert_eq!(d.alloc_segment(4 * MIB, 0), Some(t - 32 * MIB));
        assert_eq!(d.used_bytes(), 6 * MIB);
    }

    /// Reservations: starting past the filled prefix places every one where a walk from the
    /// base would.
    #[test]
    fn reservations_from_the_filled_prefix_match_a_walk_from_the_base() {
        let mut rnd = crate::engine::test_rng(0x9e37_79b9_7f4a_7c15);
        let mut d = SimDevice::new(None);
        let mut live: Vec<(u64, u64)> = Vec::new();
        for _ in 0..5000 {
            if !live.is_empty() && rnd().is_multiple_of(3) {
                let (a, b) = live.swap_remove(rnd() as usize % live.len());
                d.release_address_space(a, b);
                continue;
            }
            let va_bytes = [2, 8, 20, 6][rnd() as usize % 4] * MIB;
            let want = first_fit(&d.reservations, VA_BASE, va_bytes).0;
            let va = d.reserve_address_space(va_bytes).unwrap();
            assert_eq!(va, want);
            live.push((va, va_bytes));
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
        // No 12 MiB hint: the driver's rule puts it in the free tail of the first hinted
        // segment's 32 MiB range, clear of the hint still queued.
        let f = d.alloc_segment(12 * MIB, 0).unwrap();
        assert_eq!(f, 0x7f00_0000_0000 + 2 * MIB);
        assert_eq!(d.hints_missed, 1);
        // A hint that overlaps a live segment is not used.
        let mut d =
            SimDevice::new(None).with_segment_hints(vec![(0x7f00_0000_0000, 4 * MIB), (0x7f00_0000_0000, 4 * MIB)]);
        assert_eq!(d.alloc_segment(4 * MIB, 0), Some(0x7f00_0000_0000));
        assert_ne!(d.alloc_segment(4 * MIB, 0), Some(0x7f00_0000_0000));
    }

    /// The study's `Chunked` model (`scripts/study/driver_placement/model.py`), line for line:
    /// a walk of every range for each segment.
    #[derive(Default)]
    struct Chunked {
        ranges: BTreeMap<u64, (u64, BTreeMap<u64, u64>)>,
        top: Option<u64>,
        blocked: BTreeMap<u64, u64>,
        range_of: BTreeMap<u64, u64>,
    }

    impl Chunked {
        fn predict(&self, b: u64) -> u64 {
            for (&s, (e, segs)) in &self.ranges {
                let mut cur = s;
                for (&a, &bb) in segs.iter().chain(std::iter::once((e, &0))) {
                    if a > cur && a - cur >= b {
                        return cur;
                    }
                    cur = cur.max(a + bb);
                }
            }
            let r = b.next_multiple_of(32 * MIB);
            let mut cur = self.top.unwrap_or(SEGMENT_BASE);
            let mut occ: Vec<(u64, u64)> = self
                .ranges
                .iter()
                .map(|(&s, (e, _))| (s, *e))
                .chain(self.blocked.iter().map(|(&s, &e)| (s, e)))
                .collect();
            occ.sort();
            for &(s, e) in occ.iter().rev() {
                if e > cur {
                    cur = cur.min(s);
                    continue;
                }
                if cur - e >= r {
                    return cur - r;
                }
                cur = s;
            }
            cur - r
        }
        fn place(&mut self, a: u64, b: u64) {
            for (&s, (e, segs)) in self.ranges.iter_mut() {
                if s <= a && a < *e {
                    segs.insert(a, b);
                    self.range_of.insert(a, s);
                    *e = (*e).max(a + b);
                    return;
                }
            }
            let mut e = a + b.next_multiple_of(32 * MIB);
            let nxt = self.ranges.keys().chain(self.blocked.keys()).filter(|&&s| s > a).min().copied();
            if let Some(n) = nxt {
                e = e.min(n);
            }
            e = e.max(a + b);
            self.ranges.insert(a, (e, BTreeMap::from([(a, b)])));
            self.range_of.insert(a, a);
            match (self.top, nxt) {
                (None, _) => self.top = Some(e),
                (Some(t), _) if e > t => self.top = Some(e),
                (_, Some(n)) if n > e => {
                    self.blocked.insert(e, n);
                }
                _ => {}
            }
        }
        fn free(&mut self, a: u64) {
            let s = self.range_of.remove(&a).unwrap();
            let segs = &mut self.ranges.get_mut(&s).unwrap().1;
            segs.remove(&a);
            if segs.is_empty() {
                self.ranges.remove(&s);
            }
        }
    }

    /// With no hints, every segment goes where the study's model puts it.
    #[test]
    fn segments_go_where_the_studys_model_puts_them() {
        for seed in [1u64, 0x9e37_79b9_7f4a_7c15, 42] {
            let mut rnd = crate::engine::test_rng(seed);
            let mut d = SimDevice::new(None);
            let mut m = Chunked::default();
            let mut live: Vec<(u64, u64)> = Vec::new();
            for _ in 0..3000 {
                if !live.is_empty() && rnd() % 5 < 2 {
                    let (a, b) = live.swap_remove(rnd() as usize % live.len());
                    d.free_segment(a, b);
                    m.free(a);
                } else {
                    let bytes = [2, 2, 2, 4, 10, 20, 22, 36, 62, 100, 296][rnd() as usize % 11] * MIB;
                    let want = m.predict(bytes);
                    let got = d.alloc_segment(bytes, 0).unwrap();
                    assert_eq!(got, want, "{bytes} bytes");
                    m.place(got, bytes);
                    live.push((got, bytes));
                }
                d.placement.check(&d.segments);
            }
        }
    }

    #[test]
    fn the_first_segment_opens_a_range_below_the_base_and_later_ones_fill_it() {
        let mut d = SimDevice::new(None);
        let t = SEGMENT_BASE;
        let a = d.alloc_segment(20 * MIB, 0).unwrap();
        assert_eq!(a, t - 32 * MIB);
        assert_eq!(d.alloc_segment(8 * MIB, 0), Some(t - 12 * MIB));
        let c = d.alloc_segment(40 * MIB, 0).unwrap();
        assert_eq!(c, t - 96 * MIB);
        d.free_segment(a, 20 * MIB);
        d.free_segment(t - 12 * MIB, 8 * MIB);
        assert_eq!(d.alloc_segment(30 * MIB, 0), Some(t - 32 * MIB));
        assert_eq!(d.alloc_segment(24 * MIB, 0), Some(c + 40 * MIB));
    }

    /// Hinted and predicted segments mixed, hints anywhere (in ranges, across them, in held
    /// stretches): no overlap, and the model's trees agree with a walk of its ranges.
    #[test]
    fn hinted_and_predicted_segments_never_overlap() {
        for seed in [7u64, 0x2545_f491_4f6c_dd1d, 99] {
            let mut rnd = crate::engine::test_rng(seed);
            let sizes = [2, 2, 4, 20, 22, 36, 62];
            let hints: Vec<(u64, u64)> = (0..4000)
                .map(|_| (SEGMENT_BASE - (rnd() % 400) * 2 * MIB, sizes[rnd() as usize % sizes.len()] * MIB))
                .collect();
            let mut d = SimDevice::new(None).with_segment_hints(hints);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for _ in 0..4000 {
                if !live.is_empty() && rnd() % 5 < 2 {
                    let (a, b) = live.swap_remove(rnd() as usize % live.len());
                    d.free_segment(a, b);
                } else {
                    let bytes = sizes[rnd() as usize % sizes.len()] * MIB;
                    let a = d.alloc_segment(bytes, 0).unwrap();
                    assert!(live.iter().all(|&(x, y)| a + bytes <= x || x + y <= a));
                    live.push((a, bytes));
                }
                d.placement.check(&d.segments);
            }
            assert!(d.hints_used > 100 && d.hints_missed > 100, "{} {}", d.hints_used, d.hints_missed);
        }
    }

    /// A segment no hint places keeps off the ranges of the hints still queued, beyond the
    /// look-ahead too, and a later one of their size finds its hint free.
    #[test]
    fn predicted_segments_keep_off_queued_hints() {
        let t = SEGMENT_BASE;
        let mut hints = vec![(t - 32 * MIB, 20 * MIB)];
        hints.extend((0..HINT_LOOKAHEAD).map(|i| (t - 64 * MIB - i as u64 * 32 * MIB, 2 * MIB)));
        hints.push((t - 12 * MIB, 8 * MIB));
        let mut d = SimDevice::new(None).with_segment_hints(hints);
        assert_eq!(d.alloc_segment(20 * MIB, 0), Some(t - 32 * MIB));
        // The driver's rule puts 8 MiB in the tail of the 20's range at `t - 12`: a hint's,
        // past the look-ahead. Then a range below the lowest, at `t - 64`: a 2 MiB hint's. It
        // goes below that.
        assert_eq!(d.alloc_segment(8 * MIB, 0), Some(t - 72 * MIB));
        for _ in 0..HINT_LOOKAHEAD {
            d.alloc_segment(2 * MIB, 0).unwrap();
        }
        assert_eq!(d.alloc_segment(8 * MIB, 0), Some(t - 12 * MIB));
        assert_eq!((d.hints_used, d.hints_missed), (2 + HINT_LOOKAHEAD as u64, 1));
        d.placement.check(&d.segments);
    }

    #[test]
    fn reserve_hints() {
        let mut d = SimDevice::new(None).with_reserve_hints(vec![0x3_0000_0000]);
        assert_eq!(d.reserve_address_space(1 << 30), Some(0x3_0000_0000));
        assert_eq!(d.reserve_address_space(1 << 30), Some(VA_BASE));
    }
}
