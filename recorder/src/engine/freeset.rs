//! The free set of one pool: PyTorch's `std::set<Block*, BlockComparatorSize>`, ordered by
//! (stream, size, address), as size-segregated bins.
//!
//! A `BTreeSet` of `(stream, size, addr, idx)` tuples cost more than the rest of a cached
//! allocation: every lookup, insert and remove walked nodes comparing four fields. Here each
//! stream has its own bins (they stay sorted by stream so that whole-set iteration keeps the
//! (stream, size, addr) order), and a block goes to a size class:
//!
//! ```text
//! class = (floor(log2 size), next 4 bits of size)   (a TLSF-style two-level index)
//! sizes [8 KiB, 16 KiB): one class per 512 bytes; [16, 32 MiB): one class per 1 MiB
//! ```
//! Classes are monotone in size, so "smallest size >= n, lowest address among equals" is: a
//! binary search in the class of `n` (each class is a `Vec` sorted by (size, addr)), else the
//! first entry of the next non-empty class, found with two bitmaps. Classes are narrow, so
//! their vectors stay short and inserts and removes move a few entries.
//!
//! The classes of a stream take 23 KiB, so a stream gets them only once it holds
//! [`FEW_ENTRIES`] free blocks; below that its blocks are one sorted vector, and a stream that
//! has none left gives its slot back (when more than [`KEPT_STREAMS`] streams have slots). A
//! trace can name a new stream in every event: the set then costs what it holds, not the
//! streams it has seen, and finding a stream's slot is a binary search once there are many.

use super::block::FreeKey;
use std::collections::BTreeMap;

const SUB_BITS: u32 = 4;
const SUBS: usize = 1 << SUB_BITS;
/// Groups of `SUBS` classes: sizes below `SUBS` get group 0 (one class per size), then one
/// group per power of two from `2^SUB_BITS` to `2^63`.
const GROUPS: usize = 64 - SUB_BITS as usize + 1;
const CLASSES: usize = GROUPS * SUBS;
/// A stream's free blocks are one sorted vector until it holds this many; then size classes.
const FEW_ENTRIES: usize = 32;
/// Streams that keep their slot (and their classes) when they have no free block left: the
/// streams of a real program, whose free sets empty and refill all the time.
const KEPT_STREAMS: usize = 8;

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

/// The free blocks of one (pool, stream): a sorted vector while they are few, else size
/// classes. Positions are (class, index in the class); the vector is class 0.
#[derive(Debug, Clone)]
enum StreamBins {
    Few(Vec<Entry>),
    Many(Box<Bins>),
}

impl StreamBins {
    fn new() -> StreamBins {
        StreamBins::Few(Vec::new())
    }

    #[inline]
    fn len(&self) -> usize {
        match self {
            StreamBins::Few(v) => v.len(),
            StreamBins::Many(b) => b.len,
        }
    }

    #[inline]
    fn get(&self, class: usize, pos: usize) -> Option<&Entry> {
        match self {
            StreamBins::Few(v) => v.get(pos).filter(|_| class == 0),
            StreamBins::Many(b) => b.classes[class].get(pos),
        }
    }

    #[inline]
    fn next_class(&self, class: usize) -> Option<usize> {
        match self {
            StreamBins::Few(v) => (class == 0 && !v.is_empty()).then_some(0),
            StreamBins::Many(b) => b.next_class(class),
        }
    }

    #[inline]
    fn lower_bound(&self, size: u64, addr: u64) -> Option<(usize, usize)> {
        match self {
            StreamBins::Few(v) => {
                let i = v.partition_point(|e| e.below(size, addr));
                (i < v.len()).then_some((0, i))
            }
            StreamBins::Many(b) => b.lower_bound(size, addr),
        }
    }

