//! Maps keyed by a trace's allocation ids, and the one hasher they share.
//!
//! Writers number allocations one after another (`1, 2, 3, ...`). [`IdHasher`] keeps the eight
//! ids of one group of eight in order in the low bits of the hash, where a hash table takes its
//! bucket, and hashes the group (a multiply, as Fx does). A fold over millions of live
//! allocations then costs one cache miss per eight inserts instead of one each, and ids that
//! are not in sequence are still spread over the table.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A map from allocation id.
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A set of allocation ids.
pub type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// The hasher of [`IdMap`] and [`IdSet`] (see the module's documentation).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    #[inline]
    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }

    /// Only `u64` keys are hashed here; other input is folded in, for completeness.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    /// The group's product, bit-reversed so that its best-mixed (top) bits come low, where the
    /// table takes its bucket, with the id's place in its group below them; the place also
    /// goes into the top bits, where the table keeps a tag of each entry, so that the eight of
    /// a group have eight tags.
    #[inline]
    fn finish(&self) -> u64 {
        let place = self.0 & 7;
        let group = (self.0 >> 3).wrapping_mul(K).reverse_bits();
        ((group & !7) | place) ^ (place << 57)
    }
}

/// The call site of each live allocation, by id. Call site 0 (none recorded) is not kept, so a
/// trace without call sites keeps nothing per allocation.
#[derive(Default, Debug, Clone)]
pub struct CallsiteOf(IdMap<u32>);

impl CallsiteOf {
    #[inline]
    pub fn alloc(&mut self, id: u64, callsite: u32) {
        if callsite != 0 {
            self.0.insert(id, callsite);
        } else {
            self.free(id);
        }
    }

    #[inline]
    pub fn free(&mut self, id: u64) {
        if !self.0.is_empty() {
            self.0.remove(&id);
        }
    }

    /// The call site of live allocation `id`, 0 where none was recorded.
    #[inline]
    pub fn get(&self, id: u64) -> u32 {
        self.0.get(&id).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// Ids in sequence keep their order within a group of eight; groups are spread, and the
    /// top bits (which the table compares first) differ between groups.
    #[test]
    fn groups_of_eight_side_by_side_and_groups_spread() {
        let h = |id: u64| BuildHasherDefault::<IdHasher>::default().hash_one(id);
        let low = |h: u64| h & ((1 << 57) - 1);
        for g in 0..1000u64 {
            let tags: std::collections::HashSet<u64> = (0..8).map(|k| h(g * 8 + k) >> 57).collect();
            assert_eq!(tags.len(), 8);
            for k in 1..8 {
                assert_eq!(low(h(g * 8 + k)), low(h(g * 8)) + k);
            }
        }
        // Random bucket choices would leave about 2,589 of 4,096 buckets distinct.
        let mut buckets: Vec<u64> = (0..4096u64).map(|g| h(g * 8) >> 3 & 0xfff).collect();
        buckets.sort_unstable();
        buckets.dedup();
        assert!(buckets.len() > 2500, "4096 groups over 4096 buckets of eight: {} distinct", buckets.len());
        let mut top: Vec<u64> = (0..4096u64).map(|g| h(g * 8) >> 57).collect();
        top.sort_unstable();
        top.dedup();
        assert_eq!(top.len(), 128);
    }

    #[test]
    fn call_sites_of_live_allocations() {
        let mut c = CallsiteOf::default();
        c.alloc(1, 0);
        assert!(c.0.is_empty(), "nothing kept for an allocation without a call site");
        c.alloc(2, 7);
        c.alloc(3, 0);
        assert_eq!((c.get(1), c.get(2), c.get(3)), (0, 7, 0));
        // An id written again (a trace that reuses one) takes its latest call site.
        c.alloc(2, 0);
        assert_eq!(c.get(2), 0);
        c.alloc(4, 9);
        c.free(4);
        assert_eq!(c.get(4), 0);
    }

    #[test]
    fn a_map_of_ids_is_a_map() {
        let mut m: IdMap<u64> = IdMap::default();
        for id in (0..100_000u64).map(|k| k * 7919 % 100_003) {
            m.insert(id, id * 2);
        }
        assert_eq!(m.len(), 100_000);
        assert!((0..100_000u64).map(|k| k * 7919 % 100_003).all(|id| m[&id] == id * 2));
    }
}
