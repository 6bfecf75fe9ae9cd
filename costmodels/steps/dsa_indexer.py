"""DeepSeek-V3.2's lightning indexer (DSA, arXiv 2512.02556) in a serving step: the
scoring of every cached key, which the per-token indexer projections
(:func:`workloads.decompose.mla.mla_templates`) do not cover.

Each query token t scores every key s <= t of its sequence:
``I(t, s) = sum_j w(t, j) relu(q(t, j) . k(s))`` over ``n`` indexer heads of width ``d``
(2 n d FLOPs per pair; DeepGEMM's ``fp8_mqa_logits`` runs it in fp8 with the relu and
the weighted sum over heads in its epilogue, priced here as an fp8 GEMM of the same
FLOPs, ``[tokens, n d] x [n d, keys]``, on the GPU's op model; bf16 on GPUs without fp8),
writes the fp32 logits and selects the top ``index_topk`` keys (the logits written and
read once: 8 bytes per pair). A prefill chunk of ``n`` new tokens over ``p`` cached pays
``n (p + (n + 1) / 2)`` pairs; a decode step reads each sequence's cached indexer keys
(``indexer_cache_bytes`` per key: fp8 and its scale) and scores them (memory-bound).
Both are priced once per step model from the op model at a reference size and scaled
linearly (per pair, per cached key), per layer. Not measured on a GPU: no DeepGEMM or
FlashMLA sparse kernel installs on the lent machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.decompose.mla import indexer_cache_bytes
from workloads.models import ModelConfig
from workloads.ops import Dtype, Op, OpKind, ops_frame

REF_QUERIES, REF_KEYS = 2048, 16384  # the reference GEMM of the per-pair price
LOGIT_BYTES_PER_PAIR = 8.0  # fp32 logits written by the scoring, read by the top-k


@dataclass(frozen=True)
class IndexerCost:
    """Seconds per layer: per (query, key) pair scored, per cached key a decode reads."""

    pair_s: float
    key_read_s: float

    def prefill_s(self, new: np.ndarray, past: np.ndarray) -> float:
        """Scoring of prefill chunks of ``new`` tokens over ``past`` cached ones."""
        n, p = np.asarray(new, dtype=float), np.asarray(past, dtype=float)
        return self.pair_s * float((n * (p + (n + 1.0) / 2.0)).sum())

    def decode_s(self, n_decode: int, ctx_sum: int) -> float:
        """A decode step's scoring of ``ctx_sum`` cached keys over ``n_decode`` sequences
        (their own new key included)."""
        return self.key_read_s * float(ctx_sum + n_decode)


def indexer_cost(model: ModelConfig, cost_model: Any, fp8: bool = True) -> IndexerCost | None:
    """The indexer's scoring prices on ``cost_model`` (None without DSA); ``fp8``: the GPU
    has fp8 tensor cores (the scoring GEMM runs in fp8, else in bf16)."""
    n, d = model.index_n_heads, model.index_head_dim
    if not n or not d:
        return None
    pairs = REF_QUERIES * REF_KEYS
    logits_bytes = int(LOGIT_BYTES_PER_PAIR / 2 * pairs)  # a copy of b bytes moves 2b
    key_bytes = indexer_cache_bytes(model)
    ops = [
        # the heads' products summed in the kernel (relu and weights in its epilogue): the
        # FLOPs of a [queries, n d] x [n d, keys] GEMM with one [queries, keys] output
        Op(op=OpKind.gemm, dtype=Dtype.fp8 if fp8 else Dtype.bf16, m=REF_QUERIES, k=n * d,
           n=REF_KEYS),
        Op(op=OpKind.copy, dtype=Dtype.bf16, bytes=logits_bytes),
        Op(op=OpKind.copy, dtype=Dtype.bf16, bytes=max(1, key_bytes * REF_KEYS * 64 // 2)),
    ]
    t = np.asarray(cost_model.predict_many(ops_frame(ops)), dtype=float)
    return IndexerCost(pair_s=float(t[0] + t[1]) / pairs, key_read_s=float(t[2]) / (REF_KEYS * 64))


__all__ = ["IndexerCost", "indexer_cost"]
