import json

import pandas as pd

from simcli.reports.train import CSV_SCHEMAS
from tests.simcli.reports.browser import check_report
from tests.simcli.reports.trace_check import check_no_overlap, load_trace

ARGS = ("train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "2",
        "--pp", "4", "--vpp", "2", "--pp-schedule", "interleaved", "--global-batch", "32",
        "--seq-len", "4096", "--zero", "1")  # fmt: skip


def test_train_bundle_report_and_trace(run, tmp_path):
    out, trace = tmp_path / "train", tmp_path / "iteration.json"
    res = run(*ARGS, "--output", str(out), "--trace", str(trace), "--format", "json")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)  # stdout stays one JSON object
    for name, schema in CSV_SCHEMAS.items():
        frame = pd.read_csv(out / name)
        assert list(frame.columns) == list(schema), name
    summary = pd.read_csv(out / "summary.csv").iloc[0]
    assert (
        summary.iteration_s == result["iteration_s"]
        or abs(summary.iteration_s / result["iteration_s"] - 1) < 1e-5
    )
    breakdown = pd.read_csv(out / "breakdown.csv")
    assert abs(breakdown.share.sum() - 1) < 1e-3  # the components add up to the iteration
    tl = pd.read_csv(out / "timeline.csv")
    assert set(tl["rank"]) == {0, 1, 2, 3} and (tl.duration_s >= 0).all()
    assert tl.end_s.max() <= result["iteration_s"] * (1 + 1e-6)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["command"] == "train" and cfg["simcli_version"]
    assert cfg["inputs"]["vpp"] == 2 and cfg["inputs"]["zero"] == 1
    assert cfg["resolved"]["plan"]["dp"] == 2  # resolved, not just what was typed
    assert "calibrated profile h100-sxm" in cfg["resolved"]["cost_model"]
    events = load_trace(trace)
    check_no_overlap(events)
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"pipeline rank 0", "compute", "dp-comm"} <= names
    # 4 ranks x 2 chunks x 16 micro-batches x (F, B) compute spans
    assert sum(1 for e in events if e["ph"] == "X" and e.get("cat") == "compute") == 256
    rendered = check_report(out / "report.html", tmp_path, min_svgs=3)
    assert "Pipeline timeline" in rendered.text


def test_train_output_file_forms(run, tmp_path):
    res = run(*ARGS, "--output", str(tmp_path / "r.json"), "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(res.stdout)
    res = run(*ARGS, "--output", str(tmp_path / "r.csv"))
    assert res.exit_code == 0, res.output
    row = pd.read_csv(tmp_path / "r.csv")
    assert len(row) == 1 and "breakdown_pp_bubble_s" in row.columns


def test_train_bad_output_leaves_nothing(run, tmp_path):
    res = run(*ARGS, "--output", str(tmp_path / "missing" / "dir"))
    assert res.exit_code == 2
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    assert "does not exist" in res.stderr
    assert list(tmp_path.iterdir()) == []
    # a plan that does not fit writes nothing either
    res = run("train", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "8",
              "--global-batch", "8", "--seq-len", "4096", "--output", str(tmp_path / "o"),
              "--trace", str(tmp_path / "t.json"))  # fmt: skip
    assert res.exit_code == 2 and "does not fit" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_train_bad_trace_path_fails_before_writing(run, tmp_path):
    res = run(*ARGS, "--output", str(tmp_path / "o"), "--trace", str(tmp_path / "no" / "t.json"))
    assert res.exit_code == 2 and "does not exist" in res.stderr
    assert list(tmp_path.iterdir()) == []
