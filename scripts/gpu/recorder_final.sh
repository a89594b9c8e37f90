#!/usr/bin/env bash
# Second half of the recorder's GPU proofs (recorder_proofs.sh has the first), in one call:
# kill -9 mid-run, DDP with two ranks under torchrun, the fallback without a compiler, a replay
# check of these traces, and the overhead side by side (torch.empty loop under each back-end,
# the engine's cached alloc+free pair with recording on and PyTorch's native pair).
set -u
exec > >(tee $OUT/final.log) 2>&1
C=carry/recorder
S=$C/scripts
P=/tmp/proofs
mkdir -p $P
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB=$PWD/$C/librecorder.so TORCH_EXTENSIONS_DIR=/tmp/torch_ext
AT="timeout 150 $C/alloctrace"
stamp() { echo "[$(date +%T)] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader
for i in 1 2; do
  t=$(date +%s%N)
  $AT record -q -o $P/warm.atrace -- python3 -c "import torch; torch.ones(1, device='cuda')"
  echo "helper use $i took $(( ($(date +%s%N) - t) / 1000000 )) ms (1: build, 2: cached)"
done

stamp "== kill -9 mid-run: default back-end, then engine back-end"
rm -f $P/pid; $AT record -o $P/killed.atrace -- python3 $S/killed.py $P/pid &
sleep 12; kill -9 $(cat $P/pid); wait $!
$AT summary $P/killed.atrace 2>&1 | head -3
rm -f $P/pid; $AT record --allocator alloctrace -o $P/killed_engine.atrace -- python3 $S/killed.py $P/pid &
sleep 10; kill -9 $(cat $P/pid); wait $!
$AT summary $P/killed_engine.atrace 2>&1 | head -3

stamp "== DDP, 2 ranks under torchrun (one GPU here: gloo): native vs default back-end"
timeout 150 torchrun --nproc_per_node=2 $S/ddp_train.py 2>/dev/null | grep "^rank" | sort > $P/ddp_native.txt
$AT record -o $P/ddp.atrace -- torchrun --nproc_per_node=2 $S/ddp_train.py 2>$P/ddp_rec.err | grep "^rank" | sort > $P/ddp_rec.txt
grep "^alloctrace" $P/ddp_rec.err
head -2 $P/ddp_native.txt
if cmp -s $P/ddp_native.txt $P/ddp_rec.txt; then echo "ddp: every loss of every step EQUAL to native ($(wc -l < $P/ddp_native.txt) lines)"; else echo "ddp: DIFFERENT"; diff $P/ddp_native.txt $P/ddp_rec.txt | head; fi
ls $P/ | grep ddp

stamp "== no compiler: the default back-end falls back to PyTorch's history"
CXX=/bin/false CC=/bin/false TORCH_EXTENSIONS_DIR=/tmp/torch_ext_none $AT record -o $P/fallback.atrace -- python3 $S/stream_safety.py 2>&1 | grep -E "record_stream|alloctrace"

stamp "== replay check: each trace's replay reproduces its segment events"
timeout 100 $C/check_trace $P/ddp.rank0.atrace $P/ddp.rank1.atrace $P/fallback.atrace $P/killed.atrace $P/killed_engine.atrace

stamp "== overhead: torch.empty(4096 B) loop, ns per call: native / default back-end / engine back-end"
for round in 1 2; do
  timeout 60 python3 $S/empty_loop.py | sed "s/^/native:  /"
  $AT record -o $P/el.atrace -- python3 $S/empty_loop.py 2>&1 | sed "s/^/default: /"
  $AT record --allocator alloctrace -o $P/el_engine.atrace -- python3 $S/empty_loop.py 2>&1 | sed "s/^/engine:  /"
done
stamp "== overhead: cached alloc+free pair, engine on the CUDA device (Rust) then PyTorch native"
timeout 100 $C/cuda_bench /tmp/cb 2>&1 | grep -vE "^\s*$"
timeout 100 python3 $S/native_bench.py
cp $P/ddp.rank0.atrace $P/ddp.rank1.atrace $OUT/ 2>/dev/null
stamp done
