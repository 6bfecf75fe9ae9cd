"""Weight-only quantised GEMMs (costmodels.ops.gemm.weight_only_gemm_work): the packed
weight stream, the published Hopper Marlin figures they carry, and the compute side."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.ops.gemm import (
    WEIGHT_ONLY_MMA_CEILING,
    WEIGHT_ONLY_STREAM_EFFICIENCY,
    gemm_work,
    weight_only_gemm_work,
)
from costmodels.ops.params import arch_params
from hardware_specs.registry import load_catalog
from workloads.decompose.quant import weight_only_bytes


def _times(gpu_id: str, m, n, k, bits: int, *, group: bool = True):
    gpu = load_catalog().gpu(gpu_id)
    p = arch_params(gpu.architecture).gemm
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    batch = np.full(len(m), np.nan)
    dt = np.full(len(m), "bf16")
    wb = weight_only_bytes(bits) if group else bits / 8
    dense = gemm_work(m, n, k, batch, dt, gpu, p).time_s
    q = weight_only_gemm_work(
        m, n, k, batch, dt, np.full(len(m), bits), np.full(len(m), wb), gpu, p
    ).time_s
    # kernel time without the per-call launch (what a step replayed from a graph pays,
    # and what back-to-back benchmark loops time)
    return dense - p.launch_s, q - p.launch_s


def test_hopper_gemv_reproduces_the_published_marlin_speedups():
    # vllm-project/vllm#34556 / inclusionAI/humming#2 (H100, n = k = 8192, channelwise, m=1):
    # marlin w4a16 2.17x and w8a16 1.50x the torch bf16 GEMM
    for bits, published in ((4, 2.17), (8, 1.50)):
        dense, q = _times("h100-sxm", [1], [8192], [8192], bits, group=False)
        assert dense[0] / q[0] == pytest.approx(published, rel=0.1)


def test_ampere_streams_packed_weights_at_the_ideal_rate():
    # Marlin's README: close to the ideal 4x (3.87x with group scales) up to batch 16-32
    dense, q = _times("a100-sxm-80gb", [1, 16], [28672, 28672], [4096, 4096], 4)
    assert np.all(dense / q > 3.3) and np.all(dense / q < 4.0)
    assert "ampere" not in WEIGHT_ONLY_STREAM_EFFICIENCY


def test_compute_bound_is_never_faster_than_dense():
    m = np.array([1, 8, 64, 256, 1024, 4096, 16384])
    for gpu in ("h100-sxm", "a100-sxm-80gb"):
        for bits in (4, 8):
            dense, q = _times(gpu, m, np.full(7, 14336), np.full(7, 4096), bits)
            big = m >= 4096
            assert np.all(q[big] >= dense[big] * (1 - 1e-12))  # same tensor cores, or fewer
            assert np.all(np.diff(q) > 0)  # more rows, more time
            # memory-bound: the weight-bytes ratio less Hopper's Marlin stream efficiency
            least = {4: 1.9, 8: 1.4}[bits] if gpu == "h100-sxm" else {4: 3.3, 8: 1.8}[bits]
            assert np.all(q[m <= 16] < dense[m <= 16] / least)


def test_hopper_mma_ceiling_bounds_large_gemms():
    dense, q = _times("h100-sxm", [16384], [8192], [8192], 4)
    gpu = load_catalog().gpu("h100-sxm")
    peak = gpu.peak_flops_per_s("bf16")
    floor = 2 * 16384 * 8192 * 8192 / (peak * WEIGHT_ONLY_MMA_CEILING["hopper"])
    assert q[0] >= floor
    assert q[0] / dense[0] < 1.15  # Marlin on Hopper: a few % over cuBLAS at compute-bound
