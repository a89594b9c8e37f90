//! Self-consistency of a recorded trace: replay its allocations and frees through the engine on
//! a simulated device, under the trace's own settings, and compare the device traffic (the
//! sequence of segment alloc/free/map/unmap sizes) with what was recorded.
//!
//! The simulated device is given the recorded segment addresses as hints, so best-fit ties
//! (lowest address wins) break the same way as on the GPU. Expandable segments need no hints:
//! one reservation per stream and pool, whose offsets the engine alone decides.

use crate::device::SimDevice;
use crate::engine::Engine;
use crate::trace::{Event, RecordedPools, ReleaseCause, TraceEnd, TraceError, TraceReader};
use std::collections::HashMap;
use std::path::Path;

/// One unit of device traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SegmentOp {
    Alloc(u64),
    Free(u64),
    Map(u64),
    Unmap(u64),
}

impl SegmentOp {
    fn of(e: &Event) -> Option<SegmentOp> {
        Some(match *e {
            Event::SegmentAlloc { bytes, .. } => SegmentOp::Alloc(bytes),
            Event::SegmentFree { bytes, .. } => SegmentOp::Free(bytes),
            Event::SegmentMap { bytes, .. } => SegmentOp::Map(bytes),
            Event::SegmentUnmap { bytes, .. } => SegmentOp::Unmap(bytes),
            _ => return None,
        })
    }
}

/// The outcome of [`check_segments`].
#[derive(Clone, Debug)]
pub struct SegmentCheck {
    pub events: u64,
    pub allocs: u64,
    pub recorded: Vec<SegmentOp>,
    pub replayed: Vec<SegmentOp>,
    /// How the read of the trace ended.
    pub end: TraceEnd,
    /// Frees the replay could not apply (unknown to the engine).
    pub replay_free_errors: u64,
}

impl SegmentCheck {
    /// True when the replay produced exactly the recorded device traffic.
    pub fn same(&self) -> bool {
        self.recorded == self.replayed
    }
    /// Index of the first difference, if any.
    pub fn first_difference(&self) -> Option<usize> {
        let n = self.recorded.len().min(self.replayed.len());
        (0..n)
            .find(|&i| self.recorded[i] != self.replayed[i])
            .or((self.recorded.len() != self.replayed.len()).then_some(n))
    }
}

/// Replays the trace at `path` (see the module documentation).
pub fn check_segments(path: &Path) -> Result<SegmentCheck, TraceError> {
    let mut hints = Vec::new();
    let mut recorded = Vec::new();
    {
        let mut r = TraceReader::open(path)?;
        for rec in r.by_ref() {
            if let Some(op) = SegmentOp::of(&rec.event) {
                recorded.push(op);
            }
            if let Event::SegmentAlloc { addr, bytes, .. } = rec.event {
                hints.push((addr, bytes));
            }
        }
    }
    let mut r = TraceReader::open(path)?;
    let header = r.header().clone();
    let capacity = (header.capacity_bytes > 0).then_some(header.capacity_bytes);
    let device = SimDevice::new(None).with_segment_hints(hints);
    let mut engine = Engine::new(header.config.clone(), capacity, device, Vec::new());
    // Recorded address -> replayed address of each live block.
    let mut addrs: HashMap<u64, u64> = HashMap::new();
    let (mut events, mut allocs, mut free_errors) = (0u64, 0u64, 0u64);
    let mut replayed = Vec::new();
    let mut pools = RecordedPools::default();
    for rec in r.by_ref() {
        events += 1;
        let pools_only = pools.follow(&rec.event, &mut engine);
        match rec.event {
            Event::Alloc { addr, requested_bytes, stream, callsite, .. } => {
                allocs += 1;
                if let Ok(a) = pools.malloc(&mut engine, addr, requested_bytes, stream, callsite) {
                    addrs.insert(addr, a.addr);
                }
            }
            Event::FreeRequested { addr, .. } => match addrs.get(&addr) {
                Some(&a) if engine.free_requested(a).is_ok() => {}
                _ => free_errors += 1,
            },
            Event::FreeCompleted { addr, .. } => match addrs.remove(&addr) {
                Some(a) if engine.free_completed(a).is_ok() => {}
                _ => free_errors += 1,
            },
            Event::CacheRelease { cause: ReleaseCause::EmptyCache, .. } if !pools_only => {
                engine.empty_cache();
            }
            _ => {}
        }
        replayed.extend(engine.sink_mut().drain(..).filter_map(|e| SegmentOp::of(&e)));
    }
    Ok(SegmentCheck { events, allocs, recorded, replayed, end: r.end().clone(), replay_free_errors: free_errors })
}
