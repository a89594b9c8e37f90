#!/usr/bin/env python3
"""The first setting explain names on each third-party OOM snapshot, against what real PyTorch did.

For each `tests/fixtures/doctor/JOB.LIMIT.pickle` (a snapshot taken at the failure, LIMIT in
bytes), runs `alloctrace explain --json --capacity LIMIT` and looks up the fix's setting in
`tests/fixtures/doctor/truth.tsv` (each setting run for real at that limit). Prints one line per
snapshot (the setting, PyTorch's outcome, the fix's strength, and which settings completed in
PyTorch), then the counts: where some setting completed, how often the first pick was one of
them; where none did, how often a setting was still named. Last, every setting named worth
trying: whether it was predicted to fit, against what PyTorch did.

With `--no-capacity`, explain runs as on a snapshot a user brings without saying the limit: it
infers the range of limits the trace allows, and each line also says whether the real limit lies
in it.

    cargo build --release -p alloctrace
    python3 scripts/study/doctor_top_pick/top_pick.py [--no-capacity] [target/release/alloctrace]
"""
import csv
import glob
import json
import os
import subprocess
import sys

root = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
args = [a for a in sys.argv[1:] if a != "--no-capacity"]
inferred = "--no-capacity" in sys.argv[1:]
binary = args[0] if args else os.path.join(root, "target/release/alloctrace")
doctor = os.path.join(root, "tests/fixtures/doctor")
truth = {}
for r in csv.DictReader(open(os.path.join(doctor, "truth.tsv")), delimiter="\t"):
    truth.setdefault((r["job"], r["limit_bytes"]), {})[r["setting"]] = r["outcome"]

some = right = none_ = named = 0
# Every setting named worth trying: predicted to fit (or not, or unknown) against PyTorch.
predicted = {}
for f in sorted(glob.glob(os.path.join(doctor, "*.pickle"))):
    name = os.path.basename(f)
    job, limit = name.split(".")[:2]
    given = [] if inferred else ["--capacity", limit]
    out = subprocess.run([binary, "explain", "--json", f] + given, capture_output=True, text=True)
    x = json.loads(out.stdout)
    inside = ""
    if inferred:
        low = x["capacity_bytes"] or 0
        high = max([v["to_bytes"] or 0 for v in x.get("verdict_by_limit") or []] + [low + 1])
        inside = "in range " if x["capacity_source"] == "inferred_limit" and low <= int(limit) < high else "outside "
    fix = x.get("fix") or {}
    setting = (fix.get("setting") or "").replace("PYTORCH_CUDA_ALLOC_CONF=", "") or None
    real = truth.get((job, limit), {})
    for w in x["worth_trying"]:
        if w["policy"] in real:
            key = (str(w["predicted_to_fit"]), real[w["policy"]])
            predicted[key] = predicted.get(key, 0) + 1
    completed = sorted(s for s, o in real.items() if o == "ok")
    outcome = real.get(setting, "-") if setting else "-"
    print(f"{name:40} {inside}{str(setting):32} {outcome:4} {str(fix.get('strength')):13} completed: {', '.join(completed) or 'none'}")
    if completed:
        some += 1
        right += setting in completed
    else:
        none_ += 1
        named += setting is not None
print(f"snapshots where a setting completed in PyTorch: {some}; the first pick was one of them: {right}")
print(f"snapshots where none completed: {none_}; a setting was still named (worth trying): {named}")
print("settings named worth trying, (predicted to fit, PyTorch's outcome): count")
for (fit, outcome), n in sorted(predicted.items()):
    print(f"  ({fit}, {outcome}): {n}")
