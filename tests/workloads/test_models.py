"""ModelConfig, built-ins and the HuggingFace loader against published numbers."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from workloads.models import (
    SUPPORTED_HF_TYPES,
    ModelConfig,
    ModelError,
    get_model,
    list_models,
    load_hf_config,
    load_model,
    model_from_dict,
    model_ids,
)

# Exact totals of the official HF checkpoints (sum of safetensors tensor sizes, shown
# rounded on the model cards: 6.74B, 13.0B, 69.0B, 8.03B, 70.6B, 406B, 7.24B, 46.7B,
# 7.62B, 72.7B).
HF_EXACT = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-8b": 8_030_261_248,
    "llama3.1-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,
}

# Sizes as papers publish them (billions), with the citation.
PUBLISHED_B = {
    "llama2-7b": 6.74,  # Touvron et al. 2023 (7B), HF card 6.74B
    "llama2-70b": 68.98,  # HF card
    "llama3-8b": 8.03,  # HF card
    "llama3.1-405b": 405.0,  # Grattafiori et al. 2024 (405B)
    "mixtral-8x7b": 46.7,  # Jiang et al. 2024: 47B total (46.7B on the Mistral blog)
    "qwen2.5-7b": 7.61,  # Qwen2.5 technical report Table 1
    "qwen2.5-72b": 72.7,  # Qwen2.5 technical report Table 1
    "gpt3-175b": 174.6,  # Narayanan et al. 2021 Table 1 (Megatron vocab 51200)
    "megatron-22b": 22.0,  # Korthikanti et al. 2022 Table 3
    "turing-530b": 529.6,  # Narayanan et al. 2021 Table 1
    "megatron-1t": 1008.0,  # Narayanan et al. 2021 Table 1
}

ARCH_FIELDS = set(ModelConfig.model_fields) - {"id", "name", "family", "source"}


def arch(model: ModelConfig) -> dict:
    return {k: v for k, v in model.model_dump().items() if k in ARCH_FIELDS}


# --- built-ins -------------------------------------------------------------------------------


def test_builtin_ids_cover_the_brief():
    expected = {
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "llama3-8b",
        "llama3-70b",
        "llama3.1-8b",
        "llama3.1-70b",
        "llama3.1-405b",
        "mistral-7b",
        "mixtral-8x7b",
        "qwen2.5-7b",
        "qwen2.5-72b",
        "gpt3-175b",
        "megatron-22b",
        "turing-530b",
        "megatron-1t",
        "qwen3-8b",
        "qwen1.5-moe-a2.7b",
        "qwen3-30b-a3b",
        "deepseek-v2-lite",
        "deepseek-v2",
        "deepseek-v3",
    }
    assert set(model_ids()) == expected
    assert all(m.source for m in list_models())


@pytest.mark.parametrize("model_id", sorted(HF_EXACT))
def test_num_params_exactly_matches_hf_checkpoint(model_id):
    assert get_model(model_id).num_params == HF_EXACT[model_id]


@pytest.mark.parametrize("model_id", sorted(PUBLISHED_B))
def test_num_params_within_1pct_of_published(model_id):
    assert get_model(model_id).num_params / 1e9 == pytest.approx(PUBLISHED_B[model_id], rel=0.01)


def test_gpt3_brown_vocab_is_175b():
    # Brown et al. 2020 Table 2.1: same shape with the unpadded 50257-token vocabulary.
    brown = get_model("gpt3-175b").model_copy(update={"vocab_size": 50257})
    assert brown.num_params / 1e9 == pytest.approx(175.0, rel=0.01)


@pytest.mark.parametrize("model_id", ["gpt3-175b", "megatron-22b", "turing-530b", "megatron-1t"])
def test_megatron_models_match_narayanan_param_formula(model_id):
    # Narayanan et al. 2021 sec. 5.1: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h));
    # ours adds only the final LayerNorm (2h).
    m = get_model(model_id)
    nl, h, v, s = m.num_layers, m.hidden_size, m.vocab_size, m.max_seq_len
    formula = 12 * nl * h * h + 13 * nl * h + (v + s) * h
    assert m.num_params == formula + 2 * h


def test_mixtral_active_params():
    m = get_model("mixtral-8x7b")
    # Mistral AI: 46.7B total, 12.9B used per token.
    assert m.num_active_params == 12_879_925_248
    assert m.num_active_params / 1e9 == pytest.approx(12.9, rel=0.01)
    assert get_model("llama3-8b").num_active_params == get_model("llama3-8b").num_params


def test_megatron_head_dims_and_ffn():
    assert get_model("megatron-22b").head_dim == 96
    assert get_model("gpt3-175b").head_dim == 128
    assert get_model("turing-530b").ffn_hidden_size == 4 * 20480


def test_kv_cache_bytes_per_token():
    m = get_model("llama3-8b")
    # 2 (K and V) * 32 layers * 8 kv heads * 128 head_dim * 2 bytes = 128 KiB
    assert m.kv_cache_bytes_per_token(2) == 131072
    assert get_model("llama2-7b").kv_cache_bytes_per_token(2) == 2 * 32 * 4096 * 2
    with pytest.raises(ModelError, match="dtype_bytes"):
        m.kv_cache_bytes_per_token(0)


# --- FLOPs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", ["gpt3-175b", "megatron-22b", "turing-530b", "megatron-1t"])
def test_flops_per_token_is_narayanan_eq3(model_id):
    # Eq. (3): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per iteration, which counts the
    # layers' forward twice (full recomputation) but the LM head (6 B s V h) once. Model
    # FLOPs drop the recomputed forward, 24 B s l h^2 (1 + s/(6h)), leaving
    # 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
    m = get_model(model_id)
    nl, h, v, s, b = m.num_layers, m.hidden_size, m.vocab_size, 2048, 1
    eq3 = 96 * b * s * nl * h * h * (1 + s / (6 * h) + v / (16 * nl * h))
    recompute = 24 * b * s * nl * h * h * (1 + s / (6 * h))
    ours = m.flops_per_token(s, causal=False, training=True) * b * s
    assert ours == pytest.approx(eq3 - recompute, rel=1e-12)
    assert ours == pytest.approx(72 * b * s * nl * h * h * (1 + s / (6 * h) + v / (12 * nl * h)))


def test_flops_per_token_palm_form_and_causal_half():
    m = get_model("llama3-8b")
    s = 8192
    n = m.matmul_params_per_token
    attn_full = 12 * m.num_layers * m.num_heads * m.head_dim * s  # PaLM's 12 L H Q T
    assert m.flops_per_token(s, causal=False) == pytest.approx(6 * n + attn_full)
    assert m.flops_per_token(s, causal=True) == pytest.approx(6 * n + attn_full / 2)
    assert m.flops_per_token(s, causal=False, training=False) == pytest.approx(
        (6 * n + attn_full) / 3
    )
    # N excludes the input embedding gather (and norms) but includes the LM head.
    emb = m.vocab_size * m.hidden_size
    assert n == m.num_params - emb - (2 * m.num_layers + 1) * m.hidden_size
    with pytest.raises(ModelError, match="seq_len"):
        m.flops_per_token(0)


def test_moe_flops_count_active_experts_only():
    m = get_model("mixtral-8x7b")
    dense_equiv = m.num_active_params - m.vocab_size * m.hidden_size
    norms = (2 * m.num_layers + 1) * m.hidden_size
    assert m.matmul_params_per_token == dense_equiv - norms


# --- validation ------------------------------------------------------------------------------


def _llama_dict(**overrides):
    d = arch(get_model("llama3-8b")) | {"id": "x", "name": "x", "family": "llama", "source": "t"}
    return d | overrides


def test_head_dim_defaults_to_hidden_over_heads():
    d = _llama_dict()
    del d["head_dim"]
    assert model_from_dict(d).head_dim == 128


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"num_kv_heads": 5}, "multiple of num_kv_heads"),
        ({"num_experts": 2, "experts_per_token": 3}, "experts_per_token"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_layers": -1}, "num_layers"),
        ({"activation": "relu"}, "activation"),
        ({"moe_ffn_hidden_size": 1024}, "moe_ffn_hidden_size"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_invalid_configs_raise_one_line(overrides, needle):
    with pytest.raises(ModelError, match=needle) as info:
        model_from_dict(_llama_dict(**overrides))
    assert "\n" not in str(info.value)
    # Direct construction raises pydantic's ValidationError, also a ValueError.
    with pytest.raises(ValidationError):
        ModelConfig(**_llama_dict(**overrides))


def test_frozen():
    with pytest.raises(ValidationError):
        get_model("llama3-8b").num_layers = 3  # type: ignore[misc]


def test_unknown_id_lists_known_ids():
    with pytest.raises(ModelError) as info:
        load_model("llama9-1t")
    msg = str(info.value)
    assert "llama9-1t" in msg and "llama3-8b" in msg and "megatron-1t" in msg
    assert "\n" not in msg


# --- HuggingFace config.json -----------------------------------------------------------------

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
GPT2_SMALL = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "vocab_size": 50257,
}
MISTRAL_NEMO = {  # mistralai/Mistral-Nemo-Base-2407: head_dim 128 != 5120 / 32
    "architectures": ["MistralForCausalLM"],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "intermediate_size": 14336,
    "max_position_embeddings": 1024000,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 131072,
}


def write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    ("cfg", "builtin"),
    [
        (LLAMA3_8B, "llama3-8b"),
        (MISTRAL_7B_V01, "mistral-7b"),
        (MIXTRAL_8X7B, "mixtral-8x7b"),
        (QWEN25_7B, "qwen2.5-7b"),
    ],
)
def test_hf_config_equals_builtin(tmp_path, cfg, builtin):
    model = load_model(str(write(tmp_path, cfg)))
    assert arch(model) == arch(get_model(builtin))
    assert model.family == cfg["model_type"]
    assert model.num_params == HF_EXACT[builtin]


def test_hf_gpt2_small_is_124m(tmp_path):
    m = load_hf_config(write(tmp_path, GPT2_SMALL))
    assert (m.activation, m.norm, m.position) == ("gelu", "layernorm", "learned")
    assert m.tie_embeddings and m.qkv_bias and m.mlp_bias
    assert m.ffn_hidden_size == 4 * 768 and m.max_seq_len == 1024
    assert m.num_params == 124_439_808  # GPT-2 small, the HF checkpoint's total


def test_hf_gpt2_n_inner(tmp_path):
    m = load_hf_config(write(tmp_path, GPT2_SMALL | {"n_inner": 1000}))
    assert m.ffn_hidden_size == 1000


def test_hf_head_dim_respected(tmp_path):
    m = load_model(write(tmp_path, MISTRAL_NEMO))
    assert m.head_dim == 128 and m.q_size == 4096
    assert m.num_params / 1e9 == pytest.approx(12.2, rel=0.01)  # "12B", 12.2B on the HF card


def test_hf_folder_and_defaults(tmp_path):
    cfg = dict(LLAMA3_8B)
    del cfg["num_key_value_heads"], cfg["tie_word_embeddings"]  # HF defaults: = heads, False
    write(tmp_path, cfg)
    m = load_model(tmp_path)  # the folder holding config.json
    assert m.num_kv_heads == 32 and not m.tie_embeddings


def test_hf_unknown_model_type_lists_supported(tmp_path):
    with pytest.raises(ModelError) as info:
        load_model(str(write(tmp_path, LLAMA3_8B | {"model_type": "falcon"})))
    msg = str(info.value)
    assert "'falcon'" in msg and all(t in msg for t in SUPPORTED_HF_TYPES)


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        (LLAMA3_8B, "intermediate_size"),
        (LLAMA3_8B, "model_type"),
        (MIXTRAL_8X7B, "num_local_experts"),
        (GPT2_SMALL, "n_embd"),
    ],
)
def test_hf_missing_key_named(tmp_path, cfg, key):
    cfg = dict(cfg)
    del cfg[key]
    with pytest.raises(ModelError, match=f"missing key '{key}'") as info:
        load_model(str(write(tmp_path, cfg)))
    assert "\n" not in str(info.value)


def test_hf_invalid_json_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",\n "hidden_size": }')
    with pytest.raises(ModelError, match="not valid JSON") as info:
        load_model(str(path))
    assert "\n" not in str(info.value)
    path.write_text("[1, 2]")
    with pytest.raises(ModelError, match="JSON object"):
        load_model(str(path))


def test_hf_unreadable(tmp_path):
    with pytest.raises(ModelError, match="cannot read") as info:
        load_model(str(tmp_path / "nope" / "config.json"))
    assert "\n" not in str(info.value)


def test_hf_invalid_values_one_line(tmp_path):
    with pytest.raises(ModelError, match="num_kv_heads") as info:
        load_model(str(write(tmp_path, LLAMA3_8B | {"num_key_value_heads": 7})))
    assert "\n" not in str(info.value)


def test_mistral_v01_window_on_every_layer(tmp_path):
    """Mistral 7B v0.1's sliding_window 4096 (shorter than its 32768 positions) puts a
    window on every layer, as vLLM and transformers run it; a config without one (Nemo)
    keeps full attention."""
    v01 = load_model(str(write(tmp_path, MISTRAL_7B_V01)))
    assert v01.native_attn_pattern == "window:4096" and v01.sliding_layers == 32
    assert get_model("mistral-7b").native_attn_pattern == "window:4096"
    nemo = load_model(str(write(tmp_path, MISTRAL_NEMO)))
    assert nemo.native_attn_pattern is None and nemo.sliding_window is None
