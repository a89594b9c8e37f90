"""PyTorch's native caching allocator, cached alloc+free pair from C++ (raw_alloc/raw_delete),
measured the way PyTorch's published anchors were measured (history off only)."""
import time
import torch
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
double loop(int64_t size, int64_t n) {
  void* p = c10::cuda::CUDACachingAllocator::raw_alloc(size);
  c10::cuda::CUDACachingAllocator::raw_delete(p);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; i++) {
    void* q = c10::cuda::CUDACachingAllocator::raw_alloc(size);
    c10::cuda::CUDACachingAllocator::raw_delete(q);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}
double loop_many(int64_t size, int64_t k, int64_t rounds) {
  std::vector<void*> ps(k);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < rounds; r++) {
    for (int64_t i = 0; i < k; i++) ps[i] = c10::cuda::CUDACachingAllocator::raw_alloc(size + 512 * (i % 7));
    for (int64_t i = 0; i < k; i++) c10::cuda::CUDACachingAllocator::raw_delete(ps[(i * 7919) % k]);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (rounds * k);
}
"""
t = time.time()
m = load_inline("allocbench", cpp_sources=src, functions=["loop", "loop_many"], with_cuda=True,
                extra_cflags=["-O2"], verbose=False)
print(f"compiled in {time.time()-t:.1f}s")
torch.empty(1, device="cuda")
for size in [4096, 1 << 20, 16 << 20]:
    print(f"native pair {size} B: {min(m.loop(size, 200000) for _ in range(3)):.1f} ns")
print(f"native 1000 live 64 KiB, scrambled: {min(m.loop_many(65536, 1000, 200) for _ in range(3)):.1f} ns")
