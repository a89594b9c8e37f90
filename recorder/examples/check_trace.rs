//! `check_trace TRACE...`: for each recorded trace, its size per event, how it ended, and
//! whether a replay through the engine on the simulated device (same settings) reproduces its
//! segment alloc/free/map/unmap sizes exactly.

use recorder::recorder::replay;
use recorder::trace::{Event, TraceReader};

fn main() {
    let mut all_same = true;
    for path in std::env::args().skip(1) {
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let (mut sites, mut marks, mut releases) = (0, 0, 0);
        if let Ok(r) = TraceReader::open(&path) {
            let p = r.header().placement;
            if p.is_known() {
                println!(
                    "{path}: device {:?}, rank {:?}, local rank {:?}, world size {:?}",
                    p.device_index, p.rank, p.local_rank, p.world_size
                );
            }
            for rec in r {
                match rec.event {
                    Event::CallSite { .. } => sites += 1,
                    Event::Mark { .. } => marks += 1,
                    Event::CacheRelease { .. } => releases += 1,
                    _ => {}
                }
            }
        }
        match replay::check_segments(std::path::Path::new(&path)) {
            Ok(c) => {
                all_same &= c.same();
                println!(
                    "{path}: {} events, {} allocs, {bytes} bytes ({:.2} bytes/event), {}; call sites {sites}, marks {marks}, cache releases {releases}; segment ops recorded {} replayed {}: {}",
                    c.events,
                    c.allocs,
                    bytes as f64 / c.events.max(1) as f64,
                    c.end.describe(),
                    c.recorded.len(),
                    c.replayed.len(),
                    if c.same() { "SAME".to_string() } else { format!("DIFFERENT at {:?}", c.first_difference()) }
                );
            }
            Err(e) => {
                all_same = false;
                println!("{path}: {e}");
            }
        }
    }
    std::process::exit(if all_same { 0 } else { 1 });
}
