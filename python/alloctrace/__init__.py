"""alloctrace from Python: record a PyTorch program's GPU memory, label it, dump a snapshot at an
out-of-memory error, and read a trace's summary figures.

Every analysis is the `alloctrace` binary's (shipped in this package and installed on PATH);
this module runs it, so its answers are the command line's, word for word:

    import alloctrace

    with alloctrace.record("run.atrace"):          # or as a decorator
        alloctrace.mark_iteration("step 0")
        train_step()

    alloctrace.load("run.atrace")["peak_reserved_bytes"]

Recording uses alloctrace's recording allocator when its library is available and CUDA has
not allocated yet (every split, merge and cache release is recorded); otherwise PyTorch's own
memory history, turned into a trace when the block ends. Nothing here imports torch until a
function that needs it is called.
"""

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

__all__ = [
    "AlloctraceError",
    "binary",
    "run",
    "load",
    "export",
    "record",
    "mark",
    "mark_iteration",
    "dump_on_oom",
]


class AlloctraceError(RuntimeError):
    """The `alloctrace` binary refused or failed: the message is its own error line."""

    def __init__(self, message, returncode=None):
        super().__init__(message)
        self.returncode = returncode


# ---------------------------------------------------------------------------------------------
# The binary


def binary():
    """The path of the `alloctrace` executable: `ALLOCTRACE_BIN` if set, else the one this
    package installed (in the environment's scripts folder), else the first on PATH."""
    explicit = os.environ.get("ALLOCTRACE_BIN")
    if explicit:
        return explicit
    exe = "alloctrace" + (".exe" if os.name == "nt" else "")
    candidates = [os.path.join(sysconfig.get_path("scripts"), exe)]
    user_scheme = sysconfig.get_preferred_scheme("user") if hasattr(sysconfig, "get_preferred_scheme") else None
    if user_scheme:
        candidates.append(os.path.join(sysconfig.get_path("scripts", scheme=user_scheme), exe))
    candidates.append(os.path.join(os.path.dirname(sys.executable), exe))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    import shutil

    found = shutil.which(exe)
    if found:
        return found
    raise AlloctraceError(
        "cannot find the alloctrace executable (looked in %s and on PATH); reinstall the package "
        "or set ALLOCTRACE_BIN" % ", ".join(candidates)
    )


