#!/usr/bin/env bash
# bench_overlap.sh's large real trace again, in three rounds, two binaries in turn: whatif,
# explain and report at 2 and 16 threads, fastest of 7 each, beside one replay. The binaries are
# carry/$1.xz and carry/$2.xz (default old and new: 84406aa and the change that runs the recorded
# run's analyses beside the searches).
# Log: scripts/gpu/results/bench_overlap_rounds_h100.log.
set -u
cd "$(dirname "$0")/../.."
bins="${1:-old} ${2:-new}"
for b in $bins; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
T=traces/large/mixed_sizes_big.default.atrace
. scripts/gpu/fastest.sh
for round in 1 2 3; do
  for th in 2 16; do
    for b in $bins; do
      r=$(best $th /tmp/at-$b replay $T); w=$(best $th /tmp/at-$b whatif $T); e=$(best $th /tmp/at-$b explain $T); p=$(best $th /tmp/at-$b report $T -o /tmp/rep)
      awk -v b=$b -v th=$th -v r=$r -v w=$w -v e=$e -v p=$p -v round=$round 'BEGIN{printf "round %d %2d threads %-4s replay %.3f s  whatif %.3f s %.1fx  explain %.3f s %.1fx  report %.3f s %.1fx\n", round, th, b, r, w, w/r, e, e/r, p, p/r}'
    done
  done
done
