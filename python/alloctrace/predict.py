"""Will it fit? The request stream of a training or inference step that has not run, taken on
CPU under PyTorch's `FakeTensorMode` (no GPU memory for the step; where a GPU is visible, each
operator runs on it once, alone, to measure its kernels' scratch), written as a PyTorch snapshot
pickle that every `alloctrace` command reads, marked as predicted:

    import alloctrace

    def make_step():                        # called once, under fake tensors
        model = torchvision.models.resnet18().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step(x, y):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        return step

    alloctrace.predict(make_step, torch.empty(64, 3, 224, 224), torch.zeros(64, dtype=torch.long),
                       out="predicted.pickle")
    # then: alloctrace explain predicted.pickle --capacity 80GiB; alloctrace whatif ...

What the stream holds (one entry per caching-allocator request, stream 0):
- every device storage an operator creates, at its birth, and its free when PyTorch frees it
  (the storage's last reference goes), with the phase (forward, backward, optimizer) and the
  module or autograd node that made it;
- the requests that kernels make through the caching allocator and fake tensors do not, where
  PyTorch's source gives their size (`aten/src/ATen/cuda/CublasHandlePool.cpp`): the cuBLAS
  workspace, one per cuBLAS handle and stream, made at the first matrix product of a thread
  (forward on the calling thread, backward on the autograd engine's device thread, so a
  training step has two), of `CUBLAS_WORKSPACE_CONFIG` bytes (`:SIZE:COUNT` pairs, SIZE KiB
  each; default 32 MiB on compute capability 9.0, else 4096 KiB * 2 + 16 KiB * 8), kept for
  the process; and the cuBLASLt workspace, one per handle and stream, made at the first
  `addmm` with a bias vector (the cuBLASLt path), of `CUBLASLT_WORKSPACE_SIZE` KiB (default
  1024), at most the cuBLAS workspace, or none with `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`.

Kernel scratch, measured where a GPU is visible (`probe`): cuDNN picks a convolution's plan, and
so its workspace, at run time (`run_single_conv` in Conv_v8.cpp); fused attention's backward,
multi-block reductions (a global buffer and semaphores in Reduce.cuh) and sorts allocate inside
the kernel; their sizes are not in PyTorch's source. Where PyTorch sees a CUDA device, every
ATen operator with a tensor input is run once per distinct signature (shapes, strides, dtypes,
arguments) on that device, on zero-filled tensors of the fake ones' layout, with the
allocator's history on: what it allocates and frees before returning is its scratch, written
into the stream in the order the kernels made it, between its outputs. An operator that took
scratch runs once more, since cuDNN's first call of a convolution tries plans and caches the
one that ran: the first call in the stream takes the first run's scratch, later calls the
second's. Only one operator's tensors are
on the device at a time. Without a device (or with `probe=False`) the operators known to take
scratch are counted as not modelled, and the prediction is a lower bound. A probed cuDNN
workspace is taken as needed: where it would not fit, PyTorch tries the next plan
(`try_configs`), so at a tight limit the prediction can say "runs out" where the job completes.
Scratch that depends on the values (a sort's, say) is measured on zeros.

The autograd engine sums two gradients for one input in place (`accumulate` in
input_buffer.cpp) where it holds the last reference, but never for a tensor subclass, so under
fake tensors it allocates the sum: the stream gives the sum the old gradient's storage instead.

Not modelled (see `NOT_MODELLED`): the scratch above without a device, where the CUDA driver
places each segment (the replay's device places them its own way), NCCL buffers and anything
outside the caching allocator.
What cannot run under fake tensors (data-dependent shapes, `.item()`, custom CUDA extensions)
raises `PredictionError` with one line saying why and pointing to `alloctrace record`.
"""

import os
import pickle
import re
import sys
import threading
import weakref

__all__ = ["predict", "largest_batch", "settings", "PredictionError", "MODELLED", "NOT_MODELLED", "PROBED"]

MODELLED = (
    "device storages made by operators (parameters, activations, gradients, optimizer state, inputs)",
    "cuBLAS workspace per handle and stream (CUBLAS_WORKSPACE_CONFIG; 32 MiB on compute capability 9.0)",
    "cuBLASLt workspace per handle and stream at the first addmm with a bias (CUBLASLT_WORKSPACE_SIZE, 1 MiB)",
    "the autograd engine's in-place sum of two gradients for one input (input_buffer.cpp), which fake "
    "tensors make out of place",
)
PROBED = (
    "kernel scratch (cuDNN workspaces, fused attention, reduction buffers), measured by running each "
    "ATen operator once per signature on the visible GPU"
)
NOT_MODELLED = (
    "without a GPU to probe on: cuDNN workspaces (convolutions, cuDNN attention), which cuDNN picks at run "
    "time, and the scratch kernels allocate inside themselves (reductions, sorts, fused attention backward); "
    "a prediction that meets them is then a lower bound",
    "with one: a cuDNN workspace that would not fit, where PyTorch tries the next plan (try_configs in "
    "Conv_v8.cpp); scratch sizes that depend on values (measured on zeros)",
    "where the CUDA driver places each segment, which breaks the allocator's ties between equal free blocks",
    "NCCL and other communication buffers, and memory outside PyTorch's caching allocator",
    "data-dependent shapes and values (.item(), nonzero, masked indexing): the step cannot run",
    "custom CUDA extensions without a fake (meta) implementation: the step cannot run",
    "storages that grow in place (resize_, out= arguments): only their first size is seen",
)

PREDICTED_KEY = "alloctrace_predicted"
_RECORD_HINT = "record the real job instead: alloctrace record -o run.atrace --capacity LIMIT -- python train.py"


class PredictionError(RuntimeError):
    """The step cannot run under fake tensors; the message says why in one line."""


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}


