"""Two DDP ranks with deliberately unequal batches (rank 0: 16 rows, rank 1: 64 rows), gloo
backend, both ranks on cuda:0; each rank dumps its own snapshot to OUTDIR/ddp_rank{R}.pickle.

    python3 ranks_ddp.py OUTDIR
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks_common  # noqa: E402

BATCH = {0: 16, 1: 64}
STEPS = 3


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(1024, 4096)
        self.act = nn.GELU()
        self.down = nn.Linear(4096, 1024)
        self.head = nn.Linear(1024, 16)

    def forward(self, x):
        return self.head(self.down(self.act(self.up(x))))


def worker(rank, world, outdir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29533"
    torch.cuda.set_device(0)
    ranks_common.start_history()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Mlp().cuda(), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        with torch.profiler.record_function("iteration"):
            x = torch.randn(BATCH[rank], 256, 1024, device="cuda")
            y = torch.randint(0, 16, (BATCH[rank], 256), device="cuda")
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, 16), y.reshape(-1))
            loss.backward()
            opt.step()
            del x, y, out, loss
    print(f"rank {rank}: batch {BATCH[rank]}, max allocated {torch.cuda.max_memory_allocated()} B, "
          f"max reserved {torch.cuda.max_memory_reserved()} B", flush=True)
    ranks_common.dump(os.path.join(outdir, f"ddp_rank{rank}.pickle"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2, join=True)
