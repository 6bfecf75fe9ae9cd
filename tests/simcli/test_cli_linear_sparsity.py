"""``--weight-sparsity``/``--activation-sparsity`` on ``simcli step``, ``serve`` and
``train``: the JSON keys appear only when given, the figures move the measured way, bad
input is one line with exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from simcli.cli import app

runner = CliRunner()
STEP = ["step", "--model", "llama3-8b", "--gpu", "h100-sxm", "--format", "json"]
DECODE = [*STEP, "--phase", "decode", "--batch", "1", "--context-len", "1024"]
PREFILL = [*STEP, "--phase", "prefill", "--prompt-len", "8192"]
SERVE = [
    "serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "2", "--num-requests", "40",
    "--prompt-len", "fixed:1024", "--output-len", "fixed:128", "--seed", "0", "--format", "json",
]  # fmt: skip
TRAIN = [
    "train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "2",
    "--micro-batch", "1", "--global-batch", "64", "--seq-len", "4096", "--recompute",
    "selective", "--zero", "1", "--format", "json",
]  # fmt: skip


def _json(args: list[str]) -> dict:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_step_keys_and_figures():
    dense_d, dense_p = _json(DECODE), _json(PREFILL)
    assert "weight_sparsity" not in dense_d  # dense output unchanged
    sp_d = _json([*DECODE, "--weight-sparsity", "2:4"])
    sp_p = _json([*PREFILL, "--weight-sparsity", "2:4"])
    assert sp_d["weight_sparsity"] == "2:4" and sp_d["activation_sparsity"] is None
    assert sp_p["step_ms"] < dense_p["step_ms"] and sp_d["step_ms"] > dense_d["step_ms"]
    assert sp_d["weight_gib_per_gpu"] < dense_d["weight_gib_per_gpu"]
    assert sp_d["kv_capacity_tokens"] > dense_d["kv_capacity_tokens"]
    cats = _json([*DECODE, "--activation-sparsity", "CATS:0.30"])
    assert cats["activation_sparsity"] == "cats:0.3" and cats["step_ms"] < dense_d["step_ms"]


def test_serve_capacity_grows_with_2_4():
    dense = _json(SERVE)
    sparse = _json([*SERVE, "--weight-sparsity", "2:4"])
    assert "weight_sparsity" not in dense and sparse["weight_sparsity"] == "2:4"
    assert sparse["kv_capacity_tokens_per_replica"] > dense["kv_capacity_tokens_per_replica"]
    assert sparse["weight_gib_per_gpu"] < dense["weight_gib_per_gpu"]
    assert sparse["tpot_s_p50"] > dense["tpot_s_p50"]  # decode-bound at 2 qps: 2:4 loses


def test_train_2_4():
    dense = _json(TRAIN)
    sparse = _json([*TRAIN, "--weight-sparsity", "2:4"])
    assert "weight_sparsity" not in dense and sparse["weight_sparsity"] == "2:4"
    assert sparse["iteration_s"] < dense["iteration_s"]
    assert sparse["peak_memory_gib"] == dense["peak_memory_gib"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([*DECODE, "--weight-sparsity", "3:4"], "allowed: 2:4, unstructured:S"),
        ([*DECODE, "--weight-sparsity", "unstructured:1"], "allowed: 2:4, unstructured:S"),
        ([*DECODE, "--activation-sparsity", "2:4"], "allowed: cats:F"),
        ([*DECODE, "--weight-sparsity", "2:4", "--weight-dtype", "fp8"], "bf16 or fp16"),
        (
            [*DECODE, "--weight-sparsity", "2:4", "--activation-sparsity", "cats:0.5"],
            "one sparse kernel per GEMM",
        ),
        ([*SERVE, "--weight-sparsity", "2:4", "--weight-dtype", "int8"], "bf16 or fp16"),
        ([*TRAIN, "--weight-sparsity", "unstructured:0.5"], "no training kernel"),
        ([*TRAIN, "--activation-sparsity", "cats:0.5"], "no training kernel"),
        ([*TRAIN, "--weight-sparsity", "2:4", "--precision", "fp8"], "no sparse training"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert needle in res.output and res.output.strip().count("\n") == 0
