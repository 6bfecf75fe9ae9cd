"""Tile tables of block-sparse attention: which tiles one kernel call visits, per head.

A :class:`TileCounts` holds, per head, the full and partial tiles of each query block
(the forward CTAs' work) and of each key block (the backward dK/dV CTAs' work, the
table's transpose). :func:`tile_counts` builds one from a ``workloads.sparsity``
``TileTable`` or ``TileMask``; :func:`dense_tile_counts` from a dense or causal shape.
Priced by :mod:`costmodels.ops.sparse_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np


class SparseAttentionError(ValueError):
    """A bad input to the sparse attention models; the message is one line."""


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


__all__ = ["SparseAttentionError", "TileCounts", "dense_tile_counts", "tile_counts"]
