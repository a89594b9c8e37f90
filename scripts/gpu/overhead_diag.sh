#!/usr/bin/env bash
# Where `alloctrace record`'s time goes on the torch.empty loop: the same loop (empty_batches.py)
# one process after another on the same cores, three rounds: natively; under `alloctrace record`;
# the same with PyTorch's history forced on; the recorder attached in-process without the
# startup shim (inproc_loop.py); the engine back-end. With perf, each run's context switches.
# Run from the repository root with carry/rec/ (alloctrace, librecorder.so); log under $OUT.
set -u
exec > >(tee $OUT/diag.log) 2>&1
C=$PWD/carry/rec
S=$PWD/scripts/gpu
A=$C/alloctrace
P=/tmp/diag
mkdir -p $P
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext ALLOCTRACE_LIB=$C/librecorder.so BATCHES=${BATCHES:-800}
which perf py-spy gdb 2>&1 | head -3
PIN="taskset -c 2-5"
STAT=""
if command -v perf >/dev/null && perf stat -e context-switches true >/dev/null 2>&1; then
  STAT="perf stat -e task-clock,context-switches,cpu-migrations -x, -o"
fi
run() { # label, command...
  local label=$1; shift
  if [ -n "$STAT" ]; then $PIN $STAT $P/$label.stat "$@" > $P/$label.txt 2> $P/$label.err
  else $PIN "$@" > $P/$label.txt 2> $P/$label.err; fi
  grep -h "process CPU\|alloctrace: [0-9]" $P/$label.err | head -3
  [ -n "$STAT" ] && grep -v "^#" $P/$label.stat | grep -v "^$" | tr '\n' ' ' && echo
}
$A record -q -o $P/warm.atrace -- python3 -c "import torch; torch.ones(1, device='cuda')"
ALLOCTRACE_SHIM=$PWD/recorder/python python3 $S/inproc_loop.py $C/librecorder.so $P/warm2.atrace warm > /dev/null 2>&1
for round in 1 2 3; do
  run native$round timeout 120 python3 $S/empty_batches.py native$round
  run record$round timeout 120 $A record -o $P/r$round.atrace -- python3 $S/empty_batches.py record$round
  ALLOCTRACE_TORCH_HISTORY=1 run history$round timeout 120 $A record -o $P/h$round.atrace -- python3 $S/empty_batches.py history$round
  ALLOCTRACE_SHIM=$PWD/recorder/python run inproc$round timeout 120 python3 $S/inproc_loop.py $C/librecorder.so $P/i$round.atrace inproc$round
  run engine$round timeout 120 $A record --allocator alloctrace -o $P/e$round.atrace -- python3 $S/empty_batches.py engine$round
done
cat $P/native*.txt $P/record*.txt $P/history*.txt $P/inproc*.txt $P/engine*.txt > $P/all.txt
python3 $S/batch_stats.py $P/all.txt
