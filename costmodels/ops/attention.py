"""Attention kernels: FlashAttention-style tiling, split-KV decode, block-sparse.

Forward FLOPs are 4 b hq sq skv d for full attention (Dao et al. 2022, sec. 3.1);
the kernel does them tile by tile (block_m query rows x block_n keys), so time is
counted in visited tiles, not FLOPs:

- causal masks skip tiles above the diagonal; the count is exact (bottom-right
  aligned, as FlashAttention does when sq != skv), summed in closed form;
- per tile: 4 Bm Bn d matmul FLOPs at the backend's tensor-core efficiency plus
  Bm Bn exponentials on the special-function units, partly hidden (FA3 overlaps them);
- tiles are grouped into CTAs (one per query block and head in the forward pass, one
  per key block in the backward pass) scheduled over SMs: the makespan is the longer
  of total/SMs and the largest CTA (causal) or whole waves (uniform work);
- backward = 2.5x the forward matmul FLOPs (5 matmuls instead of 2) plus the recomputed
  exponentials and dQ accumulation traffic (Dao 2023, FlashAttention-2, sec. 3.2).

Decode (seq_q new tokens over a KV cache) is memory-bound: it reads K and V once;
split-KV (Flash-Decoding) spreads the cache over more CTAs when batch x heads cannot
fill the GPU.
"""

from __future__ import annotations

import numpy as np

from costmodels.ops.common import ELEMENT_BYTES, Work, by_dtype, cdiv, floor_sum, peak_flops
from costmodels.ops.params import AttentionBackendParams, AttentionParams
from hardware_specs.schema import GpuSpec

DECODE_BLOCK_N = 128  # keys per split-KV block (FlashAttention-2 splitkv kernels)
NOSPLIT_BLOCK_N = 64  # keys per step of the memory-efficient (cutlass) kernel


def causal_tiles_per_head(
    sq: np.ndarray, skv: np.ndarray, bm: np.ndarray, bn: np.ndarray
) -> np.ndarray:
    """Exact number of (query block, key block) tiles a causal kernel visits per head.

    Query row r may attend keys 0 .. r + (skv - sq). Query block i covers rows
    i*bm .. min((i+1)*bm, sq) - 1 and visits key blocks 0 .. floor((r_last + off)/bn),
    clipped to [0, nk].
    """
    sq, skv, bm, bn = (np.asarray(x, dtype=float) for x in (sq, skv, bm, bn))
    off = skv - sq
    nq = cdiv(sq, bm)
    nk = cdiv(skv, bn)

    def blocks_for_last_row(r: np.ndarray) -> np.ndarray:
        return np.clip(np.floor((r + off) / bn) + 1, 0, nk)

    # Full query blocks j = 1 .. nq-1 end at row j*bm - 1; the last block ends at sq - 1.
    last = blocks_for_last_row(sq - 1)
    j_hi = nq - 1  # inclusive upper bound of the full blocks
    # first j with any visible key: j*bm - 1 + off >= 0
    j_lo = np.maximum(1.0, np.ceil((1.0 - off) / bm))
    # first j whose blocks reach nk: j*bm - 1 + off >= (nk - 1) * bn
    j_cap = np.maximum(j_lo, np.ceil(((nk - 1) * bn + 1.0 - off) / bm))
    mid_hi = np.minimum(j_cap - 1, j_hi)
    count_mid = np.maximum(mid_hi - j_lo + 1, 0)
    # sum_{j=j_lo}^{mid_hi} (floor((j*bm - 1 + off)/bn) + 1)
    start = j_lo * bm - 1 + off
    mid = floor_sum(count_mid, bn, bm, np.maximum(start, 0)) + count_mid
    capped = np.maximum(j_hi - np.maximum(j_cap, j_lo) + 1, 0) * nk
    return mid + capped + last


def _makespan_tiles(
    ctas: np.ndarray,
    total_tiles: np.ndarray,
    max_cta_tiles: np.ndarray,
    uniform: np.ndarray,
    sm: float,
) -> np.ndarray:
    """Tiles on the busiest SM: whole waves for uniform CTAs, LPT bound otherwise."""
    per_cta = total_tiles / np.maximum(ctas, 1)
    waves = cdiv(ctas, sm) * per_cta
    lpt = np.maximum(total_tiles / sm, max_cta_tiles)
    return np.where(uniform, waves, lpt)


