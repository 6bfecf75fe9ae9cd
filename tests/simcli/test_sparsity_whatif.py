"""Sparsity what-ifs (simcli/sparsity/whatif.py) and `simcli sparsity compare`."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from costmodels.steps.serving import StepModel
from simcli.commands import sparsity as sparsity_cmd
from simcli.errors import set_debug
from simcli.scenario import resolve_hardware
from simcli.sparsity import whatif as w
from simcli.training.simulator import simulate_iteration
from workloads.models import load_model
from workloads.plan import make_plan

GPU = "h100-sxm"


@pytest.fixture(scope="module")
def model():
    return load_model("llama3-8b")


@pytest.fixture(scope="module")
def pricer():
    return w.SparsityPricer(GPU, cost_models=lambda n: resolve_hardware(GPU, n).cost_model)


def by_pattern(rows: list[dict]) -> dict[str, dict]:
    return {r["pattern"]: r for r in rows}


# --------------------------------------------------------------------------- parsing


def test_split_patterns_keeps_parameters_with_their_pattern():
    text = "dense,nsa,window:4096,s2:local=2,stride=8,topk:k=8,per_head,foo:3"
    assert w.split_patterns(text) == [
        "dense",
        "nsa",
        "window:4096",
        "s2:local=2,stride=8",
        "topk:k=8,per_head",
        "foo:3",
    ]
    assert w.split_patterns("hybrid:dense_every=3,inner=nsa:l=32,d=16;dense") == [
        "hybrid:dense_every=3,inner=nsa:l=32,d=16",
        "dense",
    ]


def test_gqa_override(model):
    assert w.gqa_model(model, 4) is model  # llama3-8b: 32 heads, 8 KV heads
    assert w.gqa_model(model, 1).num_kv_heads == 32
    with pytest.raises(w.WhatIfError, match="allowed: 1, 2, 4, 8, 16, 32"):
        w.gqa_model(model, 3)


# --------------------------------------------------------------------------- rows


def test_dense_is_the_baseline_exactly_and_reproduces_the_simulators(model, pricer):
    rows = w.compare(model, GPU, 8192, "dense,window:2048", pricer=pricer)
    dense = rows[0]
    assert list(dense) == list(w.COLUMNS)
    for key in dense:
        if key.endswith("_speedup") or key == "kv_cache_ratio":
            assert dense[key] == 1.0, key
    assert dense["attn_kernel"] == "flash" and dense["dense_layers"] == 32
    # the dense row is what `simcli step` and `simcli train` say
    none = np.zeros(0, np.int64)
    sm = StepModel(model, GPU)
    assert dense["prefill_ms"] == pytest.approx(sm.step_ms(np.array([8192]), np.array([0]), none))
    assert dense["decode_step_ms"] == pytest.approx(sm.step_ms(none, none, np.array([8191])))
    plan = make_plan(model, num_gpus=1, global_batch=1, seq_len=8192)
    hw = resolve_hardware(GPU, plan.num_gpus)
    assert dense["train_iteration_s"] == pytest.approx(
        simulate_iteration(model, plan, system=hw.system, cost_model=hw.cost_model).iteration_s,
        rel=1e-12,
    )
    # and the sparse step costs of the dense pattern are the dense step costs
    base = pricer.step_costs(model, plan)
    same = w.sparse_step_costs(model, plan, "dense", GPU, pricer=pricer)
    assert same.layer_fwd.by_op_s == pytest.approx(base.layer_fwd.by_op_s)
    assert same.layer_bwd.compute_s == pytest.approx(base.layer_bwd.compute_s)


def test_window_speedup_grows_with_seq_len(model, pricer):
    rows = w.sweep(model, GPU, [8192, 32768, 65536], "dense,window:4096", pricer=pricer)
    win = [r for r in rows if r["pattern"] == "window:4096"]
    assert [r["seq_len"] for r in win] == [8192, 32768, 65536]
    speedups = ("attn_fwd", "attn_bwd", "decode_attn", "prefill", "decode_step", "train")
    for key in (f"{k}_speedup" for k in speedups):
        values = [r[key] for r in win]
        assert values == sorted(values) and values[-1] > values[0], (key, values)
        assert values[-1] > 1.0
    assert win[-1]["attn_fwd_speedup"] > 5.0  # 4k of 64k keys


def test_kv_bytes_shrink_for_window_and_s2_not_for_nsa(model, pricer):
    rows = by_pattern(
        w.compare(
            model,
            GPU,
            32768,
            "dense,window:4096,s2:local=8,stride=8,nsa",
            batch=2,
            pricer=pricer,
            end_to_end=False,
        )
    )
    dense = rows["dense"]
    # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes x 32768 tokens x 2 sequences
    assert dense["kv_cache_bytes"] == 32 * 8 * 128 * 2 * 2 * 32768 * 2
    assert rows["window:4096"]["kv_cache_ratio"] == pytest.approx(4096 / 32768)
    assert rows["s2:local=8,stride=8"]["kv_cache_ratio"] < 0.25
    nsa = rows["nsa"]
    assert nsa["kv_cache_bytes"] >= dense["kv_cache_bytes"]  # keeps all + compressed keys
    # ...but reads far fewer tokens: compressed (2047) + 16 x 64 selected + 512 window
    assert nsa["decode_read_tokens"] == 2047 + 16 * 64 + 512 < 32768
    assert nsa["decode_attn_ms"] < dense["decode_attn_ms"]
    assert nsa["attn_kernel"] in ("nsa", "fsa") and "faster" in nsa["kernel_reason"]


def test_hybrid_lies_between_dense_and_its_inner_pattern(model, pricer):
    rows = by_pattern(
        w.compare(
            model,
            GPU,
            32768,
            "dense,window:2048,hybrid:dense_every=4,inner=window:2048",
            pricer=pricer,
        )
    )
    d, inner, hyb = (
        rows["dense"],
        rows["window:2048"],
        rows["hybrid:dense_every=4,inner=window:2048"],
    )
    assert hyb["dense_layers"] == 8 and hyb["attn_kernel"] == "flash+flex"
    keys = ("attn_fwd_ms", "attn_bwd_ms", "decode_attn_ms", "kv_cache_bytes", "prefill_ms")
    for key in (*keys, "decode_step_ms", "train_iteration_s"):
        lo, hi = sorted((d[key], inner[key]))
        assert lo < hyb[key] < hi, key
    # per-layer columns are the layer mean: 8 dense + 24 window layers
    assert hyb["attn_fwd_ms"] == pytest.approx(
        (8 * d["attn_fwd_ms"] + 24 * inner["attn_fwd_ms"]) / 32
    )


def test_window_longer_than_the_sequence_is_dense(model, pricer):
    rows = by_pattern(
        w.compare(model, GPU, 2048, "dense,window:4096", pricer=pricer, end_to_end=False)
    )
    win = rows["window:4096"]
    assert win["attn_fwd_ms"] == rows["dense"]["attn_fwd_ms"]
    assert "priced as dense" in win["note"]


def test_tensor_parallel_heads_and_the_slowest_rank(model, pricer):
    rows = by_pattern(
        w.compare(
            model, GPU, 16384, "dense,s2:local=2,stride=16", tp=4, pricer=pricer, end_to_end=False
        )
    )
    s2 = rows["s2:local=2,stride=16"]
    assert "slowest of 4 TP ranks" in s2["note"]
    assert s2["kv_cache_bytes_per_gpu"] == pytest.approx(s2["kv_cache_bytes"] / 4)


# --------------------------------------------------------------------------- CLI


def _app() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(sparsity_cmd.app, name="sparsity")

    @root.callback()
    def _root() -> None:
        set_debug(False)

    return root


def invoke(*args: str):
    return CliRunner().invoke(_app(), ["sparsity", "compare", "--model", "llama3-8b", *args])


def test_cli_csv_one_row_per_seq_group_pattern(tmp_path):
    out = tmp_path / "rows.csv"
    r = invoke(
        "--gpu", GPU, "--seq-lens", "4096,8192", "--gqa-groups", "4,8",
        "--patterns", "dense,window:2048,s2:local=2,stride=8", "--format", "csv",
        "--output", str(out),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    frame = pd.read_csv(io.StringIO(r.stdout))
    assert list(frame.columns) == list(w.COLUMNS)
    combos = list(zip(frame.seq_len, frame.gqa_group, frame.pattern, strict=True))
    assert combos == [
        (s, g, p)
        for s in (4096, 8192)
        for g in (4, 8)
        for p in ("dense", "window:2048", "s2:local=2,stride=8")
    ]
    assert (frame.num_kv_heads == 32 // frame.gqa_group).all()
    # times and sizes carry their unit in the name
    numeric = frame.dropna(axis=1, how="all").select_dtypes("number").columns
    for col in numeric:
        units = ("_ms", "_s", "_bytes", "_per_gpu", "_speedup", "_ratio", "_tokens", "_per_s")
        counts = ("tp", "batch", "gqa_group", "num_heads", "num_kv_heads", "dense_layers")
        assert col.endswith((*units, "_density", "_len")) or col in counts, col
    assert pd.read_csv(out).shape == frame.shape  # --output wrote the same rows


def test_cli_json_and_table():
    r = invoke("--gpu", GPU, "--seq-len", "8192", "--patterns", "dense,nsa", "--format", "json",
               "--kernels-only")  # fmt: skip
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["columns"] == w.COLUMNS and len(obj["rows"]) == 2
    assert obj["rows"][1]["prefill_ms"] is None  # --kernels-only
    r = invoke("--gpu", GPU, "--seq-len", "8192", "--patterns", "dense,nsa", "--kernels-only")
    assert r.exit_code == 0, r.output
    assert "nsa" in r.stdout and "faster" in r.stdout  # the NSA/FSA reason below the table


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--patterns", "dense,foo:3"], "unknown sparsity pattern 'foo:3'"),
        (["--patterns", "window:abc"], "window:W"),
        (["--gqa-groups", "3"], "allowed: 1, 2, 4, 8, 16, 32"),
        (["--seq-lens", "8k"], "--seq-lens"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args, needle):
    r = invoke("--gpu", GPU, *(["--seq-len", "8192"] if "--seq-lens" not in args else []), *args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.output
