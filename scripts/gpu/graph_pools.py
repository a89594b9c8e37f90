"""Private memory pools in one job: a torch.cuda.graph capture, a second graph sharing its pool,
a torch.cuda.MemPool, torch.compile(mode="reduce-overhead"), default-pool work between them,
then the graphs and the MemPool deleted and the cache emptied. Prints the results and PyTorch's
own counters; with SNAPSHOT=PATH.pickle, PyTorch's history is kept and dumped there at the end,
and to PATH.live.pickle before the graphs and the MemPool are deleted."""
import gc
import os

import torch

snapshot = os.environ.get("SNAPSHOT")
if snapshot:
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
torch.manual_seed(0)
dev = "cuda"
res = {}
warm = [torch.randn(1024, 1024, device=dev) for _ in range(4)]
m = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024)).to(dev)
x = torch.randn(256, 1024, device=dev)

with torch.no_grad():
    static_x = torch.randn(256, 1024, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            y = m(static_x)
    torch.cuda.current_stream().wait_stream(side)
    del y
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = m(static_x)
    res["graph"] = []
    for i in range(4):
        static_x.copy_(x * (i + 1))
        g.replay()
        res["graph"].append(round(static_y.sum().item(), 3))
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=g.pool()):
        static_z = m(static_y) * 2
    g2.replay()
    res["graph2"] = round(static_z.sum().item(), 3)

pool = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool):
    p = [torch.ones(n, device=dev) for n in (1 << 16, 3 << 20, 5 << 20)]
res["mempool"] = [round(t.sum().item(), 1) for t in p]
del p
between = [torch.randn(2048, 2048, device=dev) for _ in range(3)]
res["between"] = round(sum(t.sum().item() for t in between), 1)
del between

f = torch.compile(m, mode="reduce-overhead")
with torch.no_grad():
    res["compiled"] = [round(f(x * (i + 1)).sum().item(), 3) for i in range(6)]

if snapshot:
    # While the graphs and the MemPool live: the snapshot names their segments' pools.
    torch.cuda.memory._dump_snapshot(snapshot.replace(".pickle", ".live.pickle"))
del g, g2, static_x, static_y, static_z, pool, f
gc.collect()
torch.cuda.synchronize()
reserved_before = torch.cuda.memory_reserved()
torch.cuda.empty_cache()
after = [torch.randn(1024, 1024, device=dev) for _ in range(8)]
res["after"] = round(sum(t.sum().item() for t in after), 1)
for k, v in res.items():
    print(k, v)
st = torch.cuda.memory_stats()
print(f"torch: max_memory_reserved {torch.cuda.max_memory_reserved()} max_memory_allocated "
      f"{torch.cuda.max_memory_allocated()} reserved_before_empty_cache {reserved_before} reserved_at_end "
      f"{torch.cuda.memory_reserved()} num_device_alloc {st.get('num_device_alloc')} num_device_free "
      f"{st.get('num_device_free')}")
if snapshot:
    torch.cuda.memory._dump_snapshot(snapshot)
