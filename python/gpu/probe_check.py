"""Kernel scratch measured on the GPU (`alloctrace.predict(probe=...)`), checked on two small
steps against real runs, on a GPU host from the repository's root:

    PYTHONPATH=python ALLOCTRACE_BIN=target/release/alloctrace python3 python/gpu/probe_check.py

For a convolution step and a fused-attention step it prints what was probed, the scratch
requests written into the stream, and the predicted peaks with and without probing beside the
real run's (a fresh process each)."""

import json
import os
import subprocess
import sys

import torch


# The convolution step of the package's own GPU test, at batch 64 here.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
_CONV = {}
exec(__import__("test_predict")._CONV_STEP, _CONV)
conv_step = _CONV["make_step"]


def conv_inputs():
    return _CONV["make_inputs"](64)


def attn_step():
    proj = torch.nn.Linear(768, 3 * 768).cuda()
    opt = torch.optim.AdamW(proj.parameters())

    def step(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            q, k, v = proj(x).view(x.shape[0], x.shape[1], 3, 12, 64).permute(2, 0, 3, 1, 4)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        out.float().sum().backward()
        opt.step()
        opt.zero_grad()

    return step


def attn_inputs():
    return (torch.randn(32, 197, 768, device="cuda"),)


STEPS = {"conv": (conv_step, conv_inputs), "attn": (attn_step, attn_inputs)}


def real(name):
    make, inputs = STEPS[name]
    step, args = make(), inputs()
    for _ in range(3):
        step(*args)
    torch.cuda.synchronize()
    print(json.dumps({"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}))


def main():
    import alloctrace
    import pickle

    for name, (make, inputs) in STEPS.items():
        p = subprocess.run([sys.executable, __file__, "--real", name], capture_output=True, text=True)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        for probe in (False, True):
            out = "/tmp/probe_%s_%s.pickle" % (name, probe)
            got = alloctrace.predict(make, inputs, steps=3, out=out, probe=probe)
            row = [x for x in got["whatif"]["rows"] if x["policy"] == "recorded"][0]
            snap = pickle.load(open(out, "rb"))
            scratch = [(e["size"], e["frames"][0]["name"]) for e in snap["device_traces"][0]
                       if e["action"] == "alloc" and "scratch" in e["frames"][0]["name"]]
            print("%s probe=%s: %s" % (name, probe, snap["alloctrace_predicted"]["what"]))
            print("  scratch requests: %d, first: %s" % (len(scratch), scratch[:4]))
            unmatched = snap["alloctrace_predicted"]["probe_unmatched_outputs"]
            print("  probe outputs no fake output matched: %s" % unmatched[:8])
            print("  peak allocated %d (real %d, %+.2f%%), reserved %d (real %d, %+.2f%%), lower bound %s" % (
                row["peak_allocated_bytes"], r["allocated"], 100 * (row["peak_allocated_bytes"] / r["allocated"] - 1),
                row["peak_reserved_bytes"], r["reserved"], 100 * (row["peak_reserved_bytes"] / r["reserved"] - 1),
                got["whatif"].get("lower_bound")), flush=True)


def record(name, out):
    """The real step's requests, as PyTorch's own snapshot."""
    make, inputs = STEPS[name]
    torch.cuda.memory._record_memory_history(max_entries=1 << 20)
    step, args = make(), inputs()
    for _ in range(3):
        step(*args)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(out)


def record_model(model, batch, out):
    """A willitfit model's real step (3 steps), as PyTorch's own snapshot, gzipped."""
    import gzip
    import pickle

    sys.path.insert(0, "python/gpu")
    import willitfit as W

    torch.cuda.memory._record_memory_history(max_entries=1 << 22, context="alloc", stacks="python")
    step, args = W.make_step(model), W.make_inputs(model, batch)
    for _ in range(W.STEPS):
        step(*args)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    for e in snap["device_traces"][0]:  # the innermost frame names the call well enough
        e["frames"] = e.get("frames", [])[:1]
    with gzip.open(out, "wb") as f:
        pickle.dump({"device_traces": snap["device_traces"], "max_reserved": torch.cuda.max_memory_reserved(),
                     "max_allocated": torch.cuda.max_memory_allocated()}, f)


def gpt2(out):
    """GPT-2 small at batch 4 with probes, each probed operator named before it runs."""
    import importlib

    import alloctrace
    P = importlib.import_module("alloctrace.predict")
    sys.path.insert(0, "python/gpu")
    import willitfit as W

    measure = P._Probe._measure

    def loud(self, func, args, kwargs):
        print("probe", func, str(self.signature(func, args, kwargs)[1:])[:1500], flush=True)
        got = measure(self, func, args, kwargs)
        if got:
            print("  ->", str(got)[:300], flush=True)
        return got

    P._Probe._measure = loud
    alloctrace.predict(lambda: W.make_step("gpt2_adamw"), lambda: W.make_inputs("gpt2_adamw", 4), steps=3, out=out,
                       explain=False, probe=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--real":
        real(sys.argv[2])
    elif len(sys.argv) > 3 and sys.argv[1] == "--record":
        record(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 4 and sys.argv[1] == "--record-model":
        record_model(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) > 2 and sys.argv[1] == "--gpt2":
        gpt2(sys.argv[2])
    else:
        main()
