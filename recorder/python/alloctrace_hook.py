"""Installs alloctrace's recorder into PyTorch, unmodified scripts included.

`alloctrace record` puts this folder first on PYTHONPATH; its `sitecustomize.py` calls
`install()`, which waits for the program to import torch (an import hook: processes that never
import torch pay nothing), then sets up the back-end ALLOCTRACE_ALLOCATOR names:

- `pytorch` (default): PyTorch's own caching allocator runs the job, exactly as natively. When
  CUDA starts (torch.cuda's lazy-init queue, so CUDA is never started early), a small helper
  built against this torch (cached) attaches a trace tracker that forwards every allocator event
  to the recorder library; where this PyTorch calls trackers only while its history recording
  is on, that is turned on with a ring buffer of one entry. With --stacks, history records
  context (`context="alloc"`, Python stacks, a ring of one entry): PyTorch gathers each
  allocation's stack before it takes its lock, the helper gives it an id under the lock, and a
  background thread (`_Sites`) takes the GIL and resolves new stacks in batches; the trace
  writer writes each call site before its first use, so a kill -9 loses only the last flush.
  Without a compiler, or when the helper cannot attach, PyTorch's history itself is kept and
  dumped at exit, at an OOM and on SIGTERM for `alloctrace record` to convert (a kill -9 loses
  it).
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

Past the limit (default back-end). Where the job runs under a memory limit, `--capacity`
(ALLOCTRACE_CAPACITY) or the job's own `torch.cuda.set_per_process_memory_fraction`, the limit
is not applied: it is recorded as the trace's capacity, and PyTorch's allocator serves past it,
so that the trace holds the whole request stream. The job is stopped on its own
ALLOCTRACE_AFTER_LIMIT whole iterations (default 3; `end`: never) after the first point where it
went past the limit: where PyTorch's allocator, capped, would have had to reserve more than the
limit (its peak reserved above it, the test PyTorch makes with a fraction: reserved plus the
new segment against the limit), and would then have freed its cache or failed. An iteration is
the span between iteration marks, else optimizer steps, else outermost forwards; one line on
stderr says where it stopped.

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
_sites = None


def _say(msg):
    sys.stderr.write(f"alloctrace: {msg}\n")


def _library():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(os.environ["ALLOCTRACE_LIB"])
        _lib.alloctrace_mark.argtypes = [ctypes.c_char_p]
        _lib.alloctrace_mark_iteration.argtypes = [ctypes.c_char_p]
        _lib.alloctrace_shutdown.restype = ctypes.c_int
        _lib.alloctrace_set_capacity.argtypes = [ctypes.c_int, ctypes.c_uint64]
        _lib.alloctrace_set_capacity.restype = ctypes.c_int
    return _lib


def mark(label):
    """Labels a phase of the program in the trace."""
    if _installed:
        _library().alloctrace_mark(str(label).encode())


def mark_iteration(label):
    """Labels the start of an iteration in the trace."""
    if _installed:
        _library().alloctrace_mark_iteration(str(label).encode())
    _past.tick("iteration")


def shutdown():
    """Writes the last events and the trailer (also done at exit)."""
    if _installed:
        if _sites is not None:
            _sites.close()
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


# ---------------------------------------------------------------- past the limit

def _gib(n):
    return f"{n / (1 << 30):.2f} GiB"


class _PastLimit:
    """The default back-end's limit, lifted (see the module documentation): which limit, where
    the job first went past it, and the stop N whole iterations later."""

    UNITS = {"iteration": "iterations", "step": "optimizer steps", "forward": "forwards"}

    def __init__(self):
        self.torch = None
        self.limits = {}  # device -> bytes
        self.why = ""
        after = os.environ.get("ALLOCTRACE_AFTER_LIMIT", "3").strip().lower()
        self.after = None if after == "end" else max(0, int(after)) if after.isdigit() else 3
        self.counts = {"iteration": 0, "step": 0, "forward": 0}
        self.crossed = None  # (counts then, the kind of tick that saw it, device, peak reserved)
        self.stop_hooks = []  # run before the process ends at the stop (close the trace)
        self.stopped = False

    def set(self, torch, device, limit, why):
        self.torch = torch
        self.limits[device] = int(limit)
        self.why = why
        if _installed:
            _library().alloctrace_set_capacity(device, int(limit))

    def _peak_over(self):
        """The first device whose peak reserved went past its limit, with that peak."""
        for dev, limit in self.limits.items():
            try:
                peak = self.torch.cuda.memory.memory_stats_as_nested_dict(dev)["reserved_bytes"]["all"]["peak"]
            except Exception:
                continue
            if peak > limit:
                return dev, peak
        return None

    def unit(self):
        return next(u for u in ("iteration", "step", "forward") if self.counts[u] > 0 or u == "forward")

    def tick(self, kind):
        """One iteration mark, optimizer step or outermost forward has ended (or begun: marks)."""
        if not self.limits or self.stopped:
            return
        self.counts[kind] += 1
        if self.crossed is None:
            over = self._peak_over()
            if over is None:
                return
            self.crossed = (dict(self.counts), kind) + over
            atexit.register(self._said_at_exit)
        if self.after is None:
            return
        unit = self.unit()
        then, seen_by = self.crossed[0], self.crossed[1]
        # The iteration that went past the limit ends at the tick that saw it (or at the next
        # tick of the unit, where another kind saw it); then `after` whole iterations.
        done = self.counts[unit] - then[unit] - (0 if seen_by == unit else 1)
        if done >= self.after:
            self.stop(unit)

    def _where(self):
        _, _, dev, peak = self.crossed
        return (f"the limit of {_gib(self.limits[dev])} ({self.why}) was not applied, and the job went past it "
                f"(PyTorch reserved up to {_gib(peak)} by then)")

    def _said_at_exit(self):
        if not self.stopped:
            _say(f"{self._where()}; recorded to the job's end")

    def stop(self, unit):
        self.stopped = True
        when = (f"{self.after} whole {self.UNITS[unit]} after" if self.after else
                f"at the end of the {self.UNITS[unit][:-1]} in which")
        _say(f"stopped the job {when} it went past its limit: {self._where()}; `--after-limit end` lets it run to "
             "its end")
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        for hook in self.stop_hooks:
            try:
                hook()
            except Exception as e:  # still stop
                _say(f"while stopping: {e}")
        os._exit(0)


_past = _PastLimit()


def _lift_limits(torch):
    """The default back-end: `--capacity` and the job's own memory fraction are recorded, not
    applied (see the module documentation)."""
    cap = _capacity_bytes()
    original = torch.cuda.set_per_process_memory_fraction

    def set_per_process_memory_fraction(fraction, device=None):
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        torch.cuda._lazy_init()
        dev = torch.cuda.current_device() if device is None else torch.cuda._utils._get_device_index(device)
        if cap:
            _say(f"the job's memory fraction {fraction} is not applied either: --capacity {_gib(cap)} is the limit "
                 "recorded")
            return
        # As PyTorch computes its cap: the fraction of the total that cudaMemGetInfo reports.
        total = torch.cuda.mem_get_info(dev)[1]
        _past.set(torch, dev, int(fraction * total), f"the job's memory fraction {fraction}")

    set_per_process_memory_fraction.__wrapped__ = original
    set_per_process_memory_fraction.__doc__ = original.__doc__
    torch.cuda.set_per_process_memory_fraction = set_per_process_memory_fraction
    torch.cuda.memory.set_per_process_memory_fraction = set_per_process_memory_fraction


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
            _past.tick("forward")


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


def _after_step(opt, args, kwargs):
    mark("after optimizer step")
    _past.tick("step")


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
        optim.register_optimizer_step_post_hook(_after_step)
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
            if _past.limits:
                meta["capacity"] = next(iter(_past.limits.values()))
            with open(base + ".json", "w") as f:
                json.dump(meta, f)
        except Exception as e:  # never break the program
            _say(f"could not write PyTorch's allocator history: {e}")

    atexit.register(dump, "exit")
    _past.stop_hooks.append(lambda: dump("the stop past the limit"))
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


class _Sites:
    """The call sites of --stacks: a background thread that takes the GIL and resolves the
    stacks PyTorch gathered (the helper gave each an id under PyTorch's lock) in batches, and
    hands their frames to the recorder. PyTorch's allocator lock is never held here, and the
    helper never takes the GIL under it."""

    def __init__(self, helper):
        import threading

        self.helper = helper
        self.pid = os.getpid()
        self.stopping = False
        self.failed = False
        self.thread = threading.Thread(target=self._run, name="alloctrace-callsites", daemon=True)
        self.thread.start()

    def _resolve(self):
        try:
            self.helper.resolve_sites()
        except Exception as e:  # never break the program; those sites are recorded as none
            if not self.failed:
                self.failed = True
                _say(f"could not resolve some call sites: {e}")

    def _run(self):
        while not self.stopping:
            # Waits without the GIL; a batch builds up while this thread waits for it.
            if self.helper.wait_sites(0.5) and not self.stopping:
                self._resolve()

    def close(self):
        """Stops the thread and resolves what is left, in this thread (which holds the GIL),
        before the recorder closes its traces. A forked child has no thread to stop."""
        if os.getpid() != self.pid or self.stopping:
            return
        import threading

        self.stopping = True
        self.helper.stop_sites()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        self._resolve()


def _start_pytorch(torch):
    global _installed, _sites
    try:
        cap = _capacity_bytes()
        if cap and not _past.limits:
            _past.set(torch, torch.cuda.current_device(), cap, "--capacity")
        stacks = os.environ.get("ALLOCTRACE_STACKS") == "1"
        try:
            helper = _build_helper(torch)
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
            _start_history(torch, f"cannot build alloctrace's PyTorch helper ({first})")
            return
        lib = _library()
        # --stacks: PyTorch gathers the stacks (before its lock) only while its history records
        # context.
        history = stacks or _trackers_need_history(torch, helper)
        helper.attach(ctypes.cast(lib.alloctrace_torch_event, ctypes.c_void_p).value)
        if stacks:
            helper.attach_sites(
                ctypes.cast(lib.alloctrace_torch_event_at, ctypes.c_void_p).value,
                ctypes.cast(lib.alloctrace_define_callsite, ctypes.c_void_p).value,
            )
            _sites = _Sites(helper)
        if history:
            torch.cuda.memory._record_memory_history(
                max_entries=1, context="alloc" if stacks else None, stacks="python"
            )
        _installed = True
        for dev, limit in _past.limits.items():
            lib.alloctrace_set_capacity(dev, limit)
        atexit.register(shutdown)
        _past.stop_hooks.append(shutdown)
        _chain_sigterm(shutdown)
    except Exception as e:  # never break the program
        _say(f"cannot record, the job runs natively: {e}")


def _install_pytorch(torch):
    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        major, minor = 0, 0
    if (major, minor) < (2, 1) or not hasattr(torch.cuda, "memory") or not hasattr(torch.cuda, "_lazy_call"):
        _say(f"PyTorch {torch.__version__} is too old to record (2.1 or later is needed): the job runs natively")
        return
    try:
        _lift_limits(torch)
    except Exception as e:  # never break the program
        _say(f"cannot lift the memory limit, the job runs under it: {e}")
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
    # The recorder keeps the release in the trace's header, and replays follow its allocator.
    os.environ.setdefault("ALLOCTRACE_TORCH_VERSION", str(getattr(torch_module, "__version__", "")))
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
