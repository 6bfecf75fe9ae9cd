"""Ops whose sizes are functions of one scale variable: the unit of the decomposition.

An :class:`OpTemplate` is one kernel (or torch call) with its shape given as a vectorised
function of ``x``: tokens for the token-wise ops of a layer, sequences for the per-sequence
ops of a serving step (LM head, sampler). Training evaluates a template at one micro-
batch's token count (:meth:`OpTemplate.layer_op`); a serving step model evaluates the same
templates on grids of token counts at once (:meth:`OpTemplate.fields_at`). The
attention of a layer is a placeholder (``op == ""``): its shape depends on more than the
token count, and each phase builds it itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from workloads.models import ModelError
from workloads.ops import Op, OpKind

Launch = Literal["gemm", "ew", "coll"]
Region = Literal["enter", "exit"]


@dataclass(frozen=True)
class LayerOp:
    """A named op and how many identical instances of it run (e.g. one per expert).

    ``count`` is a whole number except in the mean layer of a model mixing dense and MoE
    layers, where an MLP op runs in a share of the layers (e.g. 1/27 of a dense MLP)."""

    name: str
    op: Op
    count: int | float = 1

    def __post_init__(self) -> None:
        if not self.count > 0:
            raise ModelError(f"LayerOp {self.name!r}: count must be > 0, got {self.count}")


@dataclass(frozen=True)
class OpTemplate:
    """One op of a step as a function of the scale variable ``x`` (see the module doc).

    ``label``: the breakdown group of a serving step. ``launch``: which fitted per-call
    launch cost the op's microbenchmark time carries. ``per_layer``: runs once per layer
    (else once per step). ``count``: identical instances; ``mult(x)``: instances that
    vary with ``x`` (the active experts of an MoE layer). ``decode_only``: runs only when
    a sequence decodes. ``traffic_bytes``: a memory-bound kernel moving this many bytes
    per unit of ``x``, priced as a ``copy`` (a copy of b bytes moves 2b); ``strided``: it
    runs on PyTorch's non-vectorised path, whose bytes the step model scales by the
    calibrated strided-kernel slowdown. ``region``: a tensor-parallel region boundary
    (Megatron's f/g operators), expanded into collectives per phase. ``regather``: a
    column-parallel GEMM whose sequence-sharded input is gathered again for its weight
    gradient under sequence parallelism. ``weight_bits``: a weight-only quantised GEMM
    (W8A16/W4A16, :mod:`workloads.decompose.quant`) whose ``B`` operand is stored in that
    many bits; the op itself keeps the activation dtype it computes in. ``sparsity``: a
    GEMM whose weight (or MLP activation) is sparse (:mod:`workloads.decompose.sparsity`;
    the ops' ``sparsity`` column spelling).
    """

    name: str
    label: str = ""
    op: str = ""
    fields: Callable[[np.ndarray], dict[str, Any]] | None = None
    launch: Launch = "ew"
    per_layer: bool = True
    count: int = 1
    mult: Callable[[np.ndarray], np.ndarray] | None = None
    decode_only: bool = False
    traffic_bytes: float | None = None
    strided: bool = False
    region: Region | None = None
    regather: bool = False
    weight_bits: int | None = None
    sparsity: str | None = None

    @property
    def is_attention(self) -> bool:
        return not self.op and self.region is None

    def fields_at(self, x: np.ndarray, strided_scale: float = 1.0) -> dict[str, Any]:
        """The op's size fields at every ``x`` (arrays, or scalars that do not vary)."""
        if self.traffic_bytes is not None:
            scale = strided_scale if self.strided else 1.0
            nbytes = np.ceil(self.traffic_bytes * scale * x / 2.0)
            return {"bytes": np.maximum(1, nbytes).astype(np.int64)}
        assert self.fields is not None, f"{self.name}: a placeholder has no fields"
        return self.fields(x)

    @property
    def share(self) -> float:
        """Instances per layer of an op whose ``mult`` is constant (a hybrid's attention
        placeholder: the attention layers' share); 1 without ``mult``."""
        return float(self.mult(np.ones(1))[0]) if self.mult is not None else 1.0

    def instances_at(self, x: np.ndarray) -> np.ndarray:
        """Instances per step-layer at every ``x`` (``mult``, or 1)."""
        return self.mult(x) if self.mult is not None else np.ones(len(x))

    def layer_op(self, x: int, dtype: str, repeat: int = 1) -> LayerOp:
        """The op at one value of ``x``: a concrete :class:`LayerOp`, its count times the
        instances (``repeat``: e.g. the layers of a whole-model forward)."""
        xs = np.array([x], dtype=np.int64)
        row: dict[str, Any] = {"op": OpKind(self.op), "dtype": dtype}
        for key, value in self.fields_at(xs).items():
            if value is None:
                continue
            if key == "dtype":
                row[key] = value
            else:
                row[key] = int(np.asarray(value).reshape(-1)[0])
        if self.traffic_bytes is not None:
            row["dtype"] = dtype
        if self.sparsity:
            row["sparsity"] = self.sparsity
        total = self.count * float(self.instances_at(xs)[0]) * repeat
        count: int | float = int(round(total)) if abs(total - round(total)) < 1e-9 else total
        return LayerOp(self.name, Op(**row), count)


# --- constructors ---------------------------------------------------------------------------


def gemm(name: str, k: int, n: int, dtype: str, label: str = "", **kw: Any) -> OpTemplate:
    """C[x, n] = A[x, k] . B[k, n]."""

    def fields(x: np.ndarray) -> dict[str, Any]:
        return {"m": x, "k": k, "n": n, "dtype": dtype}

    return OpTemplate(name, label or name, "gemm", fields, "gemm", **kw)


def elementwise(
    name: str, kind: str, n: int, dtype: str, rows: float = 1.0, label: str = "", **kw: Any
) -> OpTemplate:
    """An elementwise op over ``ceil(rows * x)`` rows of ``n`` elements."""

    def fields(x: np.ndarray) -> dict[str, Any]:
        return {"m": np.maximum(1, np.ceil(rows * x)).astype(np.int64), "n": n, "dtype": dtype}

    return OpTemplate(name, label or name, kind, fields, "ew", **kw)


def sharded_elementwise(name: str, kind: str, n: int, dtype: str, shards: int) -> OpTemplate:
    """An elementwise op over ``x // shards`` rows (norms under sequence parallelism)."""

    def fields(x: np.ndarray) -> dict[str, Any]:
        return {"m": x // shards, "n": n, "dtype": dtype}

    return OpTemplate(name, name, kind, fields, "ew")


def traffic(
    name: str, bytes_per_unit: float, label: str = "", strided: bool = False, **kw: Any
) -> OpTemplate:
    """A memory-bound kernel moving ``bytes_per_unit`` bytes (reads + writes) per unit."""
    return OpTemplate(
        name, label or name, "copy", None, "ew", traffic_bytes=bytes_per_unit, strided=strided,
        **kw,
    )  # fmt: skip


def copy_traffic(name: str, traffic_bytes: float, kernels: int = 1) -> LayerOp:
    """Memory-bound eager kernels as ``copy`` ops, ``kernels`` of them sharing
    ``traffic_bytes`` (reads + writes; a copy of b bytes moves 2b)."""
    per = max(1, int(traffic_bytes / (2 * kernels)))
    return LayerOp(name, Op(op=OpKind.copy, dtype="bf16", bytes=per), count=kernels)


def copy_bytes(name: str, bytes_per_unit: int, dtype: str, label: str = "") -> OpTemplate:
    """A ``copy`` reading ``bytes_per_unit * x`` bytes (MoE permutes)."""

    def fields(x: np.ndarray) -> dict[str, Any]:
        return {"bytes": bytes_per_unit * x, "dtype": dtype}

    return OpTemplate(name, label or name, "copy", fields, "ew")


def collective(
    name: str,
    kind: str,
    bytes_per_unit: float,
    ranks: int,
    dtype: str,
    nodes: int = 1,
    label: str = "",
    **kw: Any,
) -> OpTemplate:
    """A collective of ``ceil(bytes_per_unit * x)`` bytes (the full tensor, nccl-tests'
    convention) over ``ranks`` ranks spanning ``nodes`` nodes."""

    def fields(x: np.ndarray) -> dict[str, Any]:
        f: dict[str, Any] = {"bytes": np.ceil(bytes_per_unit * x).astype(np.int64)}
        f.update(ranks=ranks, dtype=dtype, nodes=nodes if nodes > 1 else None)
        return f

    return OpTemplate(name, label or name, kind, fields, "coll", **kw)


def region(
    name: str, kind: Region, mult: Callable[[np.ndarray], np.ndarray] | None = None
) -> OpTemplate:
    """The enter or exit of a tensor-parallel region (expanded per phase); ``mult``: the
    share of the layers that have the region (a hybrid's mean layer)."""
    return OpTemplate(name, region=kind, mult=mult)


def attention(name: str = "attn") -> OpTemplate:
    """The attention placeholder of a layer."""
    return OpTemplate(name, name)
