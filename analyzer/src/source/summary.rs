//! `summary`: a streaming fold over a trace's events: counts by kind, duration, OOMs, device
//! calls, and the peaks of reserved, requested and allocated bytes with when they happened.

use recorder::trace::{Event, Observed, Record, RecordedPools, EVENT_KIND_NAMES, NUM_EVENT_KINDS};
use serde::Serialize;

/// A peak and the moment it was first reached.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Peak {
    pub bytes: u64,
    /// Index of the event at which the peak was first reached (for reserved bytes, the request
    /// that the segment taking them there was made for, as a replay has it).
    pub event: u64,
    pub time_ns: u64,
}

impl Peak {
    #[inline]
    fn offer(&mut self, bytes: u64, event: u64, time_ns: u64) {
        if bytes > self.bytes {
            *self = Peak { bytes, event, time_ns };
        }
    }
}

/// Folds records into the figures of `alloctrace summary`.
#[derive(Debug, Default)]
pub struct SummaryFold {
    counts: [u64; NUM_EVENT_KINDS],
    first_time_ns: Option<u64>,
    last_time_ns: u64,
    reserved: u64,
    requested: u64,
    allocated: u64,
    /// Blocks not yet completely freed: id -> (requested bytes, block bytes, free requested).
    live: crate::model::ids::IdMap<(u64, u64, bool)>,
    block_sizes_known: bool,
    any_alloc: bool,
    live_blocks: u64,
    peak_live: u64,
    peak_reserved: Peak,
    /// The segment that took reserved memory to its peak is for a request still to come: the
    /// peak is that request's event, as a replay (which makes the segment for the request) has it.
    peak_reserved_for_request: bool,
    peak_requested: Peak,
    peak_allocated: Peak,
    dropped_events: u64,
    anomalies: u64,
    /// The recording's private pools (CUDA graphs, MemPools) and the bytes their segments hold.
    pools: RecordedPools,
    pool_ids: Vec<[u64; 2]>,
    pool_set: rustc_hash::FxHashSet<[u64; 2]>,
    private_reserved: u64,
    private_at_peak_reserved: u64,
    peak_private: Peak,
}

/// Memory in private pools: a CUDA graph's (`torch.cuda.graph`, `torch.compile`'s graph
/// trees) or a `torch.cuda.MemPool`'s. Their segments serve only their own pool's requests.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PrivatePools {
    /// PyTorch's pool ids (`MempoolId_t`), in the order the trace first names them.
    pub pool_ids: Vec<[u64; 2]>,
    /// Reserved bytes in private pools when reserved memory first reached its peak.
    pub reserved_at_peak_reserved_bytes: u64,
    /// The most reserved in private pools at once.
    pub peak_reserved: Peak,
    pub end_reserved_bytes: u64,
}

/// The result of [`SummaryFold`].
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub events: u64,
    pub events_by_kind: std::collections::BTreeMap<&'static str, u64>,
    pub duration_ns: u64,
    pub num_ooms: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub peak_reserved: Peak,
    pub peak_requested: Peak,
    /// `None` when the trace does not know block sizes (PyTorch snapshots record only requests).
    pub peak_allocated: Option<Peak>,
    pub end_reserved_bytes: u64,
    pub end_live_blocks: u64,
    pub end_requested_bytes: u64,
    pub dropped_events: u64,
    /// Frees of unknown blocks and similar inconsistencies (counted, never fatal).
    pub anomalies: u64,
    /// `None` when the trace names no private pool.
    pub private_pools: Option<PrivatePools>,
    /// The most allocations not yet completely freed at once: what a replay's state grows
    /// with ([`crate::replay::concurrent_replays`]). Not part of the JSON.
    #[serde(skip)]
    pub peak_live_allocations: u64,
}

impl Summary {
    /// How many records of `kind` ([`recorder::trace::EVENT_KIND_NAMES`]) the trace holds: an
    /// analysis that needs a kind the trace lacks can answer without reading it.
    pub fn count(&self, kind: &str) -> u64 {
        self.events_by_kind.get(kind).copied().unwrap_or(0)
    }
}

impl SummaryFold {
    pub fn new() -> Self {
        SummaryFold { block_sizes_known: true, ..Default::default() }
    }

