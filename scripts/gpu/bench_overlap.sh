#!/usr/bin/env bash
# Two binaries interleaved on one H100 host: carry/old.xz (84406aa) and carry/new.xz (a capacity
# search takes more levels at once as other searches end; what needs only the recorded run,
# explain's prelude and the report's analyses, runs beside the capacity searches). Release
# builds, compressed with xz -9 to fit the call's transfer. Large real trace: fastest of 7 runs,
# 16 threads twice and 2 threads once; the 10M-event realistic synthetic trace; the ten-times
# live10 and time100 hostile inputs (made by hostile.rs's every_command test), 60 s limit.
# Log: scripts/gpu/results/bench_overlap_h100.log (the first binary of this change), and
# bench_overlap_final_h100.log (the binary at the change's last commit).
set -u
cd "$(dirname "$0")/../.."
for b in old new; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
T=traces/large/mixed_sizes_big.default.atrace
. scripts/gpu/fastest.sh
nproc
for run in "1 16" "2 16" "1 2"; do
  set -- $run; round=$1; th=$2
  for b in old new; do
    r=$(best $th /tmp/at-$b replay $T); w=$(best $th /tmp/at-$b whatif $T); e=$(best $th /tmp/at-$b explain $T)
    f=$(best $th /tmp/at-$b frag $T); p=$(best $th /tmp/at-$b report $T -o /tmp/rep)
    awk -v b=$b -v th=$th -v r=$r -v w=$w -v e=$e -v f=$f -v p=$p -v round=$round 'BEGIN{printf "round %d %2d threads %-4s replay %.3f s  whatif %.3f s %.1fx  explain %.3f s %.1fx  frag %.1fx  report %.3f s %.1fx\n", round, th, b, r, w, w/r, e, e/r, f/r, p, p/r}'
  done
done
/tmp/at-new synth --realistic --events 10000000 --seed 1 -o /tmp/10m.atrace > /dev/null
for b in old new; do
  for c in replay whatif explain; do
    /usr/bin/time -f "10M 16 threads $b $c %e s %M KB" /tmp/at-$b $c /tmp/10m.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
  rm -rf /tmp/rep; /usr/bin/time -f "10M 16 threads $b report %e s %M KB" /tmp/at-$b report /tmp/10m.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
done
for x in live10 time100; do
  for b in old new; do
    timeout 60 /usr/bin/time -f "x10 $x explain $b: %e s %M KB" /tmp/at-$b explain carry/x10-$x.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
    rm -rf /tmp/rep; timeout 60 /usr/bin/time -f "x10 $x report $b: %e s %M KB" /tmp/at-$b report carry/x10-$x.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
done
