#!/usr/bin/env bash
# Prints alloctrace's speed and memory figures, side by side in one run (ratios where a peer
# exists). Usage: scripts/bench.sh [EVENTS]   (default 10000000)
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${1:-10000000}
cargo build --release -q -p alloctrace --examples --bins
BIN=target/release/alloctrace
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
TIME=/usr/bin/time

timed() { # label events command... -> prints seconds, events/s and peak RSS
  local label=$1 events=$2; shift 2
  local best="" rss=""
  for _ in 1 2 3; do
    "$TIME" -f "%e %M" -o "$TMP/time" "$@" > /dev/null
    read -r secs kb < "$TMP/time"
    if [ -z "$best" ] || awk "BEGIN{exit !($secs < $best)}"; then best=$secs; rss=$kb; fi
  done
  awk -v l="$label" -v s="$best" -v e="$events" -v kb="$rss" \
    'BEGIN { printf "%-40s %8.2f s %10.1f M events/s %8.0f MB max RSS\n", l, s, (s > 0 ? e / s / 1e6 : 0), kb / 1024 }'
}

echo "machine: $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
$BIN synth --events "$EVENTS" --seed 1 -o "$TMP/big.atrace"
N=$($BIN summary --json "$TMP/big.atrace" | grep '"events":' | head -1 | tr -dc 0-9)
echo "synthetic trace: $N events, $(stat -c %s "$TMP/big.atrace") bytes"
echo
echo "best of three runs:"
timed "summary" "$N" $BIN summary "$TMP/big.atrace"
timed "replay (default policy)" "$N" $BIN replay "$TMP/big.atrace"
timed "replay, expandable_segments" "$N" $BIN replay --conf expandable_segments:True "$TMP/big.atrace"
if $BIN --help | grep -q "^  report"; then
  timed "report (all analyses and plots)" "$N" $BIN report "$TMP/big.atrace" -o "$TMP/report"
fi
echo
echo "whatif scaling (gpt2_train, capacity 5.5GiB, with the capacity search):"
for t in 1 2; do
  s=$( { $TIME -f "%e" env RAYON_NUM_THREADS=$t $BIN whatif traces/gpt2_train.default.atrace --capacity 5.5GiB > /dev/null; } 2>&1 )
  echo "  $t thread(s): $s s"
done
echo
echo "import of PyTorch pickles against python3 pickle.load of the same files:"
target/release/examples/bench_import 20
echo
echo "recorder overhead on the CPU (the engine and the recorder on the simulated device; the GPU"
echo "figures come from scripts/gpu/overhead.sh):"
cargo build --release -q -p alloctrace-recorder --example bench_recorder
target/release/examples/bench_recorder "$TMP" 1000000 5
