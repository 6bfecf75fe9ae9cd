"""Tile geometry and the closed-form counting rules the patterns share.

A :class:`Grid` holds the tile extents of a ``seq x seq`` attention map cut into
``bq x bk`` tiles and the causal counts per query block; the rules below count (or mark,
tile by tile) the tiles a rule visits, never building an element mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.sparsity.tables import TileMask, TileTable

EPS = 1e-9  # ceil(x - eps): 0.3 * 10 must give 3, not 4


@dataclass(frozen=True)
class Grid:
    """Tile extents (inclusive) and the causal counts per query block."""

    seq: int
    bq: int
    bk: int
    qs: np.ndarray  # first row of each query block [nq]
    qe: np.ndarray  # last row
    ks: np.ndarray  # first key of each key block [nk]
    ke: np.ndarray
    V: np.ndarray  # causally visited key blocks per query block: #{j: ks_j <= qe_i}
    F: np.ndarray  # causally full key blocks: #{j: ke_j <= qs_i}

    @property
    def nq(self) -> int:
        return len(self.qs)

    @property
    def nk(self) -> int:
        return len(self.ks)


def extents(n: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.arange(0, n, b, dtype=np.int64)
    return s, np.minimum(s + b, n) - 1


def make_grid(seq: int, bq: int, bk: int) -> Grid:
    qs, qe = extents(seq, bq)
    ks, ke = extents(seq, bk)
    V = np.searchsorted(ks, qe, side="right").astype(np.int64)
    F = np.searchsorted(ke, qs, side="right").astype(np.int64)
    return Grid(seq, bq, bk, qs, qe, ks, ke, V, F)


def count_le(sorted_arr: np.ndarray, x: np.ndarray) -> np.ndarray:
    """#{j: sorted_arr[j] <= x} elementwise."""
    return np.searchsorted(sorted_arr, x, side="right").astype(np.int64)


def mod_count(n: np.ndarray, off: np.ndarray, stride: int) -> np.ndarray:
    """#{b in [0, n): b % stride == off}."""
    return np.maximum(0, (n - off + stride - 1) // stride)


def make_table(g: Grid, full: np.ndarray, partial: np.ndarray, heads: int, **kw: Any) -> TileTable:
    shape = (heads, g.nq)
    return TileTable(
        full=np.broadcast_to(full, shape),
        partial=np.broadcast_to(partial, shape),
        seq_q=g.seq,
        seq_kv=kw.pop("seq_kv", g.seq),
        block_q=g.bq,
        block_k=g.bk,
        **kw,
    )


def make_mask(g: Grid, full: np.ndarray, partial: np.ndarray, heads: int, **kw: Any) -> TileMask:
    nk = kw.pop("nk", g.nk)
    shape = (heads, g.nq, nk)
    return TileMask(
        full=np.broadcast_to(full, shape).copy(),
        partial=np.broadcast_to(partial & ~full, shape).copy(),
        seq_q=g.seq,
        seq_kv=kw.pop("seq_kv", g.seq),
        block_q=g.bq,
        block_k=g.bk,
        **kw,
    )


def causal_tile_rules(g: Grid) -> tuple[np.ndarray, np.ndarray]:
    """(any, all) [nq, nk] for the causal rule k <= q."""
    return g.ks[None, :] <= g.qe[:, None], g.ke[None, :] <= g.qs[:, None]


def window_counts(g: Grid, w: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(full, partial) [nq] for the rule k <= q and (q - k < w or k < s).

    A tile's keys split into a sink part ``[ks, min(ke, s-1)]`` and a window part
    ``[max(ks, s), ke]``; each set of key blocks below is an interval of j, found by
    searchsorted on the sorted tile extents.
    """
    V, F = g.V, g.F
    # visited = sink-any [0, a) union window-any [jb, V): the window part needs
    # ke >= max(s, qs - w + 1) (and ks <= qe, s <= qe; when s > qe, a == V anyway)
    a = np.minimum(count_le(g.ks, np.full_like(g.qs, s - 1)), V)
    x = np.maximum(s, g.qs - w + 1)
    jb = count_le(g.ke, x - 1)
    vis = a + np.maximum(0, V - np.maximum(jb, a))
    # full = causally full (j < F) and (ke < s, or max(ks, s) >= qe - w + 1)
    y = g.qe - w + 1
    f0 = np.minimum(count_le(g.ke, np.full_like(g.qs, s - 1)), F)
    jy = count_le(g.ks, y - 1)
    full = np.where(s >= y, F, f0 + np.maximum(0, F - np.maximum(jy, f0)))
    return full, vis - full


def chunk_counts(g: Grid, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(full, partial) [nq] for the rule k <= q and k // c == q // c (chunked local
    attention), on a grid whose tiles do not straddle chunks (``c`` a multiple of both
    block sizes): the key blocks of a query block's chunk up to the causal limit."""
    start = g.qs // c * c  # first key of the query block's chunk
    before = count_le(g.ks, start - 1)  # key blocks of earlier chunks
    return g.F - before, g.V - g.F


def chunk_tile_rules(g: Grid, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(any, all) [nq, nk] for the chunked rule, tile by tile."""
    any_, all_ = causal_tile_rules(g)
    same = (g.ks[None, :] // c) == (g.qs[:, None] // c)
    return any_ & same, all_ & same


def window_tile_rules(g: Grid, w: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(any, all) [nq, nk] for the window-with-sinks rule, tile by tile."""
    qs, qe = g.qs[:, None], g.qe[:, None]
    ks, ke = g.ks[None, :], g.ke[None, :]
    sink = ks < s
    sink_any = sink & (ks <= qe)
    sink_all = qs >= np.minimum(ke, s - 1)
    win = ke >= s
    a = np.maximum(ks, s)
    win_any = win & (a <= qe) & (ke >= qs - w + 1)
    win_all = (qs >= ke) & (qe - a <= w - 1)
    any_ = sink_any | win_any
    all_ = (~sink | sink_all) & (~win | win_all) & any_
    return any_, all_


def ceil_blocks(density: np.ndarray, causal_blocks: np.ndarray) -> np.ndarray:
    k = np.ceil(density * causal_blocks - EPS).astype(np.int64)
    return np.clip(k, 1, causal_blocks)


def select_ranked(
    rng: np.random.Generator, cand: np.ndarray, count: np.ndarray, heads: int
) -> np.ndarray:
    """Random ``count[..., r]`` of the candidates ``cand[r, :]`` per row, for each head:
    bool ``[heads, rows, cols]``. ``count <= cand.sum(-1)`` is required."""
    scores = rng.random((heads, *cand.shape))
    scores = np.where(cand[None], scores, -1.0)
    order = np.argsort(-scores, axis=-1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(cand.shape[-1])[None, None, :], axis=-1)
    return rank < np.broadcast_to(count, (heads, cand.shape[0]))[..., None]
