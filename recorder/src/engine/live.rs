//! Live blocks by address: an open-addressing table from a device address to its arena index.
//!
//! Every cached allocation inserts one entry and every free removes one, so this table is on the
//! hot path twice per pair. A general hash map spends more there than needed (SIMD group probes,
//! tombstones, generic hashing); device addresses are distinct multiples of 512 and the values
//! are `u32`s, so a linear-probing table of `(address, index)` slots does with a multiply, a
//! shift and, after a removal, a backward shift of the run behind it (no tombstones).
//!
//! The eight 512-byte addresses of one 4 KiB window share a home bucket of eight slots (two
//! cache lines), each at its own offset in it; the window is hashed. Blocks carved one after
//! another from a segment then land side by side, so millions of them live at once cost one
//! cache miss per window rather than one per block.
//!
//! ```text
//! bucket = ((addr >> 12) * 0x9e3779b97f4a7c15) >> (64 - log2(slots))   (low 3 bits cleared)
//! slot   = bucket | ((addr >> 9) & 7)                                   load factor <= 1/2
//! ```

use super::block::NIL;

/// Marks an empty slot: no allocation has this address (it is not a multiple of 512).
const EMPTY: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
struct Slot {
    addr: u64,
    idx: u32,
}

const VACANT: Slot = Slot { addr: EMPTY, idx: NIL };

/// Address → arena index of the allocated and pending-free blocks.
#[derive(Debug, Clone)]
pub(crate) struct LiveMap {
    slots: Box<[Slot]>,
    /// `64 - log2(slots.len())`.
    shift: u32,
    len: usize,
}

impl Default for LiveMap {
    fn default() -> Self {
        LiveMap::with_log2(6)
    }
}

impl LiveMap {
    fn with_log2(log2: u32) -> LiveMap {
        LiveMap { slots: vec![VACANT; 1 << log2].into_boxed_slice(), shift: 64 - log2, len: 0 }
    }

    #[inline]
    fn home(&self, addr: u64) -> usize {
        let bucket = ((addr >> 12).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize & !7;
        bucket | ((addr >> 9) & 7) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The slot holding `addr`, if any.
    #[inline]
    fn find(&self, addr: u64) -> Option<usize> {
        if addr == EMPTY {
            // The marker of an empty slot is no address: a free of it must not "find" one.
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let s = self.slots[i];
            if s.addr == addr {
                return Some(i);
            }
            if s.addr == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<u32> {
        self.find(addr).map(|i| self.slots[i].idx)
    }

    /// Inserts or replaces `addr`'s index.
    #[inline]
    pub fn insert(&mut self, addr: u64, idx: u32) {
        debug_assert_ne!(addr, EMPTY);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let s = &mut self.slots[i];
            if s.addr == EMPTY {
                *s = Slot { addr, idx };
                self.len += 1;
                return;
            }
            if s.addr == addr {
                s.idx = idx;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes `addr`, returning its index. The entries after it in its probe run move back to
    /// close the gap, so lookups never need tombstones.
    #[inline(always)]
    pub fn remove(&mut self, addr: u64) -> Option<u32> {
        let mut hole = self.find(addr)?;
        let idx = self.slots[hole].idx;
        let mask = self.mask();
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let s = self.slots[i];
            if s.addr == EMPTY {
                break;
            }
            // `s` may fill the hole when its home is not cyclically within (hole, i].
            let home = self.home(s.addr);
            if (i.wrapping_sub(home) & mask) >= (i.wrapping_sub(hole) & mask) {
                self.slots[hole] = s;
                hole = i;
            }
        }
        self.slots[hole] = VACANT;
        self.len -= 1;
        Some(idx)
    }

    #[cold]
    fn grow(&mut self) {
        let log2 = 64 - self.shift + 1;
        let old = std::mem::replace(self, LiveMap::with_log2(log2));
        for s in old.slots.iter().filter(|s| s.addr != EMPTY) {
            self.insert(s.addr, s.idx);
        }
    }

    /// Every (address, index), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots.iter().filter(|s| s.addr != EMPTY).map(|s| (s.addr, s.idx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// `map` holds exactly the entries of `reference`.
    fn assert_holds(map: &LiveMap, reference: HashMap<u64, u32>) {
        let mut all: Vec<_> = map.iter().collect();
        all.sort_unstable();
        let mut want: Vec<_> = reference.into_iter().collect();
        want.sort_unstable();
        assert_eq!(all, want);
    }

    /// Random inserts, removes and lookups agree with a `HashMap`, through growth and with
    /// addresses that collide on their home slot.
    #[test]
    fn matches_hashmap() {
        let mut rnd = crate::engine::test_rng(0x9e37_79b9_7f4a_7c15u64);
        let (mut map, mut reference) = (LiveMap::default(), HashMap::new());
        for step in 0..200_000u32 {
            // Few distinct addresses (512-byte multiples in a small range) so that removals hit.
            let addr = (rnd() % 4096) * 512 + if step % 3 == 0 { 1 << 40 } else { 0 };
            match rnd() % 3 {
                0 | 1 if reference.len() < 3000 => {
                    map.insert(addr, step);
                    reference.insert(addr, step);
                }
                _ => assert_eq!(map.remove(addr), reference.remove(&addr)),
            }
            let probe = (rnd() % 4096) * 512;
            assert_eq!(map.get(probe), reference.get(&probe).copied());
            assert_eq!(map.get(EMPTY), None);
            assert_eq!(map.remove(EMPTY), None, "the empty-slot marker is never a key");
            assert_eq!(map.len(), reference.len());
        }
        assert_holds(&map, reference);
    }

    /// Addresses side by side (blocks carved in turn from segments) and addresses that share
    /// their place in a bucket (4 KiB-aligned blocks), inserted and removed in shuffled order.
    #[test]
    fn dense_and_aligned_addresses() {
        let mut rnd = crate::engine::test_rng(7);
        let (mut map, mut reference) = (LiveMap::default(), HashMap::new());
        let mut addrs: Vec<u64> = (0..20_000u64).map(|k| (1 << 30) | (k * 512)).collect();
        addrs.extend((0..20_000u64).map(|k| (1 << 40) | (k * 4096)));
        addrs.extend((0..2_000u64).map(|k| (1 << 45) | (k << 21)));
        for (n, &a) in addrs.iter().enumerate() {
            map.insert(a, n as u32);
            reference.insert(a, n as u32);
        }
        for k in (1..addrs.len()).rev() {
            let j = (rnd() % (k as u64 + 1)) as usize;
            addrs.swap(k, j);
        }
        for (n, &a) in addrs.iter().enumerate() {
            if n % 2 == 0 {
                assert_eq!(map.remove(a), reference.remove(&a));
            }
            assert_eq!(map.get(addrs[n / 2]), reference.get(&addrs[n / 2]).copied());
        }
        assert_eq!(map.len(), reference.len());
        assert_holds(&map, reference);
    }
}
