"""A serve config naming a sparse attention pattern (simcli serve --attn-pattern)."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from costmodels.steps.serving import StepModel
from costmodels.steps.sparse import PatternStepModel
from simcli.cli import app

runner = CliRunner()


def _ms(model, pn, pp, dc):
    arr = [np.array(x, dtype=np.int64) for x in (pn, pp, dc)]
    return model.step_ms(*arr)


def test_window_speeds_up_long_steps_and_never_slows_any():
    dense = StepModel("llama3-8b", "h100-sxm")
    window = PatternStepModel("llama3-8b", "h100-sxm", pattern="window:4096")
    for pn, dc in [([32768], []), ([], [32768] * 32), ([2048], []), ([512], [1024] * 8)]:
        pp = [0] * len(pn)
        assert _ms(window, pn, pp, dc) <= _ms(dense, pn, pp, dc) + 1e-9
    assert _ms(window, [32768], [0], []) < 0.8 * _ms(dense, [32768], [0], [])
    assert _ms(window, [], [], [32768] * 32) < 0.8 * _ms(dense, [], [], [32768] * 32)
    # a window longer than the prompt changes nothing
    assert _ms(window, [2048], [0], []) == _ms(dense, [2048], [0], [])


def test_serve_cli_attention_pattern():
    # a 32k prompt: Llama-3.1-8B (128k context; Llama-3-8B's 8k would refuse it)
    args = ["serve", "--model", "llama3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--replicas",
            "1", "--qps", "0.5", "--num-requests", "20", "--prompt-len", "fixed:32768",
            "--output-len", "fixed:64", "--seed", "0", "--format", "json"]  # fmt: skip
    dense = json.loads(runner.invoke(app, args).stdout)
    res = runner.invoke(app, [*args, "--attn-pattern", "window:4096"])
    assert res.exit_code == 0, res.output
    sparse = json.loads(res.stdout)
    assert sparse["requests_completed"] == dense["requests_completed"] == 20
    assert sparse["ttft_s_p50"] < dense["ttft_s_p50"]
    bad = runner.invoke(app, [*args, "--attn-pattern", "window:0"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
