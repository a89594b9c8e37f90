"""GPT-2 training (the job behind traces/gpt2_train.default.atrace: the same model, seed, batch
and steps as that recording) under one limit and one set of allocator settings, in a fresh
process; prints one JSON line with PyTorch's outcome and figures.

Usage: PYTORCH_CUDA_ALLOC_CONF=... python3 gpt2_limits.py LIMIT_BYTES|none [LABEL [SNAPSHOT.pickle]]
       (GPT2_CHECKPOINTING=1: with the model's activation checkpointing; GPT2_USE_CACHE=0: without
       its cache of keys and values, which checkpointing turns off)
       python3 gpt2_limits.py nocache-fraction LIMIT_BYTES REQUEST_BYTES
The second form asks whether set_per_process_memory_fraction holds without caching
(PYTORCH_NO_CUDA_MEMORY_CACHING=1): one request of REQUEST_BYTES under a limit of LIMIT_BYTES.
"""
import json, os, random, sys
import torch

dev = torch.device("cuda")
total = torch.cuda.get_device_properties(0).total_memory
conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
no_caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("", "0")

if sys.argv[1] == "nocache-fraction":
    limit, request = int(sys.argv[2]), int(sys.argv[3])
    torch.cuda.set_per_process_memory_fraction(limit / total)
    try:
        t = torch.empty(request, dtype=torch.uint8, device=dev)
        outcome = "ok"
    except torch.OutOfMemoryError:
        outcome = "oom"
    print(json.dumps({"check": "nocache-fraction", "no_caching": no_caching, "limit_bytes": limit,
                      "request_bytes": request, "outcome": outcome, "torch": torch.__version__}))
    sys.exit(0)

limit = None if sys.argv[1] == "none" else int(sys.argv[1])
label = sys.argv[2] if len(sys.argv) > 2 else ""
snapshot = sys.argv[3] if len(sys.argv) > 3 else None
if limit is not None:
    torch.cuda.set_per_process_memory_fraction(limit / total)
if snapshot:
    # PyTorch's own history; SNAPSHOT_CONTEXT=all keeps the call sites, as
    # traces/gpt2_train.default.atrace has them (what tells activations from the rest).
    torch.cuda.memory._record_memory_history(enabled="all", context=os.environ.get("SNAPSHOT_CONTEXT") or None,
                                             stacks="python", max_entries=3_000_000)
torch.manual_seed(0)
random.seed(0)
torch.backends.cudnn.benchmark = False

from train_gpt2 import train

outcome, err = "ok", None
try:
    train(dev, checkpointing=os.environ.get("GPT2_CHECKPOINTING", "") not in ("", "0"),
          use_cache=os.environ.get("GPT2_USE_CACHE", "1") != "0")
except torch.OutOfMemoryError as e:
    outcome, err = "oom", str(e).splitlines()[0]
if snapshot:
    torch.cuda.memory._dump_snapshot(snapshot)
    torch.cuda.memory._record_memory_history(enabled=None)
st = torch.cuda.memory_stats()
print(json.dumps({"label": label, "conf": conf, "no_caching": no_caching, "limit_bytes": limit,
                  "outcome": outcome, "peak_reserved": st.get("reserved_bytes.all.peak"),
                  "peak_allocated": st.get("allocated_bytes.all.peak"),
                  "peak_requested": st.get("requested_bytes.all.peak"),
                  "checkpointing": os.environ.get("GPT2_CHECKPOINTING", "") not in ("", "0"),
                  "use_cache": os.environ.get("GPT2_USE_CACHE", "1") != "0",
                  "num_alloc_retries": st.get("num_alloc_retries"), "num_ooms": st.get("num_ooms"),
                  "error": err, "torch": torch.__version__}))
