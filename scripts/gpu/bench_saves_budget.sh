#!/usr/bin/env bash
# The saves' budget (SAVED_BLOCKS) halved: peak RSS and wall time of each analysis command, the
# build before (old, 2^19 blocks) and after (new, 2^18), two rounds in turn, with
# scripts/gpu/bench_memory.sh (the 10 M-event realistic trace and the large real trace).
# The binaries are carry/old.xz and carry/new.xz (release builds).
# Log: scripts/gpu/results/bench_saves_budget_h100.log.
set -u
cd "$(dirname "$0")/../.."
for b in old new; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
for round in 1 2; do
  for b in old new; do
    echo "### round $round: $b"
    scripts/gpu/bench_memory.sh /tmp/at-$b
  done
done
