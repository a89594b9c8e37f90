"""A job that allocates before it sets its own memory fraction, then trains doctor_jobs.py's
tv_resnet_varbatch: under `alloctrace record` the recorder has written its header by then, so
the limit reaches the trace through the status file and the header is rewritten after the run.

Usage: python3 late_fraction.py LIMIT_BYTES"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doctor_jobs  # noqa: E402

warm = torch.ones(1 << 20, device="cuda")
torch.cuda.set_per_process_memory_fraction(int(sys.argv[1]) / torch.cuda.mem_get_info()[1])
torch.manual_seed(0)
doctor_jobs.tv_resnet_varbatch()
torch.cuda.synchronize()
print("completed; peak reserved", torch.cuda.max_memory_reserved())
