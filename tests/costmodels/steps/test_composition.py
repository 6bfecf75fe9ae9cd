"""Composition factors: grouping, application in the step tier, file errors, shipped files."""

from __future__ import annotations

import json

import pytest

from costmodels.ops.select import get_cost_model
from costmodels.steps.composition import (
    GROUPS,
    HOST_KEY,
    Composition,
    CompositionError,
    group_of,
    load_composition,
    shipped_composition,
)
from costmodels.steps.training import step_costs
from hardware_specs.registry import builtin_catalog
from workloads.models import get_model
from workloads.plan import make_plan


def test_groups_by_op_kind():
    assert group_of("gemm") == "gemm"
    assert group_of("attn_fwd") == group_of("attn_bwd") == "attention"
    assert group_of("adamw") == "optimizer"
    assert group_of("rmsnorm") == group_of("copy") == group_of("cross_entropy") == "memory_bound"
    assert group_of("all_reduce") is None  # collectives are never scaled


def test_factor_includes_idle_and_defaults_to_one():
    comp = Composition("h100-sxm", {"pytorch": {"gemm": 0.5, "idle": 1.1}})
    assert comp.factor("pytorch", "gemm") == pytest.approx(0.55)
    assert comp.factor("pytorch", "rmsnorm") == pytest.approx(1.1)
    assert comp.factor("pytorch", "all_reduce") == 1.0
    assert comp.factor("megatron", "gemm") == 1.0


def _costs(composition, framework="pytorch", tp=1):
    model = get_model("llama3-8b")
    plan = make_plan(model, num_gpus=tp, tp=tp, global_batch=1, micro_batch=1, seq_len=2048)
    cm = get_cost_model("h100-sxm", num_gpus=tp)
    system = builtin_catalog().system("h100-sxm", tp)
    return step_costs(model, plan, cm, system, "", framework, composition)


def test_step_costs_scale_each_group_and_leave_collectives():
    base = _costs(None, tp=2)
    comp = Composition("h100-sxm", {"pytorch": {"gemm": 2.0, "memory_bound": 0.5}})
    scaled = _costs(comp, tp=2)
    for name, sec in base.layer_fwd.by_op_s.items():
        if name == "attn":
            assert scaled.layer_fwd.by_op_s[name] == pytest.approx(sec)
        elif name in ("qkv_proj", "o_proj", "mlp_up", "mlp_down"):
            assert scaled.layer_fwd.by_op_s[name] == pytest.approx(2 * sec)
        elif name in ("rmsnorm_1", "rope", "swiglu", "residual_1"):
            assert scaled.layer_fwd.by_op_s[name] == pytest.approx(0.5 * sec)
    assert scaled.layer_fwd.tp_comm_s == pytest.approx(base.layer_fwd.tp_comm_s)
    # another engine's factors leave this one alone
    other = Composition("h100-sxm", {"pytorch-compile": {"gemm": 2.0}})
    assert _costs(other).layer_fwd.compute_s == pytest.approx(_costs(None).layer_fwd.compute_s)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{", "not JSON"),
        ('{"factors": {}}', "needs gpu and factors"),
        ('{"gpu": "h100-sxm", "factors": {"pytorch": {"fp32": 1.0}}}', "unknown group 'fp32'"),
        ('{"gpu": "h100-sxm", "factors": {"pytorch": {"gemm": 0}}}', "allowed: a number"),
    ],
)
def test_bad_files_are_one_line(tmp_path, text, needle):
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(CompositionError, match=needle) as info:
        load_composition(path)
    assert "\n" not in str(info.value)
    with pytest.raises(CompositionError, match="does not exist"):
        load_composition(tmp_path / "missing.json")


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200-sxm"])
def test_shipped_files_cover_the_pytorch_engines_only(gpu):
    comp = shipped_composition(gpu)
    assert comp is not None and comp.gpu == gpu
    training = {"pytorch", "pytorch-compile"}
    serving = {"pytorch-eager/graph", "pytorch-eager/stream"}  # serve engine / launch context
    assert set(comp.factors) == training | serving
    for engine, groups in comp.factors.items():
        assert set(groups) <= set(GROUPS) | {"idle", HOST_KEY}
        assert all(0.5 < v < 2.0 for g, v in groups.items() if g != HOST_KEY)
        if engine in training:
            assert 1e-5 < comp.host_s_per_op(engine) < 1e-4  # tens of microseconds per op
    assert comp.host_s_per_op("megatron") == 0.0 and comp.idle("vllm/graph") == 1.0
    assert comp.meta["held_out"] == ["llama2-7b-like", "llama3.2-3b-like", "qwen2.5-1.5b-like"]
    assert comp.meta["serving"]["held_out"] == ["qwen2.5-7b"]
    json.dumps(comp.to_dict())
    assert shipped_composition("a100-sxm-80gb") is None


@pytest.mark.parametrize("value", [-1e-6, 0.01, "fast"])
def test_host_time_out_of_range_is_one_clear_error(tmp_path, value):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"gpu": "h100-sxm", "factors": {"pytorch": {HOST_KEY: value}}}))
    with pytest.raises(CompositionError, match=f"pytorch/{HOST_KEY}"):
        load_composition(path)


def test_serving_step_model_applies_its_context_factors():
    """The eager serving engine's steps carry the shipped factors of their launch context
    (prefill: stream, decode: graph); vLLM has no traces, so no factors."""
    import numpy as np

    from costmodels.steps.serving import StepModel

    none = np.zeros(0, np.int64)
    prefill = (np.full(2, 1024), np.zeros(2, np.int64), none)
    decode = (none, none, np.full(32, 1024))
    comp = shipped_composition("h200-sxm")
    for engine, changes in (("pytorch-eager", True), ("vllm", False)):
        plain = StepModel("llama3-8b", "h200-sxm", engine=engine, composition=None)
        shipped = StepModel("llama3-8b", "h200-sxm", engine=engine)
        for args in (prefill, decode):
            a, b = plain.step_s(*args), shipped.step_s(*args)
            assert (a != pytest.approx(b, rel=1e-4)) is changes, (engine, a, b)
    # graph decode of the eager engine: gemm, attention, memory-bound and idle all apply
    graph = comp.factors["pytorch-eager/graph"]
    assert {"gemm", "attention", "memory_bound", "idle"} <= set(graph)
    scaled = Composition("h200-sxm", {"pytorch-eager/graph": {"idle": 2.0}})
    base = StepModel("llama3-8b", "h200-sxm", engine="pytorch-eager", composition=None)
    twice = StepModel("llama3-8b", "h200-sxm", engine="pytorch-eager", composition=scaled)
    assert twice.step_s(*decode) == pytest.approx(2.0 * base.step_s(*decode), rel=1e-3)
