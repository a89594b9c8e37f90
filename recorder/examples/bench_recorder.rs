//! The recorder's overhead on the CPU: `cuda_bench`'s table on the simulated device.
//!
//! Nanoseconds per cached alloc+free pair (4 KiB, 1 MiB, 16 MiB, and 1,000 live 64 KiB blocks
//! freed in scrambled order) with recording off (the engine with a no-op sink) and on (the
//! recorder, its writer thread writing a trace), side by side with their ratio. The simulated
//! device costs nothing on the cached path, so this is the engine's and the recorder's own cost.
//!
//! `cargo run --release -p alloctrace-recorder --example bench_recorder [DIR] [PAIRS] [ROUNDS] [off|on]`
//! (the trace goes to `DIR`, default the temporary directory; `PAIRS` pairs per measurement,
//! default 2,000,000; the best of `ROUNDS` measurements, default 5; small counts for callgrind;
//! `off` or `on` runs one column only, for profiling it).

use recorder::device::SimDevice;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::{Engine, NullSink};
use recorder::recorder::{Recorder, RecorderOptions};
use std::cell::RefCell;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

fn best_of(rounds: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..rounds).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn pair_loop(
    mut malloc: impl FnMut(u64) -> u64,
    mut free: impl FnMut(u64),
    size: u64,
    pairs: u64,
    rounds: usize,
) -> f64 {
    let p = malloc(size);
    free(p);
    best_of(rounds, || {
        let t = Instant::now();
        for _ in 0..pairs {
            let p = malloc(black_box(size));
            free(black_box(p));
        }
        t.elapsed().as_nanos() as f64 / pairs as f64
    })
}

fn many_loop(mut malloc: impl FnMut(u64) -> u64, mut free: impl FnMut(u64), pairs: u64, rounds: usize) -> f64 {
    let k = 1000usize;
    let reps = (pairs as usize / k).max(1);
    let mut ps = vec![0u64; k];
    best_of(rounds, || {
        let t = Instant::now();
        for _ in 0..reps {
            for (i, p) in ps.iter_mut().enumerate() {
                *p = malloc(65536 + 512 * (i % 7) as u64);
            }
            for i in 0..k {
                free(ps[(i * 7919) % k]);
            }
        }
        t.elapsed().as_nanos() as f64 / (reps * k) as f64
    })
}

fn main() {
    let dir = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let pairs: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let rounds: usize = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let sizes = [4096u64, 1 << 20, 16 << 20];
    let only = std::env::args().nth(4).unwrap_or_default();
    let labels = ["pair 4 KiB", "pair 1 MiB", "pair 16 MiB", "1000 live 64 KiB, scrambled"];

    // Recording off: the engine with a sink that discards.
    let off = RefCell::new(Engine::new(AllocatorConfig::default(), None, SimDevice::new(None), NullSink));
    let off_malloc = |b| off.borrow_mut().malloc(b, 0, 0).expect("malloc").addr;
    let off_free = |p| off.borrow_mut().free(p).expect("free");
    let mut off_ns = vec![f64::NAN; 4];
    if only != "on" {
        off_ns = sizes.iter().map(|&s| pair_loop(off_malloc, off_free, s, pairs, rounds)).collect();
        off_ns.push(many_loop(off_malloc, off_free, pairs, rounds));
    }

    // Recording on: the recorder on the simulated device, writing a trace.
    let path = dir.join(format!("bench_recorder_{}.atrace", std::process::id()));
    let rec = Recorder::start(RecorderOptions::new(&path), SimDevice::new(None)).expect("start the recorder");
    let rec_malloc = |b| rec.malloc(b, 0).expect("malloc").addr;
    let rec_free = |p| rec.free(p).expect("free");
    let mut on_ns = vec![f64::NAN; 4];
    if only != "off" {
        on_ns = sizes.iter().map(|&s| pair_loop(rec_malloc, rec_free, s, pairs, rounds)).collect();
        on_ns.push(many_loop(rec_malloc, rec_free, pairs, rounds));
    }
    let summary = rec.finish();

    println!("| cached alloc+free, ns per pair | recording off | recording on | on / off |");
    println!("|---|---|---|---|");
    for ((label, off), on) in labels.iter().zip(&off_ns).zip(&on_ns) {
        println!("| {label} | {off:.1} | {on:.1} | {:.2} |", on / off);
    }
    println!("trace: {}", summary.describe());
    let _ = std::fs::remove_file(&path);
}
