#!/bin/sh
# Records the workloads of phases_truth.py, then two DDP ranks of phases_ddp.py under torchrun,
# with `alloctrace record` (the shim marks forward, backward, optimizer steps and
# DistributedDataParallel's buckets) and prints each trace's summary with its categories and the
# view across the ranks. Expects the release `alloctrace` and the recorder library (built with
# `--features cuda`) in $1 (default: carry/ranks); writes the traces and the models' figures to
# $2 (default: $OUT).
set -u
bin=${1:-carry/ranks}
out=${2:-$OUT}
here=$(dirname "$0")
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB="$(cd "$bin" && pwd)/librecorder.so" TORCH_EXTENSIONS_DIR=/tmp/torch_ext
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
for w in transformer_adamw transformer_adamw_checkpointed cnn_sgd; do
  timeout 200 "$bin/alloctrace" record -o "$out/$w.atrace" -- python3 "$here/phases_truth.py" "$out" $w
  "$bin/alloctrace" summary "$out/$w.atrace"
done
# Two DDP ranks, rank 1 with a 4x larger batch: one trace per rank, and the view across them.
timeout 200 "$bin/alloctrace" record -o "$out/ddp.atrace" -- torchrun --nproc_per_node=2 "$here/phases_ddp.py" "$out"
"$bin/alloctrace" ranks "$out"/ddp.rank*.atrace
ls -l "$out"
