//! The free set of one pool: PyTorch's `std::set<Block*, BlockComparatorSize>`, ordered by
//! (stream, size, address), as size-segregated bins.
//!
//! A `BTreeSet` of `(stream, size, addr, idx)` tuples cost more than the rest of a cached
//! allocation: every lookup, insert and remove walked nodes comparing four fields. Here each
//! stream has its own [`Bins`] (streams are few; they stay sorted so that whole-set iteration
//! keeps the (stream, size, addr) order), and a block goes to a size class:
//!
//! ```text
//! class = (floor(log2 size), next 4 bits of size)   (a TLSF-style two-level index)
//! sizes [8 KiB, 16 KiB): one class per 512 bytes; [16, 32 MiB): one class per 1 MiB
//! ```
//! Classes are monotone in size, so "smallest size >= n, lowest address among equals" is: a
//! binary search in the class of `n` (each class is a `Vec` sorted by (size, addr)), else the
//! first entry of the next non-empty class, found with two bitmaps. Classes are narrow, so
//! their vectors stay short and inserts and removes move a few entries.

use super::block::FreeKey;

const SUB_BITS: u32 = 4;
const SUBS: usize = 1 << SUB_BITS;
/// Groups of `SUBS` classes: sizes below `SUBS` get group 0 (one class per size), then one
/// group per power of two from `2^SUB_BITS` to `2^63`.
const GROUPS: usize = 64 - SUB_BITS as usize + 1;
const CLASSES: usize = GROUPS * SUBS;

/// The size class of `size`; monotone non-decreasing in `size`.
#[inline]
fn class_of(size: u64) -> usize {
    if size < SUBS as u64 {
        return size as usize;
    }
    let log2 = 63 - size.leading_zeros();
    let sub = (size >> (log2 - SUB_BITS)) as usize & (SUBS - 1);
    ((log2 - SUB_BITS + 1) as usize) << SUB_BITS | sub
}

/// A free block as stored in a class: ordered by (size, addr).
#[derive(Clone, Copy, Debug)]
struct Entry {
    size: u64,
    addr: u64,
    idx: u32,
}

impl Entry {
    #[inline]
    fn below(&self, size: u64, addr: u64) -> bool {
        (self.size, self.addr) < (size, addr)
    }
}

/// The free blocks of one (pool, stream).
#[derive(Debug, Clone)]
struct Bins {
    classes: [Vec<Entry>; CLASSES],
    /// Bit `g` set: group `g` has a non-empty class.
    groups: u64,
    /// Bit `s` of `subs[g]` set: class `g * SUBS + s` is non-empty.
    subs: [u16; GROUPS],
    len: usize,
}

impl Bins {
    fn new() -> Box<Bins> {
        Box::new(Bins { classes: std::array::from_fn(|_| Vec::new()), groups: 0, subs: [0; GROUPS], len: 0 })
    }

    /// The first non-empty class at or after `class`.
    #[inline]
    fn next_class(&self, class: usize) -> Option<usize> {
        if class >= CLASSES {
            return None;
        }
        let (g, s) = (class >> SUB_BITS, class & (SUBS - 1));
        let here = self.subs[g] as u32 & (u32::MAX << s);
        if here != 0 {
            return Some(g << SUB_BITS | here.trailing_zeros() as usize);
        }
        let later = if g + 1 < 64 { self.groups & (u64::MAX << (g + 1)) } else { 0 };
        if later == 0 {
            return None;
        }
        let g = later.trailing_zeros() as usize;
        Some(g << SUB_BITS | (self.subs[g] as u32).trailing_zeros() as usize)
    }

    /// Position of the first entry at or above (size, addr): (class, index in the class).
    #[inline]
    fn lower_bound(&self, size: u64, addr: u64) -> Option<(usize, usize)> {
        let c = class_of(size);
        let v = &self.classes[c];
        let i = v.partition_point(|e| e.below(size, addr));
        if i < v.len() {
            return Some((c, i));
        }
        self.next_class(c + 1).map(|c| (c, 0))
    }

