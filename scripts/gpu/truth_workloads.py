"""Small PyTorch workloads whose allocator behaviour is the ground truth for alloctrace's replay.

Usage: python3 truth_workloads.py WORKLOAD OUT_STEM [--limit-bytes=N] [--snapshot]

Reads PYTORCH_CUDA_ALLOC_CONF from the environment (the caller sets it; PyTorch reads it once per
process). With --limit-bytes the process calls torch.cuda.set_per_process_memory_fraction so that
the allocator may reserve at most N bytes. Writes OUT_STEM.json (outcome, memory_stats counters)
and, with --snapshot, OUT_STEM.pickle (torch.cuda.memory._dump_snapshot, protocol 4, no stack
frames).

Every workload is deterministic in its request sequence (fixed seeds, cudnn.benchmark off) except
where a library catches an out-of-memory error and carries on (cuDNN trying a plan with a smaller
workspace; `oom_catch` halving its batch), and except for the order in which `record_stream`
frees complete (`two_streams`), which follows the GPU's progress.
"""
import gc
import json
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

dev = torch.device("cuda")
torch.backends.cudnn.benchmark = False


def amp_adamw():
    """Conv net + MLP head, fp16 autocast with GradScaler, AdamW (its state is created on the
    first step), 6 steps."""
    m = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1, stride=2), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 256, 3, padding=1, stride=2), nn.BatchNorm2d(256), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(256, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1000),
    ).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(6):
        x = torch.randn(64, 3, 128, 128, device=dev)
        y = torch.randint(0, 1000, (64,), device=dev)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()


def varlen_train():
    """A 4-layer transformer encoder trained on batches whose size and sequence length vary per
    step (batch 4..32, sequence 32..256), AdamW, 12 steps."""
    rng = random.Random(1)
    vocab, d = 8000, 512
    emb = nn.Embedding(vocab, d).to(dev)
    layer = nn.TransformerEncoderLayer(d_model=d, nhead=8, dim_feedforward=2048, batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).to(dev)
    head = nn.Linear(d, vocab).to(dev)
    params = list(emb.parameters()) + list(enc.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    for _ in range(12):
        b = rng.choice([4, 8, 16, 32])
        s = rng.randint(32, 256)
        ids = torch.randint(0, vocab, (b, s), device=dev)
        logits = head(enc(emb(ids)))
        loss = F.cross_entropy(logits.view(-1, vocab), ids.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()


def two_streams():
    """A side stream produces tensors (varying sizes) that the busy main stream consumes; each
    is marked with record_stream, so its block waits for the main stream's work before it can be
    reused. The host synchronizes every 5 iterations (loss.item()), 30 iterations."""
    rng = random.Random(2)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    w = torch.randn(4096, 4096, device=dev)
    side.wait_stream(main)
    total = 0.0
    for i in range(30):
        rows = rng.choice([1024, 2048, 3072, 4096])
        with torch.cuda.stream(side):
            x = torch.randn(rows, 4096, device=dev)
            y = torch.tanh(x @ w)
        main.wait_stream(side)
        y.record_stream(main)
        x.record_stream(main)
        h = y
        for _ in range(3):
            h = torch.relu(h @ w)
        loss = h.mean()
        del x, y, h
        if i % 5 == 4:
            total += loss.item()
    torch.cuda.synchronize()


def empty_cache_loop():
    """An MLP trained on batches of varying (not power-of-two) size, with
    gc.collect(); torch.cuda.empty_cache() after every batch, 12 batches."""
    rng = random.Random(3)
    m = nn.Sequential(nn.Linear(3000, 6000), nn.ReLU(), nn.Linear(6000, 6000), nn.ReLU(), nn.Linear(6000, 1000)).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    for _ in range(12):
        b = rng.choice([300, 700, 1100, 1500, 2500])
        x = torch.randn(b, 3000, device=dev)
        y = torch.randint(0, 1000, (b,), device=dev)
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, y, loss
        gc.collect()
        torch.cuda.empty_cache()
    torch.cuda.synchronize()


def val_no_grad():
    """3 training steps of an MLP, then a validation loop of 8 batches (twice the training
    batch) run without torch.no_grad(): every forward keeps its autograd graph until `out` and
    `loss` are rebound, so two graphs are alive at once. No leak: the loss is taken with .item()."""
    m = nn.Sequential(nn.Linear(2048, 8192), nn.ReLU(), nn.Linear(8192, 8192), nn.ReLU(), nn.Linear(8192, 2048)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(3):
        x = torch.randn(2048, 2048, device=dev)
        loss = m(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    del x, loss
    m.eval()
    total = 0.0
    for _ in range(8):
        x = torch.randn(4096, 2048, device=dev)
        out = m(x)
        loss = out.pow(2).mean()
        total += loss.item()
    torch.cuda.synchronize()


def oom_catch():
    """An MLP trained with a batch that may not fit: on torch.OutOfMemoryError the job drops the
    failed step's tensors, calls torch.cuda.empty_cache() and halves its batch, then goes on
    (the pattern of automatic batch-size finders). 6 steps; it gives up below batch 2048."""
    m = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 2048), nn.ReLU()) for _ in range(6)]).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    bs = 32768
    step = 0
    caught = 0
    while step < 6:
        failed = False
        try:
            x = torch.randn(bs, 2048, device=dev)
            loss = m(x).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        except torch.OutOfMemoryError:
            if bs // 2 < 2048:
                raise
            failed = True
        if failed:
            # Outside the except block, so that the traceback's frames no longer hold the
            # failed step's tensors.
            caught += 1
            x = loss = None
            opt.zero_grad(set_to_none=True)
            bs //= 2
            gc.collect()
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return {"caught": caught, "final_batch": bs}



