import json

import pandas as pd

from simcli.reports.plan import CSV_SCHEMAS
from tests.simcli.reports.browser import check_report

ARGS = ("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "64", "--top", "4")  # fmt: skip


def test_plan_bundle(run, tmp_path):
    out = tmp_path / "plans"
    res = run(*ARGS, "--output", str(out), "--format", "json")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    for name, schema in CSV_SCHEMAS.items():
        assert list(pd.read_csv(out / name).columns) == list(schema), name
    plans = pd.read_csv(out / "plans.csv")
    assert plans["rank"].tolist() == [1, 2, 3, 4]
    assert plans.iteration_s.tolist() == [p["iteration_s"] for p in result["plans"]] or (
        (plans.iteration_s / [p["iteration_s"] for p in result["plans"]] - 1).abs().max() < 1e-5
    )
    ev = pd.read_csv(out / "evaluated.csv")
    assert len(ev) == result["configs_evaluated"] and ev.fits.sum() == result["configs_fit"]
    assert ev.loc[~ev.fits, "estimate_s"].isna().all()
    # the best plan is no slower than any other fitting plan's closed-form time (1e-9 slack)
    assert plans.iteration_s.min() <= ev.estimate_s.min() * (1 + 1e-9)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["command"] == "plan" and cfg["inputs"]["global_batch"] == 64
    assert cfg["resolved"]["summary"]["configs_evaluated"] == result["configs_evaluated"]
    rendered = check_report(out / "report.html", tmp_path, min_svgs=2)
    assert "Pareto front" in rendered.text or "Time and memory" in rendered.text


def test_plan_file_outputs_unchanged(run, tmp_path):
    res = run(*ARGS, "--output", str(tmp_path / "p.csv"))
    assert res.exit_code == 0, res.output
    assert len(pd.read_csv(tmp_path / "p.csv")) == 4
    res = run(*ARGS, "--output", str(tmp_path / "p.json"))
    assert res.exit_code == 0
    assert len(json.loads((tmp_path / "p.json").read_text())["plans"]) == 4
