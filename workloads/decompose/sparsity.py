"""Weight and activation sparsity of a model's linear layers, as the decomposition marks it.

Which GEMMs a sparsified checkpoint runs sparse (shape facts only; the kernels' cost is
:mod:`costmodels.ops.sparse_gemm`'s):

- ``--weight-sparsity 2:4 | unstructured:S``: the transformer blocks' linear layers, the
  only ones SparseGPT (Frantar & Alistarh 2023) and Wanda (Sun et al. 2024) prune: QKV,
  attention output, MLP gate+up and down, and a MoE layer's always-on shared expert
  (:data:`SPARSE_WEIGHT_GEMMS`). Attention has no weights; the embedding and LM head are
  left dense by those methods; routed experts stay dense (their grouped GEMMs have no
  calibrated sparse kernel, and vLLM's fused MoE has no 2:4 path for 16-bit weights); MLA
  projections stay dense (not measured).
- ``--activation-sparsity cats:F``: CATS (Lee et al. 2024) thresholds SiLU(gate) of a
  SwiGLU MLP, so the gate projection stays dense and only the up and down projections skip
  the inactive neurons: the fused gate+up GEMM becomes a dense gate GEMM and a CATS up GEMM
  (:data:`CATS_GEMMS`, the dense MLP only).

One sparsity per GEMM: the two options together are refused (no kernel combines them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hardware_specs.schema import GpuSpec
from workloads.decompose.shard import TPShard
from workloads.decompose.templates import OpTemplate
from workloads.models import ModelConfig, ModelError
from workloads.ops import OpError, canonical_sparsity, parse_gemm_sparsity

SPARSE_WEIGHT_GEMMS = ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "shared_up", "shared_down")
CATS_GEMMS = ("mlp_up", "mlp_down")
WEIGHT_KINDS = ("2:4", "unstructured")
# Weight formats with a sparse kernel modelled here: the 16-bit ones (cuSPARSELt's 2:4 and
# Flash-LLM were measured/modelled in fp16/bf16; cuSPARSELt's fp8 2:4 and Sparse-Marlin's
# int4 2:4 exist but are not calibrated)
SPARSE_WEIGHT_DTYPES = ("bf16", "fp16")


@dataclass(frozen=True)
class LinearSparsity:
    """The linear layers' sparsity in canonical spelling ("" = dense)."""

    weight: str = ""  # "2:4" | "unstructured:S"
    activation: str = ""  # "cats:F"

    @property
    def active(self) -> bool:
        return bool(self.weight or self.activation)

    def of(self, name: str) -> str:
        """The sparsity of the GEMM template called ``name`` ("" = dense)."""
        if self.weight and name in SPARSE_WEIGHT_GEMMS:
            return self.weight
        if self.activation and name in CATS_GEMMS:
            return self.activation
        return ""


def linear_sparsity(
    weight: str | None = None,
    activation: str | None = None,
    *,
    model: ModelConfig | None = None,
    gpu: GpuSpec | None = None,
    weight_dtype: str | None = None,
    training: bool = False,
) -> LinearSparsity:
    """The two options checked (``--weight-sparsity``, ``--activation-sparsity``); one
    :class:`ModelError` line for a malformed value, a wrong family, both at once, CATS on a
    model without a dense SwiGLU MLP, 2:4 on a GPU without sparse tensor cores, a quantised
    weight format, or (``training``) a kind with no training kernel."""
    try:
        w = canonical_sparsity(weight) if weight else ""
        a = canonical_sparsity(activation) if activation else ""
    except OpError as exc:
        flag = "--weight-sparsity" if weight and _bad(weight) else "--activation-sparsity"
        raise ModelError(f"{flag}: {exc}") from None
    if w and parse_gemm_sparsity(w)[0] not in WEIGHT_KINDS:
        raise ModelError(
            f"--weight-sparsity {weight!r} is not a weight sparsity; allowed: 2:4, "
            "unstructured:S with 0 <= S < 1 (CATS is --activation-sparsity cats:F)"
        )
    if a and parse_gemm_sparsity(a)[0] != "cats":
        raise ModelError(
            f"--activation-sparsity {activation!r} is not an activation sparsity; allowed: "
            "cats:F with 0 < F <= 1 (2:4 and unstructured are --weight-sparsity)"
        )
    if w and a:
        raise ModelError(
            f"--weight-sparsity {w} with --activation-sparsity {a}: one sparse kernel per GEMM "
            "is modelled; allowed: one of the two"
        )
    if training and (a or (w and w != "2:4")):
        raise ModelError(
            f"{'--activation-sparsity ' + a if a else '--weight-sparsity ' + w} has no training "
            "kernel (Flash-LLM and CATS are inference kernels); allowed for train: "
            "--weight-sparsity 2:4"
        )
    if (w or a) and weight_dtype is not None and weight_dtype not in SPARSE_WEIGHT_DTYPES:
        raise ModelError(
            f"--weight-dtype {weight_dtype} with sparsity {w or a}: no sparse kernel for "
            f"{weight_dtype} weights is modelled (cuSPARSELt's fp8 2:4 and Sparse-Marlin's int4 "
            "2:4 are not calibrated); allowed: --weight-dtype bf16 or fp16"
        )
    no_mlp = model is not None and (model.activation != "swiglu" or _moe_only(model))
    if a and no_mlp:
        raise ModelError(
            f"--activation-sparsity {a} thresholds a dense SwiGLU MLP's SiLU(gate) (CATS); "
            f"{model.id} has none; allowed: a model with a dense SwiGLU MLP, or no "
            "--activation-sparsity"
        )
    if gpu is not None and w == "2:4" and gpu.sparse_speedup <= 1.0:
        raise ModelError(
            f"--weight-sparsity 2:4 needs sparse tensor cores (Ampere or later); {gpu.id} has "
            "none; allowed: unstructured:S, or a GPU with 2:4 support"
        )
    if gpu is not None and training and w and gpu.vendor != "nvidia":
        raise ModelError(
            f"--weight-sparsity {w} for training needs torch's 2:4 tile sparsifier and "
            f"cuSPARSELt (CUDA only); {gpu.id} is an {gpu.vendor.upper()} GPU; allowed: an "
            "NVIDIA GPU"
        )
    return LinearSparsity(w, a)


