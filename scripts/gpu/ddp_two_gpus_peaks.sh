#!/usr/bin/env bash
# How much DDP's memory peaks vary from run to run on two GPUs: ddp_train.py natively three
# times and under `alloctrace record` twice, alternating; each rank's PyTorch peaks and losses.
# Run from the repository root on a 2-GPU machine with carry/rec/; log under $OUT.
set -u
exec > >(tee $OUT/ddp2_peaks.log) 2>&1
C=$PWD/carry/rec
S=$PWD/scripts/gpu
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext ALLOCTRACE_LIB=$C/librecorder.so
for run in native1 record1 native2 record2 native3; do
  case $run in
    native*) timeout 200 torchrun --nproc_per_node=2 $S/ddp_train.py > /tmp/$run.txt 2>/dev/null ;;
    record*) timeout 250 $C/alloctrace record -q -o /tmp/$run.atrace -- torchrun --nproc_per_node=2 $S/ddp_train.py > /tmp/$run.txt 2>/dev/null ;;
  esac
  grep "^peaks" /tmp/$run.txt | sort | sed "s/^/$run: /"
  echo "$run: losses $(grep '^rank' /tmp/$run.txt | sort | md5sum | cut -c1-12)"
done
