#!/usr/bin/env bash
# carry/alloctrace_old against carry/alloctrace, interleaved run by run (N runs each, default 10)
# on the large real trace: replay, whatif, explain, report; min and median wall time of each, on
# all cores, then under taskset -c 0,1 (CORES=2). Usage: [N=10] [CORES=all|2] interleaved.sh
# Log: scripts/gpu/results/interleaved_h200.log.
set -u
cd "$(dirname "$0")/../.."
T=traces/large/mixed_sizes_big.default.atrace
N=${N:-10}
pin=""
[ "${CORES:-all}" = 2 ] && pin="taskset -c 0,1"
echo "cores: ${CORES:-all} ($(nproc) here); load $(cut -d' ' -f1-3 /proc/loadavg); $N runs each, interleaved"
one() { local t0 t1; t0=$(date +%s%N); $pin "$@" > /dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000 )); }
for c in replay whatif explain report; do
  : > /tmp/old.t; : > /tmp/new.t
  for k in $(seq "$N"); do
    for b in old new; do
      bin=carry/alloctrace; [ $b = old ] && bin=carry/alloctrace_old
      rm -rf /tmp/rep
      if [ $c = report ]; then one $bin report $T -o /tmp/rep >> /tmp/$b.t; else one $bin $c $T >> /tmp/$b.t; fi
    done
  done
  for b in old new; do
    sort -n /tmp/$b.t | awk -v c=$c -v b=$b '{ a[NR] = $1 } END { printf "%-8s %-4s min %.3f s  median %.3f s\n", c, b, a[1] / 1e6, a[int((NR + 1) / 2)] / 1e6 }'
  done
done
