"""The fast prediction path gives the reference path's numbers, bit for bit (issue 18).

Learned corrections are evaluated from lazily built feature columns with per-tree bit
tables (``LearnedCostModel.work_columns``) instead of the whole feature matrix and trees
walked level by level (``work_columns_reference``); large inputs go chunk by chunk; the
GEMM tiling loop hoists what does not depend on the tile; dtypes are looked up once per
distinct value. Each is compared here with the way it was first written, on a few
thousand mixed rows and on every shipped profile.
"""

import math

import numpy as np
import pandas as pd
import pytest

import costmodels.ops.analytical as analytical_mod
import costmodels.ops.common as common_mod
import costmodels.ops.learned as learned_mod
from costmodels.ops.analytical import frame_columns
from costmodels.ops.common import (
    ELEMENT_BYTES,
    GEMM_OUT_BYTES,
    by_dtype,
    by_dtypes,
    cdiv,
    distinct,
    factorize,
    peak_flops,
)
from costmodels.ops.features import FEATURE_NAMES, Features, feature_matrix
from costmodels.ops.gemm import SPLIT_FACTORS, _gemm_parts, row_alignment
from costmodels.ops.learned import TreeEnsemble
from costmodels.ops.select import get_cost_model
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, normalise_frame

ELEMENTWISE = ["copy", "rmsnorm", "layernorm", "swiglu", "gelu", "rope", "softmax",
               "cross_entropy", "embedding", "residual_add", "adamw"]  # fmt: skip


