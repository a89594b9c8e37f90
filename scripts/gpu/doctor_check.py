"""The whole-job capacity claim on the traces recorded past the limit: each trace's replay with no
limit (`alloctrace replay TRACE --unlimited --json`, its recorded default settings) against the
real unlimited run's peak reserved (truth.tsv), and the same for the traces run to their end.

Usage: python3 scripts/gpu/doctor_check.py [FIXTURES_DIR] [ALLOCTRACE]
(defaults: tests/fixtures/doctor, target/debug/alloctrace). Prints one row per trace.
"""
import csv
import json
import os
import subprocess
import sys

here = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/doctor"
exe = sys.argv[2] if len(sys.argv) > 2 else "target/debug/alloctrace"
rows = list(csv.DictReader(open(os.path.join(here, "truth.tsv")), delimiter="\t"))
real = {r["job"]: int(r["peak_reserved"]) for r in rows if r["limit_bytes"] == "none" and r["setting"] == "default"}
GIB = 1 << 30
print(f"{'trace':42} {'capacity':>9} {'replayed':>9} {'real':>9} {'diff':>7}")
worst = {}
for name in sorted(os.listdir(here)):
    if not name.endswith(".atrace"):
        continue
    job = name.split(".")[0]
    out = subprocess.run([exe, "replay", os.path.join(here, name), "--unlimited", "--json"], capture_output=True,
                         text=True)
    summ = subprocess.run([exe, "summary", "--json", os.path.join(here, name)], capture_output=True, text=True)
    if out.returncode != 0 or summ.returncode != 0:
        print(f"{name:42} replay failed: {out.stderr.strip()[:60]} {summ.stderr.strip()[:60]}")
        continue
    peak = json.loads(out.stdout)["peak_reserved_bytes"]
    cap = json.loads(summ.stdout)["capacity_bytes"]
    diff = (peak - real[job]) / real[job]
    kind = "end" if name.endswith(".end.atrace") else "stopped"
    worst[kind] = max(worst.get(kind, 0), abs(diff))
    print(f"{name:42} {cap / GIB:8.3f}G {peak / GIB:8.3f}G {real[job] / GIB:8.3f}G {diff:+7.2%}")
for kind, w in worst.items():
    print(f"largest difference, {kind} traces: {w:.2%}")
