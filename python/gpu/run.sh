#!/usr/bin/env bash
# On a GPU host with PyTorch, from the repository's root, with a wheel from python/build-wheel.sh
# in WHEEL_DIR (default dist/): installs it, opens memory-viz exports of shipped traces with
# PyTorch's own _memory_viz (and compares frag_oom's with the original snapshot), then runs the
# package's tests, torch and GPU ones included, with PyTorch's memory history and with the
# recording allocator. Logs go to OUT (default /tmp/alloctrace-gpu).
set -x
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/alloctrace-gpu}
mkdir -p "$out" /tmp/alloctrace-x
python3 -m pip install -q --no-index --no-deps --target /tmp/alloctrace-site "${WHEEL_DIR:-dist}"/alloctrace-*.whl || exit 1
export PATH=/tmp/alloctrace-site/bin:$PATH PYTHONPATH=/tmp/alloctrace-site ALLOCTRACE_REPO=$PWD
alloctrace --version
for t in frag_oom.default frag_oom.expandable gpt2_train.default recorded_gpt2_train_expandable recorded_rust_workload; do
  alloctrace export traces/$t.atrace --format memory-viz -o /tmp/alloctrace-x/$t.pickle
done
python3 "$here/check_memory_viz.py" /tmp/alloctrace-x "$out" 2>&1 | tee "$out/viz.log"
# PyTorch's memory history (no recorder library), then the recording allocator (the wheel's).
(cd /tmp && ALLOCTRACE_TEST_BACKEND=history timeout 300 python3 -m pytest -q -rs -p no:cacheprovider "$here/../tests" 2>&1 | tee "$out/pytest_history.log")
(cd /tmp && ALLOCTRACE_TEST_BACKEND=recorder timeout 300 python3 -m pytest -q -rs -p no:cacheprovider -k record "$here/../tests" 2>&1 | tee "$out/pytest_recorder.log")
