"""Block-sparse attention priced from tile tables, and the sparse kernels built on it.

Why tile tables, not a density. A block-sparse kernel (FlexAttention, FlashAttention's
block-sparse path) runs one CTA per (query block, head) in the forward pass; each CTA
walks the key blocks its row visits. What a pattern costs depends on *which* tiles it
visits, not only on how many:

- *full* tiles run the plain inner loop; *partial* tiles (the causal diagonal, a window's
  edge) also evaluate the element mask (FlexAttention's ``mask_mod``). Fitted on the
  measured FlexAttention data, a partial 128x128 tile costs ~2.9x a full one forward (the
  benchmark's mask reads a block table per element), a partial 64x64 tile ~1.4x;
- CTAs are dispatched to SMs in grid order (query block fastest, then batch, then head)
  and an SM takes the next CTA when it frees up (one resident CTA per SM fits the data
  best): the kernel ends with the busiest SM (makespan), not at total work / SMs;
- every CTA pays a fixed cost (loading Q or K/V, the block-index reads, storing the
  output): sparse rows with few tiles are dominated by it;
- backward (PyTorch's flex backward template: one launch, per batch and KV head a grid of
  key-block programs then query-block programs) runs one CTA per *key* block
  accumulating dK, dV over the query blocks that visit it, for each query head of the
  GQA group (the table's transpose; 4 of the 7 matmuls of a tile), and one CTA per query
  block and query head accumulating dQ (3 matmuls); both recompute P = exp(QK^T - lse).
  A ``dO . O`` pre-kernel streams 4 bytes per query row x head x head_dim.

Per CTA: ``cta_s + sum over tiles (matmul / efficiency + exp) + partial tiles x mask_s``;
kernel time = launch + makespan (a memory floor for Q, K, V, O once). The tile table's
transpose comes from masks when given, otherwise from the table (see
:func:`tile_counts`). Parameters per GPU come from ``data/sparse_attention.yaml``, fitted
by ``benchmarks/sparse_attention_fit.py`` on the measured FlexAttention rows with whole
pattern families held out.

On top of the block-sparse model:

- :func:`nsa_kernel_choice`: NSA's selected-attention kernel (one program per query token
  and KV head, its G query heads padded to an MMA M of 16) versus the FSA kernel (Yan et
  al. 2025, Flash Sparse Attention: outer loop over KV blocks gathering the query tokens
  that selected each, fp32 partial outputs merged by a reduction kernel, online-softmax
  statistics in a separate pass): both times and the reason for the faster one.
- :func:`nsa_attention_time`: NSA's three branches (compressed, selected, window).
- :func:`sale_time`: SALE's low-bit estimation pass (~11% of dense attention, Ji et al.
  2025) plus block-sparse attention at the resulting density.
- :func:`head_sharded_time`: heads split over ranks (S2's per-head heterogeneous work):
  the slowest rank sets the time.

Pure numpy at run time (``workloads.sparsity`` is used when given its tables or
patterns, never required); fitting uses numpy least squares.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from hardware_specs.schema import GpuSpec

# In-order list scheduling is simulated exactly up to EXACT_WAVES waves of CTAs; longer
# grids are spread evenly except for their last TAIL_WAVES waves (see list_schedule).
EXACT_WAVES = 32
TAIL_WAVES = 16
ELEMENT_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0}
_DATA = "sparse_attention.yaml"


class SparseAttentionError(ValueError):
    """A bad input to the sparse attention models; the message is one line."""


# --------------------------------------------------------------------------- tile counts


@dataclass(frozen=True, eq=False)
class TileCounts:
    """Visited tiles of one attention kernel call, per head: ``full``/``partial``
    ``[heads, q_blocks]`` (per query block, the forward CTAs) and ``full_t``/``partial_t``
    ``[heads, kv_blocks]`` (per key block, the backward dK/dV CTAs)."""

    full: np.ndarray
    partial: np.ndarray
    full_t: np.ndarray
    partial_t: np.ndarray
    block_q: int = 128
    block_k: int = 128
    exact_transpose: bool = True

    def __post_init__(self) -> None:
        for name in ("full", "partial", "full_t", "partial_t"):
            arr = np.asarray(getattr(self, name), dtype=np.float64)
            if arr.ndim != 2 or (arr < 0).any() or not np.isfinite(arr).all():
                raise SparseAttentionError(
                    f"tile counts {name} must be a finite non-negative [heads, blocks] array"
                )
            object.__setattr__(self, name, arr)
        if self.full.shape != self.partial.shape or self.full_t.shape != self.partial_t.shape:
            raise SparseAttentionError("full/partial tile count shapes differ")
        if self.full.shape[0] != self.full_t.shape[0]:
            raise SparseAttentionError("row and column tile counts have different head counts")

    @classmethod
    def from_masks(
        cls, full: np.ndarray, partial: np.ndarray, block_q: int = 128, block_k: int = 128
    ) -> TileCounts:
        """From boolean ``[heads, q_blocks, kv_blocks]`` tables (exact transpose)."""
        full, partial = np.asarray(full, bool), np.asarray(partial, bool) & ~np.asarray(full)
        if full.ndim != 3 or full.shape != partial.shape:
            raise SparseAttentionError("tile masks must both be [heads, q_blocks, kv_blocks]")
        return cls(
            full=np.count_nonzero(full, axis=-1),
            partial=np.count_nonzero(partial, axis=-1),
            full_t=np.count_nonzero(full, axis=-2),
            partial_t=np.count_nonzero(partial, axis=-2),
            block_q=int(block_q),
            block_k=int(block_k),
        )

    @property
    def heads(self) -> int:
        return int(self.full.shape[0])

    @property
    def q_blocks(self) -> int:
        return int(self.full.shape[1])

    @property
    def kv_blocks(self) -> int:
        return int(self.full_t.shape[1])

    @property
    def visited(self) -> float:
        return float(self.full.sum() + self.partial.sum())

    @property
    def density(self) -> float:
        total = self.heads * self.q_blocks * self.kv_blocks
        return self.visited / total if total else 0.0

    def expand_heads(self, heads: int) -> TileCounts:
        """Repeat each head's rows ``heads / self.heads`` times (a selection shared by a
        GQA group, or one table for every head)."""
        if heads == self.heads:
            return self
        if heads % self.heads:
            raise SparseAttentionError(
                f"a tile table of {self.heads} heads cannot describe {heads} query heads; "
                "allowed: a table per query head, per KV head, or one shared head"
            )
        r = heads // self.heads
        return replace(
            self,
            full=np.repeat(self.full, r, 0),
            partial=np.repeat(self.partial, r, 0),
            full_t=np.repeat(self.full_t, r, 0),
            partial_t=np.repeat(self.partial_t, r, 0),
        )


def dense_tile_counts(
    seq_q: int, seq_kv: int | None = None, heads: int = 1, block: int = 128, causal: bool = False
) -> TileCounts:
    """Dense or causal (bottom-right aligned) attention as tile counts."""
    seq_kv = seq_q if seq_kv is None else seq_kv
    nq, nk = -(-seq_q // block), -(-seq_kv // block)
    if not causal:
        ones = np.ones((heads, nq, nk), bool)
        return TileCounts.from_masks(ones, ~ones, block, block)
    off = seq_kv - seq_q
    qs = np.arange(nq)[:, None] * block
    qe = np.minimum(qs + block, seq_q) - 1
    ks = np.arange(nk)[None, :] * block
    ke = np.minimum(ks + block, seq_kv) - 1
    any_ = ks <= qe + off
    all_ = ke <= qs + off
    full = np.broadcast_to(all_, (heads, nq, nk))
    return TileCounts.from_masks(full, np.broadcast_to(any_ & ~all_, (heads, nq, nk)), block, block)


def _mirror(rows: np.ndarray, nk: int) -> np.ndarray:
    """Column counts of a table known only by its rows: the rows reversed (key block j
    gets the count of query block nq-1-j). Exact for dense, causal and sliding-window
    tables, whose masks are symmetric about the anti-diagonal; for data-dependent
    selections (top-k, NSA, S2 strides) the total is exact and the spread over key blocks
    approximate. Resampled when q and kv block counts differ."""
    rev = rows[:, ::-1]
    if rev.shape[1] == nk:
        return rev.copy()
    total = rows.sum(1, keepdims=True)
    x_src = (np.arange(rev.shape[1]) + 0.5) / rev.shape[1]
    x_dst = (np.arange(nk) + 0.5) / nk
    out = np.stack([np.interp(x_dst, x_src, r) for r in rev]) if nk else np.zeros((len(rows), 0))
    s = out.sum(1, keepdims=True)
    return np.where(s > 0, out * total / np.maximum(s, 1e-300), 0.0)


def tile_counts(table: Any, masks: Any = None) -> TileCounts:
    """A :class:`TileCounts` from a ``workloads.sparsity.TileTable`` (or any object with
    ``full``/``partial`` ``[heads, q_blocks]`` counts and ``block_q``/``block_k``), from a
    ``TileMask`` (boolean masks), or a TileCounts as is.

    The backward pass needs the transpose (tiles per key block). ``masks`` (a ``TileMask``
    of the same branch, e.g. ``pattern.tile_masks(...)["main"]``) gives it exactly, as do
    ``full_t``/``partial_t`` ``[heads, k_blocks]`` attributes on the table; otherwise it is
    derived from the table by mirroring (see :func:`_mirror`: exact for dense, causal and
    windows; off by up to ~30% in backward time for S2 strides and NSA's initial block)."""
    if isinstance(table, TileCounts):
        return table
    if masks is not None:
        return TileCounts.from_masks(masks.full, masks.partial, masks.block_q, masks.block_k)
    full = np.asarray(getattr(table, "full", None))
    partial = np.asarray(getattr(table, "partial", None))
    if full.ndim == 3:  # a TileMask
        return TileCounts.from_masks(full, partial, table.block_q, table.block_k)
    if full.ndim != 2 or partial.shape != full.shape:
        raise SparseAttentionError(
            "expected a tile table with full/partial [heads, q_blocks] counts; got "
            f"{type(table).__name__}"
        )
    bq = int(getattr(table, "block_q", 128))
    bk = int(getattr(table, "block_k", bq))
    full_t, partial_t = getattr(table, "full_t", None), getattr(table, "partial_t", None)
    if full_t is not None and partial_t is not None:  # a table that carries its transpose
        return TileCounts(full, partial, full_t, partial_t, bq, bk, exact_transpose=True)
    seq_kv = getattr(table, "seq_kv", None)
    nk = -(-int(seq_kv) // bk) if seq_kv is not None else full.shape[1]
    return TileCounts(
        full=full,
        partial=partial,
        full_t=_mirror(full.astype(float), nk),
        partial_t=_mirror(partial.astype(float), nk),
        block_q=bq,
        block_k=bk,
        exact_transpose=False,
    )


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


def _gpu_spec(gpu: str | GpuSpec) -> GpuSpec:
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
    spec = _gpu_spec(gpu)
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
    return _derived_params(spec, backend)


# Extra cost of a partial tile relative to a full one (forward tile; backward, per
# program, relative to the whole 7-matmul tile), for uncalibrated GPUs: FlexAttention as
# fitted on Hopper (128x128 tiles, both GPUs), and a guess of 25% / 10% for kernels whose
# masks are built in (FlashAttention's causal and local masking).
_DERIVED_MASK_OVERHEAD = {"flex": (1.85, 0.35)}


def _derived_params(spec: GpuSpec, backend: str) -> TileKernelParams:
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
class BlockSparseTime:
    """Forward and backward time of one block-sparse attention call (seconds)."""

    fwd: KernelTime
    bwd: KernelTime
    density: float
    exact_transpose: bool
    params_source: str

    @property
    def fwd_s(self) -> float:
        return self.fwd.time_s

    @property
    def bwd_s(self) -> float:
        return self.bwd.time_s

    @property
    def fwdbwd_s(self) -> float:
        return self.fwd.time_s + self.bwd.time_s


@dataclass(frozen=True)
class _Ctx:
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


def _cta_features(tc: TileCounts, ctx: _Ctx, direction: str, exp_overlap: float):
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


def _coefs(p: TileKernelParams, direction: str, tc: TileCounts) -> np.ndarray:
    side = math.sqrt(tc.block_q * tc.block_k)
    cta = p.fwd_cta_s if direction == "fwd" else p.bwd_cta_s
    return np.array(
        [cta, 1.0 / p.efficiency(direction, side), p.mask_s(direction, tc.block_q, tc.block_k)]
    )


def _kernel_extras(tc: TileCounts, ctx: _Ctx, direction: str, p: TileKernelParams):
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


def _price(
    tcs: Sequence[TileCounts],
    ctxs: Sequence[_Ctx],
    direction: str,
    params: Sequence[TileKernelParams],
) -> list[KernelTime]:
    """Several independent launches of one direction, scheduled together (vectorised)."""
    works, stats, exps, side = [], [], [], []
    for tc, ctx, p in zip(tcs, ctxs, params, strict=True):
        feats, ex = _cta_features(tc, ctx, direction, p.exp_overlap)
        works.append(feats @ _coefs(p, direction, tc) + ex)
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
            launch, extra, floor = _kernel_extras(tc, ctx, direction, p)
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


def _context(
    tc: TileCounts,
    gpu: str | GpuSpec,
    batch: int,
    head_dim: int,
    dtype: str,
    heads_q: int | None,
    heads_kv: int | None,
) -> tuple[TileCounts, _Ctx]:
    spec = _gpu_spec(gpu)
    hq = int(heads_q) if heads_q is not None else tc.heads
    hkv = int(heads_kv) if heads_kv is not None else hq
    if hq < 1 or hkv < 1 or hq % hkv:
        raise SparseAttentionError(
            f"heads_q={hq}, heads_kv={hkv}: allowed: heads_kv >= 1 dividing heads_q"
        )
    for name, v in (("batch", batch), ("head_dim", head_dim)):
        if int(v) < 1:
            raise SparseAttentionError(f"{name}={v!r} is invalid; allowed: an integer >= 1")
    if dtype not in ELEMENT_BYTES:
        raise SparseAttentionError(
            f"dtype {dtype!r} is not supported; allowed: {', '.join(ELEMENT_BYTES)}"
        )
    spec.peak_flops_per_s(dtype)  # raises with the GPU's supported dtypes
    return tc.expand_heads(hq), _Ctx(spec, dtype, int(batch), int(head_dim), hq, hkv)


def block_sparse_time(
    table: Any,
    *,
    gpu: str | GpuSpec = "h100-sxm",
    batch: int = 1,
    head_dim: int = 128,
    dtype: str = "bf16",
    backend: str = "flex",
    heads_q: int | None = None,
    heads_kv: int | None = None,
    masks: Any = None,
    params: TileKernelParams | None = None,
) -> BlockSparseTime:
    """Forward and backward time of block-sparse attention over ``table``.

    ``table``: a ``workloads.sparsity.TileTable`` (one branch: pass ``table.leaves()``
    entries for multi-branch patterns, or use :func:`pattern_time`), a ``TileMask`` or a
    :class:`TileCounts`. Its heads are query heads, or KV heads (a selection shared by each
    GQA group), or one head shared by all. ``masks``: the branch's ``TileMask`` for an
    exact backward transpose. ``batch`` sequences of the same pattern run in one launch.
    """
    tc = tile_counts(table, masks)
    tc, ctx = _context(tc, gpu, batch, head_dim, dtype, heads_q, heads_kv)
    p = params if params is not None else kernel_params(ctx.gpu, backend)
    fwd = _price([tc], [ctx], "fwd", [p])[0]
    bwd = _price([tc], [ctx], "bwd", [p])[0]
    return BlockSparseTime(fwd, bwd, tc.density, tc.exact_transpose, p.source)


def head_sharded_time(
    table: Any,
    ranks: int,
    *,
    direction: str = "fwd",
    masks: Any = None,
    heads_q: int | None = None,
    heads_kv: int | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Heads split into ``ranks`` contiguous groups (tensor/head parallelism: each rank
    holds heads_q / ranks query and heads_kv / ranks KV heads) and each rank runs its
    heads' kernel: the slowest rank sets the time. With S2-style patterns the heads' work
    differs (per-head strides), so this is a makespan across heads. ``kwargs`` go to
    :func:`block_sparse_time`.

    Returns ``time_s`` (slowest rank), ``rank_s`` (each rank) and ``imbalance``
    (slowest / mean)."""
    tc = tile_counts(table, masks)
    hq = int(heads_q) if heads_q is not None else tc.heads
    hkv = int(heads_kv) if heads_kv is not None else hq
    if ranks < 1 or hq % ranks or hkv % ranks:
        raise SparseAttentionError(
            f"ranks={ranks} must divide heads_q={hq} and heads_kv={hkv}; allowed: a divisor"
        )
    tc = tc.expand_heads(hq)
    h = hq // ranks
    times = []
    for r in range(ranks):
        sl = slice(r * h, (r + 1) * h)
        part = replace(
            tc,
            full=tc.full[sl],
            partial=tc.partial[sl],
            full_t=tc.full_t[sl],
            partial_t=tc.partial_t[sl],
        )
        res = block_sparse_time(part, heads_q=h, heads_kv=hkv // ranks, **kwargs)
        times.append(res.fwd_s if direction == "fwd" else res.bwd_s)
    t = np.array(times)
    return {"time_s": float(t.max()), "rank_s": t.tolist(), "imbalance": float(t.max() / t.mean())}


# --------------------------------------------------------------------------- SALE & patterns


# SALE (Ji et al. 2025, arXiv 2505.24179): its 4-bit selection pass costs "approximately
# 11% of the full attention latency" at long contexts.
SALE_ESTIMATE_FRACTION = 0.11


@dataclass(frozen=True)
class SaleTime:
    """SALE prefill (forward): estimation pass plus block-sparse attention (seconds)."""

    estimate_s: float
    sparse_s: float
    dense_s: float  # dense causal attention on the same shape, the estimate's reference

    @property
    def total_s(self) -> float:
        return self.estimate_s + self.sparse_s

    @property
    def speedup(self) -> float:
        return self.dense_s / self.total_s if self.total_s > 0 else float("inf")


def estimate_pass_time(table: Any, *, bits: int | None = None, **kwargs: Any) -> float:
    """A low-bit ``Q K^T`` estimation pass over ``table``'s tiles (SALE, AdaSpa's search):
    ``estimate_fraction`` (0.11 at 4 bits: SALE reports its selection pass at about 11% of
    full attention latency at long contexts) of the forward attention time over the same
    tiles, scaled by ``bits / 4`` for other precisions (assumed; the paper only reports 4)."""
    b = 4 if bits is None else int(bits)
    return SALE_ESTIMATE_FRACTION * max(b, 1) / 4.0 * block_sparse_time(table, **kwargs).fwd_s


def sale_time(sparse: Any, estimate: Any = None, *, bits: int = 4, **kwargs: Any) -> SaleTime:
    """SALE: the estimation pass over every causal tile plus block-sparse attention at the
    resulting density. ``sparse``: a SALE ``TileTable`` (its ``estimate``/``sparse``
    branches are used) or the sparse branch alone, with ``estimate`` the causal table
    (default: the causal tiles of the same shape)."""
    branches = getattr(sparse, "branches", None) or {}
    if "estimate" in branches and "sparse" in branches:
        estimate = branches["estimate"]
        bits = branches["estimate"].bits or bits
        sparse = branches["sparse"]
    tc = tile_counts(sparse)
    if estimate is None:
        seq = tc.q_blocks * tc.block_q
        estimate = dense_tile_counts(seq, seq, tc.heads, tc.block_q, causal=True)
    dense_s = block_sparse_time(estimate, **kwargs).fwd_s
    est_s = SALE_ESTIMATE_FRACTION * bits / 4.0 * dense_s
    return SaleTime(est_s, block_sparse_time(sparse, **kwargs).fwd_s, dense_s)


def pattern_time(table: Any, *, masks: Mapping[str, Any] | None = None, **kwargs: Any):
    """Expected forward and backward seconds of one call of a (multi-branch) pattern:
    ``sum(share x time)`` over ``table.leaves()``; ``estimate`` leaves are priced by
    :func:`estimate_pass_time` (forward only). Returns ``{"fwd_s", "bwd_s", "leaves"}``."""
    leaves = table.leaves() if hasattr(table, "leaves") else {"main": table}
    out: dict[str, Any] = {"fwd_s": 0.0, "bwd_s": 0.0, "leaves": {}}
    for name, leaf in leaves.items():
        share = float(getattr(leaf, "share", 1.0))
        m = (masks or {}).get(name)
        if getattr(leaf, "kind", "attention") == "estimate":
            f, b = estimate_pass_time(leaf, bits=leaf.bits, masks=m, **kwargs), 0.0
        else:
            res = block_sparse_time(leaf, masks=m, **kwargs)
            f, b = res.fwd_s, res.bwd_s
        out["leaves"][name] = {"share": share, "fwd_s": f, "bwd_s": b}
        out["fwd_s"] += share * f
        out["bwd_s"] += share * b
    return out


# --------------------------------------------------------------------------- NSA vs FSA


@dataclass(frozen=True)
class KernelChoice:
    """NSA's selected-attention kernel versus FSA's, for one configuration (forward)."""

    choice: str  # "nsa" or "fsa"
    nsa_s: float
    fsa_s: float
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return min(self.nsa_s, self.fsa_s)

    @property
    def fsa_speedup(self) -> float:
        """NSA time / FSA time (> 1: FSA is faster)."""
        return self.nsa_s / self.fsa_s


# NSA and FSA kernel constants (not fitted: no NSA/FSA measurements here). The structure
# of both kernels is read from their sources; these set its few free numbers.
NSA_FSA: dict[str, float] = {
    # Triton runs M=16 dots as mma.sync, not wgmma: about half the big-tile rate
    "small_m_efficiency": 0.5,
    # effective bandwidth of the NSA kernel's per-token K/V reloads (L2 hits plus L1
    # reuse between the consecutive tokens a program walks; H100/H200 L2 alone gives
    # ~5.5-7 TB/s). Set so that the NSA/FSA crossover of the selected branch falls
    # between G = 4 and G = 8 (64-token blocks, top-16, 64k tokens): the FSA README says
    # FSA targets groups below 8 and falls back to NSA at G >= 8.
    "kv_reload_bytes_per_s": 9.0e12,
    "token_s": 0.2e-6,  # per (token, KV head) program: load Q, store O and the LSE
    "launch_s": 5.0e-6,  # per kernel launch
    "fsa_kernels": 6,  # index build (2), softmax statistics, cummax, main, reduction
    "fsa_index_bytes": 32.0,  # token-to-block index traffic per selection
    "fsa_stats_passes": 3.0,  # the dense [heads, blocks, tokens] maxima: fill, cummax r+w
}


def _selected_pairs(seq_len: int, block: int, selected: int) -> float:
    """Sum over query tokens of the blocks each selects: min(selected, t // block + 1)."""
    t = np.arange(seq_len)
    return float(np.minimum(selected, t // block + 1).sum())


def nsa_kernel_choice(
    *,
    seq_len: int,
    heads_q: int,
    heads_kv: int,
    head_dim: int = 128,
    block: int = 64,
    selected: int = 16,
    batch: int = 1,
    dtype: str = "bf16",
    gpu: str | GpuSpec = "h100-sxm",
) -> KernelChoice:
    """NSA selected attention (each query token attends ``selected`` blocks of ``block``
    keys, shared by the G = heads_q / heads_kv query heads of a KV group): the NSA kernel
    versus the FSA kernel, forward.

    NSA kernel (fla-org/native-sparse-attention, XunhaoLai/native-sparse-attention-triton):
    one program per (query token, KV head) loads its G query heads as a [M, d] tile with
    M = max(16, next_pow2(G)) (Triton's ``tl.dot`` needs M >= 16) and loops over the
    selected blocks, reloading each block's K and V ([block, d] each) for every token.
    Per (token, KV head, block): ``4 M block d`` matmul FLOPs at the tensor-core efficiency
    of an M-row tile (below 64 rows no wgmma: ``small_m_efficiency`` of it), M x block
    exponentials, and the K/V reload at ``kv_reload_bytes_per_s`` (L2 and L1 hits);
    the slower of the three bounds each step.

    FSA kernel (Relaxed-System-Lab/Flash-Sparse-Attention): per KV block, gathers the
    query tokens that selected it into 128-row tiles (full tensor-core tiles whatever G),
    per query head. Three kernels and index building, each max(compute, HBM): a ``Q K^T``
    pass for the online-softmax maxima (its statistics buffer is dense over heads x blocks
    x tokens, written, scanned and read: ``fsa_stats_passes``), the main ``Q K^T``/``P V``
    kernel writing fp32 partial outputs and their scales per (token, head, block), and a
    reduction reading them back; plus the token-to-block index (``fsa_index_bytes`` per
    selection). FSA's cost grows with G while NSA's stays flat until G > 16, so FSA wins
    for small GQA groups and NSA for large ones.
    """
    spec = _gpu_spec(gpu)
    if heads_q % heads_kv:
        raise SparseAttentionError(f"heads_kv={heads_kv} must divide heads_q={heads_q}")
    P = NSA_FSA
    fx = kernel_params(spec, "flex")
    eff = fx.efficiency("fwd", 128)
    sm = spec.sm_count
    rate = spec.peak_flops_per_s(dtype)
    sm_rate, sfu = rate / sm, spec.sfu_ops_per_s / sm
    elt = ELEMENT_BYTES.get(dtype, 2.0)
    hbm = spec.hbm_bytes_per_s * fx.memory_efficiency
    g = heads_q // heads_kv
    d, bk = head_dim, block
    pairs_kv = batch * heads_kv * _selected_pairs(seq_len, bk, selected)  # (token, kvh, block)
    pairs_q = pairs_kv * g  # (token, q head, block)
    tokens = batch * seq_len

    # NSA: per (token, kv head, block) step
    m = max(16, 1 << (g - 1).bit_length())
    m_eff = eff * (P["small_m_efficiency"] if m < 64 else 1.0)
    mma = 4.0 * m * bk * d / (sm_rate * m_eff)
    exp_ = m * bk / sfu
    load = 2.0 * bk * d * elt / (P["kv_reload_bytes_per_s"] / sm)
    step = max(mma + exp_, load)
    nsa_s = P["launch_s"] + (pairs_kv * step + tokens * heads_kv * P["token_s"]) / sm
    nsa_bound = "K/V reloads" if load >= mma + exp_ else "padded MMA"

    # FSA: gathered 128-token tiles per (KV block, query head)
    nk = -(-seq_len // bk)
    tiles = batch * heads_q * max(nk, 1) * np.ceil(pairs_kv / (batch * heads_kv * max(nk, 1)) / 128)
    waste = max(1.0, float(tiles) * 128 / max(pairs_q, 1.0))  # padding of the last tiles
    f_qk = 2.0 * bk * d * pairs_q * waste
    f_main = 4.0 * bk * d * pairs_q * waste
    stats_buf = batch * heads_q * nk * seq_len * 4.0 * P["fsa_stats_passes"]
    by_index = pairs_kv * P["fsa_index_bytes"]
    by_qk = pairs_q * (d * elt + 4.0)
    by_main = pairs_q * (d * elt + 4.0 * d + 12.0) + batch * heads_kv * seq_len * 2 * d * elt
    by_reduce = pairs_q * (4.0 * d + 12.0) + tokens * heads_q * d * (elt + 4.0)
    parts = {
        "index": by_index / hbm,
        "softmax_stats": max(f_qk / (rate * eff), (by_qk + stats_buf) / hbm),
        "main": max(f_main / (rate * eff), by_main / hbm),
        "reduce": by_reduce / hbm,
    }
    fsa_s = P["fsa_kernels"] * P["launch_s"] + sum(parts.values())
    useful = g / m
    details = {
        "group": g,
        "mma_m": m,
        "mma_useful_fraction": useful,
        "nsa_step_s": step,
        "nsa_bound": nsa_bound,
        "nsa_kv_reload_bytes": pairs_kv * 2.0 * bk * d * elt,
        "fsa_parts_s": parts,
        "fsa_partial_output_bytes": pairs_q * (8.0 * d + 24.0),
        "selections": pairs_kv,
    }
    if fsa_s < nsa_s:
        reason = (
            f"FSA is {nsa_s / fsa_s:.2f}x faster: with G={g} query heads per KV head the NSA "
            f"kernel pads its MMA M dimension to {m} ({useful:.0%} useful) and reloads each "
            f"selected K/V block per token ({details['nsa_kv_reload_bytes'] / 1e9:.1f} GB, "
            f"bound by {nsa_bound}); FSA gathers 128 query tokens per KV block and pays "
            f"{details['fsa_partial_output_bytes'] / 1e9:.1f} GB of fp32 partial outputs "
            "and their reduction"
        )
        choice = "fsa"
    else:
        reason = (
            f"NSA is {fsa_s / nsa_s:.2f}x faster: G={g} query heads fill {useful:.0%} of its "
            f"M={m} MMA tile and share each K/V reload, while FSA's per-query-head work "
            f"(partial outputs {details['fsa_partial_output_bytes'] / 1e9:.1f} GB, "
            "softmax statistics, reduction) grows with G"
        )
        choice = "nsa"
    return KernelChoice(choice, float(nsa_s), float(fsa_s), reason, details)


@dataclass(frozen=True)
class NsaTime:
    """NSA forward: compressed and window branches (block-sparse model) plus the selected
    branch on the faster of the NSA and FSA kernels (seconds)."""

    compressed_s: float
    window_s: float
    selected: KernelChoice

    @property
    def nsa_total_s(self) -> float:
        return self.compressed_s + self.window_s + self.selected.nsa_s

    @property
    def fsa_total_s(self) -> float:
        return self.compressed_s + self.window_s + self.selected.fsa_s

    @property
    def total_s(self) -> float:
        return min(self.nsa_total_s, self.fsa_total_s)


def nsa_attention_time(
    *,
    seq_len: int,
    heads_q: int,
    heads_kv: int,
    head_dim: int = 128,
    pattern: Any = None,
    batch: int = 1,
    dtype: str = "bf16",
    gpu: str | GpuSpec = "h100-sxm",
) -> NsaTime:
    """NSA's three branches, forward. ``pattern``: a ``workloads.sparsity`` NSA pattern
    (default ``nsa`` with the paper's l=32, d=16, l'=64, n=16, w=512). The compressed
    branch (queries over the compressed keys) and the window branch are block-sparse
    attention over their tile tables (query heads, 128x128 tiles); the compressed keys'
    attention scores are also materialised for the top-n selection (fp32, written and
    read once per KV head). The selected branch: :func:`nsa_kernel_choice`."""
    if pattern is None:
        try:
            from workloads.sparsity import parse_pattern
        except ImportError as exc:  # pragma: no cover - workloads ships with costmodels
            raise SparseAttentionError("workloads.sparsity is needed for NSA tables") from exc
        pattern = parse_pattern("nsa")
    table = pattern.tiles(seq_len, heads_q)
    kw = dict(gpu=gpu, batch=batch, head_dim=head_dim, dtype=dtype, heads_q=heads_q)
    comp = table.branches["compressed"]
    comp_s = block_sparse_time(comp, heads_kv=heads_kv, **kw).fwd_s
    spec = _gpu_spec(gpu)
    nc = int(comp.seq_kv)
    scores = batch * heads_kv * seq_len * nc * 4.0 * 2.0
    comp_s += scores / (spec.hbm_bytes_per_s * kernel_params(spec).memory_efficiency)
    win_s = block_sparse_time(table.branches["window"], heads_kv=heads_kv, **kw).fwd_s
    choice = nsa_kernel_choice(
        seq_len=seq_len,
        heads_q=heads_q,
        heads_kv=heads_kv,
        head_dim=head_dim,
        block=int(pattern.lsel),
        selected=int(pattern.n),
        batch=batch,
        dtype=dtype,
        gpu=gpu,
    )
    return NsaTime(comp_s, win_s, choice)


# --------------------------------------------------------------------------- calibration

_FAMILY = re.compile(r"^(dense|causal|window/w(\d+)|topk/k(\d+)|s2/l(\d+)s(\d+)|nsa/l(\d+)n(\d+))$")


def _bench_masks(family: str, heads: int, seq: int, bs: int, seed: int = 0):
    """(full, partial) boolean [heads, nb, nb] tables of one measured FlexAttention row.

    Mirrors ``calibrate/bench/blocksparse.py`` (``block_layout`` + ``classify_blocks``):
    dense; causal; window (causal, ``q - k < w``); topk (k random key blocks among the
    causal ones, the diagonal always); s2 (``local`` recent blocks plus key blocks
    ``== h mod stride``); nsa (block 0 + ``local`` recent + n random causal blocks). The
    benchmark draws with torch's generator: here numpy's, so the random blocks differ while
    per-row counts match exactly for topk and in distribution for nsa."""
    m = _FAMILY.match(family)
    if not m:
        raise SparseAttentionError(f"unknown calibration family {family!r}")
    nb = seq // bs
    qb, kb = np.arange(nb)[:, None], np.arange(nb)[None, :]
    lower = np.broadcast_to(kb <= qb, (heads, nb, nb))
    causal, window = True, seq
    rng = np.random.default_rng(seed)
    if family == "dense":
        T, causal = np.ones((heads, nb, nb), bool), False
    elif family == "causal":
        T = lower.copy()
    elif m.group(2):
        T, window = lower.copy(), int(m.group(2))
    elif m.group(3) or m.group(7):
        n_sel = int(m.group(3) or m.group(7))
        if m.group(3):  # the diagonal plus k - 1 of the blocks before it
            T = _random_blocks(rng, heads, nb, n_sel - 1, diagonal=False)
            T[:, np.arange(nb), np.arange(nb)] = True
        else:  # n of the causal blocks, plus block 0 and the local blocks
            T = _random_blocks(rng, heads, nb, n_sel, diagonal=True)
            T |= kb == 0
            T |= (qb - kb) < int(m.group(6))
        T &= lower
    else:
        loc, stride = int(m.group(4)), int(m.group(5))
        offs = np.arange(heads)[:, None, None] % stride
        T = (((qb - kb) < loc) | ((kb % stride) == offs)) & lower
    diff = (qb - kb) * bs
    dmin, dmax = diff - (bs - 1), diff + (bs - 1)
    lo = 0 if causal else -(10**12)
    any_ok = (dmax >= lo) & (dmin <= window - 1)
    all_ok = (dmin >= lo) & (dmax <= window - 1)
    return T & all_ok, T & any_ok & ~all_ok


def _random_blocks(
    rng: np.random.Generator, heads: int, nb: int, k: int, diagonal: bool
) -> np.ndarray:
    """[heads, nb, nb] bool: row i holds min(k, c_i) distinct blocks drawn uniformly from
    its c_i candidates (0..i with the diagonal, 0..i-1 without). Rejection sampling of
    duplicates: O(heads x nb x k), not a sort over every row."""
    out = np.zeros((heads, nb, nb), bool)
    if k <= 0:
        return out
    cand = np.arange(nb) + (1 if diagonal else 0)  # candidates per row
    allrow = cand <= k  # rows that take every candidate
    lower = np.arange(nb)[None, :] < cand[:, None]
    out[:, allrow] = lower[allrow]
    rows = np.flatnonzero(~allrow)
    if rows.size:
        c = cand[rows].astype(float)[None, :, None]
        draw = np.floor(rng.random((heads, rows.size, k)) * c).astype(np.int64)
        while True:
            draw.sort(axis=-1)
            dup = np.zeros(draw.shape, bool)
            dup[..., 1:] = draw[..., 1:] == draw[..., :-1]
            if not dup.any():
                break
            redraw = np.floor(rng.random(int(dup.sum())) * np.broadcast_to(c, draw.shape)[dup])
            draw[dup] = redraw.astype(np.int64)
        h = np.arange(heads)[:, None, None]
        out[h, rows[None, :, None], draw] = True
    return out


@lru_cache(maxsize=256)
def calibration_tiles(family: str, heads: int, seq: int, block_size: int) -> TileCounts:
    """Tile counts of a measured FlexAttention row (exact transpose), cached."""
    full, partial = _bench_masks(family, heads, seq, block_size)
    return TileCounts.from_masks(full, partial, block_size, block_size)


@dataclass(frozen=True)
class CalibrationRow:
    direction: str  # "fwd" | "bwd"
    family: str
    pattern: str
    tiles: TileCounts
    batch: int
    heads: int
    head_dim: int
    seq: int
    block_size: int
    dtype: str
    measured_s: float


def calibration_rows(frame: Any) -> list[CalibrationRow]:
    """Measured block-sparse rows (a pandas frame of ``calibrate/data/*/blocksparse.csv``,
    ``status == ok``) with their tile tables."""
    rows = []
    for r in frame.itertuples(index=False):
        if getattr(r, "status", "ok") != "ok" or not np.isfinite(r.measured_ms):
            continue
        if int(r.seq_q) != int(r.seq_kv) or int(r.heads_q) != int(r.heads_kv):
            raise SparseAttentionError("calibration rows must be self-attention without GQA")
        rows.append(
            CalibrationRow(
                direction="fwd" if str(r.op).endswith("fwd") else "bwd",
                family=str(r.family),
                pattern=str(r.pattern),
                tiles=calibration_tiles(
                    str(r.family), int(r.heads_q), int(r.seq_q), int(r.block_size)
                ),
                batch=int(r.batch),
                heads=int(r.heads_q),
                head_dim=int(r.head_dim),
                seq=int(r.seq_q),
                block_size=int(r.block_size),
                dtype=str(r.dtype),
                measured_s=float(r.measured_ms) / 1e3,
            )
        )
    return rows


def predict_rows(
    rows: Sequence[CalibrationRow], gpu: str | GpuSpec, params: TileKernelParams
) -> np.ndarray:
    """Predicted seconds for calibration rows (each its own direction)."""
    spec = _gpu_spec(gpu)
    out = np.zeros(len(rows))
    for direction in ("fwd", "bwd"):
        idx = [i for i, r in enumerate(rows) if r.direction == direction]
        if not idx:
            continue
        ctxs = [
            _Ctx(spec, rows[i].dtype, rows[i].batch, rows[i].head_dim, rows[i].heads, rows[i].heads)
            for i in idx
        ]
        res = _price([rows[i].tiles for i in idx], ctxs, direction, [params] * len(idx))
        out[idx] = [k.time_s for k in res]
    return out


def _nnls_irls(A: np.ndarray, y: np.ndarray, iters: int = 30, delta: float = 0.05) -> np.ndarray:
    """argmin_x>=0 sum huber((A x - y) / y): relative errors, robust to a few noisy rows
    (iteratively reweighted least squares; non-negativity by an active set)."""
    w = 1.0 / y
    x = np.zeros(A.shape[1])
    for _ in range(iters):
        free = np.ones(A.shape[1], bool)
        while True:
            Aw = A[:, free] * w[:, None]
            sol, *_ = np.linalg.lstsq(Aw, y * w, rcond=None)
            if (sol >= 0).all():
                break
            idx = np.flatnonzero(free)[np.argmin(sol)]
            free[idx] = False
        x = np.zeros(A.shape[1])
        x[free] = sol
        r = np.abs(A @ x - y) / y
        w = np.where(r <= delta, 1.0, np.sqrt(delta / np.maximum(r, 1e-12))) / y
    return x


def fit_tile_params(
    rows: Sequence[CalibrationRow],
    gpu: str | GpuSpec,
    *,
    start: TileKernelParams | None = None,
    iterations: int = 5,
    source: str = "",
) -> TileKernelParams:
    """Fit per-block-size efficiencies and mask costs, CTA costs and launch times, per
    direction, on measured rows: the schedule (which CTAs end on the busiest SM) is taken
    from the current parameters, the makespan is then linear in the parameters and solved
    by robust non-negative least squares on relative errors; repeated ``iterations`` times
    (damped), keeping the iterate whose scheduled predictions err least. Block sizes seen
    only forward take the backward efficiency and mask cost of the measured block size
    scaled by the forward ratio."""
    spec = _gpu_spec(gpu)
    p = start if start is not None else _derived_params(spec, "flex")
    out: dict[str, Any] = {}
    for direction in ("fwd", "bwd"):
        sub = [r for r in rows if r.direction == direction]
        if not sub:
            continue
        sizes = sorted({r.block_size for r in sub})
        ctxs = [_Ctx(spec, r.dtype, r.batch, r.head_dim, r.heads, r.heads) for r in sub]
        feats, exps, extras = [], [], []
        for r, c in zip(sub, ctxs, strict=True):
            f, e = _cta_features(r.tiles, c, direction, p.exp_overlap)
            feats.append(f)
            exps.append(e)
            extras.append(_kernel_extras(r.tiles, c, direction, p)[1])
        y = np.array([r.measured_s for r in sub]) - np.array(extras)
        fe = [np.column_stack([f, e]) for f, e in zip(feats, exps, strict=True)]
        slots = spec.sm_count
        x_prev: np.ndarray | None = None
        best: tuple[float, TileKernelParams] | None = None
        for it in range(iterations + 1):
            works = [
                f @ _coefs(p, direction, r.tiles) + e
                for f, e, r in zip(feats, exps, sub, strict=True)
            ]
            makespan, busy = list_schedule(works, slots, fe)
            if it:  # the true (scheduled) error of the current parameters
                launch = p.fwd_launch_s if direction == "fwd" else p.bwd_launch_s
                err = float(np.mean(np.abs((launch + makespan) / y - 1.0)))
                if best is None or err < best[0]:
                    best = (err, p)
            if it == iterations:
                break
            # columns: launch, cta, 1/eff[size]..., mask[size]...
            A = np.zeros((len(sub), 2 + 2 * len(sizes)))
            A[:, 0] = 1.0
            A[:, 1] = busy[:, 0]
            for i, r in enumerate(sub):
                j = sizes.index(r.block_size)
                A[i, 2 + j] = busy[i, 1]
                A[i, 2 + len(sizes) + j] = busy[i, 2]
            x = _nnls_irls(A, np.maximum(y - busy[:, 3], 1e-9))
            if x_prev is not None:  # damped: the busiest slot can flip between near-ties
                x = 0.5 * (x + x_prev)
            x_prev = x
            inv = x[2 : 2 + len(sizes)]
            if (inv <= 0).any():
                raise SparseAttentionError(f"{direction}: tile efficiency not identifiable")
            eff = {s: float(min(1.0, 1.0 / v)) for s, v in zip(sizes, inv, strict=True)}
            mask = {s: float(v) for s, v in zip(sizes, x[2 + len(sizes) :], strict=True)}
            if direction == "fwd":
                p = replace(
                    p,
                    fwd_efficiency=eff,
                    fwd_mask_s=mask,
                    fwd_cta_s=float(x[1]),
                    fwd_launch_s=float(x[0]),
                )
            else:
                p = replace(
                    p,
                    bwd_efficiency=eff,
                    bwd_mask_s=mask,
                    bwd_cta_s=float(x[1]),
                    bwd_launch_s=float(x[0]),
                )
        if best is not None:
            p = best[1]
        out[direction] = sizes
    # block sizes measured forward only: transfer the forward ratios to the backward
    fwd_sizes, bwd_sizes = out.get("fwd", []), out.get("bwd", [])
    if bwd_sizes:
        ref = bwd_sizes[-1]
        beff, bmask = dict(p.bwd_efficiency), dict(p.bwd_mask_s)
        for s in fwd_sizes:
            if s not in beff and ref in p.fwd_efficiency:
                beff[s] = beff[ref] * p.fwd_efficiency[s] / p.fwd_efficiency[ref]
                ratio = p.fwd_mask_s[s] / max(p.fwd_mask_s[ref], 1e-30)
                bmask[s] = bmask[ref] * ratio
        p = replace(p, bwd_efficiency=beff, bwd_mask_s=bmask)
    return replace(p, source=source or f"fitted on {len(rows)} measured rows ({spec.id})")


def mape_by_family(
    rows: Sequence[CalibrationRow], predicted: np.ndarray
) -> dict[str, dict[str, float]]:
    """Mean absolute percentage error per family and direction, plus ``all``."""
    meas = np.array([r.measured_s for r in rows])
    ape = np.abs(np.asarray(predicted) / meas - 1.0) * 100.0
    out: dict[str, dict[str, float]] = {}
    fams = sorted({r.family for r in rows})
    for fam in [*fams, "all"]:
        sel = np.array([fam in ("all", r.family) for r in rows])
        entry = {"rows": int(sel.sum()), "mape": float(ape[sel].mean())}
        for direction in ("fwd", "bwd"):
            s2 = sel & np.array([r.direction == direction for r in rows])
            if s2.any():
                entry[f"{direction}_mape"] = float(ape[s2].mean())
        out[fam] = entry
    return out


def split_rows(
    rows: Sequence[CalibrationRow], held_out: Iterable[str]
) -> tuple[list[CalibrationRow], list[CalibrationRow]]:
    """(fit, held-out) by family name or pattern name (``topk`` holds out every top-k)."""
    held = set(held_out)
    test = [r for r in rows if r.family in held or r.pattern in held]
    fit = [r for r in rows if not (r.family in held or r.pattern in held)]
    return fit, test


__all__ = [
    "BlockSparseTime",
    "CalibrationRow",
    "KernelChoice",
    "KernelTime",
    "NsaTime",
    "SaleTime",
    "SparseAttentionError",
    "TileCounts",
    "TileKernelParams",
    "block_sparse_time",
    "calibration_rows",
    "calibration_tiles",
    "dense_tile_counts",
    "estimate_pass_time",
    "fit_tile_params",
    "head_sharded_time",
    "kernel_params",
    "list_schedule",
    "mape_by_family",
    "nsa_attention_time",
    "nsa_kernel_choice",
    "pattern_time",
    "predict_rows",
    "sale_time",
    "split_rows",
    "tile_counts",
]
