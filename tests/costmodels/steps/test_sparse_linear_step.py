"""Sparse linear layers in the step models: serving speed and memory (costmodels.steps.
serving with weight/activation sparsity) and a 2:4 training step (sparse_linear)."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.ops.sparse_gemm import sparse_params, stored_bytes_per_weight
from costmodels.steps.serving import StepModel
from costmodels.steps.serving_memory import GIB
from costmodels.steps.training import step_costs
from simcli.scenario.hardware import resolve_hardware
from workloads.models import ModelError, load_model
from workloads.plan import make_plan

NONE = np.zeros(0, np.int64)


def _prefill(n: int):
    return np.array([n]), np.array([0]), NONE


def _decode(b: int, ctx: int = 1024):
    return NONE, NONE, np.full(b, ctx)


@pytest.fixture(scope="module")
def models():
    return {
        w: StepModel("llama3-8b", "h100-sxm", weight_sparsity=w)
        for w in (None, "2:4", "unstructured:0.8")
    }


def test_2_4_pays_at_prefill_and_loses_at_decode_batch_1(models):
    dense, sparse = models[None], models["2:4"]
    # compute-bound GEMMs at half the k steps: faster
    assert sparse.step_s(*_prefill(8192)) < 0.9 * dense.step_s(*_prefill(8192))
    # cuSPARSELt's narrow kernel streams the compressed weight slower than the dense GEMV
    # (measured on H100: 2:4 loses at decode)
    assert sparse.step_s(*_decode(1)) > 1.2 * dense.step_s(*_decode(1))
    # attention and the LM head are not sparse: their breakdown entries are identical
    bd, bs = dense.breakdown(*_prefill(8192)), sparse.breakdown(*_prefill(8192))
    for key in ("attn", "lm_head", "rope", "kv_cache_write"):
        assert bs[key] == bd[key]
    for key in ("qkv_proj", "o_proj", "mlp_up", "mlp_down"):
        assert bs[key] < bd[key]


def test_unstructured_and_cats_pay_at_decode(models):
    dense = models[None].step_s(*_decode(1))
    assert models["unstructured:0.8"].step_s(*_decode(1)) < 0.9 * dense
    cats = StepModel("llama3-8b", "h100-sxm", activation_sparsity="cats:0.3")
    assert cats.step_s(*_decode(1)) < 0.9 * dense
    # a batch's union of active neurons is all of them: no gain at large batches
    assert cats.step_s(*_decode(64)) >= models[None].step_s(*_decode(64))


def test_sparse_prices_are_in_the_grids(models):
    """The sparse GEMMs enter the token grids the serving hot path interpolates: at a grid
    point the per-template seconds equal exact pricing (attention is interpolated on its
    own grids, as for dense)."""
    sm = models["2:4"]
    for pn, n_dec in ((np.array([3008]), 0), (NONE, 37)):
        pp = np.zeros(len(pn), np.int64)
        grid = sm._evaluate(pn, pp, n_dec, 2000 * n_dec, vectors=True)
        exact = sm._evaluate(pn, pp, n_dec, 2000 * n_dec, vectors=True, exact=True)
        np.testing.assert_allclose(grid.tok, exact.tok, rtol=1e-12)
        assert grid.total == pytest.approx(exact.total, rel=1e-2)
    assert sm.step_s(*_decode(37, 2000)) == sm.exact_step_s(*_decode(37, 2000))


def test_sparse_weights_free_kv_capacity(models):
    dense, sparse, unst = models[None], models["2:4"], models["unstructured:0.8"]
    linear = 32 * (4096 * 6144 + 4096 * 4096 + 2 * 4096 * 14336 + 14336 * 4096)
    # cuSPARSELt: half the values + 2 bits of metadata each = 1.125 bytes per bf16 weight
    saved = linear * (2.0 - 1.125)
    assert dense.weight_bytes_per_gpu() - sparse.weight_bytes_per_gpu() == pytest.approx(saved)
    assert stored_bytes_per_weight("2:4", 2) == 1.125
    up = sparse_params("hopper").unstructured  # Tiled-CSL: value + 16-bit location + offsets
    assert stored_bytes_per_weight("unstructured:0.8", 2) == pytest.approx(
        0.2 * (2 + up.index_bytes) + up.tile_offset_bytes / up.tile_elements
    )
    assert (dense.weight_bytes_per_gpu() - sparse.weight_bytes_per_gpu()) / GIB > 5.0
    assert sparse.kv_capacity_tokens() > 1.1 * dense.kv_capacity_tokens()
    assert unst.kv_capacity_tokens() > sparse.kv_capacity_tokens()
    assert sparse.weight_bytes_total < dense.weight_bytes_total


def test_eager_engine_pays_the_call_floor_on_prefill_only():
    dense = StepModel("llama3-8b", "h100-sxm", engine="pytorch-eager")
    sparse = StepModel("llama3-8b", "h100-sxm", engine="pytorch-eager", weight_sparsity="2:4")
    floor = sparse_params("hopper").semi_structured.call_floor_s
    bd = sparse.breakdown(*_prefill(2048))
    # each of 32 eager calls at the floor (less the launch it includes, times the fitted
    # composition factor of the eager engine)
    assert bd["qkv_proj"] >= 32 * floor * 0.9
    assert sparse.step_s(*_prefill(2048)) > dense.step_s(*_prefill(2048))
    # decode is a CUDA-graph replay: the kernel alone, as for vllm
    assert sparse.breakdown(*_decode(1))["qkv_proj"] < 32 * floor


def test_step_model_refuses_quantised_sparse():
    with pytest.raises(ModelError, match="allowed: --weight-dtype bf16 or fp16"):
        StepModel("llama3-8b", "h100-sxm", weight_dtype="int4", weight_sparsity="2:4")


@pytest.fixture(scope="module")
def train_costs():
    m = load_model("llama3-8b")
    hw = resolve_hardware("h100-sxm", 8)
    plan = make_plan(m, num_gpus=8, tp=1, micro_batch=1, global_batch=64, seq_len=4096)
    return {
        w: step_costs(m, plan, hw.cost_model, hw.system, weight_sparsity=w) for w in (None, "2:4")
    }


def test_training_2_4_changes_only_the_sparse_gemms(train_costs):
    dense, sparse = train_costs[None], train_costs["2:4"]
    f_d, f_s = dense.layer_fwd.by_op_s, sparse.layer_fwd.by_op_s
    b_d, b_s = dense.layer_bwd.by_op_s, sparse.layer_bwd.by_op_s
    linear = ("qkv_proj", "o_proj", "mlp_up", "mlp_down")
    for name in linear:
        assert f_s[name] < f_d[name]  # forward: pruned weight
        assert b_s[f"{name}_dgrad"] < b_d[f"{name}_dgrad"]  # dgrad: its transpose
        assert b_s[f"{name}_wgrad"] == b_d[f"{name}_wgrad"]  # wgrad: dense
        assert f_s[f"sparsify24_{name}"] > 0  # the per-forward sparsify pass
    same_f = {k for k in f_d if k not in linear}
    assert {k: f_s[k] for k in same_f} == {k: f_d[k] for k in same_f}
    same_b = {k for k in b_d if not k.endswith("_dgrad")}
    assert {k: b_s[k] for k in same_b} == {k: b_d[k] for k in same_b}
    assert set(b_s) == set(b_d) and set(f_s) - set(f_d) == {f"sparsify24_{n}" for n in linear}
    # the LM head and the embedding stay dense
    assert sparse.last_fwd.by_op_s == dense.last_fwd.by_op_s
    assert sparse.layer_fwd.compute_s < dense.layer_fwd.compute_s


def test_training_refuses_fp8_gemms():
    m = load_model("llama3-8b")
    hw = resolve_hardware("h100-sxm", 8)
    plan = make_plan(
        m, num_gpus=8, tp=1, micro_batch=1, global_batch=64, seq_len=4096, precision="fp8"
    )
    with pytest.raises(ValueError, match="no sparse training kernel"):
        step_costs(m, plan, hw.cost_model, hw.system, weight_sparsity="2:4")


def test_cats_refused_where_the_neuron_axis_would_be_wrong():
    # llama3-8b at tp 8: 1792 neurons per rank < hidden 4096 (the CATS model's neurons are
    # the larger GEMM dimension)
    with pytest.raises(ValueError, match="fewer than its hidden size"):
        StepModel("llama3-8b", "h100-sxm", tp=8, activation_sparsity="cats:0.3")
