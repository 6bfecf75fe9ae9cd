"""HuggingFace ``config.json`` keys of the 2024-25 families whose layers differ from
Llama's: gpt-oss, Gemma 2 and 3, Phi-3/Phi-4 (``load_hf_config`` in
:mod:`workloads.models` dispatches here).

Each function returns the :class:`~workloads.models.ModelConfig` fields beyond the
Llama-style ones ``load_hf_config`` reads for every family (layers, widths, heads,
vocabulary, positions, ``attention_bias``, ``tie_word_embeddings``). Parameter counts
equal HF ``numel`` for the released configs (``tests/workloads/test_hf_families.py``
lists them and the command that counts them). Layer attention follows
``layer_types`` (``sliding_attention`` / ``full_attention``, transformers >= 4.53) or,
in older Gemma 3 configs, ``sliding_window_pattern``.
"""

from __future__ import annotations

from typing import Any

from workloads.vision import VisionError, vision_from_hf

FAMILY_TYPES = (
    "gpt_oss", "gemma2", "gemma3_text", "gemma3", "phi3", "phimoe", "llama4", "llama4_text",
    "glm4_moe", "minimax_m2", "qwen2_5_vl",
)  # fmt: skip

_LAYER_KIND = {
    "sliding_attention": "sliding",
    "full_attention": "full",
    "chunked_attention": "chunked",
}
_NESTED = ("gemma3", "llama4")  # multimodal configs: the language model in text_config


class FamilyError(ValueError):
    """A config of these families that cannot be read; one line."""


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's and Llama 4's multimodal configs nest the language model under
    ``text_config``; only the text model is priced (their vision towers are not).
    Qwen2.5-VL's configs carry the text keys flat (transformers < 4.53), under
    ``text_config`` or both; its ``vision_config`` stays (:func:`family_fields`)."""
    kind = cfg.get("model_type")
    if kind == "qwen2_5_vl":
        nested = cfg.get("text_config")
        return {**cfg, **(nested if isinstance(nested, dict) else {}), "model_type": kind}
    if kind in _NESTED and isinstance(cfg.get("text_config"), dict):
        text = {**cfg["text_config"], "model_type": kind}
        if kind == "gemma3":  # released configs leave Gemma3TextConfig's default out
            text.setdefault("vocab_size", 262208)
        return text
    return cfg


def layer_attention(
    cfg: dict[str, Any], layers: int, where: str, default_every: int | None = None
) -> tuple[str, ...] | None:
    """Each layer's attention from ``layer_types``, else ``sliding_window_pattern`` (every
    K-th layer full, Gemma 3), else ``default_every`` (Gemma 2 alternates); None when the
    config has no sliding window."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or any(t not in _LAYER_KIND for t in types):
            raise FamilyError(
                f"{where}: layer_types must list 'sliding_attention', 'chunked_attention' "
                f"or 'full_attention' (got {types!r})"
            )
        if len(types) != layers:
            raise FamilyError(
                f"{where}: layer_types lists {len(types)} layers, num_hidden_layers is {layers}"
            )
        kinds = tuple(_LAYER_KIND[t] for t in types)
        return kinds if set(kinds) != {"full"} else None
    if not window or window >= (cfg.get("max_position_embeddings") or window + 1):
        return None  # no window, or one no sequence outgrows (Phi-3.5: 262144 > 131072)
    every = cfg.get("sliding_window_pattern") or default_every
    if every is None:  # one window on every layer (Phi-3, Mistral 7B v0.1)
        return ("sliding",) * layers
    if not isinstance(every, int) or every < 1:
        raise FamilyError(f"{where}: sliding_window_pattern must be a positive integer")
    return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(layers))