def _bad(text: str) -> bool:
    try:
        canonical_sparsity(text)
    except OpError:
        return True
    return False


def _moe_only(model: ModelConfig) -> bool:
    """Every layer MoE: no dense MLP for CATS (the shared expert is not thresholded)."""
    return model.is_moe and not model.num_dense_layers


def sparsify_templates(tpls: list[OpTemplate], ls: LinearSparsity) -> list[OpTemplate]:
    """The layer templates with the sparse GEMMs marked (see the module docstring): a CATS
    ``mlp_up`` (fused gate+up of ``2 f`` columns) becomes a dense ``mlp_gate`` and a CATS
    ``mlp_up`` of ``f`` columns each (breakdown label ``mlp_up`` for both)."""
    if not ls.active:
        return list(tpls)
    out: list[OpTemplate] = []
    for t in tpls:
        sp = ls.of(t.name) if t.op == "gemm" else ""
        if not sp:
            out.append(t)
        elif sp.startswith("cats") and t.name == "mlp_up":
            half = _half_n(t.fields)
            out.append(replace(t, name="mlp_gate", fields=half))
            out.append(replace(t, fields=half, sparsity=sp))
        else:
            out.append(replace(t, sparsity=sp))
    return out


def _half_n(fields):
    def f(x: np.ndarray) -> dict:
        row = fields(x)
        return {**row, "n": int(row["n"]) // 2}

    return f


def sparse_weight_params(tpls: list[OpTemplate]) -> float:
    """Weights per layer (per TP rank) of the templates with a *weight* sparsity: what the
    sparse format stores instead of dense (MoE-mixed mean layers: weighted by the share of
    layers the GEMM runs in)."""
    one = np.ones(1, np.int64)
    total = 0.0
    for t in tpls:
        if t.op != "gemm" or not t.sparsity or t.sparsity.startswith("cats"):
            continue
        f = t.fields_at(one)
        total += float(f["k"]) * float(f["n"]) * t.count * float(t.instances_at(one)[0])
    return total


def sparse_layer_params(model: ModelConfig, shard: TPShard, ls: LinearSparsity) -> float:
    """:func:`sparse_weight_params` of one layer of ``model`` on one TP rank of ``shard``
    (the serving layer's GEMMs; their weight shapes are every engine's)."""
    if not ls.weight:
        return 0.0
    from workloads.decompose.layer import layer_templates

    return sparse_weight_params(
        sparsify_templates(layer_templates(model, shard, "bf16", "vllm"), ls)
    )


__all__ = [
    "CATS_GEMMS",
    "SPARSE_WEIGHT_DTYPES",
    "SPARSE_WEIGHT_GEMMS",
    "WEIGHT_KINDS",
    "LinearSparsity",
    "linear_sparsity",
    "sparse_layer_params",
    "sparse_weight_params",
    "sparsify_templates",
]
