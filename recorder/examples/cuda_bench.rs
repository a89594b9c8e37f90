//! On a GPU: the recorder's overhead and a recorded Rust workload on the CUDA device.
//!
//! `cuda_bench OUTDIR` prints a table of nanoseconds per cached alloc+free pair (4 KiB, 1 MiB,
//! 16 MiB, and 1,000 live 64 KiB blocks freed in scrambled order, as PyTorch's anchor numbers
//! were taken): the engine on the CUDA device with recording off (a no-op sink) and on (the
//! recorder, writing a trace). Then it records `OUTDIR/recorded_rust_workload.atrace` (the
//! examples' synthetic workload, 300 iterations) and checks that a replay on the simulated
//! device reproduces its segment events.

mod common;
mod overhead;

use recorder::device::cuda::CudaDevice;
use recorder::engine::config::AllocatorConfig;
use recorder::engine::{Engine, NullSink};
use recorder::recorder::{replay, Recorder, RecorderOptions};
use std::path::PathBuf;
use std::time::Instant;

/// Many short rounds, the two columns alternating, each column's best round reported: on a
/// shared host a slow stretch spoils a few rounds of both columns, not one column's figure.
const PAIRS: u64 = 20_000;
const ROUNDS: usize = 250;

fn main() {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| ".".into()));
    let dev = CudaDevice::new(0).unwrap_or_else(|e| {
        eprintln!("cuda_bench: {e}");
        std::process::exit(1)
    });
    println!("device: {} ({} bytes, VMM granularity {})", dev.name(), dev.total_bytes(), dev.granularity_bytes());
    let name = dev.name().to_string();

    // Recording off: the engine on the CUDA device with a sink that discards. On: the recorder
    // on a second CUDA device handle (the same GPU), writing a trace.
    let off = std::cell::RefCell::new(Engine::new(AllocatorConfig::default(), None, dev, NullSink));
    let mut opts = RecorderOptions::new(out.join("bench_overhead.atrace"));
    opts.device_name = name.clone();
    let dev2 = CudaDevice::new(0).expect("a second handle on the device");
    let rec = Recorder::start(opts, dev2).expect("start the recorder");
    let (off_ns, on_ns) = overhead::columns(
        (|b| off.borrow_mut().malloc(b, 0, 0).expect("malloc").addr, |p| off.borrow_mut().free(p).expect("free")),
        (|b| rec.malloc(b, 0).expect("malloc").addr, |p| rec.free(p).expect("free")),
        PAIRS,
        ROUNDS,
    );
    let clock = rec.clock_source();
    let s = rec.finish();
    println!();
    overhead::print_table(&off_ns, &on_ns);
    println!("overhead trace: {} (clock: {})", s.describe(), clock.describe());
    println!("{}", overhead::primitives());
    let dev = rec.with_device(|d| {
        let (e, n) = d.errors();
        (e.to_vec(), n)
    });
    drop(rec);
    if dev.1 > 0 {
        println!("CUDA errors: {} {:?}", dev.1, dev.0);
    }

    // A recorded Rust workload on the CUDA device, default and expandable segments.
    for (file, conf) in [
        ("recorded_rust_workload.atrace", ""),
        ("recorded_rust_workload_expandable.atrace", "expandable_segments:True"),
    ] {
        let dev = CudaDevice::new(0).expect("device");
        let mut opts = RecorderOptions::new(out.join(file));
        opts.alloc_conf = conf.into();
        opts.device_name = name.clone();
        opts.command_line = std::env::args().collect();
        opts.notes.push("cuda_bench: synthetic training-like workload, 300 iterations, seed 7".into());
        let rec = Recorder::start(opts, dev).expect("start the recorder");
        let t = Instant::now();
        common::run(&rec, 7, Some(300), 0, |_| {});
        let st = rec.stats();
        let sum = rec.finish();
        let errs = rec.with_device(|d| d.errors().1);
        println!(
            "\nworkload [{conf}]: {:.2} s, peak reserved {} B, peak allocated {} B, CUDA errors {errs}\n  {}",
            t.elapsed().as_secs_f64(),
            st.reserved_bytes.all.peak,
            st.allocated_bytes.all.peak,
            sum.describe()
        );
        match replay::check_segments(&out.join(file)) {
            Ok(c) => println!(
                "  replay on SimDevice: {} events, {} allocs, segment ops recorded {} replayed {}: {}",
                c.events,
                c.allocs,
                c.recorded.len(),
                c.replayed.len(),
                if c.same() { "SAME".to_string() } else { format!("DIFFERENT at {:?}", c.first_difference()) }
            ),
            Err(e) => println!("  replay failed: {e}"),
        }
    }
}
