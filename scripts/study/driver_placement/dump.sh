#!/usr/bin/env bash
# Writes dumps/NAME.txt (alloctrace dump) for every real run's own snapshot in
# tests/fixtures/truth/own/, the input of evaluate.py. ALLOCTRACE_BIN: the binary to use.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../../.."
bin="${ALLOCTRACE_BIN:-$root/target/release/alloctrace}"
mkdir -p "$here/dumps"
for f in "$root"/tests/fixtures/truth/own/*.atrace; do
  "$bin" dump "$f" > "$here/dumps/$(basename "$f" .atrace).txt"
done
