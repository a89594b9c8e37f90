#!/usr/bin/env bash
# graph_pools.py under other allocator settings (expandable segments; max_split_size_mb), each
# recorded by `alloctrace record` and natively with PyTorch's history (the snapshot taken while
# the graphs live): the traces come back for the replay check. Run from the repository root
# with carry/rec/ (alloctrace, librecorder.so); files under $OUT.
set -u
exec > >(tee $OUT/settings.log) 2>&1
C=$PWD/carry/rec
S=$PWD/scripts/gpu
A=$C/alloctrace
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext ALLOCTRACE_LIB=$C/librecorder.so
for conf in expandable_segments:True max_split_size_mb:8; do
  name=$(echo $conf | tr ':' '_')
  PYTORCH_CUDA_ALLOC_CONF=$conf SNAPSHOT=$OUT/$name.pickle timeout 250 python3 $S/graph_pools.py > $OUT/$name.snapshot_run.txt 2>/dev/null
  timeout 250 $A record --conf $conf -o $OUT/$name.atrace -- python3 $S/graph_pools.py > $OUT/$name.recorded_run.txt 2> $OUT/$name.err
  echo "== $conf"; cat $OUT/$name.recorded_run.txt; grep alloctrace $OUT/$name.err
  cmp -s <(grep -v '^torch:' $OUT/$name.snapshot_run.txt) <(grep -v '^torch:' $OUT/$name.recorded_run.txt) && echo "same results" || echo "DIFFERENT results"
  rm -f $OUT/$name.pickle
done
