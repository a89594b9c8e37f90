"""Marks, empty_cache, a small backward pass and the exit code, for `alloctrace record --stacks`."""
import sys
import torch

try:
    import alloctrace_hook as at
except ImportError:
    at = None


def make_blocks():
    return [torch.empty(1 << 20, device="cuda") for _ in range(10)]


if at:
    at.mark("phase: blocks")
x = make_blocks()
del x
torch.cuda.empty_cache()
if at:
    at.mark_iteration("iteration 0")
lin = torch.nn.Linear(1024, 1024).cuda()
y = lin(torch.randn(64, 1024, device="cuda"))
y.sum().backward()
torch.cuda.synchronize()
print("backend", torch.cuda.memory.get_allocator_backend(), "grad", tuple(lin.weight.grad.shape))
sys.exit(3)