def _bytes(v):
    if v is None or isinstance(v, int):
        return v
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(v))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError("cannot read %r as a size (e.g. 80GiB, 24GB, 1073741824)" % (v,))
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _cublas_workspace_bytes(compute_capability):
    """`parseChosenWorkspaceSize` of CublasHandlePool.cpp: the sum of SIZE KiB * COUNT over the
    `:SIZE:COUNT` pairs of CUBLAS_WORKSPACE_CONFIG, else 32 MiB on sm_90, else 4096 KiB * 2 +
    16 KiB * 8."""
    default = 4096 * 8 * 1024 if tuple(compute_capability) == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8
    val = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if val is None:
        return default
    pairs = re.findall(r":([0-9]+):([0-9]+)", val)
    if not pairs:
        return default
    return sum(int(s) * 1024 * int(c) for s, c in pairs)


def _cublaslt_workspace_bytes(cublas_bytes):
    """`getCUDABlasLtWorkspaceSize`: CUBLASLT_WORKSPACE_SIZE KiB (default 1024), at most the
    cuBLAS workspace; 0 when TORCH_CUBLASLT_UNIFIED_WORKSPACE is set true (the cuBLAS
    workspace is then shared, `getCUDABlasLtWorkspace`)."""
    if os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").strip().lower() in ("1", "true", "on", "yes", "y"):
        return 0
    try:
        kib = int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024"))
    except ValueError:
        kib = 1024
    return min(kib * 1024, cublas_bytes)


class _Probe:
    """The scratch an operator's CUDA kernels take from the caching allocator, measured on the
    visible GPU: the operator runs once per signature on zero-filled tensors laid out as the
    fake ones, with the allocator's history on, and where it took scratch, once more: cuDNN's
    first call of a convolution tries plans and caches one, so the first call and the later
    ones can differ. Each gives, in the order the kernels made them, ("alloc", n, size) and
    ("free", n) for the blocks allocated and freed before returning, and ("out", size) for
    those kept (the outputs); [] where nothing was freed (no scratch); None where the run
    failed."""

    def __init__(self, torch):
        self.torch = torch
        self.cache = {}
        self.device = torch.cuda.get_device_name(torch.cuda.current_device())

    def wanted(self, func, args, kwargs):
        """ATen operators with a tensor input, all of them strided: factories allocate only their
        outputs; other namespaces (collectives, custom extensions), assertions and sampling
        (which on zeros would stop the device with an assertion) are not run."""
        torch = self.torch
        if getattr(func, "namespace", None) != "aten" or func is torch.ops.aten._local_scalar_dense.default:
            return False
        name = str(func)
        if "assert" in name or "multinomial" in name:
            return False
        tensors = [x for x in torch.utils._pytree.tree_leaves((args, kwargs or {})) if isinstance(x, torch.Tensor)]
        return bool(tensors) and all(x.layout == torch.strided for x in tensors)

    def signature(self, func, args, kwargs):
        """What makes two calls one probe: the operator, the arguments' structure, each tensor's
        layout, dtype and device, which tensors share a storage, and every other argument but
        floats (a learning rate changes each step, the memory does not)."""
        torch = self.torch
        leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs or {}))
        storages = {}

        def one(x):
            if isinstance(x, torch.Tensor):
                shared = storages.setdefault(x.untyped_storage()._cdata, len(storages))
                return ("T", tuple(x.shape), tuple(x.stride()), x.storage_offset(), str(x.dtype), x.device.type,
                        shared)
            if isinstance(x, float):
                return ("F",)
            return ("V", repr(x))

        return (str(func), str(spec)) + tuple(one(x) for x in leaves)

    def scratch(self, func, args, kwargs, seen):
        """The scratch of this call; `seen` holds the signatures the run has called before."""
        try:
            key = self.signature(func, args, kwargs)
        except Exception:  # noqa: BLE001 -- a tensor without strides or storage: not modelled
            return None
        if key not in self.cache:
            try:
                self.cache[key] = self._measure(func, args, kwargs)
            except Exception:  # noqa: BLE001 -- the operator is then counted as not modelled
                self.cache[key] = None
                self.torch.cuda.empty_cache()
        got = self.cache[key]
        if got is None:
            return None
        first = key not in seen
        seen.add(key)
        return got[0] if first else got[1]

    def _measure(self, func, args, kwargs):
        """(first, later): the scratch of the signature's first call in a process (cuDNN tries
        its heuristics' plans and caches the one that ran) and of the calls after it."""
        torch = self.torch
        from torch.utils._python_dispatch import _disable_current_modes

        fake_type = torch._subclasses.fake_tensor.FakeTensor
        bases = {}  # one zero-filled storage per fake storage, so that views share it as the fakes do

        def real(x, host=False):
            if not isinstance(x, fake_type):
                return x
            device = "cpu" if host or x.device.type == "meta" else x.device
            key = (x.untyped_storage()._cdata, str(device))
            if key not in bases:
                nbytes = x.untyped_storage().nbytes()
                bases[key] = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=device).untyped_storage()
            t = torch.empty(0, dtype=x.dtype, device=device)
            return t.set_(bases[key], x.storage_offset(), tuple(x.shape), tuple(x.stride()))

        mem = torch.cuda.memory
        dev = torch.cuda.current_device()

        def recorded(rargs, rkwargs):
            try:
                mem._record_memory_history(enabled="all", context=None, stacks="python", max_entries=1 << 20,
                                           clear_history=True)
            except TypeError:  # a PyTorch without clear_history
                mem._record_memory_history(enabled="all", context=None, stacks="python", max_entries=1 << 20)
            try:
                start = len(mem._snapshot()["device_traces"][dev])
                out = func(*rargs, **rkwargs)
                torch.cuda.synchronize()
                trace = mem._snapshot()["device_traces"][dev][start:]
                del out
            finally:
                mem._record_memory_history(enabled=None)
            return _scratch_of(trace)

        # The random-number seed and offset of flash and memory-efficient attention: their CUDA
        # forward makes them on the CPU (outside graph capture) and the backward reads them on
        # the host, but the fake forward makes them on "meta" or on the device.
        names = [a.name for a in func._schema.arguments]
        host = {"philox_seed", "philox_offset"} if ("flash" in str(func) or "efficient" in str(func)) else set()
        with _disable_current_modes(), torch.no_grad():
            rargs = [real(x, i < len(names) and names[i] in host) for i, x in enumerate(args)]
            rkwargs = {k: real(v, k in host) for k, v in (kwargs or {}).items()}
            rargs, rkwargs = torch.utils._pytree.tree_map(real, (rargs, rkwargs))
            torch.cuda.synchronize()
            first = recorded(rargs, rkwargs)
            later = recorded(rargs, rkwargs) if first else []
            del rargs, rkwargs
            bases.clear()
            torch.cuda.empty_cache()
        return first, later


