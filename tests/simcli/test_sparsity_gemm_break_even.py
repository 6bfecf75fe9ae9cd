"""``simcli sparsity compare --weight-sparsity/--activation-sparsity``: break-even token
counts of the linear layers, from the sparse and dense GEMM models."""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from costmodels.ops.sparse_gemm import break_even
from hardware_specs.registry import builtin_catalog
from simcli.cli import app
from simcli.sparsity.gemm import GEMM_COLUMNS, check_sparsity_options

runner = CliRunner()
BASE = ["sparsity", "compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "8192",
        "--patterns", "dense", "--kernels-only", "--quiet"]  # fmt: skip


@pytest.fixture(scope="module")
def h100():
    return builtin_catalog().gpus["h100-sxm"]


def test_unstructured_break_even_grows_with_sparsity(h100) -> None:
    """More zeros, fewer weight bytes: the sparse kernel pays at least as far (the end is
    where the dense GEMM turns compute-bound, the same for every sparsity) and gains more
    at decode; below ~60% zeros the 16-bit indices eat the saving (Flash-LLM's format)."""
    prev, gain = 0, 0.0
    for s in (0.7, 0.8, 0.9):
        be = break_even(28672, 4096, "bf16", f"unstructured:{s}", h100)
        assert be.pays == "below" and be.break_even_tokens >= prev
        assert be.speedup_1_token > gain
        prev, gain = be.break_even_tokens, be.speedup_1_token
    for s in (0.4, 0.5):
        assert break_even(28672, 4096, "bf16", f"unstructured:{s}", h100).pays == "never"


def test_cats_break_even_shrinks_as_more_neurons_fire(h100) -> None:
    prev = 10**9
    for f in (0.05, 0.1, 0.3, 0.5):
        be = break_even(14336, 4096, "bf16", f"cats:{f}", h100)
        assert be.pays == "below" and be.break_even_tokens < prev
        prev = be.break_even_tokens


def test_2_4_pays_above_and_earlier_on_bigger_layers(h100) -> None:
    small = break_even(4096, 4096, "bf16", "2:4", h100)
    big = break_even(28672, 4096, "bf16", "2:4", h100)
    assert small.pays == big.pays == "above"
    assert big.break_even_tokens <= small.break_even_tokens
    assert small.speedup_1_token < 1 < small.speedup_max_tokens  # loses at decode (measured)


def test_json_csv_table_expose_the_rows() -> None:
    args = [*BASE, "--weight-sparsity", "2:4", "--activation-sparsity", "cats:0.5"]
    res = runner.invoke(app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["gemm_break_even"]
    assert {r["layer"] for r in rows} == {"qkv_proj", "o_proj", "mlp_up", "mlp_down"}
    assert all(set(r) == set(GEMM_COLUMNS) for r in rows)
    assert {r["sparsity"] for r in rows if r["layer"] in ("qkv_proj", "o_proj")} == {"2:4"}
    res = runner.invoke(app, [*args, "--format", "csv"])
    second = res.stdout.split("\n\n", 1)[1]
    assert next(csv.reader(io.StringIO(second))) == list(GEMM_COLUMNS)
    res = runner.invoke(app, [*args, "--format", "table"])
    assert res.exit_code == 0 and "break-even" in res.stdout


def test_without_the_options_the_object_is_unchanged() -> None:
    res = runner.invoke(app, [*BASE, "--format", "json"])
    assert res.exit_code == 0 and "gemm_break_even" not in json.loads(res.stdout)


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--weight-sparsity", "cats:0.5"), ("--weight-sparsity", "2:8"),
     ("--activation-sparsity", "2:4"), ("--activation-sparsity", "cats:0")],
)  # fmt: skip
def test_bad_values_one_line_exit_2(flag, value) -> None:
    res = runner.invoke(app, [*BASE, flag, value])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "allowed" in res.output


def test_check_options_canonicalises() -> None:
    assert check_sparsity_options("Unstructured:0.80", None) == ("unstructured:0.8", "")
    assert check_sparsity_options(None, "cats:.5") == ("", "cats:0.5")
