#!/usr/bin/env bash
# Capacity bands (a probe's outcome taken for every capacity that makes the same run): the build
# before (old, the build before them) and after (new), in turn, as ratios to one replay in the same round.
# - the large real trace: fastest of 7, on 16 cores and on 2 (taskset -c 0,1, 2 rayon threads),
#   three rounds; the capacity probes each made (ALLOCTRACE_PASSES=1, one run);
# - the 10 M-event realistic trace: whatif and report, one run each, 16 cores;
# - $OUT/report_passes_*.log: the passes of `report` on the large trace, each line stamped with
#   the wall clock as it was logged (its end), for the critical path.
# The binaries are carry/old.xz and carry/new.xz (release builds).
# Log: scripts/gpu/results/bench_bands_h100.log.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu/fastest.sh
old_and_new
T=traces/large/mixed_sizes_big.default.atrace
for b in old new; do
  for c in whatif report; do
    rm -rf /tmp/rep
    n=$(ALLOCTRACE_PASSES=1 /tmp/at-$b $c $T $( [ $c = report ] && echo "-o /tmp/rep") 2>&1 >/dev/null | grep -c capacity_search)
    echo "$b $c: $n capacity probes"
  done
done
large_rounds "$T"
stamp() { perl -MTime::HiRes=time -ne '$|=1; printf "%.4f %s", time, $_'; }
for b in old new; do
  for k in 1 2; do
    rm -rf /tmp/rep
    { t0=$(date +%s.%N); echo "start $t0"; ALLOCTRACE_PASSES=1 /tmp/at-$b report $T -o /tmp/rep 2>&1 >/dev/null | stamp; echo "end $(date +%s.%N)"; } > "${OUT:-/tmp}/report_passes_${b}_$k.log"
  done
done
/tmp/at-new synth --realistic --events 10000000 -o /tmp/r10m.atrace > /dev/null
once() { local t0=$(date +%s.%N); "$@" > /dev/null 2>&1; local t1=$(date +%s.%N); awk -v a=$t0 -v b=$t1 'BEGIN{print b-a}'; }
for b in old new; do
  rm -rf /tmp/rep10; r=$(once /tmp/at-$b replay /tmp/r10m.atrace); w=$(once /tmp/at-$b whatif /tmp/r10m.atrace)
  p=$(once /tmp/at-$b report /tmp/r10m.atrace -o /tmp/rep10)
  awk -v b=$b -v r=$r -v w=$w -v p=$p 'BEGIN{printf "10M   16 cores %-3s replay %.3f s  whatif %.3f s %.1fx  report %.3f s %.1fx\n", b, r, w, w/r, p, p/r}'
done
