#!/usr/bin/env python3
"""What `explain` predicts the whole job needs, on snapshots taken at the failure, against the
limits at which real PyTorch ran out of memory and completed under the same setting.

For every OOM snapshot of the default settings (`tests/fixtures/truth/WORKLOAD.default.LEVEL.pickle`
and `tests/fixtures/doctor/JOB.LIMIT.pickle`), runs `alloctrace explain --json --capacity LIMIT`
and, for each setting of its whole-job prediction that the truth table ran at several limits,
takes the largest limit where PyTorch ran out of memory and the smallest where it completed: a
need inside that interval agrees; outside it, the distance to the nearest end is the error.
Prints one line per (snapshot, setting) and the counts.

    cargo build --release -p alloctrace
    python3 scripts/study/whole_job_need/need.py [target/release/alloctrace]
"""
import csv
import glob
import json
import os
import subprocess
import sys

root = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "target/release/alloctrace")
truth_names = {"expandable": "expandable_segments:True", "maxsplit64": "max_split_size_mb:64",
               "pow2div4": "roundup_power2_divisions:4", "gc06": "garbage_collection_threshold:0.6",
               "default": "recorded"}
# (job, setting) -> [(limit bytes, ok)]
runs = {}
levels = {}
for r in csv.DictReader(open(os.path.join(root, "tests/fixtures/truth/truth.tsv")), delimiter="\t"):
    if r["limit_gib"] == "None":
        continue
    limit = int(float(r["limit_gib"]) * 2**30)
    levels[(r["workload"], r["level"])] = limit
    runs.setdefault((r["workload"], truth_names.get(r["policy"], r["policy"])), []).append((limit, r["outcome"] == "ok"))
for r in csv.DictReader(open(os.path.join(root, "tests/fixtures/doctor/truth.tsv")), delimiter="\t"):
    if r["limit_bytes"] == "none":
        continue
    setting = "recorded" if r["setting"] == "default" else r["setting"]
    runs.setdefault((r["job"], setting), []).append((int(r["limit_bytes"]), r["outcome"] == "ok"))

cases = []
for f in sorted(glob.glob(os.path.join(root, "tests/fixtures/truth/*.default.*.pickle"))):
    job, _, level = os.path.basename(f)[: -len(".pickle")].split(".", 2)
    if (job, level) in levels:
        cases.append((f, job, levels[(job, level)]))
for f in sorted(glob.glob(os.path.join(root, "tests/fixtures/doctor/*.pickle"))):
    job, limit = os.path.basename(f).split(".")[:2]
    cases.append((f, job, int(limit)))

inside = outside = 0
errors = []
for f, job, limit in cases:
    out = subprocess.run([binary, "explain", "--json", f, "--capacity", str(limit)], capture_output=True, text=True)
    x = json.loads(out.stdout)
    p = x.get("prediction") or {}
    for q in p.get("policies", []):
        real = runs.get((job, q["policy"]))
        need = q["needs_bytes"]
        if not real or need is None:
            continue
        fail = max([l for l, ok in real if not ok], default=0)
        done = min([l for l, ok in real if ok], default=None)
        if done is None:
            continue
        if fail < need <= done:
            inside += 1
            err = 0.0
        else:
            outside += 1
            err = need / done - 1 if need > done else need / fail - 1
            errors.append(abs(err))
        lower = " (figures hold if later iterations ask no more)" if p.get("varying") else ""
        print(f"{os.path.basename(f):40} {q['policy']:34} need {need/2**30:6.3f} GiB; PyTorch fails at "
              f"{fail/2**30:6.3f}, completes at {done/2**30:6.3f}: {100*err:+6.1f}%{lower}")
print(f"needs inside PyTorch's interval: {inside} of {inside + outside}; outside: worst "
      f"{100*max(errors, default=0):.1f}%, median {100*sorted(errors)[len(errors)//2] if errors else 0:.1f}%")