def _dense(sizes, strides):
    """`compute_non_overlapping_and_dense` (c10/core/Contiguity.h): the dimensions, ordered by
    stride, are laid out one after another with no gap and no overlap."""
    if len(sizes) == 1:
        return sizes[0] < 2 or strides[0] == 1
    expected = 1
    for size, stride in sorted(zip(sizes, strides), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _scratch_of(trace):
    """A probe's allocator history as ("alloc", n, size), ("free", n) and ("out", size); []
    where nothing was allocated and freed within it. Each allocation is its own n (the allocator
    may hand a freed block's address to the next request), and it is scratch only if its own
    block is freed before the operator returns."""
    allocs, open_at, freed_at = [], {}, {}
    for pos, e in enumerate(trace):
        if e["action"] == "alloc":
            open_at[e["addr"]] = len(allocs)
            allocs.append((pos, e["size"]))
        elif e["action"] == "free_requested" and e["addr"] in open_at:
            freed_at[pos] = open_at.pop(e["addr"])
    scratch = set(freed_at.values())
    if not scratch:
        return []
    seq, n = [], 0
    for pos, e in enumerate(trace):
        if e["action"] == "alloc":
            if n in scratch:
                seq.append(("alloc", n, e["size"]))
            else:
                seq.append(("out", e["size"]))
            n += 1
        elif pos in freed_at:
            seq.append(("free", freed_at[pos]))
    return seq


class _Recorder:
    """The caching-allocator requests of one fake run, as PyTorch snapshot trace entries."""

    def __init__(self, torch, compute_capability, probe=None):
        self.torch = torch
        self.entries = []
        self.annotations = []
        self.clock = 0
        self.next_addr = 0x7F0000000000
        self.live = {}  # storage key -> (addr, size)
        self.frames = {}  # (where, op) -> frames list, shared so the pickle stores each once
        self.workspaces = set()
        self.modules = []
        self.names = {}
        self.optimizer_depth = 0
        self.phase = None
        self.forward_seen = False
        # The phase outside modules, autograd and optimizers: "setup" while the model and the
        # inputs are built, "other" in the steps (inputs, the loss outside modules, zero_grad).
        self.outside = "setup"
        self.cublas_bytes = _cublas_workspace_bytes(compute_capability)
        self.cublaslt_bytes = _cublaslt_workspace_bytes(self.cublas_bytes)
        aten = torch.ops.aten
        self.blas_ops = {
            getattr(aten, n).default
            for n in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "_addmm_activation")
            if hasattr(aten, n)
        }
        self.lt_ops = {getattr(aten, n).default for n in ("addmm", "_addmm_activation") if hasattr(aten, n)}
        # Operators whose CUDA kernels take memory from the caching allocator that their fake
        # version does not show, in amounts not derivable from PyTorch's source.
        self.unmodelled_ops = {}
        for names, what in (
            (("convolution", "convolution_backward", "cudnn_convolution", "cudnn_convolution_transpose"),
             "cuDNN convolution workspaces"),
            (("_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
              "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
              "_flash_attention_backward", "_efficient_attention_backward"),
             "fused attention scratch"),
            (("cudnn_batch_norm", "cudnn_batch_norm_backward", "_cudnn_rnn", "_cudnn_rnn_backward"),
             "cuDNN batch-norm/RNN workspaces"),
        ):
            for n in names:
                if hasattr(aten, n):
                    self.unmodelled_ops[getattr(aten, n).default] = what
        self.unmodelled = {}
        self.probe = probe
        self.probed = {}
        self.scratch_ids = 0
        self.probed_signatures = set()
        self.accumulating = None  # (sum's storage, old gradient's storage, the sum's entry)
        self.unmatched = []  # (operator, bytes): what a probe kept that no fake output matches
        self.lock = threading.RLock()  # a finalizer may run inside a locked block (a GC)

    # -- clock, entries ------------------------------------------------------------------------
    def tick(self):
        self.clock += 1
        return self.clock

    def _frames(self, where, op):
        key = (where, op)
        f = self.frames.get(key)
        if f is None:
            f = [{"filename": where, "line": 0, "name": op}]
            self.frames[key] = f
        return f

    def alloc(self, size, where, op):
        addr = self.next_addr
        self.next_addr += (size + 511) // 512 * 512 + 512
        self.entries.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": self.tick(),
                             "frames": self._frames(where, op)})
        return addr

    def free(self, key):
        with self.lock:
            acc, self.accumulating = self.accumulating, None
            if acc and key == acc[1] and acc[2] == len(self.entries) - 1 and key in self.live and acc[0] in self.live:
                # The sum's storage is the old gradient's, as in PyTorch: no request for it.
                self.entries.pop()
                self.live.pop(acc[0])
                self.live[acc[0]] = self.live.pop(key)
                return
            got = self.live.pop(key, None)
            if got is None:
                return
            addr, size = got
            for action in ("free_requested", "free_completed"):
                self.entries.append({"action": action, "addr": addr, "size": size, "stream": 0,
                                     "time_us": self.tick(), "frames": []})

    def annotate(self, name, stage):
        self.annotations.append({"name": name, "stage": stage, "device": 0, "time_us": self.tick()})

    # -- phases --------------------------------------------------------------------------------
    def current_phase(self):
        if self.torch._C._current_autograd_node() is not None:
            return "backward"
        if self.optimizer_depth:
            return "optimizer"
        if self.modules or self.forward_seen:
            return "forward"
        return self.outside

    def set_phase(self, phase):
        if phase == self.phase:
            return
        if self.phase is not None:
            self.annotate(self.phase, "END")
        self.phase = phase
        self.annotate(phase, "START")
        if phase == "forward":
            self.forward_seen = True
        elif phase in ("backward", "optimizer"):
            self.forward_seen = False

    def where(self, phase):
        if phase == "backward":
            node = self.torch._C._current_autograd_node()
            return "backward " + (node.name() if node is not None else "")
        if self.modules:
            return self.modules[-1]
        return phase

    # -- hooks ---------------------------------------------------------------------------------
    def module_pre(self, module, args):
        if not self.modules and id(module) not in self.names:
            for n, m in module.named_modules():
                self.names.setdefault(id(m), n)
        name = self.names.get(id(module))
        kind = type(module).__name__
        self.modules.append("%s (%s)" % (name, kind) if name else kind)

    def module_post(self, module, args, output):
        if self.modules:
            self.modules.pop()

    def optimizer_pre(self, opt, args, kwargs):
        self.optimizer_depth += 1

    def optimizer_post(self, opt, args, kwargs):
        self.optimizer_depth = max(0, self.optimizer_depth - 1)

    # -- operators -----------------------------------------------------------------------------
    def op(self, func, args, kwargs, out):
        torch = self.torch
        self.accumulating = None
        phase = self.current_phase()
        self.set_phase(phase)
        where = self.where(phase)
        opname = str(func)
        tensors = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        on_device = [t for t in tensors if t.device.type == "cuda"]
        probing = bool(on_device and self.probe and self.probe.wanted(func, args, kwargs))
        with self.lock:
            seq = self.probe.scratch(func, args, kwargs, self.probed_signatures) if probing else None
        if on_device and func in self.unmodelled_ops:
            what = self.unmodelled_ops[func]
            if seq is None:
                self.unmodelled[what] = self.unmodelled.get(what, 0) + 1
            else:
                self.probed[what] = self.probed.get(what, 0) + 1
        elif probing and seq is None:
            what = "kernel scratch of operators that failed to run on the GPU"
            self.unmodelled[what] = self.unmodelled.get(what, 0) + 1
        elif seq:
            what = "other kernels' scratch (reductions, sorts)"
            self.probed[what] = self.probed.get(what, 0) + 1
        storages = []
        for t in on_device:
            try:
                st = t.untyped_storage()
            except Exception:  # a tensor without storage (sparse, nested): not modelled
                continue
            storages.append(st)
        if not seq:
            for st in storages:
                self.output(st, where, opname)
            if phase == "backward" and func is torch.ops.aten.add.Tensor:
                self.accumulation(args, kwargs, out)
            return self.blas(func, args, kwargs, phase, on_device, opname)
        # The probed order: each output where the kernels allocated one of its size, the
        # scratch between them; outputs the probe did not see (views, aliases) at the end.
        keys = {}
        for ev in seq:
            if ev[0] == "out":
                for i, st in enumerate(storages):
                    if st.nbytes() == ev[1]:
                        self.output(storages.pop(i), where, opname)
                        break
                else:
                    self.unmatched.append((opname, ev[1]))
            elif ev[0] == "alloc":
                with self.lock:
                    self.scratch_ids += 1
                    keys[ev[1]] = ("scratch", self.scratch_ids)
                    self.live[keys[ev[1]]] = (self.alloc(ev[2], where, opname + " scratch (probed)"), ev[2])
            else:
                self.free(keys.pop(ev[1]))
        for k in keys.values():
            self.free(k)
        for st in storages:
            self.output(st, where, opname)
        self.blas(func, args, kwargs, phase, on_device, opname)

    def accumulation(self, args, kwargs, out):
        """The autograd engine sums two gradients for one input (`accumulate` in
        input_buffer.cpp) in place, `old.add_(new)`, where grad mode is off and it holds the
        last reference to a dense `old`; but never for a tensor subclass, so under fake tensors
        it allocates `old + new` and drops `old`. Where the sum's request is the last one and
        `old`'s storage is freed next, that free gives its storage to the sum instead. (A sum of
        two temporaries in a backward formula, `a*b + c*d`, whose first dies at once, looks the
        same from here and is taken for one too.)"""
        torch = self.torch
        if torch.is_grad_enabled() or kwargs or len(args) != 2:
            return
        old, new = args
        if not all(isinstance(t, torch.Tensor) and t.layout == torch.strided for t in (old, new, out)):
            return
        if old.shape != out.shape or old.dtype != out.dtype or old.device != out.device:
            return
        if not _dense(old.shape, old.stride()):
            return
        old_key = old.untyped_storage()._cdata
        if old_key == new.untyped_storage()._cdata:  # one storage twice (x + x): not the last reference
            return
        key = out.untyped_storage()._cdata
        with self.lock:
            if key in self.live and self.entries and self.entries[-1]["addr"] == self.live[key][0]:
                self.accumulating = (key, old_key, len(self.entries) - 1)

    def output(self, st, where, opname):
        """An operator's output storage, from its birth to the last reference's going."""
        key = st._cdata
        with self.lock:
            if key in self.live:
                return
            size = st.nbytes()
            if size == 0:
                return
            self.live[key] = (self.alloc(size, where, opname), size)
        weakref.finalize(st, self.free, key)

    def blas(self, func, args, kwargs, phase, on_device, opname):
        """The cuBLAS and cuBLASLt workspaces a matrix product makes at its handle's first use."""
        if func in self.blas_ops and on_device:
            if phase == "backward":
                thread = "autograd device thread"
            elif threading.get_ident() == threading.main_thread().ident:
                thread = "main thread"
            else:
                thread = "thread %d" % threading.get_ident()
            self.workspace(("cuBLAS", thread), self.cublas_bytes, opname)
            if func in self.lt_ops and self.cublaslt_bytes and self._lt_path(args, kwargs):
                self.workspace(("cuBLASLt", thread), self.cublaslt_bytes, opname)

    def workspace(self, key, size, opname):
        """A workspace kept for the process, one per handle and stream (a handle per thread)."""
        if key in self.workspaces:
            return
        self.workspaces.add(key)
        with self.lock:
            self.live[key] = (self.alloc(size, "%s workspace (%s, stream 0)" % key, opname), size)

    def finish(self):
        """The process ends: what is still live (parameters, workspaces) is freed, so that the
        snapshot's empty final state agrees with its trace; annotations made before the first
        request take its time."""
        for key in list(self.live):
            self.free(key)
        first = self.entries[0]["time_us"] if self.entries else 0
        for a in self.annotations:
            a["time_us"] = max(a["time_us"], first)

    def _lt_path(self, args, kwargs):
        """addmm's cuBLASLt path (`isInputCompliesAddmmCudaLt` in Blas.cpp): beta 1, a contiguous
        1-D bias as long as the product's columns, double, float, half or bfloat16 operands with
        both dimensions above 1, and DISABLE_ADDMM_CUDA_LT not set to 1."""
        torch = self.torch
        if os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1" or len(args) < 3:
            return False
        bias, mat1, mat2 = args[0], args[1], args[2]
        if not all(isinstance(t, torch.Tensor) for t in (bias, mat1, mat2)):
            return False
        if (kwargs or {}).get("beta", 1) != 1:
            return False
        return (bias.dim() == 1 and mat1.dim() == 2 and mat2.dim() == 2 and bias.shape[0] == mat2.shape[1]
                and bias.is_contiguous()
                and mat1.dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)
                and min(mat1.shape) > 1 and min(mat2.shape) > 1)


