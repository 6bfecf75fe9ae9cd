"""The NSA/FSA kernel-choice fit (calibrate.sparse.nsa_fit) on the committed H100 sweep:
loading, family hold-outs, and the shipped coefficients being the all-rows fit."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from calibrate.sparse import nsa_fit


def test_data_loads_with_the_sweep_grid():
    d = nsa_fit.load()
    assert len(d) == 40
    assert sorted(d["group"].unique()) == [1, 2, 4, 8, 16]
    assert d["seq_len"].min() == 8192 and d["seq_len"].max() == 131072
    assert (d["nsa_fsa_rel_diff"] < 1e-2).all()  # the two kernels agreed on every input


def test_load_rejects_a_file_without_the_timing_columns(tmp_path):
    p = tmp_path / "x.csv"
    pd.DataFrame({"seq_len": [8192], "status": ["ok"]}).to_csv(p, index=False)
    with pytest.raises(ValueError, match="missing columns"):
        nsa_fit.load(p)


def test_held_out_splits_are_families_and_accurate():
    d = nsa_fit.load()
    ev = nsa_fit.evaluate(d)
    long_ = ev["splits"]["length>=98304"]
    g16 = ev["splits"]["group=16"]
    assert long_["held_out_rows"] == 10 and g16["held_out_rows"] == 8
    for s in (long_, g16):
        assert s["nsa_mape_pct"] < 5.0 and s["fsa_mape_pct"] < 10.0
    assert g16["choice_right"] == 8
    prev = ev["previous_model"]
    assert prev["nsa_mape_pct"] > 20.0 and prev["choice_right"] < 40


def test_shipped_coefficients_are_the_all_rows_fit():
    shipped = yaml.safe_load(nsa_fit.OUT.read_text())["h100-sxm"]
    fit = nsa_fit.fit_all(nsa_fit.load())
    for kernel in ("nsa", "fsa"):
        for k, v in fit[kernel].items():
            assert shipped[kernel][k] == pytest.approx(v, rel=1e-6, abs=1e-15)
