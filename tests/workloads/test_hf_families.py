"""gpt-oss, Gemma 2/3 and Phi-3/4 configs: parameter counts equal HF's, layer attention
read from the config, and the architecture's own sliding windows priced by default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.decompose import params_per_tp_rank
from workloads.models import ModelConfig, ModelError, load_hf_config, load_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"

# sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters()) for each
# examples/models/<name>.config.json, built on the meta device with transformers 5.24
# (AutoConfig.for_model(model_type, **config)); the MXFP4 quantization_config of gpt-oss
# dropped (numel counts the bf16 model)
HF_NUMEL = {
    "gpt-oss-20b": 20_914_757_184,
    "gpt-oss-120b": 116_829_156_672,
    "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984,
    "gemma-2-27b": 27_227_128_320,
    "gemma-3-1b": 999_885_952,
    "gemma-3-27b": 27_009_346_304,
    "phi-3-mini-4k": 3_821_079_552,
    "phi-3-medium-4k": 13_960_238_080,
    "phi-4": 14_659_507_200,
    "phi-3.5-moe": 41_873_153_344,  # LayerNorms with biases, an LM head bias
    # Llama4ForCausalLM(Llama4TextConfig(**text_config)): the language model only
    "llama-4-scout-17b-16e": 107_769_861_120,
    "llama-4-maverick-17b-128e": 400_711_848_960,
    "glm-4.5": 352_797_814_784,
    "glm-4.5-air": 106_852_245_504,
    "minimax-m2": 228_689_748_992,
    "kimi-k2": 1_026_408_209_408,  # deepseek_v3 with 384 experts
    "deepseek-v3.2": 671_877_929_216,  # transformers' DeepseekV32Config defaults
}
PATTERNS = {
    "gpt-oss-20b": "hybrid:dense_every=2,inner=window:128",
    "gemma-2-9b": "hybrid:dense_every=2,inner=window:4096",
    "gemma-3-27b": "hybrid:dense_every=6,inner=window:1024",
    "phi-3-mini-4k": "window:2047",
    "phi-4": None,
    "phi-3.5-moe": None,  # its 131072-token window is no shorter than its positions
    "llama-4-scout-17b-16e": "hybrid:dense_every=4,inner=chunk:8192",
    "deepseek-v3.2": "topk:k=16,block=128",  # DSA: 2048 key tokens per query
}


@pytest.mark.parametrize("name", sorted(HF_NUMEL))
def test_parameter_counts_equal_hf_numel(name):
    m = load_hf_config(EXAMPLES / f"{name}.config.json")
    assert m.num_params == HF_NUMEL[name]
    p = params_per_tp_rank(m, 1)  # the per-rank sizes add up to the same (a mean layer
    total = m.num_layers * p["layer"] + p["embedding"] + p["final_norm"] + p["lm_head"]
    assert total == pytest.approx(m.num_params, rel=1e-9)  # where dense and MoE layers mix)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_the_native_attention_pattern_follows_the_layers(name):
    m = load_hf_config(EXAMPLES / f"{name}.config.json")
    assert m.native_attn_pattern == PATTERNS[name]


def test_gemma3_pattern_key_and_layer_types_agree(tmp_path):
    cfg = json.loads((EXAMPLES / "gemma-3-1b.config.json").read_text())
    old = load_hf_config(EXAMPLES / "gemma-3-1b.config.json")
    assert old.layer_attention[:6] == ("sliding",) * 5 + ("full",)
    new = dict(cfg)
    new.pop("sliding_window_pattern")
    new["layer_types"] = [
        "full_attention" if a == "full" else "sliding_attention" for a in old.layer_attention
    ]
    path = tmp_path / "g3.json"
    path.write_text(json.dumps(new))
    assert load_hf_config(path).layer_attention == old.layer_attention
    # the multimodal config nests the text model; only that is priced
    mm = {"model_type": "gemma3", "text_config": {**cfg, "model_type": "gemma3_text"}}
    path.write_text(json.dumps(mm))
    assert load_hf_config(path).num_params == old.num_params


def test_gpt_oss_is_moe_with_biases_and_sinks():
    m = load_hf_config(EXAMPLES / "gpt-oss-20b.config.json")
    assert (m.num_experts, m.experts_per_token) == (32, 4)
    assert m.attention_sinks and m.router_bias and m.mlp_bias and m.qkv_bias
    assert m.sliding_layers == 12 and m.layer_attention[:2] == ("sliding", "full")
    # OpenAI's model card: 3.61B active parameters per token (the embedding table not
    # counted: a gather, not a matmul)
    assert round((m.num_active_params - m.embedding_params) / 1e7) == 361


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["sliding_attention"]}, "layer_types lists 1 layers"),
        ({"layer_types": ["local"] * 24}, "layer_types must list"),
        ({"num_local_experts": None}, "missing key 'num_local_experts'"),
    ],
)
def test_bad_family_configs_are_one_line(tmp_path, change, message):
    cfg = json.loads((EXAMPLES / "gpt-oss-20b.config.json").read_text())
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ModelError, match=message) as exc:
        load_model(str(path))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("name", "dense_layers", "ffn"),
    [("llama-4-scout-17b-16e", 0, 8192), ("llama-4-maverick-17b-128e", 24, 16384)],
)
def test_llama4_moe_layers_shared_expert_and_chunks(name, dense_layers, ffn):
    m = load_hf_config(EXAMPLES / f"{name}.config.json")
    assert (m.experts_per_token, m.num_dense_layers, m.ffn_hidden_size) == (1, dense_layers, ffn)
    assert m.moe_ffn_hidden_size == m.shared_expert_ffn_hidden_size == 8192
    assert m.layer_attention[:4] == ("chunked",) * 3 + ("full",)  # NoPE every 4th layer
    assert m.attention_chunk_size == 8192
    # Meta's model card: 17B active parameters per token
    assert round(m.num_active_params / 1e9) == 17


def test_dsa_indexer_parameters_and_validation():
    m = load_hf_config(EXAMPLES / "deepseek-v3.2.config.json")
    # wq_b 1536 x 64 x 128, wk 7168 x 128, its LayerNorm, weights_proj 7168 x 64
    assert m.indexer_params == 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    with pytest.raises(ValueError, match="DSA needs"):
        ModelConfig.model_validate({**m.model_dump(), "index_topk": None})