def _mode_class(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Watch(TorchDispatchMode):
        def __init__(self, rec):
            super().__init__()
            self.rec = rec

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.rec.op(func, args, kwargs, out)
            return out

    return _Watch


def _why(e):
    """One line: why the step cannot run under fake tensors."""
    name = type(e).__name__
    text = str(e).strip().splitlines()[0] if str(e).strip() else name
    low = (name + " " + str(e)).lower()
    if "hasprimarycontext" in low:
        return ("the step cannot run under fake tensors here: PyTorch's autograd engine asks the CUDA driver "
                "about the device even for fake tensors, so a backward pass needs a machine where PyTorch sees "
                "a CUDA device (no GPU memory is used; forward-only steps run anywhere); or "
                + _RECORD_HINT)
    if "local_scalar_dense" in low or "item()" in low:
        cause = ("a value read back from a tensor (.item(), bool() or int()); one read while the model is built "
                 "on CPU (timm's drop-path rates) can be computed outside fake tensors with "
                 "torch._subclasses.fake_tensor.unset_fake_temporarily()")
    elif "dynamicoutputshape" in low or "data-dependent" in low or "datadependent" in low:
        cause = "a data-dependent output shape (nonzero, masked indexing, unique)"
    elif "unsupportedoperatorexception" in low or "no fake" in low or "meta" in low:
        cause = "an operator without a fake (meta) implementation (a custom CUDA extension?)"
    elif "nccl" in low or "process group" in low or "distributed" in low:
        cause = "collective communication (NCCL buffers are outside what is predicted)"
    else:
        cause = "%s: %s" % (name, text[:160])
    return "the step cannot run under fake tensors: %s; %s" % (cause, _RECORD_HINT)


def _to_fake(torch, mode, x):
    if isinstance(x, torch.Tensor):
        fake = mode.from_tensor(x) if not isinstance(x, torch._subclasses.fake_tensor.FakeTensor) else x
        return fake.to("cuda")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_fake(torch, mode, v) for v in x)
    if isinstance(x, dict):
        return {k: _to_fake(torch, mode, v) for k, v in x.items()}
    return x


