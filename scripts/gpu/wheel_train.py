# A small Hugging Face GPT-2 training job (config only: no download), three AdamW steps.
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=6)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, 50257, (4, 256), device="cuda")
for step in range(3):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
print(f"loss {loss.item():.6f} peak_reserved {torch.cuda.max_memory_reserved()}")
