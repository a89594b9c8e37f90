//! Replays a PyTorch snapshot's alloc/free sequence (the compact fixtures in
//! `tests/fixtures/`, made by `fixtures/extract.py`) through the engine on a SimDevice.
//!
//! Fixture lines: `S addr size` segment_alloc, `X addr size` segment_free, `M`/`U addr size`
//! segment_map/unmap, `a addr size` alloc, `r addr` free_requested, `c addr` free_completed,
//! `o size` oom (rounded size); addresses in hex. The first line is `# conf <ALLOC_CONF>`.
#![allow(dead_code)]

use recorder::device::SimDevice;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::{Engine, FreeError};
use recorder::trace::Event;
use std::collections::HashMap;
use std::io::Read;

/// H100 80GB `total_memory`, as recorded with the traces.
pub const DEVICE_TOTAL: u64 = 85_017_493_504;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    SegAlloc(u64, u64),
    SegFree(u64, u64),
    Map(u64, u64),
    Unmap(u64, u64),
    Alloc(u64, u64),
    FreeRequested(u64),
    FreeCompleted(u64),
    Oom(u64),
}

pub struct Trace {
    pub conf: String,
    pub ops: Vec<Op>,
}

pub fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn load(name: &str) -> Trace {
    let path = fixture_dir().join(format!("{name}.txt.zst"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut text = String::new();
    zstd::stream::read::Decoder::new(file).unwrap().read_to_string(&mut text).unwrap();
    let mut lines = text.lines();
    let conf = lines.next().unwrap().strip_prefix("# conf").unwrap().trim().to_string();
    let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
    let dec = |s: &str| s.parse::<u64>().unwrap();
    let ops = lines
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            match f[0] {
                "S" => Op::SegAlloc(hex(f[1]), dec(f[2])),
                "X" => Op::SegFree(hex(f[1]), dec(f[2])),
                "M" => Op::Map(hex(f[1]), dec(f[2])),
                "U" => Op::Unmap(hex(f[1]), dec(f[2])),
                "a" => Op::Alloc(hex(f[1]), dec(f[2])),
                "r" => Op::FreeRequested(hex(f[1])),
                "c" => Op::FreeCompleted(hex(f[1])),
                "o" => Op::Oom(dec(f[1])),
                other => panic!("bad fixture line kind {other}"),
            }
        })
        .collect();
    Trace { conf, ops }
}

/// The outcome of one replay.
#[derive(Debug, Default)]
pub struct Outcome {
    pub oom: bool,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// Segment events the engine produced: (kind, addr, bytes), kind in S X M U.
    pub segment_events: Vec<(char, u64, u64)>,
    /// Allocations placed at a different address than recorded.
    pub address_mismatches: u64,
    pub allocs: u64,
    pub free_errors: u64,
}

/// The recorded segment events (kind, addr, bytes).
pub fn recorded_segment_events(t: &Trace) -> Vec<(char, u64, u64)> {
    t.ops
        .iter()
        .filter_map(|op| match *op {
            Op::SegAlloc(a, b) => Some(('S', a, b)),
            Op::SegFree(a, b) => Some(('X', a, b)),
            Op::Map(a, b) => Some(('M', a, b)),
            Op::Unmap(a, b) => Some(('U', a, b)),
            _ => None,
        })
        .collect()
}

