//! One suite, every configuration: seeded random workloads on several streams, with the
//! layout, the statistics and the event stream checked against each other after every step.

mod support {
    pub mod model;
}
use recorder::device::SimDevice;
use recorder::engine::config::{AllocatorConfig, MIB};
use recorder::engine::{allocation_size, round_size, Engine, SegmentView, Stats};
use recorder::trace::{Event, Pool};
use support::model::EventModel;

const CONFIGS: &[(&str, Option<u64>)] = &[
    ("", None),
    ("", Some(512 * MIB)),
    ("max_split_size_mb:64", None),
    ("max_split_size_mb:64", Some(600 * MIB)),
    ("roundup_power2_divisions:4", None),
    ("roundup_power2_divisions:8", Some(512 * MIB)),
    ("garbage_collection_threshold:0.6", Some(512 * MIB)),
    ("expandable_segments:True", None),
    ("expandable_segments:True", Some(512 * MIB)),
    ("max_split_size_mb:64,garbage_collection_threshold:0.6", Some(600 * MIB)),
    ("max_split_size_mb:64,roundup_power2_divisions:4,expandable_segments:True", Some(700 * MIB)),
    ("roundup_power2_divisions:[1:1,16:4,>:8],large_segment_size_mb:32", Some(512 * MIB)),
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_size(rng: &mut Rng) -> u64 {
    match rng.below(10) {
        0..=4 => 1 + rng.below(600 << 10),
        5..=7 => (1 << 20) + rng.below(12 << 20),
        8 => (10 << 20) + rng.below(60 << 20),
        _ => (60 << 20) + rng.below(120 << 20),
    }
}

#[derive(Clone, Copy)]
struct Live {
    addr: u64,
    requested: u64,
    stream: u64,
    pending: bool,
}

fn check_layout(segs: &[SegmentView], stats: &Stats, live: &[Live], expandable: bool) {
    let mut last_end = 0u64;
    let (mut reserved, mut allocated, mut active, mut requested) = (0, 0, 0, 0);
    let (mut inactive_split, mut inactive_split_bytes) = (0u64, 0u64);
    let mut segment_count = 0;
    for s in segs {
        assert!(s.addr >= last_end, "segments overlap at {:#x}", s.addr);
        last_end = s.addr + s.bytes;
        reserved += s.bytes;
        segment_count += !s.is_expandable as u64;
        assert_eq!(s.is_expandable, expandable);
        let mut at = s.addr;
        for b in &s.blocks {
            assert_eq!(b.addr, at, "blocks of a segment must tile it");
            assert!(b.bytes >= 512 && b.bytes % 512 == 0);
            at += b.bytes;
            if b.allocated {
                allocated += b.bytes;
            }
            if b.allocated || b.pending_free {
                active += b.bytes;
                requested += b.requested_bytes;
            } else if s.blocks.len() > 1 && !s.is_expandable {
                inactive_split += 1;
                inactive_split_bytes += b.bytes;
            }
        }
        assert_eq!(at, s.addr + s.bytes);
        // adjacent free blocks must have been merged
        for w in s.blocks.windows(2) {
            let free = |b: &recorder::engine::BlockView| !b.allocated && !b.pending_free;
            assert!(!(free(&w[0]) && free(&w[1])), "unmerged free neighbours at {:#x}", w[1].addr);
        }
    }
    assert_eq!(stats.reserved_bytes.all.current, reserved, "reserved = sum of segments");
    assert_eq!(stats.allocated_bytes.all.current, allocated, "allocated = sum of allocated blocks");
    assert_eq!(stats.active_bytes.all.current, active);
    assert_eq!(stats.requested_bytes.all.current, requested);
    assert_eq!(stats.inactive_split.all.current, inactive_split);
    assert_eq!(stats.inactive_split_bytes.all.current, inactive_split_bytes);
    assert_eq!(stats.segment.all.current, segment_count);
    assert_eq!(stats.allocation.all.current, live.iter().filter(|l| !l.pending).count() as u64);
    assert_eq!(
        stats.reserved_bytes.all.current,
        stats.reserved_bytes.small_pool.current + stats.reserved_bytes.large_pool.current
    );
    let total_requested: u64 = live.iter().map(|l| l.requested).sum();
    assert_eq!(stats.requested_bytes.all.current, total_requested);
}

fn run(conf: &str, capacity: Option<u64>, seed: u64, steps: usize) {
    let config = AllocatorConfig::parse(conf).unwrap();
    let expandable = config.expandable_segments;
    let mut e = Engine::new(config, capacity, SimDevice::new(None), Vec::<Event>::new());
    let mut model = EventModel::default();
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut live: Vec<Live> = Vec::new();
    let (mut ooms, mut reuses, mut syncs) = (0, 0, 0);
    for step in 0..steps {
        let r = rng.below(100);
        if r < 50 || live.is_empty() {
            let bytes = random_size(&mut rng);
            let stream = rng.below(3) * 0x1000;
            match e.malloc(bytes, stream, 0) {
                Ok(a) => {
                    assert!(a.block_bytes >= e.round_size(bytes));
                    assert!(live.iter().all(|l| l.addr != a.addr));
                    live.push(Live { addr: a.addr, requested: bytes, stream, pending: false });
                }
                Err(oom) => {
                    ooms += 1;
                    let cap = capacity.expect("OOM without a capacity");
                    assert!(oom.reserved_bytes + oom.alloc_bytes > cap, "OOM although it fits: {oom:?}");
                }
            }
        } else if r < 85 {
            let i = rng.below(live.len() as u64) as usize;
            let l = live[i];
            if l.pending {
                e.free_completed(l.addr).unwrap();
                live.swap_remove(i);
            } else if rng.below(3) == 0 {
                e.free_requested(l.addr).unwrap();
                live[i].pending = true;
                // a pending block is not reusable: a same-size request gets another block
                if let Ok(a) = e.malloc(l.requested, l.stream, 0) {
                    if e.stats().num_sync_all_streams == syncs {
                        assert_ne!(a.addr, l.addr);
                    }
                    live.push(Live { addr: a.addr, requested: l.requested, stream: l.stream, pending: false });
                }
            } else {
                e.free(l.addr).unwrap();
                live.swap_remove(i);
                // a freed block is reused: the same request on the same stream needs no new memory
                // (except a request just below max_split_size that got a segment at or above it:
                // once merged back, the segment is an oversize block such requests may not take)
                let rounded = round_size(e.config(), l.requested);
                let msplit = e.config().max_split_size.unwrap_or(u64::MAX);
                let oversize_segment = rounded < msplit && allocation_size(e.config(), rounded) >= msplit;
                let before = e.stats().num_device_alloc;
                let a = e.malloc(l.requested, l.stream, 0).unwrap();
                if !oversize_segment {
                    assert_eq!(
                        e.stats().num_device_alloc,
                        before,
                        "{conf} seed {seed}: freed block of {} not reused",
                        l.requested
                    );
                }
                reuses += 1;
                live.push(Live { addr: a.addr, requested: l.requested, stream: l.stream, pending: false });
            }
        } else if r < 98 {
            // bad frees are refused without damage
            let l = live[rng.below(live.len() as u64) as usize];
            if live.iter().all(|x| x.addr != l.addr + 512) {
                assert!(e.free(l.addr + 512).is_err());
            }
            if !l.pending {
                assert!(e.free_completed(l.addr).is_err());
            } else {
                assert!(e.free_requested(l.addr).is_err());
            }
        } else {
            let reserved = e.stats().reserved_bytes.all.current;
            let rel = e.empty_cache();
            assert_eq!(e.stats().reserved_bytes.all.current, reserved - rel.bytes);
        }
        if e.stats().num_sync_all_streams != syncs {
            // empty_cache or the OOM retry synchronized: every pending free completed, and
            // the caller's own free_completed is still accepted once
            syncs = e.stats().num_sync_all_streams;
            for l in live.iter().filter(|l| l.pending) {
                // (unless the address was handed out again since)
                if !live.iter().any(|x| !x.pending && x.addr == l.addr) {
                    assert_eq!(e.free_completed(l.addr), Ok(()));
                }
            }
            live.retain(|l| !l.pending);
        }
        for ev in e.sink_mut().drain(..) {
            model.apply(&ev);
        }
        if step % 7 == 0 {
            let segs = e.segments();
            check_layout(&segs, e.stats(), &live, expandable);
            model.check_against(&segs);
            if let Some(cap) = capacity {
                if !expandable {
                    assert!(e.stats().reserved_bytes.all.current <= cap);
                }
            }
            assert_eq!(e.device().used_bytes(), e.stats().reserved_bytes.all.current);
        }
    }
    for l in std::mem::take(&mut live) {
        if l.pending {
            e.free_completed(l.addr).unwrap();
        } else {
            e.free(l.addr).unwrap();
        }
    }
    e.empty_cache();
    for ev in e.sink_mut().drain(..) {
        model.apply(&ev);
    }
    let segs = e.segments();
    model.check_against(&segs);
    assert!(segs.is_empty(), "{conf}: empty_cache with nothing live leaves segments");
    let st = e.stats();
    assert_eq!(st.reserved_bytes.all.current, 0);
    assert_eq!(st.active.all.current, 0);
    assert!(reuses > 0);
    if let Some(cap) = capacity {
        assert!(ooms > 0 || st.reserved_bytes.all.peak <= cap + 20 * MIB);
    }
}

#[test]
fn every_configuration_keeps_its_invariants() {
    for &(conf, cap) in CONFIGS {
        for seed in 1..=4 {
            run(conf, cap, seed, 1500);
        }
    }
}

#[test]
fn pending_frees_complete_at_empty_cache() {
    let mut e = Engine::new(AllocatorConfig::default(), None, SimDevice::new(None), Vec::<Event>::new());
    let a = e.malloc(4 << 20, 0, 0).unwrap();
    e.free_requested(a.addr).unwrap();
    assert_eq!(e.free_requested(a.addr), Err(recorder::engine::FreeError::DoubleFree(a.addr)));
    assert_eq!(e.stats().active_bytes.all.current, 4 << 20);
    assert_eq!(e.stats().allocated_bytes.all.current, 0);
    let rel = e.empty_cache();
    assert_eq!(rel.bytes, 20 << 20);
    assert_eq!(e.stats().num_sync_all_streams, 1);
    // the trace's own free_completed may still come: accepted once
    assert_eq!(e.free_completed(a.addr), Ok(()));
    assert!(e.free_completed(a.addr).is_err());
}

#[test]
fn streams_do_not_share_free_blocks() {
    let mut e = Engine::new(AllocatorConfig::default(), None, SimDevice::new(None), recorder::engine::NullSink);
    let a = e.malloc(1000, 1, 0).unwrap();
    e.free(a.addr).unwrap();
    let b = e.malloc(1000, 2, 0).unwrap();
    assert_ne!(a.addr, b.addr);
    assert_eq!(e.stats().segment.all.current, 2);
    let c = e.malloc(1000, 1, 0).unwrap();
    assert_eq!(c.addr, a.addr);
}

#[test]
fn ten_mib_plus_one() {
    // 10 MiB + 1 rounds to 10 MiB + 512 and gets a 12 MiB segment. The remainder, 2 MiB - 512,
    // is more than 1 MiB, so `should_split` splits it off (the reference's worked example says
    // "no split", which contradicts its own rule; the real traces replay exactly with the rule).
    let mut e = Engine::new(AllocatorConfig::default(), None, SimDevice::new(None), Vec::<Event>::new());
    let a = e.malloc(10 * MIB + 1, 0, 0).unwrap();
    assert_eq!(a.block_bytes, 10 * MIB + 512);
    assert_eq!(a.pool, Pool::Large);
    assert_eq!(e.stats().reserved_bytes.all.current, 12 * MIB);
    assert_eq!(e.stats().allocated_bytes.all.current, 10 * MIB + 512);
    assert_eq!(e.stats().requested_bytes.all.current, 10 * MIB + 1);
    assert_eq!(e.stats().inactive_split_bytes.all.current, 2 * MIB - 512);
    assert!(e.sink_mut().contains(&Event::Split {
        addr: a.addr,
        bytes: 10 * MIB + 512,
        remainder_bytes: 2 * MIB - 512
    }));
    // 11 MiB - 512 leaves exactly 1 MiB + 512 of 12 MiB... and 12 MiB - 1 MiB leaves 1 MiB: no split
    let b = e.malloc(11 * MIB, 0, 0).unwrap();
    assert_eq!(b.block_bytes, 12 * MIB);
    assert_eq!(e.stats().allocated_bytes.all.current, 10 * MIB + 512 + 12 * MIB);
}

#[test]
fn split_rules() {
    // large pool: remainder must exceed 1 MiB
    let mut e = Engine::new(AllocatorConfig::default(), None, SimDevice::new(None), Vec::<Event>::new());
    let a = e.malloc(19 * MIB, 0, 0).unwrap(); // 20 MiB segment, remainder exactly 1 MiB -> no split
    assert_eq!(a.block_bytes, 20 * MIB);
    let b = e.malloc(5 * MIB, 0, 0).unwrap(); // 20 MiB segment, remainder 15 MiB -> split
    assert_eq!(b.block_bytes, 5 * MIB);
    assert_eq!(e.stats().inactive_split_bytes.all.current, 15 * MIB);
    assert_eq!(e.malloc(18 * MIB, 0, 0).unwrap().block_bytes, 18 * MIB); // 18 MiB segment, nothing left
                                                                         // small pool: a remainder of 512 or more is split off
    let s = e.malloc(MIB - 1024, 0, 0).unwrap();
    assert_eq!((s.block_bytes, s.pool), (MIB - 1024, Pool::Small));
    let t = e.malloc(MIB + 512, 0, 0).unwrap(); // large pool, takes part of the 15 MiB block
    assert_eq!(t.addr, b.addr + 5 * MIB);
    assert_eq!(e.stats().inactive_split.all.current, 2);
    // max_split_size: a request below it never takes an oversize block
    let mut m = Engine::new(
        AllocatorConfig::parse("max_split_size_mb:64").unwrap(),
        None,
        SimDevice::new(None),
        Vec::<Event>::new(),
    );
    let big = m.malloc(100 * MIB, 0, 0).unwrap();
    m.free(big.addr).unwrap();
    let small = m.malloc(30 * MIB, 0, 0).unwrap();
    assert_ne!(small.addr, big.addr);
    // within max_non_split_rounding (20 MiB) the oversize block is reused whole
    let near = m.malloc(90 * MIB, 0, 0).unwrap();
    assert_eq!((near.addr, near.block_bytes), (big.addr, 100 * MIB));
    assert_eq!(m.stats().oversize_allocations.current, 1);
}

#[test]
fn oom_path_order_and_counters() {
    let cap = 100 * MIB;
    let mut e = Engine::new(AllocatorConfig::default(), Some(cap), SimDevice::new(None), Vec::<Event>::new());
    let a = e.malloc(60 * MIB, 0, 0).unwrap();
    e.free(a.addr).unwrap();
    // another stream cannot use the cached 60 MiB; 60 + 50 MiB > cap -> release everything,
    // retry once, succeed
    let b = e.malloc(50 * MIB, 1, 0).unwrap();
    assert_ne!(b.block_bytes, 0);
    assert_eq!(e.stats().num_alloc_retries, 1);
    assert_eq!(e.stats().num_ooms, 0);
    // cannot fit at all
    let err = e.malloc(80 * MIB, 0, 0).unwrap_err();
    assert_eq!(err.alloc_bytes, 80 * MIB);
    assert_eq!(err.capacity_bytes, Some(cap));
    assert_eq!(e.stats().num_alloc_retries, 2);
    assert_eq!(e.stats().num_ooms, 1);
    assert!(e.sink_mut().iter().any(|ev| matches!(ev, Event::Oom { alloc_bytes, .. } if *alloc_bytes == 80 * MIB)));
    // the device was never asked beyond the cap
    assert!(e.stats().reserved_bytes.all.peak <= cap);
}

/// Frees of addresses the engine never handed out are refused and change nothing, whatever the
/// address (including the all-ones value, which no device returns).
#[test]
fn frees_of_unknown_addresses_are_refused() {
    use recorder::engine::FreeError::UnknownAddress;
    let mut e = Engine::new(AllocatorConfig::default(), None, SimDevice::new(None), Vec::<Event>::new());
    let live: Vec<u64> = (0..40).map(|_| e.malloc(4096, 0, 0).unwrap().addr).collect();
    for bad in [u64::MAX, 0, 1, live[0] + 512] {
        for _ in 0..64 {
            assert_eq!(e.free(bad), Err(UnknownAddress(bad)));
            assert_eq!(e.free_requested(bad), Err(UnknownAddress(bad)));
            assert_eq!(e.free_completed(bad), Err(UnknownAddress(bad)));
        }
    }
    for a in live {
        e.free(a).unwrap();
    }
    assert_eq!(e.stats().allocated_bytes.all.current, 0);
}
