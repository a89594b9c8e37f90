"""Third-party training jobs for the OOM doctor's truth table: code paths we did not write
(Hugging Face `Trainer`, torchvision models, a UNet of torchvision blocks, a `record_stream`
prefetcher as apex's examples have it, timm's ViT under AMP, a Lightning `Trainer`), each a few
seconds on an H100.

Usage: python3 doctor_jobs.py JOB OUT_STEM [--limit-bytes=N] [--snapshot]

Reads PYTORCH_CUDA_ALLOC_CONF from the environment (the caller sets it). With --limit-bytes the
job calls torch.cuda.set_per_process_memory_fraction(N / total), total as cudaMemGetInfo gives it
(the total PyTorch multiplies the fraction by), so that the allocator may reserve at most N bytes.
With --snapshot, PyTorch's allocator history is recorded (Python frames on every event) and a
snapshot is dumped at each out-of-memory error from the allocator's OOM observer, that is at the
failure, before any frame unwinds (the last one is the fatal one; a library that catches an
OOM and goes on makes an earlier one). Writes OUT_STEM.json (outcome, memory_stats counters) and,
with --snapshot and an OOM, OUT_STEM.pickle.

Every job is deterministic in its request sequence (fixed seeds, cudnn.benchmark off), except
where a library catches an out-of-memory error and goes on (cuDNN trying an algorithm with a
smaller workspace), and the order in which `record_stream` frees complete (`stream_pipeline`).
"""
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


def hf_trainer():
    """A Hugging Face Trainer: GPT-2 small configuration (random init, built in code, nothing
    downloaded), batch 4 x 512 tokens of random ids, AdamW (the Trainer's default), 8 steps."""
    import tempfile

    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Ids(Dataset):
        def __init__(self, n):
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, 50257, (n, 512), generator=g)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=8,
                                 logging_strategy="no", save_strategy="no", report_to=[],
                                 disable_tqdm=True, seed=0, dataloader_num_workers=0)
        Trainer(model=model, args=args, train_dataset=Ids(64)).train()


def tv_resnet_varbatch():
    """torchvision ResNet-50 (random init) trained on 160 x 160 images with a batch that varies
    per step (16..64), SGD with momentum, 8 steps."""
    import torchvision

    rng = random.Random(4)
    m = torchvision.models.resnet50(weights=None).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    for _ in range(8):
        b = rng.choice([16, 24, 32, 48, 64])
        x = torch.randn(b, 3, 160, 160, device=dev)
        y = torch.randint(0, 1000, (b,), device=dev)
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


class _Block(nn.Module):
    """Two torchvision Conv2dNormActivation layers (GroupNorm, SiLU) with a time embedding."""

    def __init__(self, cin, cout, tdim):
        from torchvision.ops import Conv2dNormActivation

        super().__init__()
        norm = lambda c: nn.GroupNorm(8, c)  # noqa: E731
        self.c1 = Conv2dNormActivation(cin, cout, 3, norm_layer=norm, activation_layer=nn.SiLU)
        self.c2 = Conv2dNormActivation(cout, cout, 3, norm_layer=norm, activation_layer=nn.SiLU)
        self.t = nn.Linear(tdim, cout)

    def forward(self, x, t):
        return self.c2(self.c1(x) + self.t(t)[:, :, None, None])


class _UNet(nn.Module):
    """A diffusion-style UNet of torchvision blocks: 4 levels (64..512 channels), skips, a
    sinusoidal time embedding; predicts the noise."""

    def __init__(self, ch=(64, 128, 256, 512), tdim=256):
        super().__init__()
        self.tdim = tdim
        self.temb = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inc = nn.Conv2d(3, ch[0], 3, padding=1)
        self.down = nn.ModuleList(_Block(ch[i], ch[i + 1], tdim) for i in range(len(ch) - 1))
        self.mid = _Block(ch[-1], ch[-1], tdim)
        self.up = nn.ModuleList(_Block(ch[i + 1] + ch[i], ch[i], tdim) for i in reversed(range(len(ch) - 1)))
        self.out = nn.Conv2d(ch[0], 3, 3, padding=1)

    def forward(self, x, t):
        half = self.tdim // 2
        freqs = torch.exp(-torch.arange(half, device=x.device) * (9.21 / half))
        e = self.temb(torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], dim=1))
        h = self.inc(x)
        skips = []
        for blk in self.down:
            skips.append(h)
            h = blk(F.avg_pool2d(h, 2), e)
        h = self.mid(h, e)
        for blk in self.up:
            s = skips.pop()
            h = F.interpolate(h, size=s.shape[-2:], mode="nearest")
            h = blk(torch.cat([h, s], 1), e)
        return self.out(h)


