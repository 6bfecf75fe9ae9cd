"""HuggingFace ``config.json`` keys of the linear-attention and state-space hybrids:
Qwen3-Next, Kimi-Linear, Nemotron-H, Falcon-H1, Granite 4.0-H and Jamba
(``load_hf_config`` in :mod:`workloads.models` dispatches here).

Each function returns the :class:`~workloads.models.ModelConfig` fields beyond the
Llama-style ones: the :class:`~workloads.mixers.LinearMixer` of the non-attention layers
and how many layers carry a mixer, no attention or no MLP (the mean layer weighs each part
by its layers' share; where in the stack a kind sits does not change the sums). Module
names follow transformers 5.24's modeling files; parameter counts equal their ``numel``
(``tests/workloads/test_hybrids.py``).
"""

from __future__ import annotations

import math
from typing import Any

from workloads.hf_families import (
    FAMILY_TYPES,
    FamilyError,
    _req,
    deepseek_fields,
    family_fields,
    qwen_moe_fields,
)

HYBRID_TYPES = (
    "qwen3_next", "kimi_linear", "nemotron_h", "falcon_h1", "granitemoehybrid", "jamba",
)  # fmt: skip


def _mixer(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, **fields}


def _layer_list(types: Any, layers: int, key: str, where: str) -> list[str]:
    if not isinstance(types, list | str) or len(types) != layers:
        n = len(types) if isinstance(types, list | str) else "no"
        raise FamilyError(f"{where}: {key} lists {n} layers, num_hidden_layers is {layers}")
    return list(types)


def hybrid_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Fill the Llama-style keys some hybrids' configs name otherwise: Nemotron-H's layer
    count from its pattern, Kimi-Linear's context from ``model_max_length``."""
    kind, out = cfg.get("model_type"), dict(cfg)
    if kind == "nemotron_h" and out.get("num_hidden_layers") is None:
        blocks = out.get("hybrid_override_pattern") or out.get("layers_block_type")
        if isinstance(blocks, list | str):
            out["num_hidden_layers"] = len(blocks)
    if kind == "kimi_linear" and out.get("max_position_embeddings") is None:
        # KimiLinearConfig's model_max_length, default 1048576 (transformers 5.24)
        out["max_position_embeddings"] = out.get("model_max_length") or 1048576
    return out


def hybrid_fields(model_type: str, cfg: dict[str, Any], layers: int, where: str) -> dict:
    """Fields of ``model_type`` (one of :data:`HYBRID_TYPES`) beyond the Llama ones."""
    return _FAMILIES[model_type](cfg, layers, where)


def _qwen3_next(cfg: dict[str, Any], layers: int, where: str) -> dict:
    """Qwen3NextDecoderLayer: Gated DeltaNet (``linear_attention``) or gated attention
    (q_proj emits a per-channel sigmoid gate; per-head q/k norms) per ``layer_types``,
    else every ``full_attention_interval``-th layer full; the MLP as Qwen2-MoE's (512
    experts, a gated shared expert)."""
    types = cfg.get("layer_types")
    if types is None:
        every = cfg.get("full_attention_interval") or 4
        types = ["full_attention" if (i + 1) % every == 0 else "linear" for i in range(layers)]
    linear = sum(t != "full_attention" for t in _layer_list(types, layers, "layer_types", where))
    out = qwen_moe_fields(cfg, lambda k: _req(cfg, k, where), layers, where)
    mixer = _mixer(
        "gdn",
        heads=_req(cfg, "linear_num_value_heads", where),
        head_dim=_req(cfg, "linear_value_head_dim", where),
        key_heads=_req(cfg, "linear_num_key_heads", where),
        key_dim=_req(cfg, "linear_key_head_dim", where),
        conv_kernel=cfg.get("linear_conv_kernel_dim") or 4,
    )
    return {
        **out, "qk_norm": True, "attention_output_gate": True, "mixer": mixer,
        "mixer_layers": linear, "attention_free_layers": linear,
    }  # fmt: skip


