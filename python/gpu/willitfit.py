"""Will it fit, measured: alloctrace.predict against real runs for four third-party models, on
a GPU host (one GPU), each real run a fresh process:

    PYTHONPATH=python ALLOCTRACE_BIN=target/release/alloctrace \\
        python3 python/gpu/willitfit.py OUT_DIR [--deadline-s 330] [--budget-gib 72]

WILLITFIT_PREDICT, WILLITFIT_REAL and WILLITFIT_LARGEST (comma-separated model names, default
all) choose the models that get predictions (with MemTracker's estimate), real runs, and a
predicted largest batch; WILLITFIT_SEARCH=MODEL:PRED:CAPACITY:UPPER_BOUND:WHAT,... runs the
real largest-batch search from a prediction already made; WILLITFIT_CAPACITY=MODEL:BYTES,...
fixes a model's capacity for the largest batch (default 1.5x its middle batch's predicted peak
reserved). WILLITFIT_PROBE=0 predicts without measuring kernel scratch on the GPU.

Models (3 training steps each; real and predicted runs build the same step):
- gpt2_adamw: Hugging Face GPT-2 small (config only), sequence 512, AdamW, fp32;
- resnet18_sgd: torchvision resnet18, 224x224, SGD with momentum 0.9, fp32;
- vit_b16_bf16: timm vit_base_patch16_224 (no weights), AdamW, bf16 autocast (AMP);
- unet_adamw: a diffusion-style UNet defined here (GroupNorm/SiLU residual blocks with a time
  embedding, self-attention at the lowest resolution, skip connections), 64x64, noise-prediction
  MSE loss, AdamW, fp32.

Writes to OUT_DIR:
- peaks.tsv: per model and batch, the predicted peaks (default settings; replayed later by the
  analyzer from the pickles), the real run's max_memory_allocated()/max_memory_reserved()
  (no limit) and MemTracker's peak estimate (torch.distributed._tools.mem_tracker under
  FakeTensorMode) of the same step;
- outcomes.tsv: per model, batch, limit (0.9x, 1.0x, 1.1x the real peak reserved) and setting
  (default and four PYTORCH_CUDA_ALLOC_CONF settings), whether the real run completed, each a
  fresh process under torch.cuda.set_per_process_memory_fraction;
- largest.tsv: per model, a capacity (1.5x the predicted peak reserved of the middle batch, up
  to a 256 MiB step), the predicted largest batch (alloctrace.largest_batch) and the real
  largest (a search from the predicted one, each probe a fresh process at that capacity);
- pickles.tar.gz: the predicted snapshots, one per model and batch.
"""

import json
import os
import subprocess
import sys
import tarfile
import threading
import time

STEPS = 3
MODELS = {
    "vit_b16_bf16": (16, 32, 64),
    "unet_adamw": (16, 32, 64),
    "gpt2_adamw": (4, 8, 16),
    "resnet18_sgd": (32, 64, 128),
}
SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4",
            "garbage_collection_threshold:0.6")
FRACTIONS = (0.9, 1.0, 1.1)
GIB = 1 << 30
PROBE = None if os.environ.get("WILLITFIT_PROBE", "1") != "0" else False


# -- the models --------------------------------------------------------------------------------

