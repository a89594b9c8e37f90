#!/usr/bin/env bash
# Two DDP ranks (gloo, both on one GPU, unequal batches: scripts/gpu/ranks_ddp.py) recorded with
# --stacks by the wheel installed in a fresh virtualenv; the cross-rank view and explain name the
# call sites. PY: a python with torch (here its own virtualenv).
set -u
PY=${PY:-python3}
$PY -m venv --system-site-packages /tmp/v
$PY -c "import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))" > "$(/tmp/v/bin/python -c 'import site;print(site.getsitepackages()[0])')/system-torch.pth"
/tmp/v/bin/pip install -q --no-deps --no-index --disable-pip-version-check ${W:-carry/gpuw}/alloctrace-0.1.0-py3-none-linux_x86_64.whl
mkdir -p $OUT/snaps
/tmp/v/bin/alloctrace record --stacks -o "$OUT/ddp.{pid}.atrace" -- /tmp/v/bin/python scripts/gpu/ranks_ddp.py $OUT/snaps 2>&1 | tail -5
ls $OUT
/tmp/v/bin/alloctrace ranks $OUT/ddp.*.atrace 2>&1 | tail -14
for t in $OUT/ddp.*.atrace; do /tmp/v/bin/alloctrace explain --verbose $t | grep -A6 "^call sites"; done
rm -rf $OUT/snaps