def _probe_for(torch, probe):
    """The kernel-scratch probe: `probe` None (where PyTorch sees a CUDA device), True (one is
    required) or False (none), or a `_Probe` to share."""
    if isinstance(probe, _Probe) or probe is False:
        return probe or None
    if torch.cuda.is_available():
        return _Probe(torch)
    if probe:
        raise PredictionError("probe=True needs a CUDA device that PyTorch sees, to measure kernel scratch on")
    return None


def _run(make_step, make_inputs, steps, compute_capability, probe=None):
    """Runs `steps` fake steps; returns the recorder. `make_inputs()` is called under the mode."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec = _Recorder(torch, compute_capability, _probe_for(torch, probe))
    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(rec.module_pre),
        torch.nn.modules.module.register_module_forward_hook(rec.module_post),
        register_optimizer_step_pre_hook(rec.optimizer_pre),
        register_optimizer_step_post_hook(rec.optimizer_post),
    ]
    lazy_init, swap, bf16 = torch.cuda._lazy_init, torch.utils.swap_tensors, torch.cuda.is_bf16_supported
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def swap_tensors(t1, t2):
        # `module.cuda()` swaps fake parameters, which refuses tensors with weak references; the
        # fake-tensor converter's memo holds some (it only maps real tensors to fakes).
        mode.fake_tensor_converter.meta_converter.tensor_memo.clear()
        return swap(t1, t2)

    try:
        # Without a visible GPU, PyTorch's CUDA initialisation would fail and fake tensors need
        # none; where PyTorch sees one, CUDA initialises as usual (device queries need it).
        if not torch.cuda.is_available():
            torch.cuda._lazy_init = lambda: None
            # autocast(dtype=bfloat16) asks; PyTorch's answer for the device predicted for.
            torch.cuda.is_bf16_supported = lambda *a, **k: tuple(compute_capability) >= (8, 0)
        torch.utils.swap_tensors = swap_tensors
        with mode, _mode_class(torch)(rec):
            rec.set_phase("setup")
            step = make_step()
            inputs = make_inputs(mode)
            rec.modules.clear()
            rec.outside = "other"
            for i in range(steps):
                rec.forward_seen = False
                rec.set_phase("other")
                rec.annotate("iteration %d" % i, "START")
                step(*inputs)
                rec.modules.clear()
            rec.outside = "end"
            rec.set_phase("end")
            del step, inputs
        import gc

        gc.collect()
        rec.finish()
    except PredictionError:
        raise
    except Exception as e:  # noqa: BLE001 -- every failure under fake tensors is reported so
        raise PredictionError(_why(e)) from e
    finally:
        torch.cuda._lazy_init, torch.utils.swap_tensors, torch.cuda.is_bf16_supported = lazy_init, swap, bf16
        for h in hooks:
            h.remove()
    return rec


def _write(rec, out, capacity, conf, description):
    import torch

    snapshot = {
        "segments": [],
        "device_traces": [rec.entries],
        "external_annotations": rec.annotations,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf or ""},
        PREDICTED_KEY: {
            "by": "alloctrace.predict under FakeTensorMode (torch %s)" % torch.__version__,
            "what": description,
            "capacity_bytes": capacity or 0,
            "modelled": list(MODELLED) + ([PROBED + " (%s)" % rec.probe.device] if rec.probed else []),
            "not_modelled": list(NOT_MODELLED),
            # What a probe's kernels kept that no fake output matched in size (operator, bytes).
            "probe_unmatched_outputs": [list(x) for x in rec.unmatched[:64]],
        },
    }
    out = os.path.abspath(os.fspath(out))
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    os.replace(tmp, out)
    return out


def predict(make_step, *example_inputs, steps=3, capacity="80GiB", conf=None, out=None,
            compute_capability=(9, 0), explain=True, probe=None):
    """Predicts a step's GPU memory without running it on a GPU.

    `make_step()` builds the model and optimizer on "cuda" and returns the step function; it is
    called once under fake tensors, so parameters are predicted too. `example_inputs` are
    tensors (any device; only their shape and dtype are used) moved to "cuda" before the first
    step and kept for every step, or one callable taking nothing that returns the inputs,
    called under fake tensors. The step runs `steps` times.

    Writes a predicted snapshot to `out` (default: a file in the temporary folder) and returns
    a dict: `path`, `requests` (allocations recorded), and with `explain`, `explain` (the
    `alloctrace explain --json` answer at `capacity` under `conf`, PYTORCH_CUDA_ALLOC_CONF
    syntax), `whatif` (`alloctrace whatif --json`), `settings` (from whatif: for each setting
    its peaks, fragmentation, whether it fits and its headroom, see `settings()`) and
    `most_headroom` (the fitting setting with the lowest peak reserved, or None).
    `compute_capability` picks the cuBLAS workspace default (PyTorch's rule: 32 MiB on 9.0).
    `probe`: measure kernel scratch (cuDNN workspaces, fused attention) on the visible GPU; None
    does so where PyTorch sees a CUDA device, False never (those operators then make the
    prediction a lower bound), True requires a device. Only one operator's tensors are on the
    device at a time; probing turns the allocator's memory history on and off, so a history the
    process was recording is cleared.
    Raises PredictionError when the step cannot run under fake tensors.
    """
    capacity = _bytes(capacity)
    if len(example_inputs) == 1 and callable(example_inputs[0]) and not _is_tensor(example_inputs[0]):
        build = example_inputs[0]

        def make_inputs(mode):
            got = build()
            return tuple(got) if isinstance(got, (list, tuple)) else (got,)
    else:
        def make_inputs(mode):
            import torch

            return tuple(_to_fake(torch, mode, x) for x in example_inputs)

    rec = _run(make_step, make_inputs, steps, compute_capability, probe)
    if out is None:
        import tempfile

        fd, out = tempfile.mkstemp(prefix="alloctrace-predicted-", suffix=".pickle")
        os.close(fd)
    path = _write(rec, out, capacity, conf, _describe(make_step, steps, rec))
    result = {"path": path, "requests": sum(1 for e in rec.entries if e["action"] == "alloc")}
    if explain:
        result["whatif"] = _whatif(path, capacity, conf)
        result["explain"] = _explain(path, capacity, conf)
        result["settings"], result["most_headroom"] = settings(result["whatif"])
    return result


def settings(whatif):
    """From `alloctrace whatif --json`: {setting: {fits, peak_allocated_bytes,
    peak_reserved_bytes, fragmentation, headroom_bytes}} (headroom: the capacity less the peak
    reserved, None without a capacity), and the fitting setting with the lowest peak reserved.
    `fits` is None (cannot tell) where the replay completes but the prediction is a lower bound
    (whatif's `lower_bound`: the step used memory that is not predicted, such as cuDNN
    workspaces); then no setting is said to fit."""
    cap = whatif.get("capacity_bytes")
    lower = whatif.get("lower_bound", False)
    table = {}
    for r in whatif["rows"]:
        completes = r["reach"] == "completes"
        table[r["policy"]] = {
            "fits": None if completes and lower else completes,
            "peak_allocated_bytes": r["peak_allocated_bytes"],
            "peak_reserved_bytes": r["peak_reserved_bytes"],
            "fragmentation": r["fragmentation"],
            "headroom_bytes": cap - r["peak_reserved_bytes"] if cap else None,
        }
    fitting = [k for k, v in table.items() if v["fits"] is True]
    best = min(fitting, key=lambda k: (table[k]["peak_reserved_bytes"], k != "recorded")) if fitting else None
    return table, best


def _describe(make_step, steps, rec):
    """What the header note says: the step, and what it used that is not modelled."""
    text = "%s, %d steps" % (getattr(make_step, "__name__", "step"), steps)
    if rec.probed:
        text += "; kernel scratch measured on %s: %s" % (rec.probe.device, ", ".join(
            "%s (%d calls)" % (k, v) for k, v in sorted(rec.probed.items())))
    if rec.unmodelled:
        text += "; not modelled here, so reserved memory may be under-predicted: " + ", ".join(
            "%s (%d calls)" % (k, v) for k, v in sorted(rec.unmodelled.items()))
    return text


def _is_tensor(x):
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _args(path, capacity, conf):
    args = [path, "--json"]
    if capacity:
        args += ["--capacity", str(capacity)]
    if conf:
        args += ["--conf", conf]
    return args


def _whatif(path, capacity, conf, search=True):
    import json

    from . import run

    return json.loads(run("whatif", *_args(path, capacity, conf), *([] if search else ["--no-search"])))


def _explain(path, capacity, conf):
    import json

    from . import run

    return json.loads(run("explain", *_args(path, capacity, conf)))


def largest_batch(make_step, make_inputs, capacity="80GiB", lo=1, hi=1024, steps=2, conf=None,
                  compute_capability=(9, 0), workdir=None, log=None, probe=None):
    """The largest batch size in [lo, hi] whose predicted run fits in `capacity`, under each
    setting that `alloctrace whatif` compares: a bisection per setting, one fake run per probe
    (probes are shared between settings), each replayed by `whatif --json --capacity`.
    `make_inputs(batch)` returns the inputs of one step (built on "cuda" under fake tensors).

    Returns {setting: largest batch or None (not even `lo` fits)}, the probes under the key
    "probes" ({batch: {setting: fits}}), and under "not_modelled" what the probes met that is
    not predicted (cuDNN convolution workspaces, say). Where that list is not empty the
    predicted demand is a lower bound, so each batch is an upper bound: the real largest batch
    is at most that, never "fits" (the key "upper_bound" is then True). A batch at which the
    step cannot run under fake tensors raises PredictionError. Assumes that what fits at a
    batch fits at every smaller one. `probe` as in `predict`; one probe serves every batch.

    Under the key "past_cudnn_fallback", the same per setting where a batch also counts when
    its replay goes through once the cuDNN workspace requests that fail at the capacity are
    left out (whatif's `scratch_failures_skipped`): PyTorch's cuDNN catches such a failure and
    tries a plan with a smaller workspace, which the prediction does not hold. So the real
    largest batch lies between the two figures where cuDNN's fallbacks need little memory;
    the second is not said to fit.
    """
    import tempfile

    import torch

    capacity = _bytes(capacity)
    probes = {}
    past = {}  # batch -> {setting: goes through with the failing cuDNN workspaces left out}
    unmodelled = set()
    shared_probe = _probe_for(torch, probe) or False
    d = workdir or tempfile.mkdtemp(prefix="alloctrace-batch-")

    def fits(batch):
        if batch not in probes:
            def inputs(mode, b=batch):
                got = make_inputs(b)
                return tuple(got) if isinstance(got, (list, tuple)) else (got,)

            rec = _run(make_step, inputs, steps, compute_capability, shared_probe)
            unmodelled.update(rec.unmodelled)
            path = _write(rec, os.path.join(d, "batch-%d.pickle" % batch), capacity, conf,
                          "batch %d, " % batch + _describe(make_step, steps, rec))
            w = _whatif(path, capacity, conf, search=False)  # a probe needs the outcomes only
            probes[batch] = {r["policy"]: r["reach"] == "completes" for r in w["rows"]}
            past[batch] = {r["policy"]: r["reach"] == "completes" or r.get("scratch_failures_skipped", 0) > 0
                           for r in w["rows"]}
            if log:
                log("batch %d: %s" % (batch, ", ".join("%s %s" % (k, "fits" if v else "does not fit")
                                                         for k, v in probes[batch].items())))
        return probes[batch]

    def largest(s, ok):
        """The largest batch in [lo, hi] at which `ok(batch)` holds for setting `s`, by bisection."""
        if not ok(lo).get(s):
            return None
        if ok(hi).get(s):
            return hi
        good, bad = lo, hi
        while bad - good > 1:
            mid = (good + bad) // 2
            if ok(mid).get(s):
                good = mid
            else:
                bad = mid
        return good

    def may_fit(batch):
        fits(batch)
        return past[batch]

    settings = list(fits(lo).keys())
    answer = {s: largest(s, fits) for s in settings}
    answer["past_cudnn_fallback"] = {s: largest(s, may_fit) for s in settings}
    answer["probes"] = probes
    answer["not_modelled"] = sorted(unmodelled)
    answer["upper_bound"] = bool(unmodelled)
    return answer


def main(argv=None):
    """`python -m alloctrace predict SCRIPT.py:MAKE_STEP [--inputs FUNC] ...`"""
    import argparse
    import importlib.util

    p = argparse.ArgumentParser(
        prog="python -m alloctrace predict",
        description="Predict a step's GPU memory without running it on a GPU: runs MAKE_STEP's step under "
        "PyTorch's FakeTensorMode on CPU and writes a predicted snapshot that every alloctrace command reads.",
        epilog="SCRIPT.py defines MAKE_STEP() (builds the model on 'cuda', returns step(*inputs)) and "
        "INPUTS(batch) (returns the inputs of one step, made on 'cuda'). Example: python -m alloctrace "
        "predict train.py:make_step --inputs make_inputs --batch 64 --capacity 80GiB -o predicted.pickle",
    )
    p.add_argument("target", help="SCRIPT.py:MAKE_STEP")
    p.add_argument("--inputs", default="make_inputs", help="function of SCRIPT.py: INPUTS(batch) (default make_inputs)")
    p.add_argument("--batch", type=int, default=1, help="batch size passed to INPUTS (default 1)")
    p.add_argument("--steps", type=int, default=3, help="steps to run (default 3)")
    p.add_argument("--capacity", default="80GiB", help="the GPU's memory limit (default 80GiB)")
    p.add_argument("--conf", default=None, help="allocator settings, PYTORCH_CUDA_ALLOC_CONF syntax")
    p.add_argument("--largest-batch", type=int, metavar="HI", default=None,
                   help="instead: the largest batch in [--batch, HI] that fits, per setting")
    p.add_argument("-o", "--output", default="predicted.pickle", help="the predicted snapshot (default predicted.pickle)")
    p.add_argument("--no-probe", action="store_true",
                   help="do not run operators on a visible GPU to measure their kernel scratch (cuDNN workspaces, "
                   "reduction buffers); the prediction is then a lower bound where the step has such scratch")
    a = p.parse_args(argv)
    script, _, func = a.target.rpartition(":")
    if not script or not func:
        p.error("expected SCRIPT.py:MAKE_STEP, got %r" % a.target)
    if not os.path.isfile(script):
        p.error("cannot read %s: no such file" % script)
    spec = importlib.util.spec_from_file_location("_alloctrace_predict_target", script)
    if spec is None:
        p.error("cannot load %s as Python" % script)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        import torch  # noqa: F401
    except ImportError as e:
        p.error("predict needs PyTorch (import torch failed: %s)" % e)
    spec.loader.exec_module(mod)
    for name in (func, a.inputs):
        if not callable(getattr(mod, name, None)):
            p.error("%s defines no function %s" % (script, name))
    make_step, make_inputs = getattr(mod, func), getattr(mod, a.inputs)
    try:
        if a.largest_batch:
            got = largest_batch(make_step, make_inputs, capacity=a.capacity, lo=a.batch, hi=a.largest_batch,
                                steps=a.steps, conf=a.conf, log=lambda s: print(s, file=sys.stderr),
                                probe=False if a.no_probe else None)
            got.pop("probes")
            fallback = got.pop("past_cudnn_fallback")
            missing, bound = got.pop("not_modelled"), got.pop("upper_bound")
            print("predicted largest batch at %s (fake tensors):" % a.capacity)
            for s, b in got.items():
                if b is None:
                    said = "none fits (not even %d)" % a.batch
                else:
                    said = "at most %d" % b if bound else str(b)
                more = fallback.get(s)
                if more is not None and b is not None and more > b:
                    said += " (up to %d where cuDNN falls back to plans with smaller workspaces)" % more
                print("  %-40s %s" % (s, said))
            if bound:
                print("not modelled: %s; the demand predicted is a lower bound, so these batches are upper "
                      "bounds: try each for real" % ", ".join(missing))
            return 0
        if os.path.exists(a.output) and os.path.samefile(a.output, script):
            p.error("the output would overwrite the script")
        r = predict(make_step, lambda: make_inputs(a.batch), steps=a.steps, capacity=a.capacity, conf=a.conf,
                    out=a.output, probe=False if a.no_probe else None)
    except PredictionError as e:
        print("alloctrace: %s" % e, file=sys.stderr)
        return 2
    print("predicted %d requests (batch %d, %d steps, fake tensors) -> %s" % (r["requests"], a.batch, a.steps,
                                                                             r["path"]))
    print("%-34s %-12s %11s %11s %6s %11s" % ("setting", "at " + a.capacity, "peak alloc", "peak reserv", "frag.",
                                               "headroom"))
    gib = lambda b: "%.2f GiB" % (b / 2**30) if b is not None else "-"  # noqa: E731
    said = {True: "fits", False: "out of memory", None: "cannot tell"}
    for name, v in r["settings"].items():
        print("%-34s %-12s %11s %11s %5.1f%% %11s" % (name, said[v["fits"]],
                                                     gib(v["peak_allocated_bytes"]), gib(v["peak_reserved_bytes"]),
                                                     100 * v["fragmentation"], gib(v["headroom_bytes"])))
    if r["whatif"].get("lower_bound"):
        note = r["whatif"]["predicted"].split("not modelled here, ")[-1]
        print("cannot tell: %s; the peaks are lower bounds, so no setting is said to fit: run the step for real "
              "at the limit" % (note[:-1] if note.endswith(")") else note))
    else:
        print("most headroom: %s" % (r["most_headroom"] or "none fits"))
    print("next: alloctrace explain %s --capacity %s; alloctrace whatif %s --capacity %s"
          % (r["path"], a.capacity, r["path"], a.capacity))
    return 0
