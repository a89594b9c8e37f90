#!/bin/sh
# Regenerates reports/ from traces/ with the CLI: one directory per trace holding report.md,
# report.html, summary.json and the SVGs. The test suite (analyzer/tests/pictures_reports.rs)
# fails when a committed report differs from a fresh run, so run this after any change to
# what a report says or draws.
set -eu
cd "$(dirname "$0")/.."
cargo build -q -p alloctrace
bin="${CARGO_TARGET_DIR:-target}/debug/alloctrace"
rm -rf reports
mkdir -p reports
for trace in traces/*.atrace; do
    name=$(basename "$trace" .atrace)
    "$bin" report "$trace" -o "reports/$name" > /dev/null
    echo "reports/$name"
done
