//! Private memory pools (CUDA graphs, `torch.cuda.MemPool`): a pool's blocks come only from its
//! own segments and go back to them, the cache release frees a pool's segments only once the
//! pool is freeable, and a request to a pool does not release the cache on its OOM path.

use recorder::device::SimDevice;
use recorder::engine::config::{AllocatorConfig, MIB};
use recorder::engine::Engine;
use recorder::trace::{Event, Observed, RecordedPools};

const GRAPH: [u64; 2] = [1, 0];
const MEMPOOL: [u64; 2] = [0, 1];

fn engine(capacity: Option<u64>) -> Engine<SimDevice, Vec<Event>> {
    Engine::new(AllocatorConfig::default(), capacity, SimDevice::new(None), Vec::new())
}

fn segment_frees(events: &[Event]) -> Vec<u64> {
    events.iter().filter_map(|e| if let Event::SegmentFree { addr, .. } = e { Some(*addr) } else { None }).collect()
}

#[test]
fn a_private_pool_and_the_default_pools_never_share_a_block() {
    let mut e = engine(None);
    let g = e.malloc_in(GRAPH, 4096, 0, 0).unwrap();
    e.free(g.addr).unwrap();
    // A default request of the same size on the same stream does not get the graph's block.
    let d = e.malloc(4096, 0, 0).unwrap();
    assert_ne!(d.addr, g.addr);
    assert_eq!(e.stats().segment.all.current, 2);
    e.free(d.addr).unwrap();
    // The pool's next request gets its own block back, and a third pool makes its own segment.
    assert_eq!(e.malloc_in(GRAPH, 4096, 0, 0).unwrap().addr, g.addr);
    assert_eq!(e.malloc(4096, 0, 0).unwrap().addr, d.addr);
    let m = e.malloc_in(MEMPOOL, 4096, 0, 0).unwrap();
    assert!(m.addr != g.addr && m.addr != d.addr);
    assert_eq!(e.stats().segment.all.current, 3);
    assert_eq!(e.stats().reserved_bytes.all.current, 6 * MIB);
    // Each private segment is named in the events, right after its segment_alloc.
    let ev = e.sink_mut().clone();
    let pos =
        |want: u64| ev.iter().position(|x| matches!(x, Event::SegmentAlloc { addr, .. } if *addr == want)).unwrap();
    assert_eq!(ev[pos(g.addr) + 1], Event::SegmentPool { addr: g.addr, pool_id: GRAPH });
    assert_eq!(ev[pos(m.addr) + 1], Event::SegmentPool { addr: m.addr, pool_id: MEMPOOL });
    assert!(!matches!(ev[pos(d.addr) + 1], Event::SegmentPool { .. }));
}

#[test]
fn a_private_pool_is_released_only_once_freeable_and_after_the_default_pools() {
    let mut e = engine(None);
    let g = e.malloc_in(GRAPH, 8 * MIB, 0, 0).unwrap();
    let d = e.malloc(8 * MIB, 0, 0).unwrap();
    e.free(g.addr).unwrap();
    e.free(d.addr).unwrap();
    e.sink_mut().clear();
    e.empty_cache();
    assert_eq!(segment_frees(e.sink_mut()), vec![d.addr], "the graph still uses its pool");
    let d = e.malloc(8 * MIB, 0, 0).unwrap();
    e.free(d.addr).unwrap();
    e.set_pool_freeable(GRAPH);
    e.sink_mut().clear();
    e.empty_cache();
    assert_eq!(segment_frees(e.sink_mut()), vec![d.addr, g.addr]);
    assert_eq!(e.stats().reserved_bytes.all.current, 0);
    // A request to the pool uses it again: no longer freeable.
    let g = e.malloc_in(GRAPH, 8 * MIB, 0, 0).unwrap();
    e.free(g.addr).unwrap();
    e.empty_cache();
    assert_eq!(e.stats().reserved_bytes.all.current, 20 * MIB);
}

#[test]
fn a_request_to_a_private_pool_does_not_release_the_cache() {
    // 2 MiB of capacity: the default pools' cached small segment must be released before a new
    // one fits. A default request on another stream releases it and succeeds; a graph's request
    // fails, as PyTorch skips `release_cached_blocks` while a capture is under way.
    let setup = || {
        let mut e = engine(Some(2 * MIB));
        let a = e.malloc(4096, 0, 0).unwrap();
        e.free(a.addr).unwrap();
        e
    };
    let mut e = setup();
    assert!(e.malloc(4096, 7, 0).is_ok());
    assert_eq!(e.stats().num_alloc_retries, 1);
    let mut e = setup();
    assert!(e.malloc_in(GRAPH, 4096, 7, 0).is_err());
    assert_eq!(e.stats().num_alloc_retries, 0);
    assert_eq!(e.stats().reserved_bytes.all.current, 2 * MIB);
}

