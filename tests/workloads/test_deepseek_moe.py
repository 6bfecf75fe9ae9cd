"""DeepSeek-V2/V3 (MLA + DeepSeekMoE), Qwen2-MoE and Qwen3 against published numbers and
the papers' formulas; routing skew (moe_imbalance)."""

from __future__ import annotations

import json

import pytest

from workloads.decompose import decode_step_ops, layer_forward_ops, prefill_ops
from workloads.decompose.mla import attention_dims
from workloads.decompose.shard import mla_params_per_rank, params_per_tp_rank, tp_shard
from workloads.flops import op_flops
from workloads.models import ModelError, get_model, load_hf_config, with_moe_imbalance

# Published totals / activated parameters per token (billions): DeepSeek-V2 paper
# (arXiv 2405.04434) abstract and sec. 3.1.2 (236B / 21B), DeepSeek-V2-Lite model card
# (15.7B / 2.4B), DeepSeek-V3 report (arXiv 2412.19437) abstract (671B / 37B; the HF
# checkpoint's 685B adds the 14B multi-token-prediction module, not modelled), Qwen1.5-MoE
# blog (14.3B / 2.7B), Qwen3 report Table 2 (Qwen3-30B-A3B 30.5B / 3.3B).
PUBLISHED = {
    "deepseek-v2-lite": (15.7, 2.4),
    "deepseek-v2": (236.0, 21.0),
    "deepseek-v3": (671.0, 37.0),
    "qwen1.5-moe-a2.7b": (14.3, 2.7),
    "qwen3-30b-a3b": (30.5, 3.3),
}


@pytest.mark.parametrize("model_id", sorted(PUBLISHED))
def test_total_and_activated_params_match_published(model_id):
    m = get_model(model_id)
    total_b, active_b = PUBLISHED[model_id]
    assert m.num_params / 1e9 == pytest.approx(total_b, rel=0.01)
    # DeepSeek's activated counts leave out the input embedding (a gather, no matmul):
    # the matmul weights a token goes through, LM head included
    active = m.matmul_params_per_token if model_id.startswith("deepseek") else m.num_active_params
    assert active / 1e9 == pytest.approx(active_b, rel=0.05)


def test_deepseek_v2_mla_params_from_the_paper():
    # DeepSeek-V2 eqs. 9-18 per layer: W^DQ (d x d_c'), W^UQ (d_c' x n_h(d_h + d_h^R)),
    # W^DKV + W^KR (d x (d_c + d_h^R)), W^UK + W^UV (d_c x n_h(d_h + d_v)), W^O (n_h d_v x d),
    # plus the RMSNorms on c_Q (d_c') and c_KV (d_c)
    m = get_model("deepseek-v2")
    d, nh, dc, dq, dr, dh, dv = 5120, 128, 512, 1536, 64, 128, 128
    expected = d * dq + dq * nh * (dh + dr) + d * (dc + dr) + dc * nh * (dh + dv) + nh * dv * d
    assert m.attention_matmul_params == expected
    assert m.attention_params == expected + dc + dq
    assert mla_params_per_rank(m, 1) == m.attention_params


def test_kv_cache_is_latent_plus_rope_key_per_layer():
    m = get_model("deepseek-v2")
    assert m.kv_elements_per_token_per_layer == 576  # d_c 512 + d_h^R 64 (paper Table 1)
    assert m.kv_cache_bytes_per_token(2) == 60 * 576 * 2
    # the same model under standard MHA would cache 2 n_h d_h = 2 * 128 * 192 per layer
    assert m.kv_elements_per_token_per_layer < 2 * m.num_heads * m.head_dim / 80


