//! Two patterns of a program's memory use that `explain` diagnoses, with figures:
//!
//! - `torch.cuda.empty_cache()` called in the loop (often as `gc.collect();
//!   torch.cuda.empty_cache()` after every batch): every call gives the cached segments back to
//!   the device, and the next batch gets them again, one `cudaMalloc` each. The trace is replayed
//!   without the program's `empty_cache()` calls, under the same settings and limit, and the two
//!   runs' device calls and peak reserved are compared.
//! - Blocks held back for another stream (`Tensor.record_stream`): a block the program freed is
//!   given back to the cache only when the work queued on every stream that used it is done, so
//!   between the free and its completion it holds memory no tensor uses. The bytes held per
//!   stream are followed over the trace.

use crate::analysis::whatif::DEVICE_CALL_US;
use crate::model::units::fmt_bytes;
use crate::model::Trace;
use crate::replay::{replay, ReplayOptions, ReplayResult};
use anyhow::Result;
use recorder::trace::{Event, Record, RecordedPools, ReleaseCause};
use serde::Serialize;
use std::collections::HashMap;

/// `empty_cache()` calls needed before the pattern is named.
pub const MIN_EMPTY_CACHE_CALLS: u64 = 3;
/// Held-back bytes are named when, at their peak, they are at least this share of reserved.
pub const MIN_HELD_SHARE: f64 = 0.10;

/// The program's `empty_cache()` calls, and the same run without them.
#[derive(Debug, Clone, Serialize)]
pub struct EmptyCacheCalls {
    pub calls: u64,
    /// Device calls (`cudaMalloc` + `cudaFree`) with the calls, and without.
    pub device_calls_with: u64,
    pub device_calls_without: u64,
    pub peak_reserved_with: u64,
    pub peak_reserved_without: u64,
    /// Whether the replay without the calls runs out of memory at the limit (and with them not).
    pub without_fails: bool,
    pub with_fails: bool,
}

/// Removing the calls is not advised when the run without them holds more than this share of
/// memory more at its peak: then the calls trade device calls for memory, which the program may
/// want (another process sharing the GPU), and the trade is the user's.
pub const EMPTY_CACHE_PEAK_GROWTH: f64 = 0.05;

impl EmptyCacheCalls {
    /// Without the calls, peak reserved grows by more than [`EMPTY_CACHE_PEAK_GROWTH`].
    pub fn keeps_memory_down(&self) -> bool {
        self.peak_reserved_without as f64 > self.peak_reserved_with as f64 * (1.0 + EMPTY_CACHE_PEAK_GROWTH)
    }

    pub fn text(&self) -> String {
        let saved = self.device_calls_with.saturating_sub(self.device_calls_without);
        format!(
            "the program calls torch.cuda.empty_cache() {} times: {} device calls (cudaMalloc/cudaFree) with them, {} \
without them ({} fewer, about {:.1} ms at {DEVICE_CALL_US:.0} us each); peak reserved {} with them, {} without{}",
            self.calls,
            self.device_calls_with,
            self.device_calls_without,
            saved,
            saved as f64 * DEVICE_CALL_US / 1000.0,
            fmt_bytes(self.peak_reserved_with),
            fmt_bytes(self.peak_reserved_without),
            match (self.with_fails, self.without_fails) {
                (false, true) => "; without them the replay runs out of memory at the limit: keep them",
                (true, false) => "; without them the replay gets further at the limit",
                _ => "",
            }
        )
    }
}

/// What `explain` reports of the program's own patterns, from the trace and the replay under the
/// recorded settings (`with`): its `empty_cache()` calls and the bytes held for other streams.
pub type Patterns = (Option<EmptyCacheCalls>, Option<HeldForStreams>);

/// [`Patterns`] of the run `with` (at its capacity). It needs that run alone, so callers start
/// it as soon as that run ends.
pub fn of_run(trace: &Trace, with: &ReplayResult) -> Result<Patterns> {
    Ok((empty_cache_calls(trace, with.capacity_bytes, with)?, held_for_streams(trace)?))
}

