"""Which GEMMs a sparsified checkpoint runs sparse (workloads.decompose.sparsity), and the
option checks: one ModelError line for every combination no kernel runs."""

from __future__ import annotations

import numpy as np
import pytest

from hardware_specs.registry import builtin_catalog
from workloads.decompose import tp_shard
from workloads.decompose.layer import layer_templates
from workloads.decompose.sparsity import (
    LinearSparsity,
    linear_sparsity,
    sparse_layer_params,
    sparsify_templates,
)
from workloads.decompose.training import layer_forward_ops
from workloads.models import ModelError, load_model

ONE = np.ones(1, np.int64)


def _gemms(tpls):
    return {t.name: (t.sparsity, int(t.fields_at(ONE)["n"])) for t in tpls if t.op == "gemm"}


def test_weight_sparsity_marks_the_linear_layers_only():
    m = load_model("llama3-8b")
    tpls = layer_templates(m, tp_shard(m, 2), "bf16", "vllm", serving=True)
    out = _gemms(sparsify_templates(tpls, linear_sparsity("2:4")))
    assert {k: v[0] for k, v in out.items()} == dict.fromkeys(
        ("qkv_proj", "o_proj", "mlp_up", "mlp_down"), "2:4"
    )
    # attention and every non-GEMM template are untouched
    assert [t.name for t in sparsify_templates(tpls, linear_sparsity("2:4"))] == [
        t.name for t in tpls
    ]
    assert sparsify_templates(tpls, LinearSparsity()) == tpls


def test_cats_splits_gate_and_up_and_leaves_attention_dense():
    m = load_model("llama3-8b")
    tpls = layer_templates(m, tp_shard(m, 1), "bf16", "vllm", serving=True)
    out = _gemms(sparsify_templates(tpls, linear_sparsity(None, "cats:0.3", model=m)))
    assert out["mlp_gate"] == (None, 14336)  # dense gate: CATS thresholds SiLU(gate)
    assert out["mlp_up"] == ("cats:0.3", 14336)
    assert out["mlp_down"] == ("cats:0.3", 4096)
    assert out["qkv_proj"][0] is None and out["o_proj"][0] is None


def test_sparse_params_are_the_linear_weights():
    m = load_model("llama3-8b")
    h, f, kv = 4096, 14336, 8 * 128
    per_layer = h * (h + 2 * kv) + h * h + 2 * h * f + f * h  # QKV, out, gate+up, down
    assert sparse_layer_params(m, tp_shard(m, 1), linear_sparsity("2:4")) == per_layer
    assert sparse_layer_params(m, tp_shard(m, 4), linear_sparsity("2:4")) == per_layer / 4
    assert sparse_layer_params(m, tp_shard(m, 1), linear_sparsity(None, "cats:0.5", model=m)) == 0


def test_training_ops_carry_the_sparsity():
    m = load_model("llama3-8b")
    ops = layer_forward_ops(m, 1, 128)
    assert all(o.op.sparsity is None for o in ops)  # dense default unchanged


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"weight": "3:4"}, "--weight-sparsity: sparsity '3:4' not understood"),
        ({"weight": "cats:0.5"}, "is not a weight sparsity"),
        ({"activation": "2:4"}, "is not an activation sparsity"),
        ({"weight": "2:4", "activation": "cats:0.5"}, "one sparse kernel per GEMM"),
        ({"weight": "2:4", "weight_dtype": "int4"}, "allowed: --weight-dtype bf16 or fp16"),
        ({"weight": "2:4", "weight_dtype": "fp8"}, "no sparse kernel for fp8"),
        ({"weight": "unstructured:0.5", "training": True}, "no training kernel"),
        ({"activation": "cats:0.5", "training": True}, "no training kernel"),
        ({"activation": "cats:0.5", "model": "mixtral-8x7b"}, "mixtral-8x7b has none"),
    ],
)
def test_refusals_are_one_line(kw, needle):
    if "model" in kw:
        kw["model"] = load_model(kw["model"])
    with pytest.raises(ModelError) as err:
        linear_sparsity(kw.pop("weight", None), kw.pop("activation", None), **kw)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_gpu_checks():
    cat = builtin_catalog()
    pre_ampere = cat.gpu("a100-sxm-80gb").model_copy(update={"id": "v100", "sparse_speedup": 1.0})
    with pytest.raises(ModelError, match="needs sparse tensor cores"):
        linear_sparsity("2:4", gpu=pre_ampere)
    assert linear_sparsity("unstructured:0.8", gpu=pre_ampere).weight == "unstructured:0.8"
    with pytest.raises(ModelError, match="NVIDIA GPU"):
        linear_sparsity("2:4", gpu=cat.gpu("mi300x"), training=True)
    assert linear_sparsity("2:4", gpu=cat.gpu("mi300x")).weight == "2:4"  # serving: allowed
