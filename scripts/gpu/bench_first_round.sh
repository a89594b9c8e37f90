#!/usr/bin/env bash
# The large real trace, three rounds (bench_overlap_rounds.sh): carry/prev.xz (c9352d0) and
# carry/new.xz (a capacity search replays its first bisection levels beside its check of the
# upper bound). Log: scripts/gpu/results/bench_first_round_h100.log.
exec "$(dirname "$0")/bench_overlap_rounds.sh" prev new
