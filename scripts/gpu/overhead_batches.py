"""The default back-end's cost per call, in one process, in short batches that alternate.

Before the tracker is attached: native batches. After (a trace tracker cannot be detached):
batches alternating between the helper forwarding to a C function that only counts ("tracker",
what PyTorch's tracker machinery costs with nothing behind it) and the helper forwarding to the
recorder library ("ours", what `alloctrace record` runs; history off). Each batch is 2,000
calls of the loop; the statistics are over BATCHES batches per mode (min, 10th percentile,
median), so that a slow minute of a shared host weighs on both modes alike.
  py    x = torch.empty(4096, dtype=torch.uint8, device="cuda") in Python (docs/recording.md's loop)
  pair  raw_alloc + raw_delete of 4 KiB from C++ (the caching allocator alone)

Run: python3 overhead_batches.py LIB OUT.atrace (the shim's folder recorder/python importable,
or ALLOCTRACE_SHIM)."""
import ctypes
import os
import statistics
import sys
import time

lib_path, trace = sys.argv[1], sys.argv[2]
os.environ["ALLOCTRACE_LIB"] = lib_path
os.environ["ALLOCTRACE_OUTPUT"] = trace
sys.path.insert(0, os.environ.get("ALLOCTRACE_SHIM", "recorder/python"))

import torch  # noqa: E402
from torch.utils.cpp_extension import load_inline  # noqa: E402

import alloctrace_hook  # noqa: E402

BENCH = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
#include <cstdint>

static uint64_t seen = 0;  // the tracker runs under the allocator's lock
extern "C" void count_event(int, int, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t) { seen++; }
uint64_t count_ptr() { return reinterpret_cast<uint64_t>(&count_event); }

double pair_loop(int64_t size, int64_t n) {
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; i++) {
    void* q = c10::cuda::CUDACachingAllocator::raw_alloc(size);
    c10::cuda::CUDACachingAllocator::raw_delete(q);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}
"""
bench = load_inline("alloctrace_batches_bench", cpp_sources=[BENCH], functions=["count_ptr", "pair_loop"],
                    with_cuda=True, extra_cflags=["-O2"], verbose=False)
torch.empty(1, device="cuda")
helper = alloctrace_hook._build_helper(torch)
lib = ctypes.CDLL(lib_path)
lib.alloctrace_shutdown.restype = ctypes.c_int
lib.alloctrace_dropped.restype = ctypes.c_ulonglong
N = 2000
BATCHES = int(os.environ.get("BATCHES", "600"))


def py_batch():
    x = torch.empty(4096, dtype=torch.uint8, device="cuda")
    t0 = time.perf_counter_ns()
    for _ in range(N):
        x = torch.empty(4096, dtype=torch.uint8, device="cuda")
    del x
    return (time.perf_counter_ns() - t0) / N


def pair_batch():
    return bench.pair_loop(4096, N)


results = {}


def run(modes):
    for _ in range(BATCHES):
        for name, setup in modes:
            setup()
            r = results.setdefault(name, {"py": [], "pair": []})
            r["py"].append(py_batch())
            r["pair"].append(pair_batch())


for _ in range(20):
    py_batch()
    pair_batch()
run([("native", lambda: None)])
torch.cuda.empty_cache()
print(f"the shim's probe says trackers need history: {alloctrace_hook._trackers_need_history(torch, helper)}")
count, ours = bench.count_ptr(), ctypes.cast(lib.alloctrace_torch_event, ctypes.c_void_p).value
run([("tracker", lambda: helper.attach(count)), ("ours", lambda: helper.attach(ours))])
helper.attach(0)
rc = lib.alloctrace_shutdown()
print(f"recorder shutdown: {rc} (0 = nothing lost), dropped {lib.alloctrace_dropped()}")


def q(v, p):
    s = sorted(v)
    return s[int(p * (len(s) - 1))]


stats = {m: {k: (min(v), q(v, 0.1), statistics.median(v)) for k, v in r.items()} for m, r in results.items()}
print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; {BATCHES} batches of {N} calls per mode; "
      "ns per call: min / p10 / median")
print("| mode | py torch.empty | C++ raw_alloc+raw_delete |")
print("|---|---|---|")
for m, s in stats.items():
    print(f"| {m} | " + " | ".join("{:.0f} / {:.0f} / {:.0f}".format(*s[k]) for k in ("py", "pair")) + " |")
print("\nratios (min / p10 / median):")
for a, b in (("ours", "tracker"), ("tracker", "native"), ("ours", "native")):
    cells = []
    for k in ("py", "pair"):
        cells.append(k + " " + " / ".join(f"{x / y:.3f}x" for x, y in zip(stats[a][k], stats[b][k])))
    print(f"  {a} vs {b}: " + ", ".join(cells))