    #[inline(always)]
    fn insert(&mut self, size: u64, addr: u64, idx: u32) {
        if let StreamBins::Few(v) = self {
            if v.len() < FEW_ENTRIES {
                let i = v.partition_point(|e| e.below(size, addr));
                v.insert(i, Entry { size, addr, idx });
                return;
            }
            let mut b = Bins::new();
            for e in v.iter() {
                b.insert(e.size, e.addr, e.idx);
            }
            *self = StreamBins::Many(b);
        }
        if let StreamBins::Many(b) = self {
            b.insert(size, addr, idx);
        }
    }

    #[inline]
    fn position(&self, size: u64, addr: u64, idx: u32) -> Option<(usize, usize)> {
        match self {
            StreamBins::Few(v) => {
                let i = v.partition_point(|e| e.below(size, addr));
                match v.get(i) {
                    Some(e) if e.size == size && e.addr == addr && e.idx == idx => Some((0, i)),
                    _ => None,
                }
            }
            StreamBins::Many(b) => b.position(size, addr, idx),
        }
    }

    #[inline]
    fn largest(&self) -> Option<u64> {
        match self {
            StreamBins::Few(v) => v.last().map(|e| e.size),
            StreamBins::Many(b) => b.largest(),
        }
    }

    #[inline]
    fn remove_at(&mut self, c: usize, i: usize) {
        match self {
            StreamBins::Few(v) => {
                v.remove(i);
            }
            StreamBins::Many(b) => b.remove_at(c, i),
        }
    }
}

/// Where a stream's bins are: a kept slot, or the map of further streams.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Kept(usize),
    More(u64),
}

/// Where a key is: its stream's slot, its class, its index in the class.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Position {
    slot: Slot,
    class: usize,
    pos: usize,
}

/// Ascending iteration over one stream's bins from a position.
pub(crate) struct Iter<'a> {
    stream: u64,
    bins: Option<&'a StreamBins>,
    class: usize,
    pos: usize,
}

