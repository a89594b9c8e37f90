//! The trace reader on arbitrary bytes: it must never panic, and never allocate unbounded
//! memory from a hostile length or count (libFuzzer's -rss_limit_mb catches that).
#![no_main]
use libfuzzer_sys::fuzz_target;
use recorder::trace::TraceReader;

fuzz_target!(|data: &[u8]| {
    if let Ok(mut r) = TraceReader::new(data) {
        let mut chunk = Vec::new();
        while r.next_chunk(&mut chunk) {}
        let _ = r.end().describe();
    }
});
