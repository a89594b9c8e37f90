#!/usr/bin/env bash
# A second GPU call: the `alloctrace record` CLI end to end, the recorder's overhead with the
# current engine, and alloctrace against PyTorch's own tooling (_memory_viz) on one snapshot.
# Run from the repository root with release builds in carry/ (alloctrace, librecorder.so,
# cuda_bench, check_trace, recorder_cuda) and workloads.py in carry/; results under $OUT.
set -u
C=carry
S=scripts/gpu
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB=$PWD/$C/librecorder.so
AT=$C/alloctrace
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'

echo "== 1. GPU tests (ignored in CI)"
$C/recorder_cuda --ignored --test-threads=1 2>&1 | grep -E "^test |test result"

echo "== 2. overhead: cached alloc+free pair from Rust, recording off/on (current engine)"
$C/cuda_bench /tmp 2>&1 | tail -12

echo "== 3. alloctrace record (the CLI) of GPT-2 training, then replay and summary"
/usr/bin/time -f "record wall %e s" $AT record -o $OUT/cli_gpt2.atrace -- python3 $S/train_gpt2.py; echo "exit $?"
$C/check_trace $OUT/cli_gpt2.atrace
$AT summary $OUT/cli_gpt2.atrace | head -12

echo "== 4. torch.empty loop: native vs under alloctrace record"
python3 $S/empty_loop.py
$AT record -q -o /tmp/empty_loop.atrace -- python3 $S/empty_loop.py

echo "== 5. PyTorch's _memory_viz vs alloctrace on the same snapshot (mixed_sizes_big)"
mkdir -p /tmp/snap && python3 $C/workloads.py mixed_sizes_big /tmp/snap --snapshot
P=/tmp/snap/mixed_sizes_big.default.pickle
ls -l $P
python3 - "$P" <<'PY'
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
print("entries", sum(len(t) for t in s["device_traces"]))
PY
t0=$(date +%s.%N); python3 -m torch.cuda._memory_viz stats $P > /tmp/viz_stats.txt; t1=$(date +%s.%N)
python3 -m torch.cuda._memory_viz trace_plot $P -o /tmp/viz.html; t2=$(date +%s.%N)
echo "memory_viz stats: $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s; trace_plot: $(awk "BEGIN{printf \"%.2f\", $t2 - $t1}") s, $(stat -c %s /tmp/viz.html) bytes HTML"
t0=$(date +%s.%N); $AT import torch $P -o /tmp/snap.atrace | tail -1; t1=$(date +%s.%N)
$AT summary /tmp/snap.atrace > /dev/null; t2=$(date +%s.%N)
$AT report /tmp/snap.atrace -o /tmp/snap_report > /dev/null; t3=$(date +%s.%N)
echo "alloctrace import: $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s; summary: $(awk "BEGIN{printf \"%.2f\", $t2 - $t1}") s; report: $(awk "BEGIN{printf \"%.2f\", $t3 - $t2}") s"
du -sb /tmp/snap_report /tmp/snap_report/report.html /tmp/snap.atrace
cp /tmp/snap_report/report.md $OUT/snap_report.md

echo "== 6. PyTorch native caching allocator, same machine, same run"
timeout 200 python3 $S/native_bench.py