/// Finds the pattern and replays without the calls (`None` below [`MIN_EMPTY_CACHE_CALLS`]).
/// `with` is the trace's replay at `capacity` (the limit when some, else none), which the
/// caller has made already.
pub fn empty_cache_calls(trace: &Trace, capacity: Option<u64>, with: &ReplayResult) -> Result<Option<EmptyCacheCalls>> {
    // A MemPool's deletion releases its pool alone (`Burst::pools_only`): not the program's call.
    let is_call = |pools: &mut RecordedPools, r: &Record| {
        if let Event::CacheRelease { cause: ReleaseCause::EmptyCache, .. } = r.event {
            !pools.end_burst().pools_only(ReleaseCause::EmptyCache)
        } else {
            pools.observe(&r.event);
            false
        }
    };
    // Each call is a release of the program's: a trace with too few is not read.
    if trace.facts.empty_cache_releases < MIN_EMPTY_CACHE_CALLS {
        return Ok(None);
    }
    let mut calls = 0u64;
    let mut pools = RecordedPools::default();
    trace.scan(|_, r| {
        if is_call(&mut pools, r) {
            calls += 1;
        }
    })?;
    if calls < MIN_EMPTY_CACHE_CALLS {
        return Ok(None);
    }
    let mut records = Vec::new();
    let mut pools = RecordedPools::default();
    trace.scan(|_, r| {
        if !is_call(&mut pools, r) {
            records.push(r.clone());
        }
    })?;
    let without_trace = trace.derived(trace.header.clone(), records);
    let opts = ReplayOptions { capacity_bytes: capacity, unlimited: capacity.is_none(), ..Default::default() };
    let without = replay(&without_trace, &opts)?;
    Ok(Some(EmptyCacheCalls {
        calls,
        device_calls_with: with.num_device_alloc + with.num_device_free,
        device_calls_without: without.num_device_alloc + without.num_device_free,
        peak_reserved_with: with.peak_reserved_bytes,
        peak_reserved_without: without.peak_reserved_bytes,
        with_fails: with.is_oom(),
        without_fails: without.is_oom() && without.oom_event() < with.oom_event().or(Some(u64::MAX)),
    }))
}

/// Bytes freed by the program but held back until other streams' work is done.
#[derive(Debug, Clone, Serialize)]
pub struct HeldForStreams {
    /// Peak of the held bytes, and where.
    pub peak_held_bytes: u64,
    pub peak_event: u64,
    /// Reserved bytes (recorded segments) at that moment.
    pub reserved_at_peak_bytes: u64,
    /// Live requested bytes at that moment.
    pub live_at_peak_bytes: u64,
    /// The peak of reserved memory (recorded segments), and the bytes held back then.
    pub peak_reserved_bytes: u64,
    pub held_at_peak_reserved_bytes: u64,
    /// Held bytes by the stream the blocks were allocated on, at the peak: (stream, bytes).
    pub by_stream_at_peak: Vec<(u64, u64)>,
    /// Held bytes over the trace: (event, bytes), a few samples.
    pub over_time: Vec<(u64, u64)>,
    /// The names of the trace's streams (the text names them; the JSON keeps the handles).
    #[serde(skip)]
    pub stream_names: crate::model::streams::StreamNames,
}

impl HeldForStreams {
    /// Whether the holding raised the program's peak: held bytes were a share
    /// ([`MIN_HELD_SHARE`]) of reserved memory when it peaked. A moment's holding that the peak
    /// did not need costs no capacity (CUDA graph captures defer frees this way too).
    pub fn raised_the_peak(&self) -> bool {
        self.peak_reserved_bytes > 0
            && self.held_at_peak_reserved_bytes as f64 >= MIN_HELD_SHARE * self.peak_reserved_bytes as f64
    }

