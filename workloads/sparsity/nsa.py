"""Native Sparse Attention: compressed, selected and sliding-window branches."""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from workloads.sparsity.basic import Pattern
from workloads.sparsity.errors import SparsityError
from workloads.sparsity.grid import (
    Grid,
    causal_tile_rules,
    count_le,
    extents,
    make_mask,
    make_table,
    select_ranked,
    window_counts,
    window_tile_rules,
)
from workloads.sparsity.tables import TileMask, TileTable


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

    def _compressed_grid(self, g: Grid) -> tuple[int, np.ndarray, np.ndarray]:
        nc = self.num_compressed(g.seq)
        cs, ce = extents(nc, g.bk)
        return nc, cs, ce

    def _selection(self, g: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lo_f, hi, n_sel) per query tile: forced local blocks [lo_f, hi], total selected."""
        lsel, n, local = self.selection_blocks(g.bk)
        hi = g.qe // lsel
        lo_f = np.maximum(0, np.minimum(g.qs // lsel, hi - local + 1))
        forced = hi - lo_f + 1 + (lo_f > 0)
        n_sel = np.minimum(hi + 1, np.maximum(n, forced))
        return lo_f, hi, n_sel

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        nc, cs, ce = self._compressed_grid(g)
        lim_e = (g.qe - self.l + 1) // self.d  # last compressed key a row may attend
        lim_s = (g.qs - self.l + 1) // self.d
        cv, cf = count_le(cs, lim_e), count_le(ce, lim_s)
        comp = make_table(g, cf, cv - cf, heads, seq_kv=nc)

        m = self.selection_blocks(g.bk)[0] // g.bk
        lo_f, hi, n_sel = self._selection(g)
        outside = n_sel - (hi - lo_f + 1)  # selected blocks below the local ones, all full
        sel = make_table(g, outside * m + g.F - lo_f * m, g.V - g.F, heads)

        wf, wp = window_counts(g, self.w, 0)
        win = make_table(g, wf, wp, heads)
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

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        nc, cs, ce = self._compressed_grid(g)
        t_last = cs[None, :] * self.d + self.l - 1  # first key of the tile becomes visible
        c_any = t_last <= g.qe[:, None]
        c_all = (ce[None, :] * self.d + self.l - 1) <= g.qs[:, None]
        comp = make_mask(g, c_all, c_any, heads, nk=len(cs), seq_kv=nc)

        lsel = self.selection_blocks(g.bk)[0]
        m = lsel // g.bk
        nb = -(-g.seq // lsel)
        lo_f, hi, n_sel = self._selection(g)
        blocks = np.arange(nb)[None, :]
        forced = (blocks == 0) | ((blocks >= lo_f[:, None]) & (blocks <= hi[:, None]))
        cand = (blocks >= 1) & (blocks < lo_f[:, None])
        forced_n = hi - lo_f + 1 + (lo_f > 0)
        pick = select_ranked(np.random.default_rng(seed), cand, n_sel - forced_n, heads)
        chosen = pick | forced[None]
        any_, all_ = causal_tile_rules(g)
        t = chosen[:, :, np.arange(g.nk) // m] & any_[None]
        sel = make_mask(g, t & all_[None], t, heads)

        w_any, w_all = window_tile_rules(g, self.w, 0)
        win = make_mask(g, w_all, w_any, heads)
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
