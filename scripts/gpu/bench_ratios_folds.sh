#!/usr/bin/env bash
# Two binaries side by side on one H200 host: carry/alloctrace_old (8f9119b) and
# carry/alloctrace (the folds in one pass, the bounds riding the table's replays, frag's bounds
# beside its replay, explain's held set from its replay). Usage: PART=16 or PART=2 (16 cores, or
# 2 of them with taskset: the whatif of the 10 M-event trace alone takes minutes there);
# PART=final: carry/alloctrace alone, on 16 cores then on 2, fastest of 2.
# Log: scripts/gpu/results/bench_ratios_h200_folds.log.
set -u
cd "$(dirname "$0")/../.."
nproc
if [ "${PART:-16}" = final ]; then
  for cpus in all 0,1; do
    echo "=== alloctrace, cores: $cpus"
    if [ "$cpus" = all ]; then
      RUNS=2 ALLOCTRACE_BIN=carry/alloctrace bash scripts/bench.sh ratios
    else
      RUNS=2 ALLOCTRACE_BIN=carry/alloctrace taskset -c "$cpus" bash scripts/bench.sh ratios
    fi
  done
elif [ "${PART:-16}" = 16 ]; then
  for b in alloctrace_old alloctrace; do
    echo "=== $b, 16 cores"
    RUNS=3 ALLOCTRACE_BIN=carry/$b bash scripts/bench.sh ratios
  done
else
  echo "=== alloctrace, 2 cores"
  RUNS=2 ALLOCTRACE_BIN=carry/alloctrace taskset -c 0,1 bash scripts/bench.sh ratios
fi