    pub fn text(&self) -> String {
        let streams: Vec<String> = self
            .by_stream_at_peak
            .iter()
            .map(|(s, b)| format!("{} allocated on {}", fmt_bytes(*b), self.stream_names.name(*s)))
            .collect();
        let samples: Vec<String> =
            self.over_time.iter().map(|(e, b)| format!("{} at event {e}", fmt_bytes(*b))).collect();
        format!(
            "blocks the program freed are held back until other streams' work on them is done (record_stream): {} held \
at event {} ({}; the trace does not say which stream used them), while {} was live and {} reserved; held over the \
trace: {}; {}{}",
            fmt_bytes(self.peak_held_bytes),
            self.peak_event,
            streams.join(", "),
            fmt_bytes(self.live_at_peak_bytes),
            fmt_bytes(self.reserved_at_peak_bytes),
            samples.join(", "),
            if self.raised_the_peak() {
                format!(
                    "when reserved memory peaked ({}), {} was held",
                    fmt_bytes(self.peak_reserved_bytes),
                    fmt_bytes(self.held_at_peak_reserved_bytes)
                )
            } else {
                format!(
                    "when reserved memory peaked ({}), {} was held: the holding did not raise the peak",
                    fmt_bytes(self.peak_reserved_bytes),
                    fmt_bytes(self.held_at_peak_reserved_bytes)
                )
            },
            self.stream_names.handles_note().map(|n| format!(" ({n})")).unwrap_or_default()
        )
    }
}

