"""The Python package against the binary it ships: CPU only, no torch needed except where a
test says so (those skip, saying why, when torch or a GPU is missing)."""
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import alloctrace

# The repository, for its shipped traces (ALLOCTRACE_REPO when the tests run from elsewhere).
ROOT = os.environ.get("ALLOCTRACE_REPO") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FRAG = os.path.join(ROOT, "traces", "frag_oom.default.atrace")
GPT2 = os.path.join(ROOT, "traces", "gpt2_train.default.atrace")
SNAPSHOT = os.path.join(ROOT, "analyzer", "tests", "fixtures", "torch", "frag_oom.default.pickle")


def cli_json(*args):
    out = subprocess.run([alloctrace.binary(), *args], check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def test_the_binary_is_installed_and_names_its_versions():
    out = subprocess.run([alloctrace.binary(), "--version"], check=True, stdout=subprocess.PIPE, text=True).stdout
    assert out.strip() == "alloctrace %s (trace format 1)" % alloctrace.__version__
    # The same through `python -m alloctrace` (environments whose scripts are not on PATH).
    out = subprocess.run([sys.executable, "-m", "alloctrace", "--version"], check=True, stdout=subprocess.PIPE, text=True)
    assert out.stdout.startswith("alloctrace ")


def test_load_is_the_cli_summary():
    figures = alloctrace.load(FRAG)
    assert figures == cli_json("summary", "--json", FRAG)
    # The shipped H100 run: 1,840 MiB reserved at the peak, one OOM, under a 2 GiB limit.
    assert figures["peak_reserved_bytes"] == 1840 * 2**20
    assert figures["num_ooms"] == 1
    assert figures["capacity_bytes"] == 2 * 2**30


def test_load_imports_a_snapshot_first():
    figures = alloctrace.load(SNAPSHOT, capacity="2GiB")
    assert figures["source"] == "imported-torch"
    assert figures["peak_reserved_bytes"] == 1840 * 2**20
    assert figures["capacity_bytes"] == 2 * 2**30
    # Without a limit the snapshot ran out of memory with room left on the device: the least
    # limit consistent with it (its peak reserved) is inferred, and said to be.
    inferred = alloctrace.load(SNAPSHOT)
    assert inferred["capacity_bytes"] == 1840 * 2**20
    assert inferred["capacity_source"] == "inferred_limit"


def test_errors_are_the_cli_error_line(tmp_path):
    with pytest.raises(alloctrace.AlloctraceError, match="no such file"):
        alloctrace.load(tmp_path / "missing.atrace")
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a trace\n")
    with pytest.raises(alloctrace.AlloctraceError) as e:
        alloctrace.load(foreign)
    assert e.value.returncode == 2
    assert str(e.value).startswith("alloctrace: error: ") and "notes.txt" in str(e.value)


def test_memory_viz_export_reads_in_python(tmp_path):
    out = tmp_path / "gpt2.pickle"
    stats = alloctrace.export(GPT2, out, format="memory-viz")
    with open(out, "rb") as f:
        assert f.read(2) == b"\x80\x02"  # protocol 2, which memory_viz reads
    with open(out, "rb") as f:
        snap = pickle.load(f)
    assert set(snap) >= {"segments", "device_traces", "allocator_settings", "external_annotations"}
    entries = snap["device_traces"][0]
    assert len(entries) == stats["entries"]
    assert all({"action", "size", "stream", "time_us", "frames"} <= set(e) for e in entries)
    assert all(("device_free" if e["action"] == "oom" else "addr") in e for e in entries)
    # Peak reserved from the snapshot's own segment entries, as PyTorch's tools count it.
    reserved = peak = 0
    for e in entries:
        if e["action"] in ("segment_alloc", "segment_map"):
            reserved += e["size"]
            peak = max(peak, reserved)
        elif e["action"] in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
    assert peak == alloctrace.load(GPT2)["peak_reserved_bytes"]
    assert sum(s["total_size"] for s in snap["segments"]) == reserved
    for s in snap["segments"]:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
        assert s["allocated_size"] == sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
    # Call sites are shared frame lists, as in PyTorch's snapshots.
    framed = [e["frames"] for e in entries if e["frames"]]
    assert framed and {"filename", "line", "name"} <= set(framed[0][0])
    assert len({id(f) for f in framed}) < len(framed)


def test_perfetto_export_is_json_with_the_peak(tmp_path):
    out = tmp_path / "gpt2.json"
    stats = alloctrace.export(GPT2, out, format="perfetto")
    with open(out) as f:
        doc = json.load(f)
    reserved = [e["args"]["bytes"] for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "reserved"]
    assert max(reserved) == alloctrace.load(GPT2)["peak_reserved_bytes"] == stats["peak_reserved_bytes"]


def test_marks_outside_a_recording_do_nothing():
    alloctrace.mark("forward")
    alloctrace.mark_iteration(3)


def test_record_refuses_an_unknown_backend(tmp_path):
    with pytest.raises(ValueError, match="backend"):
        alloctrace.record(tmp_path / "run.atrace", backend="cupti")


def _has_torch():
    try:
        import torch  # noqa: F401

        return True
    except ImportError:
        return False


@pytest.mark.skipif(_has_torch(), reason="checks the message given without torch")
def test_record_says_it_needs_torch(tmp_path):
    with pytest.raises(ImportError, match="need PyTorch"):
        with alloctrace.record(tmp_path / "run.atrace"):
            pass
    with pytest.raises(ImportError, match="need PyTorch"):
        alloctrace.dump_on_oom(tmp_path / "oom.pickle")


def _gpu():
    if not _has_torch():
        return False
    import torch

    return torch.cuda.is_available()


needs_gpu = pytest.mark.skipif(not _gpu(), reason="needs torch with a CUDA device")


def _python(script, tmp_path):
    """Runs a script in a fresh interpreter (recording allocators are per process)."""
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout
    return p.stdout


@needs_gpu
def test_record_as_a_context_manager(tmp_path):
    _python(
        """
        import os, torch, alloctrace
        with alloctrace.record("ctx.atrace", backend=os.environ.get("ALLOCTRACE_TEST_BACKEND", "auto")):
            for i in range(3):
                alloctrace.mark_iteration(i)
                x = [torch.empty(1 << 20, device="cuda") for _ in range(8)]
                del x
        """,
        tmp_path,
    )
    ctx = alloctrace.load(tmp_path / "ctx.atrace")
    assert ctx["events_by_kind"]["alloc"] >= 24
    assert ctx["events_by_kind"]["mark"] >= 3
    assert ctx["peak_requested_bytes"] >= 8 * (4 << 20)


@needs_gpu
def test_record_as_a_decorator(tmp_path):
    _python(
        """
        import os, torch, alloctrace

        backend = os.environ.get("ALLOCTRACE_TEST_BACKEND", "auto")

        @alloctrace.record("dec.atrace", conf="expandable_segments:True", backend=backend)
        def work():
            y = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            return y.sum().item()

        work()
        """,
        tmp_path,
    )
    dec = alloctrace.load(tmp_path / "dec.atrace")
    assert dec["peak_requested_bytes"] >= 64 << 20
    assert "expandable_segments:True" in dec["alloc_conf"]


@needs_gpu
def test_dump_on_oom_writes_the_snapshot_at_the_oom(tmp_path):
    _python(
        """
        import torch, alloctrace
        torch.cuda.set_per_process_memory_fraction(0.05)
        alloctrace.dump_on_oom("oom.pickle")
        keep = []
        try:
            while True:
                keep.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass
        """,
        tmp_path,
    )
    figures = alloctrace.load(tmp_path / "oom.pickle")
    assert figures["num_ooms"] == 1
    assert figures["peak_requested_bytes"] >= 256 << 20
