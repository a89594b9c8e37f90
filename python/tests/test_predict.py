"""alloctrace.predict: a step run under PyTorch's fake tensors on CPU, its requests replayed by
the binary. Needs torch (skips without it); no GPU, except the probing test, which skips
without one."""
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import importlib

import alloctrace

# The module (the package's `predict` is the function of the same name).
P = importlib.import_module("alloctrace.predict")

torch = pytest.importorskip("torch", reason="alloctrace.predict needs PyTorch")


def make_mlp_step():
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()

    def step(x):
        with torch.no_grad():
            return model(x).softmax(-1)

    return step


def test_workspace_sizes_follow_pytorchs_rules(monkeypatch):
    # CublasHandlePool.cpp: 32 MiB on compute capability 9.0, else 4096 KiB * 2 + 16 KiB * 8;
    # CUBLAS_WORKSPACE_CONFIG sums SIZE KiB * COUNT; cuBLASLt is 1024 KiB, at most cuBLAS's.
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    monkeypatch.delenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", raising=False)
    assert P._cublas_workspace_bytes((9, 0)) == 32 * 2**20
    assert P._cublas_workspace_bytes((8, 0)) == 8 * 2**20 + 128 * 2**10
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert P._cublas_workspace_bytes((8, 0)) == 32 * 2**20
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert P._cublas_workspace_bytes((9, 0)) == 128 * 2**10
    assert P._cublaslt_workspace_bytes(128 * 2**10) == 128 * 2**10
    assert P._cublaslt_workspace_bytes(32 * 2**20) == 2**20
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1")
    assert P._cublaslt_workspace_bytes(32 * 2**20) == 0


def test_predict_writes_a_snapshot_every_command_reads_as_predicted(tmp_path):
    out = tmp_path / "predicted.pickle"
    r = alloctrace.predict(make_mlp_step, torch.empty(256, 1024), steps=2, out=out, capacity="80GiB")
    snap = pickle.load(open(out, "rb"))
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    frees = [e for e in snap["device_traces"][0] if e["action"] == "free_completed"]
    assert r["requests"] == len(allocs) == len(frees)
    sizes = [e["size"] for e in allocs]
    # The parameters and the input (fp32), each activation per step, the two workspaces.
    for b in (4096 * 1024 * 4, 4096 * 4, 10 * 4096 * 4, 10 * 4, 256 * 1024 * 4):
        assert b in sizes
    assert sizes.count(256 * 4096 * 4) == 2 * 2  # the first Linear's output and the ReLU's
    assert sizes.count(32 * 2**20) == 1 and sizes.count(2**20) == 2  # cuBLAS; cuBLASLt and the input
    assert r["whatif"]["predicted"].startswith("predicted, not recorded")
    assert r["explain"]["predicted"].startswith("predicted, not recorded")
    rows = {row["policy"]: row for row in r["whatif"]["rows"]}
    assert rows["recorded"]["reach"] == "completes"
    # Live at the peak: 16 MiB + 16 KiB + 160 KiB + 40 B parameters, the 1 MiB input, the two
    # workspaces (33 MiB) and two 4 MiB activations, as PyTorch rounds them.
    assert rows["recorded"]["peak_allocated_bytes"] == 16 * 2**20 + 16384 + 163840 + 512 + 2**20 + 33 * 2**20 + 8 * 2**20
    # The per-setting answers, from the same rows.
    s = r["settings"]
    assert set(s) == set(rows)
    assert s["recorded"]["headroom_bytes"] == 80 * 2**30 - rows["recorded"]["peak_reserved_bytes"]
    best = r["most_headroom"]
    assert s[best]["fits"] and all(s[best]["peak_reserved_bytes"] <= v["peak_reserved_bytes"] for v in s.values())


