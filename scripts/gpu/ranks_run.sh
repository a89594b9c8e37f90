#!/bin/sh
# Runs the cross-rank and category workloads; writes snapshots and figures to $1 (default: $OUT).
set -u
out=${1:-$OUT}
here=$(dirname "$0")
export PYTHONUNBUFFERED=1
python3 "$here/ranks_ddp.py" "$out" 2>&1 | tee "$out/ranks_log.txt"
for w in transformer_adamw cnn_sgd; do python3 "$here/ranks_models.py" "$out" $w 2>&1 | tee -a "$out/ranks_log.txt"; done
ls -l "$out"
