"""DDP with torchrun: a small MLP, 8 steps; every rank prints its loss each step. NCCL when each
rank has a GPU of its own, else gloo (two ranks sharing one GPU). At the end each rank prints
PyTorch's own peaks for its device."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
own_gpu = torch.cuda.device_count() >= world
dev = torch.device("cuda", local if own_gpu else 0)
torch.cuda.set_device(dev)
dist.init_process_group("nccl" if own_gpu else "gloo")
torch.manual_seed(0)
m = DDP(torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev),
        device_ids=[dev.index] if own_gpu else None)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
g = torch.Generator(device=dev).manual_seed(rank)
for step in range(8):
    x = torch.randn(256, 1024, device=dev, generator=g)
    loss = (m(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
print(f"peaks rank {rank} device {dev.index} max_memory_reserved {torch.cuda.max_memory_reserved(dev)} "
      f"max_memory_allocated {torch.cuda.max_memory_allocated(dev)}", flush=True)
dist.destroy_process_group()
