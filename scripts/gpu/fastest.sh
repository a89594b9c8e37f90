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

# large_rounds TRACE: three rounds, on 16 cores and on 2 (taskset -c 0,1), of the fastest
# replay, whatif, explain and report of TRACE with /tmp/at-old and /tmp/at-new in turn, each
# as a ratio to the replay of its round and build.
large_rounds() {
  local T=$1
  for round in 1 2 3; do
    for cores in 16 2; do
      if [ $cores = 2 ]; then pin="taskset -c 0,1"; else pin=""; fi
      for b in old new; do
        r=$(best $cores $pin /tmp/at-$b replay $T); w=$(best $cores $pin /tmp/at-$b whatif $T)
        e=$(best $cores $pin /tmp/at-$b explain $T); p=$(best $cores $pin /tmp/at-$b report $T -o /tmp/rep)
        awk -v b=$b -v c=$cores -v r=$r -v w=$w -v e=$e -v p=$p -v round=$round 'BEGIN{printf "large round %d %2d cores %-3s replay %.3f s  whatif %.3f s %.1fx  explain %.3f s %.1fx  report %.3f s %.1fx\n", round, c, b, r, w, w/r, e, e/r, p, p/r}'
      done
    done
  done
}

# old_and_new: the two builds compared (carry/old.xz and carry/new.xz) unpacked as /tmp/at-old
# and /tmp/at-new; prints the host's cores.
old_and_new() {
  for b in old new; do xz -dc carry/$b.xz > /tmp/at-$b; chmod +x /tmp/at-$b; done
  echo "cores: $(nproc)"
}
