"""The frag_oom workload (traces/frag_oom.default.atrace) under one memory limit, in this process.

Usage: PYTORCH_CUDA_ALLOC_CONF=... python3 frag_oom_limits.py LABEL LIMIT_BYTES
Prints one JSON line: the label, the settings, the limit, the outcome and PyTorch's peaks.
The workload is the one the shipped trace recorded: 460 tensors of 4 MiB, every other one
freed, then one request of 1 GiB.
"""
import json, os, sys
import torch

label, limit = sys.argv[1], int(sys.argv[2])
dev = torch.device("cuda")
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(limit / total)
outcome, err = "ok", None
try:
    keep, tmp = [], []
    for i in range(460):
        (keep if i % 2 == 0 else tmp).append(torch.empty(4 << 20, dtype=torch.uint8, device=dev))
    del tmp
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
except torch.OutOfMemoryError as e:
    outcome, err = "oom", str(e).split(". ")[0]
st = torch.cuda.memory_stats()
print(json.dumps({"label": label, "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "limit_bytes": limit,
                  "outcome": outcome, "peak_reserved": st["reserved_bytes.all.peak"],
                  "peak_allocated": st["allocated_bytes.all.peak"], "num_ooms": st["num_ooms"],
                  "error": err, "torch": torch.__version__}))