def test_a_data_dependent_step_is_refused_in_one_line(tmp_path):
    def make_step():
        def step(x):
            return x[x > 0].sum().item()

        return step

    with pytest.raises(alloctrace.PredictionError) as e:
        alloctrace.predict(make_step, torch.empty(16), out=tmp_path / "p.pickle", explain=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("the step cannot run under fake tensors")
    assert "alloctrace record -o run.atrace --capacity LIMIT" in msg


def test_largest_batch_bisects_each_setting(tmp_path):
    # Inference of one Linear: the input (B x 4096 fp32), the output (B x 4096), the weights
    # (64 MiB + 16 KiB) and the 33 MiB of workspaces; at 256 MiB the largest batch is found by
    # bisection, and one more does not fit.
    def make_step():
        lin = torch.nn.Linear(4096, 4096).cuda()

        def step(x):
            with torch.no_grad():
                return lin(x)

        return step

    got = alloctrace.largest_batch(make_step, lambda b: (torch.empty(b, 4096, device="cuda"),),
                                   capacity="256MiB", lo=1, hi=8192, steps=1, workdir=str(tmp_path))
    probes = got.pop("probes")
    # Nothing the step used is left out of the prediction: the answers are not bounds.
    assert got.pop("not_modelled") == [] and got.pop("upper_bound") is False
    # No cuDNN workspace to fall back from: the second figure is the first.
    assert got.pop("past_cudnn_fallback") == got
    assert "recorded" in got and "expandable_segments:True" in got
    for setting, best in got.items():
        assert best is not None and 1 <= best < 8192
        assert probes[best][setting] is True
        assert probes[best + 1][setting] is False


def test_a_convolution_makes_the_prediction_a_lower_bound(tmp_path):
    # cuDNN picks a convolution's workspace at run time: without probing it on a GPU the
    # prediction leaves it out, so its replay completing is not said to fit, and the largest
    # batch is an upper bound.
    def make_step():
        conv = torch.nn.Conv2d(3, 8, 3).cuda()

        def step(x):
            with torch.no_grad():
                return conv(x)

        return step

    r = alloctrace.predict(make_step, torch.empty(4, 3, 32, 32), out=tmp_path / "p.pickle", capacity="1GiB",
                           probe=False)
    assert r["whatif"]["lower_bound"] is True
    assert "cuDNN convolution workspaces" in r["whatif"]["predicted"]
    rows = {row["policy"]: row for row in r["whatif"]["rows"]}
    assert rows["recorded"]["reach"] == "completes"
    assert all(v["fits"] is None for v in r["settings"].values()) and r["most_headroom"] is None
    assert all(row["decision"] != "fits" for row in rows.values())
    got = alloctrace.largest_batch(make_step, lambda b: (torch.empty(b, 3, 32, 32, device="cuda"),),
                                   capacity="256MiB", lo=1, hi=64, steps=1, workdir=str(tmp_path), probe=False)
    assert got["upper_bound"] is True and got["not_modelled"] == ["cuDNN convolution workspaces"]


_CONV_STEP = """
import torch
def make_step():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3), torch.nn.ReLU(), torch.nn.Conv2d(64, 128, 3, 1, 1),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    def step(x, y):
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    return step
def make_inputs(batch=32):
    return torch.randn(batch, 3, 224, 224, device="cuda"), torch.zeros(batch, dtype=torch.long, device="cuda")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="probing kernel scratch needs a CUDA device")
def test_kernel_scratch_probed_on_the_gpu_matches_a_real_run(tmp_path):
    # With a GPU visible, each operator runs once on it and its scratch (cuDNN workspaces, the
    # reductions' buffers) joins the stream: nothing is left out, and the peaks are the real
    # run's (a fresh process) within the targets, 2% allocated and 3% reserved.
    ns = {}
    exec(_CONV_STEP, ns)
    r = alloctrace.predict(ns["make_step"], ns["make_inputs"], steps=3, out=tmp_path / "p.pickle", probe=True)
    assert r["whatif"]["lower_bound"] is False
    assert "kernel scratch measured on" in r["whatif"]["predicted"]
    row = [x for x in r["whatif"]["rows"] if x["policy"] == "recorded"][0]
    code = _CONV_STEP + textwrap.dedent("""
        import json
        step, args = make_step(), make_inputs()
        for _ in range(3):
            step(*args)
        torch.cuda.synchronize()
        print(json.dumps([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    real_alloc, real_reserved = json.loads(out.strip().splitlines()[-1])
    assert abs(row["peak_allocated_bytes"] / real_alloc - 1) <= 0.02, (row, real_alloc)
    assert abs(row["peak_reserved_bytes"] / real_reserved - 1) <= 0.03, (row, real_reserved)


def test_the_command_line_form(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import torch

        def make_step():
            lin = torch.nn.Linear(512, 512).cuda()
            def step(x):
                with torch.no_grad():
                    return lin(x)
            return step

        def make_inputs(batch):
            return (torch.empty(batch, 512, device="cuda"),)
    """))
    out = tmp_path / "predicted.pickle"
    p = subprocess.run([sys.executable, "-m", "alloctrace", "predict", "%s:make_step" % script, "--batch", "8",
                        "-o", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "alloctrace explain %s" % out in p.stdout
    assert "most headroom: " in p.stdout and "recorded" in p.stdout
    text = subprocess.run([alloctrace.binary(), "whatif", str(out), "--capacity", "1GiB"], check=True,
                          capture_output=True, text=True).stdout
    assert "predicted, not recorded" in text
    assert os.path.getsize(out) > 0