def unet_varres():
    """The UNet above trained as a denoiser (noise prediction, cosine schedule) on random images
    whose resolution varies per step (96..256), batch 8, AdamW, 8 steps."""
    rng = random.Random(5)
    m = _UNet().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(8):
        r = rng.choice([96, 128, 160, 192, 224, 256])
        x0 = torch.randn(8, 3, r, r, device=dev)
        t = torch.rand(8, device=dev)
        a = torch.cos(t * 1.5707963)[:, None, None, None] ** 2
        noise = torch.randn_like(x0)
        loss = F.mse_loss(m(a.sqrt() * x0 + (1 - a).sqrt() * noise, t * 1000), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


class _Prefetcher:
    """apex's `data_prefetcher` (examples/imagenet/main_amp.py): the next batch is copied to the
    GPU and normalised on a side stream while the current one trains; `next()` makes the compute
    stream wait and marks the tensors with `record_stream`, so that their blocks are not reused
    while the side stream may still write them."""

    def __init__(self, loader):
        self.loader = iter(loader)
        self.stream = torch.cuda.Stream()
        self.mean = torch.tensor([0.485 * 255, 0.456 * 255, 0.406 * 255], device=dev).view(1, 3, 1, 1)
        self.std = torch.tensor([0.229 * 255, 0.224 * 255, 0.225 * 255], device=dev).view(1, 3, 1, 1)
        self.preload()

    def preload(self):
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = self.next_target = None
            return
        with torch.cuda.stream(self.stream):
            self.next_input = self.next_input.to(dev, non_blocking=True)
            self.next_target = self.next_target.to(dev, non_blocking=True)
            self.next_input = self.next_input.float().sub_(self.mean).div_(self.std)

    def next(self):
        torch.cuda.current_stream().wait_stream(self.stream)
        inp, target = self.next_input, self.next_target
        if inp is not None:
            inp.record_stream(torch.cuda.current_stream())
            target.record_stream(torch.cuda.current_stream())
        self.preload()
        return inp, target


def stream_pipeline():
    """torchvision ResNet-18 fed by the prefetcher above from pinned uint8 batches of varying
    size (32..128 images of 128 x 128), SGD, 10 steps."""
    import torchvision

    rng = random.Random(6)
    g = torch.Generator().manual_seed(6)
    batches = []
    for _ in range(10):
        b = rng.choice([32, 64, 96, 128])
        batches.append((torch.randint(0, 256, (b, 3, 128, 128), dtype=torch.uint8, generator=g).pin_memory(),
                        torch.randint(0, 1000, (b,), generator=g).pin_memory()))
    m = torchvision.models.resnet18(weights=None).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    pf = _Prefetcher(batches)
    x, y = pf.next()
    while x is not None:
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        x, y = pf.next()


def timm_vit_amp():
    """timm's ViT-S/16 (random init, nothing downloaded) on 224 x 224 images, batch 64, under
    autocast (float16) with a GradScaler, AdamW, 8 steps."""
    import timm

    m = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    g = torch.Generator(device=dev).manual_seed(7)
    for _ in range(8):
        x = torch.randn(64, 3, 224, 224, device=dev, generator=g)
        y = torch.randint(0, 1000, (64,), device=dev, generator=g)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def lightning_resnet():
    """A Lightning `Trainer` (lightning 2.6.6 here) fitting a LightningModule around torchvision's
    ResNet-34 (random init) on 128 x 128 images, batch 96, Adam, 8 steps; no logger, no
    checkpoints, no progress bar. The loop, the optimizer step and the device moves are
    Lightning's."""
    import lightning.pytorch as pl
    import torchvision
    from torch.utils.data import DataLoader, TensorDataset

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet34(weights=None)

        def training_step(self, batch, _):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(8)
    data = TensorDataset(torch.randn(8 * 96, 3, 128, 128, generator=g), torch.randint(0, 1000, (8 * 96,), generator=g))
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=8, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Classifier(), DataLoader(data, batch_size=96, num_workers=0))


JOBS = ["hf_trainer", "tv_resnet_varbatch", "unet_varres", "stream_pipeline", "timm_vit_amp", "lightning_resnet"]


def main():
    name, stem = sys.argv[1], sys.argv[2]
    snapshot = "--snapshot" in sys.argv
    limit = None
    for a in sys.argv[3:]:
        if a.startswith("--limit-bytes="):
            limit = int(a.split("=", 1)[1])
    torch.manual_seed(0)
    random.seed(0)
    total = torch.cuda.mem_get_info()[1]
    frac = None
    if limit is not None:
        frac = limit / total
        torch.cuda.set_per_process_memory_fraction(frac)
    ooms = []
    if snapshot:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=500_000)

        def at_oom(device, alloc, device_allocated, device_free):
            ooms.append(alloc)
            torch.cuda.memory._dump_snapshot(stem + ".pickle")

        torch._C._cuda_attach_out_of_memory_observer(at_oom)
    t0 = time.time()
    outcome, err = "ok", ""
    try:
        globals()[name]()
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        outcome, err = "oom", str(e)
    wall = time.time() - t0
    if outcome == "ok" and os.path.exists(stem + ".pickle"):
        os.rename(stem + ".pickle", stem + ".caught.pickle")  # OOMs a library caught; the job went on
    st = torch.cuda.memory_stats()
    keep = {k: v for k, v in st.items() if k.endswith(".all.peak") or k.startswith("num_")}
    rec = {
        "job": name, "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "limit_bytes": limit,
        "fraction": frac, "outcome": outcome, "error": err[:400], "observed_ooms": ooms, "wall_s": round(wall, 3),
        "stats": keep, "total_memory": total, "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
    }
    with open(stem + ".json", "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