def head_dim_factor(d: np.ndarray, at64: np.ndarray, at256: np.ndarray) -> np.ndarray:
    """Efficiency factor of a head_dim relative to 128: geometric interpolation in log2(d)
    between the 64, 128 (= 1) and 256 points, held flat outside. With factors in
    [0.5, 2] (64) and [0.25, 2] (256), tile time d / factor never decreases with d."""
    x = np.clip(np.log2(np.maximum(d, 1.0) / 128.0), -1.0, 1.0)
    return np.where(x < 0, at64 ** (-x), at256**x)


def _backend_arrays(
    backends: np.ndarray, p: AttentionParams, default: str
) -> dict[str, np.ndarray]:
    """Per-row backend parameters: the scalar fields, plus head-dim factors at 64 and 256."""
    names = np.where(backends == "", default, backends)
    scalars = [
        f
        for f, info in AttentionBackendParams.model_fields.items()
        if info.annotation in (float, int, "float", "int")
    ]
    extras = {
        "fwd64": ("fwd_head_dim_factor", 64),
        "fwd256": ("fwd_head_dim_factor", 256),
        "bwd64": ("bwd_head_dim_factor", 64),
        "bwd256": ("bwd_head_dim_factor", 256),
    }
    out = {f: np.empty(len(names)) for f in [*scalars, *extras]}
    for name in np.unique(names):
        if name not in p.backends:
            raise ValueError(
                f"no attention parameters for backend {name!r}; known: {', '.join(p.backends)}"
            )
        bp = p.backends[name]
        mask = names == name
        for f in scalars:
            out[f][mask] = getattr(bp, f)
        for key, (field, d) in extras.items():
            out[key][mask] = getattr(bp, field)[d]
    return out


SPLIT_BLOCK_M = 64  # query rows per CTA of FA2's split-KV kernel (flash_fwd_splitkv)
SPLIT_BLOCK_N = 128.0  # keys per block of that kernel at head_dim 128


def _split_kv_fwd_s(
    batch, sq, skv, hq, d, causal, fwd_eff, fwd_bytes, sm_rate, bp, sm, sfu_per_sm, hbm, plain_s
) -> np.ndarray:
    """Forward seconds of a launch whose CTAs leave SMs idle (a few query rows over many
    keys), where FlashAttention-2 splits the keys (flash_api.cpp set_params_splitkv):
    64-row query blocks, 128-key blocks, the fp32 partial outputs read back by a combine
    kernel. As in :func:`decode_work`, a continuous split count spreading the CTAs over
    the GPU's slots (2 per SM at 128 threads) stands in for FA2's discrete
    num_splits_heuristic, so time stays monotone in every size; never above ``plain_s``,
    the kernel without the split. Measured with PyTorch's FA2 on the H100
    (calibrate/data/verify-attn-h100-sxm): 2 query tokens over 64k keys at batch 1 take
    2.4x a decode, not the 16x of 32 CTAs walking every key."""
    bn = SPLIT_BLOCK_N
    bm = float(SPLIT_BLOCK_M)
    bh = batch * hq
    nq, nk = cdiv(sq, bm), cdiv(skv, bn)
    units = bh * nq  # CTAs without a split
    split_units = np.clip(2.0 * sm, units, units * nk)
    per_head = np.where(causal, causal_tiles_per_head(sq, skv, bm, bn), nq * nk)
    exp_s = (1.0 - bp["exp_overlap"]) * bm * bn / sfu_per_sm
    tile_s = 4.0 * bm * bn * d / (sm_rate * fwd_eff) + exp_s
    # balanced over the SMs, but no faster than one CTA's share of a row of key blocks
    span = np.maximum(bh * per_head / sm, nk * units / split_units)
    compute_s = span * tile_s + np.maximum(split_units / sm, 1.0) * bp["cta_latency_s"]
    # fp32 partial O and LSE of every split's 64-row tile, written and read back (as
    # decode_work's combine)
    partial_bytes = split_units * np.minimum(sq, bm) * (d + 1) * 4.0 * 2.0
    split_s = 2.0 * bp["launch_s"] + np.maximum(compute_s, (fwd_bytes + partial_bytes) / hbm)
    return np.minimum(split_s, plain_s)


