//! A trace as a PyTorch memory snapshot (what `torch.cuda.memory._dump_snapshot` writes), for
//! PyTorch's memory_viz page and `torch/cuda/_memory_viz.py`.
//!
//! # Mapping (the inverse of `import::torch`)
//!
//! | event | snapshot |
//! |---|---|
//! | `Alloc` | trace entry `alloc` (`size` = the requested bytes, `frames` = its call site) |
//! | `FreeRequested`, `FreeCompleted` | `free_requested`, `free_completed` (`size` = the block's requested bytes) |
//! | `SegmentAlloc`/`Free`/`Map`/`Unmap` | `segment_alloc`/`_free`/`_map`/`_unmap` |
//! | `Oom` | `oom` (`device_free`, `size` = the request rounded as the allocator rounds it) |
//! | `Snapshot` | `snapshot` |
//! | `Mark` | an `external_annotations` entry (`name`, `stage`; `"forward START"` splits back into both) |
//! | `Split`, `Merge`, `CacheRelease`, `CallSite`, `DeviceMemInfo`, `Dropped` | nothing: a snapshot has no such entry (splits and merges are implied by the blocks; call sites become `frames`) |
//!
//! Everything goes on device 0. `segments` is the state at the end of the trace, built from
//! the events: every segment still held (expandable pages mapped next to each other form one
//! segment, as in PyTorch's snapshot), its live blocks (`active_allocated`, or
//! `active_pending_free` between a free's request and its completion) and the gaps between
//! them as `inactive` blocks. A block whose size the trace does not know (an imported
//! snapshot records only requests) gets the request rounded as the allocator rounds it.
//! The viewers rebuild every earlier moment from this state by undoing the entries, so it
//! matches the entries exactly.
//!
//! Times: `time_us` is microseconds since the Unix epoch (the trace's clock origin plus the
//! event's time). Frame lists are shared through the pickle's memo, as PyTorch's are.
//! Snapshots do not hold the memory limit: `alloctrace import torch` takes it back with
//! `--capacity`.

use super::pickle::PickleWriter;
use crate::model::Trace;
use anyhow::Result;
use recorder::engine::round_size;
use recorder::trace::{Event, Frame, Header, MarkKind, Pool, NO_CALLSITE};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

/// What an export wrote.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct MemoryVizStats {
    /// Events read.
    pub events: u64,
    /// Trace entries written.
    pub entries: u64,
    /// Segments held at the end.
    pub segments: u64,
    /// Blocks live at the end.
    pub live_blocks: u64,
    pub annotations: u64,
    /// Events with no snapshot counterpart (splits, merges, cache releases, ...).
    pub skipped_events: u64,
    /// Segments of a private pool (a CUDA graph's, a MemPool's) freed before the end: a snapshot
    /// names the pool only of the segments in its end state, so a re-import counts these as the
    /// default pools'.
    pub private_pool_segments_freed: u64,
    /// Where the trace was damaged (the export covers what came before).
    pub damage: Option<String>,
}

struct Live {
    addr: u64,
    requested: u64,
    block_bytes: u64,
    stream: u64,
    callsite: u32,
    free_requested: bool,
}

#[derive(Clone, Copy)]
struct Seg {
    bytes: u64,
    stream: u64,
    pool: Pool,
    expandable: bool,
    /// PyTorch's id of the private pool (a CUDA graph's, a MemPool's) the segment serves;
    /// `[0, 0]` for the default pools.
    pool_id: [u64; 2],
}

/// Call sites: their frames until first written, then the memo slot of their list.
#[derive(Default)]
struct Frames {
    defined: FxHashMap<u32, Vec<Frame>>,
    written: FxHashMap<u32, u32>,
    empty: Option<u32>,
}

