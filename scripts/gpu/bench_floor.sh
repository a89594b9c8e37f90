#!/usr/bin/env bash
# Two binaries in turn (carry/start.xz: before the capacity search's floor and the decoders'
# bound on records in flight; carry/head.xz: after). First the ten-times hostile inputs that
# were over a bound on this host (carry/x10-*.atrace, made by the hostile test's ten_times), each
# command once, wall clock and peak resident memory; then one round of the large real trace's
# ratios at 2 and 16 threads (bench_overlap_rounds.sh's measure). Log:
# scripts/gpu/results/bench_floor_h200.log (the run that made it was lent an H200 host, 16 cores).
set -u
cd "$(dirname "$0")/../.."
nproc
for b in start head; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
one() { # binary, input, command...
  local b=$1 f=$2; shift 2
  rm -rf /tmp/rep-x
  /usr/bin/time -f "%e %M" -o /tmp/t-x timeout 120 /tmp/at-$b "$@" carry/$f.atrace $([ "$1" = report ] && echo -o /tmp/rep-x) > /dev/null 2>/tmp/e-x
  local code=$?
  awk -v b=$b -v f=$f -v c="$*" -v code=$code '{printf "%-6s %-14s %-8s exit %3d  %6.2f s  %7.1f MB\n", b, f, c, code, $1, $2*1024/1e6}' /tmp/t-x
}
for fc in "x10-streams8 whatif" "x10-streams8 explain" "x10-streams8 report" "x10-live10 explain" \
          "x10-live10 report" "x10-time100 report" "x10-streams1 whatif"; do
  set -- $fc
  for b in start head; do one $b $1 $2; done
done
T=traces/large/mixed_sizes_big.default.atrace
. scripts/gpu/fastest.sh
for th in 2 16; do
  for b in start head; do
    r=$(best $th /tmp/at-$b replay $T); w=$(best $th /tmp/at-$b whatif $T); e=$(best $th /tmp/at-$b explain $T); p=$(best $th /tmp/at-$b report $T -o /tmp/rep)
    awk -v b=$b -v th=$th -v r=$r -v w=$w -v e=$e -v p=$p 'BEGIN{printf "%2d threads %-5s replay %.3f s  whatif %.3f s %.1fx  explain %.3f s %.1fx  report %.3f s %.1fx\n", th, b, r, w, w/r, e, e/r, p, p/r}'
  done
done
