#!/usr/bin/env bash
# The long traces of bench_overlap.sh again, each command twice, after a capacity search takes
# no more levels at once than the probes it has left: carry/old.xz (84406aa) and carry/new.xz.
# Log: scripts/gpu/results/bench_overlap_long_h100.log.
set -u
cd "$(dirname "$0")/../.."
for b in old new; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
/tmp/at-new synth --realistic --events 10000000 --seed 1 -o /tmp/10m.atrace > /dev/null
for round in 1 2; do
  for b in old new; do
    for c in whatif explain; do
      /usr/bin/time -f "10M 16 threads $b $c %e s %M KB" /tmp/at-$b $c /tmp/10m.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
    done
    rm -rf /tmp/rep; /usr/bin/time -f "10M 16 threads $b report %e s %M KB" /tmp/at-$b report /tmp/10m.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
done
for b in old new; do
  timeout 60 /usr/bin/time -f "x10 time100 explain $b: %e s %M KB" /tmp/at-$b explain carry/x10-time100.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
  rm -rf /tmp/rep; timeout 60 /usr/bin/time -f "x10 time100 report $b: %e s %M KB" /tmp/at-$b report carry/x10-time100.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
done
for round in 1 2; do
  for b in old new; do
    rm -rf /tmp/rep; timeout 60 /usr/bin/time -f "x10 live10 report $b: %e s %M KB" /tmp/at-$b report carry/x10-live10.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
done
