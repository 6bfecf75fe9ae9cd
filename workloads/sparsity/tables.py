"""What a pattern answers: visited tiles per head and query block, as counts
(:class:`TileTable`) or as boolean tables (:class:`TileMask`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from workloads.sparsity.errors import SparsityError


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
