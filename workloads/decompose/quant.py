"""Serving precision: how a model's weights and KV cache are stored, and which of a serving
step's ops that changes. Storage facts only (bits, scale groups, which GEMMs are
quantised); what the kernels cost is :mod:`costmodels.ops.gemm`'s and the step model's.

**Weights** (``--weight-dtype``), as vLLM runs them:

- ``bf16`` / ``fp16``: unquantised; the activations run in the same dtype (vLLM's
  ``--dtype``).
- ``fp8``: W8A8 (vLLM's ``Fp8LinearMethod``): fp8 weights with a per-tensor scale, the
  activations quantised to fp8 before each quantised GEMM (``scaled_fp8_quant``: one
  kernel reading the bf16 input and writing fp8, 3 bytes per element, as for the static
  input scales of pre-quantised checkpoints), the GEMM on the fp8 tensor cores with a bf16
  output.
- ``int8`` / ``int4``: weight-only W8A16 / W4A16 (GPTQ/AWQ checkpoints through vLLM's
  Marlin kernels, Machete on Hopper for compressed-tensors; TRT-LLM's weight-only GEMMs):
  packed integer weights with one fp16 scale per group of 128 input channels (GPTQ's
  default; Marlin's README counts the 0.125 bits per weight of these scales), dequantised
  to bf16 in registers; the GEMM runs on the bf16 tensor cores.
- ``mxfp4``: the MoE experts only, as gpt-oss ships them (its ``quantization_config``:
  ``quant_method`` ``mxfp4``, attention, router, embedding and LM head left in bf16): 4-bit
  e2m1 weights with one e8m0 (1-byte) scale per 32 (OCP Microscaling spec v1.0), 4.25 bits
  per weight; on Hopper and Ampere vLLM dequantises them inside its MoE kernels (Marlin /
  Triton), so the expert GEMMs run as weight-only W4A16.

Only the linear layers inside the transformer blocks are quantised (:data:`QUANTISED_GEMMS`:
QKV, output, MLP/expert up and down projections); the embedding, LM head, norms and MoE
router stay in the activation dtype, as vLLM leaves them for fp8, GPTQ and AWQ checkpoints.

**KV cache** (``--kv-cache-dtype``, vLLM's flag and spellings): ``auto`` stores K and V in
the activation dtype; ``fp8`` (``fp8_e4m3``, ``fp8_e5m2``: one byte either way, priced
alike) halves the bytes per token of the cache, of decode attention's reads, of the cache
writes and of disaggregation's KV transfers.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.decompose.shard import shard_sizes
from workloads.models import ModelConfig, ModelError

# GEMM templates whose weights a quantised checkpoint stores quantised (vLLM's
# QKVParallelLinear, RowParallelLinear, MergedColumnParallelLinear and fused-MoE experts)
QUANTISED_GEMMS = (
    "qkv_proj", "o_proj", "mlp_up", "mlp_down", "expert_up", "expert_down",
    # MLA projections (workloads.decompose.mla) and the MoE shared expert
    "q_proj", "kv_a_proj", "qkv_a_proj", "q_b_proj", "kv_b_proj", "shared_up", "shared_down",
)  # fmt: skip
# Activation quantisation before an fp8 GEMM: reads bf16 (2 B) and writes fp8 (1 B)
FP8_QUANT_BYTES_PER_ELEMENT = 3.0


@dataclass(frozen=True)
class WeightFormat:
    """How a quantised GEMM's weights are stored and run."""

    name: str
    bits: int  # storage bits per weight
    gemm_dtype: str | None  # dtype the GEMM runs in; None: the activation dtype
    weight_only: bool  # dequantised to the activation dtype inside the GEMM
    group_size: int = 0  # input channels per scale (0: per-tensor, negligible)
    scale_bytes: float = 2.0  # bytes per scale (fp16)
    experts_only: bool = False  # only the MoE experts are stored so (mxfp4)

    @property
    def bytes_per_weight(self) -> float:
        """Storage bytes per weight, its share of the group scales included."""
        scales = self.scale_bytes / self.group_size if self.group_size else 0.0
        return self.bits / 8.0 + scales

    @property
    def quantised(self) -> bool:
        return self.bits < 16


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "bf16": WeightFormat("bf16", 16, None, False),
    "fp16": WeightFormat("fp16", 16, None, False),
    "fp8": WeightFormat("fp8", 8, "fp8", False),
    "int8": WeightFormat("int8", 8, None, True, group_size=128),
    "int4": WeightFormat("int4", 4, None, True, group_size=128),
    "mxfp4": WeightFormat("mxfp4", 4, None, True, group_size=32, scale_bytes=1.0,
                          experts_only=True),  # fmt: skip
}
EXPERT_GEMMS = ("expert_up", "expert_down")


