#!/usr/bin/env bash
# Peak RSS and wall time of each analysis command on all of this host's cores: the 10 M-event
# realistic trace (synthesised here) and the large real trace, as multiples of one `replay`.
# Usage: [EVENTS=10000000] [RUNS=1] scripts/gpu/bench_memory.sh BINARY
set -euo pipefail
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BIN" synth --realistic --events "${EVENTS:-10000000}" -o "$T/r10m.atrace" > /dev/null
echo "cores: $(nproc)"
run() { # trace command -> seconds and peak RSS (MB) of the fastest of RUNS runs
  python3 - "$BIN" "$1" "$2" "$T" "${RUNS:-1}" <<'PY'
import resource, subprocess, sys, time
b, t, c, tmp, runs = sys.argv[1:]
args = [b, c, t] + (["-o", tmp + "/rep", "--force"] if c == "report" else [])
best = None
for _ in range(int(runs)):
    t0 = time.time()
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dt = time.time() - t0
    best = dt if best is None else min(best, dt)
print(f"{best:.2f} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f}")
PY
}
for t in "$T/r10m.atrace" traces/large/mixed_sizes_big.default.atrace; do
  echo "== $(basename "$t")"
  for c in replay whatif explain frag report; do
    read -r s mb < <(run "$t" "$c")
    [ "$c" = replay ] && base=$s
    awk -v c="$c" -v s="$s" -v b="$base" -v mb="$mb" 'BEGIN { printf "%-8s %7.2f s %5.1fx %6d MB\n", c, s, s / b, mb }'
  done
done
