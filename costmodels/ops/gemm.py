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

from costmodels.ops.common import (
    ELEMENT_BYTES,
    GEMM_OUT_BYTES,
    Work,
    by_dtype,
    by_dtypes,
    cdiv,
    peak_flops,
    peak_flops_table,
)
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
    flops, bytes_, best, hbm = _gemm_parts(m, n, k, batch, dtype, gpu, p)
    time_s = p.launch_s + np.maximum(best, bytes_ / hbm)
    return Work(time_s=time_s, flops=flops, bytes=bytes_)


def _gemm_parts(
    m: np.ndarray,
    n: np.ndarray,
    k: np.ndarray,
    batch: np.ndarray,
    dtype: np.ndarray,
    gpu: GpuSpec,
    p: GemmParams,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(FLOPs, operand bytes, compute-bound seconds of the best tiling, HBM bytes/s)."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    batch = np.where(np.isnan(batch), 1.0, batch)
    in_b, out_b, eff, peak = by_dtypes(
        dtype,
        (ELEMENT_BYTES, "GEMM"),
        (GEMM_OUT_BYTES, "GEMM"),
        ({str(d): v for d, v in p.mma_efficiency.items()}, "GEMM efficiency"),
        (peak_flops_table(gpu), f"GPU {gpu.id}"),
    )
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
    sm_rate = peak * eff / sm
    feed_per_sm = p.operand_feed_bytes_per_s / sm
    hbm = gpu.hbm_bytes_per_s * p.memory_efficiency

    flops = 2.0 * m * n * k * batch
    bytes_ = batch * ((m * k + k * n) * in_b + m * n * out_b)

    # For each tile and split-K factor:
    #   waves = ceil(tiles * split / sm)
    #   t = waves * (2 Tm Tn (ceil(k / split) + k_overhead) / tile_rate + wave_latency)
    #       (+ 2 split m n batch 4 / hbm for split > 1: an fp32 m x n partial per split,
    #       written, then read by the reduction)
    # evaluated with the parts that do not depend on the tile computed once. Split factors
    # are powers of two, and scaling by one commutes with rounding, so the hoisted
    # tiles / sm and m n batch / hbm give the same floats as the formula term by term.
    splits = [s for s in SPLIT_FACTORS if s <= p.max_split_k]
    k_terms = {s: cdiv(k, s) + p.k_overhead for s in splits}
    partial = (m * n * batch) / hbm
    blocks = {}  # ceil(m / Tm), ceil(n / Tn)
    best = np.full(m.shape, np.inf)
    t = np.empty(m.shape)
    waves = np.empty(m.shape)
    for tm, tn in p.tiles:
        # FLOPs per operand byte fed into one tile: 2 Tm Tn Tk / ((Tm + Tn) Tk bytes).
        intensity = 2.0 * tm * tn / ((tm + tn) * in_b)
        tile_rate = np.minimum(sm_rate, feed_per_sm * intensity)
        for key, dim, size in (("m", m, tm), ("n", n, tn)):
            if (key, size) not in blocks:
                blocks[key, size] = cdiv(dim, size)
        tiles_per_sm = blocks["m", tm] * blocks["n", tn] * batch / sm
        for split in splits:
            np.multiply(tiles_per_sm, split, out=waves)
            np.ceil(waves, out=waves)
            np.multiply(2.0 * tm * tn, k_terms[split], out=t)
            np.divide(t, tile_rate, out=t)
            np.add(t, p.wave_latency_s, out=t)
            np.multiply(waves, t, out=t)
            if split > 1:
                np.add(t, (2.0 * split * 4.0) * partial, out=t)
            np.minimum(best, t, out=best)
    return flops, bytes_, best, hbm


# --- weight-only quantised GEMMs (W8A16 / W4A16) ------------------------------------------
# C[m,n] = A[m,k] . dequant(B[k,n]): activations and output in bf16/fp16, B stored in 4 or 8
# bits with its group scales (`weight_bytes` per element, workloads.decompose.quant), each
# weight dequantised in registers and multiplied on the bf16 tensor cores (vLLM's Marlin,
# Frantar et al. 2024; Machete on Hopper). No calibration data of ours covers these kernels:
# the analytical time below is the dense GEMM's with the weight stream shrunk and two
# published kernel figures, and the step model scales the calibrated dense time by its
# ratio to the dense analytical time (costmodels.steps.serving_grid.Pricer).
#
# Memory side: A and C at the dense GEMM's HBM rate; B's packed bytes at a fraction of it.
# Marlin on Ampere streams them at the ideal rate (IST-DASLab/marlin README: 3.87x over
# fp16 up to batch 16-32, the ideal with 4.125 bits per weight), so 1.0 there. On Hopper,
# where Marlin uses Ampere's mma.sync, the published H100 runs of n = k = 8192 at m = 1
# (vllm-project/vllm#34556 and inclusionAI/humming#2, M. Goin, 2026-03: torch bf16 2.30,
# marlin-w4a16 4.98, marlin-w8a16 3.46 TFLOP/s) reach 2.17x and 1.50x the bf16 GEMM for
# 4x and 2x fewer weight bytes: 0.54 and 0.75 of its weight-streaming rate. That fraction
# is the dequantisation overhead where it shows (few rows, memory-bound).
# Compute side: the dense bf16 GEMM's tiling, but rows padded to Marlin's 16-row MMA
# (m16n8k16) instead of the dense library's smallest tile, so a decode-sized m is not
# charged a 64-row tile; on Hopper at most 75% of the bf16 peak, what mma.sync reaches
# without wgmma (vllm-project/vllm#7174). Machete, the wgmma kernel, "matches FP16
# compute-bound performance" (Neural Magic, 2024-10): the cap is Marlin's, not Machete's.
WEIGHT_ONLY_STREAM_EFFICIENCY: dict[str, dict[int, float]] = {"hopper": {4: 0.54, 8: 0.75}}
WEIGHT_ONLY_MMA_CEILING: dict[str, float] = {"hopper": 0.75}
WEIGHT_ONLY_MMA_ROWS = 16


def weight_only_gemm_work(
    m: np.ndarray,
    n: np.ndarray,
    k: np.ndarray,
    batch: np.ndarray,
    dtype: np.ndarray,
    weight_bits: np.ndarray,
    weight_bytes: np.ndarray,
    gpu: GpuSpec,
    p: GemmParams,
) -> Work:
    """A weight-only quantised GEMM: ``dtype`` is the activations' (bf16/fp16),
    ``weight_bits`` (4 or 8) and ``weight_bytes`` (storage bytes per weight, scales
    included) describe B. See the comment above for the two kernel figures."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    flops, _, best, hbm = _gemm_parts(m, n, k, batch, dtype, gpu, p)
    batch = np.where(np.isnan(batch), 1.0, batch)
    in_b = by_dtype(dtype, ELEMENT_BYTES, "GEMM")
    out_b = by_dtype(dtype, GEMM_OUT_BYTES, "GEMM")
    table = WEIGHT_ONLY_STREAM_EFFICIENCY.get(gpu.architecture, {})
    bits = np.asarray(weight_bits, dtype=float)
    stream = np.array([table.get(int(b), 1.0) for b in bits]) if table else np.ones(len(bits))
    w_bytes = batch * k * n * np.asarray(weight_bytes, dtype=float)
    act_bytes = batch * (m * k * in_b + m * n * out_b)
    mem_s = act_bytes / hbm + w_bytes / (hbm * stream)
    tm_min = float(min(t[0] for t in p.tiles))
    best = best * np.minimum(1.0, cdiv(m, WEIGHT_ONLY_MMA_ROWS) * WEIGHT_ONLY_MMA_ROWS / tm_min)
    ceiling = WEIGHT_ONLY_MMA_CEILING.get(gpu.architecture)
    if ceiling is not None:
        best = np.maximum(best, flops / (peak_flops(dtype, gpu) * ceiling))
    time_s = p.launch_s + np.maximum(best, mem_s)
    return Work(time_s=time_s, flops=flops, bytes=act_bytes + w_bytes)
