"""Attention sparsity patterns: exact visited-tile counts and decode KV footprints.

A pattern string (the ``--pattern`` of the sparsity what-ifs) parses with
:func:`parse_pattern` into a frozen pydantic :class:`Pattern`. Every pattern answers:

- :meth:`Pattern.tiles` -- a :class:`TileTable`: for each head and query block, how many
  ``block_q x block_k`` tiles a block-sparse kernel visits, split into *full* tiles (every
  element attends) and *partial* tiles (the kernel masks elements inside: the causal
  diagonal, window edges). Counts are exact and computed in closed form over the
  ``[heads, q_blocks]`` grid (searchsorted on tile extents, modular counts), never from an
  ``N x N`` mask, so 1M tokens x 32 heads takes about a millisecond.
  ``density`` = visited / (heads x q_blocks x k_blocks): the fraction of *all* tiles, the
  definition of the ``density`` column in ``simcli predict`` and in the measured
  FlexAttention data (``calibrate/bench/blocksparse.py``).
- :meth:`Pattern.tile_masks` -- the same tiles as boolean ``[heads, q_blocks, k_blocks]``
  tables (with the seeded random selections of top-k / NSA / SALE / AdaSpa drawn), for
  tests and for building real block masks at moderate sizes. Its row sums equal
  :meth:`Pattern.tiles` exactly, for every seed.
- :meth:`Pattern.kv_cache_tokens` / :meth:`Pattern.decode_read_tokens` -- tokens kept per
  KV head, and read per KV head per decode step, at a context of ``context_len`` tokens.
- :meth:`Pattern.layer_patterns` (hybrid models: which layers are dense) and
  :meth:`Pattern.describe`.

Conventions. Self-attention over ``seq_len`` tokens; query block ``i`` covers rows
``[i*block_q, min((i+1)*block_q, seq_len))`` (the last block may be ragged, any length
works). Causal (key ``k <= q``) is implied for every pattern but ``dense``. A tile is
visited when at least one of its elements attends, *full* when all its in-range elements
do (rows/keys past ``seq_len`` are bounds, not mask). Patterns that select whole blocks
(top-k, S2, NSA selection) have their own block size in tokens (``block``, ``lsel``), which
must be a multiple of the kernel's ``block_k`` (and, for top-k style selection shared by a
query block, of ``block_q``): a tile then lies in one selection block.

Patterns (``PATTERN`` strings; ``,`` and ``:`` both separate parameters):

- ``dense`` -- every tile, non-causal. ``causal`` -- the lower triangle.
- ``window:W[:sinks=S]`` -- causal sliding window of ``W`` keys (``q - k < W``, the query's
  own token included) plus ``S`` attention-sink tokens ``k < S`` always attended
  (StreamingLLM, Xiao et al. 2023, "Efficient Streaming Language Models with Attention
  Sinks"). ``W <= seq_len`` is checked at use.
- ``topk:density=D|k=K[,block=B][:per_head]`` -- block-sparse top-k: each query block of
  ``B`` tokens attends ``K`` key blocks of ``B`` tokens among its causal ones, its own
  (diagonal) block always included, so exactly ``min(K, QB + 1)`` blocks for query block
  ``QB``. With ``density=D`` the budget is relative to the causal blocks of that query
  block: ``K = max(1, ceil(D * (QB + 1)))``, so ``density=1`` is ``causal`` (the fraction
  of *all* tiles is then about ``D / 2``: read :attr:`TileTable.density`). The other
  blocks are drawn at random from ``seed``: one selection shared by all heads (what
  FlexAttention calls a head-broadcast block mask; GQA heads then read the same KV
  blocks), or one per head with ``per_head``. Counts do not depend on the draw.
- ``s2:local=L,stride=S[,block=B]`` -- S2-Attention (Lin et al. 2024, "S2-Attention:
  Hardware-Aware Context Sharding Among Attention Heads"): head ``h`` attends the ``L``
  most recent blocks of ``B`` tokens (``k // B > q // B - L``) plus every block
  ``KB`` with ``KB % S == h % S``; with ``heads >= S`` the union of heads covers the context.
- ``nsa[:l=32,d=16,lsel=64,n=16,w=512,local=2]`` -- Native Sparse Attention (Yuan et al.
  2025, "Native Sparse Attention: Hardware-Aligned and Natively Trainable Sparse
  Attention", defaults of its section 4.1): three branches, see :class:`NSAPattern`.
- ``sale:density=D[,est_bits=4,block=B]`` -- SALE (Ji et al. 2025, "SALE: Low-bit
  Estimation for Efficient Sparse Attention in Long-context LLM Prefilling"): an estimation
  pass of ``est_bits``-bit ``Q K^T`` over the causal tiles, then top-k at ``density``.
- ``adaspa:search_every=N,density=D[,spread=0.5,block=B]`` -- AdaSpa (Xia et al. 2025,
  "Training-free and Adaptive Sparse Attention for Efficient Long Video Generation"): one
  step in ``N`` is a dense search step, the others block-sparse with head-adaptive
  densities of mean ``D``. See :class:`AdaSpaPattern`.
- ``hybrid:dense_every=K|dense_fraction=F,inner=PATTERN`` -- LongGen-style hybrid (Ge et
  al. 2024, "A Little Goes a Long Way: Efficient Long Context Training and Inference with
  Partial Contexts": 1/3 full-attention layers, the rest sparse): some layers causal-dense,
  the others ``inner``. ``inner=`` comes last and takes the rest of the string.

Multi-branch patterns list their work in :attr:`TileTable.branches` (see there).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from scipy.special import ndtri


class SparsityError(ValueError):
    """A bad pattern string, parameter or use of a pattern; the message is one line."""


SYNTAX: dict[str, str] = {
    "dense": "dense",
    "causal": "causal",
    "window": "window:W[:sinks=S]",
    "topk": "topk:density=D|k=K[,block=B][:per_head]",
    "s2": "s2:local=L,stride=S[,block=B]",
    "nsa": "nsa[:l=32,d=16,lsel=64,n=16,w=512,local=2]",
    "sale": "sale:density=D[,est_bits=4,block=B]",
    "adaspa": "adaspa:search_every=N,density=D[,spread=S,block=B]",
    "hybrid": "hybrid:dense_every=K|dense_fraction=F,inner=PATTERN",
}
ALLOWED = ", ".join(SYNTAX.values())

_EPS = 1e-9  # ceil(x - eps): 0.3 * 10 must give 3, not 4
_MASK_LIMIT = 1 << 28  # tile_masks refuses tables larger than this many booleans


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, eq=False)
class TileTable:
    """Visited tiles per head and query block: ``full`` and ``partial``, int64
    ``[heads, q_blocks]`` (read-only).

    ``kind`` says what each tile computes: ``"attention"`` (``Q K^T``, softmax, ``P V`` in
    the model dtype) or ``"estimate"`` (``Q K^T`` only, at ``bits`` bits when set: SALE's
    4-bit estimation, AdaSpa's search scores). ``share`` is the fraction of calls on which
    this work runs: diffusion steps (AdaSpa's search step) or layers (hybrid models).

    ``branches`` is empty for single-branch patterns. Otherwise it lists *all* the work, and
    the expected work of one call is ``sum(share x branch work)`` over :meth:`leaves`:

    - NSA: ``compressed`` (queries over the ``seq_kv`` compressed keys), ``selected``,
      ``window``; the top level is their sum (three kernels, same tile shape).
    - SALE: ``estimate`` (kind estimate, ``bits=est_bits``, every causal tile) and
      ``sparse``; the top level is ``sparse``.
    - AdaSpa: ``search_attention`` (dense causal) and ``search_estimate`` (a ``Q K^T`` pass
      reusing the cached LSE), both ``share = 1/search_every``, and ``sparse``
      (``share = 1 - 1/search_every``); the top level is ``sparse`` (a non-search step).
    - hybrid: ``dense`` (causal, ``share`` = dense layer fraction) and ``sparse`` (the inner
      pattern, with its own branches); the top level is ``sparse`` (one sparse layer).
    """

    full: np.ndarray
    partial: np.ndarray
    seq_q: int
    seq_kv: int
    block_q: int
    block_k: int
    kind: Literal["attention", "estimate"] = "attention"
    bits: int | None = None
    share: float = 1.0
    branches: Mapping[str, TileTable] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("full", "partial"):
            arr = np.array(getattr(self, name), dtype=np.int64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        if self.full.shape != self.partial.shape or self.full.ndim != 2:
            raise SparsityError(
                f"full {self.full.shape} and partial {self.partial.shape} must both be "
                "[heads, q_blocks]"
            )

    @property
    def heads(self) -> int:
        return int(self.full.shape[0])

    @property
    def q_blocks(self) -> int:
        return int(self.full.shape[1])

    @property
    def k_blocks(self) -> int:
        return -(-self.seq_kv // self.block_k)

    @property
    def visited(self) -> np.ndarray:
        """Visited tiles per head and query block (``full + partial``)."""
        return self.full + self.partial

    @property
    def num_visited(self) -> int:
        return int(self.full.sum() + self.partial.sum())

    @property
    def num_full(self) -> int:
        return int(self.full.sum())

    @property
    def num_partial(self) -> int:
        return int(self.partial.sum())

    @property
    def density(self) -> float:
        """Visited tiles / (heads x q_blocks x k_blocks): the fraction of all tiles."""
        total = self.heads * self.q_blocks * self.k_blocks
        return self.num_visited / total if total else 0.0

    @property
    def head_density(self) -> np.ndarray:
        """Per-head fraction of all tiles, ``[heads]``."""
        total = self.q_blocks * self.k_blocks
        if not total:
            return np.zeros(self.heads)
        return self.visited.sum(axis=1) / total

    def leaves(self) -> dict[str, TileTable]:
        """The branch tables without branches of their own, named ``a.b`` when nested,
        ``share`` multiplied down; ``{"main": self}`` for a single-branch pattern."""
        if not self.branches:
            return {"main": self}
        out: dict[str, TileTable] = {}
        for name, sub in self.branches.items():
            for sub_name, leaf in sub.leaves().items():
                key = name if sub_name == "main" else f"{name}.{sub_name}"
                out[key] = replace(leaf, share=leaf.share * self.share)
        return out

    def summary(self) -> dict[str, Any]:
        """Scalars for reports (JSON-friendly)."""
        return {
            "seq_q": self.seq_q,
            "seq_kv": self.seq_kv,
            "heads": self.heads,
            "block_q": self.block_q,
            "block_k": self.block_k,
            "q_blocks": self.q_blocks,
            "k_blocks": self.k_blocks,
            "kind": self.kind,
            "bits": self.bits,
            "share": self.share,
            "visited_tiles": self.num_visited,
            "full_tiles": self.num_full,
            "partial_tiles": self.num_partial,
            "density": self.density,
            "branches": {k: v.summary() for k, v in self.branches.items()},
        }


@dataclass(frozen=True, eq=False)
class TileMask:
    """One branch's tiles as booleans ``[heads, q_blocks, k_blocks]``: ``full`` tiles need
    no element mask, ``partial`` ones do; neither = skipped."""

    full: np.ndarray
    partial: np.ndarray
    seq_q: int
    seq_kv: int
    block_q: int
    block_k: int
    kind: Literal["attention", "estimate"] = "attention"
    bits: int | None = None
    share: float = 1.0

    @property
    def visited(self) -> np.ndarray:
        return self.full | self.partial

    def table(self) -> TileTable:
        """Row sums: the :class:`TileTable` of this branch (no branches)."""
        return TileTable(
            full=self.full.sum(axis=-1),
            partial=self.partial.sum(axis=-1),
            seq_q=self.seq_q,
            seq_kv=self.seq_kv,
            block_q=self.block_q,
            block_k=self.block_k,
            kind=self.kind,
            bits=self.bits,
            share=self.share,
        )


# --------------------------------------------------------------------------- geometry


@dataclass(frozen=True)
class _Grid:
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


def _extents(n: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.arange(0, n, b, dtype=np.int64)
    return s, np.minimum(s + b, n) - 1


def _grid(seq: int, bq: int, bk: int) -> _Grid:
    qs, qe = _extents(seq, bq)
    ks, ke = _extents(seq, bk)
    V = np.searchsorted(ks, qe, side="right").astype(np.int64)
    F = np.searchsorted(ke, qs, side="right").astype(np.int64)
    return _Grid(seq, bq, bk, qs, qe, ks, ke, V, F)


def _count_le(sorted_arr: np.ndarray, x: np.ndarray) -> np.ndarray:
    """#{j: sorted_arr[j] <= x} elementwise."""
    return np.searchsorted(sorted_arr, x, side="right").astype(np.int64)


def _mod_count(n: np.ndarray, off: np.ndarray, stride: int) -> np.ndarray:
    """#{b in [0, n): b % stride == off}."""
    return np.maximum(0, (n - off + stride - 1) // stride)


def _table(g: _Grid, full: np.ndarray, partial: np.ndarray, heads: int, **kw: Any) -> TileTable:
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


def _mask(g: _Grid, full: np.ndarray, partial: np.ndarray, heads: int, **kw: Any) -> TileMask:
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


def _causal_tile_rules(g: _Grid) -> tuple[np.ndarray, np.ndarray]:
    """(any, all) [nq, nk] for the causal rule k <= q."""
    return g.ks[None, :] <= g.qe[:, None], g.ke[None, :] <= g.qs[:, None]


def _window_counts(g: _Grid, w: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(full, partial) [nq] for the rule k <= q and (q - k < w or k < s).

    A tile's keys split into a sink part ``[ks, min(ke, s-1)]`` and a window part
    ``[max(ks, s), ke]``; each set of key blocks below is an interval of j, found by
    searchsorted on the sorted tile extents.
    """
    V, F = g.V, g.F
    # visited = sink-any [0, a) union window-any [jb, V): the window part needs
    # ke >= max(s, qs - w + 1) (and ks <= qe, s <= qe; when s > qe, a == V anyway)
    a = np.minimum(_count_le(g.ks, np.full_like(g.qs, s - 1)), V)
    x = np.maximum(s, g.qs - w + 1)
    jb = _count_le(g.ke, x - 1)
    vis = a + np.maximum(0, V - np.maximum(jb, a))
    # full = causally full (j < F) and (ke < s, or max(ks, s) >= qe - w + 1)
    y = g.qe - w + 1
    f0 = np.minimum(_count_le(g.ke, np.full_like(g.qs, s - 1)), F)
    jy = _count_le(g.ks, y - 1)
    full = np.where(s >= y, F, f0 + np.maximum(0, F - np.maximum(jy, f0)))
    return full, vis - full


def _window_tile_rules(g: _Grid, w: int, s: int) -> tuple[np.ndarray, np.ndarray]:
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


def _ceil_blocks(density: np.ndarray, causal_blocks: np.ndarray) -> np.ndarray:
    k = np.ceil(density * causal_blocks - _EPS).astype(np.int64)
    return np.clip(k, 1, causal_blocks)


def _select_ranked(
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


# --------------------------------------------------------------------------- patterns


class Pattern(BaseModel):
    """An attention sparsity pattern; see the module docstring for the syntax."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    source: ClassVar[str] = ""
    branch_names: ClassVar[tuple[str, ...]] = ()

    # ---- public API

    @property
    def causal(self) -> bool:
        return True

    @property
    def spec(self) -> str:
        """The pattern string that parses back to this pattern."""
        raise NotImplementedError

    def tiles(
        self, seq_len: int, heads: int, block_q: int = 128, block_k: int = 128, seed: int = 0
    ) -> TileTable:
        """Exact visited tiles per head and query block (closed form; see :class:`TileTable`).
        ``seed`` only matters where heads differ by a draw (AdaSpa's head densities)."""
        _check_use(seq_len, heads, block_q, block_k, seed)
        self._check_tiles(seq_len, block_q, block_k)
        return self._tiles(_grid(seq_len, block_q, block_k), heads, seed)

    def tile_masks(
        self, seq_len: int, heads: int, block_q: int = 128, block_k: int = 128, seed: int = 0
    ) -> dict[str, TileMask]:
        """Boolean tile tables keyed like ``tiles(...).leaves()``, random selections drawn
        from ``seed``. Memory is heads x q_blocks x k_blocks per branch: for tests and
        moderate sizes, not for 1M tokens."""
        _check_use(seq_len, heads, block_q, block_k, seed)
        self._check_tiles(seq_len, block_q, block_k)
        nq, nk = -(-seq_len // block_q), -(-seq_len // block_k)
        if heads * nq * nk > _MASK_LIMIT:
            raise SparsityError(
                f"tile_masks of {heads} heads x {nq} x {nk} tiles is too large "
                f"(> {_MASK_LIMIT}); allowed: use tiles() for counts at this size"
            )
        return self._masks(_grid(seq_len, block_q, block_k), heads, seed)

    def kv_cache_tokens(self, context_len: int) -> int:
        """Tokens kept per KV head (per layer) at decode with ``context_len`` tokens so far."""
        return self._kv_cache(_check_context(context_len))

    def decode_read_tokens(self, context_len: int) -> int:
        """Tokens read per KV head (per layer) by one decode step at ``context_len``."""
        return self._decode_read(_check_context(context_len))

    def layer_patterns(self, num_layers: int) -> list[Pattern]:
        """The pattern of each layer (every layer the same except for hybrids)."""
        _check_layers(num_layers)
        return [self] * num_layers

    def describe(self) -> dict[str, Any]:
        """JSON-friendly description: kind, spec, parameters, branches, KV behaviour, source."""
        params = self.model_dump(exclude={"kind"})
        return {
            "kind": self.kind,
            "spec": self.spec,
            "causal": self.causal,
            "params": params,
            "branches": list(self.branch_names),
            "kv_cache": self._kv_note(),
            "source": self.source,
        }

    # ---- per pattern

    def _check_tiles(self, seq_len: int, block_q: int, block_k: int) -> None:
        return None

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        raise NotImplementedError

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        raise NotImplementedError

    def _kv_cache(self, c: int) -> int:
        return c

    def _decode_read(self, c: int) -> int:
        return c

    def _kv_note(self) -> str:
        return "keeps and reads the whole context"


class DensePattern(Pattern):
    """Every tile, no causal mask (bidirectional attention)."""

    kind: Literal["dense"] = "dense"
    source: ClassVar[str] = "full bidirectional attention"

    @property
    def causal(self) -> bool:
        return False

    @property
    def spec(self) -> str:
        return "dense"

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        return _table(g, np.full(g.nq, g.nk, dtype=np.int64), np.zeros(g.nq, np.int64), heads)

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        ones = np.ones((g.nq, g.nk), dtype=bool)
        return {"main": _mask(g, ones, ~ones, heads)}


class CausalPattern(Pattern):
    """The lower triangle: query ``q`` attends keys ``k <= q``."""

    kind: Literal["causal"] = "causal"
    source: ClassVar[str] = "causal (decoder) attention"

    @property
    def spec(self) -> str:
        return "causal"

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        return _table(g, g.F, g.V - g.F, heads)

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        any_, all_ = _causal_tile_rules(g)
        return {"main": _mask(g, all_, any_, heads)}


class WindowPattern(Pattern):
    """Causal sliding window of ``window`` keys (``q - k < window``) plus ``sinks``
    attention-sink tokens ``k < sinks`` (StreamingLLM). Decode keeps ``window + sinks``."""

    kind: Literal["window"] = "window"
    window: int = Field(ge=1, description="keys per query, its own token included")
    sinks: int = Field(default=0, ge=0, description="initial tokens always attended")
    source: ClassVar[str] = (
        "sliding window (Beltagy et al. 2020, Longformer; Jiang et al. 2023, Mistral 7B) with "
        "attention sinks (Xiao et al. 2023, StreamingLLM)"
    )

    @property
    def spec(self) -> str:
        return f"window:{self.window}" + (f":sinks={self.sinks}" if self.sinks else "")

    def _check_tiles(self, seq_len: int, block_q: int, block_k: int) -> None:
        if self.window > seq_len:
            raise SparsityError(
                f"window={self.window} is longer than seq_len={seq_len}; allowed: "
                f"window <= seq_len (use 'causal' for full attention)"
            )

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        full, partial = _window_counts(g, self.window, self.sinks)
        return _table(g, full, partial, heads)

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        any_, all_ = _window_tile_rules(g, self.window, self.sinks)
        return {"main": _mask(g, all_, any_, heads)}

    def _kv_cache(self, c: int) -> int:
        return min(c, self.window + self.sinks)

    def _decode_read(self, c: int) -> int:
        return min(c, self.window + self.sinks)

    def _kv_note(self) -> str:
        return "keeps and reads the sinks and the last window tokens"


class _BlockTopK(Pattern):
    """Shared machinery of the top-k style patterns (topk, SALE's and AdaSpa's sparse part).

    A query block of ``block`` tokens (``QB``) attends ``K[h, QB]`` key blocks of ``block``
    tokens: its diagonal block and ``K - 1`` drawn among blocks ``0 .. QB - 1``. A kernel
    query tile lies inside one selection block, so its tiles are ``(K - 1) * m`` full tiles
    (``m = block / block_k``) plus the causal tiles of the diagonal block.
    """

    block: int = Field(default=128, ge=1, description="selection block (tokens)")

    def _check_tiles(self, seq_len: int, block_q: int, block_k: int) -> None:
        if self.block % block_q or self.block % block_k:
            raise SparsityError(
                f"{self.kind} block={self.block} is not a multiple of block_q={block_q} and "
                f"block_k={block_k}; allowed: kernel blocks that divide the selection block"
            )

    def _block_budget(self, qb: np.ndarray, heads: int, seed: int) -> np.ndarray:
        """K per (head or 1, selection query block QB): key blocks visited, in [1, QB+1]."""
        raise NotImplementedError

    def _shared_heads(self) -> bool:
        return False

    def _sparse_counts(self, g: _Grid, heads: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        m = self.block // g.bk
        qb = g.qs // self.block
        k = self._block_budget(qb, heads, seed)  # [1 or heads, nq]
        full = (k - 1) * m + (g.F - qb * m)[None, :]
        return np.broadcast_to(full, (heads, g.nq)), np.broadcast_to(g.V - g.F, (heads, g.nq))

    def _sparse_table(self, g: _Grid, heads: int, seed: int, **kw: Any) -> TileTable:
        full, partial = self._sparse_counts(g, heads, seed)
        return _table(g, full, partial, heads, **kw)

    def _sparse_mask(self, g: _Grid, heads: int, seed: int, **kw: Any) -> TileMask:
        m = self.block // g.bk
        nb = -(-g.seq // self.block)
        qb_all = np.arange(nb)
        k = np.broadcast_to(self._block_budget(qb_all, heads, seed), (heads, nb))
        draw_heads = 1 if self._shared_heads() else heads
        cand = qb_all[None, :] < qb_all[:, None]  # strictly below the diagonal block
        sel = _select_ranked(np.random.default_rng(seed), cand, k[:draw_heads] - 1, draw_heads)
        sel |= np.eye(nb, dtype=bool)[None]
        qb_tile = g.qs // self.block
        kb_tile = np.arange(g.nk) // m
        t = sel[:, qb_tile][:, :, kb_tile]  # [draw_heads, nq, nk]
        any_, all_ = _causal_tile_rules(g)
        t = np.broadcast_to(t & any_[None], (heads, g.nq, g.nk))
        return _mask(g, t & all_[None], t, heads, **kw)

    def _read_blocks(self, c: int, budget_blocks: int) -> int:
        """Tokens read at decode: ``budget_blocks`` blocks, the current (partial) one included."""
        nb = -(-c // self.block)
        k = min(max(budget_blocks, 1), nb)
        return (k - 1) * self.block + (c - (nb - 1) * self.block)


class TopKPattern(_BlockTopK):
    """Block-sparse top-k: ``k`` key blocks per query block, or ``density`` of its causal
    blocks, the diagonal block always included (see the module docstring)."""

    kind: Literal["topk"] = "topk"
    density: float | None = Field(default=None, gt=0, le=1)
    k: int | None = Field(default=None, ge=1, description="key blocks per query block")
    per_head: bool = Field(default=False, description="one draw per head (else shared)")
    source: ClassVar[str] = (
        "block-sparse top-k attention (e.g. MoBA, Lu et al. 2025; SeerAttention, Gao et al. "
        "2024), as measured with FlexAttention block masks in calibrate/bench/blocksparse.py"
    )

    @model_validator(mode="after")
    def _one_budget(self) -> TopKPattern:
        if (self.density is None) == (self.k is None):
            raise ValueError("give exactly one of density=D or k=K")
        return self

    @property
    def spec(self) -> str:
        head = f"density={_num(self.density)}" if self.density is not None else f"k={self.k}"
        tail = f",block={self.block}" if self.block != 128 else ""
        return f"topk:{head}{tail}" + (":per_head" if self.per_head else "")

    def _shared_heads(self) -> bool:
        return not self.per_head

    def _block_budget(self, qb: np.ndarray, heads: int, seed: int) -> np.ndarray:
        if self.k is not None:
            return np.minimum(self.k, qb + 1)[None, :]
        return _ceil_blocks(np.float64(self.density), qb + 1)[None, :]

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        return self._sparse_table(g, heads, seed)

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        return {"main": self._sparse_mask(g, heads, seed)}

    def _decode_read(self, c: int) -> int:
        nb = -(-c // self.block)
        budget = self.k if self.k is not None else math.ceil(self.density * nb - _EPS)
        return self._read_blocks(c, budget)

    def _kv_note(self) -> str:
        return "keeps the whole context (selection is dynamic), reads the selected blocks"


class S2Pattern(Pattern):
    """S2-Attention: per-head local blocks plus a vertical stride with a per-head offset.

    Head ``h`` lets query ``q`` attend key ``k <= q`` when ``k // block > q // block - local``
    (the ``local`` most recent blocks) or ``(k // block) % stride == h % stride``.
    """

    kind: Literal["s2"] = "s2"
    local: int = Field(ge=1, description="most recent blocks every head attends")
    stride: int = Field(ge=1, description="head h also attends blocks == h mod stride")
    block: int = Field(default=128, ge=1, description="sharding block (tokens)")
    source: ClassVar[str] = (
        "Lin et al. 2024, S2-Attention: Hardware-Aware Context Sharding Among Attention Heads"
    )

    @property
    def spec(self) -> str:
        tail = f",block={self.block}" if self.block != 128 else ""
        return f"s2:local={self.local},stride={self.stride}{tail}"

    def _check_tiles(self, seq_len: int, block_q: int, block_k: int) -> None:
        if self.block % block_k:
            raise SparsityError(
                f"s2 block={self.block} is not a multiple of block_k={block_k}; allowed: "
                "a key block that divides the sharding block"
            )

    def _strided(self, x: np.ndarray, off: np.ndarray, m: int) -> np.ndarray:
        """Key tiles j < x whose block is strided for offset ``off``."""
        whole = _mod_count(x // m, off, self.stride) * m
        return whole + (x % m) * ((x // m) % self.stride == off)

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        b, m, L = self.block, self.block // g.bk, self.local
        off = (np.arange(heads) % self.stride)[:, None]
        # local blocks: any element iff KB >= ceil((qs+1)/b) - L; all iff same with qe
        lo = np.maximum(0, (g.qs + b) // b - L) * m
        lf = np.maximum(0, (g.qe + b) // b - L) * m
        vis = (g.V - lo)[None, :] + self._strided(lo[None, :], off, m)
        full = np.maximum(0, g.F - lf)[None, :] + self._strided(
            np.minimum(lf, g.F)[None, :], off, m
        )
        return _table(g, full, vis - full, heads)

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        b, L = self.block, self.local
        kb = (g.ks // b)[None, None, :]
        strided = kb % self.stride == (np.arange(heads) % self.stride)[:, None, None]
        local_any = kb >= ((g.qs + b) // b - L)[None, :, None]
        local_all = kb >= ((g.qe + b) // b - L)[None, :, None]
        c_any, c_all = _causal_tile_rules(g)
        any_ = c_any[None] & (strided | local_any)
        all_ = c_all[None] & (strided | local_all)
        return {"main": _mask(g, all_, any_, heads)}

    def _kv_cache(self, c: int) -> int:
        # future queries need the strided blocks of this head and the `local` newest blocks;
        # offset 0 keeps the most (the others at most one block fewer)
        lo = max(0, (c - 1) // self.block - self.local + 1)
        return c - lo * self.block + self.block * int(_mod_count(np.int64(lo), 0, self.stride))

    def _decode_read(self, c: int) -> int:
        return self._kv_cache(c)

    def _kv_note(self) -> str:
        return "keeps and reads the local blocks and its own strided blocks (offset 0: the most)"


class NSAPattern(Pattern):
    """Native Sparse Attention: three branches, each a causal attention kernel.

    - ``compressed``: keys ``phi(k[i*d : i*d + l])`` for ``i = 0 .. (N - l) // d``, query
      ``t`` attending block ``i`` once it is complete (``i*d + l - 1 <= t``; NSA eq. 7).
      Its table has ``seq_kv`` = the number of compressed tokens; the compression MLP over
      those blocks is not a tile and is left to the cost model.
    - ``selected``: ``n`` blocks of ``lsel`` tokens per query, the initial block and the
      ``local`` most recent ones included (NSA section 3.3.2: n = 16 with 1 initial and 2
      local). Modelled as one selection per kernel query tile (the NSA kernel shares the
      selection across a GQA group; a query tile sharing it does the same work per query):
      forced blocks are block 0 and the ``local`` blocks ending at the tile's last row,
      extended back to the tile's first row; the other blocks are drawn from ``seed``.
      Key tiles larger than ``lsel`` select whole tiles (:meth:`selection_blocks`).
    - ``window``: a causal sliding window of ``w`` keys (no error when ``w > seq_len``).

    Decode keeps the whole KV cache plus the compressed keys, and reads the compressed
    tokens + ``n * lsel`` + ``w`` (NSA Table 4: 5632 tokens at 64k with the defaults).
    """

    kind: Literal["nsa"] = "nsa"
    l: int = Field(default=32, ge=1, description="compression block length")  # noqa: E741
    d: int = Field(default=16, ge=1, description="compression stride")
    lsel: int = Field(default=64, ge=1, description="selection block length l'")
    n: int = Field(default=16, ge=1, description="selected blocks, initial + local included")
    w: int = Field(default=512, ge=1, description="sliding window")
    local: int = Field(default=2, ge=1, description="local blocks always selected")
    source: ClassVar[str] = (
        "Yuan et al. 2025, Native Sparse Attention: Hardware-Aligned and Natively Trainable "
        "Sparse Attention (defaults l=32, d=16, l'=64, n=16, w=512; section 4.1)"
    )
    branch_names: ClassVar[tuple[str, ...]] = ("compressed", "selected", "window")

    @model_validator(mode="after")
    def _check(self) -> NSAPattern:
        if self.d > self.l or self.l % self.d:
            raise ValueError(f"d={self.d} must divide l={self.l} (d <= l, NSA eq. 7)")
        if self.lsel % self.d:
            raise ValueError(f"d={self.d} must divide lsel={self.lsel} (NSA eq. 9)")
        if self.n < self.local + 1:
            raise ValueError(
                f"n={self.n} must be >= local + 1 = {self.local + 1} (initial + local blocks)"
            )
        return self

    @property
    def spec(self) -> str:
        parts = [
            f"{name}={getattr(self, name)}"
            for name, f in type(self).model_fields.items()
            if name != "kind" and getattr(self, name) != f.default
        ]
        return "nsa" + (":" + ",".join(parts) if parts else "")

    def _check_tiles(self, seq_len: int, block_q: int, block_k: int) -> None:
        if self.lsel % block_k and block_k % self.lsel:
            raise SparsityError(
                f"nsa lsel={self.lsel} and block_k={block_k} do not divide each other; "
                "allowed: a key block that divides lsel or is a multiple of it"
            )

    def selection_blocks(self, block_k: int) -> tuple[int, int, int]:
        """(block length, blocks selected, local blocks) as the selected branch's tiles see
        them. A key tile of ``r = block_k / lsel`` selection blocks loads whole tiles, so the
        selection is modelled at tile granularity: ``ceil(n / r)`` tiles of ``block_k`` keys
        (the same keys per query), ``ceil(local / r)`` of them local."""
        self._check_tiles(1, 1, block_k)
        if self.lsel % block_k == 0:
            return self.lsel, self.n, self.local
        r = block_k // self.lsel
        return block_k, -(-self.n // r), -(-self.local // r)

    def num_compressed(self, seq_len: int) -> int:
        """Compressed tokens over ``seq_len`` tokens: ``(N - l) // d + 1`` (0 if N < l)."""
        return (seq_len - self.l) // self.d + 1 if seq_len >= self.l else 0

    def _compressed_grid(self, g: _Grid) -> tuple[int, np.ndarray, np.ndarray]:
        nc = self.num_compressed(g.seq)
        cs, ce = _extents(nc, g.bk)
        return nc, cs, ce

    def _selection(self, g: _Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lo_f, hi, n_sel) per query tile: forced local blocks [lo_f, hi], total selected."""
        lsel, n, local = self.selection_blocks(g.bk)
        hi = g.qe // lsel
        lo_f = np.maximum(0, np.minimum(g.qs // lsel, hi - local + 1))
        forced = hi - lo_f + 1 + (lo_f > 0)
        n_sel = np.minimum(hi + 1, np.maximum(n, forced))
        return lo_f, hi, n_sel

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        nc, cs, ce = self._compressed_grid(g)
        lim_e = (g.qe - self.l + 1) // self.d  # last compressed key a row may attend
        lim_s = (g.qs - self.l + 1) // self.d
        cv, cf = _count_le(cs, lim_e), _count_le(ce, lim_s)
        comp = _table(g, cf, cv - cf, heads, seq_kv=nc)

        m = self.selection_blocks(g.bk)[0] // g.bk
        lo_f, hi, n_sel = self._selection(g)
        outside = n_sel - (hi - lo_f + 1)  # selected blocks below the local ones, all full
        sel = _table(g, outside * m + g.F - lo_f * m, g.V - g.F, heads)

        wf, wp = _window_counts(g, self.w, 0)
        win = _table(g, wf, wp, heads)
        branches = {"compressed": comp, "selected": sel, "window": win}
        return TileTable(
            full=comp.full + sel.full + win.full,
            partial=comp.partial + sel.partial + win.partial,
            seq_q=g.seq,
            seq_kv=g.seq,
            block_q=g.bq,
            block_k=g.bk,
            branches=branches,
        )

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        nc, cs, ce = self._compressed_grid(g)
        t_last = cs[None, :] * self.d + self.l - 1  # first key of the tile becomes visible
        c_any = t_last <= g.qe[:, None]
        c_all = (ce[None, :] * self.d + self.l - 1) <= g.qs[:, None]
        comp = _mask(g, c_all, c_any, heads, nk=len(cs), seq_kv=nc)

        lsel = self.selection_blocks(g.bk)[0]
        m = lsel // g.bk
        nb = -(-g.seq // lsel)
        lo_f, hi, n_sel = self._selection(g)
        blocks = np.arange(nb)[None, :]
        forced = (blocks == 0) | ((blocks >= lo_f[:, None]) & (blocks <= hi[:, None]))
        cand = (blocks >= 1) & (blocks < lo_f[:, None])
        forced_n = hi - lo_f + 1 + (lo_f > 0)
        pick = _select_ranked(np.random.default_rng(seed), cand, n_sel - forced_n, heads)
        chosen = pick | forced[None]
        any_, all_ = _causal_tile_rules(g)
        t = chosen[:, :, np.arange(g.nk) // m] & any_[None]
        sel = _mask(g, t & all_[None], t, heads)

        w_any, w_all = _window_tile_rules(g, self.w, 0)
        win = _mask(g, w_all, w_any, heads)
        return {"compressed": comp, "selected": sel, "window": win}

    def _selected_read(self, c: int) -> int:
        nb = -(-c // self.lsel)
        if self.n >= nb:
            return c
        return (self.n - 1) * self.lsel + (c - (nb - 1) * self.lsel)

    def _kv_cache(self, c: int) -> int:
        return c + self.num_compressed(c)

    def _decode_read(self, c: int) -> int:
        return self.num_compressed(c) + self._selected_read(c) + min(self.w, c)

    def _kv_note(self) -> str:
        return (
            "keeps the whole context plus the compressed keys; reads the compressed keys, "
            "n*lsel selected tokens and the window"
        )


class SALEPattern(_BlockTopK):
    """SALE: an ``est_bits``-bit ``Q K^T`` estimation pass, then block-sparse attention.

    Modelled as an ``estimate`` branch over every causal tile (the paper estimates
    element-wise importance from 4-bit quantised Q, K over the whole causal map; its fused
    kernel costs about 11% of full attention at long contexts) and a ``sparse`` top-k branch
    at ``density`` (relative to the causal blocks, as for ``topk``; one selection shared by
    all heads). SALE's density comes from per-head thresholds on its Relative Attention
    Score and varies by input; here it is the given parameter. SALE is a prefill method:
    decode stays dense.
    """

    kind: Literal["sale"] = "sale"
    density: float = Field(gt=0, le=1)
    est_bits: int = Field(default=4, ge=1, le=16, description="estimation precision")
    source: ClassVar[str] = (
        "Ji et al. 2025, SALE: Low-bit Estimation for Efficient Sparse Attention in "
        "Long-context LLM Prefilling (arXiv 2505.24179)"
    )
    branch_names: ClassVar[tuple[str, ...]] = ("estimate", "sparse")

    @property
    def spec(self) -> str:
        tail = f",est_bits={self.est_bits}" if self.est_bits != 4 else ""
        tail += f",block={self.block}" if self.block != 128 else ""
        return f"sale:density={_num(self.density)}{tail}"

    def _shared_heads(self) -> bool:
        return True

    def _block_budget(self, qb: np.ndarray, heads: int, seed: int) -> np.ndarray:
        return _ceil_blocks(np.float64(self.density), qb + 1)[None, :]

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        est = _table(g, g.F, g.V - g.F, heads, kind="estimate", bits=self.est_bits)
        sparse = self._sparse_table(g, heads, seed)
        return replace(sparse, branches={"estimate": est, "sparse": sparse})

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        any_, all_ = _causal_tile_rules(g)
        est = _mask(g, all_, any_, heads, kind="estimate", bits=self.est_bits)
        return {"estimate": est, "sparse": self._sparse_mask(g, heads, seed)}

    def _kv_note(self) -> str:
        return "prefill method: decode keeps and reads the whole context"


class AdaSpaPattern(_BlockTopK):
    """AdaSpa: dense search steps with cached LSE, head-adaptive block-sparse steps.

    One denoising step in ``search_every`` runs dense (causal here, like every pattern but
    ``dense``) attention, which also yields the LSE, plus a ``Q K^T`` pass that scores the
    blocks with the cached LSE (AdaSpa's Fused LSE-Cached Search); the other steps run
    block-sparse attention with the found indices. Head-adaptive densities: the paper
    finds sparsity varying strongly across heads; here head ``h`` gets a density
    ``min(1, c * exp(spread * z_h))`` (``z_h`` the normal quantiles, permuted by ``seed``;
    ``c`` solved so the mean over heads is ``density``): see :meth:`head_densities`. Each
    head's budget is then ``ceil(density_h * causal blocks)`` as in ``topk``. AdaSpa is a
    diffusion (non-autoregressive) method; decode figures treat it as top-k at ``density``.
    """

    kind: Literal["adaspa"] = "adaspa"
    search_every: int = Field(ge=1, description="one search step in this many steps")
    density: float = Field(gt=0, le=1, description="mean over heads")
    spread: float = Field(default=0.5, ge=0, le=4, description="log-normal sigma over heads")
    source: ClassVar[str] = (
        "Xia et al. 2025, Training-free and Adaptive Sparse Attention for Efficient Long "
        "Video Generation (AdaSpa, arXiv 2502.21079)"
    )
    branch_names: ClassVar[tuple[str, ...]] = ("search_attention", "search_estimate", "sparse")

    @property
    def spec(self) -> str:
        tail = f",spread={_num(self.spread)}" if self.spread != 0.5 else ""
        tail += f",block={self.block}" if self.block != 128 else ""
        return f"adaspa:search_every={self.search_every},density={_num(self.density)}{tail}"

    def head_densities(self, heads: int, seed: int = 0) -> np.ndarray:
        """Per-head densities, ``[heads]`` in (0, 1], mean ``density`` (water-filling)."""
        if self.spread == 0 or heads == 1:
            return np.full(heads, float(self.density))
        z = ndtri((np.arange(heads) + 0.5) / heads)
        raw = np.random.default_rng(seed).permutation(np.exp(self.spread * z))
        desc = np.sort(raw)[::-1]
        target = self.density * heads
        for capped in range(heads + 1):  # the `capped` largest heads sit at density 1
            rest = desc[capped:].sum()
            if capped == heads or rest <= 0:
                return np.ones(heads)
            c = (target - capped) / rest
            if c * desc[capped] <= 1.0 + 1e-12:
                return np.minimum(1.0, c * raw)
        return np.ones(heads)  # pragma: no cover

    def _block_budget(self, qb: np.ndarray, heads: int, seed: int) -> np.ndarray:
        dens = self.head_densities(heads, seed)[:, None]
        return _ceil_blocks(dens, (qb + 1)[None, :])

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        f = 1.0 / self.search_every
        dense = _table(g, g.F, g.V - g.F, heads, share=f)
        est = _table(g, g.F, g.V - g.F, heads, kind="estimate", share=f)
        sparse = self._sparse_table(g, heads, seed, share=1.0 - f)
        top = replace(sparse, share=1.0)
        branches = {"search_attention": dense, "search_estimate": est, "sparse": sparse}
        return replace(top, branches=branches)

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        f = 1.0 / self.search_every
        any_, all_ = _causal_tile_rules(g)
        return {
            "search_attention": _mask(g, all_, any_, heads, share=f),
            "search_estimate": _mask(g, all_, any_, heads, kind="estimate", share=f),
            "sparse": self._sparse_mask(g, heads, seed, share=1.0 - f),
        }

    def _decode_read(self, c: int) -> int:
        nb = -(-c // self.block)
        return self._read_blocks(c, math.ceil(self.density * nb - _EPS))

    def _kv_note(self) -> str:
        return "keeps the whole context, reads about density of it (diffusion: no decode)"


InnerPattern = Annotated[
    DensePattern
    | CausalPattern
    | WindowPattern
    | TopKPattern
    | S2Pattern
    | NSAPattern
    | SALEPattern
    | AdaSpaPattern,
    Field(discriminator="kind"),
]


class HybridPattern(Pattern):
    """LongGen-style hybrid: some layers causal-dense, the others ``inner``.

    ``dense_every=K``: layers ``K-1, 2K-1, ...`` (0-based) are dense. ``dense_fraction=F``:
    ``round(F * num_layers)`` dense layers spread evenly, the last layer among them. Where
    the dense layers sit does not change the cost. LongGen uses 1/3 full layers.
    """

    kind: Literal["hybrid"] = "hybrid"
    inner: InnerPattern
    dense_every: int | None = Field(default=None, ge=1)
    dense_fraction: float | None = Field(default=None, ge=0, le=1)
    source: ClassVar[str] = (
        "Ge et al. 2024, A Little Goes a Long Way: Efficient Long Context Training and "
        "Inference with Partial Contexts (LongGen: 1/3 full-attention layers)"
    )
    branch_names: ClassVar[tuple[str, ...]] = ("dense", "sparse")

    @model_validator(mode="after")
    def _one_rule(self) -> HybridPattern:
        if (self.dense_every is None) == (self.dense_fraction is None):
            raise ValueError("give exactly one of dense_every=K or dense_fraction=F")
        return self

    @property
    def fraction(self) -> float:
        """Dense share of the layers (for a layer count that ``dense_every`` divides)."""
        if self.dense_every is not None:
            return 1.0 / self.dense_every
        return float(self.dense_fraction)  # type: ignore[arg-type]

    @property
    def spec(self) -> str:
        rule = (
            f"dense_every={self.dense_every}"
            if self.dense_every is not None
            else f"dense_fraction={_num(self.dense_fraction)}"  # type: ignore[arg-type]
        )
        return f"hybrid:{rule},inner={self.inner.spec}"

    def dense_layers(self, num_layers: int) -> list[int]:
        """0-based indices of the dense layers."""
        _check_layers(num_layers)
        if self.dense_every is not None:
            k = self.dense_every
            return [i for i in range(num_layers) if (i + 1) % k == 0]
        count = math.floor(self.dense_fraction * num_layers + 0.5)  # type: ignore[operator]
        return [math.floor((j + 1) * num_layers / count) - 1 for j in range(count)]

    def layer_patterns(self, num_layers: int) -> list[Pattern]:
        dense = set(self.dense_layers(num_layers))
        causal = CausalPattern()
        return [causal if i in dense else self.inner for i in range(num_layers)]

    def _check_tiles(self, seq_len: int, block_q: int, block_k: int) -> None:
        self.inner._check_tiles(seq_len, block_q, block_k)

    def _tiles(self, g: _Grid, heads: int, seed: int) -> TileTable:
        f = self.fraction
        dense = _table(g, g.F, g.V - g.F, heads, share=f)
        inner = self.inner._tiles(g, heads, seed)
        sparse = replace(inner, share=inner.share * (1.0 - f))
        return replace(inner, branches={"dense": dense, "sparse": sparse})

    def _masks(self, g: _Grid, heads: int, seed: int) -> dict[str, TileMask]:
        f = self.fraction
        any_, all_ = _causal_tile_rules(g)
        out = {"dense": _mask(g, all_, any_, heads, share=f)}
        for name, m in self.inner._masks(g, heads, seed).items():
            key = "sparse" if name == "main" else f"sparse.{name}"
            out[key] = replace(m, share=m.share * (1.0 - f))
        return out

    def _kv_cache(self, c: int) -> int:
        f = self.fraction
        return math.ceil(f * c + (1.0 - f) * self.inner._kv_cache(c) - _EPS)

    def _decode_read(self, c: int) -> int:
        f = self.fraction
        return math.ceil(f * c + (1.0 - f) * self.inner._decode_read(c) - _EPS)

    def _kv_note(self) -> str:
        return (
            "per layer on average (dense layers keep everything, the others as the inner "
            "pattern); layer_patterns() gives the exact per-layer figures"
        )

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["params"]["inner"] = self.inner.describe()
        return out


AnyPattern = Annotated[
    DensePattern
    | CausalPattern
    | WindowPattern
    | TopKPattern
    | S2Pattern
    | NSAPattern
    | SALEPattern
    | AdaSpaPattern
    | HybridPattern,
    Field(discriminator="kind"),
]

_CLASSES: dict[str, type[Pattern]] = {
    "dense": DensePattern,
    "causal": CausalPattern,
    "window": WindowPattern,
    "topk": TopKPattern,
    "s2": S2Pattern,
    "nsa": NSAPattern,
    "sale": SALEPattern,
    "adaspa": AdaSpaPattern,
    "hybrid": HybridPattern,
}


# --------------------------------------------------------------------------- checks


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def _check_use(seq_len: object, heads: object, block_q: object, block_k: object, seed: object):
    for name, value in (
        ("seq_len", seq_len),
        ("heads", heads),
        ("block_q", block_q),
        ("block_k", block_k),
    ):
        if not _is_int(value) or value < 1:  # type: ignore[operator]
            raise SparsityError(f"{name}={value!r} is invalid; allowed: an integer >= 1")
    if not _is_int(seed) or seed < 0:  # type: ignore[operator]
        raise SparsityError(f"seed={seed!r} is invalid; allowed: an integer >= 0")


def _check_context(context_len: object) -> int:
    if not _is_int(context_len) or context_len < 1:  # type: ignore[operator]
        raise SparsityError(f"context_len={context_len!r} is invalid; allowed: an integer >= 1")
    return int(context_len)  # type: ignore[arg-type]


def _check_layers(num_layers: object) -> None:
    if not _is_int(num_layers) or num_layers < 1:  # type: ignore[operator]
        raise SparsityError(f"num_layers={num_layers!r} is invalid; allowed: an integer >= 1")


# --------------------------------------------------------------------------- parsing


def _num(x: float | None) -> str:
    x = float(x)  # type: ignore[arg-type]
    return str(int(x)) if x.is_integer() else repr(x)


# per kind: parameter -> type ("int", "float", "flag"); window's bare first value is W
_PARAMS: dict[str, dict[str, str]] = {
    "dense": {},
    "causal": {},
    "window": {"window": "int", "w": "int", "sinks": "int"},
    "topk": {"density": "float", "k": "int", "block": "int", "per_head": "flag"},
    "s2": {"local": "int", "stride": "int", "block": "int"},
    "nsa": {"l": "int", "d": "int", "lsel": "int", "n": "int", "w": "int", "local": "int"},
    "sale": {"density": "float", "est_bits": "int", "block": "int"},
    "adaspa": {"search_every": "int", "density": "float", "spread": "float", "block": "int"},
    "hybrid": {"dense_every": "int", "dense_fraction": "float"},
}


def _bad(text: str, kind: str, what: str) -> SparsityError:
    return SparsityError(f"bad sparsity pattern {text!r}: {what}; allowed: {SYNTAX[kind]}")


def _value(text: str, kind: str, name: str, raw: str, typ: str) -> int | float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise _bad(text, kind, f"{name}={raw!r} is not a number")
    if typ == "int":
        if not value.is_integer():
            raise _bad(text, kind, f"{name}={raw!r} is not an integer")
        return int(value)
    return value


def parse_pattern(text: str) -> Pattern:
    """Parse a pattern string (see the module docstring); any problem is one
    :class:`SparsityError` line naming the value and the valid choices."""
    if not isinstance(text, str) or not text.strip():
        raise SparsityError(f"empty sparsity pattern; allowed: {ALLOWED}")
    raw = text.strip()
    kind, sep, rest = raw.partition(":")
    kind = kind.strip().lower()
    if kind not in _CLASSES:
        raise SparsityError(f"unknown sparsity pattern {raw!r}; allowed: {ALLOWED}")
    fields: dict[str, Any] = {}
    inner_text = None
    if kind == "hybrid":
        head, found, inner_text = rest.partition("inner=")
        if not found or not inner_text.strip():
            raise _bad(raw, kind, "inner=PATTERN is missing")
        rest = head.rstrip(",: ")
    tokens = [t.strip() for t in re.split(r"[,:]", rest)] if sep and rest.strip() else []
    spec = _PARAMS[kind]
    for pos, token in enumerate(tokens):
        if not token:
            raise _bad(raw, kind, "empty parameter")
        name, eq, value = (s.strip() for s in token.partition("="))
        if not eq:
            if kind == "window" and pos == 0:
                name, value = "window", token
            elif spec.get(name) == "flag":
                value = "1"
            else:
                allowed = ", ".join(spec) or "no parameters"
                raise _bad(raw, kind, f"{token!r} is not NAME=VALUE ({kind} takes {allowed})")
        name = "window" if (kind == "window" and name == "w") else name
        if name not in spec:
            allowed = ", ".join(spec) or "no parameters"
            raise _bad(raw, kind, f"unknown parameter {name!r} ({kind} takes {allowed})")
        if name in fields:
            raise _bad(raw, kind, f"{name} given twice")
        if spec[name] == "flag":
            if eq and value.lower() not in ("1", "true", "yes"):
                raise _bad(raw, kind, f"{name} is a flag (write :{name})")
            fields[name] = True
        else:
            fields[name] = _value(raw, kind, name, value, spec[name])
    if inner_text is not None:
        try:
            fields["inner"] = parse_pattern(inner_text)
        except SparsityError as exc:
            raise SparsityError(f"bad inner pattern of {raw!r}: {exc}") from None
        if isinstance(fields["inner"], HybridPattern):
            raise _bad(raw, kind, "inner cannot be another hybrid")
    try:
        return _CLASSES[kind](**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        what = f"{where}={err['input']!r}: {msg}" if where else msg
        raise _bad(raw, kind, what) from None


__all__ = [
    "ALLOWED",
    "AdaSpaPattern",
    "AnyPattern",
    "CausalPattern",
    "DensePattern",
    "HybridPattern",
    "NSAPattern",
    "Pattern",
    "S2Pattern",
    "SALEPattern",
    "SparsityError",
    "TileMask",
    "TileTable",
    "TopKPattern",
    "WindowPattern",
    "parse_pattern",
]
