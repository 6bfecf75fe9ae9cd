"""S2-Attention: per-head local blocks plus a vertical stride with a per-head offset."""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from workloads.sparsity.basic import Pattern
from workloads.sparsity.errors import SparsityError
from workloads.sparsity.grid import Grid, causal_tile_rules, make_mask, make_table, mod_count
from workloads.sparsity.tables import TileMask, TileTable


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
        whole = mod_count(x // m, off, self.stride) * m
        return whole + (x % m) * ((x // m) % self.stride == off)

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        b, m, L = self.block, self.block // g.bk, self.local
        off = (np.arange(heads) % self.stride)[:, None]
        # local blocks: any element iff KB >= ceil((qs+1)/b) - L; all iff same with qe
        lo = np.maximum(0, (g.qs + b) // b - L) * m
        lf = np.maximum(0, (g.qe + b) // b - L) * m
        vis = (g.V - lo)[None, :] + self._strided(lo[None, :], off, m)
        full = np.maximum(0, g.F - lf)[None, :] + self._strided(
            np.minimum(lf, g.F)[None, :], off, m
        )
        return make_table(g, full, vis - full, heads)

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        b, L = self.block, self.local
        kb = (g.ks // b)[None, None, :]
        strided = kb % self.stride == (np.arange(heads) % self.stride)[:, None, None]
        local_any = kb >= ((g.qs + b) // b - L)[None, :, None]
        local_all = kb >= ((g.qe + b) // b - L)[None, :, None]
        c_any, c_all = causal_tile_rules(g)
        any_ = c_any[None] & (strided | local_any)
        all_ = c_all[None] & (strided | local_all)
        return {"main": make_mask(g, all_, any_, heads)}

    def _kv_cache(self, c: int) -> int:
        # future queries need the strided blocks of this head and the `local` newest blocks;
        # offset 0 keeps the most (the others at most one block fewer)
        lo = max(0, (c - 1) // self.block - self.local + 1)
        return c - lo * self.block + self.block * int(mod_count(np.int64(lo), 0, self.stride))

    def _decode_read(self, c: int) -> int:
        return self._kv_cache(c)

    def _kv_note(self) -> str:
        return "keeps and reads the local blocks and its own strided blocks (offset 0: the most)"
