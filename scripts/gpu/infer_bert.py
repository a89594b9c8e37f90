"""BERT-base (random weights) inference with variable shapes: 40 batches, batch in {1..64},
sequence length 16..512; empty_cache once halfway."""
import random
import torch
from transformers import BertConfig, BertModel

torch.manual_seed(0)
random.seed(0)
dev = torch.device("cuda")
m = BertModel(BertConfig()).to(dev).eval()
with torch.no_grad():
    for i in range(40):
        b = random.choice([1, 2, 4, 8, 16, 32, 64])
        s = random.randint(16, 512)
        ids = torch.randint(0, 30000, (b, s), device=dev)
        h = m(input_ids=ids).last_hidden_state
        if i == 20:
            torch.cuda.empty_cache()
torch.cuda.synchronize()
print("done", tuple(h.shape))
