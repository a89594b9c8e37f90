"""The OOM doctor's truth from third-party jobs (doctor_jobs.py), each run in a fresh process,
many at once on the one GPU (each under its own memory fraction).

Usage (on the GPU machine):
    python3 doctor_truth.py OUTDIR ALLOCTRACE [--jobs N] [--only JOB,...] [--levels L,...] [--deadline S]

1. Each job unlimited under every setting: the peaks (the default run's peak reserved sets the
   limits).
2. Limits from the default unlimited run: by default 0.90, 0.95, 1.00 and 1.05 x its peak
   reserved (levels r0.90 ... r1.05); --levels may also name aN (N x its peak allocated) and
   mid (halfway between the two). Each is rounded down to a multiple of 2 MiB plus 1 MiB (as
   truth_run.py does: no sum of segment sizes lands on it).
3. At each limit, in fresh processes:
   (a)+(c) every setting run for real under the limit (the job's own memory fraction), outcome
       and peaks; the default run also records PyTorch's history with Python frames and dumps a
       snapshot at the OOM, from the allocator's OOM observer (the failure itself);
   (b) `ALLOCTRACE record --capacity LIMIT` of the unlimited job: the trace recorded past the
       limit, stopped 3 whole iterations after it went past (the default), and once more with
       `--after-limit end` (the whole job);
   and once per job, `ALLOCTRACE record` of the job that sets its own memory fraction (at r0.95):
   the shim lifts it and records it as the capacity.

Writes OUTDIR/truth.tsv (job, limit_bytes, setting, outcome, peak_reserved, peak_allocated; the
unlimited rows have limit_bytes `none`), runs.jsonl (every counter of every run, and each
recording's stderr) and fixtures/ (JOB.LIMIT.pickle, JOB.LIMIT.atrace, JOB.LIMIT.end.atrace).
"""
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS_PY = os.path.join(HERE, "doctor_jobs.py")
sys.path.insert(0, HERE)
from doctor_jobs import JOBS  # noqa: E402

SETTINGS = ["default", "expandable_segments:True", "max_split_size_mb:64", "max_split_size_mb:128",
            "roundup_power2_divisions:4", "garbage_collection_threshold:0.6"]
# A level: `r0.95` is 0.95 x the default run's peak reserved, `a1.00` 1.00 x its peak allocated,
# `mid` halfway between the two.
LEVELS = ["r0.90", "r0.95", "r1.00", "r1.05"]
MIB = 1 << 20

out, alloctrace = sys.argv[1], os.path.abspath(sys.argv[2])
jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 14
only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else JOBS
deadline = float(sys.argv[sys.argv.index("--deadline") + 1]) if "--deadline" in sys.argv else 500
if "--levels" in sys.argv:
    LEVELS = sys.argv[sys.argv.index("--levels") + 1].split(",")
work = os.path.join(out, "work")
fixtures = os.path.join(out, "fixtures")
os.makedirs(work, exist_ok=True)
os.makedirs(fixtures, exist_ok=True)
t_start = time.time()


def align(x):
    return int(x) // (2 * MIB) * (2 * MIB) + MIB


def env_for(setting):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if setting != "default":
        env["PYTORCH_CUDA_ALLOC_CONF"] = setting
    return env


def tag(setting):
    return setting.replace(":", "_")


def real(job, setting, limit, snapshot):
    """One real run; returns its record."""
    if time.time() - t_start > deadline:
        return {"job": job, "setting": setting, "limit_bytes": limit, "skipped": True}
    stem = os.path.join(work, f"{job}.{tag(setting)}.{limit or 'none'}")
    cmd = [sys.executable, JOBS_PY, job, stem]
    if limit is not None:
        cmd.append(f"--limit-bytes={limit}")
    if snapshot:
        cmd.append("--snapshot")
    t0 = time.time()
    p = subprocess.run(cmd, env=env_for(setting), capture_output=True, text=True, timeout=300)
    res = {"kind": "real", "job": job, "setting": setting, "limit_bytes": limit, "rc": p.returncode,
           "wall": round(time.time() - t0, 1)}
    if p.returncode != 0 or not os.path.exists(stem + ".json"):
        res["stderr"] = p.stderr[-3000:]
        print(f"FAILED {job} {setting} {limit}: rc={p.returncode}\n{p.stderr[-2000:]}", flush=True)
        return res
    with open(stem + ".json") as f:
        res.update(json.load(f))
    if snapshot and res["outcome"] == "oom" and os.path.exists(stem + ".pickle"):
        shutil.copy(stem + ".pickle", os.path.join(fixtures, f"{job}.{limit}.pickle"))
        res["snapshot"] = f"{job}.{limit}.pickle"
    return res


