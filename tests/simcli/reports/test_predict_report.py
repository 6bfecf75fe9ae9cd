"""`simcli predict --output DIR`: predictions.csv, by_op.csv, config.json, report.html."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from simcli.reports.predict import CSV_SCHEMAS
from tests.simcli.reports.browser import check_report, one_error_line
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, SPARSITY_COLUMN

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "llama3-8b-layer-tp2.csv"
FULL_ROWS = [  # every contract column, nodes included
    "gemm,bf16,4096,4096,4096,,,,,,,,,,,,,",
    "attn_fwd,bf16,,,,2,4096,4096,32,8,128,true,flash,,,,,",
    "attn_decode,bf16,,,,64,1,8192,32,8,128,,,,,,,",
    "all_reduce,,,,,,,,,,,,,,,1073741824,8,1",
    "copy,,,,,,,,,,,,,,,268435456,,",
    "rmsnorm,bf16,8192,4096,,,,,,,,,,,,,,",
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The README quick start, once as a CSV file and once as a folder bundle."""
    from typer.testing import CliRunner

    from simcli.cli import app

    tmp = tmp_path_factory.mktemp("predict")
    runner = CliRunner()
    base = ["predict", "--gpu", "h100-sxm", "--input", str(EXAMPLE)]
    single = runner.invoke(app, [*base, "--output", str(tmp / "pred.csv")])
    assert single.exit_code == 0, single.output
    folder = tmp / "run"
    result = runner.invoke(app, [*base, "--output", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output
    return tmp, folder, result


def test_bundle_files_and_json_stdout(bundle):
    tmp, folder, result = bundle
    assert sorted(p.name for p in folder.iterdir()) == [
        "by_op.csv",
        "config.json",
        "predictions.csv",
        "report.html",
    ]
    summary = json.loads(result.stdout)  # --format json stays one clean object
    assert summary["rows"] == 30 and summary["output"] == str(folder)
    assert summary["model"].startswith("calibrated profile h100-sxm")
    # predictions.csv is exactly what the single-file mode writes
    assert (folder / "predictions.csv").read_text() == (tmp / "pred.csv").read_text()
    assert [p.name for p in tmp.iterdir() if p.name.startswith(".")] == []


def test_by_op_schema_and_totals(bundle):
    _, folder, result = bundle
    by_op = pd.read_csv(folder / "by_op.csv")
    assert list(by_op.columns) == list(CSV_SCHEMAS["by_op.csv"])
    pred = pd.read_csv(folder / "predictions.csv")
    assert by_op["rows"].sum() == len(pred)
    assert by_op["total_predicted_ms"].sum() == pytest.approx(pred["predicted_ms"].sum(), 1e-4)
    assert by_op["share_pct"].sum() == pytest.approx(100, abs=1e-3)
    assert by_op["total_predicted_ms"].is_monotonic_decreasing
    gemm = by_op.set_index("op").loc["gemm"]
    assert gemm["op_class"] == "gemm_half" and gemm["achieved_tflop_per_s"] > 100
    assert by_op.set_index("op").loc["all_reduce", "total_flops"] == 0


def test_config_records_resolved_inputs(bundle):
    _, folder, result = bundle
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["command"] == "predict" and cfg["simcli_version"]
    assert cfg["inputs"] == {
        "gpu": "h100-sxm",
        "input": str(EXAMPLE),
        "profile": None,
        "hardware": None,
    }
    assert cfg["cost_model"] == json.loads(result.stdout)["model"]


def test_report_renders(bundle, tmp_path):
    _, folder, _ = bundle
    rendered = check_report(folder / "report.html", tmp_path, min_svgs=3)  # classes, roofline, top
    assert "roofline" in (folder / "report.html").read_text()
    assert "Time by op kind" in rendered.text


def test_predictions_schema_with_every_column(run, tmp_path):
    # every column, the optional sparsity one too (2:4 on the gemm row)
    header = ",".join((*CSV_COLUMNS, *EXTRA_COLUMNS, SPARSITY_COLUMN))
    rows = [r + (",2:4" if r.startswith("gemm,") else ",") for r in FULL_ROWS]
    src = tmp_path / "ops.csv"
    src.write_text("\n".join([header, *rows]) + "\n")
    out = tmp_path / "bundle"
    result = run("predict", "--gpu", "h100-sxm", "--input", str(src), "--output", str(out))
    assert result.exit_code == 0, result.output
    layer_only = ("phase", "name", "count")
    assert list(pd.read_csv(out / "predictions.csv").columns) == [
        c for c in CSV_SCHEMAS["predictions.csv"] if c not in layer_only
    ]
    assert list(pd.read_csv(out / "by_op.csv").columns) == list(CSV_SCHEMAS["by_op.csv"])
    page = (out / "report.html").read_text()
    assert "ops without FLOPs" in page  # the copy row: GB/s panel beside the roofline


def test_bad_output_is_one_line_and_writes_nothing(run, tmp_path):
    src = tmp_path / "ops.csv"
    src.write_text("op,m,n,k\ngemm,128,256,512\n")
    base = ("predict", "--gpu", "h100-sxm", "--input", str(src), "--output")
    line = one_error_line(run(*base, str(tmp_path / "missing" / "run")))
    assert "parent folder" in line and "does not exist" in line
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    line = one_error_line(run(*base, str(taken)))
    assert "is an existing file" in line and "allowed: a folder" in line
    assert taken.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.csv", "taken"]


def test_bad_input_with_folder_output_leaves_no_folder(run, tmp_path):
    src = tmp_path / "ops.csv"
    src.write_text("op,m,n,k\ngemm,-1,256,512\n")
    out = tmp_path / "run"
    one_error_line(run("predict", "--gpu", "h100-sxm", "--input", str(src), "--output", str(out)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.csv"]


def _in_schema_order(columns) -> bool:
    schema = list(CSV_SCHEMAS["predictions.csv"])
    return all(c in schema for c in columns) and [schema.index(c) for c in columns] == sorted(
        schema.index(c) for c in columns
    )


def test_one_op_subcommands_write_the_same_bundle(run, tmp_path):
    out = tmp_path / "gemm"
    args = ["predict", "gemm", "--m", "4096", "--n", "4096", "--k", "4096", "--gpu", "h100-sxm"]
    result = run(*args, "--output", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    ms = json.loads(result.stdout)["predicted_ms"]
    pred = pd.read_csv(out / "predictions.csv")
    assert len(pred) == 1 and _in_schema_order(pred.columns)
    assert pred.loc[0, "m"] == 4096 and abs(pred.loc[0, "predicted_ms"] / ms - 1) < 1e-5
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["inputs"]["m"] == 4096 and cfg["inputs"]["op"] == "gemm"
    # the single-file forms
    result = run(*args, "--output", str(tmp_path / "one.json"))
    assert json.loads((tmp_path / "one.json").read_text())["op"] == "gemm"
    result = run(*args, "--output", str(tmp_path / "one.csv"))
    assert pd.read_csv(tmp_path / "one.csv").loc[0, "k"] == 4096


def test_layer_bundle_renders(run, tmp_path):
    out = tmp_path / "layer"
    result = run("predict", "layer", "--model", "llama3-8b", "--seq-len", "4096", "--tp", "2",
                 "--phase", "fwdbwd", "--gpu", "h100-sxm", "--output", str(out), "--format",
                 "json")  # fmt: skip
    assert result.exit_code == 0, result.output
    layer_ms = json.loads(result.stdout)["layer_ms"]
    pred = pd.read_csv(out / "predictions.csv")
    assert _in_schema_order(pred.columns) and set(pred.phase) == {"fwd", "bwd"}
    assert abs(pred.predicted_ms.sum() / layer_ms - 1) < 1e-5  # counts included
    check_report(out / "report.html", tmp_path, min_svgs=3)
