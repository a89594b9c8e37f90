#!/usr/bin/env bash
# Fuzzes the trace reader and the PyTorch snapshot importer with libFuzzer (cargo fuzz), seeded
# with the shipped traces and snapshots. Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] (default 120)
# Needs `cargo install cargo-fuzz`; on a stable toolchain RUSTC_BOOTSTRAP=1 enables the
# sanitizer flags it uses. A crash lands in fuzz/artifacts/TARGET/ and becomes a regression test.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECS=${1:-120}
export RUSTC_BOOTSTRAP=1
mkdir -p corpus/trace_reader corpus/torch_import
cp ../traces/*.atrace corpus/trace_reader/
cp ../analyzer/tests/fixtures/torch/*.pickle corpus/torch_import/ 2>/dev/null || true
for target in trace_reader torch_import; do
  echo "== $target for $SECS s"
  cargo fuzz run "$target" "corpus/$target" -- -max_total_time="$SECS" -rss_limit_mb=1024 -max_len=2000000 2>&1 \
    | grep -E "^#[0-9]+ +DONE|Done [0-9]+ runs|ERROR|crash|SUMMARY" || true
done