impl Iterator for Iter<'_> {
    type Item = FreeKey;

    #[inline]
    fn next(&mut self) -> Option<FreeKey> {
        let bins = self.bins?;
        loop {
            if let Some(e) = bins.get(self.class, self.pos) {
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
    /// The first [`KEPT_STREAMS`] streams seen, sorted by stream; they keep their slot.
    streams: Vec<(u64, StreamBins)>,
    /// Any further stream, while it holds a free block.
    more: BTreeMap<u64, StreamBins>,
    /// The sizes held by the further streams, with their counts: their largest in logarithmic
    /// time, whatever their number.
    more_sizes: BTreeMap<u64, u32>,
}

impl FreeSet {
    /// The slot of `stream`'s bins. The kept streams are few: a linear scan beats a search.
    #[inline(always)]
    fn slot(&self, stream: u64) -> Option<Slot> {
        match self.streams.iter().position(|s| s.0 == stream) {
            Some(i) => Some(Slot::Kept(i)),
            None if self.more.contains_key(&stream) => Some(Slot::More(stream)),
            None => None,
        }
    }

    #[inline(always)]
    fn at(&self, slot: Slot) -> &StreamBins {
        match slot {
            Slot::Kept(i) => &self.streams[i].1,
            Slot::More(s) => &self.more[&s],
        }
    }

    #[inline]
    fn bins(&self, stream: u64) -> Option<&StreamBins> {
        self.slot(stream).map(|s| self.at(s))
    }

    /// Removes the key at (class, pos) of the stream at `slot`; a further stream with no free
    /// block left gives its bins back.
    #[inline]
    fn remove_in(&mut self, slot: Slot, class: usize, pos: usize) {
        match slot {
            Slot::Kept(i) => self.streams[i].1.remove_at(class, pos),
            Slot::More(s) => {
                let bins = self.more.get_mut(&s).expect("a slot names a stream in the set");
                let size = bins.get(class, pos).expect("a position names an entry").size;
                bins.remove_at(class, pos);
                if let std::collections::btree_map::Entry::Occupied(mut n) = self.more_sizes.entry(size) {
                    *n.get_mut() -= 1;
                    if *n.get() == 0 {
                        n.remove();
                    }
                }
                if bins.len() == 0 {
                    self.more.remove(&s);
                }
            }
        }
    }

    #[inline(always)]
    pub fn insert(&mut self, (stream, size, addr, idx): FreeKey) {
        let bins = match self.streams.iter().position(|s| s.0 == stream) {
            Some(i) => &mut self.streams[i].1,
            None if self.streams.len() < KEPT_STREAMS => {
                let i = self.streams.partition_point(|s| s.0 < stream);
                self.streams.insert(i, (stream, StreamBins::new()));
                &mut self.streams[i].1
            }
            None => {
                *self.more_sizes.entry(size).or_default() += 1;
                self.more.entry(stream).or_insert_with(StreamBins::new)
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
        match self.at(slot).position(size, addr, idx) {
            Some((c, i)) => {
                self.remove_in(slot, c, i);
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
        let bins = self.at(slot);
        let (class, pos) = bins.lower_bound(size, 0)?;
        let e = bins.get(class, pos).expect("a lower bound is an entry");
        Some(((stream, e.size, e.addr, e.idx), Position { slot, class, pos }))
    }

    /// Removes the key at `at`, which [`FreeSet::first_at_least`] returned with no change to
    /// the set since.
    #[inline]
    pub fn remove_at(&mut self, at: Position) {
        self.remove_in(at.slot, at.class, at.pos);
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

    /// The size of the largest free block of any stream (0 when none): constant time per
    /// kept stream, logarithmic for the others.
    pub fn largest(&self) -> u64 {
        let kept = self.streams.iter().filter_map(|s| s.1.largest()).max();
        kept.max(self.more_sizes.last_key_value().map(|(&size, _)| size)).unwrap_or(0)
    }

    /// True when no stream holds a free block.
    pub fn is_empty(&self) -> bool {
        self.more.is_empty() && self.streams.iter().all(|s| s.1.len() == 0)
    }

    /// Every key in (stream, size, addr) order.
    pub fn iter(&self) -> impl Iterator<Item = FreeKey> + '_ {
        let mut order: Vec<u64> = self.streams.iter().filter(|s| s.1.len() > 0).map(|s| s.0).collect();
        if !self.more.is_empty() {
            order.extend(self.more.keys());
            order.sort_unstable();
        }
        order.into_iter().flat_map(|s| self.at_least(s, 0))
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
            // Three busy streams, and more than KEPT_STREAMS quiet ones (vectors and maps).
            let stream = match rnd() % 4 {
                0 => 100 + rnd() % 40,
                k => [0, 7, u64::MAX][k as usize - 1],
            };
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
        for k in reference {
            assert!(set.remove(&k));
        }
        assert!(
            set.is_empty() && set.more.is_empty() && set.more_sizes.is_empty(),
            "emptied streams past the kept ones give their bins back"
        );
    }

    /// One block on each of 100,000 streams costs a few dozen bytes a stream, not a stream's
    /// 23 KiB of size classes, and finding a stream stays a search.
    #[test]
    fn a_stream_per_block_costs_what_it_holds() {
        let mut set = FreeSet::default();
        for i in 0..100_000u32 {
            set.insert((u64::from(i) << 8, 512, u64::from(i) << 20, i));
        }
        let classes = set.streams.iter().filter(|s| matches!(s.1, StreamBins::Many(_))).count()
            + set.more.values().filter(|b| matches!(b, StreamBins::Many(_))).count();
        assert_eq!(classes, 0, "no stream holds enough blocks for size classes");
        assert_eq!(set.iter().count(), 100_000);
        for i in 0..100_000u32 {
            assert!(set.first_at_least(u64::from(i) << 8, 1).is_some());
            assert!(set.remove(&(u64::from(i) << 8, 512, u64::from(i) << 20, i)));
        }
        assert!(set.is_empty() && set.more.is_empty());
    }
}
