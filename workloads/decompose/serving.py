"""A serving-engine iteration on one TP rank as op templates: the embedding (``head``), the
layer, what follows the layers (``tail``: final norm, pipeline sends) as functions of the
step's tokens, and the per-sequence ops (``seq``: LM head on each sequence's last token,
logits gather, sampler) as functions of its sequences.

The layer is :func:`workloads.decompose.layer.layer_templates` with the engine's kernels
(``vllm`` or ``pytorch-eager``) and the KV-cache write; its TP regions become vLLM's
all-reduces (plain TP, no sequence parallelism). The step model prices these templates on
grids (:mod:`costmodels.steps.serving`); :func:`prefill_ops` and :func:`decode_step_ops`
evaluate them at one size for inspection and tests.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose.engines import get_engine
from workloads.decompose.layer import expand_forward, layer_templates, norm_kind, rms_eager
from workloads.decompose.mixer import mixer_decode_templates
from workloads.decompose.mla import attention_dims
from workloads.decompose.quant import (
    FP8_QUANT_BYTES_PER_ELEMENT,
    WeightFormat,
    kv_storage_dtype,
    quantised_gemms,
    weight_format,
)
from workloads.decompose.shard import TPShard, positive_int, tp_shard
from workloads.decompose.templates import (
    LayerOp,
    OpTemplate,
    collective,
    elementwise,
    gemm,
    region,
    traffic,
)
from workloads.decompose.training import check_backend
from workloads.models import ModelConfig, ModelError
from workloads.ops import Op, OpKind

Templates = dict[str, list[OpTemplate]]


def serving_templates(
    model: ModelConfig,
    shard: TPShard,
    engine: str = "vllm",
    dtype: str = "bf16",
    *,
    pp: int = 1,
    tp_nodes: int = 1,
    pp_nodes: int = 1,
    weight_dtype: str | None = None,
    kv_cache_dtype: str | None = None,
) -> Templates:
    """``head``, ``layer``, ``tail`` (x = tokens) and ``seq`` (x = sequences) templates of
    one iteration of ``engine`` on one TP rank, in execution order. ``dtype``: the
    activations'; ``weight_dtype`` (default ``dtype``) and ``kv_cache_dtype`` (default
    ``dtype``): how weights and KV cache are stored (:mod:`workloads.decompose.quant`)."""
    kernels = get_engine(engine, "serve").kernels["serve"]
    tp, h = shard.tp, model.hidden_size
    e = DTYPE_BYTES[Dtype(dtype)]
    kv_dt = kv_storage_dtype(kv_cache_dtype, dtype)
    layer = layer_templates(model, shard, dtype, kernels, serving=True, kv_dtype=kv_dt)
    if weight_dtype is not None:
        layer = quantise_gemms(layer, weight_format(weight_dtype), model)
    layer = expand_forward(layer, tp, False, h * e, dtype, tp_nodes)
    lm_head = gemm("lm_head", h, shard.vocab, dtype, per_layer=False)
    if kernels == "eager":
        # final norm and LM head on the last token of each sequence (x[:, -1]); decode adds
        # a greedy argmax that reads the logits once
        argmax = traffic(
            "argmax", float(e * model.vocab_size), per_layer=False, decode_only=True
        )
        return {
            "head": [traffic("embedding", 2.0 * e * h, per_layer=False)],
            "layer": layer,
            "tail": [],
            "seq": [
                *rms_eager("final", "final_norm", h, per_layer=False), lm_head, argmax,
                *mixer_decode_templates(model, tp, dtype, kv_dt),
            ],
        }
    head = [elementwise("embedding", OpKind.embedding.value, h, dtype, per_layer=False)]
    if model.position == "learned":
        head.append(
            elementwise(
                "pos_embedding", OpKind.embedding.value, h, dtype, label="embedding",
                per_layer=False,
            )  # fmt: skip
        )
    head.append(region("embedding", "exit"))  # VocabParallelEmbedding sums the partials
    tail = [elementwise("final_norm", norm_kind(model), h, dtype, rows=2.0, per_layer=False)]
    if pp > 1:  # IntermediateTensors: hidden states and residual go to the next stage
        tail.append(
            collective(
                "pp_send_recv", "send_recv", 2.0 * h * e, 2, dtype, pp_nodes, per_layer=False,
                count=pp - 1,
            )  # fmt: skip
        )
    seq = [lm_head]
    if tp > 1:  # logits gathered to the driver rank
        seq.append(
            collective(
                "tp_gather_logits", "all_gather", shard.vocab * tp * e, tp, dtype, tp_nodes,
                per_layer=False,
            )  # fmt: skip
        )
    seq.append(
        elementwise("sampler", OpKind.softmax.value, model.vocab_size, dtype, per_layer=False)
    )
    seq += mixer_decode_templates(model, tp, dtype, kv_dt)
    head = expand_forward(head, tp, False, h * e, dtype, tp_nodes, per_layer=False)
    return {"head": head, "layer": layer, "tail": tail, "seq": seq}


def quantise_gemms(
    tpls: list[OpTemplate], fmt: WeightFormat, model: ModelConfig
) -> list[OpTemplate]:
    """The layer's :data:`~workloads.decompose.quant.QUANTISED_GEMMS` in weight format
    ``fmt``: weight-only formats mark the GEMM with its weight bits (it still computes in
    the activation dtype); fp8 (W8A8) runs it in fp8 after a quantisation kernel on its
    input (:data:`~workloads.decompose.quant.FP8_QUANT_BYTES_PER_ELEMENT` per element, in
    as many layers as the GEMM runs). vLLM's ``fused_experts`` quantises the hidden states
    once before the grouped up projection (the kernel gathers each routed row from them)
    and the ``[T k, f]`` activation output before the down projection: one row per token,
    then ``k``."""
    if not fmt.quantised:
        return list(tpls)
    out: list[OpTemplate] = []
    for t in tpls:
        if t.op != "gemm" or t.name not in quantised_gemms(fmt):
            out.append(t)
            continue
        if fmt.weight_only:
            out.append(replace(t, weight_bits=fmt.bits))
            continue
        k = int(t.fields_at(np.ones(1, np.int64))["k"])  # type: ignore[misc]
        rows = model.experts_per_token if t.name == "expert_down" else 1  # rows per token
        nbytes = FP8_QUANT_BYTES_PER_ELEMENT * k * rows
        out.append(traffic(f"{t.name}_quant", nbytes, "fp8_quant", mult=t.mult))
        out.append(replace(t, fields=_with_dtype(t.fields, fmt.gemm_dtype)))  # type: ignore[arg-type]
    return out


def _with_dtype(fields, dtype: str):
    def f(x: np.ndarray) -> dict:
        return {**fields(x), "dtype": dtype}

    return f


def _concrete(
    model: ModelConfig,
    tpls: Templates,
    tokens: int,
    seqs: int,
    attn: Op,
    dtype: str,
) -> list[LayerOp]:
    """Every template at one size; per-layer ops carry ``count * num_layers``."""
    out: list[LayerOp] = []
    for part in ("head", "layer", "tail", "seq"):
        x = seqs if part == "seq" else tokens
        for t in tpls[part]:
            repeat = model.num_layers if t.per_layer else 1
            if t.is_attention:
                out.append(LayerOp(t.name, attn, repeat * t.share))
            else:
                out.append(t.layer_op(x, dtype, repeat))
    return out


def _serving_args(
    model: ModelConfig, batch: int, length: int, tp: int, dtype: str, name: str
) -> tuple[TPShard, str]:
    positive_int(batch, "batch")
    positive_int(length, name)
    shard = tp_shard(model, tp)
    try:
        dt = Dtype(dtype).value
    except ValueError:
        allowed = ", ".join(d.value for d in Dtype)
        raise ModelError(f"unknown dtype {dtype!r}; allowed: {allowed}") from None
    return shard, dt


def prefill_ops(
    model: ModelConfig,
    batch: int,
    prompt_len: int,
    tp: int = 1,
    dtype: Dtype | str = "bf16",
    attn_backend: str = "",
    engine: str = "vllm",
) -> list[LayerOp]:
    """A prefill step of ``engine``: the whole model's forward over ``batch`` prompts of
    ``prompt_len`` tokens (layer ops carry ``count = num_layers``); the LM head runs on the
    last token of each prompt only."""
    shard, dt = _serving_args(model, batch, prompt_len, tp, str(dtype), "prompt_len")
    check_backend(attn_backend, OpKind.attn_fwd)
    attn = Op(
        op=OpKind.attn_fwd, dtype=dt, batch=batch, seq_q=prompt_len, seq_kv=prompt_len,
        causal=True, backend=attn_backend or None, **attention_dims(model, shard, "prefill"),
    )  # fmt: skip
    tpls = serving_templates(model, shard, engine, dt)
    return _concrete(model, tpls, batch * prompt_len, batch, attn, dt)


def decode_step_ops(
    model: ModelConfig,
    batch: int,
    context_len: int,
    tp: int = 1,
    dtype: Dtype | str = "bf16",
    attn_backend: str = "",
    engine: str = "vllm",
) -> list[LayerOp]:
    """One decode step of ``engine``: ``batch`` sequences each add one token attending over
    a KV cache of ``context_len`` tokens (the new one included). GEMMs have ``m = batch``;
    layer ops carry ``count = num_layers``."""
    shard, dt = _serving_args(model, batch, context_len, tp, str(dtype), "context_len")
    check_backend(attn_backend, OpKind.attn_decode)
    attn = Op(
        op=OpKind.attn_decode, dtype=dt, batch=batch, seq_q=1, seq_kv=context_len,
        backend=attn_backend or None, **attention_dims(model, shard, "decode"),
    )  # fmt: skip
    tpls = serving_templates(model, shard, engine, dt)
    return _concrete(model, tpls, batch, batch, attn, dt)


def total_instances(tpls: list[OpTemplate], x: np.ndarray) -> np.ndarray:
    """Kernel instances per template at ``x`` (attention placeholders and collectives: 0),
    for per-kernel launch floors."""
    out = np.zeros((len(tpls), len(x)))
    for i, t in enumerate(tpls):
        if t.op and t.launch != "coll":
            out[i] = t.instances_at(x)
    return out
