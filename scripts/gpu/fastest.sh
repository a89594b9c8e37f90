# Sourced by the GPU benchmark scripts. best THREADS COMMAND... prints the fastest wall time of
# 7 runs of COMMAND in seconds, under RAYON_NUM_THREADS=THREADS (a report's /tmp/rep is removed
# before each run).
best() {
  local th=$1; shift; local b=""
  for _ in 1 2 3 4 5 6 7; do
    rm -rf /tmp/rep
    local t0=$(date +%s.%N); RAYON_NUM_THREADS=$th "$@" > /dev/null 2>&1; local t1=$(date +%s.%N)
    local s=$(awk -v a=$t0 -v b=$t1 'BEGIN{print b-a}')
    if [ -z "$b" ] || awk "BEGIN{exit !($s < $b)}"; then b=$s; fi
  done
  echo "$b"
}
