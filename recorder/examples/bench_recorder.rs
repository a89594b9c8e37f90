//! The recorder's overhead on the CPU: `cuda_bench`'s table on the simulated device.
//!
//! Nanoseconds per cached alloc+free pair (4 KiB, 1 MiB, 16 MiB, and 1,000 live 64 KiB blocks
//! freed in scrambled order) with recording off (the engine with a no-op sink) and on (the
//! recorder, its writer thread writing a trace), side by side with their difference, then what
//! this machine charges for a clock read and a lock (the recorder pays each once per call).
//! The simulated device costs nothing on the cached path, so this is the engine's and the
//! recorder's own cost.
//!
//! `cargo run --release -p alloctrace-recorder --example bench_recorder [DIR] [PAIRS] [ROUNDS]`
//! (the trace goes to `DIR`, default the temporary directory; `PAIRS` pairs per measurement,
//! default 2,000,000; the best of `ROUNDS` measurements, default 5, the two columns' rounds
//! alternating).

mod overhead;

use recorder::device::SimDevice;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::{Engine, NullSink};
use recorder::recorder::{Recorder, RecorderOptions};
use std::cell::RefCell;
use std::path::PathBuf;

fn main() {
    let dir = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let pairs: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let rounds: usize = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(5);

    // Recording off: the engine with a sink that discards. On: the recorder on the simulated
    // device, writing a trace.
    let off = RefCell::new(Engine::new(AllocatorConfig::default(), None, SimDevice::new(None), NullSink));
    let path = dir.join(format!("bench_recorder_{}.atrace", std::process::id()));
    let rec = Recorder::start(RecorderOptions::new(&path), SimDevice::new(None)).expect("start the recorder");
    let (off_ns, on_ns) = overhead::columns(
        (|b| off.borrow_mut().malloc(b, 0, 0).expect("malloc").addr, |p| off.borrow_mut().free(p).expect("free")),
        (|b| rec.malloc(b, 0).expect("malloc").addr, |p| rec.free(p).expect("free")),
        pairs,
        rounds,
    );
    let clock = rec.clock_source();
    let summary = rec.finish();

    overhead::print_table(&off_ns, &on_ns);
    println!("trace: {} (clock: {})", summary.describe(), clock.describe());
    println!("{}", overhead::primitives());
    let _ = std::fs::remove_file(&path);
}