impl Frames {
    fn write<W: Write>(&mut self, p: &mut PickleWriter<W>, callsite: u32) -> std::io::Result<()> {
        let frames = (callsite != NO_CALLSITE).then(|| self.defined.get(&callsite)).flatten();
        let Some(frames) = frames else {
            return match self.empty {
                Some(slot) => p.memo_get(slot),
                None => {
                    p.begin_list()?;
                    self.empty = Some(p.memo_put()?);
                    p.end_list()
                }
            };
        };
        if let Some(&slot) = self.written.get(&callsite) {
            return p.memo_get(slot);
        }
        p.begin_list()?;
        let slot = p.memo_put()?;
        for f in frames {
            p.begin_dict()?;
            p.kv_str("filename", &f.file)?;
            p.kv_uint("line", f.line as u64)?;
            p.kv_str("name", &f.function)?;
            p.end_dict()?;
        }
        p.end_list()?;
        self.written.insert(callsite, slot);
        Ok(())
    }
}

/// Writes `trace` (read by the one opener: a trace or a snapshot) into `out` as a snapshot
/// pickle (`alloctrace export` puts it in a file).
pub fn export(trace: &Trace, out: &mut dyn Write) -> Result<MemoryVizStats> {
    let header = trace.header.clone();
    let mut p = PickleWriter::new(out)?;
    let mut ex = Exporter::new(&header);

    p.begin_dict()?;
    p.str("device_traces")?;
    p.begin_list()?;
    p.begin_list()?;
    let mut failed: Option<std::io::Error> = None;
    let scanned = trace.scan(|_, r| {
        if failed.is_none() {
            if let Err(e) = ex.event(&mut p, r.time_ns, &r.event) {
                failed = Some(e);
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    ex.stats.damage = scanned.damage_warning();
    ex.stats.events = scanned.events;
    p.end_list()?;
    p.end_list()?;
    ex.write_segments(&mut p)?;
    ex.write_settings(&mut p, &header)?;
    ex.write_annotations(&mut p)?;
    write_trace_facts(&mut p, &header)?;
    p.end_dict()?;
    p.finish()?;
    Ok(ex.stats)
}

/// What the trace knows that a snapshot has no place for, under a key of alloctrace's own
/// ([`crate::source::import::torch::EXPORTED_KEY`]; the viewers ignore it): the recorded limit,
/// the device, the PyTorch release. `import` reads them back, so that an export re-imported
/// answers at the same limit on the same device.
fn write_trace_facts<W: Write>(p: &mut PickleWriter<W>, header: &Header) -> std::io::Result<()> {
    p.str(crate::source::import::torch::EXPORTED_KEY)?;
    p.begin_dict()?;
    p.kv_uint("capacity_bytes", header.capacity_bytes)?;
    p.kv_uint("device_total_bytes", header.device_total_bytes)?;
    p.kv_str("device_name", &header.device_name)?;
    p.kv_str("torch_version", &header.torch_version)?;
    p.end_dict()
}

struct Exporter {
    config: recorder::engine::config::AllocatorConfig,
    origin_ns: u64,
    live: crate::model::ids::IdMap<Live>,
    segments: BTreeMap<u64, Seg>,
    frames: Frames,
    annotations: Vec<(u64, String, &'static str)>,
    stats: MemoryVizStats,
}

impl Exporter {
    fn new(header: &Header) -> Self {
        Exporter {
            config: header.config.clone(),
            origin_ns: header.clock_origin_unix_ns,
            live: Default::default(),
            segments: BTreeMap::new(),
            frames: Frames::default(),
            annotations: Vec::new(),
            stats: MemoryVizStats::default(),
        }
    }

    fn time_us(&self, time_ns: u64) -> u64 {
        self.origin_ns.saturating_add(time_ns) / 1000
    }

    /// One trace entry: `action`, `addr` (or `device_free`), `size`, `stream`, `time_us`, `frames`.
    #[allow(clippy::too_many_arguments)]
    fn entry<W: Write>(
        &mut self,
        p: &mut PickleWriter<W>,
        action: &'static str,
        addr_key: &'static str,
        addr: u64,
        size: u64,
        stream: u64,
        time_ns: u64,
        callsite: u32,
    ) -> std::io::Result<()> {
        p.begin_dict()?;
        p.name("action")?;
        p.name(action)?;
        p.kv_uint(addr_key, addr)?;
        p.kv_uint("size", size)?;
        p.kv_uint("stream", stream)?;
        p.kv_uint("time_us", self.time_us(time_ns))?;
        p.name("frames")?;
        self.frames.write(p, callsite)?;
        // As PyTorch writes them when no compile context or metadata was set.
        p.name("compile_context")?;
        p.name("N/A")?;
        p.name("user_metadata")?;
        p.name("")?;
        p.end_dict()?;
        self.stats.entries += 1;
        Ok(())
    }

    fn event<W: Write>(&mut self, p: &mut PickleWriter<W>, t: u64, ev: &Event) -> std::io::Result<()> {
        match ev {
            Event::Alloc { id, addr, requested_bytes, block_bytes, stream, pool: _, callsite } => {
                let block = if *block_bytes > 0 { *block_bytes } else { round_size(&self.config, *requested_bytes) };
                self.live.insert(
                    *id,
                    Live {
                        addr: *addr,
                        requested: *requested_bytes,
                        block_bytes: block,
                        stream: *stream,
                        callsite: *callsite,
                        free_requested: false,
                    },
                );
                self.entry(p, "alloc", "addr", *addr, *requested_bytes, *stream, t, *callsite)?;
            }
            Event::FreeRequested { id, addr, callsite } => {
                let (size, stream) = match self.live.get_mut(id) {
                    Some(l) => {
                        l.free_requested = true;
                        (l.requested, l.stream)
                    }
                    None => (0, 0),
                };
                self.entry(p, "free_requested", "addr", *addr, size, stream, t, *callsite)?;
            }
            Event::FreeCompleted { id, addr } => {
                let (size, stream) = self.live.remove(id).map(|l| (l.requested, l.stream)).unwrap_or((0, 0));
                self.entry(p, "free_completed", "addr", *addr, size, stream, t, NO_CALLSITE)?;
            }
            Event::SegmentAlloc { addr, bytes, stream, pool } => {
                self.segments.insert(
                    *addr,
                    Seg { bytes: *bytes, stream: *stream, pool: *pool, expandable: false, pool_id: [0, 0] },
                );
                self.entry(p, "segment_alloc", "addr", *addr, *bytes, *stream, t, NO_CALLSITE)?;
            }
            Event::SegmentFree { addr, bytes, stream, pool: _ } => {
                if self.segments.remove(addr).is_some_and(|s| s.pool_id != [0, 0]) {
                    self.stats.private_pool_segments_freed += 1;
                }
                self.entry(p, "segment_free", "addr", *addr, *bytes, *stream, t, NO_CALLSITE)?;
            }
            Event::SegmentMap { addr, bytes, stream, pool } => {
                self.segments.insert(
                    *addr,
                    Seg { bytes: *bytes, stream: *stream, pool: *pool, expandable: true, pool_id: [0, 0] },
                );
                self.entry(p, "segment_map", "addr", *addr, *bytes, *stream, t, NO_CALLSITE)?;
            }
            Event::SegmentUnmap { addr, bytes, stream, pool: _ } => {
                self.unmap(*addr, *bytes);
                self.entry(p, "segment_unmap", "addr", *addr, *bytes, *stream, t, NO_CALLSITE)?;
            }
            Event::Oom { requested_bytes, device_free_bytes, stream, .. } => {
                let size = round_size(&self.config, *requested_bytes);
                self.entry(p, "oom", "device_free", *device_free_bytes, size, *stream, t, NO_CALLSITE)?;
            }
            Event::Snapshot { active_bytes } => {
                self.entry(p, "snapshot", "addr", 0, *active_bytes, 0, t, NO_CALLSITE)?;
            }
            Event::Mark { kind, text } => {
                let (name, stage) = match (kind, text.rsplit_once(' ')) {
                    (MarkKind::Annotation, Some((name, "START"))) => (name.to_string(), "START"),
                    (MarkKind::Annotation, Some((name, "END"))) => (name.to_string(), "END"),
                    (MarkKind::Annotation, _) => (text.clone(), ""),
                    (MarkKind::Phase | MarkKind::Iteration, _) => (text.clone(), "START"),
                };
                self.annotations.push((self.time_us(t), name, stage));
            }
            Event::CallSite { id, frames } => {
                self.frames.defined.insert(*id, frames.clone());
                self.frames.written.remove(id);
                self.stats.skipped_events += 1;
            }
            Event::Split { .. }
            | Event::Merge { .. }
            | Event::CacheRelease { .. }
            | Event::DeviceMemInfo { .. }
            | Event::Dropped { .. } => self.stats.skipped_events += 1,
            // The segment's private pool, which the snapshot's segment list names.
            Event::SegmentPool { addr, pool_id } => match self.segments.get_mut(addr) {
                Some(s) => s.pool_id = *pool_id,
                None => self.stats.skipped_events += 1,
            },
        }
        Ok(())
    }

    /// Removes `[addr, addr + bytes)` from the mapped expandable ranges (it may cut one in parts).
    fn unmap(&mut self, addr: u64, bytes: u64) {
        let end = addr.saturating_add(bytes);
        let start = self.segments.range(..=addr).next_back().map(|(&a, _)| a).unwrap_or(addr);
        let hit: Vec<(u64, Seg)> = self.segments.range(start..end).map(|(&a, &s)| (a, s)).collect();
        for (a, s) in hit {
            let s_end = a + s.bytes;
            if s_end <= addr || !s.expandable {
                continue;
            }
            self.segments.remove(&a);
            if s.pool_id != [0, 0] && addr <= a && end >= s_end {
                self.stats.private_pool_segments_freed += 1;
            }
            if a < addr {
                self.segments.insert(a, Seg { bytes: addr - a, ..s });
            }
            if s_end > end {
                self.segments.insert(end, Seg { bytes: s_end - end, ..s });
            }
        }
    }

    /// `segments`: the state at the end.
    fn write_segments<W: Write>(&mut self, p: &mut PickleWriter<W>) -> std::io::Result<()> {
        // Expandable ranges mapped next to each other are one segment.
        let mut segs: Vec<(u64, Seg)> = Vec::new();
        for (&a, &s) in &self.segments {
            if let Some((pa, ps)) = segs.last_mut() {
                if s.expandable && ps.expandable && *pa + ps.bytes == a && ps.stream == s.stream && ps.pool == s.pool {
                    ps.bytes += s.bytes;
                    continue;
                }
            }
            segs.push((a, s));
        }
        let mut blocks: Vec<&Live> = self.live.values().collect();
        blocks.sort_by_key(|l| l.addr);
        let mut next = 0usize;
        p.str("segments")?;
        p.begin_list()?;
        for (addr, s) in segs {
            let end = addr + s.bytes;
            while next < blocks.len() && blocks[next].addr < addr {
                next += 1;
            }
            let mut inside = Vec::new();
            let mut cursor = addr;
            while next < blocks.len() && blocks[next].addr < end {
                let b = blocks[next];
                next += 1;
                if b.addr < cursor {
                    continue; // overlaps the previous block: a damaged trace
                }
                let size = b.block_bytes.min(end - b.addr);
                inside.push((b, size));
                cursor = b.addr + size;
            }
            let allocated: u64 = inside.iter().filter(|(b, _)| !b.free_requested).map(|(_, s)| s).sum();
            let active: u64 = inside.iter().map(|(_, s)| s).sum();
            let requested: u64 = inside.iter().map(|(b, _)| b.requested).sum();
            p.begin_dict()?;
            p.kv_uint("device", 0)?;
            p.kv_uint("address", addr)?;
            p.kv_uint("total_size", s.bytes)?;
            p.kv_uint("allocated_size", allocated)?;
            p.kv_uint("active_size", active)?;
            p.kv_uint("requested_size", requested)?;
            p.kv_uint("stream", s.stream)?;
            p.name("segment_type")?;
            p.name(s.pool.as_str())?;
            p.name("segment_pool_id")?;
            p.int_pair(i128::from(s.pool_id[0]), i128::from(s.pool_id[1]))?;
            p.name("is_expandable")?;
            p.bool(s.expandable)?;
            p.name("frames")?;
            self.frames.write(p, NO_CALLSITE)?;
            p.name("blocks")?;
            p.begin_list()?;
            let mut cursor = addr;
            let free_block = |p: &mut PickleWriter<W>, frames: &mut Frames, at: u64, size: u64| {
                p.begin_dict()?;
                p.kv_uint("address", at)?;
                p.kv_uint("size", size)?;
                p.kv_uint("requested_size", 0)?;
                p.name("state")?;
                p.name("inactive")?;
                p.name("frames")?;
                frames.write(p, NO_CALLSITE)?;
                p.end_dict()
            };
            for (b, size) in &inside {
                if b.addr > cursor {
                    free_block(p, &mut self.frames, cursor, b.addr - cursor)?;
                }
                p.begin_dict()?;
                p.kv_uint("address", b.addr)?;
                p.kv_uint("size", *size)?;
                p.kv_uint("requested_size", b.requested)?;
                p.name("state")?;
                p.name(if b.free_requested { "active_pending_free" } else { "active_allocated" })?;
                p.name("frames")?;
                self.frames.write(p, b.callsite)?;
                p.end_dict()?;
                cursor = b.addr + size;
                self.stats.live_blocks += 1;
            }
            if cursor < end {
                free_block(p, &mut self.frames, cursor, end - cursor)?;
            }
            p.end_list()?;
            p.end_dict()?;
            self.stats.segments += 1;
        }
        p.end_list()
    }

    /// `allocator_settings`: the settings string the importer reads back, and the structured
    /// keys the viewers show.
    fn write_settings<W: Write>(&self, p: &mut PickleWriter<W>, header: &Header) -> std::io::Result<()> {
        let c = &header.config;
        let conf = if header.alloc_conf.trim().is_empty() { c.to_string() } else { header.alloc_conf.clone() };
        p.str("allocator_settings")?;
        p.begin_dict()?;
        p.kv_str("PYTORCH_CUDA_ALLOC_CONF", &conf)?;
        p.str("max_split_size")?;
        p.int(c.max_split_size.map_or(-1, |v| v as i128))?;
        p.str("garbage_collection_threshold")?;
        p.float(c.garbage_collection_threshold.unwrap_or(0.0))?;
        p.str("expandable_segments")?;
        p.bool(c.expandable_segments)?;
        p.str("roundup_power2_divisions")?;
        p.begin_dict()?;
        for (i, d) in c.roundup_power2_divisions.iter().enumerate() {
            p.str(&(1u64 << i).to_string())?;
            p.uint(*d as u64)?;
        }
        p.end_dict()?;
        // PyTorch 2.13 and later write whether the history overflowed; an earlier release's
        // snapshot has no such key, and a reader takes the key for 2.13's.
        let version = recorder::engine::version::TorchVersion::from_header(&header.torch_version).unwrap_or_default();
        if version >= recorder::engine::version::TorchVersion::new(2, 13) {
            p.str("trace_alloc_overflowed")?;
            p.bool(false)?;
        }
        p.end_dict()
    }

    fn write_annotations<W: Write>(&mut self, p: &mut PickleWriter<W>) -> std::io::Result<()> {
        p.str("external_annotations")?;
        p.begin_list()?;
        for (time_us, name, stage) in &self.annotations {
            p.begin_dict()?;
            p.kv_str("name", name)?;
            p.name("stage")?;
            p.name(stage)?;
            p.kv_uint("device", 0)?;
            p.kv_uint("time_us", *time_us)?;
            p.end_dict()?;
        }
        self.stats.annotations = self.annotations.len() as u64;
        p.end_list()
    }
}