def attention_work(
    kind: np.ndarray,
    batch: np.ndarray,
    sq: np.ndarray,
    skv: np.ndarray,
    hq: np.ndarray,
    hkv: np.ndarray,
    d: np.ndarray,
    causal: np.ndarray,
    backend: np.ndarray,
    dtype: np.ndarray,
    density: np.ndarray,
    block_size: np.ndarray,
    gpu: GpuSpec,
    p: AttentionParams,
) -> Work:
    """Forward, backward, forward+backward and block-sparse attention.

    ``kind`` holds op names: attn_fwd, attn_bwd, attn_fwdbwd, attn_blocksparse_fwd,
    attn_blocksparse_bwd. Block-sparse rows visit ``density`` of all block_size^2 tiles
    and default to the flex backend.
    """
    sparse = np.char.startswith(kind.astype(str), "attn_blocksparse")
    do_fwd = np.isin(kind, ["attn_fwd", "attn_fwdbwd", "attn_blocksparse_fwd"])
    do_bwd = np.isin(kind, ["attn_bwd", "attn_fwdbwd", "attn_blocksparse_bwd"])
    bp = _backend_arrays(np.where(sparse & (backend == ""), "flex", backend), p, "flash")
    elt = by_dtype(dtype, ELEMENT_BYTES, "attention")
    sm = float(gpu.sm_count)
    sm_rate = peak_flops(dtype, gpu) / sm
    sfu_per_sm = gpu.sfu_ops_per_s / sm
    hbm = gpu.hbm_bytes_per_s * p.memory_efficiency

    bm = np.where(sparse, block_size, bp["block_m"])
    bn = np.where(sparse, block_size, bp["block_n"])
    nq, nk = cdiv(sq, bm), cdiv(skv, bn)
    dense_causal = causal & ~sparse
    per_head = np.where(dense_causal, causal_tiles_per_head(sq, skv, bm, bn), nq * nk)
    # block-sparse: each query block visits ceil(density x key blocks) tiles (at least one)
    per_head = np.where(sparse, nq * np.maximum(np.ceil(np.nan_to_num(density) * nk), 1), per_head)
    bh = batch * hq
    total = bh * per_head

    exp_s = (1.0 - bp["exp_overlap"]) * bm * bn / sfu_per_sm
    # Forward: one CTA per (query block, head); the longest is a full row of key blocks.
    fwd_eff = bp["fwd_efficiency"] * head_dim_factor(d, bp["fwd64"], bp["fwd256"])
    fwd_tile_s = 4.0 * bm * bn * d / (sm_rate * fwd_eff) + exp_s
    max_fwd = np.where(dense_causal, np.minimum(nk, per_head), per_head / nq)
    fwd_span = _makespan_tiles(bh * nq, total, max_fwd, ~dense_causal, sm)
    fwd_bytes = batch * elt * d * (2.0 * sq * hq + 2.0 * skv * hkv) + bh * sq * 4.0
    fwd_waves = cdiv(bh * nq, sm)
    fwd_compute_s = fwd_span * fwd_tile_s + fwd_waves * bp["cta_latency_s"]
    fwd_s = bp["launch_s"] + np.maximum(fwd_compute_s, fwd_bytes / hbm)
    # a few query rows over many keys leave the GPU idle: FA2 splits the keys (FA2's
    # threshold: fewer CTAs than 80% of 2 per SM; only those rows are priced again)
    names = np.where(sparse & (backend == ""), "flex", backend)
    idle = (names == "flash") & ~sparse & (bh * cdiv(sq, SPLIT_BLOCK_M) < 0.8 * 2.0 * sm)
    if idle.any():
        r = np.flatnonzero(idle)
        fwd_s = np.array(fwd_s, dtype=float)
        fwd_s[r] = _split_kv_fwd_s(
            batch[r], sq[r], skv[r], hq[r], d[r], causal[r], fwd_eff[r], fwd_bytes[r],
            sm_rate[r], {k: v[r] for k, v in bp.items()}, sm, sfu_per_sm, hbm, fwd_s[r],
        )  # fmt: skip

    # Backward: one CTA per (key block, head); recomputes P (exp) and does 5 matmuls.
    bwd_eff = bp["bwd_efficiency"] * head_dim_factor(d, bp["bwd64"], bp["bwd256"])
    bwd_tile_s = 10.0 * bm * bn * d / (sm_rate * bwd_eff) + exp_s
    # block-sparse backward: each key block visits ceil(density x query blocks) tiles
    dens = np.nan_to_num(density)
    per_head_bwd = np.where(sparse, nk * np.maximum(np.ceil(dens * nq), 1), per_head)
    total_bwd = bh * per_head_bwd
    max_bwd = np.where(dense_causal, np.minimum(nq, per_head), per_head_bwd / nk)
    bwd_span = _makespan_tiles(bh * nk, total_bwd, max_bwd, ~dense_causal, sm)
    # reads Q, O, dO, K, V, LSE; writes dQ, and dK, dV per query head (summed for GQA);
    # dQ accumulates in fp32 and is converted at the end (FA2's dq_accum).
    bwd_bytes = (
        batch * d * (elt * (4.0 * sq * hq + 2.0 * skv * hkv + 2.0 * skv * hq) + 8.0 * sq * hq)
    )
    # FA2 runs a pre-kernel (rowsum dO.O) and, after the main kernel, converts the fp32 dQ
    # accumulator: sequential traffic that scales with query rows, not with tiles
    rows_s = batch * hq * sq * d * bp["bwd_row_bytes"] / hbm
    bwd_waves = cdiv(bh * nk, sm)
    bwd_compute_s = bwd_span * bwd_tile_s + bwd_waves * bp["cta_latency_s"]
    bwd_s = (
        bp["launch_s"] + bp["bwd_launch_s"] + np.maximum(bwd_compute_s, bwd_bytes / hbm) + rows_s
    )

    time_s = np.where(do_fwd, fwd_s, 0.0) + np.where(do_bwd, bwd_s, 0.0)
    tile_flops = 4.0 * bm * bn * d
    flops = tile_flops * (np.where(do_fwd, total, 0.0) + np.where(do_bwd, 2.5 * total_bwd, 0.0))
    bytes_ = np.where(do_fwd, fwd_bytes, 0.0) + np.where(do_bwd, bwd_bytes, 0.0)
    return Work(time_s=time_s, flops=flops, bytes=bytes_)


