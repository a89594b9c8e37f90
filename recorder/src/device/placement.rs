//! Where the CUDA driver puts a segment that no recorded address places: a model of its
//! virtual-address ranges, as the real runs show them (`scripts/study/driver_placement/`).
//!
//! 1. A segment that fits in no free run of a range opens a range of `round_up(bytes, 32 MiB)`
//!    ([`RANGE_BYTES`]) at the top of the highest free stretch of address space below the top
//!    (the highest end of a range opened so far), and sits at its bottom; below the lowest
//!    range when no stretch holds it.
//! 2. Otherwise it takes the lowest free run inside a range that holds it: ranges in address
//!    order, each filled from the bottom up.
//! 3. A range whose segments are all freed goes back to the free address space.
//! 4. A segment at a known address (a recorded one) outside every range opens a range there,
//!    its size rounded up the same way and cut short at the next range. Where that range ends
//!    below the top and short of the next one, the stretch between is taken as held by
//!    allocations the trace does not show (the driver's own) and is not used.
//!
//! Worked example, in MiB below the top `T`: 20 opens `[T-32, T)` and sits at `T-32`; 8 fills
//! that range's tail at `T-12`; 40 fits in no run (4 MiB are left) and opens `[T-96, T-32)`
//! below the lowest range, at `T-96`; freeing the 20 and the 8 gives `[T-32, T)` back; 30 fits
//! in no run (the 40's range has 24 MiB left) and the highest free stretch that holds 32 is
//! `[T-32, T)`: it goes to `T-32`.
//!
//! Cost: the free runs inside ranges and the free stretches between them are kept in two trees
//! keyed by address that know the largest entry below each node ([`MaxTree`]), so placing or
//! freeing a segment costs `O(log n)` in the live segments and ranges.

use super::sim::ALIGN;
use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};

/// The granularity of the driver's ranges.
pub const RANGE_BYTES: u64 = 32 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A range the driver opened for segments, with how many are live in it.
    Segments(u64),
    /// Address space taken as held by something the trace does not show.
    Held,
}

fn align_down(x: u64) -> u64 {
    x / ALIGN * ALIGN
}

/// The driver's ranges and where the next segment goes (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Disjoint ranges: start -> (end, kind). Every live segment lies inside one `Segments`
    /// range, and every `Segments` range holds one at least.
    ranges: BTreeMap<u64, (u64, Kind)>,
    /// The top of the address space known to be free below it; never lowered.
    top: Option<u64>,
    /// Free runs inside `Segments` ranges: the run's start (the range's start or a segment's
    /// end) -> bytes usable from its start rounded up to [`ALIGN`]. Only runs with some.
    holes: MaxTree,
    /// Free stretches between ranges, and between the highest and the top: the end of the
    /// range below -> bytes from there to the next range's start (or the top) rounded down to
    /// [`ALIGN`]. Only stretches with some.
    gaps: MaxTree,
}

/// Address ranges a predicted segment keeps off ([`Placement::predict_clear`]).
pub trait KeepOff {
    /// The lowest start of a range that overlaps `[from, to)`, if one does.
    fn lowest_overlapping(&self, from: u64, to: u64) -> Option<u64>;
    /// The highest end of the ranges that start below `to` (0 if none): `[from, to)` overlaps
    /// one exactly when this lies above `from`.
    fn max_end_before(&self, to: u64) -> u64;
    /// Where the walks down from a candidate ended, for ranges that change less often than
    /// they are asked: a walk reads nothing else, so while the ranges stay the same it ends the
    /// same way. `None`: no such memory.
    fn walks(&self) -> Option<&WalkMemo> {
        None
    }
}

/// How a walk down from a candidate ended ([`Placement::predict_clear`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkEnd {
    /// A place clear of the ranges.
    Clear(u64),
    /// The next place down lies below the floor: this candidate has none.
    Blocked,
    /// The address space ran out above a place.
    Overflow,
    /// No end within the tries allowed.
    Unfinished,
}

/// Walks down already made over one set of ranges, keyed by `(start, floor, bytes, tries)`, with
/// how each ended and the tries it took ([`KeepOff::walks`]). Its owner empties it whenever
/// its ranges change. A copy starts empty: it is a memory of answers, not state.
#[derive(Debug, Default)]
pub struct WalkMemo(std::sync::Mutex<std::collections::HashMap<WalkKey, (WalkEnd, usize)>>);

