"""The serving expected-error rule on a small fidelity table."""

import pytest
import yaml

from costmodels.steps.serving_fidelity import serving_fidelity_fields, summarise


def _table(tmp_path):
    rows = [
        {"engine": "vllm", "metric_class": "ttft", "error_pct": e, "near_saturation": False}
        for e in (-10.0, 5.0, 15.0)
    ] + [
        {
            "engine": "sglang",
            "metric_class": "tpot_itl",
            "error_pct": 4.0,
            "near_saturation": False,
        },
        {"engine": "vllm", "metric_class": "tpot_itl", "error_pct": 90.0, "near_saturation": True},
    ]
    out = summarise(rows)
    p = tmp_path / "fid.yaml"
    p.write_text(yaml.safe_dump(out))
    return out, str(p)


def test_summarise_skips_near_saturation(tmp_path):
    out, _ = _table(tmp_path)
    assert out["by_engine"]["vllm"]["ttft"] == {"mape_pct": 10.0, "rows": 3}
    assert "tpot_itl" not in out["by_engine"]["vllm"]  # its only row was near saturation
    assert out["by_engine"]["all"]["tpot_itl"] == {"mape_pct": 4.0, "rows": 1}


def test_rule(tmp_path):
    _, path = _table(tmp_path)
    f = serving_fidelity_fields("vllm", 5.4, "calibrated", path=path)
    errs = {k.rsplit("pct_", 1)[1]: v for k, v in f.items() if k.startswith("serving_exp")}
    assert errs == {"ttft": 10.0, "tpot_itl": 8.0, "e2e": None, "throughput": None}
    assert f["serving_provenance"] == "partly-validated"
    g = serving_fidelity_fields("trtllm", 36.0, "datasheet", path=path)
    assert g["serving_provenance"] == "validated-other-engines"
    assert g["serving_expected_error_pct_ttft"] == 2 * 10.0 + 36.0
    assert serving_fidelity_fields("x", None, None, path=str(tmp_path / "none.yaml")) == {
        "serving_provenance": "unvalidated",
        "serving_expected_error_pct_ttft": None,
        "serving_expected_error_pct_tpot_itl": None,
        "serving_expected_error_pct_e2e": None,
        "serving_expected_error_pct_throughput": None,
    }


def test_the_shipped_table_is_the_validation_runners():
    """costmodels/data/serving_fidelity.yaml is written by validate_serving.py: every row
    ran, and each class's all-engine figure is the row-weighted mean of the engines'."""
    from costmodels.steps.serving_fidelity import METRIC_CLASSES, load_fidelity

    t = load_fidelity()
    assert t["written_by"].startswith("python benchmarks/validate_serving.py")
    every = t["by_engine"]["all"]
    for cls in METRIC_CLASSES:
        parts = [e[cls] for k, e in t["by_engine"].items() if k != "all" and cls in e]
        assert sum(p["rows"] for p in parts) == every[cls]["rows"]
        mean = sum(p["mape_pct"] * p["rows"] for p in parts) / every[cls]["rows"]
        assert mean == pytest.approx(every[cls]["mape_pct"], abs=0.02)
