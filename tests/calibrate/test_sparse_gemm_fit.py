"""Fitting the sparse-weight GEMM parameters (calibrate/sparse/gemm.py) on the H100 rows:
held-out error, the shipped parameters reproduced by the fit, the split, the command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from calibrate.sparse import gemm as G
from costmodels.ops import sparse_gemm as S
from hardware_specs.registry import builtin_catalog

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibrate" / "data" / "h100-sxm" / "sparse_gemm.csv"


@pytest.fixture(scope="module")
def h100():
    return builtin_catalog().gpus["h100-sxm"]


@pytest.fixture(scope="module")
def measured():
    return G.read_measured(DATA)


def test_2_4_faster_than_dense_only_where_compute_bound_as_measured(h100, measured) -> None:
    d = measured
    dense = {
        (dt, m, n, k): t
        for dt, m, n, k, t, pat in zip(
            d["dtype"], d["m"], d["n"], d["k"], d["measured_s"], d["pattern"], strict=True
        )
        if pat == "dense"
    }
    # bf16 (cuSPARSELt's fp16 narrow kernel is faster: it ties dense GEMV on big layers)
    sel = (d["pattern"] == "2:4") & (d["backend"] == "cusparselt_graph") & (d["dtype"] == "bf16")
    m, n, k, dt, t = (d[c][sel] for c in ("m", "n", "k", "dtype", "measured_s"))
    td = np.array([dense[key] for key in zip(dt, m, n, k, strict=True)])
    faster = t < td
    # measured (kernel alone): 2:4 wins only from 64 tokens on (the narrow kernel loses
    # the decode range), and does win on big layers at large token counts
    assert faster.any() and m[faster].min() >= 64
    assert np.mean(t[m <= 32] > td[m <= 32]) > 0.99
    assert np.mean(t[m >= 4096] < td[m >= 4096]) > 0.8
    # the model agrees on the direction for nearly every measured pair
    ps = S.sparse_gemm_work(m, n, k, None, dt, "2:4", h100).time_s
    pd = S.sparse_gemm_work(m, n, k, None, dt, "dense", h100).time_s
    assert np.mean((ps < pd) == faster) >= 0.85
    # and predicts a win only where the dense GEMM is compute-bound-ish
    intensity = 2 * m * n * k / (2 * (m * k + n * k + m * n))
    ridge = h100.peak_flops_per_s("bf16") / h100.hbm_bytes_per_s
    assert np.all(intensity[ps < pd] >= ridge / 2)


def test_held_out_mape_bound(h100, measured) -> None:
    """``python -m calibrate.sparse.gemm eval calibrate/data/h100-sxm/sparse_gemm.csv``."""
    rep = G.report(measured, h100, S.sparse_params("hopper"))
    assert rep["2:4"]["held_out"]["rows"] >= 300
    assert rep["2:4"]["held_out"]["mape"] < 0.20
    assert rep["2:4"]["held_out"]["p90"] < 0.35
    assert rep["2:4/eager"]["held_out"]["mape"] < 0.25
    assert rep["cats/fused"]["held_out"]["mape"] < 0.10
    assert rep["cats/gather"]["held_out"]["mape"] < 0.10
    assert rep["dense"]["held_out"]["mape"] < 0.10
    # the 2:4 speedup at large token counts is reproduced
    big = rep["speedup_2:4"][16384]
    assert abs(big["model"] / big["measured"] - 1) < 0.1


def test_shipped_parameters_are_the_fit(h100, measured) -> None:
    fitted, rep = G.fit(measured, h100)
    shipped = S.sparse_params("hopper")
    ss, fs = shipped.semi_structured, fitted.semi_structured
    assert fs.compute_efficiency == pytest.approx(ss.compute_efficiency, abs=1e-9)
    assert fs.call_floor_s == pytest.approx(ss.call_floor_s, abs=1e-9)
    for name in ("memory_efficiency_factor", "narrow_memory_efficiency_factor"):
        assert getattr(fs, name) == pytest.approx(getattr(ss, name), abs=1e-9)
    assert fs.kernel_overhead_s == pytest.approx(ss.kernel_overhead_s, abs=1e-12)
    assert fitted.cats.gather_memory_efficiency == pytest.approx(
        shipped.cats.gather_memory_efficiency, abs=1e-9
    )
    assert fitted.cats.gather_launch_s == pytest.approx(shipped.cats.gather_launch_s, abs=1e-12)
    recorded = shipped.fit["held_out"]["2:4"]["mape"]
    assert rep["2:4"]["held_out"]["mape"] == pytest.approx(recorded, abs=1e-3)


def test_held_out_split_is_by_family(measured) -> None:
    held = G.held_out_mask(measured["family"])
    assert held.any() and (~held).any()
    assert {f.split("/")[0] for f in measured["family"][held]} == {"qwen2.5-7b", "qwen2.5-72b"}
    # no held-out layer shape is in the training rows (the split is by model, not random)
    shape = [f"{n}x{k}" for n, k in zip(measured["n"], measured["k"], strict=True)]
    shape = np.array(shape)
    assert not set(shape[held]) & set(shape[~held])


def test_fit_command_prints_the_shipped_parameters(capsys) -> None:
    """``python -m calibrate.sparse.gemm fit calibrate/data/h100-sxm/sparse_gemm.csv``
    (the command named in costmodels/data/sparse_gemm.yaml) prints the shipped values."""
    assert G.main(["fit", str(DATA)]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    shipped = S.sparse_params("hopper")
    assert out["semi_structured"] == {
        k: getattr(shipped.semi_structured, k) for k in out["semi_structured"]
    }
    assert len(out["semi_structured"]) == 5
    assert out["cats"] == {
        "gather_memory_efficiency": shipped.cats.gather_memory_efficiency,
        "gather_launch_s": shipped.cats.gather_launch_s,
    }
    recorded = shipped.fit["held_out"]
    for kind in ("2:4", "dense"):  # recorded to 3 decimals
        assert out[kind]["held_out"]["mape"] == pytest.approx(recorded[kind]["mape"], abs=5e-4)
    assert shipped.fit["command"] == f"{G.COMMAND} fit calibrate/data/h100-sxm/sparse_gemm.csv"


def test_unknown_gpu_is_one_line(capsys) -> None:
    assert G.main(["eval", str(DATA), "--gpu", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "known:" in err
