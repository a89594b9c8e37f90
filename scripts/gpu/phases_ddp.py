"""DDP under torchrun with deliberately unequal ranks (rank 1's batch is 4x rank 0's), AdamW,
3 iterations, each rank marking its iterations; gloo with both ranks on one GPU when there is
only one. Meant to run under `alloctrace record` (one trace per rank, phases marked by the
shim); writes each rank's own figures to OUTDIR/ddp.rank{R}.json.

    alloctrace record -o OUTDIR/ddp.atrace -- torchrun --nproc_per_node=2 phases_ddp.py OUTDIR
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import alloctrace_hook as at  # present when recorded
except ImportError:
    at = None

BATCH = {0: 64, 1: 256}
outdir = sys.argv[1]
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
own_gpu = torch.cuda.device_count() >= world
dev = torch.device("cuda", local if own_gpu else 0)
torch.cuda.set_device(dev)
dist.init_process_group("nccl" if own_gpu else "gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                            torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
m = DDP(model, device_ids=[dev.index] if own_gpu else None)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
g = torch.Generator(device=dev).manual_seed(rank)
for step in range(3):
    if at:
        at.mark_iteration(f"step {step}")
    x = torch.randn(BATCH[rank] * 16, 1024, device=dev, generator=g)
    opt.zero_grad(set_to_none=True)
    loss = (m(x) - x).pow(2).mean()
    loss.backward()
    opt.step()
    del x, loss
torch.cuda.synchronize()
params = list(model.parameters())
state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.is_cuda]
fig = {
    "rank": rank,
    "batch_rows": BATCH[rank] * 16,
    "parameter_tensors": len(params),
    "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
    "optimizer_state_tensors": len(state),
    "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state),
    "max_allocated_bytes": torch.cuda.max_memory_allocated(),
    "max_reserved_bytes": torch.cuda.max_memory_reserved(),
    "torch_version": torch.__version__,
    "device": torch.cuda.get_device_name(0),
}
with open(os.path.join(outdir, f"ddp.rank{rank}.json"), "w") as f:
    json.dump(fig, f, indent=1)
print(json.dumps(fig), flush=True)
dist.destroy_process_group()
