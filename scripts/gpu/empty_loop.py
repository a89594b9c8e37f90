"""Python-level cost: torch.empty(4096, uint8) on CUDA, ns per call (best of 5 x 100k)."""
import time
import torch

x = torch.empty(1, device="cuda")
best = float("inf")
for _ in range(5):
    t = time.perf_counter()
    for _ in range(100000):
        x = torch.empty(4096, dtype=torch.uint8, device="cuda")
    best = min(best, (time.perf_counter() - t) / 100000 * 1e9)
print(f"torch_empty_4KiB_ns {best:.1f} backend {torch.cuda.memory.get_allocator_backend()}")
