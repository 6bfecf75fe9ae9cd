"""One transformer layer as op templates, per engine kernel style, and the expansion of its
tensor-parallel regions into collectives.

Tensor parallelism follows Megatron-LM (Shoeybi et al. 2019, sec. 3; sequence parallelism
from Korthikanti et al. 2022): Q/K/V and the MLP up (fused gate+up for SwiGLU) projections
are column-parallel, the attention output and MLP down projections row-parallel, heads
split across ranks. Each block is wrapped in Megatron's conjugate operators: *enter*
(``f``: identity forward, all-reduce of the input gradient backward) and *exit* (``g``:
all-reduce forward, identity backward). With sequence parallelism they become all-gather /
reduce-scatter pairs (enter: all-gather forward, reduce-scatter backward; exit:
reduce-scatter forward, all-gather backward) and norms and residual adds run on
``tokens / tp`` tokens. Serving engines run plain TP: the exits are vLLM's all-reduces.

Collective ``bytes`` is the size of the full (unsharded) tensor, ``tokens * hidden *
dtype_bytes``, for all-reduce, all-gather (output size) and reduce-scatter (input size),
the nccl-tests convention; ``ranks = tp``; none when ``tp == 1``.

MoE layers (Mixtral; DeepSeekMoE, Dai et al. 2024; Qwen2-MoE): a router GEMM and top-k
softmax, the routed experts as grouped GEMMs (one launch each for the up and the down
projection over all touched experts, their activation one kernel over the routed rows;
:mod:`workloads.decompose.moe`: distinct experts touched, rows padded to the kernel's M
tile, the model's ``moe_imbalance``), and the always-on shared expert as a plain
tensor-parallel MLP. A model mixing dense and MoE layers (DeepSeek's
``first_k_dense_replace``) is priced as its mean layer: the dense MLP's ops carry
``dense_layers / num_layers`` instances and the MoE ops ``moe_layers / num_layers`` times
theirs (exact for the sum over all layers; pipeline stages get the mean layer).

Simplifications: biases are fused into their GEMMs; dropout is not modelled (Llama-style
pre-training runs without it); sliding-window attention is a sparsity pattern, priced
elsewhere.
"""

from __future__ import annotations

from dataclasses import replace

from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose.engines import LayerKernels
from workloads.decompose.mixer import mixer_templates
from workloads.decompose.mla import mla_templates
from workloads.decompose.moe import constant, grouped_gemm, moe_share
from workloads.decompose.shard import TPShard
from workloads.decompose.templates import (
    OpTemplate,
    attention,
    collective,
    elementwise,
    gemm,
    region,
    sharded_elementwise,
    traffic,
)
from workloads.models import ModelConfig
from workloads.ops import OpKind


def norm_kind(model: ModelConfig) -> str:
    return "rmsnorm" if model.norm == "rmsnorm" else "layernorm"


def rms_eager(tag: str, label: str, h: int, per_layer: bool = True) -> list[OpTemplate]:
    """``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).to(bf16) * w``: 8 kernels
    (bytes per token read + written; the strided ones broadcast a [T, 1] scale or the
    weight, or cast)."""
    kw = {"per_layer": per_layer, "label": label}
    return [
        traffic(f"{tag}_float", 6.0 * h, strided=True, **kw),  # bf16 -> fp32 cast
        traffic(f"{tag}_pow", 8.0 * h, **kw),
        traffic(f"{tag}_mean", 4.0 * h, **kw),
        traffic(f"{tag}_eps", 8.0, **kw),
        traffic(f"{tag}_rsqrt", 8.0, **kw),
        traffic(f"{tag}_mul", 8.0 * h, strided=True, **kw),
        traffic(f"{tag}_to", 6.0 * h, **kw),
        traffic(f"{tag}_weight", 4.0 * h, strided=True, **kw),
    ]


def _rope_eager(tag: str, width: int) -> list[OpTemplate]:
    """``(x * cos + cat(-x2, x1) * sin).to(bf16)`` with fp32 cos/sin on a strided view of
    the QKV output: 6 kernels, bytes per rotated element read + written."""
    return [
        traffic(f"{tag}_cos", 6.0 * width, "rope", strided=True),  # bf16 x fp32 -> fp32
        traffic(f"{tag}_neg", 2.0 * width, "rope", strided=True),  # half the elements
        traffic(f"{tag}_cat", 4.0 * width, "rope", strided=True),
        traffic(f"{tag}_sin", 6.0 * width, "rope", strided=True),
        traffic(f"{tag}_add", 12.0 * width, "rope", strided=True),  # fp32 + fp32 -> fp32
        traffic(f"{tag}_to", 6.0 * width, "rope"),  # fp32 -> bf16
    ]


