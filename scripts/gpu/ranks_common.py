"""Shared by ranks_ddp.py and ranks_models.py: start PyTorch's memory history with Python frames,
and dump a snapshot kept small (frames of multiprocessing/runpy dropped, at most 16 kept per stack)."""
import pickle

import torch

MAX_FRAMES = 16
OUTER = ("multiprocessing/", "runpy.py", "threading.py", "torch/distributed/run.py", "torch/distributed/elastic/")


def start_history():
    # Before the first CUDA allocation, so that parameters are in the trace.
    torch.cuda.memory._record_memory_history(max_entries=200000, context="all", stacks="python")


def _trim(frames):
    kept = [f for f in frames if not any(o in f.get("filename", "") for o in OUTER)]
    return kept[:MAX_FRAMES]


def dump(path):
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    for dev in snap.get("device_traces", []):
        for e in dev:
            if "frames" in e:
                e["frames"] = _trim(e["frames"])
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            if "frames" in b:
                b["frames"] = _trim(b["frames"])
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    n = sum(len(d) for d in snap.get("device_traces", []))
    print(f"wrote {path}: {n} trace entries", flush=True)
