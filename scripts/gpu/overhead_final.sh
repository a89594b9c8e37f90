#!/usr/bin/env bash
# The default back-end's overhead on whole runs, one process after another on the same cores,
# modes alternating: the Hugging Face Trainer run (trainer_hf.py, 30 steps; its own
# trainer.train() seconds and the process's wall seconds) in 4 rounds, and the torch.empty loop
# (empty_batches.py) in 3 rounds. Run from the repository root with carry/rec/ (alloctrace,
# librecorder.so); log under $OUT.
set -u
exec > >(tee $OUT/final.log) 2>&1
C=$PWD/carry/rec
S=$PWD/scripts/gpu
A=$C/alloctrace
P=/tmp/final
mkdir -p $P
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext ALLOCTRACE_LIB=$C/librecorder.so BATCHES=800
PIN="taskset -c 2-5"
$A record -q -o $P/warm.atrace -- python3 -c "import torch; torch.ones(1, device='cuda')"
for round in 1 2 3 4; do
  /usr/bin/time -f "wall %e" $PIN timeout 200 python3 $S/trainer_hf.py > $P/tn$round.txt 2>&1
  echo "trainer native$round $(grep -h trainer_seconds $P/tn$round.txt) $(grep -h '^wall' $P/tn$round.txt)"
  /usr/bin/time -f "wall %e" $PIN timeout 200 $A record -o $P/t$round.atrace -- python3 $S/trainer_hf.py > $P/tr$round.txt 2>&1
  echo "trainer record$round $(grep -h trainer_seconds $P/tr$round.txt) $(grep -h '^wall' $P/tr$round.txt)"
  grep -h "max_memory\|^alloctrace" $P/tn$round.txt $P/tr$round.txt | sed "s/^/  /"
done
for round in 1 2 3; do
  $PIN timeout 120 python3 $S/empty_batches.py native$round > $P/en$round.txt 2> $P/en$round.err
  $PIN timeout 120 $A record -o $P/e$round.atrace -- python3 $S/empty_batches.py record$round > $P/er$round.txt 2> $P/er$round.err
  cat $P/en$round.err $P/er$round.err | grep -v "^$"
done
cat $P/en*.txt $P/er*.txt > $P/loops.txt
python3 $S/batch_stats.py $P/loops.txt
