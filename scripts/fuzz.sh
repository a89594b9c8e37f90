#!/usr/bin/env bash
# Fuzzes the trace reader, the record decoder past the checksums (trace_records: frames are
# re-framed with valid CRCs) and the PyTorch snapshot importer with libFuzzer (cargo fuzz),
# seeded with the shipped traces, snapshots and the hostile inputs of the regression tests.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] (default 60; CI keeps it short)
# Needs `cargo install cargo-fuzz`; on a stable toolchain RUSTC_BOOTSTRAP=1 enables the
# sanitizer flags it uses. A crash lands in fuzz/artifacts/TARGET/ and becomes a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
hostile=analyzer/tests/fixtures/hostile
mkdir -p fuzz/corpus/trace_reader fuzz/corpus/trace_records fuzz/corpus/torch_import
cp traces/*.atrace "$hostile"/*.atrace fuzz/corpus/trace_reader/
cp analyzer/tests/fixtures/torch/*.pickle "$hostile"/*.pickle fuzz/corpus/torch_import/ 2>/dev/null || true
# Records, not zstd streams: seeds with uncompressed chunk bodies (and the hostile traces as they are).
cargo run -q -p alloctrace-recorder --example raw_chunks -- fuzz/corpus/trace_records traces/*.atrace
cp "$hostile"/*.atrace fuzz/corpus/trace_records/
cd fuzz
export RUSTC_BOOTSTRAP=1
for target in trace_reader trace_records torch_import; do
  echo "== $target for $SECS s"
  cargo fuzz run "$target" "corpus/$target" -- -max_total_time="$SECS" -rss_limit_mb=1024 -max_len=2000000 2>&1 \
    | grep -E "^#[0-9]+ +DONE|Done [0-9]+ runs|ERROR|crash|SUMMARY" || true
done
