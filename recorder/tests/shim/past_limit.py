"""The recording shim past the limit (default back-end), on a stand-in for torch: the job's own
memory fraction is recorded, not applied; the first point past the limit is where PyTorch's
peak reserved went above it; the job stops ALLOCTRACE_AFTER_LIMIT whole iterations later, with
one line on stderr. Run by shim_phases.rs with the shim's folder on sys.path; prints PASS."""
import io
import os
import sys
import types

GIB = 1 << 30


def fake_torch():
    state = {"peak": 0, "applied": [], "lazy": 0}
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    utils = types.ModuleType("torch.cuda._utils")
    torch = types.ModuleType("torch")
    torch.cuda, cuda.memory, cuda._utils = cuda, memory, utils

    def set_fraction(fraction, device=None):
        state["applied"].append(fraction)

    def lazy_init():
        state["lazy"] += 1

    cuda.set_per_process_memory_fraction = set_fraction
    memory.set_per_process_memory_fraction = set_fraction
    cuda._lazy_init = lazy_init
    cuda.current_device = lambda: 0
    cuda.mem_get_info = lambda dev: (10 * GIB, 80 * GIB)
    utils._get_device_index = lambda d: int(d)
    memory.memory_stats_as_nested_dict = lambda dev: {"reserved_bytes": {"all": {"peak": state["peak"]}}}
    return torch, state


class Stopped(Exception):
    pass


def run(after, fraction_first=True, steps=10, cross_at=(3, "forward")):
    """A training loop of `steps` iterations (forward, optimizer step) whose peak reserved goes
    past 8 GiB (0.1 of 80 GiB) during iteration `cross_at[0]` (0-based), before its forward ends
    or before its step ends. Returns (iterations completed, stderr, set_capacity calls)."""
    os.environ["ALLOCTRACE_AFTER_LIMIT"] = after
    for m in [m for m in sys.modules if m == "alloctrace_hook"]:
        del sys.modules[m]
    import alloctrace_hook as at

    torch, state = fake_torch()
    calls = []

    class Lib:
        def alloctrace_set_capacity(self, dev, limit):
            calls.append((dev, limit))
            return 1

    at._installed = True
    at._library = lambda: Lib()
    at._lift_limits(torch)
    err = io.StringIO()
    at.sys = types.SimpleNamespace(stdout=io.StringIO(), stderr=err)

    def exit_(code):
        raise Stopped(code)

    at.os = types.SimpleNamespace(_exit=exit_, environ=os.environ, path=os.path, getpid=os.getpid)
    closed = []
    at._past.stop_hooks.append(lambda: closed.append(True))
    at._say = lambda msg: err.write(f"alloctrace: {msg}\n")
    if fraction_first:
        torch.cuda.set_per_process_memory_fraction(0.1)
    assert state["applied"] == [], "the fraction is not applied"
    done = 0
    try:
        for i in range(steps):
            if i == cross_at[0] and cross_at[1] == "forward":
                state["peak"] = 9 * GIB
            at._past.tick("forward")
            if i == cross_at[0] and cross_at[1] == "step":
                state["peak"] = 9 * GIB
            done += 1  # the stop comes right after an optimizer step: its iteration is whole
            at._past.tick("step")
    except Stopped as e:
        assert e.args == (0,), e.args
        assert closed == [True], "the trace is closed before the process ends"
    return done, err.getvalue(), calls


# The job's fraction 0.1 of 80 GiB: 8 GiB, recorded as the capacity, not applied.
done, err, calls = run("3")
assert calls == [(0, int(0.1 * 80 * GIB))], calls
# Past the limit in iteration 3's forward: iteration 3 ends, then 3 whole iterations (4, 5, 6).
assert done == 7, (done, err)
assert err.count("\n") == 1 and "stopped the job 3 whole optimizer steps after it went past its limit" in err, err
assert "8.00 GiB (the job's memory fraction 0.1)" in err and "9.00 GiB" in err, err

# Seen at the step's end: the same iteration, the same stop.
done, err, _ = run("3", cross_at=(3, "step"))
assert done == 7, (done, err)

# 0: stop as soon as the iteration that went past the limit ends.
done, err, _ = run("0")
assert done == 4, done
assert "stopped the job at the end of the optimizer step in which it went past its limit" in err, err

# `end`: the job runs to its end; nothing is stopped.
done, err, _ = run("end")
assert done == 10 and "stopped" not in err, (done, err)

# Never past the limit: runs to its end.
done, err, _ = run("3", cross_at=(99, "forward"))
assert done == 10 and err == "", (done, err)

# No limit at all: the ticks cost nothing and stop nothing.
done, err, calls = run("3", fraction_first=False)
assert done == 10 and calls == [] and err == "", (done, err, calls)
print("PASS")
