"""What one tensor-parallel rank holds of a model: heads, KV heads, FFN and vocabulary
shards, and the parameters of each part (Megatron-LM's splits, Shoeybi et al. 2019, sec. 3;
the vocabulary padded to a multiple of tp as Megatron pads it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.decompose.mixer import mixer_tp_problem
from workloads.models import ModelConfig, ModelError


def positive_int(value: object, what: str) -> int:
    """``value`` if it is a positive integer, else a one-line ModelError naming ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelError(f"{what} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class TPShard:
    """What one tensor-parallel rank holds of each split dimension."""

    tp: int
    heads: int
    kv_heads: int  # 1 when tp > num_kv_heads (each KV head then lives on kv_replicas ranks)
    kv_replicas: int  # ranks holding a copy of each KV head: tp / num_kv_heads, at least 1
    ffn: int
    expert_ffn: int
    vocab: int  # ceil(vocab / tp): the vocabulary is padded to a multiple of tp
    shared_ffn: int = 0  # the MoE shared expert's width on this rank (0 without one)


def _tp_problem(model: ModelConfig, tp: int) -> str | None:
    """Why ``tp`` cannot split ``model``, or None if it can."""
    if model.num_heads % tp:
        return f"tp={tp} does not divide num_heads={model.num_heads}"
    kv = model.num_kv_heads
    if kv % tp and tp % kv:
        return (
            f"tp={tp} neither divides num_kv_heads={kv} nor is a multiple of it "
            "(KV heads are split, or replicated when tp > num_kv_heads)"
        )
    if model.ffn_hidden_size % tp:
        return f"tp={tp} does not divide ffn_hidden_size={model.ffn_hidden_size}"
    if model.expert_ffn_hidden_size % tp:
        return f"tp={tp} does not divide moe_ffn_hidden_size={model.expert_ffn_hidden_size}"
    if model.shared_ffn_hidden_size % tp:
        return (
            f"tp={tp} does not divide shared_expert_ffn_hidden_size={model.shared_ffn_hidden_size}"
        )
    return mixer_tp_problem(model, tp)


def valid_tp_degrees(model: ModelConfig) -> list[int]:
    """Every tensor-parallel degree that can split ``model`` (divisors of num_heads)."""
    return [t for t in range(1, model.num_heads + 1) if _tp_problem(model, t) is None]


def tp_shard(model: ModelConfig, tp: int) -> TPShard:
    """Per-rank sizes for ``tp``; a bad ``tp`` raises naming the dimension and the valid tps."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ModelError(f"tp must be a positive integer, got {tp!r}")
    problem = _tp_problem(model, tp)
    if problem:
        valid = ", ".join(str(t) for t in valid_tp_degrees(model))
        raise ModelError(f"{problem} of {model.id}; valid tp: {valid}")
    return TPShard(
        tp=tp,
        heads=model.num_heads // tp,
        kv_heads=max(1, model.num_kv_heads // tp),
        kv_replicas=max(1, tp // model.num_kv_heads),
        ffn=model.ffn_hidden_size // tp,
        expert_ffn=model.expert_ffn_hidden_size // tp,
        vocab=-(-model.vocab_size // tp),
        shared_ffn=model.shared_ffn_hidden_size // tp,
    )


def shard_sizes(model: ModelConfig, tp: Any) -> dict[str, Any]:
    """Per-rank sizes and parameter counts for ``tp`` (an int, or an array of degrees for
    vectorised plan search; no validation - see :func:`tp_shard`): heads, KV heads
    (replicated when tp > num_kv_heads), FFN and expert-FFN shards, the padded vocabulary
    shard, and the parameters of one layer's attention (``attn``), one expert's MLP
    (``expert``), one layer (``layer``), the embedding (with learned positions) and an
    untied LM head (``vocab_h``). A model mixing dense and MoE layers reports its mean
    layer: ``expert`` and ``shared`` (the shared expert, dense MLP and router: the MLP
    parameters outside the routed experts) are means over all layers, so ``num_layers``
    times them is the exact sum."""
    h, d = model.hidden_size, model.head_dim
    heads = model.num_heads // tp
    kv_heads = np.maximum(1, model.num_kv_heads // tp)
    ffn_e = model.expert_ffn_hidden_size // tp
    vocab = -(-model.vocab_size // tp)
    qkv_out = (heads + 2 * kv_heads) * d
    if model.is_mla:
        attn = mla_params_per_rank(model, tp)
    else:
        attn = h * qkv_out + heads * d * h
        attn = attn + (h * heads * d if model.attention_output_gate else 0)
        attn = attn + (qkv_out if model.qkv_bias else 0) + (h if model.out_proj_bias else 0)
        qk = 0
        if model.qk_norm:  # per head (replicated), or over this rank's q and k columns
            qk = 2 * d if model.qk_norm_span == "head" else qkv_out - kv_heads * d
        attn = attn + qk + (heads if model.attention_sinks else 0)
    gated = model.gated_mlp

    def mlp_params(width):
        n = (3 if gated else 2) * h * width
        return n + ((2 * width if gated else width) + h if model.mlp_bias else 0)

    expert = mlp_params(ffn_e)
    n = model.num_layers
    moe_s, dense_s = model.moe_layers / n, model.dense_layers / n
    if not model.is_moe:
        shared = 0
        expert = dense_s * expert if dense_s < 1.0 else expert
    elif model.dense_layers or model.shared_ffn_hidden_size or model.mlp_free_layers:
        width = model.shared_ffn_hidden_size // tp
        shared_mlp = mlp_params(width) if model.shared_ffn_hidden_size else 0
        shared = moe_s * (shared_mlp + model.router_params) + dense_s * mlp_params(
            model.ffn_hidden_size // tp
        )
        expert = moe_s * expert
    else:
        shared = model.router_params
    mlp = model.num_experts * expert + shared
    if model.is_hybrid:  # the mean layer: attention and mixers in their layers' shares
        attn = attn * (model.attention_layers / n)
        mlp = mlp + (model.mixer_layers / n) * model.mixer_params / tp
    pos = model.max_seq_len * h if model.position == "learned" else 0
    return {
        "heads": heads,
        "kv_heads": kv_heads,
        "ffn": model.ffn_hidden_size // tp,
        "ffn_e": ffn_e,
        "vocab": vocab,
        "attn": attn,
        "expert": expert,
        "shared": shared,
        "layer": attn + mlp + model.norms_per_layer * model.norm_params,
        "embedding": vocab * h + pos,
        "vocab_h": vocab * h,
    }


def params_per_tp_rank(model: ModelConfig, tp: int) -> dict[str, int]:
    """Parameters one tensor-parallel rank holds: ``layer`` (one layer), ``embedding``,
    ``final_norm`` and ``lm_head`` (0 when tied).

    Column-parallel weights and biases are split, row-parallel weights split and their
    biases replicated, norms and the MoE router replicated, replicated KV heads counted on
    every rank that holds them, the vocabulary padded to ``tp * ceil(vocab / tp)``.
    """
    tp_shard(model, tp)  # one-line error for a tp that cannot split the model
    sz = shard_sizes(model, tp)
    return {
        "layer": int(sz["layer"]),
        "embedding": int(sz["embedding"]),
        "final_norm": model.norm_params,
        "lm_head": (0 if model.tie_embeddings else int(sz["vocab_h"]))
        + (int(sz["vocab"]) if model.lm_head_bias else 0),
    }


def mla_params_per_rank(model: ModelConfig, tp: Any) -> Any:
    """MLA attention parameters one TP rank holds (``tp`` an int or an array; see
    :mod:`workloads.decompose.mla`): the
    replicated down-projections and latent norms, and ``1/tp`` of ``W^UQ`` (or ``W^Q``),
    ``W^UK``/``W^UV`` and ``W^O``."""
    h, nh = model.hidden_size, model.num_heads
    c, r, ql = model.kv_lora_rank or 0, model.qk_rope_head_dim or 0, model.q_lora_rank
    heads = nh // tp
    replicated = h * (c + r) + c + ((h + 1) * ql if ql else 0)
    q_in = ql if ql else h
    split = heads * (q_in * model.head_dim + c * (model.qk_nope_head_dim + model.v_dim))
    return replicated + split + heads * model.v_dim * h + model.indexer_params  # replicated
