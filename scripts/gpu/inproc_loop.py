"""The empty_batches.py loop with the recorder attached in this process, as `alloctrace record`
attaches it but without the startup shim (no phase hooks): python3 inproc_loop.py LIB OUT.atrace
LABEL. Needs recorder/python importable (or ALLOCTRACE_SHIM)."""
import os
import runpy
import sys

lib_path, trace, label = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["ALLOCTRACE_LIB"] = lib_path
os.environ["ALLOCTRACE_OUTPUT"] = trace
sys.path.insert(0, os.environ.get("ALLOCTRACE_SHIM", "recorder/python"))
import ctypes  # noqa: E402

import torch  # noqa: E402

import alloctrace_hook  # noqa: E402

torch.empty(1, device="cuda")
helper = alloctrace_hook._build_helper(torch)
lib = ctypes.CDLL(lib_path)
helper.attach(ctypes.cast(lib.alloctrace_torch_event, ctypes.c_void_p).value)
sys.argv = ["empty_batches.py", label]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "empty_batches.py"), run_name="__main__")
lib.alloctrace_shutdown()