def _unet():
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, cin, cout, tdim):
            super().__init__()
            self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.t = nn.Linear(tdim, cout)
            self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, t):
            h = self.c1(F.silu(self.n1(x)))
            h = h + self.t(F.silu(t))[:, :, None, None]
            h = self.c2(F.silu(self.n2(h)))
            return h + self.skip(x)

    class Attention(nn.Module):
        def __init__(self, c, heads=4):
            super().__init__()
            self.heads, self.n = heads, nn.GroupNorm(32, c)
            self.qkv, self.o = nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

        def forward(self, x):
            b, c, h, w = x.shape
            q, k, v = self.qkv(self.n(x)).reshape(b, 3, self.heads, c // self.heads, h * w).permute(
                1, 0, 2, 4, 3).unbind(0)
            o = F.scaled_dot_product_attention(q, k, v)
            return x + self.o(o.permute(0, 1, 3, 2).reshape(b, c, h, w))

    class UNet(nn.Module):
        def __init__(self, ch=(64, 128, 256), tdim=256):
            super().__init__()
            self.tdim = tdim
            self.temb = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
            self.inp = nn.Conv2d(3, ch[0], 3, padding=1)
            self.down, self.pool = nn.ModuleList(), nn.ModuleList()
            c = ch[0]
            for i, co in enumerate(ch):
                self.down.append(nn.ModuleList([Block(c, co, tdim), Block(co, co, tdim)]))
                c = co
                self.pool.append(nn.Conv2d(c, c, 3, stride=2, padding=1) if i < len(ch) - 1 else nn.Identity())
            self.mid1, self.attn, self.mid2 = Block(c, c, tdim), Attention(c), Block(c, c, tdim)
            self.up, self.ups = nn.ModuleList(), nn.ModuleList()
            for i, co in reversed(list(enumerate(ch))):
                self.up.append(nn.ModuleList([Block(c + co, co, tdim), Block(co, co, tdim)]))
                c = co
                self.ups.append(nn.Conv2d(c, c, 3, padding=1) if i > 0 else nn.Identity())
            self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

        def embed(self, t):
            half = self.tdim // 2
            freqs = torch.exp(-torch.arange(half, device=t.device, dtype=torch.float32) * (9.21 / half))
            a = t[:, None] * 1000.0 * freqs[None]
            return self.temb(torch.cat([a.sin(), a.cos()], dim=1))

        def forward(self, x, t):
            t = self.embed(t)
            h, skips = self.inp(x), []
            for (b1, b2), pool in zip(self.down, self.pool):
                h = b2(b1(h, t), t)
                skips.append(h)
                h = pool(h)
            h = self.mid2(self.attn(self.mid1(h, t)), t)
            for (b1, b2), ups in zip(self.up, self.ups):
                h = b2(b1(torch.cat([h, skips.pop()], dim=1), t), t)
                if not isinstance(ups, nn.Identity):
                    h = ups(F.interpolate(h, scale_factor=2.0, mode="nearest"))
            return self.out(h)

    return UNet()


