"""workloads.decompose.quant and the quantised serving templates: storage bytes of each
weight format, the KV-cache dtype spellings, which GEMMs a quantised checkpoint changes."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.decompose import serving_templates, tp_shard
from workloads.decompose.quant import (
    QUANTISED_GEMMS,
    WEIGHT_FORMATS,
    kv_storage_dtype,
    quantised_params_per_layer,
    weight_format,
    weight_only_bytes,
)
from workloads.models import ModelError, load_model


def test_storage_bytes_per_weight_include_group_scales():
    # Marlin's README: 4-bit weights with fp16 scales per 128 are 4.125 bits per weight
    assert weight_format("int4").bytes_per_weight * 8 == pytest.approx(4.125)
    assert weight_format("int8").bytes_per_weight == pytest.approx(1 + 2 / 128)
    assert weight_format("fp8").bytes_per_weight == 1.0  # per-tensor scale
    assert weight_format("bf16").bytes_per_weight == weight_format("fp16").bytes_per_weight == 2
    assert weight_only_bytes(4) == weight_format("int4").bytes_per_weight
    assert [n for n, f in WEIGHT_FORMATS.items() if f.weight_only] == ["int8", "int4", "mxfp4"]
    # OCP MX: e2m1 elements with one e8m0 scale per 32, the MoE experts only
    assert weight_format("mxfp4").bytes_per_weight * 8 == pytest.approx(4.25)
    assert weight_format("mxfp4").experts_only and not weight_format("int4").experts_only
    with pytest.raises(ModelError, match="allowed: bf16, fp16, fp8, int8, int4, mxfp4"):
        weight_format("int3")


@pytest.mark.parametrize(
    ("given", "stored"),
    [("auto", "bf16"), (None, "bf16"), ("fp8", "fp8"), ("fp8_e4m3", "fp8"),
     ("fp8_e5m2", "fp8"), ("fp16", "fp16")],
)  # fmt: skip
def test_kv_cache_dtype_spellings(given, stored):
    assert kv_storage_dtype(given, "bf16") == stored
    assert kv_storage_dtype("auto", "fp16") == "fp16"


def test_bad_kv_cache_dtype_is_one_line():
    with pytest.raises(ModelError, match=r"^unknown kv cache dtype 'int8'; allowed: auto, "):
        kv_storage_dtype("int8", "bf16")


def test_quantised_params_are_the_linear_weights():
    m = load_model("llama3-8b")
    h, d, f = m.hidden_size, m.head_dim, m.ffn_hidden_size
    per_layer = h * (m.num_heads + 2 * m.num_kv_heads) * d + m.num_heads * d * h + 3 * h * f
    assert quantised_params_per_layer(m, 1) == per_layer  # 218.1M: all but the norms
    assert quantised_params_per_layer(m, 2) == per_layer // 2
    # Mixtral: every expert is quantised, the router is not
    x = load_model("mixtral-8x7b")
    q = quantised_params_per_layer(x, 1)
    assert q == x.layer_params - 2 * x.norm_params - x.router_params


def _by_name(tpls):
    return {t.name: t for t in tpls}


def test_weight_only_marks_the_quantised_gemms_only():
    m = load_model("llama3-8b")
    sh = tp_shard(m, 1)
    base = serving_templates(m, sh)
    q = serving_templates(m, sh, weight_dtype="int4")
    layer = _by_name(q["layer"])
    for name in ("qkv_proj", "o_proj", "mlp_up", "mlp_down"):
        assert layer[name].weight_bits == 4
        x = np.array([7])
        assert layer[name].fields_at(x)["dtype"] == "bf16"  # computes in bf16
    assert q["seq"][0].name == "lm_head" and q["seq"][0].weight_bits is None
    assert [t.name for t in q["layer"]] == [t.name for t in base["layer"]]  # no new kernels


def test_fp8_runs_fp8_gemms_after_a_quantisation_kernel():
    m = load_model("llama3-8b")
    sh = tp_shard(m, 1)
    q = serving_templates(m, sh, weight_dtype="fp8")
    names = [t.name for t in q["layer"]]
    layer = _by_name(q["layer"])
    x = np.array([10])
    for gemm in ("qkv_proj", "o_proj", "mlp_up", "mlp_down"):
        assert layer[gemm].fields_at(x)["dtype"] == "fp8"
        quant = layer[f"{gemm}_quant"]
        assert names.index(f"{gemm}_quant") == names.index(gemm) - 1
        k = layer[gemm].fields_at(x)["k"]
        assert quant.traffic_bytes == 3.0 * k  # reads bf16, writes fp8
    assert _by_name(q["seq"])["lm_head"].fields_at(np.array([1]))["dtype"] == "bf16"
    moe = serving_templates(load_model("mixtral-8x7b"), tp_shard(load_model("mixtral-8x7b"), 2),
                            weight_dtype="fp8")  # fmt: skip
    ml = _by_name(moe["layer"])
    assert ml["expert_up"].fields_at(x)["dtype"] == "fp8"
    assert ml["router"].fields_at(x)["dtype"] == "bf16"
    assert set(QUANTISED_GEMMS) >= {"expert_up", "expert_down"}


def test_fp8_kv_cache_halves_the_cache_write():
    m = load_model("llama3-8b")
    sh = tp_shard(m, 1)
    w16 = _by_name(serving_templates(m, sh)["layer"])["kv_cache_write"].traffic_bytes
    w8 = _by_name(serving_templates(m, sh, kv_cache_dtype="fp8")["layer"])[
        "kv_cache_write"
    ].traffic_bytes
    kv = 2 * sh.kv_heads * m.head_dim
    assert w16 == kv * (2 + 2) and w8 == kv * (2 + 1)  # reads bf16 K/V, writes the cache
