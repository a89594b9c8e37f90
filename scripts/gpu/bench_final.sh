#!/usr/bin/env bash
# carry/new.xz (the end of this stop) on one H100 host, on the ten-times hostile inputs
# time100 and live10 (carry/x10-*.atrace, made by hostile.rs's every_command test), 60 s limit
# each. Log: scripts/gpu/results/bench_final_h100.log.
set -u
cd "$(dirname "$0")/../.."
xz -dc carry/new.xz > /tmp/at-new; chmod +x /tmp/at-new
for t in time100 live10; do
  for c in summary replay whatif explain frag leaks; do
    timeout 60 /usr/bin/time -f "x10 $t $c: %e s %M KB" /tmp/at-new $c carry/x10-$t.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
  rm -rf /tmp/rep; timeout 60 /usr/bin/time -f "x10 $t report: %e s %M KB" /tmp/at-new report carry/x10-$t.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -2 /tmp/err | tr '\n' ' '; echo
done
