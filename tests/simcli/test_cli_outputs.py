"""Single-file outputs get the format their name says, and a failed write names the output
(issue 18 items 3 and 9): ``serve --output sv.json`` used to write CSV into the .json file,
an unwritable output printed the temp file's name."""

import csv
import io
import json
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPS = str(ROOT / "examples" / "llama3-8b-layer-tp2.csv")

GEMM = ("predict", "gemm", "--m", "64", "--n", "64", "--k", "64", "--gpu", "h100-sxm")
# every command with a single-file --output (sweep export: test_sweep_export_follows_the_name)
COMMANDS = {
    "predict": ("predict", "--gpu", "h100-sxm", "--input", OPS),
    "predict gemm": GEMM,
    "predict layer": ("predict", "layer", "--model", "llama3-8b", "--seq-len", "512",
                      "--gpu", "h100-sxm"),
    "serve": ("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "4",
              "--num-requests", "20"),
    "serve plan": ("serve", "plan", "--model", "llama3-8b", "--qps", "2", "--slo-ttft-s", "1",
                   "--gpus-types", "h100-sxm", "--tp", "1", "--schedulers", "vllm",
                   "--pd-ratios", "none", "--num-requests", "50"),
    "sparsity compare": ("sparsity", "compare", "--model", "llama3-8b", "--gpu", "h100-sxm",
                         "--seq-lens", "8192", "--patterns", "dense;window:1024"),
    "train": ("train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "8",
              "--global-batch", "8", "--seq-len", "2048"),
}  # fmt: skip


@pytest.mark.parametrize("name", COMMANDS)
def test_a_json_name_gets_json_and_a_csv_name_csv(run, tmp_path, name):
    argv = COMMANDS[name]
    res = run(*argv, "--quiet", "--output", str(tmp_path / "out.json"))
    assert res.exit_code == 0, res.output
    obj = json.loads((tmp_path / "out.json").read_text())
    assert isinstance(obj, dict) and obj, name
    res = run(*argv, "--quiet", "--output", str(tmp_path / "out.csv"))
    assert res.exit_code == 0, res.output
    text = (tmp_path / "out.csv").read_text()
    assert not text.lstrip().startswith("{"), name
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows and len(rows[0]) > 1, name


def test_serve_json_output_is_the_json_result_with_the_requests(run, tmp_path):
    argv = (*COMMANDS["serve"], "--quiet")
    printed = json.loads(run(*argv, "--format", "json").stdout)
    assert run(*argv, "--output", str(tmp_path / "sv.json")).exit_code == 0
    written = json.loads((tmp_path / "sv.json").read_text())
    requests = written.pop("requests")
    wall = ("simulation_wall_s", "simulated_requests_per_wall_s")  # timings of this run
    assert {k: v for k, v in written.items() if k not in wall} == {
        k: v for k, v in printed.items() if k not in wall
    }
    assert len(requests) == printed["requests_completed"] == 20
    assert set(requests[0]) >= {"request_id", "ttft_s", "tpot_s", "e2e_s"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sv.json"]  # no temp files left


def test_predict_batch_json_output_is_what_format_json_prints(run, tmp_path):
    argv = COMMANDS["predict"]
    printed = json.loads(run(*argv, "--format", "json").stdout)
    assert run(*argv, "--output", str(tmp_path / "p.json")).exit_code == 0
    assert json.loads((tmp_path / "p.json").read_text()) == printed


def test_sweep_export_follows_the_name(run, tmp_path, monkeypatch):
    from simcli.commands import sweep as sweep_cmd

    class _Store:
        def frame(self):
            return None

        def close(self):
            pass

    import pandas as pd

    monkeypatch.setattr(sweep_cmd, "_open", lambda store: _Store())
    monkeypatch.setattr(
        "simcli.sweep.report.points_frame", lambda frame: pd.DataFrame([{"in.tp": 1}])
    )
    assert run("sweep", "export", "s.sqlite", "--output", str(tmp_path / "x.json")).exit_code == 0
    assert json.loads((tmp_path / "x.json").read_text())["points"] == [{"in.tp": 1}]
    assert run("sweep", "export", "s.sqlite", "--output", str(tmp_path / "x.csv")).exit_code == 0
    assert (tmp_path / "x.csv").read_text().splitlines() == ["in.tp", "1"]


@pytest.mark.parametrize(
    "argv, target",
    [
        ((*GEMM, "--output"), "p.csv"),
        ((*GEMM, "--output"), "bundle"),  # a folder: staged in a temp folder beside it
        ((*COMMANDS["serve"], "--quiet", "--output"), "r.json"),
        ((*COMMANDS["serve"], "--quiet", "--output"), "r.csv"),
    ],
)
def test_an_unwritable_output_is_named_not_its_temp_file(run, tmp_path, monkeypatch, argv, target):
    def refuse(*args, prefix="", suffix="", dir=None, **kw):
        name = Path(dir or ".") / f"{prefix}x1y2z3{suffix}"
        raise PermissionError(13, "Permission denied", str(name))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    out = tmp_path / target
    res = run(*argv, str(out))
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert lines == [f"error: cannot write {out}: Permission denied"], res.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_header_only_ops_csv_is_one_line(run, tmp_path):
    ops = tmp_path / "ops.csv"
    ops.write_text(Path(OPS).read_text().splitlines()[0] + "\n")
    for out in ("outdir", "pred.csv", None):
        extra = ("--output", str(tmp_path / out)) if out else ()
        res = run("predict", "--gpu", "h100-sxm", "--input", str(ops), *extra)
        assert res.exit_code == 2, res.output
        assert res.stderr.strip().splitlines() == [
            f"error: input CSV {ops} has a header but no rows; allowed: at least one op row"
        ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.csv"]
