#!/usr/bin/env bash
# The report's critical path: the build before (old) and after (new) a change, in turn, as
# ratios to one replay in the same round (first made for the pictures drawn beside the searches,
# no second replay at an OOM and the analyses of the recorded run on a pool of their own; the
# log names the builds compared).
# - the large real trace: fastest of 7, on 16 cores and on 2 (taskset -c 0,1, 2 rayon threads);
# - the 10 M-event realistic trace: one run each, 16 cores, two rounds.
# The binaries are carry/old.xz and carry/new.xz (release builds).
# Logs: scripts/gpu/results/bench_report_path_h100*.log.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu/fastest.sh
old_and_new
T=traces/large/mixed_sizes_big.default.atrace
large_rounds "$T"
/tmp/at-new synth --realistic --events 10000000 -o /tmp/r10m.atrace > /dev/null
once() { local t0=$(date +%s.%N); "$@" > /dev/null 2>&1; local t1=$(date +%s.%N); awk -v a=$t0 -v b=$t1 'BEGIN{print b-a}'; }
for round in 1 2; do
  for b in old new; do
    rm -rf /tmp/rep10; r=$(once /tmp/at-$b replay /tmp/r10m.atrace); e=$(once /tmp/at-$b explain /tmp/r10m.atrace)
    p=$(once /tmp/at-$b report /tmp/r10m.atrace -o /tmp/rep10)
    awk -v b=$b -v r=$r -v e=$e -v p=$p -v round=$round 'BEGIN{printf "10M   round %d 16 cores %-3s replay %.3f s  explain %.3f s %.1fx  report %.3f s %.1fx\n", round, b, r, e, e/r, p, p/r}'
  done
done
