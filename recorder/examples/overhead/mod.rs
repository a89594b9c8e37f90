//! The overhead table shared by `bench_recorder` (simulated device) and `cuda_bench` (GPU):
//! nanoseconds per cached alloc+free pair, 4 KiB, 1 MiB, 16 MiB, and 1,000 live 64 KiB blocks
//! freed in scrambled order (as PyTorch's anchor numbers were taken), recording off and on side
//! by side, with what the machine charges for the recorder's two fixed costs per call.

use std::hint::black_box;
use std::time::Instant;

pub const LABELS: [&str; 4] = ["pair 4 KiB", "pair 1 MiB", "pair 16 MiB", "1000 live 64 KiB, scrambled"];
const SIZES: [u64; 3] = [4096, 1 << 20, 16 << 20];

/// One measurement: nanoseconds per pair of `pairs` alloc+free pairs of `size`, or of `pairs`
/// allocations of 1,000 live blocks freed in scrambled order when `size` is `None`.
fn measure(malloc: &mut impl FnMut(u64) -> u64, free: &mut impl FnMut(u64), size: Option<u64>, pairs: u64) -> f64 {
    let t = Instant::now();
    match size {
        Some(size) => {
            for _ in 0..pairs {
                let p = malloc(black_box(size));
                free(black_box(p));
            }
            t.elapsed().as_nanos() as f64 / pairs as f64
        }
        None => {
            let k = 1000usize;
            let reps = (pairs as usize / k).max(1);
            let mut ps = vec![0u64; k];
            for _ in 0..reps {
                for (i, p) in ps.iter_mut().enumerate() {
                    *p = malloc(65536 + 512 * (i % 7) as u64);
                }
                for i in 0..k {
                    free(ps[(i * 7919) % k]);
                }
            }
            t.elapsed().as_nanos() as f64 / (reps * k) as f64
        }
    }
}

/// Both columns, recording off and on, each the best of `rounds` measurements; the rounds of
/// the two columns alternate, so that both see the same moments of a noisy machine.
pub fn columns<A, B, C, D>(
    (mut off_malloc, mut off_free): (A, B),
    (mut on_malloc, mut on_free): (C, D),
    pairs: u64,
    rounds: usize,
) -> (Vec<f64>, Vec<f64>)
where
    A: FnMut(u64) -> u64,
    B: FnMut(u64),
    C: FnMut(u64) -> u64,
    D: FnMut(u64),
{
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for size in SIZES.iter().map(|&s| Some(s)).chain([None]) {
        let (mut best_off, mut best_on) = (f64::INFINITY, f64::INFINITY);
        // A warm-up pair each: the first segment comes from the device.
        if let Some(s) = size {
            let p = off_malloc(s);
            off_free(p);
            let p = on_malloc(s);
            on_free(p);
        }
        for _ in 0..rounds {
            best_off = best_off.min(measure(&mut off_malloc, &mut off_free, size, pairs));
            best_on = best_on.min(measure(&mut on_malloc, &mut on_free, size, pairs));
        }
        off.push(best_off);
        on.push(best_on);
    }
    (off, on)
}

pub fn print_table(off: &[f64], on: &[f64]) {
    println!("| cached alloc+free, ns per pair | recording off | recording on | on - off |");
    println!("|---|---|---|---|");
    for ((label, off), on) in LABELS.iter().zip(off).zip(on) {
        println!("| {label} | {off:.1} | {on:.1} | {:.1} |", on - off);
    }
}

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 processor and has no preconditions.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn rdtsc() -> u64 {
    0
}

/// What this machine charges for a time stamp counter read, a `CLOCK_MONOTONIC` read and an
/// uncontended `std::sync::Mutex` lock and unlock: the recorder reads the clock and takes a
/// lock once per call.
pub fn primitives() -> String {
    let n = 2_000_000u32;
    let per = |t: Instant| t.elapsed().as_nanos() as f64 / f64::from(n);
    let t = Instant::now();
    let mut acc = 0u64;
    for _ in 0..n {
        acc = acc.wrapping_add(rdtsc());
    }
    black_box(acc);
    let tsc = per(t);
    let t = Instant::now();
    for _ in 0..n {
        black_box(Instant::now());
    }
    let mono = per(t);
    let m = std::sync::Mutex::new(0u64);
    let t = Instant::now();
    for _ in 0..n {
        *m.lock().unwrap() += 1;
    }
    black_box(&m);
    let mutex = per(t);
    let source = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!(
        "this machine: rdtsc {tsc:.1} ns, CLOCK_MONOTONIC {mono:.1} ns (kernel clock source {source}), \
std Mutex lock+unlock {mutex:.1} ns"
    )
}