def run(*args, check=True):
    """Runs `alloctrace ARGS...` and returns its standard output as text. With `check`, a
    non-zero exit raises AlloctraceError with the binary's error line (exit code 3, a damaged
    trace analyzed up to the damage, is not an error: its warning goes to stderr)."""
    p = subprocess.run([binary(), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.stderr:
        sys.stderr.write(p.stderr)
    if check and p.returncode not in (0, 3):
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        msg = lines[-1] if lines else "alloctrace %s exited with %d" % (" ".join(map(str, args)), p.returncode)
        raise AlloctraceError(msg, p.returncode)
    return p.stdout


def _is_snapshot(path):
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"  # a pickle; traces start with their magic


def load(path, capacity=None):
    """Summary figures of a trace (or of a PyTorch snapshot pickle, imported first) as a dict:
    the keys of `alloctrace summary --json` (peak_reserved_bytes, peak_requested_bytes,
    peak_allocated_bytes, num_ooms, events_by_kind, ...). `capacity` is the memory limit a
    snapshot ran under (snapshots do not record it), e.g. "2GiB"."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise AlloctraceError("cannot read %s: no such file" % path)
    if _is_snapshot(path):
        with tempfile.TemporaryDirectory(prefix="alloctrace-") as d:
            trace = os.path.join(d, "snapshot.atrace")
            _import(path, trace, capacity)
            return json.loads(run("summary", "--json", trace))
    return json.loads(run("summary", "--json", path))


def export(path, output, format="memory-viz"):
    """Writes the trace for another viewer: format "memory-viz" (a PyTorch snapshot pickle) or
    "perfetto" (Chrome trace-event JSON). Returns what `alloctrace export --json` reports."""
    return json.loads(run("export", os.fspath(path), "--format", format, "-o", os.fspath(output), "--json"))


def _import(snapshot, trace, capacity=None):
    args = ["import", "torch", snapshot, "-o", trace, "--json"]
    if capacity:
        args += ["--capacity", str(capacity)]
    return json.loads(run(*args))


# ---------------------------------------------------------------------------------------------
# Recording

# What is recording now: None, ("recorder", ctypes library), or ("history", _History).
_active = None
# Once the recording allocator is installed, PyTorch keeps it for the process.
_recorder_used = False


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("alloctrace.record and dump_on_oom need PyTorch (import torch failed: %s)" % e) from e
    return torch


def _recorder_library():
    """The recorder's shared library: ALLOCTRACE_LIB, else the one in this package (wheels made
    by python/build-wheel.sh carry it), else next to the binary (or in ../lib), as
    `alloctrace record` looks. None when absent (`pip install ./python` builds the binary only;
    `cargo build --release -p alloctrace-recorder --features cuda` builds the library)."""
    env = os.environ.get("ALLOCTRACE_LIB")
    if env and os.path.isfile(env):
        return env
    packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "librecorder.so")
    if os.path.isfile(packaged):
        return packaged
    try:
        here = os.path.dirname(os.path.realpath(binary()))
    except AlloctraceError:
        return None
    for d in (here, os.path.join(here, "..", "lib"), os.path.join(here, "..")):
        for name in ("liballoctrace_recorder.so", "librecorder.so"):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                return os.path.realpath(p)
    return None


class _History:
    """PyTorch's memory history, with marks kept aside and merged in as annotations."""

    def __init__(self, torch, stacks):
        self.torch = torch
        self.marks = []
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all" if stacks else None, stacks="python", max_entries=sys.maxsize
        )

    def mark(self, label, kind):
        name = str(label) if kind == "phase" else "iteration %s" % label
        self.marks.append({"name": name, "stage": "START", "device": 0, "time_us": time.time_ns() // 1000})

    def dump(self, pickle_path):
        import pickle

        snap = self.torch.cuda.memory._snapshot()
        snap.setdefault("external_annotations", []).extend(self.marks)
        with open(pickle_path, "wb") as f:
            pickle.dump(snap, f, protocol=4)

    def stop(self):
        self.torch.cuda.memory._record_memory_history(enabled=None)


def _capacity(torch):
    """The memory fraction in force, as bytes (for `import --capacity`), or None."""
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if get is None:
        return None
    try:
        fraction = get()
        if fraction < 1.0:
            return int(fraction * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    except Exception:
        pass
    return None


class record(contextlib.ContextDecorator):
    """Records GPU memory of the block (`with alloctrace.record("run.atrace"):`) or function
    (`@alloctrace.record("run.atrace")`) into a trace at `path`.

    `conf` sets the allocator (PYTORCH_CUDA_ALLOC_CONF syntax), `stacks` records the Python call
    site of every allocation. With the recorder library available and CUDA not yet used by this
    process, alloctrace's recording allocator is installed (PyTorch keeps it for the rest of the
    process: one such recording per process). Otherwise PyTorch's memory history is recorded
    and imported into the trace at the end (allocator settings can then only be changed before
    CUDA's first allocation). `backend="recorder"` or `"history"` insists on one of the two.
    """

    def __init__(self, path, conf=None, stacks=False, *, backend="auto"):
        if backend not in ("auto", "recorder", "history"):
            raise ValueError("backend must be 'auto', 'recorder' or 'history', not %r" % (backend,))
        self.path = os.path.abspath(os.fspath(path))
        self.conf = conf
        self.stacks = stacks
        self.backend = backend
        self._mode = None

    def __enter__(self):
        global _active, _recorder_used
        if _active is not None:
            raise AlloctraceError("alloctrace is already recording; recordings do not nest")
        torch = _torch()
        lib = _recorder_library() if self.backend != "history" else None
        if self.backend == "recorder" and (lib is None or _recorder_used or torch.cuda.is_initialized()):
            raise AlloctraceError(
                "cannot record with alloctrace's allocator: "
                + (
                    "no recorder library (set ALLOCTRACE_LIB)"
                    if lib is None
                    else "this process has already used CUDA; record from the start of a new process"
                )
            )
        if lib and not _recorder_used and not torch.cuda.is_initialized():
            os.environ["ALLOCTRACE_LIB"] = lib
            os.environ["ALLOCTRACE_OUTPUT"] = self.path
            os.environ["ALLOCTRACE_STACKS"] = "1" if self.stacks else "0"
            if self.conf:
                os.environ["ALLOCTRACE_CONF"] = self.conf
            handle = ctypes.CDLL(lib)
            handle.alloctrace_mark.argtypes = [ctypes.c_char_p]
            handle.alloctrace_mark_iteration.argtypes = [ctypes.c_char_p]
            handle.alloctrace_shutdown.restype = ctypes.c_int
            from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator

            alloc = CUDAPluggableAllocator(lib, "alloctrace_malloc", "alloctrace_free")
            raw = alloc.allocator()
            raw.set_init_fn(ctypes.cast(handle.alloctrace_init, ctypes.c_void_p).value)
            raw.set_reset_fn(ctypes.cast(handle.alloctrace_empty_cache, ctypes.c_void_p).value)
            change_current_allocator(alloc)
            _recorder_used = True
            # The recorder starts at its first request; a request of 0 bytes starts it and
            # allocates nothing. Started now, it keeps the marks made before the block's first
            # allocation (and its clock starts with the block).
            handle.alloctrace_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            handle.alloctrace_malloc.restype = ctypes.c_void_p
            handle.alloctrace_malloc(0, torch.cuda.current_device(), None)
            self._mode = ("recorder", handle)
        elif _recorder_used:
            raise AlloctraceError(
                "this process already recorded with alloctrace's allocator, which PyTorch keeps until "
                "the process ends; record again in a new process"
            )
        else:
            if self.conf:
                if torch.cuda.is_initialized():
                    sys.stderr.write(
                        "alloctrace: conf=%r not applied: CUDA has already allocated in this process\n" % self.conf
                    )
                else:
                    torch.cuda.memory._set_allocator_settings(self.conf)
            self._mode = ("history", _History(torch, self.stacks))
        _active = self._mode
        return self

    def __exit__(self, *exc):
        global _active
        kind, state = self._mode
        _active = None
        if kind == "recorder":
            code = state.alloctrace_shutdown()
            if code == 2:
                sys.stderr.write("alloctrace: nothing was recorded (no CUDA allocation in the block)\n")
        else:
            torch = _torch()
            with tempfile.TemporaryDirectory(prefix="alloctrace-") as d:
                snap = os.path.join(d, "snapshot.pickle")
                try:
                    state.dump(snap)
                finally:
                    state.stop()
                cap = _capacity(torch)
                _import(snap, self.path, cap)
        return False


def _label(kind, label):
    if _active is None:
        return
    mode, state = _active
    if mode == "recorder":
        fn = state.alloctrace_mark if kind == "phase" else state.alloctrace_mark_iteration
        fn(str(label).encode())
    else:
        state.mark(label, kind)


def mark(label):
    """Labels a phase of the program ("forward", "eval") in the trace being recorded (nothing
    when not recording)."""
    _label("phase", label)


def mark_iteration(label):
    """Labels the start of an iteration in the trace being recorded (nothing when not
    recording). `alloctrace leaks` compares iterations to find growth."""
    _label("iteration", label)


def dump_on_oom(path, max_entries=1_000_000, stacks=True):
    """With PyTorch's own allocator: records its memory history from now on (the last
    `max_entries` events) and writes a snapshot at `path` when an allocation runs out of memory,
    through PyTorch's OOM observer, before the error reaches the program. A path ending in
    `.atrace` gets a trace (the snapshot imported, with the memory fraction in force as its
    capacity); any other a snapshot pickle for `alloctrace import torch` or PyTorch's memory_viz.
    Returns the observer."""
    torch = _torch()
    path = os.path.abspath(os.fspath(path))
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all" if stacks else None, stacks="python", max_entries=max_entries
    )

    def observer(device, alloc, device_alloc, device_free):
        try:
            if path.endswith(".atrace"):
                with tempfile.TemporaryDirectory(prefix="alloctrace-") as d:
                    snap = os.path.join(d, "oom.pickle")
                    torch.cuda.memory._dump_snapshot(snap)
                    _import(snap, path, _capacity(torch))
            else:
                torch.cuda.memory._dump_snapshot(path)
            sys.stderr.write("alloctrace: out of memory; wrote %s (alloctrace explain %s)\n" % (path, path))
        except Exception as e:  # never hide the OOM behind our own error
            sys.stderr.write("alloctrace: could not write %s at the OOM: %s\n" % (path, e))

    torch._C._cuda_attach_out_of_memory_observer(observer)
    return observer


def _version():
    try:
        from importlib.metadata import version

        return version("alloctrace")
    except Exception:
        return "unknown"


__version__ = _version()
from .predict import PredictionError, largest_batch, predict  # noqa: E402  (Will it fit? needs torch only when called)
