"""A Hugging Face Trainer run (GPT-2 small configuration, random weights, batch 4 x 512 tokens on
random ids, as trainer_hf.py) that prints the time of each training step after the first five:
the cost of recording is read from the step time, not from the job's start.

  python3 trainer_steps.py [--history] [--steps N] [--workers N] [--pidfile PATH]

--history: PyTorch's own allocator history with Python stacks on, as memory_viz users turn it on
(`_record_memory_history(context="alloc", stacks="python", max_entries=100000)`), the comparison
for `alloctrace record --stacks`. --pidfile: writes the process id there once training starts
(for the kill -9 proof). --workers: DataLoader worker processes (forked children of the job)."""
import argparse
import os
import statistics
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--history", action="store_true")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--workers", type=int, default=0)
ap.add_argument("--pidfile")
a = ap.parse_args()


class Ids(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 50257, (n, 512), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Steps(TrainerCallback):
    def __init__(self):
        self.times, self.t = [], None

    def on_step_begin(self, args, state, control, **kw):
        torch.cuda.synchronize()
        self.t = time.perf_counter()
        if state.global_step == 2 and a.pidfile:
            with open(a.pidfile, "w") as f:
                f.write(str(os.getpid()))

    def on_step_end(self, args, state, control, **kw):
        torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.t)


if a.history:
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=100000)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024))
args = TrainingArguments(output_dir="/tmp/trainer_out", per_device_train_batch_size=4, max_steps=a.steps,
                         logging_steps=10, save_strategy="no", report_to=[], disable_tqdm=True, seed=0,
                         dataloader_num_workers=a.workers)
steps = Steps()
t = time.perf_counter()
Trainer(model=model, args=args, train_dataset=Ids(200), callbacks=[steps]).train()
torch.cuda.synchronize()
late = steps.times[5:]
print(f"trainer_seconds {time.perf_counter() - t:.2f}")
print(f"step_ms median {statistics.median(late) * 1e3:.2f} min {min(late) * 1e3:.2f} over {len(late)} steps")
print(f"max_memory_reserved {torch.cuda.max_memory_reserved()}")