def quantised_gemms(fmt: WeightFormat) -> tuple[str, ...]:
    """The GEMM templates ``fmt`` stores quantised."""
    return EXPERT_GEMMS if fmt.experts_only else QUANTISED_GEMMS
KV_CACHE_DTYPES = ("auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2")


def weight_format(name: str) -> WeightFormat:
    """The :class:`WeightFormat` called ``name``; a one-line error listing the allowed."""
    fmt = WEIGHT_FORMATS.get(name)
    if fmt is None:
        raise ModelError(f"unknown weight dtype {name!r}; allowed: {', '.join(WEIGHT_FORMATS)}")
    return fmt


def weight_only_bytes(bits: int) -> float:
    """Storage bytes per weight of the weight-only format with ``bits`` bits."""
    for fmt in WEIGHT_FORMATS.values():
        if fmt.weight_only and fmt.bits == bits:
            return fmt.bytes_per_weight
    allowed = ", ".join(str(f.bits) for f in WEIGHT_FORMATS.values() if f.weight_only)
    raise ModelError(f"no weight-only format of {bits} bits; allowed: {allowed}")


def kv_storage_dtype(kv_cache_dtype: str | None, activation_dtype: str) -> str:
    """The element type the KV cache stores: ``auto``/None -> the activation dtype, any fp8
    spelling -> ``fp8``."""
    kv = kv_cache_dtype or "auto"
    if kv not in KV_CACHE_DTYPES:
        raise ModelError(
            f"unknown kv cache dtype {kv!r}; allowed: {', '.join(KV_CACHE_DTYPES)}"
        )
    if kv == "auto":
        return activation_dtype
    return "fp8" if kv.startswith("fp8") else kv


def quantised_params_per_layer(model: ModelConfig, tp: int, fmt: WeightFormat | None = None) -> int:
    """Weights of one layer on one TP rank that a quantised checkpoint stores quantised:
    the QKV and output projections and every expert's (or the MLP's) up and down matrices;
    biases, norms and the MoE router stay unquantised. ``fmt`` with ``experts_only``
    (mxfp4): the routed experts alone."""
    sz = shard_sizes(model, tp)
    h, d = model.hidden_size, model.head_dim
    experts_only = fmt is not None and fmt.experts_only
    if model.is_mla or model.num_dense_layers or model.shared_ffn_hidden_size:
        # MLA's projections (its latent norms stay unquantised); the mean layer's routed
        # experts, shared expert and dense MLP (the router stays unquantised)
        if experts_only:
            return int(model.num_experts * sz["expert"])
        norms = (model.kv_lora_rank or 0) + (model.q_lora_rank or 0)
        attn = sz["attn"] - norms if model.is_mla else sz["attn"]
        router = model.router_params * model.moe_layers / model.num_layers
        return int(attn + model.num_experts * sz["expert"] + sz["shared"] - router)
    attn = h * (sz["heads"] + 2 * sz["kv_heads"]) * d + sz["heads"] * d * h
    per_expert = (3 if model.gated_mlp else 2) * h * sz["ffn_e"]
    return int((0 if experts_only else attn) + model.num_experts * per_expert)


__all__ = [
    "EXPERT_GEMMS",
    "FP8_QUANT_BYTES_PER_ELEMENT",
    "KV_CACHE_DTYPES",
    "QUANTISED_GEMMS",
    "WEIGHT_FORMATS",
    "WeightFormat",
    "kv_storage_dtype",
    "quantised_gemms",
    "quantised_params_per_layer",
    "weight_format",
    "weight_only_bytes",
]
