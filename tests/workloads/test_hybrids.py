"""Linear-attention and state-space hybrids (Qwen3-Next, Kimi-Linear, Nemotron-H, Falcon-H1,
Granite 4.0-H, Jamba): parameter counts equal HF's, layer kinds read from the config, the
mean layer weighs attention, mixer and MLP by their layers, KV only in attention layers and
a constant recurrent state per sequence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.decompose import (
    decode_step_ops,
    params_per_tp_rank,
    prefill_ops,
    total_count,
    tp_shard,
)
from workloads.models import ModelError, load_hf_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "models"
DATA = Path(__file__).resolve().parent / "data"

# sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters()) on the meta
# device with transformers 5.24 (AutoConfig.for_model(model_type, **config)) for each
# examples/models/<name>.config.json (examples/models/hybrids_numel.json keeps the
# per-module shapes and the configs' sources); the hf-default-* files are transformers
# 5.24's own config defaults (Falcon-H1's and Granite 4.0-H's released configs were not
# found), cut to 2 layers
HF_NUMEL = {
    EXAMPLES / "qwen3-next-80b-a3b.config.json": 79_674_391_296,
    EXAMPLES / "kimi-linear-48b-a3b.config.json": 49_122_675_072,
    EXAMPLES / "nemotron-h-8b.config.json": 8_100_852_736,
    EXAMPLES / "nemotron-nano-9b-v2.config.json": 8_888_227_328,
    EXAMPLES / "jamba-v0.1.config.json": 51_570_323_328,
    DATA / "hf-default-falcon_h1.config.json": 1_515_228_928,
    DATA / "hf-default-granitemoehybrid.config.json": 2_622_102_400,
}
# (attention layers, mixer layers, MoE layers, dense-MLP layers, mixer kind)
LAYERS = {
    "qwen3-next-80b-a3b": (12, 36, 48, 0, "gdn"),
    "kimi-linear-48b-a3b": (7, 20, 26, 1, "kda"),
    "nemotron-h-8b": (4, 24, 0, 24, "mamba2"),
    "nemotron-nano-9b-v2": (4, 27, 0, 25, "mamba2"),
    "jamba-v0.1": (4, 28, 16, 16, "mamba"),
}


@pytest.mark.parametrize("path", sorted(HF_NUMEL), ids=lambda p: p.stem)
def test_parameter_counts_equal_hf_numel(path):
    m = load_hf_config(path)
    assert m.num_params == HF_NUMEL[path]
    p = params_per_tp_rank(m, 1)  # the mean layer (a whole number) adds up to the same
    total = m.num_layers * p["layer"] + p["embedding"] + p["final_norm"] + p["lm_head"]
    assert total == pytest.approx(m.num_params, abs=m.num_layers)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_kinds_read_from_the_config(name):
    m = load_hf_config(EXAMPLES / f"{name}.config.json")
    attn, mixer, moe, dense, kind = LAYERS[name]
    assert (m.attention_layers, m.mixer_layers, m.moe_layers, m.dense_layers) == (
        attn, mixer, moe, dense
    )  # fmt: skip
    assert m.mixer is not None and m.mixer.kind == kind


def test_nemotron_pattern_blocks_have_one_norm_and_one_mixer():
    m = load_hf_config(EXAMPLES / "nemotron-h-8b.config.json")
    assert m.norms_per_layer == 1 and m.activation == "relu2" and not m.gated_mlp
    # 24 Mamba-2 + 4 attention blocks without an MLP; 24 MLP blocks
    assert m.mlp_free_layers == 28 and m.attention_free_layers == 48


def test_kv_only_in_attention_layers_and_state_constant_in_context():
    m = load_hf_config(EXAMPLES / "qwen3-next-80b-a3b.config.json")
    # 12 full-attention layers x 2 KV heads x 256 x (K, V) x 2 bytes
    assert m.kv_cache_bytes_per_token(2) == 12 * 2 * 256 * 2 * 2
    mx = m.mixer
    # GDN state per layer: 32 value heads x 128 x 128, conv window 3 x (2 x 2048 + 4096)
    assert mx.state_elements == 32 * 128 * 128
    assert mx.conv_state_elements == 3 * 8192
    assert m.state_bytes_per_seq(2) == 36 * 2 * (32 * 128 * 128 + 3 * 8192)


def test_mean_layer_weighs_attention_and_mixer_by_their_layers():
    m = load_hf_config(EXAMPLES / "qwen3-next-80b-a3b.config.json")
    ops = prefill_ops(m, 1, 4096, tp=4)
    assert total_count(ops, "attn") == pytest.approx(m.attention_layers)
    assert total_count(ops, "mixer_scan") == pytest.approx(m.mixer_layers)
    assert total_count(ops, "mixer_in_proj") == pytest.approx(m.mixer_layers)
    # the gated attention's q_proj emits the gate too: q (and gate), k, v of one rank
    sh = tp_shard(m, 4)
    qkv = next(o for o in ops if o.name == "qkv_proj").op
    assert qkv.n == (2 * sh.heads + 2 * sh.kv_heads) * m.head_dim
    dec = decode_step_ops(m, 8, 1024, tp=4)
    assert total_count(dec, "mixer_state") == pytest.approx(m.mixer_layers)


def test_nemotron_mlp_and_region_collectives_in_their_blocks():
    m = load_hf_config(EXAMPLES / "nemotron-h-8b.config.json")
    ops = prefill_ops(m, 1, 1024, tp=2)
    assert total_count(ops, "mlp_up") == pytest.approx(m.dense_layers)
    # one all-reduce per block: after its mixer (28 blocks) or its MLP (24)
    reduces = [o for o in ops if o.name in ("tp_allreduce_attn", "tp_allreduce_mlp")]
    assert sum(o.count for o in reduces) == pytest.approx(52)


def test_tp_must_split_the_mixer_heads():
    m = load_hf_config(EXAMPLES / "nemotron-h-8b.config.json")
    odd = m.model_copy(update={"mixer": m.mixer.model_copy(update={"heads": 48})})
    with pytest.raises(ModelError, match="mamba2 mixer's 48 heads"):
        tp_shard(odd, 32)


def test_bad_hybrid_configs_are_one_line_errors(tmp_path):
    cfg = json.loads((EXAMPLES / "nemotron-h-8b.config.json").read_text())
    cfg["hybrid_override_pattern"] = cfg["hybrid_override_pattern"].replace("M", "X", 1)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="takes M, \\*, - and E") as err:
        load_hf_config(bad)
    assert "\n" not in str(err.value)
    cfg = json.loads((EXAMPLES / "qwen3-next-80b-a3b.config.json").read_text())
    del cfg["linear_num_value_heads"]
    bad.write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="missing key 'linear_num_value_heads'"):
        load_hf_config(bad)
