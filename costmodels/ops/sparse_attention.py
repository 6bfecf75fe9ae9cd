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
by ``python -m calibrate.sparse.attention`` on the measured FlexAttention rows with whole
pattern families held out. Tile tables live in :mod:`costmodels.ops.sparse_tiles`, the
parameters, CTA work and SM schedule in :mod:`costmodels.ops.sparse_kernel`; their public
names are re-exported here.

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

:class:`SparseAttentionModel` is the cost-model face of all this: ``predict(call)`` and
``predict_many(calls)`` in seconds for :class:`SparseAttentionCall` inputs.

Pure numpy at run time (``workloads.sparsity`` is used when given its tables or
patterns, never required).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from costmodels.ops.sparse_kernel import (
    ELEMENT_BYTES,
    EXACT_WAVES,
    TAIL_WAVES,
    KernelContext,
    KernelTime,
    TileKernelParams,
    gpu_spec,
    kernel_params,
    list_schedule,
    price_launches,
)
from costmodels.ops.sparse_tiles import (
    SparseAttentionError,
    TileCounts,
    dense_tile_counts,
    tile_counts,
)
from hardware_specs.schema import GpuSpec

# --------------------------------------------------------------------------- one call


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


def _context(
    tc: TileCounts,
    gpu: str | GpuSpec,
    batch: int,
    head_dim: int,
    dtype: str,
    heads_q: int | None,
    heads_kv: int | None,
) -> tuple[TileCounts, KernelContext]:
    spec = gpu_spec(gpu)
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
    return tc.expand_heads(hq), KernelContext(spec, dtype, int(batch), int(head_dim), hq, hkv)


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
    fwd = price_launches([tc], [ctx], "fwd", [p])[0]
    bwd = price_launches([tc], [ctx], "bwd", [p])[0]
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


def nsa_work(
    *,
    seq_len: int,
    heads_q: int,
    heads_kv: int,
    block: int = 64,
    selected: int = 16,
    batch: int = 1,
    head_dim: int = 128,
) -> dict[str, float]:
    """Work counts of NSA's selected branch: ``pairs_kv`` (token, KV head, selected block)
    steps, ``pairs_q = G x pairs_kv``, ``rows_q`` (token, query head) outputs, ``mma_m``
    the NSA kernel's padded MMA rows."""
    if heads_q % heads_kv:
        raise SparseAttentionError(f"heads_kv={heads_kv} must divide heads_q={heads_q}")
    g = heads_q // heads_kv
    pairs_kv = batch * heads_kv * _selected_pairs(seq_len, block, selected)
    return {
        "group": g,
        "pairs_kv": pairs_kv,
        "pairs_q": pairs_kv * g,
        "rows_q": float(batch * seq_len * heads_q),
        "mma_m": max(16, 1 << (g - 1).bit_length()),
        "block": block,
        "head_dim": head_dim,
    }


@lru_cache(maxsize=1)
def _nsa_fsa_fits() -> dict[str, Any]:
    path = Path(str(resources.files("costmodels") / "data" / "nsa_fsa.yaml"))
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def nsa_fsa_fit(gpu: str | GpuSpec) -> tuple[dict[str, Any], str] | None:
    """The measured NSA/FSA fit for ``gpu`` (its own, else one of its architecture, as
    :func:`kernel_params`), and its provenance; None where there is none."""
    spec = gpu_spec(gpu)
    fits = _nsa_fsa_fits()
    if spec.id in fits:
        return fits[spec.id], fits[spec.id].get("source", spec.id)
    from hardware_specs.registry import builtin_catalog

    cat = builtin_catalog()
    for gid, entry in fits.items():
        if gid in cat.gpus and cat.gpus[gid].architecture == spec.architecture:
            return entry, f"transferred from {gid} (same architecture): {entry.get('source', '')}"
    return None


NSA_FIT_TERMS = ("launch_s", "step_s")
FSA_FIT_TERMS = ("launch_s", "index_s", "pair_s", "row_s")


