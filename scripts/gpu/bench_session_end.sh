#!/usr/bin/env bash
# Two binaries interleaved on one H100 host: carry/old.xz (1632268) and carry/new.xz (the report
# and explain as plans, replays in turns within 1 GiB, leaks' bounded list); release builds,
# compressed with xz -9 to fit the call's transfer. Large real trace: fastest of 7 runs, twice,
# 16 and 2 threads; the 10M-event realistic synthetic trace; the ten-times live10 hostile input
# (carry/x10-live10.atrace, made by hostile.rs's every_command test), 60 s limit.
# Log: scripts/gpu/results/bench_session_end_h100.log.
set -u
cd "$(dirname "$0")/../.."
for b in old new; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
T=traces/large/mixed_sizes_big.default.atrace
. scripts/gpu/fastest.sh
nproc
for round in 1 2; do
  for th in 16 2; do
    for b in old new; do
      r=$(best $th /tmp/at-$b replay $T); w=$(best $th /tmp/at-$b whatif $T); e=$(best $th /tmp/at-$b explain $T)
      f=$(best $th /tmp/at-$b frag $T); p=$(best $th /tmp/at-$b report $T -o /tmp/rep)
      awk -v b=$b -v th=$th -v r=$r -v w=$w -v e=$e -v f=$f -v p=$p -v round=$round 'BEGIN{printf "round %d %2d threads %-4s replay %.3f s  whatif %.3f s %.1fx  explain %.3f s %.1fx  frag %.1fx  report %.3f s %.1fx\n", round, th, b, r, w, w/r, e, e/r, f/r, p, p/r}'
    done
  done
done
/tmp/at-new synth --realistic --events 10000000 --seed 1 -o /tmp/10m.atrace > /dev/null
for b in old new; do
  for c in replay whatif explain frag; do
    /usr/bin/time -f "10M 16 threads $b $c %e s %M KB" /tmp/at-$b $c /tmp/10m.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
  rm -rf /tmp/rep; /usr/bin/time -f "10M 16 threads $b report %e s %M KB" /tmp/at-$b report /tmp/10m.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
done
for b in old new; do
  for c in whatif explain leaks; do
    timeout 60 /usr/bin/time -f "x10 live10 $c $b: %e s %M KB" /tmp/at-$b $c carry/x10-live10.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
  rm -rf /tmp/rep; timeout 60 /usr/bin/time -f "x10 live10 report $b: %e s %M KB" /tmp/at-$b report carry/x10-live10.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
done
