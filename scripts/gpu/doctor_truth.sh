#!/usr/bin/env bash
# The OOM doctor's truth from third-party jobs, in one call on the H100: doctor_truth.py runs
# doctor_jobs.py's jobs unlimited, then at 4 limits around each one's peak reserved under every
# setting (the default run dumping a snapshot at the OOM), and records each past the limit with
# `alloctrace record --capacity`. Run from the repository root with release builds in
# carry/doctor/ (`alloctrace` from `cargo build --release -p alloctrace`, `librecorder.so` from
# `cargo build --release -p alloctrace-recorder --features cuda`) and these scripts in
# carry/doctor/scripts/; results under $OUT: doctor.log, truth.tsv, runs.jsonl, fixtures.tar.gz.
# Extra arguments go to doctor_truth.py (e.g. --only unet_varres).
set -u
exec > >(tee $OUT/doctor.log) 2>&1
C=carry/doctor
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB=$PWD/$C/librecorder.so TORCH_EXTENSIONS_DIR=/tmp/torch_ext
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "torchvision", torchvision.__version__, "transformers", transformers.__version__)'
R=/tmp/doctor
rm -rf $R; mkdir -p $R
python3 $C/scripts/doctor_truth.py $R $C/alloctrace "$@"
cp $R/truth.tsv $R/runs.jsonl $OUT/
tar -C $R -czf $OUT/fixtures.tar.gz fixtures
ls -la $R/fixtures | head -80
