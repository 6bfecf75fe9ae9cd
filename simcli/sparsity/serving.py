"""A serving step model whose attention follows a sparse pattern (``simcli serve
--attn-pattern``).

The dense :class:`~costmodels.steps.serving.StepModel` prices each iteration's attention from
its grids; this subclass scales the prefill part by the pattern's forward time over
dense causal attention at the chunk's length, and the decode part by the pattern's
decode time over dense decode at the batch's mean context (a window or NSA reads fewer
keys). Ratios are capped at 1: an engine runs dense attention where the pattern's kernel
would be slower (NSA below ~16k tokens in this model). Both ratios come from
:class:`~simcli.sparsity.whatif.SparsityPricer` on a log-spaced length grid, interpolated
in log length, so a step stays microseconds.

KV capacity is unchanged: the block manager still holds every token of every sequence
(true for NSA, which keeps the cache, and conservative for windows and S2, which could
drop old blocks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodels.steps.serving import StepModel
from simcli.sparsity.whatif import SparsityPricer
from workloads.sparsity import Pattern, WindowPattern, parse_pattern

GRID_POINTS = 12
MIN_LEN = 256


class PatternStepModel(StepModel):
    """:class:`StepModel` with ``pattern``'s attention in every layer (see the module)."""

    def __init__(self, *args: Any, pattern: str | Pattern, max_len: int = 131072, **kw: Any):
        super().__init__(*args, **kw)
        self.pattern = pattern if isinstance(pattern, Pattern) else parse_pattern(pattern)
        gpu = args[1] if len(args) > 1 else kw["gpu_id"]
        # dense attention priced by this step model's own (resolved) cost model
        pricer = SparsityPricer(gpu, seed=0, cost_models=lambda _n: self.cost_model)
        lens = np.unique(
            np.geomspace(MIN_LEN, max(max_len, MIN_LEN * 2), GRID_POINTS).astype(int) // 128 * 128
        )
        pre, dec = [], []
        for n in lens.tolist():
            if isinstance(self.pattern, WindowPattern) and self.pattern.window >= n:
                pre.append(1.0)  # the window covers the whole chunk
            else:
                a = pricer.attention(self.pattern, self.model, n, tp=self.tp, batch=1)
                dense = pricer.attention(parse_pattern("causal"), self.model, n, tp=self.tp)
                pre.append(a.fwd_s / dense.fwd_s if dense.fwd_s > 0 else 1.0)
            d = pricer.decode(self.pattern, self.model, n, tp=self.tp)["decode_attn_s"]
            d0 = pricer.decode(parse_pattern("causal"), self.model, n, tp=self.tp)
            dec.append(d / d0["decode_attn_s"] if d0["decode_attn_s"] > 0 else 1.0)
        self._log_lens = np.log(lens.astype(float))
        self._pre_ratio = np.minimum(np.array(pre), 1.0)
        self._dec_ratio = np.minimum(np.array(dec), 1.0)

    def _ratio(self, table: np.ndarray, length: float) -> float:
        return float(np.interp(np.log(max(length, 1.0)), self._log_lens, table))

    def _attention(
        self, pn: np.ndarray, pp: np.ndarray, dc: np.ndarray, exact: bool
    ) -> tuple[float | None, float | None, bool]:
        pre, dec, in_grid = super()._attention(pn, pp, dc, exact)
        if pre is not None:
            pre *= self._ratio(self._pre_ratio, float((pn + pp).max()))
        if dec is not None:
            dec *= self._ratio(self._dec_ratio, float(dc.mean()) + 1.0)
        return pre, dec, in_grid
