//! The PyTorch snapshot importer (pickle reader included) on arbitrary bytes: it must never
//! panic, and never allocate unbounded memory.
#![no_main]
use analyzer::source::import::torch::{import_snapshot, ImportOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = import_snapshot(data, &ImportOptions::default());
});
