#!/usr/bin/env bash
# The built wheel on a clean machine: install into a fresh virtualenv (PyTorch from the system),
# then record a job with no other step; then the speed ratios with the wheel's release binary.
set -u
W=${W:-carry/gpuw}   # the wheel (python/build-wheel.sh) and wheel_train.py
PY=$(for p in python3 python /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python; do command -v $p >/dev/null && $p -c "import torch" 2>/dev/null && command -v $p && break; done)
echo "python with torch: $PY ($($PY -c 'import torch,sys;print(torch.__version__, torch.__file__)'))"
$PY -m venv --system-site-packages /tmp/v
# PyTorch from where the machine has it (a user or other site folder the venv does not see)
$PY -c "import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))" > "$(/tmp/v/bin/python -c 'import site;print(site.getsitepackages()[0])')/system-torch.pth"
s=$(date +%s.%N); /tmp/v/bin/pip install -q --no-deps --no-index --disable-pip-version-check $W/alloctrace-0.1.0-py3-none-linux_x86_64.whl; e=$(date +%s.%N)
echo "pip install of the wheel: $(awk -v a=$s -v b=$e 'BEGIN{printf "%.2f", b-a}') s"
/tmp/v/bin/alloctrace --version
echo "native:"; /tmp/v/bin/python scripts/gpu/wheel_train.py
for args in "" "--stacks"; do
  s=$(date +%s.%N)
  /tmp/v/bin/alloctrace record $args -o $OUT/run$args.atrace -- /tmp/v/bin/python scripts/gpu/wheel_train.py; echo "exit $?"
  e=$(date +%s.%N); echo "record $args: $(awk -v a=$s -v b=$e 'BEGIN{printf "%.1f", b-a}') s wall (first use builds the helper)"
done
/tmp/v/bin/alloctrace summary $OUT/run.atrace | head -12
/tmp/v/bin/alloctrace explain --verbose $OUT/run--stacks.atrace > $OUT/explain_stacks.txt; head -70 $OUT/explain_stacks.txt

echo "== bench ratios, 16 cores"
RUNS=5 ALLOCTRACE_BIN=/tmp/v/bin/alloctrace bash scripts/bench.sh ratios 10000000 2>&1
echo "== bench ratios, 2 threads"
RAYON_NUM_THREADS=2 RUNS=3 ALLOCTRACE_BIN=/tmp/v/bin/alloctrace bash scripts/bench.sh ratios 0 2>&1
