#!/usr/bin/env bash
# carry/old.xz (1632268) and carry/new.xz side by side on one H100 host, on the ten-times time100
# hostile input (carry/x10-time100.atrace: 108 KB, 65.5 M events, made by hostile.rs's
# every_command test), 60 s limit each. Log: scripts/gpu/results/bench_time100_h100.log.
set -u
cd "$(dirname "$0")/../.."
for b in old new; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
for c in explain whatif leaks; do
  for b in old new; do
    timeout 60 /usr/bin/time -f "x10 time100 $c $b: %e s %M KB" /tmp/at-$b $c carry/x10-time100.atrace > /dev/null 2> /tmp/err; tail -1 /tmp/err
  done
done
for b in old new; do
  rm -rf /tmp/rep; timeout 60 /usr/bin/time -f "x10 time100 report $b: %e s %M KB" /tmp/at-$b report carry/x10-time100.atrace -o /tmp/rep > /dev/null 2> /tmp/err; tail -1 /tmp/err
done
