#!/usr/bin/env bash
# Recording overhead side by side, in one call: a torch.empty loop natively, under the default
# back-end (PyTorch's allocator, events streamed) and under the engine back-end, alternating;
# then the cached alloc+free pair from Rust with recording on (engine on the CUDA device) and
# PyTorch's native pair, alternating. The Trainer run's time is in recorder_proofs.sh.
# Run from the repository root with release builds in carry/recorder/; results under $OUT.
set -u
exec > >(tee $OUT/overhead.log) 2>&1
C=carry/recorder
S=$C/scripts
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB=$PWD/$C/librecorder.so TORCH_EXTENSIONS_DIR=/tmp/torch_ext
AT=$C/alloctrace
nvidia-smi --query-gpu=name --format=csv,noheader
$AT record -q -o /tmp/warm.atrace -- python3 -c "import torch; torch.ones(1, device='cuda')"

echo "== torch.empty(4096 B) loop, ns per call: native / default back-end / engine back-end"
for round in 1 2 3; do
  python3 $S/empty_loop.py | sed "s/^/native:  /"
  $AT record -o /tmp/el.atrace -- python3 $S/empty_loop.py 2>&1 | sed "s/^/default: /"
  $AT record --allocator alloctrace -o /tmp/el_engine.atrace -- python3 $S/empty_loop.py 2>&1 | sed "s/^/engine:  /"
done

echo "== cached alloc+free pair: alloctrace engine on the CUDA device (Rust) and PyTorch native, alternating"
for round in 1 2; do
  $C/cuda_bench /tmp/cb 2>&1 | grep -vE "^\s*$"
  timeout 200 python3 $S/native_bench.py
done
