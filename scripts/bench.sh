#!/usr/bin/env bash
# Prints alloctrace's speed and memory figures, side by side in one run (ratios where a peer
# exists). Usage: scripts/bench.sh [EVENTS]   (default 10000000)
#        scripts/bench.sh ratios [EVENTS]: only the commands against one replay, on the real
#        trace and a realistic synthetic one; ALLOCTRACE_BIN=PATH uses that binary instead of
#        building one (for a machine without a Rust toolchain); EVENTS 0 leaves out the
#        synthetic trace.
set -euo pipefail
cd "$(dirname "$0")/.."
ONLY_RATIOS=
if [ "${1:-}" = ratios ]; then
  ONLY_RATIOS=1
  shift
fi
EVENTS=${1:-10000000}
if [ -n "${ALLOCTRACE_BIN:-}" ]; then
  BIN=$ALLOCTRACE_BIN
else
  cargo build --release -q -p alloctrace --examples --bins
  BIN=target/release/alloctrace
fi
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

LARGE=traces/large/mixed_sizes_big.default.atrace

secs() { # command... -> wall seconds, peak RSS in MB (the fastest of RUNS runs, default 1)
  local best="" rss=""
  for _ in $(seq "${RUNS:-1}"); do
    if [ -x "$TIME" ]; then
      "$TIME" -f "%e %M" -o "$TMP/t" "$@" > /dev/null 2>&1 || true
    else # no GNU time: wall clock only
      local t0 t1
      t0=$(date +%s.%N)
      "$@" > /dev/null 2>&1 || true
      t1=$(date +%s.%N)
      awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f 0\n", b - a }' > "$TMP/t"
    fi
    read -r s kb < "$TMP/t"
    if [ -z "$best" ] || awk "BEGIN{exit !($s < $best)}"; then best=$s; rss=$kb; fi
  done
  awk -v s="$best" -v kb="$rss" 'BEGIN { printf "%s %.0f\n", s, kb / 1024 }'
}

ratios() { # trace label -> each command's time as a multiple of one replay of the same trace
  local t=$1 label=$2
  local n; n=$($BIN summary --json "$t" | grep '"events":' | head -1 | tr -dc 0-9)
  echo "commands against one replay of $label ($n events; the fastest of ${RUNS:-1} run(s) each):"
  read -r base rss < <(secs "$BIN" replay "$t")
  printf "  %-26s %7.2f s  %5s x  %-10s %6s MB\n" "replay" "$base" "1.0" "" "$rss"
  for spec in "whatif:4" "explain:5" "frag:1.5"; do
    local c=${spec%%:*} target=${spec##*:}
    read -r s rss < <(secs "$BIN" "$c" "$t")
    printf "  %-26s %7.2f s  %5.1f x  (<= %3s x) %6s MB\n" "$c" "$s" "$(awk "BEGIN{print $s / ($base > 0 ? $base : 0.01)}")" "$target" "$rss"
  done
  rm -rf "$TMP/rep"
  read -r s rss < <(secs "$BIN" report "$t" -o "$TMP/rep")
  local opens="-"
  if command -v strace > /dev/null; then
    rm -rf "$TMP/rep"
    opens=$(strace -f -e trace=openat -o "$TMP/strace" "$BIN" report "$t" -o "$TMP/rep" > /dev/null 2>&1; grep -c "$(basename "$t")" "$TMP/strace" || true)
  fi
  printf "  %-26s %7.2f s  %5.1f x  (<=   5 x) %6s MB; opens of the trace: %s (<= 3)\n" "report" "$s" "$(awk "BEGIN{print $s / ($base > 0 ? $base : 0.01)}")" "$rss" "$opens"
}

echo "machine: $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$ONLY_RATIOS" ]; then
  ratios "$LARGE" "the large real trace"
  [ "$EVENTS" = 0 ] && exit 0
  $BIN synth --realistic --events "$EVENTS" --seed 1 -o "$TMP/real.atrace" > /dev/null
  ratios "$TMP/real.atrace" "a realistic synthetic trace (synth --realistic)"
  exit 0
fi
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
ratios "$LARGE" "the large real trace"
$BIN synth --realistic --events "$EVENTS" --seed 1 -o "$TMP/real.atrace" > /dev/null
ratios "$TMP/real.atrace" "a realistic synthetic trace (synth --realistic)"
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