/// Random requests spread over the default pools and two private pools, on two streams, some
/// pools made freeable and the cache released now and then: every block handed out lies in a
/// segment of the pool it was asked of, as the engine's own events tell a replay
/// ([`RecordedPools`], which reads them as it reads a recorded trace).
#[test]
fn every_block_comes_from_a_segment_of_its_pool() {
    for conf in ["", "max_split_size_mb:64", "expandable_segments:True"] {
        let config = AllocatorConfig::parse(conf).unwrap();
        let mut e = Engine::new(config, None, SimDevice::new(None), Vec::new());
        let mut seen = RecordedPools::default();
        let mut live: Vec<(u64, Option<[u64; 2]>)> = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let pools = [None, Some(GRAPH), Some(MEMPOOL)];
        for step in 0..20_000 {
            match next(10) {
                0..=5 => {
                    let pool = pools[next(3) as usize];
                    let bytes = match next(4) {
                        0 | 1 => 1 + next(600 << 10),
                        2 => (1 << 20) + next(12 << 20),
                        _ => (10 << 20) + next(50 << 20),
                    };
                    let stream = next(2);
                    let a = match pool {
                        Some(p) => e.malloc_in(p, bytes, stream, 0),
                        None => e.malloc(bytes, stream, 0),
                    }
                    .unwrap();
                    live.push((a.addr, pool));
                }
                6..=8 if !live.is_empty() => {
                    let (addr, _) = live.swap_remove(next(live.len() as u64) as usize);
                    e.free(addr).unwrap();
                }
                _ => {
                    if next(2) == 0 {
                        e.set_pool_freeable(pools[1 + next(2) as usize].unwrap());
                    }
                    e.empty_cache();
                }
            }
            let events: Vec<Event> = e.sink_mut().drain(..).collect();
            for ev in &events {
                if let Observed::PrivateFreed { pool_id: p, .. } = seen.observe(ev) {
                    // Only a freeable pool's segments are released.
                    assert!(e.private_pools().any(|(id, freeable)| id == p && freeable), "{conf}: step {step}");
                }
            }
            if let Some(&(addr, pool)) = live.last() {
                assert_eq!(seen.pool_of(addr), pool, "{conf}: step {step}, block {addr:#x}");
            }
        }
        for &(addr, pool) in &live {
            assert_eq!(seen.pool_of(addr), pool, "{conf}: block {addr:#x} at the end");
        }
    }
}

/// Deleting a MemPool releases its pool alone (PyTorch's `emptyCache(pool)`), and the next
/// default request reuses the default pools' cached segment. The recording of that replays to
/// the same device calls: the pool's release is not replayed as a release of the whole cache
/// (which would free the cached default segment and allocate it again).
#[test]
fn a_deleted_mempool_replays_as_its_own_release() {
    let mut e = engine(None);
    let d = e.malloc(8 * MIB, 0, 0).unwrap();
    e.free(d.addr).unwrap();
    let m = e.malloc_in(MEMPOOL, 8 * MIB, 0, 0).unwrap();
    e.free(m.addr).unwrap();
    e.release_pool(MEMPOOL);
    let d2 = e.malloc(8 * MIB, 0, 0).unwrap();
    assert_eq!(d2.addr, d.addr, "the cached default segment serves the request");
    let events = std::mem::take(e.sink_mut());
    assert_eq!(segment_frees(&events), vec![m.addr]);
    // Cargo's folder for integration tests' files.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mempool-{}.atrace", std::process::id()));
    let mut w =
        recorder::trace::TraceWriter::create(&path, &recorder::trace::Header::new(recorder::trace::Source::Simulated))
            .unwrap();
    for (i, event) in events.into_iter().enumerate() {
        w.write(&recorder::trace::Record { time_ns: i as u64, event }).unwrap();
    }
    w.finish().unwrap();
    let c = recorder::recorder::replay::check_segments(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(c.same(), "recorded {:?}, replayed {:?}", c.recorded, c.replayed);
    assert_eq!(c.recorded.len(), 3);
}
