"""Installs alloctrace's recording allocator into PyTorch, unmodified scripts included.

`alloctrace record` puts this folder first on PYTHONPATH; its `sitecustomize.py` calls
`install()`, which waits for the program to import torch (an import hook: processes that never
import torch pay nothing) and then swaps in the CUDAPluggableAllocator from the library named by
ALLOCTRACE_LIB, before the first CUDA allocation. `torch.cuda.empty_cache()` reaches the
recorder through the allocator's reset function; the trace is closed at exit and on SIGTERM.

Programs may also label their trace: `import alloctrace_hook as at; at.mark("forward")`,
`at.mark_iteration("step 3")` (no-ops when not recording).
"""
import atexit
import ctypes
import os
import signal
import sys

_lib = None
_installed = False


def _library():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(os.environ["ALLOCTRACE_LIB"])
        _lib.alloctrace_mark.argtypes = [ctypes.c_char_p]
        _lib.alloctrace_mark_iteration.argtypes = [ctypes.c_char_p]
        _lib.alloctrace_shutdown.restype = ctypes.c_int
    return _lib


def mark(label):
    """Labels a phase of the program in the trace."""
    if _installed:
        _library().alloctrace_mark(str(label).encode())


def mark_iteration(label):
    """Labels the start of an iteration in the trace."""
    if _installed:
        _library().alloctrace_mark_iteration(str(label).encode())


def shutdown():
    """Writes the last events and the trailer (also done at exit)."""
    if _installed:
        return _library().alloctrace_shutdown()
    return 2


def _on_sigterm(signum, frame):
    shutdown()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_into_torch(torch_module):
    global _installed
    if _installed:
        return
    path = os.environ["ALLOCTRACE_LIB"]
    from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator

    lib = _library()
    alloc = CUDAPluggableAllocator(path, "alloctrace_malloc", "alloctrace_free")
    raw = alloc.allocator()
    raw.set_init_fn(ctypes.cast(lib.alloctrace_init, ctypes.c_void_p).value)
    raw.set_reset_fn(ctypes.cast(lib.alloctrace_empty_cache, ctypes.c_void_p).value)
    change_current_allocator(alloc)
    _installed = True
    atexit.register(shutdown)
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:
        pass  # not the main thread


class _TorchWatcher:
    """A meta-path finder that runs `_install_into_torch` right after `import torch`."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            try:
                _install_into_torch(module)
            except Exception as e:  # never break the program
                sys.stderr.write(f"alloctrace: could not install the recording allocator: {e}\n")

        loader.exec_module = exec_module
        return spec


def install():
    if not os.environ.get("ALLOCTRACE_LIB"):
        return
    if "torch" in sys.modules:
        _install_into_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchWatcher())
