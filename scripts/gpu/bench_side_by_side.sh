#!/usr/bin/env bash
# Two binaries side by side on one H200 host: carry/alloctrace_old (b6ebe59) and carry/alloctrace
# (the run at the capacity compared beside the capacity search). PART=16: both on 16 cores, three
# runs each, then the new one's timeline of whatif on the large real trace; PART=2: both under
# taskset -c 0,1 on the large real trace only (EVENTS=0), three runs each.
# Log: scripts/gpu/results/bench_side_by_side_h200.log.
set -u
cd "$(dirname "$0")/../.."
nproc
if [ "${PART:-16}" = 16 ]; then
  for b in alloctrace_old alloctrace; do
    echo "=== $b, 16 cores"
    RUNS=3 ALLOCTRACE_BIN=carry/$b bash scripts/bench.sh ratios
  done
  for k in 1 2; do
    echo "=== alloctrace whatif timeline $k"
    ALLOCTRACE_PASSES=1 carry/alloctrace whatif traces/large/mixed_sizes_big.default.atrace 2>&1 >/dev/null | tail -n 3
  done
else
  for b in alloctrace_old alloctrace; do
    echo "=== $b, 2 cores"
    RUNS=3 ALLOCTRACE_BIN=carry/$b taskset -c 0,1 bash scripts/bench.sh ratios 0
  done
fi
