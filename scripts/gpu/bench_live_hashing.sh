#!/usr/bin/env bash
# Two binaries in turn (carry/start.xz: the code before id hashing by groups of eight, the
# engine's live table by 4 KiB windows and the shared layout; carry/head.xz: after): the large
# real trace's rounds (bench_overlap_rounds.sh), then the ten-times hostile inputs that broke a
# bound (carry/x10-*.atrace, made by the hostile test's ten_times), each command once, wall
# clock and peak resident memory. Log: scripts/gpu/results/bench_live_hashing_h100.log.
set -u
cd "$(dirname "$0")/../.."
nproc
scripts/gpu/bench_overlap_rounds.sh start head
for b in start head; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
one() { # binary, input, command...
  local b=$1 f=$2; shift 2
  rm -rf /tmp/rep-x
  /usr/bin/time -f "%e %M" -o /tmp/t-x /tmp/at-$b "$@" carry/$f.atrace $([ "$1" = report ] && echo -o /tmp/rep-x) > /dev/null 2>/tmp/e-x
  local code=$?
  awk -v b=$b -v f=$f -v c="$*" -v code=$code '{printf "%-6s %-14s %-8s exit %d  %6.2f s  %7.1f MB\n", b, f, c, code, $1, $2*1024/1e6}' /tmp/t-x
}
for f in x10-live10 x10-time100 x10-streams8; do
  for c in whatif explain leaks report; do
    for b in start head; do one $b $f $c; done
  done
done
