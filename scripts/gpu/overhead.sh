#!/usr/bin/env bash
# The recorder's overhead on a GPU machine, every figure side by side in one call: the Rust
# table (engine on the CUDA device, recording off and on) alternating with PyTorch's native
# caching allocator, the same table on the simulated device, and a Python torch.empty loop
# native vs under `alloctrace record`. Also runs the GPU tests and one recorded Python job, so
# the figures come from a recorder that is proven to work there.
# Run from the repository root with release builds in carry/ (alloctrace, librecorder.so,
# cuda_bench, bench_recorder, check_trace, recorder_cuda); results under $OUT.
set -u
C=carry
S=scripts/gpu
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB=$PWD/$C/librecorder.so
AT=$C/alloctrace
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
grep -m1 "model name" /proc/cpuinfo; nproc
python3 -c 'import torch; print("torch", torch.__version__)'

echo "== 1. GPU tests (ignored in CI)"
$C/recorder_cuda --ignored --test-threads=1 2>&1 | grep -E "^test |test result"

echo "== 2. cached alloc+free pair: alloctrace (Rust, CUDA device) and PyTorch native, alternating"
for round in 1 2 3; do
  echo "-- round $round: alloctrace"
  $C/cuda_bench $OUT 2>&1 | grep -vE "^\s*$"
  echo "-- round $round: PyTorch native"
  timeout 300 python3 $S/native_bench.py
done

echo "== 3. the same table on the simulated device (the engine's and recorder's own cost)"
$C/bench_recorder /tmp 1000000 3
echo "-- the same with an unwritable trace path: the writer thread idles, so this is the"
echo "   allocating thread's own cost without a busy writer beside it"
$C/bench_recorder /proc/nonexistent 1000000 3

echo "== 4. torch.empty loop: native vs under alloctrace record, alternating"
for round in 1 2 3; do
  python3 $S/empty_loop.py
  $AT record -q -o /tmp/empty_loop.atrace -- python3 $S/empty_loop.py
done
$AT summary /tmp/empty_loop.atrace | head -6

echo "== 5. a recorded Python job with stacks, replayed"
$AT record --stacks -o $OUT/smoke.atrace -- python3 $S/smoke_stacks.py; echo "exit $? (expect 3)"
$C/check_trace $OUT/smoke.atrace $OUT/recorded_rust_workload*.atrace
