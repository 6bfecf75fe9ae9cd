"""Tile-table block-sparse attention (costmodels/ops/sparse_attention.py): invariants and the
NSA/FSA choice against the published direction. The fit and its held-out fidelity by
pattern family: tests/calibrate/test_sparse_attention_fit.py."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from costmodels.ops import sparse_attention as sa
from workloads.sparsity import parse_pattern

GPUS = ["h100-sxm", "h200-sxm"]


def _counts(full: np.ndarray, partial: np.ndarray, block: int = 128) -> sa.TileCounts:
    return sa.TileCounts.from_masks(full, partial & ~full, block, block)


def _nested_topk(heads: int, nb: int, ks: list[int], seed: int = 0) -> list[sa.TileCounts]:
    """Top-k tables whose visited sets grow with k (same random scores)."""
    rng = np.random.default_rng(seed)
    lower = np.tril(np.ones((nb, nb), bool))
    scores = np.where(lower, rng.random((heads, nb, nb)), -1.0)
    scores[:, np.arange(nb), np.arange(nb)] = 2.0
    order = np.argsort(-scores, axis=-1)
    out = []
    for k in ks:
        t = np.zeros((heads, nb, nb), bool)
        np.put_along_axis(t, order[..., :k], True, axis=-1)
        t &= lower
        diag = np.eye(nb, dtype=bool)[None]
        out.append(_counts(t & ~diag, t & diag))
    return out


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("seq,heads", [(8192, 8), (32768, 16)])
def test_density_one_equals_dense_within_the_model(seq, heads):
    table = parse_pattern("dense").tiles(seq, heads)
    assert table.density == 1.0
    via_table = sa.block_sparse_time(table)
    direct = sa.block_sparse_time(sa.dense_tile_counts(seq, seq, heads, 128))
    assert via_table.fwd_s == pytest.approx(direct.fwd_s, rel=1e-12)
    assert via_table.bwd_s == pytest.approx(direct.bwd_s, rel=1e-12)
    assert via_table.exact_transpose is False and direct.exact_transpose is True
    causal = sa.block_sparse_time(parse_pattern("causal").tiles(seq, heads))
    assert causal.fwd_s < via_table.fwd_s < 2.2 * causal.fwd_s


def test_dense_and_causal_match_measurements_and_the_density_model():
    from costmodels.ops.select import get_cost_model
    from workloads.ops import Op

    model = get_cost_model("h100-sxm")
    # measured H100 rows (calibrate/data/h100-sxm/blocksparse.csv): dense, causal 16k x 16
    for causal, measured_ms in ((False, 5.23965), (True, 2.81184)):
        tc = sa.dense_tile_counts(16384, 16384, 16, 128, causal=causal)
        ours = sa.block_sparse_time(tc, gpu="h100-sxm").fwd_s
        assert ours * 1e3 == pytest.approx(measured_ms, rel=0.06)
        op = Op(
            op="attn_blocksparse_fwd",
            dtype="bf16",
            batch=1,
            seq_q=16384,
            seq_kv=16384,
            heads_q=16,
            heads_kv=16,
            head_dim=128,
            causal=causal,
            backend="flex",
            density=tc.density,
            block_size=128,
        )
        assert ours == pytest.approx(model.predict(op), rel=0.10)


@pytest.mark.parametrize("gpu", GPUS)
def test_monotone_in_density_for_nested_tables(gpu):
    ks = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    times = [sa.block_sparse_time(t, gpu=gpu) for t in _nested_topk(8, 64, ks)]
    for a, b in zip(times, times[1:], strict=False):
        assert b.fwd_s >= a.fwd_s and b.bwd_s >= a.bwd_s
    windows = [256, 512, 1024, 2048, 4096, 8192]
    wt = [
        sa.block_sparse_time(parse_pattern(f"window:{w}").tiles(8192, 16), gpu=gpu) for w in windows
    ]
    for a, b in zip(wt, wt[1:], strict=False):
        assert b.fwd_s >= a.fwd_s and b.bwd_s >= a.bwd_s


def test_adding_tiles_never_speeds_up_random_tables():
    rng = np.random.default_rng(3)
    for _ in range(25):
        heads, nb = int(rng.integers(1, 9)), int(rng.integers(4, 40))
        base = rng.random((heads, nb, nb)) < rng.uniform(0.05, 0.6)
        part = base & (rng.random(base.shape) < 0.3)
        more = base | (rng.random(base.shape) < 0.1)
        t0 = sa.block_sparse_time(_counts(base & ~part, part))
        t1 = sa.block_sparse_time(_counts(more & ~part, part))
        assert t1.fwd_s >= t0.fwd_s - 1e-15 and t1.bwd_s >= t0.bwd_s - 1e-15


@pytest.mark.parametrize("spec", ["window:2048", "topk:k=8", "s2:local=2,stride=8", "nsa"])
def test_speedup_never_exceeds_the_flop_ratio(spec):
    seq, heads = 32768, 16
    table = parse_pattern(spec).tiles(seq, heads)
    if table.branches:
        table = table.branches["selected"]
    masks = None if "nsa" in spec else parse_pattern(spec).tile_masks(seq, heads)["main"]
    sparse = sa.block_sparse_time(table, masks=masks)
    dense = sa.block_sparse_time(sa.dense_tile_counts(seq, seq, heads, 128))
    for s, d in ((sparse.fwd, dense.fwd), (sparse.bwd, dense.bwd)):
        flop_ratio = d.flops / s.flops
        # sparse time >= its tile compute, which is proportional to its FLOPs; the dense
        # call can only lose its fixed costs (launch, per-CTA, pre-kernel, imbalance)
        overhead = d.time_s / d.compute_s - 1.0
        assert s.time_s >= s.compute_s
        assert 0.0 <= overhead < 0.08
        assert d.time_s / s.time_s <= flop_ratio * (1.0 + overhead) * (1 + 1e-9)
        assert 1.0 < d.time_s / s.time_s < flop_ratio


def test_makespan_is_at_least_the_average_and_matches_exact_greedy():
    rng = np.random.default_rng(0)
    for spec in ["causal", "window:1024", "topk:k=4", "s2:local=1,stride=16"]:
        r = sa.block_sparse_time(parse_pattern(spec).tiles(16384, 4))
        for k in (r.fwd, r.bwd):
            assert k.makespan_s >= k.average_s * (1 - 1e-12)
            assert k.imbalance >= 1.0
    for _ in range(20):  # exact below EXACT_WAVES waves
        n, slots = int(rng.integers(1, 600)), int(rng.choice([3, 16, 132]))
        w = rng.pareto(2.0, n) + 0.1
        heap = [(0.0, s) for s in range(slots)]
        for x in w:
            t, s = heapq.heappop(heap)
            heapq.heappush(heap, (t + x, s))
        got = sa.list_schedule([w], slots)[0][0]
        if n <= sa.EXACT_WAVES * slots:
            assert got == pytest.approx(max(heap)[0], rel=1e-12)
        assert got >= w.sum() / slots and got >= w.max()


def test_causal_imbalance_is_real_at_few_waves():
    # 8 query blocks x 1 head, causal: CTAs of 1..8 tiles on 132 SMs -> the longest CTA
    r = sa.block_sparse_time(sa.dense_tile_counts(1024, 1024, 1, 128, causal=True))
    assert r.fwd.imbalance > 3.0


def test_partial_tiles_cost_more_than_full_ones():
    nb, heads = 32, 8
    vis = np.tril(np.ones((nb, nb), bool))[None].repeat(heads, 0)
    none = np.zeros_like(vis)
    all_full = sa.block_sparse_time(_counts(vis, none))
    all_partial = sa.block_sparse_time(_counts(none, vis))
    assert all_partial.fwd_s > 1.5 * all_full.fwd_s
    assert all_partial.bwd_s > all_full.bwd_s


def test_transpose_mirror_is_exact_for_banded_patterns():
    for spec in ["dense", "causal", "window:1000"]:
        p = parse_pattern(spec)
        derived = sa.tile_counts(p.tiles(4096, 2))
        exact = sa.tile_counts(None, masks=p.tile_masks(4096, 2)["main"])
        np.testing.assert_array_equal(derived.full_t, exact.full_t)
        np.testing.assert_array_equal(derived.partial_t, exact.partial_t)


def test_gqa_shared_table_and_errors():
    table = parse_pattern("topk:k=4").tiles(8192, 2)  # one table per KV head
    r = sa.block_sparse_time(table, heads_q=8, heads_kv=2)
    per_q = sa.block_sparse_time(sa.tile_counts(table).expand_heads(8), heads_kv=2)
    assert r.fwd_s == pytest.approx(per_q.fwd_s) and r.bwd_s == pytest.approx(per_q.bwd_s)
    with pytest.raises(sa.SparseAttentionError, match="heads_kv"):
        sa.block_sparse_time(table, heads_q=8, heads_kv=3)
    with pytest.raises(sa.SparseAttentionError, match="cannot describe"):
        sa.block_sparse_time(table, heads_q=5, heads_kv=5)
    with pytest.raises(sa.SparseAttentionError, match="unknown GPU"):
        sa.block_sparse_time(table, gpu="nope")
    with pytest.raises(sa.SparseAttentionError, match="dtype"):
        sa.block_sparse_time(table, dtype="int4")


def test_uncalibrated_gpu_and_backend_fall_back_to_derived_parameters():
    table = parse_pattern("causal").tiles(8192, 8)
    a100 = sa.block_sparse_time(table, gpu="a100-sxm-80gb")
    assert "uncalibrated" in a100.params_source
    h100 = sa.block_sparse_time(table, gpu="h100-sxm")
    assert a100.fwd_s > h100.fwd_s  # 312 vs 989 TFLOP/s peak
    flash = sa.block_sparse_time(table, gpu="h100-sxm", backend="flash")
    assert math.isfinite(flash.fwd_s) and flash.fwd_s > 0


# --------------------------------------------------------------------------- SALE and S2


def test_sale_estimate_is_about_eleven_percent_of_dense():
    table = parse_pattern("sale:density=0.1").tiles(65536, 8)
    st = sa.sale_time(table)
    assert st.estimate_s == pytest.approx(0.11 * st.dense_s)
    assert st.total_s == pytest.approx(st.estimate_s + st.sparse_s)
    assert 1.0 < st.speedup < 1.0 / 0.11
    both = sa.pattern_time(table)
    assert both["leaves"]["estimate"]["fwd_s"] == pytest.approx(st.estimate_s)
    assert both["fwd_s"] == pytest.approx(st.total_s)


def test_s2_heterogeneous_heads_makespan():
    # 4 heads, one with twice the strided blocks: head sharding waits for the heavy rank
    p_light = parse_pattern("s2:local=2,stride=8").tile_masks(16384, 4)["main"]
    p_heavy = parse_pattern("s2:local=2,stride=4").tile_masks(16384, 4)["main"]
    full = np.concatenate([p_light.full[:3], p_heavy.full[:1]])
    part = np.concatenate([p_light.partial[:3], p_heavy.partial[:1]])
    tc = sa.TileCounts.from_masks(full, part, 128, 128)
    sharded = sa.head_sharded_time(tc, 4)
    assert sharded["imbalance"] > 1.1
    assert sharded["time_s"] == pytest.approx(max(sharded["rank_s"]))
    one = sa.block_sparse_time(tc)
    assert one.fwd_s >= sharded["time_s"]


# --------------------------------------------------------------------------- NSA vs FSA


def test_fsa_beats_nsa_for_small_groups_and_not_for_large_ones():
    for gpu in GPUS:
        for block, sel in ((64, 16), (128, 8)):
            speedups = [
                sa.nsa_kernel_choice(
                    seq_len=65536, heads_q=4 * g, heads_kv=4, block=block, selected=sel, gpu=gpu
                ).fsa_speedup
                for g in (1, 2, 4, 8, 16, 32)
            ]
            assert all(a > b for a, b in zip(speedups, speedups[1:], strict=False))
            assert speedups[0] > 2.0  # G = 1
            assert speedups[-1] < 1.0  # G = 32
    small = sa.nsa_kernel_choice(seq_len=65536, heads_q=4, heads_kv=4)
    large = sa.nsa_kernel_choice(seq_len=65536, heads_q=64, heads_kv=4)
    assert small.choice == "fsa" and "FSA is" in small.reason and "G=1" in small.reason
    assert large.choice == "nsa" and "NSA is" in large.reason and "G=16" in large.reason
    assert small.time_s == small.fsa_s and large.time_s == large.nsa_s
    assert small.details["mma_m"] == 16 and small.details["mma_useful_fraction"] == 1 / 16
    # README of Relaxed-System-Lab/Flash-Sparse-Attention: FSA below G = 8, NSA from 8;
    # the analytical constants were set to that. Measured (Triton, H100, 64k): FSA wins
    # at G = 4, G = 8 is a tie (FSA 1% faster), NSA wins at G = 16.
    g4 = sa.nsa_kernel_choice(seq_len=65536, heads_q=16, heads_kv=4, fitted=False)
    g8 = sa.nsa_kernel_choice(seq_len=65536, heads_q=32, heads_kv=4, fitted=False)
    assert g4.choice == "fsa" and g8.choice == "nsa"
    m4, m8, m16 = (
        sa.nsa_kernel_choice(seq_len=65536, heads_q=4 * g, heads_kv=4) for g in (4, 8, 16)
    )
    assert m4.choice == "fsa" and m16.choice == "nsa"
    assert abs(m8.fsa_speedup - 1.0) < 0.1
    assert "fitted on" in m8.details["source"] and "analytical" in g8.details["source"]


def test_measured_nsa_fsa_fit_matches_its_data_and_transfers_by_architecture():
    """The shipped fit reproduces the committed H100 timings (CSV): NSA within 10% per
    row, FSA within 10% on average (its first row, 8k G=1, measured an index build twice
    as slow as every other row's); the H200 (same architecture) uses it, labelled."""
    import pandas as pd

    from costmodels.ops.sparse_attention import nsa_fsa_fit

    d = pd.read_csv("calibrate/data/nsa-fsa-h100-sxm/nsa_fsa.csv")
    errs = []
    for r in d.itertuples():
        c = sa.nsa_kernel_choice(seq_len=r.seq_len, heads_q=r.heads_q, heads_kv=r.heads_kv)
        assert abs(c.nsa_s * 1e3 / r.nsa_ms - 1) < 0.1, r
        errs.append(abs(c.fsa_s * 1e3 / r.fsa_ms - 1))
    assert sum(errs) / len(errs) < 0.1
    fit = nsa_fsa_fit("h200-sxm")
    assert fit is not None and fit[1].startswith("transferred from h100-sxm")


def test_nsa_fsa_kernel_level_speedups_have_the_published_size():
    """Yan et al. 2025: up to 3.5x and 1.6x on average at kernel level (compressed +
    selected + window). Reproduced in direction and rough size."""
    ratios, groups = [], []
    for block, sel in ((64, 16), (128, 8)):
        pattern = parse_pattern(f"nsa:lsel={block},n={sel}")
        for seq in (32768, 65536):
            for g in (1, 2, 4, 8):
                t = sa.nsa_attention_time(
                    seq_len=seq, heads_q=4 * g, heads_kv=4, pattern=pattern, gpu="h100-sxm"
                )
                assert t.total_s == min(t.nsa_total_s, t.fsa_total_s)
                assert t.compressed_s > 0 and t.window_s > 0
                ratios.append(t.nsa_total_s / t.fsa_total_s)
                groups.append(g)
    ratios = np.array(ratios)
    assert 2.5 <= ratios.max() <= 6.0
    assert 1.2 <= np.exp(np.log(ratios).mean()) <= 2.4
    assert (ratios[np.array(groups) == 8] < 1.5).all()


# --------------------------------------------------------------------------- cost model


def test_model_predicts_block_sparse_time_per_direction():
    table = parse_pattern("window:1024").tiles(8192, 4)
    res = sa.block_sparse_time(table, heads_q=16, heads_kv=4, batch=2)
    model = sa.SparseAttentionModel("h100-sxm")
    calls = [
        sa.SparseAttentionCall(table, direction=d, batch=2, heads_q=16, heads_kv=4)
        for d in sa.DIRECTIONS
    ]
    want = [res.fwd_s, res.bwd_s, res.fwdbwd_s]
    assert [model.predict(c) for c in calls] == want
    np.testing.assert_array_equal(model.predict_many(calls), want)
    with pytest.raises(sa.SparseAttentionError, match="allowed: fwd, bwd, fwdbwd"):
        model.predict(sa.SparseAttentionCall(table, direction="both"))
