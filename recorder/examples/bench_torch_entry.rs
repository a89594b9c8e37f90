//! The default back-end's own cost on the CPU: nanoseconds per entry of PyTorch's allocator
//! trace forwarded to `alloctrace_torch_entry` (the C ABI its trace tracker calls), for the
//! three entries of a cached `torch.empty` + free (alloc, free requested, free completed),
//! with the recorder on the simulated device writing a trace. Each entry carries a time stamp
//! counter reading, as PyTorch's do on x86-64.
//!
//! `cargo run --release -p alloctrace-recorder --example bench_torch_entry [DIR] [TRIPLES] [ROUNDS]`

use recorder::ffi::{alloctrace_dropped, alloctrace_shutdown, alloctrace_torch_event, torch_action};
use std::hint::black_box;
use std::time::Instant;

/// What PyTorch passes with each entry: its time stamp counter reading (0 where there is none,
/// as on other processors).
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rdtsc` exists on every x86-64 processor and has no preconditions.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    0
}

fn main() {
    let dir = std::env::args().nth(1).map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let n: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let rounds: usize = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let path = dir.join(format!("bench_torch_entry_{}.atrace", std::process::id()));
    // SAFETY: set before any other thread exists.
    unsafe {
        std::env::set_var("ALLOCTRACE_DEVICE", "sim");
        std::env::set_var("ALLOCTRACE_OUTPUT", &path);
    }
    let base = 0x7f00_0000_0000u64;
    alloctrace_torch_event(torch_action::SEGMENT_ALLOC, 0, base, 2 << 20, 0, ticks(), 0, 0);
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let t = Instant::now();
        for i in 0..n {
            let addr = black_box(base + (i & 7) * 4096);
            alloctrace_torch_event(torch_action::ALLOC, 0, addr, 4096, 0, ticks(), 0, 0);
            alloctrace_torch_event(torch_action::FREE_REQUESTED, 0, addr, 4096, 0, ticks(), 0, 0);
            alloctrace_torch_event(torch_action::FREE_COMPLETED, 0, addr, 4096, 0, ticks(), 0, 0);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    let dropped = alloctrace_dropped();
    let rc = alloctrace_shutdown();
    println!(
        "torch entries: {best:.1} ns per alloc + free (3 entries), {:.1} ns per entry; {dropped} events dropped \
         (the writer starved of CPU), shutdown {rc}",
        best / 3.0
    );
    let _ = std::fs::remove_file(&path);
}