def make_step(model):
    import torch
    import torch.nn.functional as F

    if model == "resnet18_sgd":
        import torchvision

        net = torchvision.models.resnet18().cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            F.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
    elif model == "gpt2_adamw":
        from transformers import GPT2Config, GPT2LMHeadModel

        net = GPT2LMHeadModel(GPT2Config()).cuda()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

        def step(ids):
            net(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    elif model == "vit_b16_bf16":
        import timm
        import timm.models.vision_transformer as vt
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        # timm's ViT reads its drop-path rates with .item() from a CPU tensor while it is built:
        # that value is computed outside fake tensors (a no-op in a real run).
        rates = getattr(vt.calculate_drop_path_rates, "__wrapped__", vt.calculate_drop_path_rates)

        def drop_path_rates(*a, **k):
            with unset_fake_temporarily():
                return rates(*a, **k)

        drop_path_rates.__wrapped__ = rates
        vt.calculate_drop_path_rates = drop_path_rates
        net = timm.create_model("vit_base_patch16_224", pretrained=False).cuda()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

        def step(x, y):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    elif model == "unet_adamw":
        net = _unet().cuda()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

        def step(x, t, noise):
            F.mse_loss(net(x + noise, t), noise).backward()
            opt.step()
            opt.zero_grad()
    else:
        raise ValueError(model)
    step.net, step.opt = net, opt
    return step


def make_inputs(model, batch):
    import torch

    if model in ("resnet18_sgd", "vit_b16_bf16"):
        return (torch.randn(batch, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (batch,), device="cuda"))
    if model == "unet_adamw":
        return (torch.randn(batch, 3, 64, 64, device="cuda"), torch.rand(batch, device="cuda"),
                torch.randn(batch, 3, 64, 64, device="cuda"))
    return (torch.randint(0, 50257, (batch, 512), device="cuda"),)


# -- one real run (a fresh process) --------------------------------------------------------------

def real(model, batch, limit):
    """PYTORCH_CUDA_ALLOC_CONF comes from the environment; `limit` bytes (0: none) is set as
    the memory fraction before the first allocation."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    if limit:
        # PyTorch's limit is static_cast<size_t>(fraction * total): half a byte up keeps it exact.
        torch.cuda.set_per_process_memory_fraction((limit + 0.5) / total)
    torch.manual_seed(0)
    err = ""
    try:
        step = make_step(model)
        inputs = make_inputs(model, batch)
        for _ in range(STEPS):
            step(*inputs)
        torch.cuda.synchronize()
        ok = True
    except torch.OutOfMemoryError as e:
        ok, err = False, "oom: " + str(e).splitlines()[0][:200]
    except RuntimeError as e:  # cuDNN finding no engine under pressure, say
        ok, err = False, "error: " + str(e).splitlines()[0][:200]
    print(json.dumps({"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
                      "completed": ok, "total": total, "err": err}))


# -- predictions and MemTracker (one process per model; fake tensors) --------------------------

def predict_model(model, out_dir):
    import math

    import alloctrace
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    for b in MODELS[model]:
        path = os.path.join(out_dir, "%s_b%d.pickle" % (model, b))
        t = time.time()
        alloctrace.predict(lambda: make_step(model), lambda: make_inputs(model, b), steps=STEPS, out=path,
                           explain=False, probe=PROBE)
        secs = time.time() - t
        w = json.loads(alloctrace.run("whatif", path, "--json"))
        row = [r for r in w["rows"] if r["policy"] == "recorded"][0]
        mt_peak, mt_err = None, ""
        try:
            from torch.distributed._tools.mem_tracker import MemTracker

            with FakeTensorMode(allow_non_fake_inputs=True):
                step = make_step(model)
                inputs = make_inputs(model, b)
                mt = MemTracker()
                mt.track_external(step.net, step.opt)
                with mt:
                    for i in range(STEPS):
                        step(*inputs)
                        if i < STEPS - 1:
                            mt.reset_mod_stats()  # MemTracker's rule for iterations; its peak stays
                snap = mt.get_tracker_snapshot("peak")
                mt_peak = max(v.get("Total", 0) for d, v in snap.items() if torch.device(d).type == "cuda")
        except Exception as e:  # noqa: BLE001 -- reported in the table
            mt_err = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:120] if str(e) else "")
        print(json.dumps({"kind": "pred", "model": model, "batch": b, "pred_alloc": row["peak_allocated_bytes"],
                          "pred_reserved": row["peak_reserved_bytes"], "fake_s": round(secs, 1),
                          "memtracker": mt_peak, "memtracker_err": mt_err}), flush=True)
        if b == MODELS[model][1]:
            step_b = 256 << 20
            cap = int(math.ceil(1.5 * row["peak_reserved_bytes"] / step_b)) * step_b
    fixed = dict(x.split(":") for x in os.environ.get("WILLITFIT_CAPACITY", "").split(",") if x)
    if model in fixed:
        cap = int(fixed[model])
    if model not in os.environ.get("WILLITFIT_LARGEST", ",".join(MODELS)).split(","):
        return
    t = time.time()
    os.makedirs(os.path.join(out_dir, "probes"), exist_ok=True)
    got = alloctrace.largest_batch(lambda: make_step(model), lambda bb: make_inputs(model, bb), capacity=cap, lo=1,
                                   hi=4 * MODELS[model][-1], steps=STEPS, workdir=os.path.join(out_dir, "probes"),
                                   probe=PROBE)
    print(json.dumps({"kind": "largest_pred", "model": model, "capacity": cap, "pred": got.get("recorded"),
                      "expandable": got.get("expandable_segments:True"), "upper_bound": got["upper_bound"],
                      "not_modelled": got["not_modelled"], "secs": round(time.time() - t, 1),
                      "past_cudnn_fallback": got["past_cudnn_fallback"].get("recorded"),
                      "probes": sorted(got["probes"])}), flush=True)


# -- the driver ----------------------------------------------------------------------------------

class Pool:
    """Runs real-run processes while their memory (limit, or an estimate, plus a context
    allowance) fits the budget and at most `slots` run at once."""

    def __init__(self, budget, slots, deadline):
        self.budget, self.slots, self.deadline = budget, slots, deadline
        self.used, self.running = 0, 0
        self.cv = threading.Condition()

    def run(self, model, batch, limit, conf, est):
        need = est + GIB
        with self.cv:
            while self.running >= self.slots or (self.used + need > self.budget and self.running):
                self.cv.wait(1.0)
            if time.time() > self.deadline:
                return None
            self.used += need
            self.running += 1
        try:
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
            left = max(5, self.deadline + 40 - time.time())
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--real", model, str(batch), str(limit)],
                               capture_output=True, text=True, env=env, timeout=left)
            lines = [ln for ln in p.stdout.strip().splitlines() if ln.startswith("{")]
            if not lines:
                sys.stderr.write("real %s %d %d %r failed:\n%s\n" % (model, batch, limit, conf, p.stderr[-2000:]))
                return None
            return json.loads(lines[-1])
        except subprocess.TimeoutExpired:
            return None
        finally:
            with self.cv:
                self.used -= need
                self.running -= 1
                self.cv.notify_all()


def main(out_dir, deadline_s, budget_gib):
    start = time.time()
    work = os.environ.get("WILLITFIT_WORK") or os.path.join(out_dir, "work")
    os.makedirs(work, exist_ok=True)
    pool = Pool(budget_gib * GIB, 14, start + deadline_s)
    lock = threading.Lock()
    logs = {name: open(os.path.join(out_dir, name), "w") for name in ("peaks.tsv", "outcomes.tsv", "largest.tsv")}
    logs["peaks.tsv"].write("model\tbatch\tpred_alloc\treal_alloc\tpred_reserved\treal_reserved\tmemtracker\tfake_s\n")
    logs["outcomes.tsv"].write("model\tbatch\treal_reserved\tfraction\tlimit\tsetting\treal\treal_peak_reserved\terr\n")
    logs["largest.tsv"].write("model\tcapacity\tpred_largest\tupper_bound\treal_largest\treal_probes\tnot_modelled\t"
                              "pred_past_cudnn_fallback\n")

    def log(name, line):
        with lock:
            logs[name].write(line + "\n")
            logs[name].flush()
            print(name, line, flush=True)

    preds, largest = {}, {}

    def predictions(model):
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--predict", model, work],
                             stdout=subprocess.PIPE, text=True)
        for ln in p.stdout:
            if not ln.startswith("{"):
                continue
            r = json.loads(ln)
            if r["kind"] == "pred":
                preds[(model, r["batch"])] = r
            else:
                largest[model] = r
        p.wait()

    # A rough size for scheduling the runs without a limit (their processes are not limited).
    guess = {"gpt2_adamw": 1.05, "resnet18_sgd": 1.3, "vit_b16_bf16": 1.3, "unet_adamw": 1.4}

    real_models = os.environ.get("WILLITFIT_REAL", ",".join(MODELS)).split(",")

    def model_thread(model):
        pt = threading.Thread(target=predictions, args=(model,))
        if model in os.environ.get("WILLITFIT_PREDICT", ",".join(MODELS)).split(","):
            pt.start()
        else:
            pt = threading.Thread(target=lambda: None)
            pt.start()
        jobs = []
        if model not in real_models:  # predictions and MemTracker only
            pt.join()
            for b in MODELS[model]:
                pr = preds.get((model, b))
                if pr:
                    log("peaks.tsv", "%s\t%d\t%s\t-\t%s\t-\t%s\t%s" % (
                        model, b, pr["pred_alloc"], pr["pred_reserved"], pr["memtracker"] or pr["memtracker_err"],
                        pr["fake_s"]))
        for b in MODELS[model] if model in real_models else ():
            while (model, b) not in preds and pt.is_alive():
                time.sleep(0.5)
            pr = preds.get((model, b))
            est = int(guess[model] * pr["pred_reserved"]) if pr else 16 * GIB
            r = pool.run(model, b, 0, "", est)
            if not r:
                continue
            log("peaks.tsv", "%s\t%d\t%s\t%d\t%s\t%d\t%s\t%s" % (
                model, b, pr and pr["pred_alloc"], r["allocated"], pr and pr["pred_reserved"], r["reserved"],
                (pr and pr["memtracker"]) or (pr and pr["memtracker_err"]), pr and pr["fake_s"]))

            def limited(b=b, real_reserved=r["reserved"]):
                for f in FRACTIONS:
                    limit = int(f * real_reserved)
                    ts = []
                    for conf in SETTINGS:
                        def one(conf=conf, limit=limit, f=f):
                            o = pool.run(model, b, limit, conf, limit)
                            if o:
                                log("outcomes.tsv", "%s\t%d\t%d\t%.1f\t%d\t%s\t%s\t%d\t%s" % (
                                    model, b, real_reserved, f, limit, conf or "default",
                                    "completes" if o["completed"] else "oom", o["reserved"], o["err"]))
                        t = threading.Thread(target=one)
                        t.start()
                        ts.append(t)
                    for t in ts:
                        t.join()

            t = threading.Thread(target=limited)
            t.start()
            jobs.append(t)
        pt.join()
        lp = largest.get(model)
        search_only = [x.split(":") for x in os.environ.get("WILLITFIT_SEARCH", "").split(",") if x]
        for m, pred, cap, bound, what in search_only:  # the real search from a known prediction
            if m == model:
                lp = {"pred": int(pred), "capacity": int(cap), "upper_bound": bound == "True",
                      "not_modelled": [what]}
        if lp and lp["pred"]:
            cap, probes = lp["capacity"], {}

            def fits(b):
                if b not in probes:
                    o = pool.run(model, b, cap, "", cap)
                    probes[b] = None if o is None else o["completed"]
                return probes[b]

            b0, hi = lp["pred"], 4 * MODELS[model][-1]
            if fits(b0):
                good, step = b0, 1
                while good + step <= hi and fits(good + step):
                    good += step
                    step *= 2
                bad = min(good + step, hi + 1)
            else:
                bad, step = b0, 1
                while bad - step >= 1 and fits(bad - step) is False:
                    bad -= step
                    step *= 2
                good = max(bad - step, 0)
            while bad - good > 1 and time.time() < pool.deadline:
                mid = (good + bad) // 2
                if fits(mid):
                    good = mid
                else:
                    bad = mid
            done = bad - good <= 1 and None not in probes.values()
            log("largest.tsv", "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s" % (
                model, cap, lp["pred"], lp["upper_bound"], good if done else "unfinished",
                ",".join("%d:%s" % (k, {True: "ok", False: "oom", None: "-"}[v]) for k, v in sorted(probes.items())),
                "; ".join(lp["not_modelled"]) or "-", lp.get("past_cudnn_fallback", "-")))
        for t in jobs:
            t.join()

    threads = [threading.Thread(target=model_thread, args=(m,)) for m in MODELS]
    for t in threads:
        t.start()
        time.sleep(2)
    for t in threads:
        t.join()
    with tarfile.open(os.path.join(out_dir, "pickles.tar.gz"), "w:gz") as tar:
        for m, bs in MODELS.items():
            for b in bs:
                p = os.path.join(work, "%s_b%d.pickle" % (m, b))
                if os.path.exists(p):
                    tar.add(p, arcname=os.path.basename(p))
    print("done in %.0f s" % (time.time() - start), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--real":
        real(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "--predict":
        predict_model(sys.argv[2], sys.argv[3])
    else:
        args = sys.argv[2:]
        deadline = float(args[args.index("--deadline-s") + 1]) if "--deadline-s" in args else 330.0
        budget = float(args[args.index("--budget-gib") + 1]) if "--budget-gib" in args else 72.0
        main(sys.argv[1], deadline, budget)
