import numpy as np
import pandas as pd
import pytest

from costmodels.ops.energy import (
    EnergyModel,
    PowerModel,
    datasheet_power_model,
    datasheet_power_note,
)
from costmodels.ops.learned import NotFittedError
from costmodels.ops.select import get_cost_model
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, Op, ops_frame


def test_fit_recovers_power_model_and_respects_the_cap():
    rng = np.random.default_rng(0)
    uc, um = rng.uniform(0, 1, 40), rng.uniform(0, 1, 40)
    p = np.minimum(700, 70 + 900 * uc + 450 * um)
    fit = PowerModel.fit(uc, um, p, idle_w=70, cap_w=700)
    assert fit.compute_w == pytest.approx(900, rel=0.02)
    assert fit.memory_w == pytest.approx(450, rel=0.02)


def test_capped_samples_only_bound_from_below():
    # two uncapped memory-bound points, one compute-bound point at the cap
    fit = PowerModel.fit(
        np.array([0.0, 0.0, 0.3]),
        np.array([0.5, 0.9, 0.1]),
        np.array([300, 480, 700]),
        idle_w=70,
        cap_w=700,
    )
    assert fit.memory_w == pytest.approx(460, rel=0.05)
    assert 70 + fit.compute_w * 0.3 + fit.memory_w * 0.1 >= 700 * 0.98


def test_shipped_h100_energy_matches_measured_power_samples():
    measured = pd.read_csv("calibrate/data/h100-sxm/power.csv")
    copy = measured[measured["op"] == "copy"].iloc[0]
    model = get_cost_model("h100-sxm")
    assert model.power is not None
    op = Op(op="copy", bytes=int(copy["bytes"]))
    work = model.work(op)
    energy = model.power.energy_j(work, np.array(["bf16"]), model.gpu)[0]
    assert energy == pytest.approx(copy["energy_j"], rel=0.10)
    gemm = model.work(Op(op="gemm", m=8192, n=8192, k=8192))
    assert model.power.power_w(gemm, np.array(["bf16"]), model.gpu)[0] == pytest.approx(700.0)


def test_energy_in_single_op_output(run):
    import json

    out = json.loads(
        run(
            "predict",
            "gemm",
            "--m",
            "4096",
            "--n",
            "4096",
            "--k",
            "4096",
            "--gpu",
            "h100-sxm",
            "--format",
            "json",
        ).stdout
    )
    assert out["energy_j"] == pytest.approx(out["power_w"] * out["predicted_ms"] / 1e3)
    a100 = json.loads(
        run(
            "predict",
            "gemm",
            "--m",
            "64",
            "--n",
            "64",
            "--k",
            "64",
            "--gpu",
            "a100-sxm-80gb",
            "--format",
            "json",
        ).stdout
    )
    # no measured power model for the A100: the datasheet estimate, bounded by its 400 W TDP
    assert 0 < a100["power_w"] <= 400.0
    assert a100["energy_j"] == pytest.approx(a100["power_w"] * a100["predicted_ms"] / 1e3)


def _power_rows(gpu: str) -> pd.DataFrame:
    rows = pd.read_csv(f"calibrate/data/{gpu}/power.csv")
    rows = rows[rows["status"] == "ok"].copy()
    rows["measured_s"] = rows["measured_ms"] / 1e3
    keep = [*CSV_COLUMNS, *EXTRA_COLUMNS, "measured_s", "avg_power_w"]
    return rows[[c for c in rows.columns if c in keep]]


def test_energy_model_fit_reproduces_the_shipped_power_model():
    """EnergyModel.fit on the power suite's rows, with the profile's fitted analytical
    model and the board's idle and cap, gives the PowerModel the profile ships."""
    model = get_cost_model("h100-sxm")
    shipped = model.power
    fitted = EnergyModel(model.base, idle_w=shipped.idle_w, cap_w=shipped.cap_w)
    assert fitted.fit(_power_rows("h100-sxm")) is fitted
    assert fitted.power_.compute_w == pytest.approx(shipped.compute_w, rel=1e-9)
    assert fitted.power_.memory_w == pytest.approx(shipped.memory_w, rel=1e-9)


def test_energy_model_predicts_what_predict_reports(run):
    import json

    model = get_cost_model("h100-sxm")
    energy = EnergyModel.from_power(model, model.power)
    size = ["--m", "4096", "--n", "4096", "--k", "4096"]
    out = json.loads(run("predict", "gemm", *size, "--gpu", "h100-sxm", "--format", "json").stdout)
    ops = [Op(op="gemm", m=4096, n=4096, k=4096), Op(op="copy", bytes=2**30)]
    assert energy.predict(ops[0]) == pytest.approx(out["energy_j"], rel=1e-9)
    one_by_one = [energy.predict(o) for o in ops]
    np.testing.assert_allclose(energy.predict_many(ops_frame(ops)), one_by_one)


def test_energy_model_needs_fit_and_its_inputs():
    model = get_cost_model("h100-sxm")
    unfitted = EnergyModel(model.base)
    with pytest.raises(NotFittedError, match="not fitted"):
        unfitted.predict(Op(op="copy", bytes=2**20))
    with pytest.raises(ValueError, match="idle_w and cap_w"):
        unfitted.fit(_power_rows("h100-sxm"))
    with pytest.raises(ValueError, match="avg_power_w"):
        unfitted.fit(_power_rows("h100-sxm").drop(columns=["avg_power_w"]))


@pytest.mark.parametrize("gpu", ["h100-pcie", "a100-sxm-80gb", "a100-sxm-40gb", "l40s", "b200",
                                 "mi300x"])  # fmt: skip
def test_no_gpu_borrows_another_boards_power_model(gpu):
    """A GPU without its own NVML samples gets a datasheet estimate of its own TDP: the
    350 W H100 PCIe must not draw the 700 W the H100 SXM model says (it used to)."""
    model = get_cost_model(gpu)
    tdp_w = model.gpu.tdp_w
    assert model.power == datasheet_power_model(model.gpu)
    assert model.power.cap_w == tdp_w
    assert model.provenance.power == datasheet_power_note(model.gpu)
    assert "datasheet estimate" in model.provenance.power and f"{tdp_w:g} W TDP" in (
        model.provenance.power
    )
    big = model.work(Op(op="gemm", m=8192, n=8192, k=8192))
    watts = model.power.power_w(big, np.array(["bf16"]), model.gpu)[0]
    assert watts == pytest.approx(tdp_w)  # a large GEMM sits at the cap, as measured boards do
    copy = model.work(Op(op="copy", bytes=2**31))
    assert 0.1 * tdp_w < model.power.power_w(copy, np.array(["bf16"]), model.gpu)[0] < tdp_w


def test_datasheet_estimate_is_close_to_the_measured_boards():
    """On the two boards with NVML samples the datasheet shape is within 12% of the
    measured power of each power-suite row (its fractions come from these rows)."""
    for gpu in ("h100-sxm", "h200-sxm"):
        model = get_cost_model(gpu)
        rows = _power_rows(gpu)
        work = model.base.work_many(rows.drop(columns=["measured_s", "avg_power_w"]))
        dtype = rows["dtype"].to_numpy(dtype=str)
        from costmodels.ops.common import Work

        measured_work = Work(rows["measured_s"].to_numpy(), work.flops, work.bytes)
        estimate = datasheet_power_model(model.gpu).power_w(measured_work, dtype, model.gpu)
        np.testing.assert_allclose(estimate, rows["avg_power_w"], rtol=0.12)