def _mlp(model: ModelConfig, sh: TPShard, dtype: str, kernels: LayerKernels) -> list[OpTemplate]:
    """The MLP (dense or MoE) between its region markers."""
    h, e = model.hidden_size, DTYPE_BYTES[Dtype(dtype)]
    gated = model.gated_mlp
    up = 2 if gated else 1  # gate and up fused into one column-parallel GEMM
    act_kind = OpKind.swiglu.value if gated else OpKind.gelu.value
    fused = kernels == "fused"

    def dense_mlp(prefix: str, width: int, mult) -> list[OpTemplate]:
        kw = {"mult": mult} if mult is not None else {}
        out = [gemm(f"{prefix}_up", h, up * width, dtype, regather=fused, **kw)]
        if kernels == "eager":  # F.silu on the strided gate half, then * the up half
            out += [
                traffic("silu", 2.0 * e * width, "silu_mul", strided=True, **kw),
                traffic("silu_mul", 3.0 * e * width, "silu_mul", strided=True, **kw),
            ]
        elif kernels == "vllm" and gated:  # silu_and_mul reads gate and up, writes one
            act = "act" if prefix == "mlp" else f"{prefix}_act"
            out.append(traffic(act, 3.0 * width * e, **kw))
        else:
            name = "act" if kernels == "vllm" else act_kind  # the gated kind: swiglu
            name = name if prefix == "mlp" else f"{prefix}_{name}"
            out.append(elementwise(name, act_kind, width, dtype, **kw))
        return out + [gemm(f"{prefix}_down", width, h, dtype, **kw)]

    dense_share = model.dense_layers / model.num_layers
    if not model.is_moe:
        return dense_mlp("mlp", sh.ffn, constant(dense_share))
    share = moe_share(model)
    dense = dense_mlp("mlp", sh.ffn, constant(dense_share)) if dense_share > 0.0 else []
    k, ne, f = model.experts_per_token, model.num_experts, sh.expert_ffn
    per_layer = {"mult": constant(share)} if share < 1.0 else {}
    if kernels == "vllm":  # silu_and_mul over the [T k, 2 f] cache: 3 f elements per row
        act = traffic("expert_act", 3.0 * k * f * e, **per_layer)
    else:  # one activation kernel over the T k permuted rows (grouped MLP)
        act = elementwise(
            f"expert_{act_kind}", act_kind, f, dtype, rows=float(k), **per_layer
        )
    softmax = "topk_softmax" if kernels == "vllm" else "router_softmax"
    gate = 1 if model.shared_expert_gate else 0  # the shared expert's sigmoid gate, fused
    shared = dense_mlp("shared", sh.shared_ffn, constant(share)) if sh.shared_ffn else []
    return [
        *dense,
        gemm("router", h, ne + gate, dtype, regather=fused, **per_layer),
        elementwise(softmax, OpKind.softmax.value, ne, dtype, label="router", **per_layer),
        *shared,
        traffic("moe_permute", 2.0 * k * h * e, **per_layer),
        grouped_gemm("expert_up", model, h, up * f, dtype, **per_layer),
        act,
        grouped_gemm("expert_down", model, f, h, dtype, **per_layer),
        traffic("moe_unpermute", 2.0 * k * h * e, "moe_permute", **per_layer),
    ]


