"""Sparse-weight GEMM models: 2:4, unstructured (Flash-LLM), CATS; fitted on H100 rows."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from costmodels.ops import sparse_gemm as S
from costmodels.ops.common import peak_flops
from hardware_specs.registry import builtin_catalog

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "calibrate" / "data" / "h100-sxm" / "sparse_gemm.csv"

# (m, n, k) of LLM layers (n, k) at decode to prefill token counts, plus squares
LAYERS = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (1280, 8192), (57344, 8192)]
TOKENS = [1, 2, 4, 8, 16, 64, 256, 1024, 4096, 16384]


def _grid():
    m = np.array([t for _ in LAYERS for t in TOKENS] + [512, 2048, 8192], dtype=float)
    n = np.array([nk[0] for nk in LAYERS for _ in TOKENS] + [512, 2048, 8192], dtype=float)
    k = np.array([nk[1] for nk in LAYERS for _ in TOKENS] + [512, 2048, 8192], dtype=float)
    return m, n, k


@pytest.fixture(scope="module")
def gpus():
    return builtin_catalog().gpus


@pytest.fixture(scope="module")
def h100(gpus):
    return gpus["h100-sxm"]


@pytest.mark.parametrize("gpu_id", ["h100-sxm", "a100-sxm-80gb", "h200-sxm", "b200"])
@pytest.mark.parametrize(
    "sparsity", ["2:4", "unstructured:0.5", "unstructured:0.9", "cats:0.1", "cats:0.5"]
)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_never_faster_than_the_spec_sparse_bound(gpus, gpu_id, sparsity, dtype) -> None:
    if gpu_id not in gpus:
        pytest.skip(f"{gpu_id} not in the catalog")
    gpu = gpus[gpu_id]
    m, n, k = _grid()
    for kernel in ("fused", "gather"):
        w = S.sparse_gemm_work(m, n, k, None, dtype, sparsity, gpu, cats_kernel=kernel)
        assert np.all(np.isfinite(w.time_s)) and np.all(w.time_s > 0)
        peak = peak_flops(np.full(len(m), dtype), gpu)
        sparse_rate = peak * gpu.sparse_speedup
        assert np.all(w.time_s >= w.flops / sparse_rate * (1 - 1e-9))
        assert np.all(w.time_s >= w.bytes / gpu.hbm_bytes_per_s * (1 - 1e-9))
        if sparsity == "2:4":
            # the spec's sparse rate counts dense-equivalent FLOPs
            assert np.all(w.time_s >= 2 * m * n * k / sparse_rate * (1 - 1e-9))
            assert np.allclose(w.flops, m * n * k)


def test_2_4_bytes_are_half_the_weights_plus_metadata(h100) -> None:
    n, k = 4096.0, 4096.0
    w = S.sparse_gemm_work(8, n, k, None, "bf16", "2:4", h100)
    # 8 x k activations, n x k / 2 bf16 values, 2 bits per kept value, 8 x n outputs
    want = 8 * k * 2 + n * k / 2 * 2 + n * k / 2 * 2 / 8 + 8 * n * 2
    assert w.bytes[0] == pytest.approx(want)


def test_2_4_kernel_loses_at_decode_and_gains_at_most_the_byte_ratio(h100) -> None:
    """As measured on H100 (calibrate/data/h100-sxm/sparse_gemm.csv, CUDA-graph rows):
    cuSPARSELt's narrow kernel (<= 128 tokens) is slower than the dense GEMV; above it a
    memory-bound 2:4 GEMM gains at most the byte ratio (2 bytes -> 1 + 1/8)."""
    m = np.array([1.0, 4, 16, 128, 256])
    n, k = np.full(5, 28672.0), np.full(5, 4096.0)
    dense = S.sparse_gemm_work(m, n, k, None, "bf16", "dense", h100).time_s
    sparse = S.sparse_gemm_work(m, n, k, None, "bf16", "2:4", h100).time_s
    assert np.all(sparse[:4] > dense[:4])
    assert np.all(dense / sparse <= 1 / (0.5 + 0.5 / 8) + 1e-6)
    eager = S.sparse_gemm_work(m, n, k, None, "bf16", "2:4", h100, eager=True).time_s
    floor = S.sparse_params("hopper").semi_structured.call_floor_s
    assert np.all(eager >= floor) and np.all(eager >= sparse)


@pytest.mark.parametrize("s", [0.5, 0.7, 0.8, 0.9])
@pytest.mark.parametrize("nk", LAYERS)
def test_unstructured_gains_shrink_as_m_grows(h100, s, nk) -> None:
    m = np.array(TOKENS, dtype=float)
    n, k = np.full(len(m), nk[0], dtype=float), np.full(len(m), nk[1], dtype=float)
    dense = S.sparse_gemm_work(m, n, k, None, "bf16", "dense", h100).time_s
    sparse = S.sparse_gemm_work(m, n, k, None, "bf16", f"unstructured:{s}", h100).time_s
    gain = dense / sparse
    # what is gained (speedup above 1) never grows with m (2% slack for wave quantisation)
    won = np.maximum(gain, 1.0)
    assert np.all(np.diff(won) <= 1e-9 + 0.02 * won[:-1])
    assert gain[-1] <= 1.0  # compute-bound: no gain
    if s >= 0.7:
        assert gain[0] > (1.2 if s >= 0.8 else 1.1)  # decode: weight bytes shrink
    if s == 0.5:
        assert np.all(gain <= 1.0)  # 16-bit location per 16-bit value: nothing saved


@pytest.mark.parametrize("kernel", ["fused", "gather"])
@pytest.mark.parametrize("tokens", [1, 4, 16, 64])
def test_cats_cost_monotone_in_active_fraction(h100, kernel, tokens) -> None:
    for n, k in [(14336, 4096), (4096, 14336), (3584, 8192), (8192, 3584)]:
        times = [
            S.sparse_gemm_work(
                tokens, n, k, None, "bf16", f"cats:{f}", h100, cats_kernel=kernel
            ).time_s[0]
            for f in np.linspace(0.02, 1.0, 25)
        ]
        assert np.all(np.diff(times) >= -1e-12)


def test_cats_gains_at_batch_one_and_vanish_with_batch(h100) -> None:
    n, k = 14336, 4096
    dense = S.sparse_gemm_work(1, n, k, None, "bf16", "dense", h100).time_s[0]
    fused = S.sparse_gemm_work(1, n, k, None, "bf16", "cats:0.3", h100).time_s[0]
    assert 2.0 < dense / fused < 1 / 0.3 + 1e-6
    d64 = S.sparse_gemm_work(64, n, k, None, "bf16", "dense", h100).time_s[0]
    f64 = S.sparse_gemm_work(64, n, k, None, "bf16", "cats:0.3", h100).time_s[0]
    assert f64 >= d64  # the union of 64 tokens' neurons is all of them
    # the gather copy makes plain torch lose unless few neurons are active
    g = S.sparse_gemm_work(1, n, k, None, "bf16", "cats:0.7", h100, cats_kernel="gather")
    assert g.time_s[0] > dense


def test_scalar_and_vector_agree(h100) -> None:
    for sp in ("2:4", "unstructured:0.8", "cats:0.4", "dense"):
        v = S.sparse_gemm_work([1, 64, 4096], [4096] * 3, [14336] * 3, None, "bf16", sp, h100)
        for i, m in enumerate((1, 64, 4096)):
            s = S.sparse_gemm_work(m, 4096, 14336, None, "bf16", sp, h100)
            assert s.time_s[0] == pytest.approx(v.time_s[i])


@pytest.mark.parametrize(
    "bad", ["3:4", "unstructured", "unstructured:1.0", "cats:0", "cats:x", "block:0.5"]
)
def test_bad_sparsity_is_one_clear_line(h100, bad) -> None:
    with pytest.raises(ValueError, match="allowed: empty or dense, 2:4"):
        S.sparse_gemm_work(1, 4096, 4096, None, "bf16", bad, h100)


def test_bad_cats_kernel(h100) -> None:
    with pytest.raises(ValueError, match="allowed: fused, gather"):
        S.sparse_gemm_work(1, 4096, 4096, None, "bf16", "cats:0.5", h100, cats_kernel="x")


def test_every_architecture_has_parameters(gpus) -> None:
    for gpu in gpus.values():
        assert S.sparse_params(gpu.architecture).semi_structured.compute_efficiency > 0


def test_module_needs_neither_torch_nor_simcli() -> None:
    tree = ast.parse((ROOT / "costmodels" / "ops" / "sparse_gemm.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    assert not names & {"torch", "simcli", "calibrate", "scipy", "sklearn"}


@pytest.mark.parametrize("gpu_id", ["h100-sxm", "a100-sxm-80gb"])
def test_tile_time_mirrors_the_dense_gemm_model(gpus, gpu_id) -> None:
    """``_compute_only_s`` copies gemm_work's tile loop: launch + max(it, operand floor)
    must be gemm_work exactly."""
    from costmodels.ops.common import ELEMENT_BYTES, GEMM_OUT_BYTES
    from costmodels.ops.gemm import gemm_work

    gpu = gpus[gpu_id]
    dp = S.dense_gemm_params(gpu)
    rng = np.random.default_rng(0)
    m, n, k = (np.round(np.exp(rng.uniform(0, 10, 500))) for _ in range(3))
    for dt in ("bf16", "fp32"):
        d, b = np.full(500, dt), np.ones(500)
        want = gemm_work(m, n, k, b, d, gpu, dp).time_s
        floor = (m * k + k * n) * ELEMENT_BYTES[dt] + m * n * GEMM_OUT_BYTES[dt]
        hbm = gpu.hbm_bytes_per_s * dp.memory_efficiency
        got = dp.launch_s + np.maximum(S._compute_only_s(m, n, k, b, d, gpu, dp), floor / hbm)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_model_prices_gemm_ops_as_sparse_gemm_work(h100) -> None:
    from workloads.ops import Op, ops_frame

    ops = [Op(op="gemm", m=m, n=4096, k=14336, batch=b) for m, b in ((1, 1), (4096, 2))]
    for sparsity in ("2:4", "unstructured:0.8", "cats:0.4", "dense"):
        model = S.SparseGemmModel(h100, sparsity)
        shapes = ([1, 4096], [4096] * 2, [14336] * 2, [1, 2])
        want = S.sparse_gemm_work(*shapes, "bf16", sparsity, h100)
        np.testing.assert_array_equal(model.predict_many(ops_frame(ops)), want.time_s)
        assert [model.predict(o) for o in ops] == list(want.time_s)
    with pytest.raises(ValueError, match="allowed: gemm"):
        S.SparseGemmModel(h100).predict(Op(op="copy", bytes=1024))
    with pytest.raises(ValueError, match="allowed: empty or dense, 2:4"):
        S.SparseGemmModel(h100, "3:4")


def test_2_4_kernel_switch_is_the_only_drop(h100) -> None:
    """Monotone in tokens within each cuSPARSELt kernel; from 128 to 256 tokens the time may
    drop (as measured) but not below the registered envelope."""
    m = np.arange(1.0, 16385.0, 7.0)
    n, k = np.full(len(m), 28672.0), np.full(len(m), 4096.0)
    t = S.sparse_gemm_work(m, n, k, None, "bf16", "2:4", h100).time_s
    narrow = m <= S.sparse_params("hopper").semi_structured.narrow_rows
    assert np.all(np.diff(t[narrow]) >= 0) and np.all(np.diff(t[~narrow]) >= 0)
    ratio = t[~narrow][0] / t[narrow][-1]
    assert 0.45 < ratio < 1.0
