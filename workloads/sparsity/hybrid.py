"""LongGen-style hybrids (some layers causal-dense, the others an inner pattern) and the
discriminated unions of every pattern."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from workloads.sparsity.basic import (
    CausalPattern,
    ChunkPattern,
    DensePattern,
    Pattern,
    WindowPattern,
    spec_number,
)
from workloads.sparsity.errors import check_layers
from workloads.sparsity.grid import EPS, Grid, causal_tile_rules, make_mask, make_table
from workloads.sparsity.nsa import NSAPattern
from workloads.sparsity.s2 import S2Pattern
from workloads.sparsity.tables import TileMask, TileTable
from workloads.sparsity.topk import AdaSpaPattern, SALEPattern, TopKPattern

InnerPattern = Annotated[
    DensePattern
    | CausalPattern
    | WindowPattern
    | ChunkPattern
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
            else f"dense_fraction={spec_number(self.dense_fraction)}"  # type: ignore[arg-type]
        )
        return f"hybrid:{rule},inner={self.inner.spec}"

    def dense_layers(self, num_layers: int) -> list[int]:
        """0-based indices of the dense layers."""
        check_layers(num_layers)
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

    def _tiles(self, g: Grid, heads: int, seed: int) -> TileTable:
        f = self.fraction
        dense = make_table(g, g.F, g.V - g.F, heads, share=f)
        inner = self.inner._tiles(g, heads, seed)
        sparse = replace(inner, share=inner.share * (1.0 - f))
        return replace(inner, branches={"dense": dense, "sparse": sparse})

    def _masks(self, g: Grid, heads: int, seed: int) -> dict[str, TileMask]:
        f = self.fraction
        any_, all_ = causal_tile_rules(g)
        out = {"dense": make_mask(g, all_, any_, heads, share=f)}
        for name, m in self.inner._masks(g, heads, seed).items():
            key = "sparse" if name == "main" else f"sparse.{name}"
            out[key] = replace(m, share=m.share * (1.0 - f))
        return out

    def _kv_cache(self, c: int) -> int:
        f = self.fraction
        return math.ceil(f * c + (1.0 - f) * self.inner._kv_cache(c) - EPS)

    def _decode_read(self, c: int) -> int:
        f = self.fraction
        return math.ceil(f * c + (1.0 - f) * self.inner._decode_read(c) - EPS)

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
    | ChunkPattern
    | TopKPattern
    | S2Pattern
    | NSAPattern
    | SALEPattern
    | AdaSpaPattern
    | HybridPattern,
    Field(discriminator="kind"),
]
