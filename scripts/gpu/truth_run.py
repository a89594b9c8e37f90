"""Runs every truth workload under every allocator setting and limit, each in a fresh process.

Usage (on the GPU machine, from the directory holding truth_workloads.py or with its path):
    python3 truth_run.py OUTDIR [--jobs N]

1. Each workload's default run with no limit, recording a snapshot (`oom_catch` records its
   snapshot under its own limit, 0.7 x the peak allocated of its unlimited run, so that the
   snapshot holds the out-of-memory errors it catches).
2. Limits from that recorded run: 0.90, 1.00 and 1.10 x its peak allocated, `mid` halfway
   between its peak allocated and peak reserved (and `rec`, the recording limit, for
   `oom_catch`). Each limit is rounded down to a multiple of 2 MiB plus 1 MiB, so that no sum of
   segment sizes (all multiples of 2 MiB) lands on it exactly.
3. Every (workload, setting, limit or none) in a fresh process; runs of the default setting
   under a limit also record a snapshot (kept when they end in an out-of-memory error).

With --workloads A,B only those workloads run (default: the first six of truth_workloads.py).
With --gpu-gib G (default 64) runs start only while the GPU memory they may take (their limit,
or 1.3 x the recorded run's peak reserved when unlimited) sums to at most G GiB, so that no
unlimited run meets the device's own limit.

With --levels-from TRUTH.tsv, step 1 is skipped: the limits are those of an earlier truth.tsv,
and every run of step 3 records a snapshot (--snapshot-all does the same without it;
--no-snapshots records none); they go to
OUTDIR/snapshots_all.tar.gz, to compare each row's own request sequence with the default run's.

Writes OUTDIR/truth.tsv (one row per run, the columns of the shipped truth.tsv), runs.jsonl (all
counters of every run), snapshots.tar.gz (the snapshots) and prints a summary.
"""
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WL = os.path.join(HERE, "truth_workloads.py")
sys.path.insert(0, HERE)
WORKLOADS = ["amp_adamw", "varlen_train", "two_streams", "empty_cache_loop", "val_no_grad", "oom_catch"]
if "--workloads" in sys.argv:
    WORKLOADS = sys.argv[sys.argv.index("--workloads") + 1].split(",")
POLICIES = {
    "default": "",
    "expandable": "expandable_segments:True",
    "maxsplit64": "max_split_size_mb:64",
    "pow2div4": "roundup_power2_divisions:4",
    "gc06": "garbage_collection_threshold:0.6",
}
MIB = 1 << 20
GIB = 1 << 30

out = sys.argv[1]
jobs = 12
if "--jobs" in sys.argv:
    jobs = int(sys.argv[sys.argv.index("--jobs") + 1])
work = os.path.join(out, "work")
t_start = time.time()
os.makedirs(work, exist_ok=True)


def align(x):
    return int(x) // (2 * MIB) * (2 * MIB) + MIB


gpu_budget = float(sys.argv[sys.argv.index("--gpu-gib") + 1]) if "--gpu-gib" in sys.argv else 64.0
gpu_lock = __import__("threading").Condition()
gpu_used = [0.0]
footprint_of = {}  # workload -> GiB an unlimited run may take


def run(workload, policy, level, limit, snapshot):
    need = (limit / GIB if limit is not None else footprint_of.get(workload, 0.0)) + 0.6
    with gpu_lock:
        while gpu_used[0] > 0 and gpu_used[0] + need > gpu_budget:
            gpu_lock.wait()
        gpu_used[0] += need
    try:
        return run_admitted(workload, policy, level, limit, snapshot)
    finally:
        with gpu_lock:
            gpu_used[0] -= need
            gpu_lock.notify_all()