def _kimi_linear(cfg: dict[str, Any], layers: int, where: str) -> dict:
    """KimiLinearDecoderLayer: Kimi Delta Attention on ``linear_attn_config.kda_layers``
    (1-based; or ``layer_types``), MLA on the others; DeepSeek-V3-style MoE (the first
    ``first_k_dense_replace`` layers dense)."""
    lac = cfg.get("linear_attn_config") or {}
    if cfg.get("layer_types") is not None:
        types = _layer_list(cfg["layer_types"], layers, "layer_types", where)
        kda = sum(t == "linear_attention" for t in types)
    else:
        kda = len(_req(lac, "kda_layers", where))
    ds_cfg = {
        **cfg,
        "n_routed_experts": cfg.get("num_experts"),
        "num_experts_per_tok": cfg.get("num_experts_per_token") or cfg.get("num_experts_per_tok"),
        "n_shared_experts": cfg.get("num_shared_experts"),
    }
    out = deepseek_fields(ds_cfg, lambda k: _req(ds_cfg, k, where), layers, where)
    if cfg.get("mlp_layer_types") is not None:
        kinds = _layer_list(cfg["mlp_layer_types"], layers, "mlp_layer_types", where)
        out["num_dense_layers"] = sum(k == "dense" for k in kinds)
    heads = lac.get("num_heads") or cfg.get("linear_num_heads")
    heads = heads or _req(cfg, "num_attention_heads", where)
    dim = lac.get("head_dim") or cfg.get("linear_head_dim") or 128
    mixer = _mixer(
        "kda", heads=heads, head_dim=dim, key_heads=heads, key_dim=dim, gate_rank=dim,
        conv_kernel=lac.get("short_conv_kernel_size") or cfg.get("linear_conv_kernel_dim") or 4,
    )  # fmt: skip
    return {**out, "mixer": mixer, "mixer_layers": kda, "attention_free_layers": kda}


def _mamba2(cfg: dict[str, Any], where: str, prefix: str, inner: int, **kw: Any) -> dict:
    """A Mamba-2 mixer from the ``mamba_*`` keys (Falcon-H1, Granite 4.0-H)."""
    heads = _req(cfg, f"{prefix}n_heads", where)
    if inner % heads:
        raise FamilyError(f"{where}: the Mamba width {inner} is not a multiple of {heads} heads")
    return _mixer(
        "mamba2", heads=heads, head_dim=inner // heads,
        key_heads=cfg.get(f"{prefix}n_groups") or 1, key_dim=_req(cfg, f"{prefix}d_state", where),
        conv_kernel=cfg.get(f"{prefix}d_conv") or 4, conv_bias=cfg.get(f"{prefix}conv_bias", True),
        proj_bias=bool(cfg.get(f"{prefix}proj_bias", False)),
        chunk_size=cfg.get(f"{prefix}chunk_size") or 256, **kw,
    )  # fmt: skip


def _nemotron_h(cfg: dict[str, Any], layers: int, where: str) -> dict:
    """NemotronHBlock: one pre-norm and ONE mixer per block, per
    ``hybrid_override_pattern`` (``M`` Mamba-2, ``*`` attention, ``-`` squared-ReLU MLP,
    ``E`` MoE; or ``layers_block_type``). Attention has no position encoding (RoPE ops
    priced anyway: a few elementwise kernels)."""
    names = {"mamba": "M", "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E"}
    names["linear_attention"] = "M"
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None:
        key = "layers_block_type"
        blocks = _layer_list(_req(cfg, key, where), layers, key, where)
        pattern = "".join(names.get(b, "?") for b in blocks)
    pattern = "".join(_layer_list(pattern, layers, "hybrid_override_pattern", where))
    if set(pattern) - set("M*-E"):
        raise FamilyError(f"{where}: hybrid_override_pattern takes M, *, - and E (got {pattern!r})")
    heads, dim = _req(cfg, "mamba_num_heads", where), _req(cfg, "mamba_head_dim", where)
    mixer = _mixer(
        "mamba2", heads=heads, head_dim=dim, key_heads=cfg.get("n_groups") or 1,
        key_dim=_req(cfg, "ssm_state_size", where), conv_kernel=cfg.get("conv_kernel") or 4,
        conv_bias=cfg.get("use_conv_bias", True), proj_bias=bool(cfg.get("mamba_proj_bias")),
        chunk_size=cfg.get("chunk_size") or 128,
        state_fp32=cfg.get("mamba_ssm_cache_dtype") == "float32",
    )  # fmt: skip
    out: dict[str, Any] = {
        "head_dim": cfg.get("head_dim") or cfg.get("attention_head_dim"),
        "activation": "relu2",
        "norms_per_layer": 1,
        "mixer": mixer,
        "mixer_layers": pattern.count("M"),
        "attention_free_layers": layers - pattern.count("*"),
        "mlp_free_layers": pattern.count("M") + pattern.count("*"),
    }
    if "E" in pattern:
        width = _req(cfg, "moe_intermediate_size", where)
        shared = (cfg.get("n_shared_experts") or 0) * (
            cfg.get("moe_shared_expert_intermediate_size") or width
        )
        out.update(
            num_experts=_req(cfg, "n_routed_experts", where),
            experts_per_token=_req(cfg, "num_experts_per_tok", where),
            moe_ffn_hidden_size=width,
            num_dense_layers=pattern.count("-"),
        )
        if shared:
            out["shared_expert_ffn_hidden_size"] = shared
    return out


