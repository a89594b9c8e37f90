#!/usr/bin/env python3
"""Opens alloctrace's memory-viz exports with PyTorch's own tools and compares them with the
original snapshot and alloctrace's figures."""
import json, os, pickle, subprocess, sys, time
import torch
from torch.cuda import _memory_viz as mv

src, out = sys.argv[1], sys.argv[2]
print("torch", torch.__version__)
for f in sorted(os.listdir(src)):
    name = f[: -len(".pickle")]
    path = os.path.join(src, f)
    with open(path, "rb") as fh:
        snap = pickle.load(fh)
    entries = snap["device_traces"][0]
    r = peak = 0
    for e in entries:
        if e["action"] in ("segment_alloc", "segment_map"):
            r += e["size"]; peak = max(peak, r)
        elif e["action"] in ("segment_free", "segment_unmap"):
            r -= e["size"]
    summ = json.loads(subprocess.check_output(["alloctrace", "summary", "--json", "traces/%s.atrace" % name]))
    print(name, "entries", len(entries), "peak reserved from the pickle", peak, "alloctrace summary", summ["peak_reserved_bytes"], "EQUAL" if peak == summ["peak_reserved_bytes"] else "DIFFERENT")
    for fn in ("segsum", "trace", "trace_plot", "segment_plot"):
        t0 = time.time()
        try:
            res = getattr(mv, fn)(snap)
            print("  _memory_viz.%s: ok, %d chars, %.2f s" % (fn, len(res), time.time() - t0))
            if name == "frag_oom.default" and fn in ("segsum", "trace"):
                with open(os.path.join(out, "%s.%s.txt" % (name, fn)), "w") as w:
                    w.write(res)
        except Exception as e:
            print("  _memory_viz.%s: FAILED %r" % (fn, e))
    p = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", path], capture_output=True, text=True)
    print("  python -m torch.cuda._memory_viz stats: exit", p.returncode, p.stderr[-300:])

orig_path = "analyzer/tests/fixtures/torch/frag_oom.default.pickle"
with open(orig_path, "rb") as fh:
    orig = pickle.load(fh)
with open(os.path.join(src, "frag_oom.default.pickle"), "rb") as fh:
    exp = pickle.load(fh)
for fn in ("segsum", "trace"):
    a, b = getattr(mv, fn)(orig).splitlines(), getattr(mv, fn)(exp).splitlines()
    diff = sum(1 for x, y in zip(a, b) if x != y) + abs(len(a) - len(b))
    print("frag_oom original vs export, _memory_viz.%s: %d vs %d lines, %d differ" % (fn, len(a), len(b), diff))
    if diff:
        shown = [(x, y) for x, y in zip(a, b) if x != y][:5]
        for x, y in shown:
            print("   orig:", x[:150]); print("   expo:", y[:150])
with open(os.path.join(out, "frag_oom.default.original.segsum.txt"), "w") as w:
    w.write(mv.segsum(orig))
