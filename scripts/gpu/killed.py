"""For the kill -9 proof: allocates and frees in a loop, marks progress, writes its pid to argv[1]."""
import os
import sys
import time

import torch

with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
keep = []
t = time.time()
while True:
    keep.append(torch.empty(1 << 20, device="cuda"))
    if len(keep) > 50:
        keep.pop(0)
    time.sleep(0.0005)