/// A walk's start, floor, bytes and tries allowed.
type WalkKey = (u64, u64, u64, usize);

/// A memory of walks stops growing past this many, and starts again.
const WALK_MEMO_MAX: usize = 1 << 14;

impl WalkMemo {
    pub fn clear(&mut self) {
        self.0.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
    }
    fn get(&self, key: &WalkKey) -> Option<(WalkEnd, usize)> {
        self.0.lock().ok()?.get(key).copied()
    }
    fn put(&self, key: WalkKey, value: (WalkEnd, usize)) {
        if let Ok(mut m) = self.0.lock() {
            if m.len() >= WALK_MEMO_MAX {
                m.clear();
            }
            m.insert(key, value);
        }
    }
}

impl Clone for WalkMemo {
    fn clone(&self) -> Self {
        WalkMemo::default()
    }
}

/// The walk down from `p` of [`Placement::predict_clear`]: a place for `bytes` that clashes
/// with a range moves below the lowest start of those it overlaps, and no further than
/// `floor`. Each place looked at takes one try; `tries` bounds them (the end is then
/// [`WalkEnd::Unfinished`], counted as one try more than allowed). Remembered in `keep`'s
/// [`KeepOff::walks`] where it has one.
fn walk_down(keep: &impl KeepOff, start: u64, floor: u64, bytes: u64, tries: usize) -> (WalkEnd, usize) {
    let key = (start, floor, bytes, tries);
    if let Some(known) = keep.walks().and_then(|m| m.get(&key)) {
        return known;
    }
    let mut p = start;
    let mut taken = 0;
    let end = loop {
        if taken == tries {
            break (WalkEnd::Unfinished, tries + 1);
        }
        taken += 1;
        let Some(to) = p.checked_add(bytes) else { break (WalkEnd::Overflow, taken) };
        let Some(s) = keep.lowest_overlapping(p, to) else { break (WalkEnd::Clear(p), taken) };
        match align_down(s).checked_sub(bytes).map(align_down).filter(|&q| q >= floor && q < p) {
            Some(q) => p = q,
            None => break (WalkEnd::Blocked, taken),
        }
    };
    if let Some(m) = keep.walks() {
        m.put(key, end);
    }
    end
}

impl Placement {
    /// Where a segment of `bytes` goes; `None` when the address space below runs out.
    /// `first_top` is the top when nothing was ever placed.
    pub fn predict(&self, bytes: u64, first_top: u64) -> Option<u64> {
        if let Some((start, _)) = self.holes.leftmost_at_least(bytes) {
            return start.checked_next_multiple_of(ALIGN);
        }
        let range = bytes.checked_next_multiple_of(RANGE_BYTES)?;
        if let Some((from, usable)) = self.gaps.rightmost_at_least(range) {
            return Some(from + usable - range);
        }
        align_down(self.bottom(first_top)).checked_sub(range)
    }

    /// The bottom of the ranges: a segment that fits in no free run or stretch opens a range
    /// below it. `first_top` when nothing was ever placed.
    fn bottom(&self, first_top: u64) -> u64 {
        self.ranges.first_key_value().map(|(&s, _)| s).or(self.top).unwrap_or(first_top)
    }

