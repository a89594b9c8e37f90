//! Structure-aware: the input is a trace whose frame checksums need not match. Every frame is
//! re-framed with a valid CRC before the reader sees it, so mutations of record bytes reach the
//! record decoder, the bounds and the analyses instead of stopping at the checksum. Seeds are
//! traces with uncompressed chunk bodies (`recorder/examples/raw_chunks.rs` writes them), so
//! libFuzzer mutates records, not zstd streams.
#![no_main]
use analyzer::source::summary::SummaryFold;
use libfuzzer_sys::fuzz_target;
use recorder::trace::TraceReader;

/// `data` with every frame's CRC recomputed (a cut last frame is kept as it is).
fn reframe(data: &[u8]) -> Vec<u8> {
    let mut out = data[..data.len().min(12)].to_vec();
    let mut at = 12;
    while at + 9 <= data.len() {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        let kind = data[at + 4];
        let end = (at + 9).saturating_add(len).min(data.len());
        let payload = &data[at + 9..end];
        let mut h = crc32fast::Hasher::new();
        h.update(&[kind]);
        h.update(payload);
        out.extend_from_slice(&data[at..at + 5]);
        out.extend_from_slice(&h.finalize().to_le_bytes());
        out.extend_from_slice(payload);
        at = end;
    }
    out.extend_from_slice(&data[at.min(data.len())..]);
    out
}

fuzz_target!(|data: &[u8]| {
    let bytes = reframe(data);
    if let Ok(r) = TraceReader::new(&bytes[..]) {
        let mut fold = SummaryFold::new();
        let mut reader = r;
        for (i, rec) in (&mut reader).enumerate() {
            fold.record(i as u64, &rec);
        }
        let _ = reader.end().describe();
    }
});
