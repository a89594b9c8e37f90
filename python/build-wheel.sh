#!/usr/bin/env bash
# Builds the wheel to distribute: the release `alloctrace` binary, and inside the package the
# recorder library with CUDA support (it builds without CUDA installed: the driver is loaded at
# run time), where `alloctrace.record` and `python -m alloctrace record` find it.
#   python/build-wheel.sh [OUT_DIR]      (default dist/)
# The wheel is tagged for this machine's Linux (linux_x86_64); PyPI takes manylinux wheels only,
# so for an upload build it in a manylinux container (maturin's own image does) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-dist}"
cargo build --release -p alloctrace-recorder --features cuda --lib
mkdir -p python/alloctrace/lib
cp target/release/librecorder.so python/alloctrace/lib/librecorder.so
# Bytecode left by a local run is not part of the package.
find python/alloctrace -name __pycache__ -prune -exec rm -rf {} +
python3 -m pip wheel --no-deps ./python -w "$out"