def family_fields(model_type: str, cfg: dict[str, Any], layers: int, where: str) -> dict:
    """Fields of ``model_type`` (one of :data:`FAMILY_TYPES`) beyond the Llama ones."""
    out: dict[str, Any] = {}
    window = cfg.get("sliding_window")
    if model_type == "gpt_oss":
        # GptOssAttention: q/k/v/o biases and one sink logit per head; GptOssTopKRouter
        # with a bias; GptOssExperts' gate_up and down biases; clamped SwiGLU (limit 7)
        out.update(
            num_experts=_req(cfg, "num_local_experts", where),
            experts_per_token=_req(cfg, "num_experts_per_tok", where),
            attention_sinks=True,
            checkpoint_weights=(cfg.get("quantization_config") or {}).get("quant_method"),
            router_bias=True,
            mlp_bias=True,
            layer_attention=layer_attention(cfg, layers, where),
        )
    elif model_type in ("gemma2", "gemma3_text", "gemma3"):
        # Gemma2/3DecoderLayer: input, post-attention, pre- and post-feedforward RMSNorms;
        # GeGLU (gelu_pytorch_tanh); tied embeddings; Gemma 3 adds q/k norms. Gemma 2
        # alternates sliding and full layers (sliding first, HF Gemma2Config).
        gemma3 = model_type != "gemma2"
        out.update(
            final_logit_softcap=cfg.get("final_logit_softcapping"),
            activation="geglu",
            norms_per_layer=4,
            qk_norm=gemma3,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            layer_attention=layer_attention(cfg, layers, where, None if gemma3 else 2),
        )
    elif model_type == "phi3":
        # Phi3Attention: fused qkv_proj, Phi3MLP: fused gate_up_proj (same parameters as
        # separate ones); a sliding window on every layer when the config sets one
        out.update(layer_attention=layer_attention(cfg, layers, where))
    elif model_type == "phimoe":
        # PhimoeDecoderLayer (Phi-3.5-MoE): LayerNorms with biases, q/k/v/o biases
        # (attention_bias), a bias-free router over num_local_experts; an LM head bias
        out.update(
            norm="layernorm",
            num_experts=_req(cfg, "num_local_experts", where),
            experts_per_token=_req(cfg, "num_experts_per_tok", where),
            lm_head_bias=bool(cfg.get("lm_head_bias", False)),
            layer_attention=layer_attention(cfg, layers, where),
        )
    elif model_type in ("llama4", "llama4_text"):
        out.update(_llama4_fields(cfg, layers, where))
    elif model_type == "qwen2_5_vl":
        # Qwen2_5_VLTextModel is Qwen2's decoder (q/k/v biases); the ViT in workloads.vision
        try:
            vision = vision_from_hf(cfg.get("vision_config", {}), cfg["hidden_size"], where)
        except VisionError as exc:
            raise FamilyError(str(exc)) from None
        out.update(qkv_bias=True, vision=vision)
    elif model_type == "glm4_moe":
        # Glm4MoeAttention: q/k/v biases (attention_bias), none on o_proj, per-head q/k
        # norms with use_qk_norm; Glm4MoeMoE: n_routed_experts of moe_intermediate_size,
        # a router without bias (its e_score_correction_bias is a buffer), n_shared_experts
        # fused into one shared MLP; the first first_k_dense_replace layers dense
        shared = cfg.get("n_shared_experts") or 0
        width = _req(cfg, "moe_intermediate_size", where)
        out.update(
            out_proj_bias=False,
            qk_norm=bool(cfg.get("use_qk_norm", False)),
            num_experts=_req(cfg, "n_routed_experts", where),
            experts_per_token=_req(cfg, "num_experts_per_tok", where),
            moe_ffn_hidden_size=width,
            num_dense_layers=min(int(cfg.get("first_k_dense_replace") or 0), layers - 1),
        )
        if shared:
            out["shared_expert_ffn_hidden_size"] = shared * width
    elif model_type == "minimax_m2":
        # MiniMaxM2Attention: RMSNorm over all of q and all of k (qk_norm_type per_layer);
        # MiniMaxM2SparseMoeBlock: num_local_experts of intermediate_size, a bias-free
        # gate, no shared expert, every layer sparse
        out.update(
            qk_norm=bool(cfg.get("use_qk_norm", True)),
            qk_norm_span="layer" if cfg.get("qk_norm_type", "per_layer") == "per_layer" else "head",
            num_experts=_req(cfg, "num_local_experts", where),
            experts_per_token=_req(cfg, "num_experts_per_tok", where),
        )
    kinds = out.get("layer_attention") or ()
    if "sliding" in kinds:
        out["sliding_window"] = window
    return out