    #[inline(always)]
    fn insert(&mut self, size: u64, addr: u64, idx: u32) {
        let c = class_of(size);
        let v = &mut self.classes[c];
        let e = Entry { size, addr, idx };
        // Classes are narrow: most hold a block or two, and a new block often goes last.
        match v.last() {
            None => {
                v.push(e);
                self.subs[c >> SUB_BITS] |= 1 << (c & (SUBS - 1));
                self.groups |= 1 << (c >> SUB_BITS);
            }
            Some(last) if last.below(size, addr) => v.push(e),
            Some(_) => {
                let i = v.partition_point(|e| e.below(size, addr));
                v.insert(i, e);
            }
        }
        self.len += 1;
    }

    /// Position of (size, addr) when it is in the set.
    #[inline]
    fn position(&self, size: u64, addr: u64, idx: u32) -> Option<(usize, usize)> {
        let c = class_of(size);
        let v = &self.classes[c];
        let i = v.partition_point(|e| e.below(size, addr));
        match v.get(i) {
            Some(e) if e.size == size && e.addr == addr && e.idx == idx => Some((c, i)),
            _ => None,
        }
    }

    /// The largest size held (the last entry of the highest non-empty class).
    #[inline]
    fn largest(&self) -> Option<u64> {
        if self.groups == 0 {
            return None;
        }
        let g = 63 - self.groups.leading_zeros() as usize;
        let s = 31 - (self.subs[g] as u32).leading_zeros() as usize;
        self.classes[g << SUB_BITS | s].last().map(|e| e.size)
    }

    #[inline]
    fn remove_at(&mut self, c: usize, i: usize) {
        let v = &mut self.classes[c];
        if i + 1 == v.len() {
            v.pop();
        } else {
            v.remove(i);
        }
        if v.is_empty() {
            let g = c >> SUB_BITS;
            self.subs[g] &= !(1 << (c & (SUBS - 1)));
            if self.subs[g] == 0 {
                self.groups &= !(1 << g);
            }
        }
        self.len -= 1;
    }
}

/// Where a key is: its stream's slot, its class, its index in the class.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Position {
    slot: usize,
    class: usize,
    pos: usize,
}

/// Ascending iteration over one stream's bins from a position.
pub(crate) struct Iter<'a> {
    stream: u64,
    bins: Option<&'a Bins>,
    class: usize,
    pos: usize,
}

impl Iterator for Iter<'_> {
    type Item = FreeKey;

    #[inline]
    fn next(&mut self) -> Option<FreeKey> {
        let bins = self.bins?;
        loop {
            if let Some(e) = bins.classes[self.class].get(self.pos) {
                self.pos += 1;
                return Some((self.stream, e.size, e.addr, e.idx));
            }
            match bins.next_class(self.class + 1) {
                Some(c) => (self.class, self.pos) = (c, 0),
                None => {
                    self.bins = None;
                    return None;
                }
            }
        }
    }
}

/// The free set of one pool. Keys are [`FreeKey`]s `(stream, size, addr, idx)`, iterated in
/// that order, as the `BTreeSet` it replaces did.
#[derive(Debug, Default, Clone)]
pub(crate) struct FreeSet {
    /// Sorted by stream. Boxed: a `Bins` is 23 KiB, and one pointer leads to a class's `Vec`.
    streams: Vec<(u64, Box<Bins>)>,
}

impl FreeSet {
    /// The slot of `stream`'s bins. Streams are few: a linear scan beats a binary search.
    #[inline(always)]
    fn slot(&self, stream: u64) -> Option<usize> {
        self.streams.iter().position(|s| s.0 == stream)
    }

    #[inline]
    fn bins(&self, stream: u64) -> Option<&Bins> {
        self.slot(stream).map(|i| &*self.streams[i].1)
    }

    #[inline(always)]
    pub fn insert(&mut self, (stream, size, addr, idx): FreeKey) {
        let bins = match self.slot(stream) {
            Some(i) => &mut self.streams[i].1,
            None => {
                let i = self.streams.partition_point(|s| s.0 < stream);
                self.streams.insert(i, (stream, Bins::new()));
                &mut self.streams[i].1
            }
        };
        bins.insert(size, addr, idx);
    }

    /// Removes the key; false when it is not in the set.
    #[inline(always)]
    pub fn remove(&mut self, &(stream, size, addr, idx): &FreeKey) -> bool {
        let Some(slot) = self.slot(stream) else {
            return false;
        };
        let bins = &mut self.streams[slot].1;
        match bins.position(size, addr, idx) {
            Some((c, i)) => {
                bins.remove_at(c, i);
                true
            }
            None => false,
        }
    }

