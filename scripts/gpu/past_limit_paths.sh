#!/usr/bin/env bash
# The other paths of `alloctrace record` past the limit, on the H100: a job that sets its own
# fraction after its first allocation (the header rewritten after the run), PyTorch's history
# instead of the helper (no compiler) with --capacity, and --after-limit 0. Run from the
# repository root with the release builds and scripts in carry/doctor/ as doctor_truth.sh
# says; log under $OUT.
set -u
exec > >(tee $OUT/past_limit_paths.log) 2>&1
C=carry/doctor
S=$C/scripts
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB=$PWD/$C/librecorder.so TORCH_EXTENSIONS_DIR=/tmp/torch_ext
AT="timeout 200 $C/alloctrace"
P=/tmp/paths; mkdir -p $P
L=2509242368   # tv_resnet_varbatch at 1.00 x its peak allocated: the default run fails there
echo "== 1. the job's own fraction, set after its first allocation"
$AT record -o $P/late.atrace -- python3 $S/late_fraction.py $L; echo "exit $?"
$AT summary --json $P/late.atrace | grep -E '"capacity_bytes"|"capacity_source"|"peak_reserved_bytes"'
echo "== 2. PyTorch's history (no compiler), --capacity"
CXX=/bin/false CC=/bin/false TORCH_EXTENSIONS_DIR=/tmp/torch_ext_none $AT record -o $P/hist.atrace --capacity $L -- python3 $S/doctor_jobs.py tv_resnet_varbatch $P/hist; echo "exit $?"
$AT summary --json $P/hist.atrace | grep -E '"capacity_bytes"|"capacity_source"|"peak_reserved_bytes"|"events"'
echo "== 3. --after-limit 0, and end"
$AT record -o $P/zero.atrace --capacity $L --after-limit 0 -- python3 $S/doctor_jobs.py tv_resnet_varbatch $P/zero; echo "exit $?"
$AT record -o $P/end.atrace --capacity $L --after-limit end -- python3 $S/doctor_jobs.py tv_resnet_varbatch $P/end; echo "exit $?"
for t in zero end; do
  echo "$t: $($AT summary --json $P/$t.atrace | grep -E '"events"|"peak_reserved_bytes"' | tr -d '\n ')"
  $AT dump $P/$t.atrace | grep -c "after optimizer step"
done
