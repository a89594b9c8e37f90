//! A Rust workload on the simulated device through the recorder, for the `kill -9` test and
//! for trying the recorder without a GPU.
//!
//! `sim_workload TRACE [ITERATIONS]`: runs forever without ITERATIONS. After every iteration it
//! prints `progress <events produced> <ns since the trace's clock origin>` (flushed), so a parent
//! that kills it knows how far it got.

mod common;

use recorder::device::SimDevice;
use recorder::recorder::{Recorder, RecorderOptions};
use std::io::Write;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "sim_workload.atrace".into());
    let iterations = args.next().and_then(|s| s.parse().ok());
    let rec = Recorder::start(RecorderOptions::new(&path), SimDevice::new(None)).expect("start the recorder");
    let out = std::io::stdout();
    common::run(&rec, 42, iterations, 0, |_| {
        let mut o = out.lock();
        let _ = writeln!(o, "progress {} {}", rec.produced_events(), rec.now_ns());
        let _ = o.flush();
    });
    println!("{}", rec.finish().describe());
}