def test_mla_decode_is_absorbed_and_prefill_expanded():
    m = get_model("deepseek-v2-lite")
    sh = tp_shard(m, 2)
    dec = attention_dims(m, sh, "decode")
    assert dec == {"heads_q": 8, "heads_kv": 1, "head_dim": 288}  # K+V = 576 cached
    pre = attention_dims(m, sh, "prefill")
    assert pre == {"heads_q": 8, "heads_kv": 8, "head_dim": 160}  # (192 + 128) / 2
    ops = {o.name: o for o in decode_step_ops(m, 2, 1000, tp=2)}
    attn = ops["attn"].op
    assert (attn.heads_q, attn.heads_kv, attn.head_dim) == (8, 1, 288)
    # KV bytes the decode kernel reads per token and layer: the latent, once
    assert attn.heads_kv * attn.head_dim * 2 == m.kv_elements_per_token_per_layer
    # V2-Lite has no q_lora_rank: a plain q_proj; the replicated kv_a_proj is whole
    assert ops["q_proj"].op.n == 8 * 192 and "q_b_proj" not in ops
    assert ops["kv_a_proj"].op.n == 512 + 64
    assert ops["kv_b_proj"].op.k == 512 and ops["kv_b_proj"].op.n == 8 * (128 + 128)


def _gemm_flops_per_token(ops, tokens):
    return sum(o.count * op_flops(o.op) for o in ops if o.op.op.value == "gemm") / tokens


@pytest.mark.parametrize(
    ("model_id", "batch"),
    [("deepseek-v2-lite", 2048), ("deepseek-v2", 5120), ("deepseek-v3", 2048)],
)
def test_layer_gemm_flops_are_two_per_activated_weight(model_id, batch):
    # every expert touched, batch * top_k / experts a multiple of the grouped kernel's
    # 64-row M tile: the grouped GEMMs run no padding rows
    m = get_model(model_id)
    ops = decode_step_ops(m, batch, 512)
    assert _gemm_flops_per_token(ops, batch) == pytest.approx(2 * m.matmul_params_per_token)


def test_mla_prefill_attention_flops_match_the_paper_dims():
    m = get_model("deepseek-v2-lite")
    s = 1024
    (attn,) = [o for o in prefill_ops(m, 1, s) if o.name == "attn"]
    # causal Q K^T at 192 and P V at 128 over 16 heads and 27 layers
    expected = 27 * 16 * 2 * s * s * (192 + 128) / 2
    assert attn.count * op_flops(attn.op) == pytest.approx(expected)


def test_dense_layers_and_shared_experts_in_the_mean_layer():
    m = get_model("deepseek-v3")  # 3 dense layers of 61
    ops = {o.name: o for o in layer_forward_ops(m, 1, 256)}
    assert ops["mlp_up"].count == pytest.approx(3 / 61)
    assert ops["mlp_up"].op.n == 2 * 18432
    assert ops["shared_up"].count == pytest.approx(58 / 61)
    assert ops["shared_up"].op.n == 2 * 2048
    assert ops["router"].op.n == 256
    # one grouped launch in the MoE layers' share; 256 * 8 picks touch all 256 experts
    # (256 (1 - (31/32)^256) = 255.9), 8 rows each padded to the 16-row tile
    up = ops["expert_up"]
    assert up.count == pytest.approx(58 / 61) and up.op.batch == 256 and up.op.m == 16


def test_params_per_rank_sum_to_the_model():
    for model_id in ("deepseek-v2", "deepseek-v3", "qwen1.5-moe-a2.7b"):
        m = get_model(model_id)
        for tp in (1, 2, 4, 8):
            p = params_per_tp_rank(m, tp)
            if tp == 1:
                total = m.num_layers * p["layer"] + p["embedding"] + p["final_norm"]
                assert total + p["lm_head"] == pytest.approx(m.num_params, abs=m.num_layers)