    /// The smallest key of this stream with a size of at least `size` (lowest address among
    /// equals), and where it is, for [`FreeSet::remove_at`].
    #[inline]
    pub fn first_at_least(&self, stream: u64, size: u64) -> Option<(FreeKey, Position)> {
        let slot = self.slot(stream)?;
        let bins = &self.streams[slot].1;
        let (class, pos) = bins.lower_bound(size, 0)?;
        let e = bins.classes[class][pos];
        Some(((stream, e.size, e.addr, e.idx), Position { slot, class, pos }))
    }

    /// Removes the key at `at`, which [`FreeSet::first_at_least`] returned with no change to
    /// the set since.
    #[inline]
    pub fn remove_at(&mut self, at: Position) {
        self.streams[at.slot].1.remove_at(at.class, at.pos);
    }

    /// This stream's keys of at least `size`, ascending (`range((stream, size, 0, 0)..)`
    /// restricted to the stream).
    #[inline]
    pub fn at_least(&self, stream: u64, size: u64) -> Iter<'_> {
        let start = self.bins(stream).and_then(|b| b.lower_bound(size, 0).map(|(c, p)| (b, c, p)));
        match start {
            Some((bins, class, pos)) => Iter { stream, bins: Some(bins), class, pos },
            None => Iter { stream, bins: None, class: 0, pos: 0 },
        }
    }

    /// This stream's keys below `size`, descending (`range(..(stream, size, 0, 0)).rev()`
    /// restricted to the stream). Off the hot path: collects.
    pub fn below_size_rev(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeKey> {
        let mut keys: Vec<FreeKey> = self.at_least(stream, 0).take_while(|k| k.1 < size).collect();
        keys.reverse();
        keys.into_iter()
    }

    /// The size of the largest free block of any stream (0 when none): constant time.
    pub fn largest(&self) -> u64 {
        self.streams.iter().filter_map(|s| s.1.largest()).max().unwrap_or(0)
    }

    /// Every key in (stream, size, addr) order.
    pub fn iter(&self) -> impl Iterator<Item = FreeKey> + '_ {
        self.streams.iter().filter(|s| s.1.len > 0).flat_map(|s| self.at_least(s.0, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Random inserts, removes and lower-bound walks agree with the `BTreeSet` it replaces.
    #[test]
    fn matches_btreeset() {
        let mut rnd = crate::engine::test_rng(0x2545_f491_4f6c_dd1du64);
        let (mut set, mut reference) = (FreeSet::default(), BTreeSet::new());
        for i in 0..20_000u32 {
            let stream = [0, 7, u64::MAX][rnd() as usize % 3];
            let size = match rnd() % 4 {
                0 => 512 * (1 + rnd() % 8),
                1 => 512 * (1 + rnd() % 4096),
                2 => 1 + rnd() % (1 << 40),
                _ => u64::MAX - rnd() % 4,
            };
            // Free blocks never share an address.
            let key = (stream, size, ((rnd() % 64) << 40) | (u64::from(i) * 512), i);
            set.insert(key);
            reference.insert(key);
            if rnd().is_multiple_of(2) {
                let victim = *reference.iter().nth(rnd() as usize % reference.len()).unwrap();
                assert!(set.remove(&victim) && reference.remove(&victim));
                assert!(!set.remove(&victim));
            }
            let (s, n) = (key.0, rnd() % (1 << 41));
            let want: Vec<_> = reference.range((s, n, 0, 0)..).take_while(|k| k.0 == s).take(3).copied().collect();
            assert_eq!(set.at_least(s, n).take(3).collect::<Vec<_>>(), want);
            let first = set.first_at_least(s, n);
            assert_eq!(first.map(|f| f.0), want.first().copied());
            if let (Some((k, at)), 0) = (first, rnd() % 4) {
                set.remove_at(at);
                assert!(reference.remove(&k));
            }
            let below: Vec<_> = reference.range(..(s, n, 0, 0)).rev().take_while(|k| k.0 == s).copied().collect();
            assert_eq!(set.below_size_rev(s, n).collect::<Vec<_>>(), below);
            assert_eq!(set.largest(), reference.iter().map(|k| k.1).max().unwrap_or(0));
        }
        assert!(set.iter().eq(reference.iter().copied()));
    }
}