def _falcon_h1(cfg: dict[str, Any], layers: int, where: str) -> dict:
    """FalconH1DecoderLayer: attention and a Mamba-2 mixer in parallel on every layer
    (``mamba_d_ssm`` wide, else ``mamba_expand * hidden``; its gated RMSNorm only with
    ``mamba_rms_norm``), then a SwiGLU MLP; the multipliers have no parameters."""
    inner = cfg.get("mamba_d_ssm") or int(cfg.get("mamba_expand", 2) * cfg["hidden_size"])
    mixer = _mamba2(cfg, where, "mamba_", inner, out_norm=bool(cfg.get("mamba_rms_norm")))
    return {"mixer": mixer, "mixer_layers": layers}


def _granite_hybrid(cfg: dict[str, Any], layers: int, where: str) -> dict:
    """GraniteMoeHybridDecoderLayer: Mamba-2 (``mamba_expand * hidden`` wide) or attention
    per ``layer_types``; ``num_local_experts`` SwiGLU experts of ``intermediate_size`` with
    a bias-free router beside a shared SwiGLU MLP of ``shared_intermediate_size`` (dense
    models: that MLP alone)."""
    types = _layer_list(_req(cfg, "layer_types", where), layers, "layer_types", where)
    mamba = sum(t in ("mamba", "linear_attention") for t in types)
    inner = int(cfg.get("mamba_expand", 2) * cfg["hidden_size"])
    out: dict[str, Any] = {"mixer": _mamba2(cfg, where, "mamba_", inner)} if mamba else {}
    out.update(mixer_layers=mamba, attention_free_layers=mamba)
    experts = cfg.get("num_local_experts") or 0
    shared = _req(cfg, "shared_intermediate_size", where)
    if experts > 1:
        out.update(
            num_experts=experts, experts_per_token=_req(cfg, "num_experts_per_tok", where),
            moe_ffn_hidden_size=_req(cfg, "intermediate_size", where),
            shared_expert_ffn_hidden_size=shared,
        )  # fmt: skip
    else:
        out["ffn_hidden_size"] = shared
    return out


def _jamba(cfg: dict[str, Any], layers: int, where: str) -> dict:
    """JambaAttentionDecoderLayer every ``attn_layer_period`` layers from
    ``attn_layer_offset``, JambaMambaDecoderLayer (Mamba-1 with dt/B/C RMSNorms) on the
    rest; MoE (SwiGLU experts of ``intermediate_size``, bias-free router) every
    ``expert_layer_period`` layers from ``expert_layer_offset``, dense SwiGLU elsewhere."""
    ap, ao = cfg.get("attn_layer_period", 8), cfg.get("attn_layer_offset", 4)
    ep, eo = cfg.get("expert_layer_period", 2), cfg.get("expert_layer_offset", 1)
    attn = sum(i % ap == ao for i in range(layers))
    moe = sum(i % ep == eo for i in range(layers))
    hidden = cfg["hidden_size"]
    inner = int(cfg.get("mamba_expand", 2) * hidden)
    rank = cfg.get("mamba_dt_rank", "auto")
    rank = math.ceil(hidden / 16) if rank == "auto" else rank
    mixer = _mixer(
        "mamba", heads=1, head_dim=inner, key_heads=1, key_dim=cfg.get("mamba_d_state", 16),
        conv_kernel=cfg.get("mamba_d_conv", 4), conv_bias=cfg.get("mamba_conv_bias", True),
        proj_bias=bool(cfg.get("mamba_proj_bias", False)), dt_rank=rank, out_norm=False,
        dt_norms=True,
    )  # fmt: skip
    out: dict[str, Any] = {
        "mixer": mixer, "mixer_layers": layers - attn, "attention_free_layers": layers - attn,
    }  # fmt: skip
    experts = cfg.get("num_experts") or 1
    if experts > 1 and moe:
        out.update(
            num_experts=experts, experts_per_token=_req(cfg, "num_experts_per_tok", where),
            num_dense_layers=layers - moe,
        )  # fmt: skip
    return out


_FAMILIES = {
    "qwen3_next": _qwen3_next,
    "kimi_linear": _kimi_linear,
    "nemotron_h": _nemotron_h,
    "falcon_h1": _falcon_h1,
    "granitemoehybrid": _granite_hybrid,
    "jamba": _jamba,
}


def family_extra(model_type: str, cfg: dict[str, Any], req: Any, layers: int, where: str) -> dict:
    """The fields of a family beyond the Llama-style ones (MoE, MLA, local layers, mixers)."""
    if model_type in ("qwen2_moe", "qwen3_moe"):
        return qwen_moe_fields(cfg, req, layers, where)
    if model_type in ("deepseek_v2", "deepseek_v3", "deepseek_v32"):
        out = deepseek_fields(cfg, req, layers, where)
        if model_type == "deepseek_v32":  # DSA's lightning indexer and its top-k
            out.update({k: req(k) for k in ("index_n_heads", "index_head_dim", "index_topk")})
        return out
    if model_type in FAMILY_TYPES:
        return family_fields(model_type, cfg, layers, where)
    if model_type in HYBRID_TYPES:
        return hybrid_fields(model_type, cfg, layers, where)
    return {}
