#!/usr/bin/env bash
# The recorder's overhead, before and after its hot paths were cut, side by side in one call:
# where the default back-end's time goes (torch_overhead.py: native, PyTorch's history alone,
# the tracker alone, ours), the torch.empty loop under `alloctrace record` (the build of the
# previous proofs in old/, and this one), the engine's cached alloc+free pair (both builds),
# and CUDA graphs and record_stream under the new helper, with a replay check of their traces.
# Run from the repository root with release builds in carry/recorder/ (alloctrace,
# librecorder.so, check_trace, cuda_bench; the previous build's in carry/recorder/old/), these
# scripts in carry/recorder/scripts/ and the shim in carry/recorder/python/; results under $OUT.
set -u
exec > >(tee $OUT/speed.log) 2>&1
C=$PWD/carry/recorder
S=$C/scripts
P=/tmp/speed
mkdir -p $P /tmp/cb /tmp/cb_old
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
stamp() { echo "[$(date +%T)] $*"; }
# The host is shared: each measured process gets the same four cores.
PIN="taskset -c 4-7"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nproc

stamp "== where the default back-end's time goes (one process, modes alternating)"
ALLOCTRACE_SHIM=$C/python $PIN timeout 300 python3 $S/torch_overhead.py $C/librecorder.so $P/inproc.atrace
timeout 60 $C/check_trace $P/inproc.atrace 2>&1 | tail -1

stamp "== torch.empty(4096 B) loop under alloctrace record, ns per call: native / before / after / engine"
old() { ALLOCTRACE_LIB=$C/old/librecorder.so $PIN timeout 150 $C/old/alloctrace "$@"; }
new() { ALLOCTRACE_LIB=$C/librecorder.so $PIN timeout 150 $C/alloctrace "$@"; }
old record -q -o $P/warm.atrace -- python3 -c "import torch; torch.ones(1, device='cuda')"
for round in 1 2 3 4; do
  $PIN timeout 60 python3 $S/empty_loop.py | sed "s/^/native:  /"
  old record -o $P/el_old.atrace -- python3 $S/empty_loop.py 2>&1 | sed "s/^/before:  /"
  new record -o $P/el_new.atrace -- python3 $S/empty_loop.py 2>&1 | sed "s/^/after:   /"
  new record --allocator alloctrace -o $P/el_engine.atrace -- python3 $S/empty_loop.py 2>&1 | sed "s/^/engine:  /"
done

stamp "== engine back-end: cached alloc+free pair, before then after"
for round in 1 2; do
  $PIN timeout 100 $C/old/cuda_bench /tmp/cb_old 2>&1 | grep -E "^\| pair|^\| 1000|this machine" | sed "s/^/before: /"
  $PIN timeout 100 $C/cuda_bench /tmp/cb 2>&1 | grep -E "^\| pair|^\| 1000|trace:|this machine" | sed "s/^/after:  /"
done

stamp "== the new helper under CUDA graphs and record_stream (default back-end)"
timeout 60 python3 $S/graphs.py > $P/graphs_native.txt 2>/dev/null
new record -o $P/graphs.atrace -- python3 $S/graphs.py > $P/graphs_rec.txt 2>$P/graphs_rec.err
grep alloctrace $P/graphs_rec.err
cat $P/graphs_rec.txt
if cmp -s $P/graphs_native.txt $P/graphs_rec.txt; then echo "graphs: same results as native"; else echo "graphs: DIFFERENT"; diff $P/graphs_native.txt $P/graphs_rec.txt | head; fi
new dump $P/graphs.atrace 2>/dev/null | grep -E "segment_(alloc|map|pool)"
new record -o $P/stream.atrace -- python3 $S/stream_safety.py 2>&1
timeout 100 $C/check_trace $P/graphs.atrace $P/stream.atrace $P/el_new.atrace 2>&1 | grep -v "^$"
cp $P/graphs.atrace $OUT/ 2>/dev/null
stamp done
