"""GPT-2 small (random weights, transformers), AdamW, 4 training steps of batch 4 x 512 tokens."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
dev = torch.device("cuda")
cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
m = GPT2LMHeadModel(cfg).to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
for step in range(4):
    ids = torch.randint(0, 50257, (4, 512), device=dev)
    out = m(input_ids=ids, labels=ids)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    opt.step()
    print(f"step {step} loss {out.loss.item():.4f}")
torch.cuda.synchronize()
print("allocator backend:", torch.cuda.memory.get_allocator_backend())