def _llama4_fields(cfg: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Llama4TextDecoderLayer: MoE on ``moe_layers`` (default every
    ``interleave_moe_layer_step``-th layer) with ``num_local_experts`` routed experts of
    ``intermediate_size``, a bias-free router and one shared expert of the same width;
    the other layers a dense MLP of ``intermediate_size_mlp``. Attention is chunked
    (``attention_chunk_size``) on the RoPE layers and full on the NoPE ones
    (``no_rope_layers[i] == 0``; default every 4th); its QK L2 norm has no parameters."""
    step = cfg.get("interleave_moe_layer_step") or 1
    moe = cfg.get("moe_layers")
    if moe is None:
        moe = list(range(step - 1, layers, step))
    dense = layers - len(set(moe))
    width = _req(cfg, "intermediate_size", where)
    out: dict[str, Any] = {
        "num_experts": _req(cfg, "num_local_experts", where),
        "experts_per_token": _req(cfg, "num_experts_per_tok", where),
        "moe_ffn_hidden_size": width,
        "shared_expert_ffn_hidden_size": width,
        "num_dense_layers": dense,
    }
    if dense:
        out["ffn_hidden_size"] = _req(cfg, "intermediate_size_mlp", where)
    chunk = cfg.get("attention_chunk_size")
    if chunk:
        kinds = layer_attention(cfg, layers, where)
        if kinds is None:
            rope = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
            if len(rope) != layers:
                raise FamilyError(
                    f"{where}: no_rope_layers lists {len(rope)} layers, num_hidden_layers "
                    f"is {layers}"
                )
            kinds = tuple("chunked" if r else "full" for r in rope)
        out.update(layer_attention=kinds, attention_chunk_size=chunk)
    return out


def _req(cfg: dict[str, Any], key: str, where: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise FamilyError(f"{where}: missing key {key!r}")
    return value


def int_key(cfg: dict[str, Any], key: str, default: int, where: str) -> int:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FamilyError(f"{where}: {key} must be a non-negative integer (got {value!r})")
    return value


def qwen_moe_fields(cfg: dict[str, Any], req: Any, layers: int, where: str) -> dict[str, Any]:
    """qwen2_moe / qwen3_moe: ``num_experts`` of ``moe_intermediate_size``, top
    ``num_experts_per_tok``; a layer is sparse unless listed in ``mlp_only_layers`` or
    ``(layer + 1) % decoder_sparse_step != 0`` (HF ``Qwen2MoeDecoderLayer``); qwen2_moe
    adds one shared expert of ``shared_expert_intermediate_size`` behind a sigmoid gate."""
    step = int_key(cfg, "decoder_sparse_step", 1, where) or 1
    only = cfg.get("mlp_only_layers") or []
    dense = sum(1 for i in range(layers) if i in only or (i + 1) % step)
    out: dict[str, Any] = {
        "num_experts": req("num_experts"),
        "experts_per_token": req("num_experts_per_tok"),
        "moe_ffn_hidden_size": req("moe_intermediate_size"),
        "num_dense_layers": dense,
    }
    shared = cfg.get("shared_expert_intermediate_size")
    if shared:
        out["shared_expert_ffn_hidden_size"] = shared
        out["shared_expert_gate"] = True
    return out


def deepseek_fields(cfg: dict[str, Any], req: Any, layers: int, where: str) -> dict[str, Any]:
    """deepseek_v2 / deepseek_v3: MLA (``kv_lora_rank``, ``q_lora_rank`` or null,
    ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``) and DeepSeekMoE
    (``n_routed_experts`` of ``moe_intermediate_size``, ``n_shared_experts`` fused into
    one shared MLP of ``n_shared * moe_intermediate_size``, top ``num_experts_per_tok``);
    layer ``i`` is MoE when ``i >= first_k_dense_replace and i % moe_layer_freq == 0``
    (HF ``DeepseekV2DecoderLayer``), the rest dense with ``intermediate_size``. The
    multi-token-prediction module of V3 (``num_nextn_predict_layers``) is not modelled."""
    nope, rope = req("qk_nope_head_dim"), req("qk_rope_head_dim")
    for key, value in (("qk_nope_head_dim", nope), ("qk_rope_head_dim", rope)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise FamilyError(f"{where}: {key} must be a positive integer (got {value!r})")
    out: dict[str, Any] = {
        "head_dim": nope + rope,
        "kv_lora_rank": req("kv_lora_rank"),
        "q_lora_rank": cfg.get("q_lora_rank"),
        "qk_rope_head_dim": rope,
        "v_head_dim": req("v_head_dim"),
    }
    routed = cfg.get("n_routed_experts")
    if not routed:
        return out
    first = int_key(cfg, "first_k_dense_replace", 0, where)
    freq = int_key(cfg, "moe_layer_freq", 1, where) or 1
    moe_f = req("moe_intermediate_size")
    shared = int_key(cfg, "n_shared_experts", 0, where)
    out.update(
        num_experts=routed,
        experts_per_token=req("num_experts_per_tok"),
        moe_ffn_hidden_size=moe_f,
        num_dense_layers=sum(1 for i in range(layers) if i < first or i % freq),
    )
    if shared:
        out["shared_expert_ffn_hidden_size"] = shared * moe_f
    return out