def mixed_frame(rows: int = 4000, seed: int = 0, fp8: bool = True) -> pd.DataFrame:
    """A validated ops frame of every op family: GEMMs aligned and not in every dtype,
    attention (fwd, bwd, fwd+bwd, decode on each backend, block-sparse), collectives,
    elementwise."""
    rng = np.random.default_rng(seed)
    kinds = ["gemm"] * 8 + ["attn_fwd", "attn_bwd", "attn_fwdbwd", "attn_decode",
             "attn_decode", "attn_blocksparse_fwd", "attn_blocksparse_bwd", "all_reduce",
             "all_gather", "reduce_scatter", "all_to_all", "send_recv", *ELEMENTWISE]  # fmt: skip
    op = rng.choice(kinds, rows)
    f = pd.DataFrame({c: np.full(rows, np.nan) for c in (*CSV_COLUMNS, *EXTRA_COLUMNS)})
    f["op"] = op
    dtypes = ["bf16", "fp16", "fp32", "tf32", "fp8", "int8"] if fp8 else ["bf16", "fp16", "fp32"]
    f["dtype"] = rng.choice(dtypes, rows)
    f["backend"] = ""
    f["causal"] = rng.random(rows) < 0.6

    def sizes(lo, hi):
        return np.round(np.exp(rng.uniform(math.log(lo), math.log(hi), rows)))

    gemm = op == "gemm"
    for c in "mnk":
        dims = sizes(1, 32768)
        dims = np.where(rng.random(rows) < 0.5, np.ceil(dims / 64) * 64, dims)
        f.loc[gemm, c] = dims[gemm]
    f.loc[gemm & (rng.random(rows) < 0.2), "batch"] = 4
    attn = np.char.startswith(op.astype(str), "attn")
    hkv = rng.choice([1, 4, 8], rows)
    f.loc[attn, "heads_kv"] = hkv[attn]
    f.loc[attn, "heads_q"] = (hkv * rng.choice([1, 4], rows))[attn]
    f.loc[attn, "head_dim"] = rng.choice([64, 128], rows)[attn]
    f.loc[attn, "batch"] = sizes(1, 32)[attn]
    seq = sizes(64, 65536)
    f.loc[attn, "seq_q"] = seq[attn]
    f.loc[attn, "seq_kv"] = seq[attn]
    dec = op == "attn_decode"
    f.loc[dec, "seq_q"] = 1
    f.loc[dec, "backend"] = rng.choice(["", "flash", "cudnn", "efficient"], rows)[dec]
    sparse = np.char.startswith(op.astype(str), "attn_blocksparse")
    f.loc[sparse, "density"] = rng.uniform(0.02, 1.0, rows)[sparse]
    f.loc[sparse, "block_size"] = 128
    f.loc[attn & f["dtype"].isin(["fp32", "tf32", "fp8", "int8"]).to_numpy(), "dtype"] = "bf16"
    coll = np.isin(op, ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"])
    f.loc[coll, "bytes"] = sizes(1024, 2**31)[coll]
    f.loc[coll & (op != "send_recv"), "ranks"] = 8
    ew = np.isin(op, ELEMENTWISE)
    f.loc[ew, "m"] = sizes(1, 65536)[ew]
    f.loc[ew, "n"] = sizes(256, 65536)[ew]
    f.loc[op == "copy", "bytes"] = sizes(1024, 2**30)[op == "copy"]
    f.loc[ew & f["dtype"].isin(["fp8", "int8", "tf32"]).to_numpy(), "dtype"] = "bf16"
    return normalise_frame(f)


@pytest.fixture(scope="module")
def frame():
    return mixed_frame()


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200-sxm", "h100-pcie", "a100-sxm-80gb"])
def test_learned_fast_path_is_the_reference_bit_for_bit(gpu):
    frame = mixed_frame(fp8=gpu != "a100-sxm-80gb")
    model = get_cost_model(gpu)
    assert hasattr(model, "residuals_"), "a shipped or transferred profile with corrections"
    cols = frame_columns(frame)
    fast, ref = model.work_columns(cols), model.work_columns_reference(cols)
    np.testing.assert_array_equal(fast.time_s, ref.time_s)
    np.testing.assert_array_equal(fast.flops, ref.flops)
    np.testing.assert_array_equal(fast.bytes, ref.bytes)
    assert (fast.time_s != model.base.work_columns(cols).time_s).mean() > 0.25  # corrected


def test_chunks_price_as_one_pass(frame, monkeypatch):
    model = get_cost_model("h100-sxm")
    cols = frame_columns(frame)
    whole = model.work_columns(cols)
    for mod in (common_mod, analytical_mod, learned_mod):
        monkeypatch.setattr(mod, "CHUNK_ROWS", 333)
    chunked = model.work_columns(cols)
    np.testing.assert_array_equal(chunked.time_s, whole.time_s)
    np.testing.assert_array_equal(chunked.flops, whole.flops)


def test_lazy_features_are_the_matrix(frame):
    model = get_cost_model("h100-sxm")
    cols = frame_columns(frame)
    work = model.base.work_columns(cols)
    matrix = feature_matrix(cols, work)
    lazy = Features(cols, work)
    for i in reversed(range(len(FEATURE_NAMES))):  # any order
        np.testing.assert_array_equal(lazy(i), matrix[:, i], err_msg=FEATURE_NAMES[i])


def test_tree_tables_walk_like_the_trees():
    """Random ensembles, random features with NaN and values exactly on thresholds."""
    rng = np.random.default_rng(3)
    n_feat = 6
    trees = []
    for _ in range(25):  # random binary trees of depth <= 4, nodes numbered parent first
        left, right, feature, threshold, value = [], [], [], [], []

        def grow(depth, left=left, right=right, feature=feature, threshold=threshold,
                 value=value):  # fmt: skip
            node = len(left)
            for lst in (left, right, feature, threshold):
                lst.append(-1)
            value.append(float(rng.normal()))
            if depth < 4 and rng.random() < 0.75:
                feature[node] = int(rng.integers(n_feat))
                threshold[node] = float(np.round(rng.normal(), 1))
                left[node] = grow(depth + 1)
                right[node] = grow(depth + 1)
            return node

        grow(0)
        trees.append({"left": left, "right": right, "feature": feature,
                      "threshold": threshold, "value": value})  # fmt: skip
    ens = TreeEnsemble.from_dict({"init": 0.25, "learning_rate": 0.1, "trees": trees})
    x = np.round(rng.normal(size=(5000, n_feat)), 1)  # many values equal a threshold
    x[rng.random(x.shape) < 0.05] = np.nan
    cols = {i: np.ascontiguousarray(x[:, i]) for i in range(n_feat)}
    np.testing.assert_array_equal(ens.predict_features(cols.__getitem__, len(x)), ens.predict(x))


def _gemm_parts_as_first_written(m, n, k, batch, dtype, gpu, p):
    """costmodels.ops.gemm._gemm_parts before the tile loop was hoisted (issue 18)."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    batch = np.where(np.isnan(batch), 1.0, batch)
    in_b = by_dtype(dtype, ELEMENT_BYTES, "GEMM")
    out_b = by_dtype(dtype, GEMM_OUT_BYTES, "GEMM")
    eff = by_dtype(dtype, {str(d): v for d, v in p.mma_efficiency.items()}, "GEMM efficiency")
    sm = float(gpu.sm_count)
    align = np.minimum(row_alignment(k * in_b), row_alignment(n * in_b))
    factor = np.ones(len(align))
    for elt_bytes, table in p.misaligned_efficiency.items():
        for bytes_, f in table.items():
            factor[(in_b == elt_bytes) & (align == bytes_)] = f
    eff = np.where(dtype == "fp32", eff, eff * factor)
    sm_rate = peak_flops(dtype, gpu) * eff / sm
    feed_per_sm = p.operand_feed_bytes_per_s / sm
    hbm = gpu.hbm_bytes_per_s * p.memory_efficiency
    flops = 2.0 * m * n * k * batch
    bytes_ = batch * ((m * k + k * n) * in_b + m * n * out_b)
    best = np.full(m.shape, np.inf)
    for tm, tn in p.tiles:
        intensity = 2.0 * tm * tn / ((tm + tn) * in_b)
        tile_rate = np.minimum(sm_rate, feed_per_sm * intensity)
        tiles = cdiv(m, tm) * cdiv(n, tn) * batch
        for split in SPLIT_FACTORS:
            if split > p.max_split_k:
                break
            waves = cdiv(tiles * split, sm)
            k_per = cdiv(k, split)
            t = waves * (2.0 * tm * tn * (k_per + p.k_overhead) / tile_rate + p.wave_latency_s)
            if split > 1:
                t = t + 2.0 * split * m * n * batch * 4.0 / hbm
            best = np.minimum(best, t)
    return flops, bytes_, best, hbm


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-sxm-80gb", "mi300x"])
def test_gemm_tiling_is_the_formula_term_by_term(gpu):
    model = get_cost_model(gpu)
    rng = np.random.default_rng(1)
    rows = 20000
    m, n, k = np.round(np.exp(rng.uniform(0, math.log(2**20), (3, rows))))
    batch = np.where(rng.random(rows) < 0.3, np.round(rng.uniform(1, 64, rows)), np.nan)
    dtype = rng.choice(["bf16", "fp16", "fp32", "tf32", "int8"], rows)
    params = getattr(model, "base", model).params.gemm
    args = (m, n, k, batch, dtype, model.gpu, params)
    for got, want in zip(_gemm_parts(*args), _gemm_parts_as_first_written(*args), strict=True):
        np.testing.assert_array_equal(got, want)


def test_distinct_values_and_dtype_lookups():
    rng = np.random.default_rng(2)
    for values in (
        rng.choice(["bf16", "fp16", "fp8", ""], 3000),  # packed and peeled
        np.array([f"op{i}" for i in range(400)]),  # more than 16 distinct: sorted
        rng.choice(["é", "gemm"], 1000),  # not Latin-1 packable
        np.array(["gemm"] * 10),  # small: a dict
        rng.choice(np.array(["x", None], dtype=object), 500),
    ):
        codes, uniq = distinct(values)
        ok = codes >= 0
        assert [uniq[c] for c in codes[ok]] == list(values[ok])
        assert set(np.asarray(uniq).tolist()) == set(factorize(values)[1].tolist())
    dtypes = rng.choice(["bf16", "fp32", "fp8"], 5000)
    tables = [(ELEMENT_BYTES, "a"), (GEMM_OUT_BYTES, "b")]
    for got, (table, what) in zip(by_dtypes(dtypes, *tables), tables, strict=True):
        np.testing.assert_array_equal(got, by_dtype(dtypes, table, what))
    with pytest.raises(ValueError, match="'fp4'"):  # the first unknown in row order
        by_dtypes(np.array(["bf16", "fp4", "fp2"] * 200), (ELEMENT_BYTES, "GEMM"))
