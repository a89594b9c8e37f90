#!/usr/bin/env bash
# Two layouts of the report interleaved on one H100 host, twice, fastest of 7 runs each:
# carry/rowzero.xz (the watches of the recorded run on the what-if table's recorded row, kept) and
# carry/separate.xz (the same watches on a replay of their own, beside the table). Release
# binaries, compressed with xz -9 to fit the call's transfer.
# Log: scripts/gpu/results/bench_report_plan_h100.log.
set -u
cd "$(dirname "$0")/../.."
for b in rowzero separate; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
T=traces/large/mixed_sizes_big.default.atrace
. scripts/gpu/fastest.sh
for round in 1 2; do
  for th in 16 2; do
    for b in rowzero separate; do
      r=$(best $th /tmp/at-$b replay $T); w=$(best $th /tmp/at-$b whatif $T); e=$(best $th /tmp/at-$b explain $T); p=$(best $th /tmp/at-$b report $T -o /tmp/rep)
      awk -v b=$b -v th=$th -v r=$r -v w=$w -v e=$e -v p=$p -v round=$round 'BEGIN{printf "round %d %2d threads %-9s replay %.3f s  whatif %.1fx  explain %.1fx  report %.3f s = %.1fx\n", round, th, b, r, w/r, e/r, p, p/r}'
    done
  done
done
/tmp/at-rowzero synth --realistic --events 10000000 --seed 1 -o /tmp/10m.atrace > /dev/null
for th in 16 2; do
  for b in rowzero separate; do
    rm -rf /tmp/rep; RAYON_NUM_THREADS=$th /usr/bin/time -f "10M $th threads $b report %e s %M KB" /tmp/at-$b report /tmp/10m.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
done
