"""Installs alloctrace's recorder into PyTorch, unmodified scripts included.

`alloctrace record` puts this folder first on PYTHONPATH; its `sitecustomize.py` calls
`install()`, which waits for the program to import torch (an import hook: processes that never
import torch pay nothing), then sets up the back-end ALLOCTRACE_ALLOCATOR names:

- `pytorch` (default): PyTorch's own caching allocator runs the job, exactly as natively. When
  CUDA starts (torch.cuda's lazy-init queue, so CUDA is never started early), a small helper
  built against this torch (cached) attaches a trace tracker that forwards every allocator event
  to the recorder library; where this PyTorch calls trackers only while its history recording
  is on, that is turned on with a ring buffer of one entry. Without a compiler, with --stacks,
  or when the helper cannot attach, PyTorch's history itself is kept and dumped at exit, at an OOM and on
  SIGTERM for `alloctrace record` to convert (a kill -9 loses it).
- `alloctrace`: alloctrace's engine runs the job through CUDAPluggableAllocator, with
  record_stream honoured; CUDA graph capture is refused with a clear message.

Every failure says one line on stderr and leaves the job running natively.

Phases. While recording, PyTorch's public hooks mark the phases of training in the trace, so
that `alloctrace` can tell what each allocation is for (parameters, gradients, optimizer state,
activations): `forward` when the outermost module's forward starts and `after forward` when it
returns (global module forward pre- and post-hooks, with a depth count, so nested modules mark
nothing), `backward` and `after backward` around the autograd engine's run (`torch.autograd.backward`,
which `Tensor.backward` calls; a forward recomputed inside backward, as activation checkpointing
does, marks nothing), `optimizer step` and `after optimizer step` around every `torch.optim`
step (global step pre- and post-hooks), and `gradient buckets (DistributedDataParallel)` and
`after gradient buckets` around DistributedDataParallel's construction, which allocates the
gradient buckets it keeps (and `gradient buckets ...` then `forward` around the bucket rebuild
at the start of its forward). They are installed only when recording.

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
_history = False


def _say(msg):
    sys.stderr.write(f"alloctrace: {msg}\n")


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


def _chain_sigterm(dump):
    """On SIGTERM: `dump()`, then die of the signal as the program would have."""

    def handler(signum, frame):
        try:
            dump()
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, handler)
    except ValueError:
        pass  # not the main thread


def _capacity_bytes():
    text = os.environ.get("ALLOCTRACE_CAPACITY", "").strip()
    if not text:
        return None
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
             "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
    num = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    try:
        return int(float(num) * units[text[len(num):].strip().lower()])
    except (ValueError, KeyError):
        return None


# ---------------------------------------------------------------- phase marks

_phase = {"depth": 0, "backward": 0}


def _forward_pre(module, args):
    if _phase["backward"] == 0:
        if _phase["depth"] == 0:
            mark("forward")
        _phase["depth"] += 1


def _forward_post(module, args, output):
    if _phase["backward"] == 0 and _phase["depth"] > 0:
        _phase["depth"] -= 1
        if _phase["depth"] == 0:
            mark("after forward")


def _wrap_backward(original):
    def backward(*args, **kwargs):
        _phase["backward"] += 1
        if _phase["backward"] == 1:
            # A forward that raised left its depth behind; a backward starts afresh.
            _phase["depth"] = 0
            mark("backward")
        try:
            return original(*args, **kwargs)
        finally:
            _phase["backward"] -= 1
            if _phase["backward"] == 0:
                mark("after backward")

    backward.__wrapped__ = original
    backward.__doc__ = original.__doc__
    return backward


def _wrap_ddp_init(original):
    def init(*args, **kwargs):
        mark("gradient buckets (DistributedDataParallel)")
        try:
            return original(*args, **kwargs)
        finally:
            mark("after gradient buckets")

    init.__wrapped__ = original
    return init


def _wrap_ddp_pre_forward(original):
    """The bucket rebuild at the start of DistributedDataParallel's forward: its own phase,
    after which the forward goes on."""

    def pre_forward(*args, **kwargs):
        if _phase["backward"] > 0:
            return original(*args, **kwargs)
        mark("gradient buckets (DistributedDataParallel)")
        try:
            return original(*args, **kwargs)
        finally:
            mark("forward" if _phase["depth"] > 0 else "after gradient buckets")

    pre_forward.__wrapped__ = original
    return pre_forward


def _install_phase_hooks(torch):
    """Marks forward, backward and optimizer steps (see the module documentation)."""
    try:
        from torch.nn.modules import module as nn_module

        nn_module.register_module_forward_pre_hook(_forward_pre)
        try:
            nn_module.register_module_forward_hook(_forward_post, always_call=True)
        except TypeError:  # before always_call
            nn_module.register_module_forward_hook(_forward_post)
        torch.autograd.backward = _wrap_backward(torch.autograd.backward)
        from torch.optim import optimizer as optim

        optim.register_optimizer_step_pre_hook(lambda opt, args, kwargs: mark("optimizer step"))
        optim.register_optimizer_step_post_hook(lambda opt, args, kwargs: mark("after optimizer step"))
    except Exception as e:  # never break the program
        _say(f"cannot mark forward, backward and optimizer steps: {e}")
    try:
        from torch.nn.parallel import distributed

        ddp = distributed.DistributedDataParallel
        ddp.__init__ = _wrap_ddp_init(ddp.__init__)
        if hasattr(ddp, "_pre_forward"):
            ddp._pre_forward = _wrap_ddp_pre_forward(ddp._pre_forward)
    except Exception:
        pass  # no torch.distributed in this build


# ---------------------------------------------------------------- the default back-end

def _rank_info():
    def num(name):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            return None

    return {"rank": num("RANK"), "local_rank": num("LOCAL_RANK"), "world_size": num("WORLD_SIZE")}


def _build_helper(torch):
    import hashlib
    from torch.utils import cpp_extension

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "alloctrace_torch_helper.cpp")
    with open(src) as f:
        text = f.read()
    digest = hashlib.sha256((text + torch.__version__).encode()).hexdigest()[:16]
    # load_inline keeps the source in the extension's own build folder, so a later run (whose
    # shim folder is a new one) finds the build up to date and only loads it.
    return cpp_extension.load_inline(
        name=f"alloctrace_torch_helper_{digest}", cpp_sources=[text], with_cuda=True, extra_cflags=["-O2"],
        verbose=False,
    )


def _start_history(torch, why):
    """The fallback: PyTorch keeps its allocator history; dumped at exit, OOM and SIGTERM."""
    global _history
    stacks = os.environ.get("ALLOCTRACE_STACKS") == "1"
    entries = int(os.environ.get("ALLOCTRACE_HISTORY_ENTRIES", "1000000"))
    torch.cuda.memory._record_memory_history(
        max_entries=entries, context="alloc" if stacks else None, stacks="python"
    )
    _history = True
    out = os.environ.get("ALLOCTRACE_HISTORY_DIR")
    if not out:
        return
    _say(f"{why}: keeping PyTorch's allocator history instead (up to {entries} entries), written at exit, at an "
         "OOM and on SIGTERM (a kill -9 loses it)")

    def dump(reason):
        import json

        try:
            base = os.path.join(out, f"snapshot.{os.getpid()}")
            devices = [d for d in range(torch.cuda.device_count()) if torch.cuda.max_memory_reserved(d) > 0]
            torch.cuda.memory._dump_snapshot(base + ".pickle")
            meta = dict(_rank_info(), devices=devices or [torch.cuda.current_device()], reason=reason)
            with open(base + ".json", "w") as f:
                json.dump(meta, f)
        except Exception as e:  # never break the program
            _say(f"could not write PyTorch's allocator history: {e}")

    atexit.register(dump, "exit")
    _chain_sigterm(lambda: dump("SIGTERM"))
    try:
        torch._C._cuda_attach_out_of_memory_observer(lambda *a: dump("an OOM"))
    except Exception:
        pass


def _trackers_need_history(torch, helper):
    """Whether this PyTorch calls trace trackers only while its history recording is on.

    Its history costs every allocation a little time (an entry built and copied under a lock)
    even with a ring of one entry, so it is turned on only where trackers need it. Learned from
    one 512-byte allocation made with the tracker attached to nothing, before the program has
    allocated: its segment is given back at once, so the cache is as it was. Where the program
    already holds memory, or ALLOCTRACE_TORCH_HISTORY=1, history is turned on without asking.
    """
    if os.environ.get("ALLOCTRACE_TORCH_HISTORY") == "1" or _reserved(torch) != 0:
        return True
    helper.attach(0)
    helper.saw_entry()
    p = torch.cuda.caching_allocator_alloc(512)
    torch.cuda.caching_allocator_delete(p)
    seen = helper.saw_entry()
    # torch.cuda.empty_cache() does nothing while CUDA is still starting (this runs in its
    # lazy-init queue): call the allocator directly, so the probe's segment goes back.
    torch._C._cuda_emptyCache()
    return not seen


def _reserved(torch):
    """Bytes PyTorch's allocator holds on the current device; None when it cannot say. Asked of
    the allocator directly: torch.cuda.memory_reserved() answers 0 while CUDA is starting."""
    try:
        return torch._C._cuda_memoryStats(torch.cuda.current_device())["reserved_bytes"]["all"]["current"]
    except Exception:
        return None


def _start_pytorch(torch):
    global _installed
    try:
        _set_capacity(torch)
        if os.environ.get("ALLOCTRACE_STACKS") == "1":
            # Not through the tracker: PyTorch calls trackers while it holds its allocator's lock,
            # and reading Python frames there means taking the GIL, which another thread may hold
            # while it waits for that lock to free a tensor (a deadlock). PyTorch gathers its own
            # stacks before it takes the lock, so call sites come from its history.
            _start_history(torch, "--stacks with PyTorch's allocator takes Python call sites from its history")
            return
        try:
            helper = _build_helper(torch)
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
            _start_history(torch, f"cannot build alloctrace's PyTorch helper ({first})")
            return
        lib = _library()
        history = _trackers_need_history(torch, helper)
        helper.attach(ctypes.cast(lib.alloctrace_torch_event, ctypes.c_void_p).value)
        if history:
            torch.cuda.memory._record_memory_history(max_entries=1, context=None, stacks="python")
        _installed = True
        atexit.register(shutdown)
        _chain_sigterm(shutdown)
    except Exception as e:  # never break the program
        _say(f"cannot record, the job runs natively: {e}")


def _set_capacity(torch):
    cap = _capacity_bytes()
    if cap:
        dev = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), dev)


def _install_pytorch(torch):
    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        major, minor = 0, 0
    if (major, minor) < (2, 1) or not hasattr(torch.cuda, "memory") or not hasattr(torch.cuda, "_lazy_call"):
        _say(f"PyTorch {torch.__version__} is too old to record (2.1 or later is needed): the job runs natively")
        return
    # Runs when the program starts CUDA (at once if it already has): never starts CUDA itself.
    torch.cuda._lazy_call(lambda: _start_pytorch(torch))


# ---------------------------------------------------------------- the engine back-end

_GRAPHS = (
    "CUDA graph capture (torch.cuda.graph, torch.compile(mode=\"reduce-overhead\")) needs PyTorch's own "
    "allocator, and this job runs on alloctrace's engine (--allocator alloctrace); record it with the default "
    "back-end instead: `alloctrace record -o run.atrace -- python ...` without --allocator alloctrace"
)


def _refuse_graphs(torch):
    def refuse(*args, **kwargs):
        _say(_GRAPHS)
        raise RuntimeError("alloctrace: " + _GRAPHS)

    try:
        torch.cuda.graphs.CUDAGraph.capture_begin = refuse
    except Exception:
        pass
    for name in ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_beginAllocateCurrentStreamToPool",
                 "_cuda_beginAllocateToPool", "_cuda_checkPoolLiveAllocations"):
        if hasattr(torch._C, name):
            try:
                setattr(torch._C, name, refuse)
            except Exception:
                pass


def _install_engine(torch_module):
    global _installed
    path = os.environ["ALLOCTRACE_LIB"]
    from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator

    lib = _library()
    alloc = CUDAPluggableAllocator(path, "alloctrace_malloc", "alloctrace_free")
    raw = alloc.allocator()
    raw.set_init_fn(ctypes.cast(lib.alloctrace_init, ctypes.c_void_p).value)
    raw.set_reset_fn(ctypes.cast(lib.alloctrace_empty_cache, ctypes.c_void_p).value)
    if hasattr(raw, "set_record_stream_fn"):
        raw.set_record_stream_fn(ctypes.cast(lib.alloctrace_record_stream, ctypes.c_void_p).value)
    else:
        _say("this PyTorch cannot pass record_stream to a pluggable allocator: blocks used on other streams "
             "may be reused too early; record with the default back-end instead")
    change_current_allocator(alloc)
    _refuse_graphs(torch_module)
    _installed = True
    atexit.register(shutdown)
    _chain_sigterm(shutdown)


def _install_into_torch(torch_module):
    if _installed:
        return
    _install_phase_hooks(torch_module)
    if os.environ.get("ALLOCTRACE_ALLOCATOR", "pytorch") == "alloctrace":
        _install_engine(torch_module)
    else:
        _install_pytorch(torch_module)


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
                _say(f"could not install the recorder, the job runs natively: {e}")

        loader.exec_module = exec_module
        return spec


def install():
    if not os.environ.get("ALLOCTRACE_LIB"):
        return
    if "torch" in sys.modules:
        _install_into_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchWatcher())
