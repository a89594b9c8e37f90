"""The recording shim's phase marks, on a stand-in for torch (the hooks' registration points and
the autograd entry), so that the depth count, the backward flag and the marks are checked
without PyTorch. Run by shim_phases.rs with the shim's folder on sys.path; prints PASS."""
import sys
import types


def fake_torch():
    hooks = {"pre": [], "post": [], "step_pre": [], "step_post": []}

    def module(name):
        m = types.ModuleType(name)
        sys.modules[name] = m
        return m

    torch = module("torch")
    nn = module("torch.nn")
    modules = module("torch.nn.modules")
    mod = module("torch.nn.modules.module")
    autograd = module("torch.autograd")
    optim = module("torch.optim")
    optimizer = module("torch.optim.optimizer")
    parallel = module("torch.nn.parallel")
    distributed = module("torch.nn.parallel.distributed")

    class DistributedDataParallel:
        def __init__(self, module):
            self.module = module

        def _pre_forward(self):
            pass

    distributed.DistributedDataParallel = DistributedDataParallel
    torch.nn, nn.modules, modules.module = nn, modules, mod
    nn.parallel, parallel.distributed = parallel, distributed
    torch.autograd, torch.optim, optim.optimizer = autograd, optim, optimizer
    mod.register_module_forward_pre_hook = hooks["pre"].append

    def register_post(hook, always_call=False):
        assert always_call, "the post hook must run when a forward raises"
        hooks["post"].append(hook)

    mod.register_module_forward_hook = register_post
    optimizer.register_optimizer_step_pre_hook = hooks["step_pre"].append
    optimizer.register_optimizer_step_post_hook = hooks["step_post"].append
    return torch, hooks


torch, hooks = fake_torch()
import alloctrace_hook as at  # noqa: E402

marks = []
at.mark = marks.append  # the hooks look `mark` up at each call


def call(name, body=lambda: None):
    """A module call as torch runs it: pre-hooks, forward, post-hooks (always)."""
    for h in hooks["pre"]:
        h(name, ())
    try:
        return body()
    finally:
        for h in hooks["post"]:
            h(name, (), None)


def model():
    call("block1", lambda: call("linear"))
    call("block2")


def backward_engine():
    # Activation checkpointing recomputes a block's forward inside backward.
    call("block2", lambda: call("linear"))


torch.autograd.backward = backward_engine
at._install_phase_hooks(torch)
assert torch.autograd.backward.__wrapped__ is backward_engine

for _ in range(2):
    call("model", model)
    torch.autograd.backward()
    for h in hooks["step_pre"]:
        h(None, (), {})
    for h in hooks["step_post"]:
        h(None, (), {})
one = ["forward", "after forward", "backward", "after backward", "optimizer step", "after optimizer step"]
assert marks == one * 2, marks

# DistributedDataParallel's construction is marked: what it keeps is its gradient buckets.
marks.clear()
from torch.nn.parallel.distributed import DistributedDataParallel  # noqa: E402

ddp = DistributedDataParallel("model")
assert marks == ["gradient buckets (DistributedDataParallel)", "after gradient buckets"], marks
# Its forward: the bucket rebuild first, marked, then the forward goes on.
marks.clear()
call("ddp", lambda: (ddp._pre_forward(), call("model", model)))
assert marks == ["forward", "gradient buckets (DistributedDataParallel)", "forward", "after forward"], marks

# A forward that raises still closes its phase; the next forward marks again.
marks.clear()


def boom():
    raise RuntimeError("out of memory")


try:
    call("model", lambda: call("block1", boom))
except RuntimeError:
    pass
call("model", model)
assert marks == ["forward", "after forward", "forward", "after forward"], marks

# A backward that raises still ends its phase.
marks.clear()


def failing():
    raise RuntimeError("boom")


wrapped = at._wrap_backward(failing)
try:
    wrapped()
except RuntimeError:
    pass
assert marks == ["backward", "after backward"], marks
assert at._phase == {"depth": 0, "backward": 0}, at._phase
print("PASS")