def layer_templates(
    model: ModelConfig,
    sh: TPShard,
    dtype: str,
    kernels: LayerKernels,
    sequence_parallel: bool = False,
    serving: bool = False,
    kv_dtype: str | None = None,
) -> list[OpTemplate]:
    """Forward templates of one layer on one TP rank, in execution order, ``x`` = tokens.

    ``kernels``: ``fused`` (Megatron/TE: norm, residual add, RoPE, activation as one
    kernel each), ``vllm`` (fused residual-add + norm reading and writing both tensors,
    in-place rotary, ``silu_and_mul``) or ``eager`` (PyTorch's kernels one by one).
    ``serving`` adds the KV-cache write (``kv_dtype``: the cache's element type, default
    ``dtype``). Region markers stand where Megatron's f/g operators are
    (:func:`expand_regions`)."""
    h, d, e = model.hidden_size, model.head_dim, DTYPE_BYTES[Dtype(dtype)]
    nk = norm_kind(model)
    qkv = (sh.heads + 2 * sh.kv_heads) * d
    sp = sequence_parallel and sh.tp > 1

    def norm(name: str) -> OpTemplate:
        if sp:
            return sharded_elementwise(name, nk, h, dtype, sh.tp)
        return elementwise(name, nk, h, dtype)

    def residual(name: str) -> list[OpTemplate]:
        if kernels == "vllm":
            return []  # fused into the next norm (fused_add_rms_norm)
        if kernels == "eager":
            return [traffic(name, 3.0 * e * h, "residual_add")]
        if sp:
            return [sharded_elementwise(name, OpKind.residual_add.value, h, dtype, sh.tp)]
        return [elementwise(name, OpKind.residual_add.value, h, dtype)]

    if kernels == "vllm":  # reads input and residual, writes both: twice a norm's traffic
        pre_attn = [elementwise("input_norm", nk, h, dtype, rows=2.0, label="norm")]
        pre_mlp = [elementwise("post_attn_norm", nk, h, dtype, rows=2.0, label="norm")]
    elif kernels == "eager":
        pre_attn, pre_mlp = rms_eager("rms1", "rmsnorm", h), rms_eager("rms2", "rmsnorm", h)
    else:
        pre_attn, pre_mlp = [norm(f"{model.norm}_1")], [norm(f"{model.norm}_2")]

    mix_share, mlp_share = _shares(model)
    pre_attn, pre_mlp = _weigh(pre_attn, mix_share), _weigh(pre_mlp, mlp_share)
    out = [*pre_attn, region("attn", "enter", constant(mix_share))]
    if model.is_mla:
        att = mla_templates(model, sh, dtype, kernels, serving, kv_dtype, attention())
        return _after_attention(out, att, model, sh, dtype, kernels, pre_mlp, residual)
    att = _attention_block(model, sh, dtype, kernels, serving, kv_dtype, qkv)
    return _after_attention(out, att, model, sh, dtype, kernels, pre_mlp, residual)


def _weigh(tpls: list[OpTemplate], share: float) -> list[OpTemplate]:
    """``tpls`` run in a ``share`` of the layers (the mean layer of a hybrid)."""
    if share >= 1.0:
        return list(tpls)
    return [replace(t, mult=constant(share * t.share)) for t in tpls]


def _shares(model: ModelConfig) -> tuple[float, float]:
    """Shares of the layers with a token mixer (attention and/or a linear mixer) and with
    an MLP: below 1 only in Nemotron-H's single-mixer blocks."""
    n = model.num_layers
    return min(n, model.attention_layers + model.mixer_layers) / n, (
        n - model.mlp_free_layers
    ) / n


def _attention_block(
    model: ModelConfig, sh: TPShard, dtype: str, kernels: LayerKernels, serving: bool,
    kv_dtype: str | None, qkv: int,
) -> list[OpTemplate]:  # fmt: skip
    """Q/K/V projection to output projection of a (non-MLA) attention layer."""
    h, d, e = model.hidden_size, model.head_dim, DTYPE_BYTES[Dtype(dtype)]
    nk = norm_kind(model)
    gate = sh.heads * d if model.attention_output_gate else 0  # Qwen3-Next's output gate
    out = [gemm("qkv_proj", h, qkv + gate, dtype, regather=kernels == "fused")]
    if model.qk_norm:  # Qwen3: RMSNorm over each q and k head before RoPE
        rows = float(sh.heads + sh.kv_heads)
        out.append(elementwise("qk_norm", nk, d, dtype, rows=rows, label="norm"))
    if model.position == "rope":
        if kernels == "eager":
            out += _rope_eager("rope_q", sh.heads * d) + _rope_eager("rope_k", sh.kv_heads * d)
        elif kernels == "vllm":  # rotary_embedding rotates q and k in place
            out.append(traffic("rope", 2.0 * (sh.heads + sh.kv_heads) * d * e))
        else:
            out.append(elementwise("rope", OpKind.rope.value, (sh.heads + sh.kv_heads) * d, dtype))
    if serving:
        if kernels == "eager":  # cache[..., start:start+s].copy_(k) and (v): strided
            kv = 2.0 * e * sh.kv_heads * d
            out += [
                traffic("cache_k", kv, "kv_cache_write", strided=True),
                traffic("cache_v", kv, "kv_cache_write", strided=True),
            ]
        else:  # reshape_and_cache_flash: reads k and v, writes them into the paged cache
            kv_e = e if kv_dtype is None else DTYPE_BYTES[Dtype(kv_dtype)]
            out.append(traffic("kv_cache_write", 2.0 * sh.kv_heads * d * (e + kv_e)))
    out.append(attention())
    if gate:  # o * sigmoid(gate) before o_proj
        out.append(traffic("attn_gate", 3.0 * e * gate, "attn_gate"))
    return [*out, gemm("o_proj", sh.heads * d, h, dtype)]