    /// Where a segment of `bytes` goes when it must keep off some address ranges as well as
    /// the live segments: the first candidate in the order of [`predict`](Self::predict) (free
    /// runs lowest first, then free stretches highest first, then below the lowest range) that
    /// clears the ranges of `keep`. A candidate that overlaps one moves past it (up in a free
    /// run, past the highest end of those starting below its end; down in a stretch, below the
    /// lowest start of those it overlaps) and is tried again. `None` when no candidate cleared
    /// them within `tries` tries, or the address space ran out: the caller falls back to
    /// [`predict`](Self::predict).
    pub fn predict_clear(&self, bytes: u64, first_top: u64, tries: usize, keep: &impl KeepOff) -> Option<u64> {
        let left = std::cell::Cell::new(tries);
        let ask = || -> Option<()> {
            left.set(left.get().checked_sub(1)?);
            Some(())
        };
        let mut hole = self.holes.leftmost_at_least(bytes);
        while let Some((start, usable)) = hole {
            let end = start.checked_next_multiple_of(ALIGN)? + usable;
            let mut p = start.checked_next_multiple_of(ALIGN)?;
            while let Some(q) = p.checked_add(bytes).filter(|&q| q <= end) {
                ask()?;
                // `[p, q)` overlaps a range exactly when one starting below `q` ends past `p`.
                let e = keep.max_end_before(q);
                if e <= p {
                    return Some(p);
                }
                p = e.max(p + 1).checked_next_multiple_of(ALIGN)?;
            }
            hole = self.holes.leftmost_at_least_after(start, bytes);
        }
        let range = bytes.checked_next_multiple_of(RANGE_BYTES)?;
        // A range opened with its segment at `p` that clashes moves down until its segment ends
        // below the clash, and no further than `floor` ([`walk_down`]); its tries come out of
        // the same count.
        let down = |p: u64, floor: u64| -> Option<Option<u64>> {
            let (end, taken) = walk_down(keep, p, floor, bytes, tries);
            left.set(left.get().checked_sub(taken)?);
            match end {
                WalkEnd::Clear(p) => Some(Some(p)),
                WalkEnd::Blocked => Some(None),
                WalkEnd::Overflow | WalkEnd::Unfinished => None,
            }
        };
        let mut gap = self.gaps.rightmost_at_least(range);
        while let Some((from, usable)) = gap {
            if let Some(p) = down(from + usable - range, from)? {
                return Some(p);
            }
            gap = self.gaps.rightmost_at_least_before(from, range);
        }
        down(align_down(self.bottom(first_top)).checked_sub(range)?, 0)?
    }

    /// Records a segment placed at `addr` (predicted or recorded). `segments` holds every live
    /// segment, this one included; `[addr, addr + bytes)` overlaps none of the others.
    /// `predicted`: the address came from this model, which chose it in free space, so the
    /// stretch above a range it opens is free rather than held by the driver (rule 4).
    pub fn place(&mut self, segments: &BTreeMap<u64, u64>, addr: u64, bytes: u64, predicted: bool) {
        let end = addr.saturating_add(bytes);
        let holder = self
            .ranges
            .range(..=addr)
            .next_back()
            .filter(|(_, &(e, k))| addr < e && matches!(k, Kind::Segments(_)))
            .map(|(&s, _)| s);
        let opened = holder.is_none();
        let start = match holder {
            Some(s) => s,
            None => {
                // A held stretch that a recorded segment lands in was not held after all.
                if let Some((&s, &(e, Kind::Held))) = self.ranges.range(..=addr).next_back() {
                    if addr < e {
                        self.ranges.remove(&s);
                        if s < addr {
                            self.ranges.insert(s, (addr, Kind::Held));
                        }
                        if e > end {
                            self.ranges.insert(end, (e, Kind::Held));
                        }
                    }
                }
                let next = self.ranges.range(addr..).next().map(|(&s, _)| s);
                let mut e = addr.saturating_add(bytes.checked_next_multiple_of(RANGE_BYTES).unwrap_or(u64::MAX));
                if let Some(n) = next {
                    e = e.min(n);
                }
                self.ranges.insert(addr, (e.max(end), Kind::Segments(0)));
                addr
            }
        };
        // The range takes the segment and grows to hold it, taking in what it now overlaps.
        let (mut e, mut live) = match self.ranges[&start] {
            (e, Kind::Segments(n)) => (e.max(end), n + 1),
            (_, Kind::Held) => unreachable!("a segment's range is never held"),
        };
        while let Some((&s, &(se, k))) = self.ranges.range((Excluded(start), Unbounded)).next() {
            if s >= e {
                break;
            }
            self.ranges.remove(&s);
            match k {
                Kind::Held if se > e => {
                    self.ranges.insert(e, (se, Kind::Held));
                }
                Kind::Held => {}
                Kind::Segments(n) => {
                    live += n;
                    e = e.max(se);
                }
            }
        }
        self.ranges.insert(start, (e, Kind::Segments(live)));
        let mut gaps_to = e;
        if opened {
            match self.top {
                Some(top) if e <= top && !predicted => {
                    let next = self.ranges.range((Excluded(start), Unbounded)).next().map(|(&s, _)| s);
                    if let Some(n) = next.filter(|&n| n > e) {
                        self.ranges.insert(e, (n, Kind::Held));
                        gaps_to = n;
                    }
                }
                Some(top) if e <= top => {}
                _ => self.top = Some(e),
            }
        }
        let prev_segment_end = segments.range(..addr).next_back().map_or(0, |(&a, &b)| a.saturating_add(b));
        self.refresh_holes(segments, prev_segment_end.max(start), end);
        let prev_range_end = self.ranges.range(..start).next_back().map_or(start, |(_, &(pe, _))| pe);
        self.refresh_gaps(prev_range_end.min(start), gaps_to);
    }

