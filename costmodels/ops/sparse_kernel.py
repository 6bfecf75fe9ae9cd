"""The tile kernel model of block-sparse attention: per-GPU parameters, CTA work and the
SM schedule.

Per CTA: ``cta_s + sum over tiles (matmul / efficiency + exp) + partial tiles x mask_s``;
a launch takes ``launch_s + makespan`` of its CTAs dispatched in grid order to one slot
per SM (:func:`list_schedule`), never less than a memory floor (Q, K, V, O once), plus
work outside the kernel (the backward ``dO . O`` pre-kernel). :func:`price_launches`
prices several launches at once. Per CTA the work is linear in the parameters
(:func:`cta_features` @ :func:`cta_coefficients` + exp), which is what the fit in
``calibrate.sparse.attention`` solves for.

Parameters per GPU come from ``data/sparse_attention.yaml`` (:func:`kernel_params`),
fitted by ``python -m calibrate.sparse.attention --write``; GPUs without a fit of their
own or of their architecture get :func:`derived_params` from the dense attention model.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from costmodels.ops.sparse_tiles import SparseAttentionError, TileCounts
from hardware_specs.schema import GpuSpec

# In-order list scheduling is simulated exactly up to EXACT_WAVES waves of CTAs; longer
# grids are spread evenly except for their last TAIL_WAVES waves (see list_schedule).
EXACT_WAVES = 32
TAIL_WAVES = 16
ELEMENT_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0}
_DATA = "sparse_attention.yaml"


# --------------------------------------------------------------------------- parameters


def _interp_log2(table: Mapping[int, float], x: float) -> float:
    """Value at ``x`` from a {size: value} table: linear in log2(size), held flat outside."""
    keys = sorted(int(k) for k in table)
    vals = [float(table[k]) for k in keys]
    if len(keys) == 1:
        return vals[0]
    return float(np.interp(np.log2(x), np.log2(keys), vals))


@dataclass(frozen=True)
class TileKernelParams:
    """A block-sparse attention kernel family on one GPU. Times in seconds.

    ``*_efficiency``: tensor-core efficiency of a tile's matmuls, keyed by tile side
    (block size; interpolated in log2). ``*_mask_s``: extra SM-seconds of a partial tile
    (element mask), keyed by tile side; scaled by tile area in between. ``*_cta_s``:
    fixed SM-seconds per CTA. ``*_launch_s``: fixed time per kernel call (including the
    framework's per-call work). ``bwd_row_bytes``: pre-kernel bytes per query row x head x
    head_dim (``dO . O``).
    """

    fwd_efficiency: Mapping[int, float]
    fwd_mask_s: Mapping[int, float]
    fwd_cta_s: float
    fwd_launch_s: float
    bwd_efficiency: Mapping[int, float]
    bwd_mask_s: Mapping[int, float]
    bwd_cta_s: float
    bwd_launch_s: float
    bwd_row_bytes: float = 4.0
    exp_overlap: float = 0.0
    memory_efficiency: float = 0.85
    source: str = ""

    def efficiency(self, direction: str, side: float) -> float:
        table = self.fwd_efficiency if direction == "fwd" else self.bwd_efficiency
        return min(1.0, max(1e-3, _interp_log2(table, side)))

    def mask_s(self, direction: str, bq: int, bk: int) -> float:
        table = self.fwd_mask_s if direction == "fwd" else self.bwd_mask_s
        side = math.sqrt(bq * bk)
        per_elem = {k: v / (k * k) for k, v in table.items()}
        return max(0.0, _interp_log2(per_elem, side)) * bq * bk

    def to_dict(self) -> dict[str, Any]:
        def keyed(m: Mapping[int, float]) -> dict[int, float]:
            return {int(k): float(v) for k, v in sorted(m.items())}

        return {
            "fwd": {
                "efficiency": keyed(self.fwd_efficiency),
                "mask_s": keyed(self.fwd_mask_s),
                "cta_s": float(self.fwd_cta_s),
                "launch_s": float(self.fwd_launch_s),
            },
            "bwd": {
                "efficiency": keyed(self.bwd_efficiency),
                "mask_s": keyed(self.bwd_mask_s),
                "cta_s": float(self.bwd_cta_s),
                "launch_s": float(self.bwd_launch_s),
                "row_bytes": float(self.bwd_row_bytes),
            },
            "exp_overlap": float(self.exp_overlap),
            "memory_efficiency": float(self.memory_efficiency),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "") -> TileKernelParams:
        f, b = d["fwd"], d["bwd"]

        def keyed(m: Mapping[Any, Any]) -> dict[int, float]:
            return {int(k): float(v) for k, v in m.items()}

        return cls(
            fwd_efficiency=keyed(f["efficiency"]),
            fwd_mask_s=keyed(f["mask_s"]),
            fwd_cta_s=float(f["cta_s"]),
            fwd_launch_s=float(f["launch_s"]),
            bwd_efficiency=keyed(b["efficiency"]),
            bwd_mask_s=keyed(b["mask_s"]),
            bwd_cta_s=float(b["cta_s"]),
            bwd_launch_s=float(b["launch_s"]),
            bwd_row_bytes=float(b.get("row_bytes", 4.0)),
            exp_overlap=float(d.get("exp_overlap", 0.0)),
            memory_efficiency=float(d.get("memory_efficiency", 0.85)),
            source=str(d.get("source", source)),
        )


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    path = Path(str(resources.files("costmodels") / "data" / _DATA))
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def gpu_spec(gpu: str | GpuSpec) -> GpuSpec:
    """A GPU id resolved in the built-in catalog (a spec as is); one-line error."""
    if isinstance(gpu, GpuSpec):
        return gpu
    from hardware_specs.registry import builtin_catalog

    try:
        return builtin_catalog().gpu(str(gpu))
    except Exception as exc:  # the registry's own message names the valid ids
        raise SparseAttentionError(str(exc).splitlines()[0]) from None


def kernel_params(gpu: str | GpuSpec, backend: str = "flex") -> TileKernelParams:
    """Parameters of ``backend``'s block-sparse kernel on ``gpu``: fitted ones from
    ``data/sparse_attention.yaml`` (this GPU, else one of the same architecture), else
    derived from the dense attention parameters of the architecture (uncalibrated)."""
    spec = gpu_spec(gpu)
    fitted = _data().get("backends", {}).get(backend, {})
    if spec.id in fitted:
        entry = fitted[spec.id]
        return replace(TileKernelParams.from_dict(entry), source=entry.get("source", spec.id))
    from hardware_specs.registry import builtin_catalog

    cat = builtin_catalog()
    for gid, entry in fitted.items():
        if gid in cat.gpus and cat.gpus[gid].architecture == spec.architecture:
            label = f"transferred from {gid} (same architecture): {entry.get('source', '')}"
            return replace(TileKernelParams.from_dict(entry), source=label)
    return derived_params(spec, backend)


# Extra cost of a partial tile relative to a full one (forward tile; backward, per
# program, relative to the whole 7-matmul tile), for uncalibrated GPUs: FlexAttention as
# fitted on Hopper (128x128 tiles, both GPUs), and a guess of 25% / 10% for kernels whose
# masks are built in (FlashAttention's causal and local masking).
_DERIVED_MASK_OVERHEAD = {"flex": (1.85, 0.35)}


def derived_params(spec: GpuSpec, backend: str) -> TileKernelParams:
    """Not fitted on block-sparse data: the dense attention model's efficiencies and
    latencies for this backend (the GPU's calibrated profile when one ships, else the
    architecture's defaults) and ``_DERIVED_MASK_OVERHEAD`` for partial tiles."""
    from costmodels.ops.params import arch_params

    try:
        from costmodels.ops.select import get_cost_model

        model = get_cost_model(spec.id)
        ap = getattr(model, "base", model).params.attention
        origin = model.label
    except Exception:  # a GPU outside the catalog: the architecture's defaults
        ap, origin = arch_params(spec.architecture).attention, f"{spec.architecture} defaults"
    if backend not in ap.backends:
        raise SparseAttentionError(
            f"no attention parameters for backend {backend!r}; known: {', '.join(ap.backends)}"
        )
    bp = ap.backends[backend]
    side = int(math.sqrt(bp.block_m * bp.block_n))
    rel_f, rel_b = _DERIVED_MASK_OVERHEAD.get(backend, (0.25, 0.10))
    rate = spec.peak_flops_per_s("bf16") / spec.sm_count
    # the dense model counts 5 backward matmuls per tile (FlashAttention-2), this one 7
    bwd_eff = min(1.0, bp.bwd_efficiency * 14.0 / 10.0)
    t_f = 4.0 * side * side * 128 / (rate * bp.fwd_efficiency)
    t_b = 14.0 * side * side * 128 / (rate * bwd_eff)
    return TileKernelParams(
        fwd_efficiency={side: bp.fwd_efficiency},
        fwd_mask_s={side: rel_f * t_f},
        fwd_cta_s=bp.cta_latency_s,
        fwd_launch_s=bp.launch_s,
        bwd_efficiency={side: bwd_eff},
        bwd_mask_s={side: rel_b * t_b},
        bwd_cta_s=bp.cta_latency_s,
        bwd_launch_s=bp.launch_s + bp.bwd_launch_s,
        exp_overlap=bp.exp_overlap,
        memory_efficiency=ap.memory_efficiency,
        source=f"uncalibrated: {backend} dense attention parameters ({origin})",
    )


# --------------------------------------------------------------------------- scheduling


def _greedy(w: list[float], slots: int, start: float = 0.0) -> tuple[list[float], list[int]]:
    """Exact in-order greedy: each CTA to the slot that frees first (ties: lowest slot)."""
    heap = [(start, s) for s in range(slots)]
    assign = [0] * len(w)
    for j, x in enumerate(w):
        t, s = heap[0]
        heapq.heapreplace(heap, (t + x, s))
        assign[j] = s
    finish = [0.0] * slots
    for t, s in heap:
        finish[s] = t
    return finish, assign


def list_schedule(
    works: Sequence[np.ndarray],
    slots: int,
    feats: Sequence[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Makespan of in-order greedy dispatch of CTAs to ``slots`` identical SM slots.

    ``works[r]``: the CTAs of kernel ``r`` in dispatch order (seconds each). Each CTA goes
    to the slot that frees first (the hardware block scheduler). Exact up to
    ``EXACT_WAVES`` waves; longer grids spread all but the last ``TAIL_WAVES`` waves evenly
    over the slots and simulate the tail exactly (the greedy schedule keeps slots within
    one CTA of each other, so the error is at most one CTA's work against many waves),
    never below the largest CTA. Returns the makespan per kernel and, if ``feats[r]``
    (``[n_r, k]`` per CTA) is given, the feature sums of the busiest slot (``[R, k]``):
    with CTA work linear in parameters, the makespan is linear in them for a fixed
    assignment (the fit uses this).
    """
    out = np.zeros(len(works))
    busy = np.zeros((len(works), feats[0].shape[1])) if feats is not None and works else None
    for r, w in enumerate(works):
        w = np.asarray(w, dtype=float).ravel()
        f = np.asarray(feats[r], dtype=float) if feats is not None else None
        n_head = len(w) - TAIL_WAVES * slots if len(w) > EXACT_WAVES * slots else 0
        start = float(w[:n_head].sum()) / slots
        finish, assign = _greedy(w[n_head:].tolist(), slots, start)
        finish_a = np.asarray(finish)
        top = int(finish_a.argmax())
        out[r] = max(float(finish_a[top]), float(w.max(initial=0.0)))
        if busy is not None and f is not None:
            on_top = np.asarray(assign, dtype=int) == top
            busy[r] = f[:n_head].sum(0) / slots + f[n_head:][on_top].sum(0)
            if w.size and float(w.max()) > finish_a[top]:  # one CTA longer than the rest
                busy[r] = f[int(w.argmax())]
    return out, busy


# --------------------------------------------------------------------------- kernel model


@dataclass(frozen=True)
class KernelTime:
    """One kernel launch: time and what it is made of (seconds, tiles, FLOPs, bytes)."""

    time_s: float
    launch_s: float
    makespan_s: float
    average_s: float  # total CTA work / slots: the balanced-load time
    compute_s: float  # the tiles' matmuls and exponentials alone / slots (no mask, no CTA)
    extra_s: float  # outside the main kernel (backward pre-kernel)
    memory_floor_s: float
    ctas: int
    full_tiles: float
    partial_tiles: float
    flops: float  # executed (backward: 7 matmuls per tile, recomputation included)

    @property
    def imbalance(self) -> float:
        """makespan / balanced time (>= 1)."""
        return self.makespan_s / self.average_s if self.average_s > 0 else 1.0


@dataclass(frozen=True)
class KernelContext:
    """What a launch's CTA work depends on besides its tiles: GPU, dtype and shape."""

    gpu: GpuSpec
    dtype: str
    batch: int
    head_dim: int
    heads_q: int
    heads_kv: int

    @property
    def sm_rate(self) -> float:
        return self.gpu.peak_flops_per_s(self.dtype) / self.gpu.sm_count

    @property
    def sfu_rate(self) -> float:
        return self.gpu.sfu_ops_per_s / self.gpu.sm_count

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv


def cta_features(tc: TileCounts, ctx: KernelContext, direction: str, exp_overlap: float):
    """Per-CTA features in dispatch order: ``[1, matmul SM-seconds at 100% efficiency,
    partial tiles]`` and the known per-CTA exp time. Work = features @ [cta_s, 1/eff,
    mask_s] + exp."""
    bq, bk, d = tc.block_q, tc.block_k, ctx.head_dim
    exp_tile = (1.0 - exp_overlap) * bq * bk / ctx.sfu_rate
    mm_unit = bq * bk * d / ctx.sm_rate  # one (bq x d) . (d x bk) matmul: 2*bq*bk*d FLOPs
    if direction == "fwd":
        vis = tc.full + tc.partial  # [Hq, nq]
        shape = (tc.heads, ctx.batch, tc.q_blocks)  # dispatch: q block, batch, head
        n = np.ones(shape)
        mm = np.broadcast_to((4.0 * mm_unit * vis)[:, None, :], shape)
        part = np.broadcast_to(tc.partial[:, None, :], shape)
        ex = np.broadcast_to((exp_tile * vis)[:, None, :], shape)
    else:
        g, hkv = ctx.group, ctx.heads_kv

        def grouped(a: np.ndarray) -> np.ndarray:
            return a.reshape(hkv, g, a.shape[1]).sum(1)

        # per (batch, kv head): dK/dV programs (one per key block, looping over the G query
        # heads), then dQ programs (one per query block and query head of the group)
        vis_t, part_t = grouped(tc.full_t + tc.partial_t), grouped(tc.partial_t)
        vis = (tc.full + tc.partial).reshape(hkv, g * tc.q_blocks)
        part_q = tc.partial.reshape(hkv, g * tc.q_blocks)
        mm_h = np.concatenate([8.0 * mm_unit * vis_t, 6.0 * mm_unit * vis], 1)
        part_h = np.concatenate([part_t, part_q], 1)
        ex_h = np.concatenate([exp_tile * vis_t, exp_tile * vis], 1)
        shape = (ctx.batch, hkv, mm_h.shape[1])
        n = np.ones(shape)
        mm = np.broadcast_to(mm_h[None], shape)
        part = np.broadcast_to(part_h[None], shape)
        ex = np.broadcast_to(ex_h[None], shape)
    feats = np.stack([n.ravel(), mm.ravel(), part.ravel()], 1)
    return feats, np.ascontiguousarray(ex).ravel()


def cta_coefficients(p: TileKernelParams, direction: str, tc: TileCounts) -> np.ndarray:
    """``[cta_s, 1 / efficiency, mask_s]`` of ``p`` at ``tc``'s tile size: what
    :func:`cta_features` are multiplied by."""
    side = math.sqrt(tc.block_q * tc.block_k)
    cta = p.fwd_cta_s if direction == "fwd" else p.bwd_cta_s
    return np.array(
        [cta, 1.0 / p.efficiency(direction, side), p.mask_s(direction, tc.block_q, tc.block_k)]
    )


def kernel_extras(tc: TileCounts, ctx: KernelContext, direction: str, p: TileKernelParams):
    """(launch, outside-kernel seconds, memory floor seconds) of one launch."""
    elt = ELEMENT_BYTES.get(ctx.dtype, 2.0)
    hbm = ctx.gpu.hbm_bytes_per_s * p.memory_efficiency
    sq, skv = tc.q_blocks * tc.block_q, tc.kv_blocks * tc.block_k
    b, d, hq, hkv = ctx.batch, ctx.head_dim, ctx.heads_q, ctx.heads_kv
    if direction == "fwd":
        io = b * elt * d * (2.0 * sq * hq + 2.0 * skv * hkv) + b * hq * sq * 4.0
        return p.fwd_launch_s, 0.0, io / hbm
    io = b * d * elt * (4.0 * sq * hq + 4.0 * skv * hkv)
    rows_s = b * hq * sq * d * p.bwd_row_bytes / hbm
    return p.bwd_launch_s, rows_s, io / hbm


def price_launches(
    tcs: Sequence[TileCounts],
    ctxs: Sequence[KernelContext],
    direction: str,
    params: Sequence[TileKernelParams],
) -> list[KernelTime]:
    """Several independent launches of one direction, scheduled together (vectorised)."""
    works, stats, exps, side = [], [], [], []
    for tc, ctx, p in zip(tcs, ctxs, params, strict=True):
        feats, ex = cta_features(tc, ctx, direction, p.exp_overlap)
        works.append(feats @ cta_coefficients(p, direction, tc) + ex)
        stats.append(feats)
        exps.append(ex)
        side.append(math.sqrt(tc.block_q * tc.block_k))
    slots = [ctx.gpu.sm_count for ctx in ctxs]  # one resident CTA per SM fits best
    out: list[KernelTime | None] = [None] * len(tcs)
    for s in sorted(set(slots)):
        idx = [i for i, v in enumerate(slots) if v == s]
        makespans, _ = list_schedule([works[i] for i in idx], s)
        for i, ms in zip(idx, makespans, strict=True):
            tc, ctx, p = tcs[i], ctxs[i], params[i]
            launch, extra, floor = kernel_extras(tc, ctx, direction, p)
            out[i] = KernelTime(
                time_s=launch + max(float(ms), floor) + extra,
                launch_s=launch,
                makespan_s=float(ms),
                average_s=float(works[i].sum()) / s,
                compute_s=float(
                    stats[i][:, 1].sum() / p.efficiency(direction, side[i]) + exps[i].sum()
                )
                / s,
                extra_s=extra,
                memory_floor_s=floor,
                ctas=len(works[i]),
                full_tiles=float(ctx.batch * tc.full.sum()),
                partial_tiles=float(ctx.batch * tc.partial.sum()),
                # matmul feature = FLOPs / per-SM peak rate
                flops=float(stats[i][:, 1].sum()) * ctx.sm_rate,
            )
    return out  # type: ignore[return-value]


__all__ = [
    "ELEMENT_BYTES",
    "EXACT_WAVES",
    "TAIL_WAVES",
    "KernelContext",
    "KernelTime",
    "TileKernelParams",
    "cta_coefficients",
    "cta_features",
    "derived_params",
    "gpu_spec",
    "kernel_extras",
    "kernel_params",
    "list_schedule",
    "price_launches",
]
