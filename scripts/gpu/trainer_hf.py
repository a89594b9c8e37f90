"""A Hugging Face Trainer run: GPT-2 small configuration (random weights), 30 steps of batch 4 x
512 tokens on random ids. Prints the wall time, the losses and PyTorch's own peaks."""
import time

import torch
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


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024))
args = TrainingArguments(output_dir="/tmp/trainer_out", per_device_train_batch_size=4, max_steps=30,
                         logging_steps=10, save_strategy="no", report_to=[], disable_tqdm=True, seed=0)
t = time.perf_counter()
Trainer(model=model, args=args, train_dataset=Ids(200)).train()
torch.cuda.synchronize()
print(f"trainer_seconds {time.perf_counter() - t:.2f}")
print(f"max_memory_reserved {torch.cuda.max_memory_reserved()}")
print(f"max_memory_allocated {torch.cuda.max_memory_allocated()}")
