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

FAMILY_TYPES = ("gpt_oss", "gemma2", "gemma3_text", "gemma3", "phi3")

_LAYER_KIND = {"sliding_attention": "sliding", "full_attention": "full"}


class FamilyError(ValueError):
    """A config of these families that cannot be read; one line."""


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's multimodal config nests the language model under ``text_config``; only
    the text model is priced (its vision tower is not)."""
    if cfg.get("model_type") == "gemma3" and isinstance(cfg.get("text_config"), dict):
        return {**cfg["text_config"], "model_type": "gemma3", "vocab_size": _vocab(cfg)}
    return cfg


def _vocab(cfg: dict[str, Any]) -> Any:
    text = cfg.get("text_config") or {}
    return text.get("vocab_size") or cfg.get("vocab_size") or 262208


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
                f"{where}: layer_types must list 'sliding_attention' / 'full_attention' "
                f"(got {types!r})"
            )
        if len(types) != layers:
            raise FamilyError(
                f"{where}: layer_types lists {len(types)} layers, num_hidden_layers is {layers}"
            )
        kinds = tuple(_LAYER_KIND[t] for t in types)
        return kinds if "sliding" in kinds else None
    if not window:
        return None
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
    if out.get("layer_attention") is not None:
        out["sliding_window"] = window
    return out


def _req(cfg: dict[str, Any], key: str, where: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise FamilyError(f"{where}: missing key {key!r}")
    return value
