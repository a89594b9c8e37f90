#!/usr/bin/env bash
# Call sites through the default back-end (--stacks), the final check in one device call: the
# helper built against the installed torch; the torch.empty loop side by side
# (callsite_overhead.py: native / PyTorch's history with Python stacks / record --stacks); a
# Trainer's step time natively, under PyTorch's history with Python stacks and recorded with
# --stacks (same losses), and recorded with forked DataLoader workers; the recorded Trainer's
# call sites in `explain --verbose` with the named allocations per phase; and a Trainer
# recorded with --stacks killed with kill -9 mid-run.
# Carry: carry/callsites/{alloctrace,librecorder.so,python/,scripts/} (release builds; the
# library with --features cuda).
set -u
exec > >(tee $OUT/callsites_final.log) 2>&1
C=carry/callsites
S=$C/scripts
P=/tmp/cs
mkdir -p $P
export PYTHONUNBUFFERED=1 ALLOCTRACE_LIB=$PWD/$C/librecorder.so TORCH_EXTENSIONS_DIR=/tmp/torch_ext
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
AT="$C/alloctrace"
stamp() { echo "[$(date +%T)] $*"; }
phases() {
  $AT dump $1 2>/dev/null | awk '$3=="mark"{ph=$0; sub(/.*text=/,"",ph)} $3=="alloc"{ if ($0 ~ /callsite=0$/) z[ph]++; else n[ph]++ } $3=="callsite"{d++} END{print d, "call sites"; for (p in n) print "  named", n[p], "in phase", p; for (p in z) print "  none ", z[p], "in phase", p}'
}
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"

stamp "== the helper, built against this torch"
t=$(date +%s%N)
if ! timeout 240 python3 -c "
import sys; sys.path.insert(0, '$C/python')
import torch, alloctrace_hook as h
torch.empty(1, device='cuda')
try:
    h._build_helper(torch)
except Exception as e:
    print('\n'.join(str(e).splitlines()[-60:])); sys.exit(1)
"; then echo "helper build FAILED"; exit 1; fi
echo "helper built in $(( ($(date +%s%N) - t) / 1000000 )) ms"

stamp "== torch.empty loop, ns per iteration, one process"
timeout 150 python3 $S/callsite_overhead.py $PWD/$C/librecorder.so $P/empty.atrace $C/python
phases $P/empty.atrace

stamp "== Trainer step time: native / PyTorch history with Python stacks / record --stacks"
timeout 120 python3 $S/trainer_steps.py 2>&1 | grep -E "^(step_ms|\{'loss)" | sed "s/^/native:   /"
timeout 120 python3 $S/trainer_steps.py --history 2>&1 | grep -E "^(step_ms|\{'loss)" | sed "s/^/history:  /"
timeout 120 $AT record --stacks -o $P/trainer.atrace -- python3 $S/trainer_steps.py 2>&1 | grep -E "^(step_ms|\{'loss|alloctrace)" | sed "s/^/stacks:   /"
stamp "== record --stacks with 2 forked DataLoader workers"
timeout 120 $AT record --stacks -o $P/workers.atrace -- python3 $S/trainer_steps.py --workers 2 2>&1 | grep -E "^(step_ms|\{'loss|alloctrace)" | sed "s/^/workers:  /"

stamp "== explain --verbose on the Trainer recorded with --stacks"
timeout 60 $AT explain --verbose $P/trainer.atrace 2>&1 | head -32
phases $P/trainer.atrace

stamp "== kill -9 mid-run: Trainer recorded with --stacks"
rm -f $P/pid
timeout 120 $AT record --stacks -o $P/killed.atrace -- python3 $S/trainer_steps.py --steps 500 --pidfile $P/pid > $P/killed.out 2>&1 &
for i in $(seq 1 60); do [ -s $P/pid ] && break; sleep 1; done
sleep 3; stamp "kill -9 $(cat $P/pid)"; kill -9 $(cat $P/pid); wait $!
grep alloctrace $P/killed.out
timeout 60 $AT explain --verbose $P/killed.atrace 2>&1 | grep -E -A7 "^(partial input|call sites holding)"
phases $P/killed.atrace
cp $P/trainer.atrace $P/killed.atrace $OUT/ 2>/dev/null
stamp done