def run_admitted(workload, policy, level, limit, snapshot):
    if time.time() - t_start > deadline:
        print(f"SKIPPED (out of time) {workload} {policy} {level}", flush=True)
        return {"workload": workload, "policy": policy, "level": level, "limit_bytes": limit, "skipped": True}
    stem = os.path.join(work, f"{workload}.{policy}.{level}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if POLICIES[policy]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = POLICIES[policy]
    cmd = [sys.executable, WL, workload, stem]
    if limit is not None:
        cmd.append(f"--limit-bytes={limit}")
    if snapshot:
        cmd.append("--snapshot")
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    res = {"workload": workload, "policy": policy, "level": level, "limit_bytes": limit, "rc": p.returncode,
           "wall": round(time.time() - t0, 1)}
    if p.returncode != 0 or not os.path.exists(stem + ".json"):
        res["stderr"] = p.stderr[-3000:]
        print(f"FAILED {workload} {policy} {level}: rc={p.returncode}\n{p.stderr[-1500:]}", flush=True)
        return res
    with open(stem + ".json") as f:
        res.update(json.load(f))
    res["snapshot"] = stem + ".pickle" if snapshot else None
    return res


deadline = 460
levels_from = sys.argv[sys.argv.index("--levels-from") + 1] if "--levels-from" in sys.argv else None
snapshot_all = ("--snapshot-all" in sys.argv or levels_from is not None) and "--no-snapshots" not in sys.argv
if "--deadline" in sys.argv:
    deadline = float(sys.argv[sys.argv.index("--deadline") + 1])


def peaks(r):
    s = r["stats"]
    return s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"]


plan = []
levels_of = {}
rec, oc_unlimited = {}, {}
if levels_from:
    with open(levels_from) as f:
        next(f)
        for line in f:
            w, policy, level, lim = line.split("\t")[:4]
            limit = None if lim == "None" else round(float(lim) * GIB)
            levels_of.setdefault(w, {})[level] = limit
    for w, lv in levels_of.items():
        footprint_of[w] = 1.3 * max(x for x in lv.values() if x is not None) / GIB
        for policy in POLICIES:
            for level, limit in lv.items():
                plan.append((w, policy, level, limit, snapshot_all))
else:
    with cf.ThreadPoolExecutor(jobs) as ex:
        rec = dict(zip(WORKLOADS, ex.map(lambda w: run(w, "default", "snap", None, True), WORKLOADS)))
    for w, r in rec.items():
        print(f"snapshot run {w}: {r.get('outcome')} peaks {peaks(r) if 'stats' in r else None} wall {r.get('wall')}s", flush=True)
    # oom_catch: its own snapshot under a limit where its first batch does not fit.
    if "oom_catch" in rec:
        oc_unlimited = rec["oom_catch"]
        oc_limit = align(0.7 * peaks(oc_unlimited)[0]) if "stats" in oc_unlimited else 2 * GIB + MIB
        rec["oom_catch"] = run("oom_catch", "default", "snaprec", oc_limit, True)
        print(f"oom_catch at its own limit {oc_limit}: {rec['oom_catch'].get('outcome')} extra {rec['oom_catch'].get('extra')}", flush=True)
    for w in WORKLOADS:
        if "stats" not in rec[w]:
            continue
        pa, pr = peaks(rec[w])
        footprint_of[w] = 1.3 * pr / GIB
        lv = {"unlimited": None, "0.90": align(0.90 * pa), "1.00": align(pa), "1.10": align(1.10 * pa),
              "mid": align((pa + pr) / 2)}
        if w == "oom_catch":
            lv["rec"] = oc_limit
        levels_of[w] = lv
        for policy in POLICIES:
            for level, limit in lv.items():
                plan.append((w, policy, level, limit, snapshot_all or (policy == "default" and limit is not None)))
print(f"{len(plan)} runs, {jobs} at a time", flush=True)
with cf.ThreadPoolExecutor(jobs) as ex:
    results = list(ex.map(lambda a: run(*a), plan))

with open(os.path.join(out, "runs.jsonl"), "w") as f:
    for r in list(rec.values()) + ([oc_unlimited] if oc_unlimited else []) + results:
        f.write(json.dumps(r) + "\n")

cols = ["workload", "policy", "level", "limit_gib", "outcome", "peak_reserved", "peak_allocated",
        "num_alloc_retries", "num_ooms"]
with open(os.path.join(out, "truth.tsv"), "w") as f:
    f.write("\t".join(cols) + "\n")
    for r in results:
        if "stats" not in r:
            continue
        s = r["stats"]
        lim = "None" if r["limit_bytes"] is None else f"{r['limit_bytes'] / GIB:.10f}"
        f.write("\t".join(str(x) for x in [r["workload"], r["policy"], r["level"], lim, r["outcome"],
                                            s["reserved_bytes.all.peak"], s["allocated_bytes.all.peak"],
                                            s["num_alloc_retries"], s["num_ooms"]]) + "\n")

# Snapshots: each workload's recorded run, and default runs under a limit that ran out of memory.
with tarfile.open(os.path.join(out, "snapshots.tar.gz"), "w:gz") as tar:
    for w, r in rec.items():
        if r.get("snapshot") and os.path.exists(r["snapshot"]):
            tar.add(r["snapshot"], arcname=f"{w}.default.pickle")
            tar.add(r["snapshot"][:-len(".pickle")] + ".json", arcname=f"{w}.default.json")
    if oc_unlimited and oc_unlimited.get("snapshot") and os.path.exists(oc_unlimited["snapshot"]):
        tar.add(oc_unlimited["snapshot"], arcname="oom_catch.default.unlimited.pickle")
    for r in results:
        if r["policy"] == "default" and r.get("snapshot") and r.get("outcome") == "oom" and os.path.exists(r["snapshot"]):
            tar.add(r["snapshot"], arcname=f"{r['workload']}.default.{r['level']}.pickle")
            tar.add(r["snapshot"][:-len(".pickle")] + ".json", arcname=f"{r['workload']}.default.{r['level']}.json")

for r in results:
    if "stats" in r:
        s = r["stats"]
        print(f"{r['workload']:17} {r['policy']:10} {r['level']:9} {r['outcome']:3} res={s['reserved_bytes.all.peak']:>11} "
              f"alloc={s['allocated_bytes.all.peak']:>11} retries={s['num_alloc_retries']} ooms={s['num_ooms']} "
              f"extra={r.get('extra')} {r['wall']}s")
if snapshot_all:
    # One archive per workload (each must stay small enough to fetch).
    for w in WORKLOADS:
        with tarfile.open(os.path.join(out, f"snapshots_all.{w}.tar.xz"), "w:xz") as tar:
            for r in results:
                if r["workload"] == w and r.get("snapshot") and os.path.exists(r["snapshot"]):
                    tar.add(r["snapshot"], arcname=os.path.basename(r["snapshot"]))
for w, r in rec.items():
    if r.get("snapshot") and os.path.exists(r["snapshot"]):
        print(f"snapshot {w}: {os.path.getsize(r['snapshot'])} bytes")
print(f"done in {time.time() - t_start:.0f}s; failures: {sum(1 for r in results if 'stats' not in r)}")
