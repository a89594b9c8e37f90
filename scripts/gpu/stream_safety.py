"""record_stream safety: a tensor is read on a side stream (behind a long sleep), x.record_stream(s),
del x, then a tensor of the same size is written on the main stream. If the allocator hands the
block out before the side stream's read finished, the sum is wrong. 20 trials; prints the count."""
import torch

N = 16 << 20  # floats: 64 MiB
s = torch.cuda.Stream()
wrong = 0
for trial in range(20):
    x = torch.ones(N, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # the side stream reads x late
        total = x.sum()
    x.record_stream(s)
    del x
    y = torch.empty(N, device="cuda")
    y.fill_(2.0)  # the main stream writes at once: into x's block if it was reused too early
    s.synchronize()
    if total.item() != float(N):
        wrong += 1
    del y, total
print(f"record_stream: {wrong} of 20 wrong (backend {torch.cuda.memory.get_allocator_backend()})")