def rs_pipeline():
    """A producer stream fills buffers (1.5 to 7 MiB, and a small header tensor) that the
    consumer (the current stream) reads after `record_stream`; the consumer is kept busy
    (`torch.cuda._sleep`), so each buffer waits for its consumer event before it can be reused.
    The host synchronizes every 8 batches, 48 batches."""
    rng = random.Random(4)
    prod = torch.cuda.Stream()
    cons = torch.cuda.current_stream()
    acc = torch.zeros(1024, device=dev)
    for i in range(48):
        rows = rng.choice([384, 768, 1280, 1792])
        with torch.cuda.stream(prod):
            buf = torch.randn(rows, 1024, device=dev)
            hdr = torch.randn(rng.choice([300, 3000, 30000]), device=dev)
        cons.wait_stream(prod)
        buf.record_stream(cons)
        hdr.record_stream(cons)
        torch.cuda._sleep(200_000)
        out = torch.relu(buf) * hdr.mean()
        acc += out.sum(0)
        del buf, hdr, out
        if i % 8 == 7:
            acc.sum().item()
    torch.cuda.synchronize()


def ec_batches():
    """A data loader copies each batch on a side stream (`record_stream` onto the compute
    stream), an MLP trains on it (batches of 900 to 3,700 rows), a few outputs are kept across
    batches, and `gc.collect(); torch.cuda.empty_cache()` runs after every batch, 14 batches."""
    rng = random.Random(5)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    m = nn.Sequential(nn.Linear(2500, 7000), nn.ReLU(), nn.Linear(7000, 5000), nn.ReLU(), nn.Linear(5000, 1000)).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    kept = []
    for i in range(14):
        b = rng.choice([900, 1700, 2300, 3100, 3700])
        with torch.cuda.stream(side):
            x = torch.randn(b, 2500, device=dev)
            y = torch.randint(0, 1000, (b,), device=dev)
        main.wait_stream(side)
        x.record_stream(main)
        y.record_stream(main)
        out = m(x)
        loss = F.cross_entropy(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        kept.append(out.detach()[: rng.choice([100, 700])].clone())
        if len(kept) > 3:
            kept.pop(0)
        del x, y, out, loss
        gc.collect()
        torch.cuda.empty_cache()
    torch.cuda.synchronize()


def mixed_sizes(n=20000):
    """Random allocations and frees of sizes from 1 byte to 64 MiB (a third each up to 4 KiB,
    up to 1 MiB, up to 64 MiB), a fifth of them on a second stream; 20,000 steps, each freeing a
    random live tensor with probability 0.48, so that the live set grows to about 8 GB."""
    s2 = torch.cuda.Stream()
    live = []
    for _ in range(n):
        if live and random.random() < 0.48:
            live.pop(random.randrange(len(live)))
        else:
            k = random.choice([random.randint(1, 4096), random.randint(4096, 1 << 20), random.randint(1 << 20, 64 << 20)])
            if random.random() < 0.2:
                with torch.cuda.stream(s2):
                    live.append(torch.empty(k, dtype=torch.uint8, device=dev))
            else:
                live.append(torch.empty(k, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize()


def mixed_gc():
    """A bounded working set of tensors of many sizes (4 KiB..1 MiB, 1..20 MiB, 20..400 MiB),
    4,000 steps: each step frees a random live tensor once 48 are live (or with probability 0.3)
    and allocates one, so cached segments of every size are freed and reused for years of
    allocator time, as under `garbage_collection_threshold`."""
    rng = random.Random(6)
    live = []
    for _ in range(4000):
        if live and (len(live) >= 48 or rng.random() < 0.3):
            live.pop(rng.randrange(len(live)))
        k = rng.choice([rng.randint(4 << 10, 1 << 20), rng.randint(1 << 20, 20 << 20), rng.randint(20 << 20, 400 << 20)])
        live.append(torch.empty(k, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize()

WORKLOADS = ["amp_adamw", "varlen_train", "two_streams", "empty_cache_loop", "val_no_grad", "oom_catch",
             "rs_pipeline", "ec_batches", "mixed_sizes", "mixed_gc"]


def main():
    name, stem = sys.argv[1], sys.argv[2]
    snapshot = "--snapshot" in sys.argv
    limit = None
    for a in sys.argv[3:]:
        if a.startswith("--limit-bytes="):
            limit = int(a.split("=", 1)[1])
    torch.manual_seed(0)
    random.seed(0)
    total = torch.cuda.get_device_properties(0).total_memory
    frac = None
    if limit is not None:
        frac = limit / total
        torch.cuda.set_per_process_memory_fraction(frac)
    if snapshot:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=1_000_000)
    t0 = time.time()
    outcome, err, extra = "ok", "", None
    try:
        extra = globals()[name]()
    except torch.OutOfMemoryError as e:
        outcome, err = "oom", str(e)
    wall = time.time() - t0
    if snapshot:
        torch.cuda.memory._dump_snapshot(stem + ".pickle")
        torch.cuda.memory._record_memory_history(enabled=None)
    st = torch.cuda.memory_stats()
    keep = {k: v for k, v in st.items() if k.endswith(".all.peak") or k.endswith(".all.current") or k.startswith("num_")}
    rec = {
        "workload": name, "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "limit_bytes": limit,
        "fraction": frac, "outcome": outcome, "error": err, "extra": extra, "wall_s": round(wall, 3),
        "stats": keep, "total_memory": total, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }
    with open(stem + ".json", "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