    #[inline]
    pub fn record(&mut self, index: u64, r: &Record) {
        self.counts[r.event.kind_index()] += 1;
        if self.first_time_ns.is_none() {
            self.first_time_ns = Some(r.time_ns);
        }
        self.last_time_ns = self.last_time_ns.max(r.time_ns);
        let t = r.time_ns;
        match self.pools.observe(&r.event) {
            Observed::Nothing => {}
            Observed::PrivateFreed { bytes, .. } => self.private_reserved = self.private_reserved.saturating_sub(bytes),
            Observed::PrivateMade { pool_id, bytes } => {
                if self.pool_set.insert(pool_id) {
                    self.pool_ids.push(pool_id);
                }
                self.private_reserved = self.private_reserved.saturating_add(bytes);
                self.peak_private.offer(self.private_reserved, index, t);
                // The segment that took reserved memory to its peak (the record before) is this
                // pool's.
                if self.reserved == self.peak_reserved.bytes && self.peak_reserved.event + 1 == index {
                    self.private_at_peak_reserved = self.private_reserved;
                }
            }
        }
        if self.peak_reserved_for_request && matches!(r.event, Event::Alloc { .. } | Event::Oom { .. }) {
            self.peak_reserved_for_request = false;
            self.peak_reserved.event = index;
            self.peak_reserved.time_ns = t;
        }
        match &r.event {
            Event::Alloc { id, requested_bytes, block_bytes, .. } => {
                self.any_alloc = true;
                if *block_bytes == 0 {
                    self.block_sizes_known = false;
                }
                if let Some((req, block, pending)) = self.live.insert(*id, (*requested_bytes, *block_bytes, false)) {
                    // An allocation that reuses the id of a live block: the old block's bytes
                    // leave the sums (as if freed), and it counts as an anomaly.
                    self.anomalies += 1;
                    self.requested = self.requested.saturating_sub(req);
                    if !pending {
                        self.allocated = self.allocated.saturating_sub(block);
                        self.live_blocks -= 1;
                    }
                }
                // Sums saturate: hostile sizes near 2^64 must not wrap to small numbers.
                self.requested = self.requested.saturating_add(*requested_bytes);
                self.allocated = self.allocated.saturating_add(*block_bytes);
                self.live_blocks += 1;
                self.peak_live = self.peak_live.max(self.live.len() as u64);
                self.peak_requested.offer(self.requested, index, t);
                self.peak_allocated.offer(self.allocated, index, t);
            }
            Event::FreeRequested { id, .. } => match self.live.get_mut(id) {
                Some((_, block, pending @ false)) => {
                    *pending = true;
                    self.allocated = self.allocated.saturating_sub(*block);
                    self.live_blocks -= 1;
                }
                _ => self.anomalies += 1,
            },
            Event::FreeCompleted { id, .. } => match self.live.remove(id) {
                Some((req, block, pending)) => {
                    // A completion without a request: the source freed in one step.
                    if !pending {
                        self.allocated = self.allocated.saturating_sub(block);
                        self.live_blocks -= 1;
                    }
                    self.requested = self.requested.saturating_sub(req);
                }
                None => self.anomalies += 1,
            },
            Event::SegmentAlloc { bytes, .. } | Event::SegmentMap { bytes, .. } => {
                self.reserved = self.reserved.saturating_add(*bytes);
                if self.reserved > self.peak_reserved.bytes {
                    self.private_at_peak_reserved = self.private_reserved;
                    self.peak_reserved_for_request = true;
                }
                self.peak_reserved.offer(self.reserved, index, t);
            }
            // Counted above, through the recording's pools.
            Event::SegmentPool { .. } => {}
            Event::SegmentFree { bytes, .. } | Event::SegmentUnmap { bytes, .. } => {
                // A release before the request: the peak was the segment's own.
                self.peak_reserved_for_request = false;
                self.reserved = self.reserved.saturating_sub(*bytes);
            }
            Event::Dropped { events } => self.dropped_events = self.dropped_events.saturating_add(*events),
            Event::Split { .. }
            | Event::Merge { .. }
            | Event::CacheRelease { .. }
            | Event::Oom { .. }
            | Event::Mark { .. }
            | Event::CallSite { .. }
            | Event::Snapshot { .. }
            | Event::DeviceMemInfo { .. } => {}
        }
    }

    pub fn finish(self) -> Summary {
        let c = |name: &str| self.counts[EVENT_KIND_NAMES.iter().position(|n| *n == name).expect("known kind")];
        Summary {
            events: self.counts.iter().sum(),
            events_by_kind: EVENT_KIND_NAMES
                .iter()
                .zip(self.counts.iter())
                .filter(|(_, &n)| n > 0)
                .map(|(k, &n)| (*k, n))
                .collect(),
            duration_ns: self.last_time_ns - self.first_time_ns.unwrap_or(0),
            num_ooms: c("oom"),
            num_device_alloc: c("segment_alloc") + c("segment_map"),
            num_device_free: c("segment_free") + c("segment_unmap"),
            peak_reserved: self.peak_reserved,
            peak_requested: self.peak_requested,
            peak_allocated: (self.block_sizes_known && self.any_alloc).then_some(self.peak_allocated),
            end_reserved_bytes: self.reserved,
            end_live_blocks: self.live_blocks,
            peak_live_allocations: self.peak_live,
            end_requested_bytes: self.requested,
            dropped_events: self.dropped_events,
            anomalies: self.anomalies,
            private_pools: (!self.pool_ids.is_empty()).then(|| PrivatePools {
                pool_ids: self.pool_ids.clone(),
                reserved_at_peak_reserved_bytes: self.private_at_peak_reserved,
                peak_reserved: self.peak_private,
                end_reserved_bytes: self.private_reserved,
            }),
        }
    }
}
