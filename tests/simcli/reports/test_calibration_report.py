"""`simcli calibrate report --output DIR` and `calibrate fit --report DIR`: fidelity.csv,
predictions.csv, config.json, report.html."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from simcli.reports.calibration import CSV_SCHEMAS
from tests.calibrate.test_fit import write_dataset
from tests.simcli.reports.browser import check_report, one_error_line

ROOT = Path(__file__).resolve().parents[3]
PROFILE = ROOT / "costmodels" / "profiles" / "h100-sxm.json"
SHIPPED = ROOT / "calibrate" / "data" / "h100-sxm"


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """A slice of the shipped H100 measurements: three op classes, a few hundred rows."""
    folder = tmp_path_factory.mktemp("data") / "h100-sxm"
    folder.mkdir()
    shutil.copy(SHIPPED / "meta.json", folder / "meta.json")
    for suite, rows in (("gemm", 120), ("decode", 80), ("elementwise", 80)):
        pd.read_csv(SHIPPED / f"{suite}.csv", dtype=str, keep_default_na=False).head(rows).to_csv(
            folder / f"{suite}.csv", index=False
        )
    return folder


@pytest.fixture(scope="module")
def report_bundle(small_data, tmp_path_factory):
    from typer.testing import CliRunner

    from simcli.cli import app

    folder = tmp_path_factory.mktemp("report") / "fidelity"
    args = ["calibrate", "report", "--profile", str(PROFILE), "--data", str(small_data)]
    result = CliRunner().invoke(app, [*args, "--output", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output
    return folder, result


def test_report_bundle_files_and_json_stdout(report_bundle):
    folder, result = report_bundle
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "fidelity.csv",
        "predictions.csv",
        "report.html",
    ]
    obj = json.loads(result.stdout)
    assert obj["gpu"] == "h100-sxm"
    classes = {r["op_class"] for r in obj["fidelity"]}
    assert {"gemm_half", "decode", "elementwise", "all"} <= classes


def test_csv_schemas(report_bundle):
    folder, _ = report_bundle
    for name, schema in CSV_SCHEMAS.items():
        assert list(pd.read_csv(folder / name, nrows=1).columns) == list(schema), name
    fid = pd.read_csv(folder / "fidelity.csv").set_index("op_class")
    rows = len(pd.read_csv(folder / "predictions.csv"))  # the ok rows of the slice
    assert fid.loc["all", "rows_held_out"] == rows > 200  # a new dataset: all held out
    assert fid.loc["all", "rows_fit"] == 0
    assert fid.loc["gemm_half", "profile_mape"] < fid.loc["gemm_half", "default_mape"]


def test_config_records_resolved_inputs(report_bundle, small_data):
    folder, _ = report_bundle
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["command"] == "calibrate report" and cfg["simcli_version"]
    assert cfg["inputs"] == {"profile": str(PROFILE), "data": [str(small_data.resolve())]}
    assert cfg["gpu"] == "h100-sxm" and cfg["profile_name"]
    assert cfg["measured_on"]["gpu_name"].startswith("NVIDIA H100")


def test_report_renders(report_bundle, tmp_path):
    folder, _ = report_bundle
    # the MAPE bars, then a scatter + histogram figure per op class
    rendered = check_report(folder / "report.html", tmp_path, min_svgs=4)
    assert "measured vs predicted" in (folder / "report.html").read_text()
    assert "Fidelity per op class" in rendered.text


def test_fit_report_colours_fit_and_held_out(run, tmp_path):
    data = write_dataset(tmp_path / "ds")
    profile, report = tmp_path / "prof.json", tmp_path / "report"
    args = ["--data", str(data), "--gpu", "h100-sxm", "--out", str(profile)]
    result = run("calibrate", "fit", *args, "--report", str(report), "--quiet", "--format", "json")
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    pred = pd.read_csv(report / "predictions.csv")
    assert set(pred["side"]) == {"fit", "held_out"}
    assert list(pred.columns) == list(CSV_SCHEMAS["predictions.csv"])
    cfg = json.loads((report / "config.json").read_text())
    assert cfg["command"] == "calibrate fit" and cfg["inputs"]["gpu"] == "h100-sxm"
    assert cfg["inputs"]["data"] == [str(data.resolve())]
    page = (report / "report.html").read_text()
    assert page.count("<svg") >= 3 and "fit (" in page and "held-out (" in page


def test_single_file_output(run, small_data, tmp_path):
    base = ["calibrate", "report", "--profile", str(PROFILE), "--data", str(small_data)]
    assert run(*base, "--output", str(tmp_path / "fid.csv"), "--quiet").exit_code == 0
    assert list(pd.read_csv(tmp_path / "fid.csv").columns) == list(CSV_SCHEMAS["fidelity.csv"])
    assert run(*base, "--output", str(tmp_path / "fid.json")).exit_code == 0
    assert json.loads((tmp_path / "fid.json").read_text())["fidelity"][0]["op_class"]


def test_bad_output_is_one_line_and_writes_nothing(run, small_data, tmp_path):
    base = ["calibrate", "report", "--profile", str(PROFILE), "--data", str(small_data)]
    line = one_error_line(run(*base, "--output", str(tmp_path / "missing" / "dir")))
    assert "does not exist" in line
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    assert "is an existing file" in one_error_line(run(*base, "--output", str(taken)))
    assert taken.read_text() == "keep me"
    # fit: a bad --report is refused before fitting, and no profile is written
    fit = ["calibrate", "fit", "--data", str(small_data), "--gpu", "h100-sxm"]
    profile = tmp_path / "p.json"
    line = one_error_line(run(*fit, "--out", str(profile), "--report", str(taken)))
    assert "--report" in line and "existing file" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
