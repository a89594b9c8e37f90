#!/bin/sh
# Regenerates reports/ from traces/ with the CLI: one directory per trace holding report.md,
# report.html, summary.json and each picture as SVG and PNG. The test suite
# (analyzer/tests/pictures_report.rs) fails when a committed report differs from a fresh run, so
# run this after any change to what a report says or draws.
set -eu
cd "$(dirname "$0")/.."
cargo build -q -p alloctrace
bin="${CARGO_TARGET_DIR:-target}/debug/alloctrace"
mkdir -p reports
# Only the per-trace directories are generated; other files (reports/README.md) stay.
find reports -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
for trace in traces/*.atrace; do
    name=$(basename "$trace" .atrace)
    "$bin" report "$trace" -o "reports/$name" > /dev/null
    echo "reports/$name"
done
