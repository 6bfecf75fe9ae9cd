"""Composition fit: ratio-of-sums factors, the idle factor from GPU-bound steps only, the
held-out report, and the shipped files reproduced from the committed traces."""

from __future__ import annotations

import json

import pytest

from calibrate.trace.fit import (
    SUITES,
    TracedStep,
    fit_factors,
    fit_gpu,
    fit_suite,
    gpu_bound_step_errors,
    kernel_sum_errors,
    serving_suite_steps,
    step_errors,
    suite_steps,
)
from costmodels.steps.composition import GROUPS, HOST_KEY, SHIPPED_DIR

ROOT = SHIPPED_DIR.parents[2]


def _step(model, meas, pred, step_s, fw="pytorch", ops=0):
    zeros = dict.fromkeys(GROUPS, 0.0)
    return TracedStep(fw, model, "s", {**zeros, **meas}, {**zeros, **pred}, step_s, ops)


def test_ratio_of_sums_and_idle_from_gpu_bound_steps():
    steps = [
        _step("a", {"gemm": 3.0, "memory_bound": 1.0}, {"gemm": 2.0, "memory_bound": 2.0}, 4.4),
        _step("a", {"gemm": 1.0, "memory_bound": 1.0}, {"gemm": 1.0, "memory_bound": 1.0}, 2.1),
        # host-bound (kernels fill half the step): its kernels ran apart, so it counts for
        # neither the groups nor idle
        _step("a", {"gemm": 1.0, "memory_bound": 1.0}, {"gemm": 9.0, "memory_bound": 9.0}, 4.0),
    ]
    f = fit_factors(steps)["pytorch"]
    assert f["gemm"] == pytest.approx(4.0 / 3.0)
    assert f["memory_bound"] == pytest.approx(2.0 / 3.0)
    assert f["idle"] == pytest.approx(6.5 / 6.0)
    assert "attention" not in f  # nothing predicted: factor 1 by absence
    assert HOST_KEY not in f  # ops unknown (0): no host fit


def test_host_time_per_op_fitted_from_host_bound_steps():
    # GPU-bound steps of 1 s; host-bound ones that take 2 us per op (one noisy: 3 us)
    steps = [_step("a", {"gemm": 1.0}, {"gemm": 1.0}, 1.0, ops=100_000)]
    steps += [_step("a", {"gemm": 0.1}, {"gemm": 0.1}, 2e-6 * n, ops=n) for n in (1e5, 2e5, 3e5)]
    steps += [_step("a", {"gemm": 0.1}, {"gemm": 0.1}, 3e-6 * 4e5, ops=4e5)]
    f = fit_factors(steps)["pytorch"]
    assert f[HOST_KEY] == pytest.approx(2e-6)  # the median-like fit ignores the noisy one
    held = [_step("b", {"gemm": 0.2}, {"gemm": 0.1}, 2e-6 * 5e5, ops=5e5)]
    assert step_errors(held, {"pytorch": f}).error.iloc[0] == pytest.approx(0.0, abs=1e-9)
    assert step_errors(held, None).error.iloc[0] == pytest.approx(0.1 / 1.0 - 1.0)
    # no host-bound step: the data cannot say, no host term
    assert HOST_KEY not in fit_factors(steps[:1])["pytorch"]


def test_errors_and_held_out_meta():
    fit = [_step("a", {"gemm": 2.0}, {"gemm": 1.0}, 2.2)]
    held = [_step("b", {"gemm": 4.0}, {"gemm": 2.0}, 4.4)]
    factors = fit_factors(fit)
    assert kernel_sum_errors(held, None).error.iloc[0] == pytest.approx(-0.5)
    assert kernel_sum_errors(held, factors).error.iloc[0] == pytest.approx(0.0)
    assert gpu_bound_step_errors(held, factors).error.iloc[0] == pytest.approx(0.0)
    comp = fit_suite("h100-sxm", fit + held, ("a",), ("b",))
    e = comp.meta["held_out_error"]["pytorch"]
    assert e["kernel_sum_mape_before"] == pytest.approx(0.5)
    assert e["kernel_sum_mape_after"] == pytest.approx(0.0)
    assert comp.meta["fitted_on"] == ["a"] and comp.meta["held_out"] == ["b"]


@pytest.mark.parametrize("gpu", sorted(SUITES))
def test_shipped_factors_refit_from_the_committed_traces(gpu):
    steps = suite_steps(gpu, [ROOT / "calibrate" / "data" / sub for sub in SUITES[gpu]])
    # steps2: 9 eager, 2 recompute, 12 compiled / fp8; steps3: 16 + 4 eager, 8 compiled,
    # and on the H200 the Llama-2-7B shape (3 eager, 1 recompute, 1 compiled)
    assert len(steps) == 23 + 28 + (5 if gpu == "h200-sxm" else 0)
    comp = fit_gpu(gpu, SUITES[gpu])
    shipped = json.loads((SHIPPED_DIR / f"{gpu}.json").read_text())
    assert comp.factors == shipped["factors"]
    assert comp.meta["held_out_error"] == shipped["meta"]["held_out_error"]
    assert comp.meta["serving"]["held_out_error"] == shipped["meta"]["serving"]["held_out_error"]
    # the held-out (Qwen-, Llama-3B- and Llama-2-7B-shaped) steps get better, not worse
    for e in comp.meta["held_out_error"].values():
        assert e["kernel_sum_mape_after"] < e["kernel_sum_mape_before"] + 0.005
        assert e["gpu_bound_step_mape_after"] <= e["gpu_bound_step_mape_before"]
        assert e["step_mape_after"] < 0.6 * e["step_mape_before"]
    # both engines dispatch from the host: a host cost was fitted, tens of microseconds
    for fw in ("pytorch", "pytorch-compile"):
        assert 1e-5 < comp.factors[fw][HOST_KEY] < 1e-4
    # serving (Llama-3-8B fitted, Qwen2.5-7B held out): prefill streams and graph decode
    serving = comp.meta["serving"]["held_out_error"]
    assert set(serving) == {"pytorch-eager/graph", "pytorch-eager/stream"}
    for e in serving.values():
        assert e["gpu_bound_step_mape_after"] <= e["gpu_bound_step_mape_before"]


def test_serving_steps_of_the_traced_suites():
    steps = serving_suite_steps("h200-sxm", ROOT / "calibrate" / "data" / "steps2-h200-sxm")
    keys = sorted({(s.framework, s.model) for s in steps})
    assert len(steps) == 18  # 8 + 8 (prefill, graph decode) + 2 eager decodes
    assert ("pytorch-eager/graph", "qwen2.5-7b") in keys
    assert all(sum(s.measured_s.values()) > 0 and s.step_s > 0 for s in steps)
