#!/usr/bin/env bash
# Private pools and the recorder's overhead, in one H100 call.
# 1. graph_pools.py (CUDA graphs, a shared graph pool, a MemPool, torch.compile's graph trees,
#    then all deleted and the cache emptied): natively, natively with PyTorch's history (the
#    snapshot), and under `alloctrace record`; results compared, each trace's replay checked
#    against its segment events, the replayed peaks printed beside PyTorch's counters.
# 2. Overhead of the default back-end: in one process (overhead_batches.py, short batches
#    alternating), and natively and recorded at the same time (empty_batches.py, paired).
# 3. The engine back-end's cached alloc+free pair (cuda_bench, short alternating rounds).
# Run from the repository root with release builds in carry/rec/ (alloctrace, librecorder.so,
# check_trace, cuda_bench); results under $OUT.
set -u
exec > >(tee $OUT/pools.log) 2>&1
C=$PWD/carry/rec
S=$PWD/scripts/gpu
A=$C/alloctrace
P=/tmp/pools
mkdir -p $P /tmp/cb
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext ALLOCTRACE_LIB=$C/librecorder.so
stamp() { echo "[$(date +%T)] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"

stamp "== 1. private pools: natively, with a snapshot, under alloctrace record"
timeout 300 python3 $S/graph_pools.py > $P/native.txt 2> $P/native.err || tail -5 $P/native.err
SNAPSHOT=$P/graph_pools.pickle timeout 300 python3 $S/graph_pools.py > $P/snap.txt 2> $P/snap.err || tail -5 $P/snap.err
timeout 300 $A record -o $P/graph_pools.atrace -- python3 $S/graph_pools.py > $P/rec.txt 2> $P/rec.err
echo "record exit $?"; grep alloctrace $P/rec.err | head -5
for f in native snap rec; do echo "--- $f"; cat $P/$f.txt; done
for f in snap rec; do
  if cmp -s <(grep -v '^torch:' $P/native.txt) <(grep -v '^torch:' $P/$f.txt); then echo "$f: same results as native"; else echo "$f: DIFFERENT results"; fi
done
python3 - $P/graph_pools.pickle $P/graph_pools.live.pickle <<'PY'
import pickle, sys
for path in sys.argv[1:]:
    d = pickle.load(open(path, "rb"))
    keys = set(k for tr in d["device_traces"] for e in tr for k in e)
    pools = sorted(set(tuple(s["segment_pool_id"]) for s in d["segments"]))
    print(path, "entry keys", sorted(keys), "segment pools", pools)
PY
timeout 120 $A import torch $P/graph_pools.pickle -o $P/graph_pools_snapshot.atrace 2>&1 | tail -3
timeout 120 $A import torch $P/graph_pools.live.pickle -o $P/graph_pools_live.atrace 2>&1 | tail -3
timeout 120 $C/check_trace $P/graph_pools.atrace $P/graph_pools_snapshot.atrace $P/graph_pools_live.atrace 2>&1 | grep -v "^$"
for t in graph_pools graph_pools_snapshot graph_pools_live; do
  echo "--- replay $t"; timeout 120 $A replay $P/$t.atrace 2>&1 | head -30
done
timeout 60 $A dump $P/graph_pools.atrace 2>/dev/null | grep -E "segment_(alloc|free|map|unmap|pool)|cache_release" | head -60
cp $P/graph_pools.atrace $P/graph_pools.pickle $P/graph_pools.live.pickle $P/native.txt $P/rec.txt $P/snap.txt $OUT/ 2>/dev/null

stamp "== 2a. overhead in one process, short batches alternating"
ALLOCTRACE_SHIM=$PWD/recorder/python taskset -c 2-5 timeout 400 python3 $S/overhead_batches.py $C/librecorder.so $P/ob.atrace

stamp "== 2b. native and recorded at the same time, paired (cores swapped in round 2)"
$A record -q -o $P/warm.atrace -- python3 -c "import torch; torch.ones(1, device='cuda')"
for round in 1 2; do
  if [ $round = 1 ]; then NC=2-3 RC=6-7; else NC=6-7 RC=2-3; fi
  export START_AT=$(( $(date +%s) + 30 ))
  taskset -c $NC timeout 200 python3 $S/empty_batches.py native$round > $P/pn$round.txt 2> $P/pn$round.err &
  n=$!
  taskset -c $RC timeout 200 $A record -o $P/pr$round.atrace -- python3 $S/empty_batches.py record$round > $P/pr$round.txt 2> $P/pr$round.err &
  r=$!
  wait $n $r
  cat $P/pn$round.err $P/pr$round.err | grep -v "^$" | tail -4
done
python3 $S/batch_stats.py $P/pn1.txt $P/pr1.txt $P/pn2.txt $P/pr2.txt
timeout 60 $C/check_trace $P/pr1.atrace 2>&1 | tail -2

stamp "== 3. engine back-end: cached alloc+free pair, recording off / on"
taskset -c 4-7 timeout 200 $C/cuda_bench /tmp/cb 2>&1 | grep -E "^\| |this machine|overhead trace"
stamp done
