#!/usr/bin/env bash
# Everything the recorder needs proven on a GPU, in one call. Run from the repository root with
# the built artefacts in carry/ (see traces/README.md), results under $OUT.
set -u
C=carry
S=$C/scripts
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB=$PWD/$C/librecorder.so
REC="$C/alloctrace_record --lib $ALLOCTRACE_LIB"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'

echo "== 1. GPU tests (ignored in CI)"
$C/recorder_cuda --ignored --test-threads=1 2>&1 | tail -15

echo "== 2. Rust: overhead table and recorded Rust workload"
$C/cuda_bench $OUT

echo "== 3. GPT-2 training under alloctrace record"
$REC -o $OUT/recorded_gpt2_train.atrace -- python3 $S/train_gpt2.py; echo "exit $?"

echo "== 4. BERT inference with variable shapes under alloctrace record"
$REC -o $OUT/recorded_bert_infer_varlen.atrace -- python3 $S/infer_bert.py; echo "exit $?"

echo "== 5. stacks, marks, empty_cache, exit code (expect exit 3)"
$REC --stacks -o $OUT/recorded_smoke_stacks.atrace -- python3 $S/smoke_stacks.py; echo "exit $?"
python3 $S/smoke_stacks.py; echo "native exit $?"

echo "== 6. expandable segments: GPT-2 training"
$REC --conf expandable_segments:True -o $OUT/recorded_gpt2_train_expandable.atrace -- python3 $S/train_gpt2.py; echo "exit $?"

echo "== 7. unwritable output path: the job keeps running"
$REC -o /proc/nonexistent/x.atrace -- python3 $S/smoke_stacks.py; echo "exit $?"

echo "== 8. torch.empty loop: native vs recorded"
python3 $S/empty_loop.py
$REC -o $OUT/empty_loop.atrace -- python3 $S/empty_loop.py
rm -f $OUT/empty_loop.atrace $OUT/bench_overhead.atrace

echo "== replay check of every recorded trace"
$C/check_trace $OUT/recorded_*.atrace

echo "== 9. PyTorch native caching allocator, same machine, same run"
timeout 300 python3 $S/native_bench.py