def test_imbalance_prices_the_busiest_expert():
    m = get_model("mixtral-8x7b")
    skewed = with_moe_imbalance(m, 2.0)
    rows = {o.name: o.op.m for o in layer_forward_ops(m, 1, 512)}
    rows_skew = {o.name: o.op.m for o in layer_forward_ops(skewed, 1, 512)}
    assert rows["expert_up"] == 512 * 2 // 8
    assert rows_skew["expert_up"] == 2 * rows["expert_up"]
    # never more rows than tokens: a token visits an expert once
    capped = with_moe_imbalance(m, 100.0)
    assert {o.name: o.op.m for o in layer_forward_ops(capped, 1, 512)}["expert_up"] == 512
    assert with_moe_imbalance(m, 1.0) is m


def test_imbalance_on_a_dense_model_is_one_line_error():
    with pytest.raises(ModelError, match="dense"):
        with_moe_imbalance(get_model("llama3-8b"), 1.5)


# --- HF config.json --------------------------------------------------------------------------

V2_LITE = {
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "vocab_size": 102400,
    "max_position_embeddings": 163840,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "tie_word_embeddings": False,
}


def _write(tmp_path, cfg):
    path = tmp_path / "DeepSeek-V2-Lite" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(cfg))
    return path


def test_hf_deepseek_v2_lite_matches_builtin(tmp_path):
    loaded = load_hf_config(_write(tmp_path, V2_LITE))
    builtin = get_model("deepseek-v2-lite")
    skip = {"id", "name", "family", "source"}
    assert {k: v for k, v in loaded.model_dump().items() if k not in skip} == {
        k: v for k, v in builtin.model_dump().items() if k not in skip
    }
    assert loaded.family == "deepseek_v2" and loaded.id == "DeepSeek-V2-Lite"


def test_hf_deepseek_v3_and_layer_freq(tmp_path):
    cfg = {
        **V2_LITE, "model_type": "deepseek_v3", "q_lora_rank": 1536,
        "first_k_dense_replace": 3, "moe_layer_freq": 2,
    }  # fmt: skip
    m = load_hf_config(_write(tmp_path, cfg))
    # MoE when layer >= 3 and layer % 2 == 0: layers 4, 6, ..., 26 -> 12 of 27
    assert m.moe_layers == 12 and m.num_dense_layers == 15
    assert m.q_lora_rank == 1536


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"kv_lora_rank": None}, "missing key 'kv_lora_rank'"),
        ({"qk_rope_head_dim": "64"}, "qk_rope_head_dim must be a positive integer"),
        ({"first_k_dense_replace": -1}, "first_k_dense_replace must be a non-negative"),
        ({"first_k_dense_replace": 27}, "num_dense_layers"),
        ({"num_experts_per_tok": 65}, "experts_per_token"),
        ({"moe_intermediate_size": None}, "missing key 'moe_intermediate_size'"),
        ({"model_type": "deepseek_v9"}, "unsupported model_type 'deepseek_v9'"),
    ],
)
def test_bad_deepseek_configs_are_one_line_errors(tmp_path, change, match):
    with pytest.raises(ModelError, match=match) as info:
        load_hf_config(_write(tmp_path, {**V2_LITE, **change}))
    assert "\n" not in str(info.value)


def test_hf_qwen_moe_and_qwen3(tmp_path):
    qwen = {
        "model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
        "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "vocab_size": 151936, "max_position_embeddings": 8192,
    }  # fmt: skip
    path = tmp_path / "q.json"
    path.write_text(json.dumps(qwen))
    m = load_hf_config(path)
    assert m.num_params == get_model("qwen1.5-moe-a2.7b").num_params
    path.write_text(json.dumps({**qwen, "mlp_only_layers": [0, 5]}))
    assert load_hf_config(path).num_dense_layers == 2
    dense = {k: v for k, v in qwen.items() if "expert" not in k and "sparse" not in k}
    dense = {**dense, "model_type": "qwen3", "head_dim": 128, "num_key_value_heads": 8}
    path.write_text(json.dumps(dense))
    q3 = load_hf_config(path)
    assert q3.qk_norm and not q3.qkv_bias
    assert q3.attention_params == 2048 * 128 * (16 + 2 * 8) + 16 * 128 * 2048 + 2 * 128
