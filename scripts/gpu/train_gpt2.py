"""GPT-2 small (random weights, transformers), AdamW, 4 training steps of batch 4 x 512 tokens."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def train(dev, report=None, checkpointing=False, use_cache=True):
    """The four steps on `dev`; `report(step, loss)` after each, where given. `checkpointing`:
    with the model's own activation checkpointing (each of the 12 blocks recomputed in backward,
    which turns the model's cache of keys and values off); `use_cache=False` turns it off alone."""
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257, use_cache=use_cache)
    m = GPT2LMHeadModel(cfg).to(dev)
    if checkpointing:
        m.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for step in range(4):
        ids = torch.randint(0, 50257, (4, 512), device=dev)
        out = m(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        if report:
            report(step, out.loss)
    torch.cuda.synchronize()


if __name__ == "__main__":
    torch.manual_seed(0)
    train(torch.device("cuda"), lambda step, loss: print(f"step {step} loss {loss.item():.4f}"))
    print("allocator backend:", torch.cuda.memory.get_allocator_backend())
