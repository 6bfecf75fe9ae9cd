"""Routed experts as grouped GEMMs (workloads/decompose/moe.py): one launch per projection
whatever the expert count, the distinct experts a batch touches, rows padded to the M
tile, routing skew, and the backward of a grouped GEMM."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.decompose import decode_step_ops, layer_backward_ops, layer_forward_ops
from workloads.decompose.moe import (
    LARGE_BLOCK_M,
    SMALL_BLOCK_M,
    expected_touched,
    padded_rows,
    touched_experts,
)
from workloads.decompose.serving import serving_templates, total_instances
from workloads.decompose.shard import tp_shard
from workloads.flops import op_flops
from workloads.models import get_model, with_moe_imbalance

EXPERT_OPS = ("expert_up", "expert_act", "expert_down")


def _with_experts(n: int):
    """Mixtral's shapes with ``n`` routed experts, top-2."""
    return get_model("mixtral-8x7b").model_copy(update={"num_experts": n})


@pytest.mark.parametrize("tokens", [1, 7, 64, 4096])
def test_launches_do_not_grow_with_the_expert_count(tokens):
    x = np.array([tokens])
    counts = []
    for n in (8, 64, 256):
        m = _with_experts(n)
        tpls = [t for t in serving_templates(m, tp_shard(m, 2))["layer"] if t.name in EXPERT_OPS]
        assert sorted(t.name for t in tpls) == sorted(EXPERT_OPS)
        counts.append(total_instances(tpls, x).sum())
    assert counts == [3.0, 3.0, 3.0]  # grouped up, activation, grouped down per layer


def test_touched_experts_at_one_token_are_the_top_k():
    for model_id in ("mixtral-8x7b", "deepseek-v2-lite", "deepseek-v3", "qwen1.5-moe-a2.7b"):
        m = get_model(model_id)
        k = m.experts_per_token
        assert expected_touched(m, np.array([1]))[0] == pytest.approx(k, rel=1e-12)
        assert touched_experts(m)(np.array([1]))[0] == k


def test_touched_experts_saturate_at_all_experts():
    m = get_model("deepseek-v3")  # E = 256, k = 8
    big = np.array([2048, 65536])
    assert np.all(touched_experts(m)(big) == 256)
    assert expected_touched(m, big) == pytest.approx([256, 256], rel=1e-9)
    # E (1 - (1 - k/E)^T): at T = 64, 256 (1 - (31/32)^64) = 222.4, not min(E, kT) = 256
    assert expected_touched(m, np.array([64]))[0] == pytest.approx(
        256 * (1 - (31 / 32) ** 64), rel=1e-12
    )
    assert touched_experts(m)(np.array([64]))[0] == 222
    t = touched_experts(m)(np.arange(1, 3000))
    assert np.all(np.diff(t) >= 0) and np.all(t <= np.minimum(256, 8 * np.arange(1, 3000)))


def test_touched_experts_match_a_routing_simulation():
    # top-k as k distinct uniform picks of E per token (seeded): the formula is the mean
    rng = np.random.default_rng(0)
    e, k, t, trials = 64, 6, 10, 4000
    picks = np.argsort(rng.random((trials, t, e)), axis=2)[:, :, :k].reshape(trials, -1)
    distinct = np.array([len(np.unique(p)) for p in picks])
    m = get_model("deepseek-v2-lite")  # E = 64, k = 6
    assert expected_touched(m, np.array([t]))[0] == pytest.approx(distinct.mean(), rel=0.01)


def test_rows_are_padded_to_the_kernel_m_tile():
    m = get_model("deepseek-v3")
    rows = padded_rows(m)
    # T <= E: BLOCK_SIZE_M 16 (vLLM's default config); 64 x 8 picks over 222 experts:
    # 3 rows for the busiest, padded to 16
    assert rows(np.array([1, 64, 256])).tolist() == [SMALL_BLOCK_M] * 3
    # T > E: 64-row tiles; 2048 x 8 / 256 = 64 rows exactly, 2049 tokens need a second tile
    assert rows(np.array([2048, 2049])).tolist() == [LARGE_BLOCK_M, 2 * LARGE_BLOCK_M]


def test_decode_reads_only_the_touched_experts_weights():
    m = get_model("deepseek-v3")
    for batch, touched in ((1, 8), (64, 222), (256, 256)):
        up = {o.name: o for o in decode_step_ops(m, batch, 1024, tp=8)}["expert_up"]
        assert up.count == 58 and up.op.batch == touched  # one launch per MoE layer
        assert (up.op.k, up.op.n) == (7168, 2 * 2048 // 8)


def test_imbalance_grows_the_busiest_experts_rows_monotonically():
    base = get_model("mixtral-8x7b")
    for tokens in (1, 8, 512, 4096):
        ms = []
        for f in (1.0, 1.5, 3.0, 100.0):
            m = with_moe_imbalance(base, f)
            ms.append(int(padded_rows(m)(np.array([tokens]))[0]))
        assert ms == sorted(ms)
        # at most all the tokens (a token visits an expert once), padded
        assert ms[-1] <= -(-tokens // LARGE_BLOCK_M) * LARGE_BLOCK_M
    skew = {o.name: o.op.m for o in layer_forward_ops(with_moe_imbalance(base, 3.0), 1, 4096)}
    assert skew["expert_up"] == 3 * 4096 * 2 // 8


def test_backward_of_a_grouped_gemm_is_grouped_with_twice_the_flops():
    m = get_model("mixtral-8x7b")
    fwd = {o.name: o for o in layer_forward_ops(m, 1, 4096, tp=2)}
    bwd = {o.name: o for o in layer_backward_ops(m, 1, 4096, tp=2)}
    for name in ("expert_up", "expert_down"):
        dgrad, wgrad = bwd[f"{name}_dgrad"], bwd[f"{name}_wgrad"]
        assert dgrad.op.batch == wgrad.op.batch == fwd[name].op.batch == 8
        assert dgrad.count == wgrad.count == 1
        assert op_flops(dgrad.op) + op_flops(wgrad.op) == 2 * op_flops(fwd[name].op)
