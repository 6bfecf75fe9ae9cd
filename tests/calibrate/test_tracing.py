"""Whole-step traces: trimming keeps what the importer reads, and a tiny CPU run of the
step scripts writes traces that ``calibrate.trace`` loads, with steps and phases."""

from __future__ import annotations

import gzip
import json

import pytest

pytest.importorskip("torch")

from calibrate.steps import serve_step as S  # noqa: E402
from calibrate.steps import tracing  # noqa: E402
from calibrate.steps import train_step as T  # noqa: E402
from calibrate.trace import TraceError, load_trace  # noqa: E402


def _steps(path) -> list[str]:
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return [e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]


def test_trim_keeps_gpu_work_launches_and_annotations():
    raw = {
        "schemaVersion": 1,
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2,
             "args": {"correlation": 7, "stream": 7, "grid": [1, 1, 1], "registers per thread": 9}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 1,
             "args": {"correlation": 7}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGetErrorString", "ts": 0, "dur": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 3},
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 7, "ts": 1},
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 5},
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python"}},
        ],
    }  # fmt: skip
    kept = tracing.trim(raw)
    names = [e["name"] for e in kept["traceEvents"]]
    assert names == ["k", "cudaLaunchKernel", "ProfilerStep#1", "process_name"]
    assert kept["traceEvents"][0]["args"] == {"correlation": 7, "stream": 7, "grid": [1, 1, 1]}
    assert kept["schemaVersion"] == 1
    assert tracing.trace_name("m", "eager", "none", "2x4096") == "m.eager.none.2x4096.trace.json.gz"


def test_tiny_train_run_writes_loadable_traces(tmp_path):
    trace_dir = tmp_path / "traces"
    rc = T.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--warmup", "1",
                 "--steps", "2", "--models", "tiny-gqa", "--recompute", "none,full",
                 "--trace-dir", str(trace_dir)])  # fmt: skip
    assert rc == 0
    files = sorted(p.name for p in trace_dir.iterdir())
    assert files == [
        f"tiny-gqa.eager.{rc_}.{shape}.trace.json.gz"
        for rc_ in ("full", "none") for shape in ("1x32", "2x16")
    ]  # fmt: skip
    with gzip.open(trace_dir / files[0], "rt") as fh:
        data = json.load(fh)
    assert data["simcli"]["arch"]["layers"] == 2
    cats = {e.get("cat") for e in data["traceEvents"]}
    assert "cpu_op" not in cats and "user_annotation" in cats
    assert len(_steps(trace_dir / files[0])) == 2  # --trace-steps default
    names = {e["name"] for e in data["traceEvents"]}
    assert {"forward", "backward", "optimizer"} <= names  # the phases, as record_function
    # a CPU run has no GPU work: the importer says so in one line instead of guessing
    with pytest.raises(TraceError, match="no GPU kernels"):
        load_trace(trace_dir / files[0])
    rows = (tmp_path / "train_step.csv").read_text().splitlines()
    assert rows[0].endswith("mode,recompute,trace") and all(r.endswith(".gz") for r in rows[1:])


def test_tiny_serve_run_writes_traces(tmp_path):
    trace_dir = tmp_path / "traces"
    rc = S.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--warmup", "1",
                 "--phases", "prefill", "--trace-dir", str(trace_dir)])  # fmt: skip
    assert rc == 0
    files = list(trace_dir.iterdir())
    assert files and all(p.name.startswith("tiny.prefill.") for p in files)
    assert len(_steps(files[0])) == 2
