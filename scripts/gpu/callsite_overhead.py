"""The cost of call sites on the torch.empty loop, side by side in one process on one GPU.

ns per iteration of `x = torch.empty(4096, dtype=torch.uint8, device="cuda")` from Python, in
rounds that alternate between modes (the tables give the median and the best round):
  native          PyTorch as shipped
  history         PyTorch's history with Python stacks, as memory_viz users turn it on
                  (context="alloc", stacks="python", max_entries=100000)
then the shim's set-up for `alloctrace record --stacks` (helper attached, stacks resolved by a
background thread, the recorder writing the trace), and, alternating with it:
  stacks          what `alloctrace record --stacks` runs
  tracker-off     the helper forwarding nothing and history off (an attached tracker that
                  cannot be detached: native plus one indirect call)
and the trace's call sites at the end.

Run from the repository root: python3 callsite_overhead.py LIB OUT.atrace [SHIM_DIR]
"""
import os
import statistics
import sys
import time

lib_path, trace = sys.argv[1], sys.argv[2]
os.environ["ALLOCTRACE_LIB"] = lib_path
os.environ["ALLOCTRACE_OUTPUT"] = trace
os.environ["ALLOCTRACE_STACKS"] = "1"
sys.path.insert(0, sys.argv[3] if len(sys.argv) > 3 else "recorder/python")

import torch  # noqa: E402

import alloctrace_hook as hook  # noqa: E402

N, ROUNDS = 100_000, int(os.environ.get("ROUNDS", "5"))


def loop(n=N):
    x = torch.empty(4096, dtype=torch.uint8, device="cuda")
    t0 = time.perf_counter()
    for _ in range(n):
        x = torch.empty(4096, dtype=torch.uint8, device="cuda")
    del x
    return (time.perf_counter() - t0) / n * 1e9


def history(on):
    if on:
        torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=100000)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


results = {}


def rounds(modes):
    for _ in range(ROUNDS):
        for name, setup in modes:
            setup()
            loop(2000)
            results.setdefault(name, []).append(loop())


torch.empty(1, device="cuda")
rounds([("native", lambda: history(False)), ("history", lambda: history(True))])
history(False)

t = time.time()
hook._start_pytorch(torch)  # as the shim does at CUDA start, with --stacks
print(f"shim set up in {time.time() - t:.1f} s (helper build or load included); installed: {hook._installed}")
helper = hook._sites.helper
lib = hook._library()
import ctypes  # noqa: E402

event = ctypes.cast(lib.alloctrace_torch_event, ctypes.c_void_p).value


def ours():
    helper.attach(event)
    torch.cuda.memory._record_memory_history(max_entries=1, context="alloc", stacks="python")


def off():
    helper.attach(0)
    history(False)


rounds([("stacks", ours), ("tracker-off", off)])
ours()
print(f"{'mode':<12} {'median ns':>10} {'best ns':>9} {'x native':>9}")
base = statistics.median(results["native"])
for name, v in results.items():
    m = statistics.median(v)
    print(f"{name:<12} {m:>10.0f} {min(v):>9.0f} {m / base:>9.2f}")
print(f"shutdown: {hook.shutdown()}")
