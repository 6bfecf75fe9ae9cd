"""The :class:`Pattern` base class and the patterns without block selection: dense,
causal and sliding window with attention sinks."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from workloads.sparsity.errors import SparsityError, check_context, check_layers, check_use
from workloads.sparsity.grid import (
    Grid,
    causal_tile_rules,
    chunk_counts,
    chunk_tile_rules,
    make_grid,
    make_mask,
    make_table,
    window_counts,
    window_tile_rules,
)
from workloads.sparsity.tables import TileMask, TileTable

_MASK_LIMIT = 1 << 28  # tile_masks refuses tables larger than this many booleans


def spec_number(x: float | None) -> str:
    """A parameter as written in a pattern string: ``2`` for 2.0, else its repr."""
    x = float(x)  # type: ignore[arg-type]
    return str(int(x)) if x.is_integer() else repr(x)


class Pattern(BaseModel):
    """An attention sparsity pattern; see :mod:`workloads.sparsity` for the syntax."""

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
        check_use(seq_len, heads, block_q, block_k, seed)
        self._check_tiles(seq_len, block_q, block_k)
        return self._tiles(make_grid(seq_len, block_q, block_k), heads, seed)

    def tile_masks(
        self, seq_len: int, heads: int, block_q: int = 128, block_k: int = 128, seed: int = 0
    ) -> dict[str, TileMask]:
        """Boolean tile tables keyed like ``tiles(...).leaves()``, random selections drawn
        from ``seed``. Memory is heads x q_blocks x k_blocks per branch: for tests and
        moderate sizes, not for 1M tokens."""
        check_use(seq_len, heads, block_q, block_k, seed)
        self._check_tiles(seq_len, block_q, block_k)
        nq, nk = -(-seq_len // block_q), -(-seq_len // block_k)
        if heads * nq * nk > _MASK_LIMIT:
            raise SparsityError(
                f"tile_masks of {heads} heads x {nq} x {nk} tiles is too large "
                f"(> {_MASK_LIMIT}); allowed: use tiles() for counts at this size"
            )
        return self._masks(make_grid(seq_len, block_q, block_k), heads, seed)

    def kv_cache_tokens(self, context_len: int) -> int:
        """Tokens kept per KV head (per layer) at decode with ``context_len`` tokens so far."""
        return self._kv_cache(check_context(context_len))

    def decode_read_tokens(self, context_len: int) -> int:
        """Tokens read per KV head (per layer) by one decode step at ``context_len``."""
        return self._decode_read(check_context(context_len))

    def layer_patterns(self, num_layers: int) -> list[Pattern]:
        """The pattern of each layer (every layer the same except for hybrids)."""
        check_layers(num_layers)
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

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        raise NotImplementedError

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
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

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        return make_table(g, np.full(g.nq, g.nk, dtype=np.int64), np.zeros(g.nq, np.int64), heads)

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        ones = np.ones((g.nq, g.nk), dtype=bool)
        return {"main": make_mask(g, ones, ~ones, heads)}


class CausalPattern(Pattern):
    """The lower triangle: query ``q`` attends keys ``k <= q``."""

    kind: Literal["causal"] = "causal"
    source: ClassVar[str] = "causal (decoder) attention"

    @property
    def spec(self) -> str:
        return "causal"

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        return make_table(g, g.F, g.V - g.F, heads)

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        any_, all_ = causal_tile_rules(g)
        return {"main": make_mask(g, all_, any_, heads)}


class ChunkPattern(Pattern):
    """Chunked local attention: the sequence is cut into chunks of ``chunk`` tokens and a
    query attends causally within its own chunk (``k <= q`` and ``k // chunk == q //
    chunk``), as Llama 4's local layers do (HF ``attention_chunk_size``, 8192). Decode
    keeps and reads the current chunk's tokens: ``(c - 1) % chunk + 1`` at context ``c``,
    at most ``chunk``."""

    kind: Literal["chunk"] = "chunk"
    chunk: int = Field(ge=1, description="tokens per chunk")
    source: ClassVar[str] = (
        "chunked local attention (Meta 2025, Llama 4; HF Llama4TextAttention "
        "attention_chunk_size; vLLM's chunked local attention)"
    )

    @property
    def spec(self) -> str:
        return f"chunk:{self.chunk}"

    def _check_tiles(self, seq_len: int, block_q: int, block_k: int) -> None:
        if self.chunk % block_q or self.chunk % block_k:
            raise SparsityError(
                f"chunk={self.chunk} is not a multiple of the tile sizes {block_q} x "
                f"{block_k}; allowed: a chunk that whole tiles fill (e.g. 8192)"
            )

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        full, partial = chunk_counts(g, self.chunk)
        return make_table(g, full, partial, heads)

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        any_, all_ = chunk_tile_rules(g, self.chunk)
        return {"main": make_mask(g, all_, any_, heads)}

    def _kv_cache(self, c: int) -> int:
        return (c - 1) % self.chunk + 1

    def _decode_read(self, c: int) -> int:
        return (c - 1) % self.chunk + 1

    def _kv_note(self) -> str:
        return "keeps and reads the current chunk's tokens (at most one chunk)"


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

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        full, partial = window_counts(g, self.window, self.sinks)
        return make_table(g, full, partial, heads)

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        any_, all_ = window_tile_rules(g, self.window, self.sinks)
        return {"main": make_mask(g, all_, any_, heads)}

    def _kv_cache(self, c: int) -> int:
        return min(c, self.window + self.sinks)

    def _decode_read(self, c: int) -> int:
        return min(c, self.window + self.sinks)

    def _kv_note(self) -> str:
        return "keeps and reads the sinks and the last window tokens"
