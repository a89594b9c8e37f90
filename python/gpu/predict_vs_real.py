"""Predicted against real: for third-party models at several batch sizes, alloctrace.predict's
peak allocated and reserved (default settings, replayed by the alloctrace binary) beside the
real run's torch.cuda.max_memory_allocated() / max_memory_reserved(), on a GPU host.

    python3 python/gpu/predict_vs_real.py OUT_DIR        # prints a TSV table, writes OUT_DIR/*.tsv

Models: torchvision resnet18 with SGD (momentum 0.9), Hugging Face GPT-2 small (config only,
no download; sequence 512) with AdamW; fp32, 3 steps each. A real run is a fresh process.
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

MODELS = {"resnet18_sgd": (32, 64, 128), "gpt2_adamw": (4, 8, 16)}
STEPS = 3


def make_step(model):
    import torch

    if model == "resnet18_sgd":
        import torchvision

        net = torchvision.models.resnet18().cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()

        return step
    from transformers import GPT2Config, GPT2LMHeadModel

    net = GPT2LMHeadModel(GPT2Config()).cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def step(ids):
        net(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def make_inputs(model, batch):
    import torch

    if model == "resnet18_sgd":
        return (torch.randn(batch, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (batch,), device="cuda"))
    return (torch.randint(0, 50257, (batch, 512), device="cuda"),)


def real(model, batch, fraction_bytes=None):
    import torch

    if fraction_bytes:
        torch.cuda.set_per_process_memory_fraction(fraction_bytes / torch.cuda.get_device_properties(0).total_memory)
    torch.manual_seed(0)
    try:
        step = make_step(model)
        inputs = make_inputs(model, batch)
        for _ in range(STEPS):
            step(*inputs)
        torch.cuda.synchronize()
        ok = True
    except torch.OutOfMemoryError:
        ok = False
    print(json.dumps({"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
                      "completed": ok}))


def predicted(model, batch, out_dir):
    import alloctrace

    path = os.path.join(out_dir, "%s_b%d.pickle" % (model, batch))
    t = time.time()
    alloctrace.predict(lambda: make_step(model), lambda: make_inputs(model, batch), steps=STEPS, out=path,
                       explain=False)
    secs = time.time() - t
    w = json.loads(alloctrace.run("whatif", path, "--json"))
    rec = [r for r in w["rows"] if r["policy"] == "recorded"][0]
    exp = [r for r in w["rows"] if r["policy"] == "expandable_segments:True"][0]
    return rec["peak_allocated_bytes"], rec["peak_reserved_bytes"], exp["peak_reserved_bytes"], secs


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = ["model\tbatch\tpred_alloc\treal_alloc\terr_alloc\tpred_reserved\treal_reserved\terr_reserved\tfake_s"]
    print(rows[0], flush=True)
    for model, batches in MODELS.items():
        for b in batches:
            pa, pr, _, secs = predicted(model, b, out_dir)
            p = subprocess.run([sys.executable, __file__, "--real", model, str(b)], capture_output=True, text=True)
            got = json.loads(p.stdout.strip().splitlines()[-1])
            line = "%s\t%d\t%d\t%d\t%+.2f%%\t%d\t%d\t%+.2f%%\t%.1f" % (
                model, b, pa, got["allocated"], 100.0 * (pa - got["allocated"]) / got["allocated"], pr,
                got["reserved"], 100.0 * (pr - got["reserved"]) / got["reserved"], secs)
            rows.append(line)
            print(line, flush=True)
    with open(os.path.join(out_dir, "predict_vs_real.tsv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    # The largest batch at a limit, predicted, then run for real at that batch and one above.
    import alloctrace

    cap = 6 << 30
    got = alloctrace.largest_batch(lambda: make_step("resnet18_sgd"), lambda b: make_inputs("resnet18_sgd", b),
                                   capacity=cap, lo=16, hi=512, steps=2, log=print)
    best = got["recorded"]
    print("predicted largest resnet18 batch at 6GiB (defaults): %s; all: %s" %
          (best, {k: v for k, v in got.items() if k != "probes"}), flush=True)
    if best:
        for b in (best, best + 1, int(best * 1.1)):
            p = subprocess.run([sys.executable, __file__, "--real", "resnet18_sgd", str(b), str(cap)],
                               capture_output=True, text=True)
            print("real resnet18 batch %d at 6GiB: %s" % (b, p.stdout.strip().splitlines()[-1:]), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--real":
        real(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
    else:
        main(sys.argv[1])
