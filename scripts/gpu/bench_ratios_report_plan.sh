#!/usr/bin/env bash
# Two binaries side by side on one H100 host: carry/old.gz (1632268, before the report was a
# plan) and carry/new.gz (the report as a plan, and leaks' bounded list). Ratios on the large real
# trace (16 and 2 threads), the 10M-event realistic synthetic trace, and the ten-times live10
# hostile input (carry/x10-live10.atrace, made by hostile.rs's every_command test).
# Log: scripts/gpu/results/bench_ratios_h100_report_plan.log.
set -u
cd "$(dirname "$0")/../.."
for b in old new; do gunzip -c carry/$b.gz > /tmp/at-$b; chmod +x /tmp/at-$b; done
nproc
for th in 16 2; do
  for b in old new; do
    echo "== $b $th threads"
    RAYON_NUM_THREADS=$th RUNS=5 ALLOCTRACE_BIN=/tmp/at-$b bash scripts/bench.sh ratios 0
  done
done
/tmp/at-new synth --realistic --events 10000000 --seed 1 -o /tmp/10m.atrace > /dev/null
for th in 16 2; do
  for b in old new; do
    echo "== $b $th threads, 10M"
    for c in replay whatif explain frag; do
      RAYON_NUM_THREADS=$th /usr/bin/time -f "$c %e s %M KB" /tmp/at-$b $c /tmp/10m.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
    done
    rm -rf /tmp/rep; RAYON_NUM_THREADS=$th /usr/bin/time -f "report %e s %M KB" /tmp/at-$b report /tmp/10m.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
done
for b in old new; do
  for c in whatif explain leaks; do
    timeout 60 /usr/bin/time -f "x10 live10 $c $b: %e s %M KB" /tmp/at-$b $c carry/x10-live10.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
done