    /// Records that the segment at `addr` is freed; `segments` no longer holds it.
    pub fn free(&mut self, segments: &BTreeMap<u64, u64>, addr: u64, bytes: u64) {
        let Some((&start, &(e, Kind::Segments(live)))) = self.ranges.range(..=addr).next_back() else {
            debug_assert!(false, "a freed segment at {addr:#x} outside every range");
            return;
        };
        let prev_segment_end = segments.range(..addr).next_back().map_or(0, |(&a, &b)| a.saturating_add(b));
        if live > 1 {
            self.ranges.insert(start, (e, Kind::Segments(live - 1)));
        } else {
            self.ranges.remove(&start);
            let prev_range_end = self.ranges.range(..start).next_back().map_or(start, |(_, &(pe, _))| pe);
            self.refresh_gaps(prev_range_end.min(start), e);
        }
        self.refresh_holes(segments, prev_segment_end.max(start), addr.saturating_add(bytes));
    }

    /// Recomputes the free runs that start in `[lo, hi]`. Callers pass a window with a segment
    /// or two in it, so this costs `O(log n)`.
    fn refresh_holes(&mut self, segments: &BTreeMap<u64, u64>, lo: u64, hi: u64) {
        while let Some(k) = self.holes.first_at_or_after(lo).filter(|&k| k <= hi) {
            self.holes.remove(k);
        }
        let mut starts: Vec<u64> = Vec::with_capacity(4);
        starts.extend(self.ranges.range(lo..=hi).filter(|(_, (_, k))| matches!(k, Kind::Segments(_))).map(|(&s, _)| s));
        let ends = segments.range(..lo).next_back().into_iter().chain(segments.range(lo..=hi));
        starts.extend(ends.map(|(&a, &b)| a.saturating_add(b)).filter(|&x| lo <= x && x <= hi));
        for p in starts {
            let Some((_, &(e, Kind::Segments(_)))) = self.ranges.range(..=p).next_back() else { continue };
            if p >= e {
                continue;
            }
            let run_end = segments.range(p..).next().map_or(e, |(&a, _)| a.min(e));
            if let Some(from) = p.checked_next_multiple_of(ALIGN).filter(|&f| f < run_end) {
                self.holes.insert(p, run_end - from);
            }
        }
    }

    /// Recomputes the free stretches that start in `[lo, hi]` (at the end of a range).
    fn refresh_gaps(&mut self, lo: u64, hi: u64) {
        while let Some(k) = self.gaps.first_at_or_after(lo).filter(|&k| k <= hi) {
            self.gaps.remove(k);
        }
        let below = self.ranges.range(..lo).next_back().into_iter();
        let ends: Vec<u64> =
            below.chain(self.ranges.range(lo..=hi)).map(|(_, &(e, _))| e).filter(|&e| lo <= e && e <= hi).collect();
        for from in ends {
            let to = self.ranges.range(from..).next().map(|(&s, _)| s).or(self.top).unwrap_or(from);
            let usable = align_down(to).saturating_sub(from);
            if usable > 0 {
                self.gaps.insert(from, usable);
            }
        }
    }

    /// Checks the trees against a walk of every range and segment (tests).
    #[cfg(test)]
    pub fn check(&self, segments: &BTreeMap<u64, u64>) {
        let mut prev_end = None;
        let mut live_total = 0;
        for (&s, &(e, k)) in &self.ranges {
            assert!(s < e, "empty range at {s:#x}");
            assert!(prev_end.is_none_or(|p| p <= s), "overlapping ranges at {s:#x}");
            prev_end = Some(e);
            if let Kind::Segments(n) = k {
                let inside: Vec<_> = segments.range(s..e).collect();
                assert_eq!(inside.len() as u64, n, "live count of the range at {s:#x}");
                assert!(n > 0, "an empty range at {s:#x} kept");
                assert!(inside.iter().all(|(&a, &b)| a + b <= e), "a segment past the range at {s:#x}");
                live_total += n;
            }
        }
        assert_eq!(live_total, segments.len() as u64, "segments outside every range");
        let mut holes = Vec::new();
        for (&s, &(e, k)) in &self.ranges {
            if !matches!(k, Kind::Segments(_)) {
                continue;
            }
            let mut cur = s;
            for (&a, &b) in segments.range(s..e).chain(std::iter::once((&e, &0))) {
                let from = cur.next_multiple_of(ALIGN);
                if a > from {
                    holes.push((cur, a - from));
                }
                cur = cur.max(a + b);
            }
        }
        assert_eq!(self.holes.entries(), holes, "free runs inside ranges");
        let mut gaps = Vec::new();
        let bounds: Vec<(u64, u64)> = self.ranges.iter().map(|(&s, &(e, _))| (s, e)).collect();
        for (i, &(_, e)) in bounds.iter().enumerate() {
            let to = bounds.get(i + 1).map(|b| b.0).or(self.top).unwrap();
            if align_down(to) > e {
                gaps.push((e, align_down(to) - e));
            }
        }
        assert_eq!(self.gaps.entries(), gaps, "free stretches between ranges");
    }
}

