"""GEMM: roofline with tile and wave quantisation, operand feed, split-K.

C[m,n] = A[m,k] . B[k,n], ``batch`` independent products. The library is modelled
as choosing, per shape, the fastest of a few CTA tile shapes and split-K factors
(cuBLAS's heuristics aim at the same thing):

- tiles = ceil(m/Tm) ceil(n/Tn) batch split, run in waves of one CTA per SM;
  a partial last wave costs a whole wave (wave quantisation).
- each wave pays a fixed latency (operands' first trip from HBM, the epilogue's stores);
- each tile computes 2 Tm Tn (k/split + k_overhead) FLOPs at the smaller of the SM's
  tensor rate and what the L2->SMEM operand feed sustains: a k-step of a Tm x Tn tile
  brings (Tm+Tn) Tk elements for 2 Tm Tn Tk FLOPs, so small tiles are feed-bound.
- shapes whose rows are not 16-byte aligned (k or n) run slower kernels;
- split-K adds an fp32 partial-sum round trip; HBM traffic of the operands gives a
  memory floor (the GEMV regime for small m or n).
"""

from __future__ import annotations

import numpy as np

from costmodels.ops.common import ELEMENT_BYTES, GEMM_OUT_BYTES, Work, by_dtype, cdiv, peak_flops
from costmodels.ops.params import GemmParams
from hardware_specs.schema import GpuSpec

SPLIT_FACTORS = (1, 2, 4, 8, 16)


def row_alignment(row_bytes: np.ndarray) -> np.ndarray:
    """Largest power of two (capped at 16) dividing a row's byte length."""
    b = np.nan_to_num(np.asarray(row_bytes, dtype=float), nan=16.0).astype(np.int64)
    return np.minimum(b & -b, 16).astype(float)


def gemm_work(
    m: np.ndarray,
    n: np.ndarray,
    k: np.ndarray,
    batch: np.ndarray,
    dtype: np.ndarray,
    gpu: GpuSpec,
    p: GemmParams,
) -> Work:
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    batch = np.where(np.isnan(batch), 1.0, batch)
    in_b = by_dtype(dtype, ELEMENT_BYTES, "GEMM")
    out_b = by_dtype(dtype, GEMM_OUT_BYTES, "GEMM")
    eff = by_dtype(dtype, {str(d): v for d, v in p.mma_efficiency.items()}, "GEMM efficiency")
    sm = float(gpu.sm_count)
    # rows of A (k elements) and of B and C (n elements) must be 16-byte aligned for the
    # fastest kernels; misaligned shapes fall back to slower ones
    # (fp32 without TF32 runs SIMT kernels, which do not use TMA)
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
        # FLOPs per operand byte fed into one tile: 2 Tm Tn Tk / ((Tm + Tn) Tk bytes).
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
                # each split writes and the reduction reads an fp32 m x n partial
                t = t + 2.0 * split * m * n * batch * 4.0 / hbm
            best = np.minimum(best, t)
    time_s = p.launch_s + np.maximum(best, bytes_ / hbm)
    return Work(time_s=time_s, flops=flops, bytes=bytes_)