/// Replays `t` under `conf` with a reserved-memory cap of `capacity` bytes. Segment addresses
/// of the recording are given to the SimDevice as hints. A burst of `segment_free` in the
/// recording is an `empty_cache()` call. The replay stops at the first OOM (as the workload did).
pub fn replay(t: &Trace, conf: &str, capacity: Option<u64>) -> Outcome {
    let config = AllocatorConfig::parse(conf).unwrap();
    let seg_hints: Vec<(u64, u64)> =
        t.ops.iter().filter_map(|op| if let Op::SegAlloc(a, b) = *op { Some((a, b)) } else { None }).collect();
    let first_map = t.ops.iter().find_map(|op| if let Op::Map(a, _) = *op { Some(a) } else { None });
    let device = SimDevice::new(Some(DEVICE_TOTAL))
        .with_segment_hints(seg_hints)
        .with_reserve_hints(first_map.into_iter().collect());
    let mut engine = Engine::new(config, capacity, device, Vec::<Event>::new());
    let mut out = Outcome::default();
    let mut addr_map: HashMap<u64, u64> = HashMap::new();
    let mut prev_was_seg_free = false;
    for op in &t.ops {
        let is_seg_free = matches!(op, Op::SegFree(..) | Op::Unmap(..));
        match *op {
            Op::Alloc(rec_addr, size) => {
                out.allocs += 1;
                match engine.malloc(size, 0, 0) {
                    Ok(a) => {
                        if a.addr != rec_addr {
                            out.address_mismatches += 1;
                        }
                        addr_map.insert(rec_addr, a.addr);
                    }
                    Err(_) => {
                        out.oom = true;
                        break;
                    }
                }
            }
            Op::FreeRequested(rec) => {
                let r: Result<(), FreeError> = match addr_map.get(&rec) {
                    Some(&a) => engine.free_requested(a),
                    None => Err(FreeError::UnknownAddress(rec)),
                };
                out.free_errors += r.is_err() as u64;
            }
            Op::FreeCompleted(rec) => {
                let r = match addr_map.remove(&rec) {
                    Some(a) => engine.free_completed(a),
                    None => Err(FreeError::UnknownAddress(rec)),
                };
                out.free_errors += r.is_err() as u64;
            }
            Op::Oom(rounded) => {
                if engine.malloc(rounded, 0, 0).is_err() {
                    out.oom = true;
                    break;
                }
            }
            Op::SegFree(..) | Op::Unmap(..) => {
                if !prev_was_seg_free {
                    engine.empty_cache();
                }
            }
            Op::SegAlloc(..) | Op::Map(..) => {}
        }
        prev_was_seg_free = is_seg_free;
    }
    let st = engine.stats();
    out.peak_reserved = st.reserved_bytes.all.peak;
    out.peak_allocated = st.allocated_bytes.all.peak;
    out.num_alloc_retries = st.num_alloc_retries;
    out.num_ooms = st.num_ooms;
    let (_, events) = engine.into_parts();
    out.segment_events = events
        .iter()
        .filter_map(|e| match *e {
            Event::SegmentAlloc { addr, bytes, .. } => Some(('S', addr, bytes)),
            Event::SegmentFree { addr, bytes, .. } => Some(('X', addr, bytes)),
            Event::SegmentMap { addr, bytes, .. } => Some(('M', addr, bytes)),
            Event::SegmentUnmap { addr, bytes, .. } => Some(('U', addr, bytes)),
            _ => None,
        })
        .collect();
    out
}

/// The PYTORCH_CUDA_ALLOC_CONF of a truth.tsv policy.
pub fn policy_conf(policy: &str) -> &'static str {
    match policy {
        "default" => "",
        "expandable" => "expandable_segments:True",
        "maxsplit64" => "max_split_size_mb:64",
        "pow2div4" => "roundup_power2_divisions:4",
        "gc06" => "garbage_collection_threshold:0.6",
        other => panic!("unknown policy {other}"),
    }
}

/// One row of truth.tsv.
#[derive(Debug, Clone)]
pub struct TruthRow {
    pub workload: String,
    pub policy: String,
    pub level: String,
    pub limit_gib: Option<f64>,
    pub oom: bool,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
}

pub fn truth() -> Vec<TruthRow> {
    let text = std::fs::read_to_string(fixture_dir().join("truth.tsv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            TruthRow {
                workload: f[0].into(),
                policy: f[1].into(),
                level: f[2].into(),
                limit_gib: f[3].parse().ok(),
                oom: f[4] == "oom",
                peak_reserved: f[5].parse().unwrap(),
                peak_allocated: f[6].parse().unwrap(),
                num_alloc_retries: f[7].parse().unwrap(),
                num_ooms: f[8].parse().unwrap(),
            }
        })
        .collect()
}

/// The fixture replayed for a truth row: the policy's own snapshot when one was recorded
/// (the unlimited rows of default/expandable), else the workload's default snapshot.
pub fn fixture_for(row: &TruthRow) -> String {
    let own = format!("{}.{}", row.workload, row.policy);
    if fixture_dir().join(format!("{own}.txt.zst")).exists() {
        own
    } else {
        format!("{}.default", row.workload)
    }
}

pub fn capacity_of(row: &TruthRow) -> Option<u64> {
    row.limit_gib.map(|g| (g * (1u64 << 30) as f64) as u64)
}
