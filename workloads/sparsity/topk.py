"""Top-k style block selection: ``topk``, SALE (estimation pass, then top-k) and AdaSpa
(dense search steps, head-adaptive top-k), on one shared block-selection machinery."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from workloads.sparsity.basic import Pattern, spec_number
from workloads.sparsity.errors import SparsityError
from workloads.sparsity.grid import (
    EPS,
    Grid,
    causal_tile_rules,
    ceil_blocks,
    make_mask,
    make_table,
    select_ranked,
)
from workloads.sparsity.tables import TileMask, TileTable


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

    def _sparse_counts(self, g: Grid, heads: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        m = self.block // g.bk
        qb = g.qs // self.block
        k = self._block_budget(qb, heads, seed)  # [1 or heads, nq]
        full = (k - 1) * m + (g.F - qb * m)[None, :]
        return np.broadcast_to(full, (heads, g.nq)), np.broadcast_to(g.V - g.F, (heads, g.nq))

    def _sparse_table(self, g: Grid, heads: int, seed: int, **kw: Any) -> TileTable:
        full, partial = self._sparse_counts(g, heads, seed)
        return make_table(g, full, partial, heads, **kw)

    def _sparse_mask(self, g: Grid, heads: int, seed: int, **kw: Any) -> TileMask:
        m = self.block // g.bk
        nb = -(-g.seq // self.block)
        qb_all = np.arange(nb)
        k = np.broadcast_to(self._block_budget(qb_all, heads, seed), (heads, nb))
        draw_heads = 1 if self._shared_heads() else heads
        cand = qb_all[None, :] < qb_all[:, None]  # strictly below the diagonal block
        sel = select_ranked(np.random.default_rng(seed), cand, k[:draw_heads] - 1, draw_heads)
        sel |= np.eye(nb, dtype=bool)[None]
        qb_tile = g.qs // self.block
        kb_tile = np.arange(g.nk) // m
        t = sel[:, qb_tile][:, :, kb_tile]  # [draw_heads, nq, nk]
        any_, all_ = causal_tile_rules(g)
        t = np.broadcast_to(t & any_[None], (heads, g.nq, g.nk))
        return make_mask(g, t & all_[None], t, heads, **kw)

    def _read_blocks(self, c: int, budget_blocks: int) -> int:
        """Tokens read at decode: ``budget_blocks`` blocks, the current (partial) one included."""
        nb = -(-c // self.block)
        k = min(max(budget_blocks, 1), nb)
        return (k - 1) * self.block + (c - (nb - 1) * self.block)


class TopKPattern(_BlockTopK):
    """Block-sparse top-k: ``k`` key blocks per query block, or ``density`` of its causal
    blocks, the diagonal block always included (see :mod:`workloads.sparsity`)."""

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
        head = f"density={spec_number(self.density)}" if self.density is not None else f"k={self.k}"
        tail = f",block={self.block}" if self.block != 128 else ""
        return f"topk:{head}{tail}" + (":per_head" if self.per_head else "")

    def _shared_heads(self) -> bool:
        return not self.per_head

    def _block_budget(self, qb: np.ndarray, heads: int, seed: int) -> np.ndarray:
        if self.k is not None:
            return np.minimum(self.k, qb + 1)[None, :]
        return ceil_blocks(np.float64(self.density), qb + 1)[None, :]

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        return self._sparse_table(g, heads, seed)

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        return {"main": self._sparse_mask(g, heads, seed)}

    def _decode_read(self, c: int) -> int:
        nb = -(-c // self.block)
        budget = self.k if self.k is not None else math.ceil(self.density * nb - EPS)
        return self._read_blocks(c, budget)

    def _kv_note(self) -> str:
        return "keeps the whole context (selection is dynamic), reads the selected blocks"


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
        return f"sale:density={spec_number(self.density)}{tail}"

    def _shared_heads(self) -> bool:
        return True

    def _block_budget(self, qb: np.ndarray, heads: int, seed: int) -> np.ndarray:
        return ceil_blocks(np.float64(self.density), qb + 1)[None, :]

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        est = make_table(g, g.F, g.V - g.F, heads, kind="estimate", bits=self.est_bits)
        sparse = self._sparse_table(g, heads, seed)
        return replace(sparse, branches={"estimate": est, "sparse": sparse})

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        any_, all_ = causal_tile_rules(g)
        est = make_mask(g, all_, any_, heads, kind="estimate", bits=self.est_bits)
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
        tail = f",spread={spec_number(self.spread)}" if self.spread != 0.5 else ""
        tail += f",block={self.block}" if self.block != 128 else ""
        return f"adaspa:search_every={self.search_every},density={spec_number(self.density)}{tail}"

    def head_densities(self, heads: int, seed: int = 0) -> np.ndarray:
        """Per-head densities, ``[heads]`` in (0, 1], mean ``density`` (water-filling)."""
        if self.spread == 0 or heads == 1:
            return np.full(heads, float(self.density))
        from scipy.special import ndtri  # scipy loads where used (CLI start-up)

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
        return ceil_blocks(dens, (qb + 1)[None, :])

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        f = 1.0 / self.search_every
        dense = make_table(g, g.F, g.V - g.F, heads, share=f)
        est = make_table(g, g.F, g.V - g.F, heads, kind="estimate", share=f)
        sparse = self._sparse_table(g, heads, seed, share=1.0 - f)
        top = replace(sparse, share=1.0)
        branches = {"search_attention": dense, "search_estimate": est, "sparse": sparse}
        return replace(top, branches=branches)

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        f = 1.0 / self.search_every
        any_, all_ = causal_tile_rules(g)
        return {
            "search_attention": make_mask(g, all_, any_, heads, share=f),
            "search_estimate": make_mask(g, all_, any_, heads, kind="estimate", share=f),
            "sparse": self._sparse_mask(g, heads, seed, share=1.0 - f),
        }

    def _decode_read(self, c: int) -> int:
        nb = -(-c // self.block)
        return self._read_blocks(c, math.ceil(self.density * nb - EPS))

    def _kv_note(self) -> str:
        return "keeps the whole context, reads about density of it (diffusion: no decode)"
