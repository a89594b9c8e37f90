//! Engine throughput: a replay-like loop (random sizes, a window of live allocations) and a
//! cached alloc+free pair, with a null sink and with a `Vec<Event>` sink.
//! `cargo run --release -p alloctrace-recorder --example bench_engine [replay|pair] [scale]`
//! (an optional section and a divisor of the iteration counts, for profiling one part).

use recorder::device::SimDevice;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::{Engine, NullSink, Sink};
use recorder::trace::Event;
use std::hint::black_box;
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Sizes like a training step: many small tensors, some activations, a few big buffers.
fn size(rng: &mut Rng) -> u64 {
    match rng.next() % 100 {
        0..=59 => 4 + rng.next() % (64 << 10),
        60..=89 => (1 << 20) + rng.next() % (8 << 20),
        _ => (16 << 20) + rng.next() % (64 << 20),
    }
}

fn replay_loop<S: Sink>(sink: S, conf: &str, ops: usize, clear: impl Fn(&mut S)) -> f64 {
    let mut e = Engine::new(AllocatorConfig::parse(conf).unwrap(), None, SimDevice::new(None), sink);
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut live: Vec<u64> = Vec::with_capacity(512);
    let sizes: Vec<u64> = (0..4096).map(|_| size(&mut rng)).collect();
    // warm the cache
    for i in 0..ops / 10 {
        if live.len() < 256 {
            live.push(e.malloc(sizes[i % 4096], 0, 0).unwrap().addr);
        } else {
            let j = (rng.next() % live.len() as u64) as usize;
            e.free(live.swap_remove(j)).unwrap();
        }
    }
    let start = Instant::now();
    let mut events = 0u64;
    let mut i = 0usize;
    while (events as usize) < ops {
        if live.len() < 256 || (live.len() < 400 && rng.next() & 1 == 0) {
            live.push(e.malloc(sizes[i % 4096], 0, 0).unwrap().addr);
            i += 1;
        } else {
            let j = (rng.next() % live.len() as u64) as usize;
            e.free(live.swap_remove(j)).unwrap();
        }
        events += 1;
        if events & 0xffff == 0 {
            // keep a Vec sink from growing without bound
            clear(e.sink_mut());
        }
    }
    let secs = start.elapsed().as_secs_f64();
    black_box(e.stats().reserved_bytes.all.peak);
    events as f64 / secs
}

fn pair_ns<S: Sink>(sink: S, iters: u64, clear: impl Fn(&mut S)) -> f64 {
    let mut e = Engine::new(AllocatorConfig::default(), None, SimDevice::new(None), sink);
    let keep: Vec<u64> = (0..64).map(|i| e.malloc(4096 * (i + 1), 0, 0).unwrap().addr).collect();
    let start = Instant::now();
    for k in 0..iters {
        let a = e.malloc(black_box(8192), 0, 0).unwrap();
        e.free(a.addr).unwrap();
        if k & 0xfff == 0 {
            clear(e.sink_mut());
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / iters as f64;
    black_box(keep);
    ns
}

fn main() {
    let section = std::env::args().nth(1).unwrap_or_default();
    let scale: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let ops = 5_000_000 / scale;
    for conf in ["", "expandable_segments:True", "max_split_size_mb:64"] {
        if !"replay".contains(section.as_str()) {
            break;
        }
        let null = replay_loop(NullSink, conf, ops, |_| {});
        let vec = replay_loop(Vec::<Event>::with_capacity(1 << 18), conf, ops, |v| v.clear());
        println!(
            "replay loop [{}]: {:.2} M events/s (NullSink), {:.2} M events/s (Vec sink)",
            if conf.is_empty() { "default" } else { conf },
            null / 1e6,
            vec / 1e6
        );
    }
    if !"pair".contains(section.as_str()) {
        return;
    }
    let n = 20_000_000 / scale as u64;
    println!("cached alloc+free pair: {:.1} ns (NullSink)", pair_ns(NullSink, n, |_| {}));
    println!(
        "cached alloc+free pair: {:.1} ns (Vec sink)",
        pair_ns(Vec::<Event>::with_capacity(1 << 16), n, |v| v.clear())
    );
}