def nsa_fsa_features(w: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """The fitted model's features (``calibrate.sparse.nsa_fit``): NSA ``[1, pairs_kv x e]``
    (a program per (token, KV head) reloads each selected block; flat in G up to 16, as
    measured), FSA ``[1, pairs_kv, pairs_q x e, rows_q x d / 128]`` (index sort, main kernel
    and fp32 partials per (query head, selection), reduction per output row); ``e =
    block x head_dim / (64 x 128)`` scales the element work from the fitted shape."""
    e = w["block"] * w["head_dim"] / (64.0 * 128.0)
    f_nsa = np.array([1.0, w["pairs_kv"] * e])
    f_fsa = np.array([1.0, w["pairs_kv"], w["pairs_q"] * e, w["rows_q"] * w["head_dim"] / 128])
    return f_nsa, f_fsa


def _fitted_times(w: Mapping[str, float], fit: Mapping[str, Any]) -> tuple[float, float]:
    """(NSA, FSA) seconds from the fitted coefficients."""
    f_nsa, f_fsa = nsa_fsa_features(w)
    c_nsa = np.array([fit["nsa"][k] for k in NSA_FIT_TERMS])
    c_fsa = np.array([fit["fsa"][k] for k in FSA_FIT_TERMS])
    return float(f_nsa @ c_nsa), float(f_fsa @ c_fsa)


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
    fitted: bool = True,
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

    Measured (``fitted``, where :func:`nsa_fsa_fit` has a fit for the GPU or its
    architecture): both times come from the linear fit of the Triton kernels' timings in
    the same work counts (:func:`nsa_work`; ``calibrate.sparse.nsa_fit``), the analytical
    parts above stay as ``details``.
    """
    spec = gpu_spec(gpu)
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
    fit = nsa_fsa_fit(spec) if fitted else None
    work = nsa_work(
        seq_len=seq_len,
        heads_q=heads_q,
        heads_kv=heads_kv,
        block=bk,
        selected=selected,
        batch=batch,
        head_dim=d,
    )
    if fit is not None:
        nsa_s, fsa_s = _fitted_times(work, fit[0])
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
        "source": fit[1] if fit is not None else "analytical (NSA_FSA constants, not fitted)",
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
    spec = gpu_spec(gpu)
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


# --------------------------------------------------------------------------- cost model

DIRECTIONS = ("fwd", "bwd", "fwdbwd")


@dataclass(frozen=True)
class SparseAttentionCall:
    """One block-sparse attention call to price: a tile table and the shape it runs at.

    ``table``: what :func:`block_sparse_time` takes (a ``TileTable`` branch, a
    ``TileMask`` or a :class:`TileCounts`); ``direction``: ``fwd``, ``bwd`` or ``fwdbwd``;
    ``masks``: the branch's ``TileMask`` for an exact backward transpose."""

    table: Any
    direction: str = "fwd"
    batch: int = 1
    head_dim: int = 128
    dtype: str = "bf16"
    heads_q: int | None = None
    heads_kv: int | None = None
    masks: Any = None


class SparseAttentionModel:
    """Tile-table block-sparse attention as a cost model: one GPU, one kernel family.

    ``predict(call) -> seconds`` is :func:`block_sparse_time`'s time in the call's
    direction; ``predict_many(calls)`` prices the launches of every call, per direction,
    in one :func:`price_launches` pass (launches are scheduled independently, so the
    numbers are the same). The parameters are loaded (:func:`kernel_params`), never
    fitted here: ``python -m calibrate.sparse.attention`` refits them."""

    def __init__(
        self,
        gpu: str | GpuSpec = "h100-sxm",
        backend: str = "flex",
        params: TileKernelParams | None = None,
    ) -> None:
        self.gpu = gpu_spec(gpu)
        self.backend = backend
        self.params = params if params is not None else kernel_params(self.gpu, backend)

    @property
    def label(self) -> str:
        return self.params.source

    def _prepare(self, call: SparseAttentionCall) -> tuple[TileCounts, KernelContext]:
        if call.direction not in DIRECTIONS:
            raise SparseAttentionError(
                f"direction {call.direction!r} is not supported; allowed: {', '.join(DIRECTIONS)}"
            )
        tc = tile_counts(call.table, call.masks)
        return _context(
            tc, self.gpu, call.batch, call.head_dim, call.dtype, call.heads_q, call.heads_kv
        )

    def predict(self, call: SparseAttentionCall) -> float:
        """Seconds of one call."""
        self._prepare(call)
        res = block_sparse_time(
            call.table,
            gpu=self.gpu,
            batch=call.batch,
            head_dim=call.head_dim,
            dtype=call.dtype,
            heads_q=call.heads_q,
            heads_kv=call.heads_kv,
            masks=call.masks,
            params=self.params,
        )
        return {"fwd": res.fwd_s, "bwd": res.bwd_s, "fwdbwd": res.fwdbwd_s}[call.direction]

    def predict_many(self, calls: Sequence[SparseAttentionCall]) -> np.ndarray:
        """Seconds per call, in order."""
        prepared = [self._prepare(c) for c in calls]
        out = np.zeros(len(prepared))
        for direction in ("fwd", "bwd"):
            idx = [i for i, c in enumerate(calls) if c.direction in (direction, "fwdbwd")]
            if not idx:
                continue
            tcs = [prepared[i][0] for i in idx]
            ctxs = [prepared[i][1] for i in idx]
            times = price_launches(tcs, ctxs, direction, [self.params] * len(idx))
            out[idx] += [k.time_s for k in times]
        return out


__all__ = [
    "DIRECTIONS",
    "EXACT_WAVES",
    "TAIL_WAVES",
    "BlockSparseTime",
    "KernelChoice",
    "KernelTime",
    "NsaTime",
    "SaleTime",
    "SparseAttentionCall",
    "SparseAttentionError",
    "SparseAttentionModel",
    "TileCounts",
    "TileKernelParams",
    "block_sparse_time",
    "dense_tile_counts",
    "estimate_pass_time",
    "head_sharded_time",
    "kernel_params",
    "list_schedule",
    "nsa_attention_time",
    "nsa_kernel_choice",
    "pattern_time",
    "sale_time",
    "tile_counts",
]
