//! A Rust workload on the simulated device through the recorder, for the `kill -9` test and
//! for trying the recorder without a GPU.
//!
//! `sim_workload TRACE [ITERATIONS] [PAUSE_US]`: runs forever without ITERATIONS (0 = forever);
//! sleeps PAUSE_US microseconds after each iteration (a job's compute between allocations; a
//! tight loop in a debug build can outrun the writer). After every iteration it
//! prints `progress <events produced> <ns since the trace's clock origin>` (flushed), so a parent
//! that kills it knows how far it got.

mod common;

use recorder::device::SimDevice;
use recorder::recorder::{Recorder, RecorderOptions};
use std::io::Write;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "sim_workload.atrace".into());
    let iterations = args.next().and_then(|s| s.parse().ok()).filter(|&n: &u64| n > 0);
    let pause = std::time::Duration::from_micros(args.next().and_then(|s| s.parse().ok()).unwrap_or(0));
    let rec = Recorder::start(RecorderOptions::new(&path), SimDevice::new(None)).expect("start the recorder");
    let out = std::io::stdout();
    common::run(&rec, 42, iterations, 0, |_| {
        let mut o = out.lock();
        let _ = writeln!(o, "progress {} {}", rec.produced_events(), rec.now_ns());
        let _ = o.flush();
        drop(o);
        std::thread::sleep(pause);
    });
    println!("{}", rec.finish().describe());
}
