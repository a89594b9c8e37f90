"""Two training runs whose memory the model itself accounts for: a small transformer with AdamW
and a small CNN (no batch norm, so no buffers) with SGD and momentum. Each records a snapshot
with Python frames (OUTDIR/transformer_adamw.pickle, OUTDIR/cnn_sgd.pickle) and writes the
model's own figures to OUTDIR/NAME.json:

  parameter bytes = sum(p.numel() * p.element_size())
  gradient bytes = parameter bytes
  AdamW state = 2 x parameter bytes (exp_avg, exp_avg_sq; `step` stays on the CPU)
  SGD momentum state = 1 x parameter bytes

    python3 ranks_models.py OUTDIR transformer_adamw|cnn_sgd
"""
import json
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks_common  # noqa: E402

STEPS = 3


class TinyLm(nn.Module):
    def __init__(self, vocab=8000, d=256, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=1024, batch_first=True, dropout=0.0)
        self.blocks = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.blocks(self.emb(ids)))


class TinyCnn(nn.Module):
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


def figures(model, opt):
    params = list(model.parameters())
    pb = sum(p.numel() * p.element_size() for p in params)
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.is_cuda]
    return {
        "parameter_tensors": len(params),
        "parameter_bytes": pb,
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "gradient_bytes": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        "optimizer_state_tensors": len(state),
        "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state),
    }


def run(name, make_model, make_opt, batch, outdir):
    ranks_common.start_history()
    torch.manual_seed(0)
    model = make_model().cuda()
    opt = make_opt(model.parameters())
    for step in range(STEPS):
        with torch.profiler.record_function("iteration"):
            x, y = batch()
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
            opt.step()
            del x, y, out, loss
    fig = figures(model, opt)
    fig["expected_optimizer_state_bytes"] = fig["parameter_bytes"] * (2 if isinstance(opt, torch.optim.AdamW) else 1)
    fig["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    fig["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    ranks_common.dump(os.path.join(outdir, f"{name}.pickle"))
    print(name, json.dumps(fig), flush=True)
    return fig


WORKLOADS = {
    "transformer_adamw": (TinyLm, lambda p: torch.optim.AdamW(p, lr=1e-4),
                          lambda: (torch.randint(0, 8000, (8, 128), device="cuda"),) * 2),
    "cnn_sgd": (TinyCnn, lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
                lambda: (torch.randn(32, 3, 64, 64, device="cuda"), torch.randint(0, 100, (32,), device="cuda"))),
}

if __name__ == "__main__":
    # One workload per process, so that each snapshot holds that workload alone.
    outdir, name = sys.argv[1], sys.argv[2]
    fig = run(name, *WORKLOADS[name], outdir)
    fig["torch_version"] = torch.__version__
    fig["device"] = torch.cuda.get_device_name(0)
    with open(os.path.join(outdir, f"{name}.json"), "w") as f:
        json.dump(fig, f, indent=1)
