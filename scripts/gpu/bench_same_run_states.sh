#!/bin/bash
# Before (the last stop's binary) and after (this change), one run each, alternating.
# Expects before.xz and new.xz (xz-compressed binaries) and the ten-times hostile inputs in
# carry/dev/ (x10-time100 and x10-live10, as the hostile test every_command makes them), carried
# to the host; run from the repository root: bash scripts/gpu/bench_same_run_states.sh
cd carry/dev
for b in before new; do xz -dc $b.xz > $b.bin; chmod +x $b.bin; done
nproc
t() { local b=$1; shift; rm -rf /tmp/o; /usr/bin/time -f "%e s %M KB" -o /tmp/tm ./$b.bin "$@" >/dev/null 2>&1; echo "$b $* : $(cat /tmp/tm)"; }
for b in before new; do
  t $b report x10-time100.atrace -o /tmp/o
  t $b report x10-live10.atrace -o /tmp/o
  t $b plot --kind whatif x10-time100.atrace -o /tmp/o.svg
done
cd ../..
for b in before new; do
  echo "== ratios $b, 16 cores"; RUNS=3 ALLOCTRACE_BIN=$PWD/carry/dev/$b.bin scripts/bench.sh ratios 0 2>&1 | tail -7
  echo "== ratios $b, 2 cores"; RUNS=3 ALLOCTRACE_BIN=$PWD/carry/dev/$b.bin taskset -c 0,1 scripts/bench.sh ratios 0 2>&1 | tail -7
done
