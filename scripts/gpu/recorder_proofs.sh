#!/usr/bin/env bash
# The recorder's proofs on one GPU, in one call: record_stream safety under every back-end, CUDA
# graphs, a Hugging Face Trainer run (peaks and time), kill -9 mid-run, DDP with two ranks, the
# fallback without a compiler, and a replay check of every trace. Run from the repository root
# with release builds in carry/recorder/ (alloctrace, librecorder.so, check_trace) and these
# scripts in carry/recorder/scripts/; results under $OUT.
set -u
exec > >(tee $OUT/proofs.log) 2>&1
C=carry/recorder
S=$C/scripts
P=/tmp/proofs
mkdir -p $P
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB=$PWD/$C/librecorder.so TORCH_EXTENSIONS_DIR=/tmp/torch_ext
AT="timeout 150 $C/alloctrace"
stamp() { echo "[$(date +%T)] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'

stamp "== 0. default back-end: the helper is built at first use (then cached)"
t=$(date +%s%N)
$AT record -o $P/warm.atrace -- python3 -c "import torch; print(torch.ones(4, device='cuda').sum().item())"
echo "first use took $(( ($(date +%s%N) - t) / 1000000 )) ms"
t=$(date +%s%N)
$AT record -q -o $P/warm.atrace -- python3 -c "import torch; print(torch.ones(4, device='cuda').sum().item())"
echo "second use took $(( ($(date +%s%N) - t) / 1000000 )) ms"

stamp "== 1. record_stream, 20 trials: native, default back-end, engine back-end"
timeout 60 python3 $S/stream_safety.py
$AT record -o $P/stream_default.atrace -- python3 $S/stream_safety.py
$AT record --allocator alloctrace -o $P/stream_engine.atrace -- python3 $S/stream_safety.py
$AT dump $P/stream_engine.atrace | awk '{print $3}' | sort | uniq -c

stamp "== 2. CUDA graphs: native vs default back-end; the engine back-end refuses clearly"
timeout 150 python3 $S/graphs.py > $P/graphs_native.txt 2>$P/graphs_native.err; echo "native exit $?"
$AT record -o $P/graphs_default.atrace -- python3 $S/graphs.py > $P/graphs_default.txt; echo "default exit $?"
cat $P/graphs_native.txt
if cmp -s $P/graphs_native.txt $P/graphs_default.txt; then echo "graphs: SAME results as native"; else echo "graphs: DIFFERENT"; cat $P/graphs_default.txt; fi
$AT record --allocator alloctrace -o $P/graphs_engine.atrace -- python3 $S/graphs.py 2>&1 | grep -m2 "alloctrace:"; echo "engine exit ${PIPESTATUS[0]}"

stamp "== 3. Hugging Face Trainer: native, default back-end"
for round in 1; do
  timeout 150 python3 $S/trainer_hf.py 2>&1 | grep -E "trainer_seconds|max_memory|'loss'" | sed "s/^/native: /"
  $AT record -o $P/trainer.atrace -- python3 $S/trainer_hf.py 2>&1 | grep -E "trainer_seconds|max_memory|'loss'|^alloctrace" | sed "s/^/default: /"
done
$AT summary --json $P/trainer.atrace | grep -E '"peak_reserved_bytes"|"num_device_alloc"|"events"'
$AT replay --json $P/trainer.atrace | grep -m3 -E '"peak_allocated_bytes"|"peak_reserved_bytes"'

stamp "== 4. kill -9 mid-run (default back-end): the trace reads up to its last flush"
$AT record -o $P/killed.atrace -- python3 $S/killed.py $P/pid &
sleep 10; kill -9 $(cat $P/pid); wait $!
$AT summary $P/killed.atrace 2>&1 | head -4
echo "-- engine back-end"
$AT record --allocator alloctrace -o $P/killed_engine.atrace -- python3 $S/killed.py $P/pid &
sleep 8; kill -9 $(cat $P/pid); wait $!
$AT summary $P/killed_engine.atrace 2>&1 | head -4

stamp "== 5. DDP, 2 ranks under torchrun (one GPU here: gloo): native vs default back-end"
timeout 150 torchrun --nproc_per_node=2 $S/ddp_train.py 2>/dev/null | grep "^rank" | sort > $P/ddp_native.txt
$AT record -o $P/ddp.atrace -- torchrun --nproc_per_node=2 $S/ddp_train.py 2>$P/ddp_rec.err | grep "^rank" | sort > $P/ddp_rec.txt
grep "^alloctrace" $P/ddp_rec.err
head -3 $P/ddp_native.txt
if cmp -s $P/ddp_native.txt $P/ddp_rec.txt; then echo "ddp: every loss of every step EQUAL to native ($(wc -l < $P/ddp_native.txt) lines)"; else echo "ddp: DIFFERENT"; diff $P/ddp_native.txt $P/ddp_rec.txt | head; fi
ls -la $P/ddp*.atrace


stamp "== 6. no compiler: the default back-end falls back to PyTorch's history"
CXX=/bin/false CC=/bin/false TORCH_EXTENSIONS_DIR=/tmp/torch_ext_none $AT record -o $P/fallback.atrace -- python3 $S/stream_safety.py 2>&1 | grep -E "record_stream|alloctrace"

stamp "== 7. replay check: each trace's replay reproduces its segment events"
$C/check_trace $P/stream_default.atrace $P/stream_engine.atrace $P/graphs_default.atrace $P/trainer.atrace $P/ddp.rank0.atrace $P/ddp.rank1.atrace $P/fallback.atrace
cp $P/ddp.rank0.atrace $P/ddp.rank1.atrace $P/trainer.atrace $OUT/ 2>/dev/null
