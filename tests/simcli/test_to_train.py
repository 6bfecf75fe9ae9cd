"""Time and cost to train (`--train-tokens` on `train` and `plan`)."""

from __future__ import annotations

import json
import math

import pytest

from simcli.training.to_train import to_train_fields
from tests.simcli.reports.browser import one_error_line


def test_fields_scale_the_iteration_to_the_budget():
    f = to_train_fields(iteration_s=2.0, tokens_per_iteration=1000, num_gpus=8,
                        usd_per_gpu_hour=3.0, train_tokens=10_500)  # fmt: skip
    assert f["train_iterations"] == 11  # a partial last iteration still runs
    assert f["days_to_train"] == pytest.approx(22.0 / 86400)
    assert f["gpu_hours_to_train"] == pytest.approx(22.0 * 8 / 3600)
    assert f["cost_usd_to_train"] == pytest.approx(22.0 * 8 / 3600 * 3.0)
    no_price = to_train_fields(iteration_s=2.0, tokens_per_iteration=1000, num_gpus=8,
                               usd_per_gpu_hour=None, train_tokens=1000)  # fmt: skip
    assert no_price["cost_usd_to_train"] is None


BASE = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "8192",
        "--global-batch", "512"]  # fmt: skip


def test_train_and_plan_report_time_and_cost_to_train(run):
    tokens = 15e12
    r = run("train", *BASE, "--tp", "2", "--zero", "1", "--train-tokens", str(tokens),
            "--price-per-gpu-hour", "2.5", "--format", "json", "--quiet")  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    iters = math.ceil(tokens / (512 * 8192))
    assert d["train_iterations"] == iters
    assert d["days_to_train"] == pytest.approx(iters * d["iteration_s"] / 86400)
    assert d["cost_usd_to_train"] == pytest.approx(d["gpu_hours_to_train"] * 2.5)
    plain = json.loads(run("train", *BASE, "--tp", "2", "--zero", "1", "--format", "json",
                           "--quiet").stdout)  # fmt: skip
    assert "days_to_train" not in plain  # only when asked
    p = run("plan", *BASE, "--top", "3", "--train-tokens", str(tokens), "--format", "json",
            "--quiet")  # fmt: skip
    assert p.exit_code == 0, p.output
    plans = json.loads(p.stdout)["plans"]
    days = [x["days_to_train"] for x in plans]
    assert days == sorted(days) and all(x["train_iterations"] == iters for x in plans)
    assert plans[0]["gpu_hours_to_train"] == pytest.approx(
        plans[0]["gpu_hours_per_iteration"] * iters
    )


def test_bad_budget_is_one_line(run):
    r = run("train", *BASE, "--train-tokens", "-5")
    assert "--train-tokens" in one_error_line(r) and r.exit_code != 0
