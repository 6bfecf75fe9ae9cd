"""``simcli trace import``: table, json and csv output, ``--output`` bundles, bad input, and
any real trace + config pair dropped into tests/data/traces/."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from calibrate.trace import OP_CLASSES
from tests.calibrate.trace import synthetic as syn
from tests.simcli.reports.browser import one_error_line

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
TRAIN = """\
kind: train
model: llama3-8b
gpu: h100-sxm
engine: pytorch-eager
micro_batch: 1
seq_len: 2048
phase_markers: {forward: forward, optimizer: optimizer}
"""
DECODE = """\
kind: decode
model: llama3-8b
gpu: h100-sxm
engine: vllm
batch: 8
context_len: 1024
"""
JSON_KEYS = {
    "step_measured_ms", "step_predicted_ms", "step_error", "classes", "unmatched", "gaps",
    "steps_in_trace", "phases", "steps", "top_kernels", "kernel_measured_ms",
    "kernel_predicted_ms", "comm_overlapped_ms", "warnings", "cost_model",
}  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace-cli")
    (tmp / "train.yaml").write_text(TRAIN)
    (tmp / "decode.yaml").write_text(DECODE)
    syn.write_trace(tmp / "step.json")
    syn.write_trace(tmp / "step.json.gz", gz=True)
    return tmp


def test_json_object(run, files):
    result = run("trace", "import", str(files / "step.json"), "--config",
                 str(files / "train.yaml"), "--format", "json")  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) >= JSON_KEYS
    assert out["steps_in_trace"] == 2 and out["step_source"] == "cpu annotations"
    assert out["step_measured_ms"] == pytest.approx(0.14)
    assert out["step_predicted_ms"] > 0
    expect_err = out["step_predicted_ms"] / out["step_measured_ms"] - 1
    assert out["step_error"] == pytest.approx(expect_err)
    assert [c["op_class"] for c in out["classes"]] == list(OP_CLASSES)
    measured = {c["op_class"]: c["measured_ms"] * 1e3 for c in out["classes"] if c["measured_ms"]}
    assert measured == pytest.approx(syn.EXPECTED_US_PER_STEP)
    assert out["gaps"] == pytest.approx(
        {"host_bound_ms": 0.014, "exposed_comm_ms": 0.015, "pipeline_wait_ms": 0.0075,
         "other_ms": 0.005, "total_ms": 0.0415}
    )  # fmt: skip
    assert [u["name"] for u in out["unmatched"]] == [syn.CUSTOM]
    assert {p["phase"] for p in out["phases"]} == {"forward", "optimizer"}
    assert out["workload"]["kind"] == "train"


def test_table_and_gzip(run, files):
    result = run("trace", "import", str(files / "step.json.gz"), "--config",
                 str(files / "train.yaml"))  # fmt: skip
    assert result.exit_code == 0, result.output
    for text in ("per op class", "step_measured_ms", "host_bound_ms", "unmatched kernels"):
        assert text in result.stdout


def test_csv_rows_per_class(run, files):
    result = run("trace", "import", str(files / "step.json"), "--config",
                 str(files / "decode.yaml"), "--format", "csv")  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "op_class,label,predicted_ms,measured_ms,error,kernels_per_step"
    assert [line.split(",")[0] for line in lines[1:]] == list(OP_CLASSES)


def test_output_bundle(run, files, tmp_path):
    folder = tmp_path / "report"
    config = str(files / "train.yaml")
    result = run("trace", "import", str(files / "step.json"), "--config", config,
                 "--output", str(folder), "--format", "json")  # fmt: skip
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["classes.csv", "config.json", "gaps.csv", "kernels.csv", "phases.csv",
                     "report.html", "result.json", "steps.csv", "unmatched.csv"]  # fmt: skip
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    saved = json.loads((folder / "result.json").read_text())
    assert set(saved) >= JSON_KEYS
    assert saved["classes"] == json.loads(result.stdout)["classes"]
    config = json.loads((folder / "config.json").read_text())
    assert config["command"] == "trace import"
    assert config["resolved"]["workload"]["engine"] == "pytorch-eager"
    classes = pd.read_csv(folder / "classes.csv")
    assert classes["op_class"].tolist() == list(OP_CLASSES)
    kernels = pd.read_csv(folder / "kernels.csv")
    assert len(kernels) == len(syn.GPU_EVENTS)
    page = (folder / "report.html").read_text()
    assert "Op classes" in page and "Unmatched kernels" in page and "<svg" in page


def test_report_renders(run, files, tmp_path):
    from tests.simcli.reports.browser import check_report

    folder = tmp_path / "report"
    result = run("trace", "import", str(files / "step.json"), "--config",
                 str(files / "decode.yaml"), "--output", str(folder))  # fmt: skip
    assert result.exit_code == 0, result.output
    check_report(folder / "report.html", tmp_path, min_svgs=2)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_output_single_file(run, files, tmp_path, suffix):
    path = tmp_path / f"result{suffix}"
    result = run("trace", "import", str(files / "step.json"), "--config",
                 str(files / "decode.yaml"), "--output", str(path), "--format", "json")  # fmt: skip
    assert result.exit_code == 0, result.output
    if suffix == ".json":
        assert set(json.loads(path.read_text())) >= JSON_KEYS
    else:
        assert pd.read_csv(path)["op_class"].tolist() == list(OP_CLASSES)


BAD_CONFIGS = {
    "missing field": ("kind: train\ngpu: h100-sxm\nengine: megatron\nseq_len: 512\n", "model"),
    "unknown gpu": (TRAIN.replace("h100-sxm", "h999"), "unknown GPU 'h999'"),
    "unknown field": (TRAIN + "seqlen: 4\n", "seqlen: Extra inputs are not permitted"),
    "engine for kind": (TRAIN.replace("pytorch-eager", "vllm"), "does not run kind train"),
    "field of another kind": (TRAIN + "prompt_len: 5\n", "prompt_len: not used by kind train"),
    "not yaml": ("kind: [train\n", "not valid YAML/JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_is_one_line_and_writes_nothing(run, files, tmp_path, case):
    text, message = BAD_CONFIGS[case]
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    folder = tmp_path / "out"
    result = run("trace", "import", str(files / "step.json"), "--config", str(config),
                 "--output", str(folder))  # fmt: skip
    assert message in one_error_line(result)
    assert not folder.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.yaml"]


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"not json at all", "is not a profiler trace"), (b'{"a": 1}', "no 'traceEvents'")],
)
def test_not_a_trace_is_one_line_and_writes_nothing(run, files, tmp_path, content, message):
    trace = tmp_path / "bad.json"
    trace.write_bytes(content)
    folder = tmp_path / "out"
    result = run("trace", "import", str(trace), "--config", str(files / "train.yaml"),
                 "--output", str(folder))  # fmt: skip
    assert message in one_error_line(result)
    assert not folder.exists()


def test_missing_trace_and_unknown_gpu_option(run, files, tmp_path):
    result = run("trace", "import", str(tmp_path / "nope.json"), "--config",
                 str(files / "train.yaml"))  # fmt: skip
    assert "does not exist" in one_error_line(result)
    result = run("trace", "import", str(files / "step.json"), "--config",
                 str(files / "train.yaml"), "--gpu", "nope")  # fmt: skip
    assert "unknown GPU 'nope'" in one_error_line(result)


# --------------------------------------------------------------------------- real traces

ROOT = Path(__file__).resolve().parents[2]


def _real_pairs() -> list[tuple[Path, Path]]:
    """(trace, config) pairs of tests/data/traces/ (see its README.md): NAME.yaml beside
    NAME.json[.gz] or NAME.trace.json[.gz], or naming its trace on its first line."""
    pairs = []
    for config in sorted(DATA.glob("*.yaml")) if DATA.is_dir() else []:
        stem = config.name.removesuffix(".yaml")
        first = config.read_text().partition("\n")[0]
        named = (
            [ROOT / first.removeprefix("# trace:").strip()] if first.startswith("# trace:") else []
        )
        siblings = [
            DATA / f"{stem}{s}" for s in (".json.gz", ".json", ".trace.json.gz", ".trace.json")
        ]
        found = [p for p in named + siblings if p.is_file()]
        if found:
            pairs.append((found[0], config))
    return pairs


@pytest.mark.parametrize(("trace", "config"), _real_pairs(), ids=lambda p: p.name)
def test_real_trace(run, trace, config):
    result = run("trace", "import", str(trace), "--config", str(config), "--format", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["steps_in_trace"] >= 1 and out["step_measured_ms"] > 0
    parts = out["compute_ms"] + sum(v for k, v in out["gaps"].items() if k != "total_ms")
    assert parts == pytest.approx(out["step_measured_ms"], rel=1e-6)
    # the rules cover what real H100/H200 traces run, and GEMMs are the GEMMs predicted
    assert out["unmatched_ms"] <= 0.01 * out["kernel_measured_ms"], out["unmatched"][:10]
    gemm = next(c for c in out["classes"] if c["op_class"] == "gemm")
    assert abs(gemm["error"]) < 0.25, gemm
