#!/usr/bin/env bash
# Real PyTorch runs that check the doctor's answers on GPT-2 training (traces/gpt2_train.default.atrace)
# under power-of-two rounding and without caching, each in a fresh process, several at once on one
# GPU (each limited by set_per_process_memory_fraction). Writes one JSON line per run; the lines
# are kept in tests/fixtures/gpt2_limits_h100.jsonl, which tests/tests/fidelity.rs checks the engine against.
# Usage: scripts/gpu/gpt2_limits.sh OUTFILE
#        SNAPSHOTS=DIR scripts/gpu/gpt2_limits.sh   (the runs that differ, with PyTorch's snapshots)
#        ADVICE=1 scripts/gpu/gpt2_limits.sh OUTFILE   (the doctor's printed figures, typed back)
set -u
cd "$(dirname "$0")"
OUT=${1:-/dev/stdout}
M=$((1 << 20))
SNAPSHOTS=${SNAPSHOTS:-}
run() { # label conf limit [env...]
  local label=$1 conf=$2 lim=$3; shift 3
  env PYTORCH_CUDA_ALLOC_CONF="$conf" "$@" python3 gpt2_limits.py "$lim" "$label" 2>/dev/null | tail -1
}
# With ADVICE=1 instead: the figures the doctor prints, typed back as a user would (`explain` at
# --capacity 5GiB: "give the process 5.50 GiB ... with max_split_size_mb:64; 6.03 GiB under the
# recorded settings"; the table's min capacity 6.03 GiB, which printed 6.02 GiB before it rounded up).
if [ -n "${ADVICE:-}" ]; then
  {
    run def_602 "" 6463925780 &
    run def_603 "" 6474663198 &
    run ms64_550 max_split_size_mb:64 5905580032 &
    run ms64_min max_split_size_mb:64 5903482880 &
    run ms64_below max_split_size_mb:64 $((5903482880 - 2 * M)) &
    wait
  } > "$OUT"
  exit 0
fi
[ -z "$SNAPSHOTS" ] && {
  # no caching: does the memory fraction hold? (one 2 GiB request under a 1 GiB limit)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 gpt2_limits.py nocache-fraction $((1 << 30)) $((2 << 30)) &
  python3 gpt2_limits.py nocache-fraction $((1 << 30)) $((2 << 30)) &
  wait
  run r4_55 roundup_power2_divisions:4 5905580032 &
  run r1_55 roundup_power2_divisions:1 5905580032 &
  run r8_55 roundup_power2_divisions:8 5905580032 &
  run def_55 "" 5905580032 &
  run nc_55 "" 5905580032 PYTORCH_NO_CUDA_MEMORY_CACHING=1 &
  run nc_4 "" $((4 << 30)) PYTORCH_NO_CUDA_MEMORY_CACHING=1 &
  wait
  run ms64r4_min max_split_size_mb:64,roundup_power2_divisions:4 6249512960 &
  run ms64r4_below max_split_size_mb:64,roundup_power2_divisions:4 $((6249512960 - M)) &
  run r4_min roundup_power2_divisions:4 6958350336 &
  run r4_below roundup_power2_divisions:4 $((6958350336 - 2 * M)) &
  run r1_min roundup_power2_divisions:1 6465519616 &
  run r1_below roundup_power2_divisions:1 $((6465519616 - 2 * M)) &
  wait
  run exp_r4_min expandable_segments:True,roundup_power2_divisions:4 6390022144 &
  run gc_r4_min garbage_collection_threshold:0.6,roundup_power2_divisions:4 6882852864 &
  run r4_none roundup_power2_divisions:4 none &
  run r1_none roundup_power2_divisions:1 none &
  wait
} > "$OUT"
# With SNAPSHOTS=DIR instead: the runs where the replay of the default run's trace differs from
# PyTorch, again, each recording PyTorch's own snapshot into DIR (to replay each run's own
# addresses), and what each run reported in DIR/runs.jsonl.
if [ -n "${SNAPSHOTS:-}" ]; then
  mkdir -p "$SNAPSHOTS"
  {
    env PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4 python3 gpt2_limits.py 6958350336 r4_min_snap "$SNAPSHOTS/r4_min.pickle" 2>/dev/null | tail -1 &
    env PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4 python3 gpt2_limits.py $((6958350336 - 2 * M)) r4_below_snap "$SNAPSHOTS/r4_below.pickle" 2>/dev/null | tail -1 &
    env PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6,roundup_power2_divisions:4 python3 gpt2_limits.py 6882852864 gc_r4_min_snap "$SNAPSHOTS/gc_r4_min.pickle" 2>/dev/null | tail -1 &
    env PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4 python3 gpt2_limits.py none r4_none_snap "$SNAPSHOTS/r4_none.pickle" 2>/dev/null | tail -1 &
    wait
  } > "$SNAPSHOTS/runs.jsonl"
fi
