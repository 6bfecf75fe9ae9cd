"""Where a GPU's predictions come from, as ``simcli specs show ID`` prints it."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize(
    ("gpu", "kind", "error_pct"),
    [("h100-sxm", "calibrated", 5.4), ("h100-pcie", "transferred", 17.0),
     ("a100-sxm-80gb", "calibrated", 8.6), ("b200", "datasheet", 36.0)],
)  # fmt: skip
def test_specs_show_prints_the_cost_model_provenance(run, gpu, kind, error_pct):
    result = run("specs", "show", gpu, "--format", "json")
    assert result.exit_code == 0, result.output
    cost = json.loads(result.stdout)["cost_model"]
    assert cost["provenance"] == kind
    assert cost["expected_error_pct"] == pytest.approx(error_pct, abs=0.05)
    assert cost["error_basis"] and cost["source"]
    measured = kind == "calibrated" and gpu.startswith("h")  # public A100 data: no power
    assert cost["power"].startswith("measured" if measured else "datasheet estimate")
    table = run("specs", "show", gpu)
    assert f"provenance={kind}" in table.stdout


def test_specs_show_of_a_link_has_no_cost_model(run):
    result = run("specs", "show", "nvlink4-nvswitch", "--format", "json")
    assert result.exit_code == 0 and "cost_model" not in json.loads(result.stdout)