def record(job, limit, variant):
    """`alloctrace record` past the limit: `default` (--capacity, stop 3 iterations after),
    `end` (--capacity, --after-limit end), `own` (the job's own fraction, no --capacity)."""
    if time.time() - t_start > deadline:
        return {"job": job, "limit_bytes": limit, "variant": variant, "skipped": True}
    name = {"default": f"{job}.{limit}.atrace", "end": f"{job}.{limit}.end.atrace", "own": f"{job}.{limit}.own.atrace"}
    trace = os.path.join(fixtures if variant != "own" else work, name[variant])
    stem = os.path.join(work, f"{job}.record.{variant}.{limit}")
    cmd = [alloctrace, "record", "-o", trace]
    if variant != "own":
        cmd += ["--capacity", str(limit)]
    if variant == "end":
        cmd += ["--after-limit", "end"]
    cmd += ["--", sys.executable, JOBS_PY, job, stem]
    if variant == "own":
        cmd.append(f"--limit-bytes={limit}")
    t0 = time.time()
    p = subprocess.run(cmd, env=env_for("default"), capture_output=True, text=True, timeout=300)
    res = {"kind": "record", "job": job, "limit_bytes": limit, "variant": variant, "rc": p.returncode,
           "wall": round(time.time() - t0, 1), "trace": name[variant],
           "stderr": [l for l in p.stderr.splitlines() if l.startswith("alloctrace")][-6:]}
    if os.path.exists(stem + ".json"):
        with open(stem + ".json") as f:
            res["job_result"] = json.load(f)
    s = subprocess.run([alloctrace, "summary", "--json", trace], capture_output=True, text=True)
    try:
        summ = json.loads(s.stdout)
        res["summary"] = {k: summ.get(k) for k in ("capacity_bytes", "capacity_source", "peak_reserved_bytes", "events")}
    except ValueError:
        res["summary_error"] = s.stderr[-500:]
    print(f"record {variant:7} {job:18} {limit}: rc={p.returncode} {res['wall']}s {' | '.join(res['stderr'])}",
          flush=True)
    return res


results = []
# 1. Unlimited, every setting; the recorder's helper is built once meanwhile (cached after).
warm = [alloctrace, "record", "-q", "-o", os.path.join(work, "warm.atrace"), "--", sys.executable, "-c",
        "import torch; torch.ones(1, device='cuda')"]
with cf.ThreadPoolExecutor(jobs) as ex:
    w = ex.submit(subprocess.run, warm, capture_output=True, text=True)
    unlimited = list(ex.map(lambda a: real(*a), [(j, s, None, False) for j in only for s in SETTINGS]))
    print(f"helper warm-up: rc={w.result().returncode} {w.result().stderr[-300:]}", flush=True)
results += unlimited
limits = {}
for r in unlimited:
    if r.get("setting") == "default" and "stats" in r:
        pr, pa = r["stats"]["reserved_bytes.all.peak"], r["stats"]["allocated_bytes.all.peak"]
        base = lambda lv: (pa + pr) / 2 if lv == "mid" else float(lv[1:]) * (pr if lv[0] == "r" else pa)  # noqa: E731
        limits[r["job"]] = {lv: align(base(lv)) for lv in LEVELS}
        print(f"unlimited {r['job']}: peak reserved {pr} allocated {r['stats']['allocated_bytes.all.peak']} "
              f"{r['wall']}s limits {limits[r['job']]}", flush=True)

# 2. At each limit: real runs of every setting, recordings past the limit.
plan = []
for j, lv in limits.items():
    for level, limit in lv.items():
        plan += [("real", (j, s, limit, s == "default")) for s in SETTINGS]
        plan += [("record", (j, limit, "default")), ("record", (j, limit, "end"))]
    if "r0.95" in lv:
        plan.append(("record", (j, lv["r0.95"], "own")))
# The slow ones (the Trainer) first.
plan.sort(key=lambda p: p[1][0] != "hf_trainer")
print(f"{len(plan)} runs, {jobs} at a time", flush=True)
with cf.ThreadPoolExecutor(jobs) as ex:
    results += list(ex.map(lambda p: real(*p[1]) if p[0] == "real" else record(*p[1]), plan))

with open(os.path.join(out, "runs.jsonl"), "w") as f:
    for r in results:
        f.write(json.dumps(r) + "\n")
with open(os.path.join(out, "truth.tsv"), "w") as f:
    f.write("job\tlimit_bytes\tsetting\toutcome\tpeak_reserved\tpeak_allocated\n")
    for r in results:
        if r.get("kind") == "real" and "stats" in r:
            s = r["stats"]
            f.write(f"{r['job']}\t{r['limit_bytes'] if r['limit_bytes'] is not None else 'none'}\t{r['setting']}\t"
                    f"{r['outcome']}\t{s['reserved_bytes.all.peak']}\t{s['allocated_bytes.all.peak']}\n")

print("\njob                limit        setting                          outcome  peak_reserved  peak_alloc  wall")
for r in results:
    if r.get("kind") == "real" and "stats" in r:
        s = r["stats"]
        print(f"{r['job']:18} {str(r['limit_bytes']):12} {r['setting']:32} {r['outcome']:4} "
              f"{s['reserved_bytes.all.peak']:>14} {s['allocated_bytes.all.peak']:>11} {r['wall']}s"
              f"{' caught-ooms=' + str(len(r['observed_ooms'])) if r.get('observed_ooms') else ''}")
skipped = sum(1 for r in results if r.get("skipped"))
failed = sum(1 for r in results if r.get("kind") == "real" and "stats" not in r and not r.get("skipped"))
print(f"done in {time.time() - t_start:.0f}s; failed {failed}, skipped {skipped}")
