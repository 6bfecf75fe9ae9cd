"""Sparsity what-ifs: what an attention pattern does to a layer, a prefill, a decode step
and a training iteration (see :mod:`simcli.sparsity.whatif`)."""

from simcli.sparsity.whatif import (
    COLUMNS,
    AttentionTimes,
    SparsityPricer,
    compare,
    gqa_model,
    sparse_step_costs,
    sparse_step_model_ms,
    split_patterns,
    sweep,
)

__all__ = [
    "COLUMNS",
    "AttentionTimes",
    "SparsityPricer",
    "compare",
    "gqa_model",
    "sparse_step_costs",
    "sparse_step_model_ms",
    "split_patterns",
    "sweep",
]
