"""``serve plan --attn-pattern`` and ``--weight-sparsity``: capacity planning sees a
pattern's KV and sparse linear layers (issue 19). A sliding window frees old blocks, so a
memory-bound workload needs fewer replicas; a request longer than the dense cache still
fits when its window layers are capped; 2:4 weights slow small-batch decode (as measured)
and unstructured 70% ones speed it up."""

from __future__ import annotations

import json

import pytest

from costmodels.steps.sparse import kv_layout
from simcli.serving.plan_inputs import PlanError, PlanSpace
from simcli.serving.requests import Request
from simcli.serving.simulator import ServeConfig, SimulationError, Simulator
from tests.simcli.serving.test_kv_window import WindowStep, _requests
from workloads.sparsity import parse_pattern

PLAN = ("serve", "plan", "--model", "llama3-8b", "--gpus-types", "h100-sxm", "--tp", "1",
        "--schedulers", "vllm", "--pd-ratios", "none", "--qps", "20",
        "--prompt-len", "lognormal:6000:0.5:16000", "--output-len", "lognormal:800:0.5:4000",
        "--num-requests", "300", "--slo-ttft-s", "2", "--slo-tpot-s", "0.05", "--quiet",
        "--format", "json")  # fmt: skip


@pytest.fixture(scope="module")
def plans():
    from typer.testing import CliRunner

    from simcli.cli import app

    runner = CliRunner()
    out = {}
    for name, extra in (("dense", ()), ("window", ("--attn-pattern", "window:1024"))):
        res = runner.invoke(app, [*PLAN, *extra])
        assert res.exit_code == 0, res.output
        out[name] = json.loads(res.stdout)
    return out


def test_a_window_needs_fewer_replicas_and_says_why(plans):
    dense, window = plans["dense"], plans["window"]
    assert window["deployments"][0]["replicas"] < dense["deployments"][0]["replicas"]
    assert window["attn_pattern"] == "window:1024"
    assert "attn_pattern" not in dense  # dense output unchanged
    note = next(n for n in window["notes"] if n.startswith("KV layout"))
    assert "sliding-window" in note and "x the sequences" in note


def test_a_bad_pattern_is_one_line():
    from typer.testing import CliRunner

    from simcli.cli import app

    res = CliRunner().invoke(app, [*PLAN, "--attn-pattern", "windw:12"])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1
    with pytest.raises((ValueError, PlanError)):
        PlanSpace(attn_pattern="windw:12")


def test_a_long_request_fits_a_window_cache_but_not_a_dense_one():
    """40k-token cache: a 60k-token request is refused dense, served with window:512."""
    layout = kv_layout(parse_pattern("window:512"), 32)
    cfg = ServeConfig(max_model_len=131072, prefix_caching=False)
    with pytest.raises(SimulationError, match="needs"):
        Simulator(WindowStep(None), cfg).run([_long_request()])
    out = Simulator(WindowStep(layout), cfg, check=True).run([_long_request()]).summary
    assert out["requests_completed"] == 1


def _long_request() -> Request:
    """One request of 50k prompt + 10k output tokens (a fresh one per run)."""
    t = _requests(n=1)[0].arrival_s
    return Request(0, t, 50_000, 10_000)


SMALL = ("serve", "plan", "--model", "llama3-8b", "--gpus-types", "h100-sxm", "--tp", "1",
         "--schedulers", "vllm", "--pd-ratios", "none", "--qps", "20", "--num-requests", "300",
         "--slo-ttft-s", "2", "--slo-tpot-s", "0.05", "--quiet", "--format", "json")  # fmt: skip


def test_weight_sparsity_reaches_every_candidate():
    from typer.testing import CliRunner

    from simcli.cli import app

    runner = CliRunner()
    tpot = {}
    for ws in (None, "2:4", "unstructured:0.7"):
        res = runner.invoke(app, [*SMALL, *(("--weight-sparsity", ws) if ws else ())])
        assert res.exit_code == 0, res.output
        obj = json.loads(res.stdout)
        assert obj.get("weight_sparsity") == ws  # absent when dense
        tpot[ws] = obj["deployments"][0]["tpot_s_at_slo_percentile"]
    assert tpot["2:4"] > tpot[None] > tpot["unstructured:0.7"]
    bad = runner.invoke(app, [*SMALL, "--weight-sparsity", "3:4"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
