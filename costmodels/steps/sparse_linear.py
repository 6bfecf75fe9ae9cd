"""2:4 weight sparsity in a training step: which of a layer's GEMMs run sparse, the
per-step sparsification they need, and the eager engines' per-call cost.

**What is assumed.** The forward GEMM ``Y = X W^T`` runs on sparse tensor cores with the
pruned weight, the input-gradient GEMM ``dX = dY W`` with its transpose, and the
weight-gradient GEMM ``dW = dY^T X`` dense (both operands are activations). Using ``W^T``
as the sparse operand of dgrad needs it 2:4 along *its* reduction dimension, i.e. a
*transposable* mask, 2:4 along rows and columns (Hubara et al., NeurIPS 2021, "Accelerated
Sparse Neural Training: A Provable and Efficient Method to Find N:M Transposable Masks").
NVIDIA's ASP recipe (Mishra et al. 2021, "Accelerating Sparse Deep Neural Networks") prunes
along rows only, which accelerates the forward GEMM alone; the transposable variant is what
torch runs for 2:4 training: ``torch._sparse_semi_structured_tile`` (xFormers' sparsify24,
used by torch.sparse's ``_Sparsify24Func`` and torchao's semi-sparse training) picks, per
4x4 tile, a mask that is 2:4 in both directions and returns the compressed weight *and* its
compressed transpose. That kernel runs on every forward (the weights change each step): a
pass reading the dense weight and writing both compressed copies, priced here as one
memory-bound ``copy`` per sparse GEMM (``sparsify24_*``).

**Engines.** ``megatron`` prices the cuSPARSELt kernels alone (plan-caching calls, as the
ops' models do: PyTorch from PR 179642 on); ``pytorch`` and ``pytorch-compile`` call torch
2.11's ``_cslt_sparse_mm``, which rebuilds its plan on every call: each 2:4 GEMM costs at
least the calibrated ``call_floor_s`` (:func:`costmodels.ops.sparse_gemm.sparse_gemm_work`,
``eager=True``).

Memory is not changed: the dense weights, gradients and optimizer states stay (the mask is
reapplied to dense master weights); the compressed copies a layer keeps from its forward to
its backward (about 1.1x its bf16 linear weights) are not counted.
"""

from __future__ import annotations

import numpy as np

from costmodels.ops.sparse_gemm import sparse_params, stored_bytes_per_weight
from hardware_specs.schema import DTYPE_BYTES, Dtype, GpuSpec
from workloads.decompose import LayerOp
from workloads.decompose.sparsity import SPARSE_WEIGHT_GEMMS, linear_sparsity
from workloads.ops import Op, OpKind

EAGER_FRAMEWORKS = ("pytorch", "pytorch-compile")
TRAIN_SPARSE_DTYPES = ("bf16", "fp16")


def sparsify_training_groups(
    groups: list[list[LayerOp]], weight_sparsity: str, gpu: GpuSpec
) -> list[list[LayerOp]]:
    """:func:`workloads.decompose.op_groups`' six groups with the layer's forward and
    dgrad GEMMs of :data:`~workloads.decompose.sparsity.SPARSE_WEIGHT_GEMMS` marked 2:4 and
    a ``sparsify24_*`` pass per sparse forward GEMM (see the module docstring); one
    ``ValueError`` line for a kind, GPU or precision with no training kernel."""
    w = linear_sparsity(weight_sparsity, gpu=gpu, training=True).weight
    fwd, bwd, *rest = groups
    out_f: list[LayerOp] = []
    for lo in fwd:
        if lo.op.op != OpKind.gemm or lo.name not in SPARSE_WEIGHT_GEMMS:
            out_f.append(lo)
            continue
        dtype = Dtype(lo.op.dtype).value
        if dtype not in TRAIN_SPARSE_DTYPES:
            raise ValueError(
                f"--weight-sparsity {w} with {dtype} GEMMs: no sparse training kernel is "
                "modelled for them; allowed: --precision bf16-mixed, fp16-mixed or bf16"
            )
        out_f.append(LayerOp(lo.name, lo.op.model_copy(update={"sparsity": w}), lo.count))
        out_f.append(_sparsify_pass(lo, w, dtype))
    sparse_dgrad = {f"{n}_dgrad" for n in SPARSE_WEIGHT_GEMMS}
    out_b = [
        LayerOp(lo.name, lo.op.model_copy(update={"sparsity": w}), lo.count)
        if lo.name in sparse_dgrad and lo.op.op == OpKind.gemm
        else lo
        for lo in bwd
    ]
    return [out_f, out_b, *rest]


def _sparsify_pass(lo: LayerOp, sparsity: str, dtype: str) -> LayerOp:
    """Reads the dense weight [n, k], writes its compressed copy and compressed transpose
    (values and metadata); a ``copy`` of b bytes moves 2b."""
    elt = DTYPE_BYTES[Dtype(dtype)]
    weights = float(lo.op.n) * float(lo.op.k) * (lo.op.batch or 1)
    moved = weights * (elt + 2.0 * stored_bytes_per_weight(sparsity, elt))
    op = Op(op=OpKind.copy, dtype=dtype, bytes=max(1, int(moved / 2.0)))
    return LayerOp(f"sparsify24_{lo.name}", op, lo.count)


def eager_call_floor(
    times_s: np.ndarray, ops: list[Op], framework: str, gpu: GpuSpec
) -> np.ndarray:
    """``times_s`` with every 2:4 GEMM of an eager torch engine at least the calibrated
    per-call floor of torch 2.11's ``_cslt_sparse_mm`` (no change for ``megatron``)."""
    if framework not in EAGER_FRAMEWORKS:
        return times_s
    mask = np.array([o.op == OpKind.gemm and o.sparsity == "2:4" for o in ops], dtype=bool)
    if not mask.any():
        return times_s
    floor = sparse_params(gpu.architecture).semi_structured.call_floor_s
    out = np.asarray(times_s, dtype=float).copy()
    out[mask] = np.maximum(out[mask], floor)
    return out


__all__ = ["EAGER_FRAMEWORKS", "eager_call_floor", "sparsify_training_groups"]
