#!/usr/bin/env bash
# The large real trace, three rounds: carry/prev.xz (c9352d0) and carry/new.xz (a capacity search
# replays its first bisection levels beside its check of the upper bound), fastest of 7 each.
# Log: scripts/gpu/results/bench_first_round_h100.log.
set -u
cd "$(dirname "$0")/../.."
for b in prev new; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
T=traces/large/mixed_sizes_big.default.atrace
. scripts/gpu/fastest.sh
for round in 1 2 3; do
  for th in 2 16; do
    for b in prev new; do
      r=$(best $th /tmp/at-$b replay $T); w=$(best $th /tmp/at-$b whatif $T); e=$(best $th /tmp/at-$b explain $T); p=$(best $th /tmp/at-$b report $T -o /tmp/rep)
      awk -v b=$b -v th=$th -v r=$r -v w=$w -v e=$e -v p=$p -v round=$round 'BEGIN{printf "round %d %2d threads %-4s replay %.3f s  whatif %.3f s %.1fx  explain %.3f s %.1fx  report %.3f s %.1fx\n", round, th, b, r, w, w/r, e, e/r, p, p/r}'
    done
  done
done