def _after_attention(
    out: list[OpTemplate], att: list[OpTemplate], model: ModelConfig, sh: TPShard, dtype: str,
    kernels: LayerKernels, pre_mlp: list[OpTemplate], residual,
) -> list[OpTemplate]:  # fmt: skip
    """The rest of a layer from its attention block (weighed by the attention layers'
    share) and linear mixer: the token-mixing region's exit, the residual add, the MLP's
    norm and the MLP between its region markers."""
    mix_share, mlp_share = _shares(model)
    out = [*out, *_weigh(att, model.attention_layers / model.num_layers)]
    out += mixer_templates(model, sh.tp, dtype, kernels)
    out.append(region("attn", "exit", constant(mix_share)))
    out += _post_norm(model, "post_attn_out_norm", dtype, kernels)
    out += _weigh(residual("residual_1"), mix_share)
    out += [*pre_mlp, region("mlp", "enter", constant(mlp_share))]
    out += _mlp(model, sh, dtype, kernels)
    out.append(region("mlp", "exit", constant(mlp_share)))
    out += _post_norm(model, "post_mlp_norm", dtype, kernels)
    out += _weigh(residual("residual_2"), mlp_share)
    return out


def _post_norm(model: ModelConfig, name: str, dtype: str, kernels: LayerKernels) -> list:
    """Gemma 2/3's norm on the attention's and the MLP's output before each residual add
    (``post_attention_layernorm``, ``post_feedforward_layernorm``; HF Gemma2DecoderLayer),
    an unfused RMSNorm in every engine; nothing for two-norm layers."""
    if model.norms_per_layer < 4:
        return []
    if kernels == "eager":
        return rms_eager(name, "rmsnorm", model.hidden_size)
    return [elementwise(name, norm_kind(model), model.hidden_size, dtype, label="norm")]


def region_collective(
    step: OpTemplate,
    tp: int,
    sequence_parallel: bool,
    backward: bool,
    bytes_per_token: float,
    dtype: str,
    nodes: int = 1,
    per_layer: bool = True,
) -> list[OpTemplate]:
    """The collective of a region boundary (Megatron's f/g operators), or nothing."""
    if tp == 1:
        return []
    suffix = "_bwd" if backward else ""
    enter = step.region == "enter"
    if sequence_parallel:
        # enter: all-gather fwd / reduce-scatter bwd; exit: reduce-scatter fwd / all-gather bwd
        gather = enter != backward
        kind = OpKind.all_gather if gather else OpKind.reduce_scatter
        label = "allgather" if gather else "reducescatter"
    else:
        # enter: nothing fwd / all-reduce bwd; exit: all-reduce fwd / nothing bwd
        if enter != backward:
            return []
        kind, label = OpKind.all_reduce, "allreduce"
    name = f"tp_{label}_{step.name}{suffix}"
    return [
        collective(
            name, kind.value, bytes_per_token, tp, dtype, nodes, f"tp_{label}",
            per_layer=per_layer, mult=step.mult,
        )  # fmt: skip
    ]


def expand_forward(
    steps: list[OpTemplate],
    tp: int,
    sequence_parallel: bool,
    bytes_per_token: float,
    dtype: str,
    nodes: int = 1,
    per_layer: bool = True,
) -> list[OpTemplate]:
    """Forward templates with the region markers replaced by their collectives."""
    out: list[OpTemplate] = []
    for step in steps:
        if step.region:
            out += region_collective(
                step, tp, sequence_parallel, False, bytes_per_token, dtype, nodes, per_layer
            )
        else:
            out.append(step)
    return out
