#!/usr/bin/env bash
# The doctor's answers on traces/frag_oom.default.atrace at other limits, each run in a fresh
# process on one GPU: at 1 GiB, where memory is used up (every setting runs out of memory); at
# the what-if table's smallest capacity (3,003,121,664 bytes) and 2 MiB below it; at 3 GiB,
# where the replay serves the request that failed at the recorded 2 GiB.
# Usage: scripts/gpu/frag_oom_limits.sh OUTFILE   (kept as tests/fixtures/frag_oom_limits_h100.jsonl)
set -u
cd "$(dirname "$0")"
OUT=${1:-/dev/stdout}
M=$((1 << 20))
run() { # label conf limit
  PYTORCH_CUDA_ALLOC_CONF="$2" python3 frag_oom_limits.py "$1" "$3" 2>/dev/null | tail -1
}
{
  run def_1g "" $((1 << 30)) &
  run exp_1g expandable_segments:True $((1 << 30)) &
  run def_min "" 3003121664 &
  run def_below "" $((3003121664 - 2 * M)) &
  run exp_min expandable_segments:True 3003121664 &
  run def_3g "" $((3 << 30)) &
  wait
} > "$OUT"
