//! Where the time of a scan goes: decoding alone, the pipelined scan with a no-op fold, and
//! the summary fold. Run: `cargo run --release -p alloctrace --example bench_scan -- TRACE`.
use analyzer::source::summary::SummaryFold;
use analyzer::source::tracefile;
use recorder::trace::TraceReader;
use std::time::Instant;

fn main() {
    let path = std::env::args().nth(1).expect("usage: bench_scan TRACE");
    let path = std::path::Path::new(&path);
    let t = Instant::now();
    let mut r = TraceReader::open(path).unwrap();
    let mut chunk = Vec::new();
    let mut n = 0u64;
    while r.next_chunk(&mut chunk) {
        n += chunk.len() as u64;
    }
    let decode = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let s = tracefile::scan(path, |_, _| {}).unwrap();
    let scan = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut fold = SummaryFold::new();
    tracefile::scan(path, |i, r| fold.record(i, r)).unwrap();
    let summary = t.elapsed().as_secs_f64();
    let m = |secs: f64| n as f64 / secs / 1e6;
    println!("events {n} ({})", s.events);
    println!("decode only (1 thread)     {decode:.3} s  {:.1} M events/s", m(decode));
    println!("scan, no-op fold           {scan:.3} s  {:.1} M events/s", m(scan));
    println!("scan + summary fold        {summary:.3} s  {:.1} M events/s", m(summary));
}
