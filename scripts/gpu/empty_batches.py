"""torch.empty(4096, uint8) on CUDA in short batches, ns per call of each batch, for a paired
comparison of two processes running at the same time (one natively, one under alloctrace
record): each waits until START_AT (Unix seconds), then runs BATCHES batches of 2,000 calls and
prints one line: the label and every batch's ns per call."""
import os
import sys
import time

import torch

label = sys.argv[1] if len(sys.argv) > 1 else "run"
start_at = float(os.environ.get("START_AT", "0"))
batches = int(os.environ.get("BATCHES", "1500"))
x = torch.empty(4096, dtype=torch.uint8, device="cuda")
for _ in range(20000):
    x = torch.empty(4096, dtype=torch.uint8, device="cuda")
late = start_at - time.time()
if late > 0:
    time.sleep(late)
else:
    print(f"{label}: started {-late:.1f} s after START_AT", file=sys.stderr)
out = []
cpu0, wall0 = time.process_time(), time.perf_counter()
for _ in range(batches):
    t = time.perf_counter_ns()
    for _ in range(2000):
        x = torch.empty(4096, dtype=torch.uint8, device="cuda")
    out.append((time.perf_counter_ns() - t) / 2000)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
try:
    history = len(torch.cuda.memory._snapshot()["device_traces"][0]) > 0
except Exception:
    history = None
print(f"{label}: process CPU {cpu / wall:.2f} cores over {wall:.1f} s; PyTorch history kept: {history}",
      file=sys.stderr)
print(label, " ".join(f"{v:.1f}" for v in out))
