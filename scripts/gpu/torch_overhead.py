"""Where the default back-end's time goes, side by side in one process on one GPU.

Each mode runs three loops, nanoseconds per iteration, in several rounds (the modes' rounds
alternate, so every mode sees the same moments of the machine); the tables give the median and
the best round:
  py    x = torch.empty(4096, dtype=torch.uint8, device="cuda") in Python (docs/recording.md's loop)
  cpp   the same at::empty from C++ (no interpreter in the way)
  pair  raw_alloc + raw_delete of 4 KiB from C++ (the caching allocator alone)

Modes, in the order they can be reached (a trace tracker cannot be detached):
  native                 PyTorch as shipped
  history                PyTorch's history on, max_entries=1, context=None, no tracker: the floor
                         PyTorch's own recording costs
  tracker                alloctrace's helper attached, forwarding to a C function that only counts
  tracker+history        the same with history on
  ours+history           the helper forwarding to the recorder library (what `alloctrace record`
                         runs), history on
  ours                   the same with history off (only if trackers fire without history)

Run from the repository root: python3 torch_overhead.py LIB OUT.atrace
(LIB: the recorder library built with --features cuda; the shim's folder recorder/python must
be importable, or pass ALLOCTRACE_SHIM).
"""
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
uint64_t counted() { return seen; }

double empty_loop(int64_t n) {
  auto opt = at::TensorOptions().dtype(at::kByte).device(at::kCUDA);
  at::Tensor x = at::empty({4096}, opt);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; i++) x = at::empty({4096}, opt);
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}

double pair_loop(int64_t size, int64_t n) {
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
"""

t = time.time()
bench = load_inline("alloctrace_overhead_bench", cpp_sources=[BENCH], functions=["count_ptr", "counted", "empty_loop", "pair_loop"],
                    with_cuda=True, extra_cflags=["-O2"], verbose=False)
print(f"bench extension built in {time.time() - t:.1f} s")
torch.empty(1, device="cuda")
t = time.time()
helper = alloctrace_hook._build_helper(torch)
print(f"helper built in {time.time() - t:.1f} s")
lib = ctypes.CDLL(lib_path)
lib.alloctrace_shutdown.restype = ctypes.c_int
lib.alloctrace_dropped.restype = ctypes.c_ulonglong


def history(on):
    if on:
        torch.cuda.memory._record_memory_history(max_entries=1, context=None, stacks="python")
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def py_loop(n):
    x = torch.empty(4096, dtype=torch.uint8, device="cuda")
    t0 = time.perf_counter()
    for _ in range(n):
        x = torch.empty(4096, dtype=torch.uint8, device="cuda")
    del x
    return (time.perf_counter() - t0) / n * 1e9


PY_N, CPP_N, PAIR_N, REPS = 50_000, 200_000, 200_000, 2
results = {}


def measure(mode):
    r = results.setdefault(mode, {"py": [], "cpp": [], "pair": []})
    r["py"].append(min(py_loop(PY_N) for _ in range(REPS)))
    r["cpp"].append(min(bench.empty_loop(CPP_N) for _ in range(REPS)))
    r["pair"].append(min(bench.pair_loop(4096, PAIR_N) for _ in range(REPS)))


def stage(modes, rounds):
    for _ in range(rounds):
        for name, setup in modes:
            setup()
            measure(name)
    history(False)


ROUNDS = int(os.environ.get("ROUNDS", "7"))
stage([("native", lambda: history(False)), ("history", lambda: history(True))], ROUNDS)

torch.cuda.empty_cache()
print(f"reserved before the shim's probe: {alloctrace_hook._reserved(torch)} bytes; the shim's probe says trackers "
      f"need history: {alloctrace_hook._trackers_need_history(torch, helper)}; reserved after: "
      f"{alloctrace_hook._reserved(torch)}")
helper.attach(bench.count_ptr())
before = bench.counted()
history(False)
py_loop(1000)
fires_without_history = bench.counted() - before
history(True)
before = bench.counted()
py_loop(1000)
fires_with_history = bench.counted() - before
history(False)
print(f"tracker entries per 1000 iterations: history off {fires_without_history}, history on {fires_with_history}")

ours = ctypes.cast(lib.alloctrace_torch_event, ctypes.c_void_p).value
count = bench.count_ptr()


def mode(fn, hist):
    def setup():
        helper.attach(fn)
        history(hist)
    return setup


modes = [("tracker", mode(count, False)), ("tracker+history", mode(count, True)), ("ours+history", mode(ours, True))]
if fires_without_history:
    modes.append(("ours", mode(ours, False)))
stage(modes, ROUNDS)
helper.attach(0)
rc = lib.alloctrace_shutdown()
print(f"recorder shutdown: {rc} (0 = nothing lost), dropped {lib.alloctrace_dropped()}")

print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; {ROUNDS} rounds, each the best of {REPS}; "
      "ns per iteration (x native)")
for label, stat in (("median of the rounds", statistics.median), ("best round", min)):
    base = {k: stat(v) for k, v in results["native"].items()}
    print(f"\n{label}:\n| mode | py torch.empty | C++ at::empty | C++ raw_alloc+raw_delete |")
    print("|---|---|---|---|")
    for name, r in results.items():
        cells = [f"{stat(r[k]):.0f} ({stat(r[k]) / base[k]:.3f}x)" for k in ("py", "cpp", "pair")]
        print(f"| {name} | " + " | ".join(cells) + " |")
print("\nall rounds (py / cpp / pair):")
for name, r in results.items():
    print(f"  {name}: " + " / ".join(" ".join(f"{v:.0f}" for v in r[k]) for k in ("py", "cpp", "pair")))