_DECODE_FIELDS = ("memory_efficiency", "crowded_bytes_per_s", "ctas_per_sm", "launch_s",
                  "split_iter_s")  # fmt: skip


def _decode_arrays(named: np.ndarray, p: AttentionParams) -> dict[str, np.ndarray | float]:
    """The split-KV decode parameters of every row: :class:`AttentionParams`' ``decode_*``
    scalars, or per row those of a backend in ``decode_backends`` (``own`` marks its rows).
    Scalars stay scalars when no row names such a backend (the same arithmetic)."""
    hd = p.decode_head_dim_factor
    out: dict[str, np.ndarray | float] = {f: getattr(p, f"decode_{f}") for f in _DECODE_FIELDS}
    out["hd64"], out["hd256"] = np.float64(hd[64]), np.float64(hd[256])
    own = np.isin(named, list(p.decode_backends or [""]))
    out["own"] = own
    if not own.any():
        return out
    for key in (*_DECODE_FIELDS, "hd64", "hd256"):
        out[key] = np.full(len(named), out[key], dtype=float)
    for name, bp in p.decode_backends.items():
        rows = named == name
        for f in _DECODE_FIELDS:
            out[f][rows] = getattr(bp, f)
        out["hd64"][rows], out["hd256"][rows] = bp.head_dim_factor[64], bp.head_dim_factor[256]
    return out