/// Follows the held-back bytes (`None` when they never reach [`MIN_HELD_SHARE`] of reserved
/// memory; [`HeldForStreams::raised_the_peak`] says whether they were held when it peaked).
pub fn held_for_streams(trace: &Trace) -> Result<Option<HeldForStreams>> {
    // A block is held between the program's free and its completion: a trace where no free
    // waited holds nothing, and is not read.
    if trace.facts.waited_frees == 0 {
        return Ok(None);
    }
    let mut size: crate::model::ids::IdMap<(u64, u64, bool)> = Default::default(); // id -> (stream, bytes, free asked)
    let mut held: crate::model::ids::IdMap<(u64, u64)> = Default::default();
    let (mut held_bytes, mut live, mut reserved) = (0u64, 0u64, 0u64);
    // Held bytes when reserved memory reached its peak: what the holding cost in capacity.
    let (mut peak_reserved, mut held_at_peak_reserved) = (0u64, 0u64);
    let mut best: Option<HeldForStreams> = None;
    // Each hold and each completion of a held block, (stream, bytes, held), in order: the held
    // bytes by stream at the peak are folded from its prefix once the peak is known, instead of
    // from every held block at each new peak (quadratic where held bytes keep growing).
    let mut log: Vec<(u64, u64, bool)> = Vec::new();
    let mut log_at_best = 0;
    // Held bytes after eight records evenly spread over the trace (its first and last included).
    let n = trace.events.max(1);
    let sample_at = |k: u64| (k * (n - 1)) / 7;
    let mut over_time: Vec<(u64, u64)> = Vec::with_capacity(8);
    // A free asked for and completed by the next record never waited (PyTorch records both
    // under one lock when no other stream used the block): it is held only once another
    // record comes between.
    let mut asked: Option<u64> = None;
    trace.scan(|i, r| {
        if let Some(id) = asked.take() {
            if !matches!(r.event, Event::FreeCompleted { id: done, .. } if done == id) {
                if let Some(&(stream, b, _)) = size.get(&id) {
                    held.insert(id, (stream, b));
                    log.push((stream, b, true));
                    held_bytes = held_bytes.saturating_add(b);
                }
            }
        }
        match r.event {
            Event::Alloc { id, requested_bytes, stream, .. } => {
                size.insert(id, (stream, requested_bytes, false));
                live = live.saturating_add(requested_bytes);
            }
            Event::FreeRequested { id, .. } => {
                if let Some((_, b, freed)) = size.get_mut(&id).filter(|s| !s.2) {
                    *freed = true;
                    asked = Some(id);
                    live = live.saturating_sub(*b);
                }
            }
            Event::FreeCompleted { id, .. } => {
                if let Some((stream, b)) = held.remove(&id) {
                    log.push((stream, b, false));
                    held_bytes = held_bytes.saturating_sub(b);
                } else if let Some(&(_, b, false)) = size.get(&id) {
                    live = live.saturating_sub(b);
                }
                size.remove(&id);
            }
            Event::SegmentAlloc { bytes, .. } | Event::SegmentMap { bytes, .. } => {
                reserved = reserved.saturating_add(bytes);
                if reserved > peak_reserved {
                    peak_reserved = reserved;
                    held_at_peak_reserved = held_bytes;
                }
            }
            Event::SegmentFree { bytes, .. } | Event::SegmentUnmap { bytes, .. } => {
                reserved = reserved.saturating_sub(bytes)
            }
            _ => {}
        }
        while over_time.len() < 8 && sample_at(over_time.len() as u64) == i {
            over_time.push((i, held_bytes));
        }
        if held_bytes > best.as_ref().map_or(0, |b| b.peak_held_bytes) {
            log_at_best = log.len();
            best = Some(HeldForStreams {
                peak_held_bytes: held_bytes,
                peak_event: i,
                reserved_at_peak_bytes: reserved,
                live_at_peak_bytes: live,
                peak_reserved_bytes: 0,
                held_at_peak_reserved_bytes: 0,
                by_stream_at_peak: Vec::new(),
                over_time: Vec::new(),
                stream_names: crate::model::streams::StreamNames::default(),
            });
        }
    })?;
    // Named wherever the held bytes were a share of reserved memory at their own peak; whether
    // they raised the program's peak (held when reserved memory peaked) is said beside it.
    let Some(mut best) = best.filter(|b| {
        b.reserved_at_peak_bytes > 0 && b.peak_held_bytes as f64 >= MIN_HELD_SHARE * b.reserved_at_peak_bytes as f64
    }) else {
        return Ok(None);
    };
    // Every stream the trace names, numbered in the order it first uses them.
    best.stream_names = trace.facts.streams.clone();
    best.peak_reserved_bytes = peak_reserved;
    best.held_at_peak_reserved_bytes = held_at_peak_reserved;
    // The blocks held at the peak, by the stream that allocated them (summed exactly, then
    // capped as a sum of byte counts is).
    let mut by: HashMap<u64, (u64, u128)> = HashMap::new(); // stream -> (blocks, bytes)
    for &(stream, b, held) in &log[..log_at_best] {
        let (blocks, bytes) = by.entry(stream).or_default();
        if held {
            (*blocks, *bytes) = (*blocks + 1, *bytes + b as u128);
        } else {
            (*blocks, *bytes) = (*blocks - 1, *bytes - b as u128);
        }
    }
    let mut by: Vec<(u64, u64)> = by
        .into_iter()
        .filter(|&(_, (blocks, _))| blocks > 0)
        .map(|(s, (_, b))| (s, u64::try_from(b).unwrap_or(u64::MAX)))
        .collect();
    by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    best.by_stream_at_peak = by;
    // A trace read again is the same records; were it shorter, its last figure stands for the
    // samples past its end.
    while over_time.len() < 8 {
        over_time.push(over_time.last().copied().unwrap_or((0, held_bytes)));
    }
    best.over_time = over_time;
    Ok(Some(best))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truth(name: &str) -> Trace {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/truth").join(name);
        Trace::open(&p).unwrap()
    }

    /// Real PyTorch runs (`tests/fixtures/truth/README.md`): a program on one stream, whose
    /// every free is completed by the next record, holds nothing; a producer/consumer
    /// `record_stream` pipeline holds blocks, named although they did not raise its peak (none
    /// was held when its segments peaked, before the first free); two streams whose held blocks
    /// were a share of the peak are named as raising it.
    #[test]
    fn held_blocks_are_the_ones_other_streams_kept() {
        let single = truth("amp_adamw.default.atrace");
        let mut asked: Option<u64> = None;
        let mut waited = 0;
        single
            .scan(|_, r| {
                if asked.take().is_some_and(|id| !matches!(r.event, Event::FreeCompleted { id: d, .. } if d == id)) {
                    waited += 1;
                }
                if let Event::FreeRequested { id, .. } = r.event {
                    asked = Some(id);
                }
            })
            .unwrap();
        assert_eq!(waited, 0, "the one-stream run completes each free at once");
        assert!(held_for_streams(&single).unwrap().is_none());

        let pipeline =
            held_for_streams(&truth("rs_pipeline.default.atrace")).unwrap().expect("the pipeline holds blocks");
        assert!(pipeline.peak_held_bytes > 0 && !pipeline.by_stream_at_peak.is_empty());
        assert_eq!(pipeline.held_at_peak_reserved_bytes, 0);
        assert!(!pipeline.raised_the_peak());
        assert!(pipeline.text().contains("did not raise the peak"), "{}", pipeline.text());

        let two = held_for_streams(&truth("two_streams.default.atrace")).unwrap().expect("two streams hold blocks");
        assert!(two.raised_the_peak(), "{}", two.text());
    }
}
