#!/usr/bin/env bash
# The timeline of whatif, explain and report on 16 cores: each pass's end after the first pass
# began (ALLOCTRACE_PASSES=1), beside the command's wall time, three runs each, on the large real
# trace and once on the 10 M-event realistic one. carry/alloctrace is the release binary.
# Log: scripts/gpu/results/timeline_16_h200.log.
set -u
cd "$(dirname "$0")/../.."
B=carry/alloctrace
T=traces/large/mixed_sizes_big.default.atrace
nproc
wall() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null 2> /tmp/passes.log; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { printf "wall %.3f s\n", b - a }'; }
for k in 1 2 3; do
  echo "=== replay $k"; ALLOCTRACE_PASSES=1 wall $B replay $T; cat /tmp/passes.log
done
for c in whatif explain report; do
  for k in 1 2 3; do
    rm -rf /tmp/rep
    echo "=== $c $k"
    if [ $c = report ]; then ALLOCTRACE_PASSES=1 wall $B report $T -o /tmp/rep; else ALLOCTRACE_PASSES=1 wall $B $c $T; fi
    awk '{ print }' /tmp/passes.log | tail -n 400
  done
done
$B synth --realistic --events 10000000 -o /tmp/r10m.atrace > /dev/null
echo "=== 10M replay"; ALLOCTRACE_PASSES=1 wall $B replay /tmp/r10m.atrace; cat /tmp/passes.log
echo "=== 10M whatif"; ALLOCTRACE_PASSES=1 wall $B whatif /tmp/r10m.atrace; cat /tmp/passes.log