def decode_work(
    batch: np.ndarray,
    sq: np.ndarray,
    skv: np.ndarray,
    hq: np.ndarray,
    hkv: np.ndarray,
    d: np.ndarray,
    dtype: np.ndarray,
    backend: np.ndarray,
    gpu: GpuSpec,
    p: AttentionParams,
) -> Work:
    """seq_q (default 1) new tokens per sequence attending over a KV cache of seq_kv.

    Split-KV spreads the cache over enough CTAs to fill the GPU: a continuous split
    count s = clip(SMs x c / units, 1, seq_kv / 128) stands in for FlashAttention-2's
    discrete num_splits heuristic, so time stays monotone in every size. HBM traffic is
    K and V once, plus the fp32 partial outputs the combine step reads back; a decode
    never beats one wave of 128-key blocks. Backends without split-KV (the memory-
    efficient kernel) stream the cache with batch x KV-head CTAs only, so a small batch
    leaves most SMs idle and reads at that fraction of the bandwidth. Whichever is
    longer of the HBM stream and one CTA's block-by-block walk sets the time.
    """
    sq = np.where(np.isnan(sq), 1.0, sq)
    flops = 4.0 * batch * hq * sq * skv * d
    elt = by_dtype(dtype, ELEMENT_BYTES, "decode attention")
    real_bytes = batch * (skv * hkv + sq * hq) * d * 2.0 * elt
    # FlashAttention instantiates head dims 32, 64, 96, 128, 160, 192, 224, 256 and pads
    # the others up (flash_api.cpp round_multiple(head_size, 32)); the tile loads and
    # the combine traffic follow the padded width.
    # The memory-efficient (cutlass) kernel is compiled for head_dim <= 64, <= 128 and
    # any (kernel_forward.h kMaxK); measured, head_dim 80 runs exactly like 128.
    named = np.where(backend == "", "flash", backend)
    dp = _decode_arrays(named, p)
    split = np.isin(named, p.decode_split_kv_backends) | dp["own"]
    d_tmpl = np.where(d <= 64, 64.0, np.where(d <= 128, 128.0, d))
    d = np.where(named == "flash", np.ceil(d / 32.0) * 32.0, np.where(split, d, d_tmpl))
    slots = gpu.sm_count * dp["ctas_per_sm"]
    kv_bytes = batch * skv * hkv * d * 2.0 * elt
    qo_bytes = batch * sq * hq * d * 2.0 * elt
    # GQA heads of one KV head share a CTA (query heads packed into 64-row tiles).
    rows = sq * hq / hkv
    units = batch * hkv * cdiv(rows, 64.0)
    split_units = np.clip(slots, units, units * np.maximum(skv / DECODE_BLOCK_N, 1.0))
    combine_bytes = split_units * np.minimum(rows, 64.0) * (d + 1) * 4.0 * 2.0
    floor_bytes = slots * DECODE_BLOCK_N * d * 2.0 * elt
    occupancy = np.where(split, 1.0, np.minimum(1.0, units / slots))
    combine_bytes = np.where(split, combine_bytes, 0.0)
    bw = gpu.hbm_bytes_per_s * dp["memory_efficiency"] * occupancy
    bw = bw * head_dim_factor(d, dp["hd64"], dp["hd256"])
    # More cache streams than SMs (no split left to make): the read rate drops to a
    # GPU-independent ceiling (measured: 2.7 TB/s on H100 and H200 alike at batch x KV
    # heads = 256, against 3.0 and 4.4 TB/s at 128).
    crowded = split & (units > gpu.sm_count)
    bw = np.where(crowded, np.minimum(bw, dp["crowded_bytes_per_s"]), bw)
    mem_s = (np.maximum(kv_bytes + qo_bytes, floor_bytes) + combine_bytes) / bw
    compute_s = flops / (peak_flops(dtype, gpu) * 0.25)  # few query rows: tensor cores mostly idle
    # A CTA walks its keys block by block, each step a dependent load: with few CTAs
    # the kernel is bound by that walk, not by HBM (a non-split kernel at batch 1 takes
    # nearly the same time at head_dim 64 and 256). Waves count CTAs beyond the resident slots.
    nosplit_slots = gpu.sm_count * p.decode_nosplit_ctas_per_sm
    nf = p.decode_nosplit_head_dim_factor
    walk_split_s = (
        np.maximum(split_units / slots, 1.0)
        * np.maximum(skv / DECODE_BLOCK_N / (split_units / units), 1.0)
        * dp["split_iter_s"]
    )
    walk_nosplit_s = (
        np.maximum(units / nosplit_slots, 1.0)
        * np.maximum(skv / NOSPLIT_BLOCK_N, 1.0)
        * p.decode_nosplit_iter_s
        / head_dim_factor(d, np.float64(nf[64]), np.float64(nf[256]))
    )
    walk_s = np.where(split, walk_split_s, walk_nosplit_s)
    time_s = dp["launch_s"] + np.maximum(np.maximum(mem_s, compute_s), walk_s)
    return Work(time_s=time_s, flops=flops, bytes=real_bytes)
