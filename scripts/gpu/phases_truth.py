"""Training runs whose memory the model itself accounts for, to be recorded by `alloctrace record`
(whose shim marks forward, backward and optimizer steps): a transformer with AdamW, the same
transformer with each encoder layer checkpointed (torch.utils.checkpoint), and a CNN (no batch
norm, so no buffers) with SGD and momentum. Writes the model's own figures to OUTDIR/NAME.json:

  parameter bytes = sum(p.numel() * p.element_size())
  gradient bytes = parameter bytes
  AdamW state = 2 x parameter bytes (exp_avg, exp_avg_sq; `step` stays on the CPU)
  SGD momentum state = 1 x parameter bytes

    alloctrace record -o OUTDIR/NAME.atrace -- python3 phases_truth.py OUTDIR NAME
"""
import json
import os
import sys

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

STEPS = 3
LAYERS = 4


class Lm(nn.Module):
    def __init__(self, checkpointed, vocab=8000, d=256):
        super().__init__()
        self.checkpointed = checkpointed
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=1024, batch_first=True, dropout=0.0)
            for _ in range(LAYERS)
        )
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpointed else layer(x)
        return self.head(x)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(256, 100)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def tokens():
    ids = torch.randint(0, 8000, (16, 256), device="cuda")
    return ids, ids


def images():
    return torch.randn(32, 3, 64, 64, device="cuda"), torch.randint(0, 100, (32,), device="cuda")


WORKLOADS = {
    "transformer_adamw": (lambda: Lm(False), lambda p: torch.optim.AdamW(p, lr=1e-4), tokens),
    "transformer_adamw_checkpointed": (lambda: Lm(True), lambda p: torch.optim.AdamW(p, lr=1e-4), tokens),
    "cnn_sgd": (Cnn, lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9), images),
}


def main(outdir, name):
    make_model, make_opt, batch = WORKLOADS[name]
    torch.manual_seed(0)
    model = make_model().cuda()
    opt = make_opt(model.parameters())
    for _ in range(STEPS):
        x, y = batch()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        del x, y, out, loss
    torch.cuda.synchronize()
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.is_cuda]
    fig = {
        "parameter_tensors": len(params),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "gradient_bytes": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        "optimizer_state_tensors": len(state),
        "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state),
        "max_allocated_bytes": torch.cuda.max_memory_allocated(),
        "max_reserved_bytes": torch.cuda.max_memory_reserved(),
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }
    with open(os.path.join(outdir, f"{name}.json"), "w") as f:
        json.dump(fig, f, indent=1)
    print(name, json.dumps(fig), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