/// A treap keyed by address with a value per key, which knows the largest value in each
/// subtree: the lowest (or highest) key whose value is at least `x` in `O(log n)`.
#[derive(Debug, Clone, Default)]
pub struct MaxTree {
    /// Node `i` is `nodes[i - 1]`; 0 is no node.
    nodes: Vec<Node>,
    root: u32,
    free: Vec<u32>,
    /// Priorities come from a counter run through a mixer: deterministic, and balanced for any
    /// order of keys.
    counter: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Node {
    key: u64,
    value: u64,
    max: u64,
    priority: u64,
    left: u32,
    right: u32,
}

const NIL: u32 = 0;

impl MaxTree {
    fn node(&self, id: u32) -> &Node {
        &self.nodes[id as usize - 1]
    }
    fn node_mut(&mut self, id: u32) -> &mut Node {
        &mut self.nodes[id as usize - 1]
    }
    fn max_of(&self, id: u32) -> u64 {
        if id == NIL {
            0
        } else {
            self.node(id).max
        }
    }
    fn pull(&mut self, id: u32) {
        let n = *self.node(id);
        self.node_mut(id).max = n.value.max(self.max_of(n.left)).max(self.max_of(n.right));
    }
    /// `(keys below key, keys at or above it)`.
    fn split(&mut self, t: u32, key: u64) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        let n = *self.node(t);
        if n.key < key {
            let (l, r) = self.split(n.right, key);
            self.node_mut(t).right = l;
            self.pull(t);
            (t, r)
        } else {
            let (l, r) = self.split(n.left, key);
            self.node_mut(t).left = r;
            self.pull(t);
            (l, t)
        }
    }
    /// Every key of `a` is below every key of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.node(a).priority > self.node(b).priority {
            let r = self.merge(self.node(a).right, b);
            self.node_mut(a).right = r;
            self.pull(a);
            a
        } else {
            let l = self.merge(a, self.node(b).left);
            self.node_mut(b).left = l;
            self.pull(b);
            b
        }
    }

    /// Sets `key`'s value.
    pub fn insert(&mut self, key: u64, value: u64) {
        self.remove(key);
        self.counter += 1;
        let mut z = self.counter.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let node = Node { key, value, max: value, priority: z ^ (z >> 31), left: NIL, right: NIL };
        let id = match self.free.pop() {
            Some(id) => {
                *self.node_mut(id) = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() as u32
            }
        };
        let (l, r) = self.split(self.root, key);
        let l = self.merge(l, id);
        self.root = self.merge(l, r);
    }

    /// Removes `key`; its value if it was there.
    pub fn remove(&mut self, key: u64) -> Option<u64> {
        let (l, r) = self.split(self.root, key);
        let (m, r) = match key.checked_add(1) {
            Some(next) => self.split(r, next),
            None => (r, NIL),
        };
        let value = (m != NIL).then(|| {
            self.free.push(m);
            self.node(m).value
        });
        self.root = self.merge(l, r);
        value
    }

    /// The lowest key at or above `x`.
    pub fn first_at_or_after(&self, x: u64) -> Option<u64> {
        let (mut t, mut best) = (self.root, None);
        while t != NIL {
            let n = self.node(t);
            if n.key >= x {
                best = Some(n.key);
                t = n.left;
            } else {
                t = n.right;
            }
        }
        best
    }

    /// The lowest key whose value is at least `x`, with its value (none for 0).
    pub fn leftmost_at_least(&self, x: u64) -> Option<(u64, u64)> {
        self.outermost_at_least(x, false)
    }

    /// The lowest (or, `highest`, the highest) key whose value is at least `x`, with its value
    /// (none for 0): down the near side while its subtree holds one.
    fn outermost_at_least(&self, x: u64, highest: bool) -> Option<(u64, u64)> {
        let mut t = self.root;
        if x == 0 || self.max_of(t) < x {
            return None;
        }
        loop {
            let n = self.node(t);
            let (near, far) = if highest { (n.right, n.left) } else { (n.left, n.right) };
            if self.max_of(near) >= x {
                t = near;
            } else if n.value >= x {
                return Some((n.key, n.value));
            } else {
                t = far;
            }
        }
    }

    /// The lowest key above `k` whose value is at least `x`, with its value (none for 0).
    pub fn leftmost_at_least_after(&self, k: u64, x: u64) -> Option<(u64, u64)> {
        self.outermost_at_least_beyond(k, x, false)
    }

    /// The highest key below `k` whose value is at least `x`, with its value (none for 0).
    pub fn rightmost_at_least_before(&self, k: u64, x: u64) -> Option<(u64, u64)> {
        self.outermost_at_least_beyond(k, x, true)
    }

    /// The lowest key above `k` (or, `highest`, the highest below it) whose value is at least
    /// `x`, with its value (none for 0): the near side first, skipping subtrees too small.
    fn outermost_at_least_beyond(&self, k: u64, x: u64, highest: bool) -> Option<(u64, u64)> {
        fn go(t: &MaxTree, id: u32, k: u64, x: u64, highest: bool) -> Option<(u64, u64)> {
            if id == NIL || t.max_of(id) < x {
                return None;
            }
            let n = *t.node(id);
            let (near, far) = if highest { (n.right, n.left) } else { (n.left, n.right) };
            let beyond = if highest { n.key < k } else { n.key > k };
            if !beyond {
                return go(t, far, k, x, highest);
            }
            go(t, near, k, x, highest)
                .or_else(|| (n.value >= x).then_some((n.key, n.value)))
                .or_else(|| go(t, far, k, x, highest))
        }
        if x == 0 {
            return None;
        }
        go(self, self.root, k, x, highest)
    }

    /// The highest key whose value is at least `x`, with its value (none for 0).
    pub fn rightmost_at_least(&self, x: u64) -> Option<(u64, u64)> {
        self.outermost_at_least(x, true)
    }

    /// Every `(key, value)` in key order (tests).
    #[cfg(test)]
    pub fn entries(&self) -> Vec<(u64, u64)> {
        fn walk(t: &MaxTree, id: u32, out: &mut Vec<(u64, u64)>) {
            if id != NIL {
                let n = *t.node(id);
                walk(t, n.left, out);
                out.push((n.key, n.value));
                walk(t, n.right, out);
            }
        }
        let mut out = Vec::new();
        walk(self, self.root, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tree_against_a_sorted_list() {
        let mut rnd = crate::engine::test_rng(0x2545_f491_4f6c_dd1d);
        let mut t = MaxTree::default();
        let mut m: BTreeMap<u64, u64> = BTreeMap::new();
        for _ in 0..20_000 {
            let key = rnd() % 500;
            if rnd().is_multiple_of(3) {
                assert_eq!(t.remove(key), m.remove(&key));
            } else {
                let v = 1 + rnd() % 1000;
                t.insert(key, v);
                m.insert(key, v);
            }
            let x = 1 + rnd() % 1000;
            assert_eq!(t.leftmost_at_least(x), m.iter().find(|(_, &v)| v >= x).map(|(&k, &v)| (k, v)));
            assert_eq!(t.rightmost_at_least(x), m.iter().rev().find(|(_, &v)| v >= x).map(|(&k, &v)| (k, v)));
            let y = rnd() % 520;
            assert_eq!(t.first_at_or_after(y), m.range(y..).next().map(|(&k, _)| k));
            let after = m.range(y + 1..).find(|(_, &v)| v >= x).map(|(&k, &v)| (k, v));
            assert_eq!(t.leftmost_at_least_after(y, x), after);
            let before = m.range(..y).rev().find(|(_, &v)| v >= x).map(|(&k, &v)| (k, v));
            assert_eq!(t.rightmost_at_least_before(y, x), before);
        }
        assert_eq!(t.entries(), m.into_iter().collect::<Vec<_>>());
    }
}
