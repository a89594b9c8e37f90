#!/usr/bin/env bash
# DDP with two ranks on two GPUs (NCCL): natively and under `alloctrace record` (the default
# back-end), every loss of every step compared; one trace per rank, each header's rank, local
# rank, world size and device; each rank's replay against its segment events and PyTorch's own
# peaks; and `alloctrace ranks` over the two traces. Run from the repository root on a 2-GPU
# machine with carry/rec/ (alloctrace, librecorder.so, check_trace); traces under $OUT.
set -u
exec > >(tee $OUT/ddp2.log) 2>&1
C=$PWD/carry/rec
S=$PWD/scripts/gpu
A=$C/alloctrace
# NVLink multicast stays off on these shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext ALLOCTRACE_LIB=$C/librecorder.so
nvidia-smi --query-gpu=index,name --format=csv,noheader
timeout 200 torchrun --nproc_per_node=2 $S/ddp_train.py > $OUT/native.txt 2> $OUT/native.err || tail -5 $OUT/native.err
timeout 250 $A record -o $OUT/ddp.atrace -- torchrun --nproc_per_node=2 $S/ddp_train.py > $OUT/rec.txt 2> $OUT/rec.err
echo "record exit $?"; grep "^alloctrace" $OUT/rec.err
grep "^rank" $OUT/native.txt | sort > $OUT/native_steps.txt
grep "^rank" $OUT/rec.txt | sort > $OUT/rec_steps.txt
head -2 $OUT/native_steps.txt
if cmp -s $OUT/native_steps.txt $OUT/rec_steps.txt; then echo "ddp: every loss of every step EQUAL to native ($(wc -l < $OUT/native_steps.txt) lines)"; else echo "ddp: DIFFERENT"; diff $OUT/native_steps.txt $OUT/rec_steps.txt | head; fi
echo "native:"; grep "^peaks" $OUT/native.txt | sort
echo "recorded:"; grep "^peaks" $OUT/rec.txt | sort
ls $OUT | grep atrace
timeout 100 $C/check_trace $OUT/ddp.rank0.atrace $OUT/ddp.rank1.atrace
for r in 0 1; do echo "-- replay rank $r"; timeout 60 $A replay $OUT/ddp.rank$r.atrace | grep -E "peak (reserved|allocated)|device calls"; done
timeout 60 $A ranks $OUT/ddp.rank0.atrace $OUT/ddp.rank1.atrace 2>&1 | head -20
