"""Model FLOPs of single ops: the matmul work an op asks for, not what a kernel spends.

Conventions match :meth:`workloads.models.ModelConfig.flops_per_token`, so summing
:func:`total_flops` over :func:`workloads.decompose.layer_forward_ops` for every layer plus
the LM head gives ``flops_per_token(training=False) * tokens``:

* GEMM: ``2 m n k`` per product (one multiply and one add per MAC), times ``batch``.
* Attention forward: ``Q K^T`` and ``P V``, ``4 * batch * heads_q * seq_q * seq_kv *
  head_dim``, halved when causal (the lower triangle; the FlashAttention papers' count).
  Backward: 2x forward (``dV``, ``dP``, ``dQ``, ``dK``: four matmuls against two), so
  forward + backward is the 3x of ``6N``-style model FLOPs; ``attn_fwdbwd``: 3x.
  FlashAttention's benchmarks count 2.5x / 3.5x because the kernel also recomputes
  ``Q K^T`` in the backward: those are hardware FLOPs, a cost model's business.
  Block-sparse kinds: times ``density``.
* Everything else (elementwise, collectives, copies, the optimizer): 0 model FLOPs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from workloads.ops import Op, OpKind

if TYPE_CHECKING:
    from workloads.decompose.templates import LayerOp

ATTENTION_PASS_FACTOR: dict[OpKind, float] = {
    OpKind.attn_fwd: 1.0,
    OpKind.attn_bwd: 2.0,
    OpKind.attn_fwdbwd: 3.0,
    OpKind.attn_decode: 1.0,
    OpKind.attn_blocksparse_fwd: 1.0,
    OpKind.attn_blocksparse_bwd: 2.0,
}


def op_flops(op: Op) -> float:
    """Matmul FLOPs of one op (0 for kinds without matmuls)."""
    if op.op == OpKind.gemm:
        assert op.m is not None and op.n is not None and op.k is not None
        return 2.0 * op.m * op.n * op.k * (op.batch or 1)
    if op.op in ATTENTION_PASS_FACTOR:
        assert op.batch and op.seq_kv and op.heads_q and op.head_dim
        seq_q = op.seq_q or 1
        fwd = 4.0 * op.batch * op.heads_q * seq_q * op.seq_kv * op.head_dim
        if op.causal:
            fwd *= 0.5
        if op.density is not None:
            fwd *= op.density
        return fwd * ATTENTION_PASS_FACTOR[op.op]
    return 0.0


def total_flops(layer_ops: Iterable[LayerOp]) -> float:
    """``sum(count * op_flops(op))`` over named ops."""
    return sum(lo.count * op_flops(lo.op) for lo in layer_ops)
