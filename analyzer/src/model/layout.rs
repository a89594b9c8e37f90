//! The measures of one layout of segments and blocks: the one definition of "reserved but
//! unallocated", of the free bytes inside segments, of the largest free block and of what
//! `empty_cache()` would give back, for every command that reports them. The four measures are
//! described in [`crate::analysis::frag`].

use recorder::engine::SegmentView;
use serde::Serialize;

/// Figures of one layout.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LayoutMeasures {
    pub segments: u64,
    pub blocks: u64,
    pub reserved_bytes: u64,
    /// Blocks handed out and not yet freed (rounded sizes).
    pub allocated_bytes: u64,
    /// What the program asked for, for the allocated blocks.
    pub requested_bytes: u64,
    /// Freed by the program, waiting for stream work: neither usable nor live.
    pub pending_free_bytes: u64,
    /// Free blocks inside segments (external fragmentation).
    pub free_bytes: u64,
    /// Rounding slack inside allocated blocks (internal fragmentation).
    pub internal_bytes: u64,
    /// The largest free block of the default pools (a private pool's serve only that pool).
    pub largest_free_bytes: u64,
    /// Segments of the default pools with no allocated or pending block: what `empty_cache()`
    /// would give back.
    pub releasable_bytes: u64,
    /// The segment being folded by [`LayoutMeasures::add`]: its bytes, and whether a block is busy.
    #[serde(skip)]
    open: Option<(u64, bool)>,
}

impl LayoutMeasures {
    /// The byte figures the engine keeps (no segment or block counts, nothing releasable): the
    /// four measures over time, at every request, in constant time each.
    pub fn of_occupancy(o: &recorder::engine::Occupancy) -> Self {
        LayoutMeasures {
            reserved_bytes: o.reserved_bytes,
            allocated_bytes: o.allocated_bytes,
            requested_bytes: o.requested_bytes,
            pending_free_bytes: o.pending_free_bytes,
            free_bytes: o.free_bytes,
            internal_bytes: o.allocated_bytes.saturating_sub(o.requested_bytes),
            largest_free_bytes: o.largest_free_bytes,
            ..Default::default()
        }
    }

    pub fn of(segments: &[SegmentView]) -> Self {
        let mut m = LayoutMeasures::default();
        for s in segments {
            for (k, b) in s.blocks.iter().enumerate() {
                m.add(k == 0, b);
            }
        }
        m.finish();
        m
    }

    /// Folds one block (`starts_segment`: the first block of a segment); [`LayoutMeasures::finish`]
    /// closes the last segment. The one definition of the measures, for a list of segments
    /// ([`LayoutMeasures::of`]) and for a walk of the engine's blocks
    /// ([`crate::replay::EngineView::layout`]).
    pub fn add(&mut self, starts_segment: bool, b: &recorder::engine::BlockView) {
        if starts_segment {
            self.finish();
            self.segments += 1;
            self.open = Some((0, false));
        }
        let Some((bytes, busy)) = self.open.as_mut() else { return };
        *bytes += b.bytes;
        self.reserved_bytes += b.bytes;
        self.blocks += 1;
        // A private pool's wholly free segment stays while its graph or MemPool lives: not
        // something `empty_cache()` gives back.
        *busy |= b.in_private_pool;
        if b.allocated {
            *busy = true;
            self.allocated_bytes += b.bytes;
            self.requested_bytes += b.requested_bytes;
            self.internal_bytes += b.bytes.saturating_sub(b.requested_bytes);
        } else if b.pending_free {
            *busy = true;
            self.pending_free_bytes += b.bytes;
        } else {
            self.free_bytes += b.bytes;
            if !b.in_private_pool {
                self.largest_free_bytes = self.largest_free_bytes.max(b.bytes);
            }
        }
    }

    /// Closes the segment being folded.
    pub fn finish(&mut self) {
        if let Some((bytes, busy)) = self.open.take() {
            if !busy {
                self.releasable_bytes += bytes;
            }
        }
    }

    /// Measure 1: `1 - allocated / reserved`.
    pub fn reserved_vs_allocated(&self) -> f64 {
        ratio_complement(self.allocated_bytes, self.reserved_bytes)
    }
    /// Measure 1 in bytes: reserved memory that no live block holds.
    pub fn reserved_unallocated_bytes(&self) -> u64 {
        reserved_unallocated(self.reserved_bytes, self.allocated_bytes)
    }
    /// Measure 2: `1 - largest free block / total free` (0 when nothing is free).
    pub fn contiguity(&self) -> f64 {
        contiguity(self.largest_free_bytes, self.free_bytes)
    }
    /// Measure 3a: internal slack as a share of reserved.
    pub fn internal(&self) -> f64 {
        share(self.internal_bytes, self.reserved_bytes)
    }
    /// Measure 3b: free blocks inside segments as a share of reserved.
    pub fn external(&self) -> f64 {
        share(self.free_bytes, self.reserved_bytes)
    }
}

/// `part / whole`, in [0, 1] (0 when `whole` is 0).
pub fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64).clamp(0.0, 1.0)
    }
}

/// "Reserved but unallocated", in bytes: reserved memory that no live block holds (measure 1's
/// numerator; [`LayoutMeasures::reserved_unallocated_bytes`]).
pub fn reserved_unallocated(reserved_bytes: u64, allocated_bytes: u64) -> u64 {
    reserved_bytes.saturating_sub(allocated_bytes)
}

/// Measure 2 from its two figures: `1 - largest free block / total free` (0 when nothing is
/// free; [`LayoutMeasures::contiguity`]).
pub fn contiguity(largest_free_bytes: u64, free_bytes: u64) -> f64 {
    ratio_complement(largest_free_bytes, free_bytes)
}

/// `1 - part / whole`, in [0, 1] (0 when `whole` is 0).
pub fn ratio_complement(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (1.0 - part as f64 / whole as f64).clamp(0.0, 1.0)
    }
}
