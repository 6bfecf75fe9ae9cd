"""Eager PyTorch (framework ``pytorch``) under tensor and pipeline parallelism, as
calibrate/steps/par_step.py runs it and calibrate/data/steps-par-h200-x4 measured it:
memory per tensor, what a stage sends, gradient accumulation, host work of collectives.
Hand-derived numbers; the measured comparison is benchmarks/validate_training.py."""

from __future__ import annotations

import math

import pytest

from costmodels.ops.select import get_cost_model
from costmodels.steps.memory import estimate_memory, layer_activation_bytes
from costmodels.steps.training import (
    HOST_OPS_PER_COLLECTIVE,
    host_collectives,
    host_launches,
    host_work,
    step_costs,
)
from hardware_specs.registry import builtin_catalog, get_gpu
from workloads.decompose import params_per_tp_rank
from workloads.decompose.training import eager_extra_ops
from workloads.models import get_model
from workloads.plan import make_plan

H100 = get_gpu("h100-sxm")
M = get_model("llama3-8b")


def _plan(**kw):
    kw.setdefault("num_gpus", kw.get("tp", 1) * kw.get("pp", 1))
    kw.setdefault("seq_len", 1024)
    return make_plan(M, **kw)


def test_tensor_parallel_layer_saves_one_cast_per_fused_gemm():
    """Fused QKV and gate|up GEMMs read one bf16 cast of their norm's output each, saved
    as the sequence shard: 2 (8h + 4) + 2 * 2h per token outside the TP regions, / tp."""
    h, heads, f, tp = 4096, 32, 14336, 2
    q, kv = 4096 // tp, 1024 // tp
    got = layer_activation_bytes(M, micro_batch=1, seq_len=512, tp=tp, sp=True,
                                 framework="pytorch")  # fmt: skip
    per_token = (2 * (8 * h + 4) + 2 * 2 * h) / tp + 2 * (q + 2 * kv) + 2 * q
    per_token += 4 * heads / tp + 8 * f / tp  # log-sum-exp; SwiGLU gate, silu, up, product
    assert got == 512 * per_token
    # one GPU keeps autocast's cast per nn.Linear (q, k, v, gate, up): unchanged
    one = layer_activation_bytes(M, micro_batch=1, seq_len=512, framework="pytorch")
    assert one == 512 * (26 * h + 4 * 4096 + 4 * 1024 + 8 * f + 4 * heads + 8)


def test_tensor_parallel_loss_is_vocab_parallel():
    """Megatron's vocab-parallel cross-entropy: 6 bytes per logit of the rank's vocabulary
    shard at the peak (fp32 softmax turned gradient + its bf16 cast), not 10."""
    # 8k tokens: the activations' moment is the peak (not the end of the backward)
    plan = _plan(tp=2, global_batch=1, sequence_parallel=True, seq_len=8192)
    est = estimate_memory(M, plan, H100, framework="pytorch")
    assert est.logits_bytes == 8192 * math.ceil(M.vocab_size / 2) * 6
    one = estimate_memory(M, _plan(global_batch=1, seq_len=8192), H100, framework="pytorch")
    assert one.logits_bytes == 8192 * M.vocab_size * 10


def test_pipeline_keeps_weight_copies_per_micro_batch_in_flight():
    """Each micro-batch's forward makes its own autocast weight copies, saved for its
    backward: a second micro-batch in flight on rank 0 adds its activations and one more
    set of bf16 copies of the rank's GEMM weights (8k tokens: the activations' moment is
    the peak)."""
    one, two = (_plan(pp=2, micro_batch=1, global_batch=g, seq_len=8192) for g in (1, 2))
    a1, a2 = (estimate_memory(M, p, H100, framework="pytorch") for p in (one, two))
    layers = M.num_layers // 2
    linear = layers * (params_per_tp_rank(M, 1)["layer"] - 2 * M.hidden_size)
    acts = layers * layer_activation_bytes(M, micro_batch=1, seq_len=8192, framework="pytorch")
    diff = a2.per_stage_allocated_bytes[0] - a1.per_stage_allocated_bytes[0]
    assert diff == pytest.approx(acts + 2 * linear, rel=1e-12)
    # Megatron caches no per-micro-batch copies: only the activations grow
    m1, m2 = (estimate_memory(M, p, H100, framework="megatron") for p in (one, two))
    mdiff = m2.per_stage_allocated_bytes[0] - m1.per_stage_allocated_bytes[0]
    assert mdiff == pytest.approx(layers * layer_activation_bytes(M, micro_batch=1, seq_len=8192))


def test_per_stage_allocated_bytes_hold_the_peak_stage():
    est = estimate_memory(M, _plan(pp=4, global_batch=8), H100, framework="pytorch")
    assert len(est.per_stage_allocated_bytes) == 4
    assert est.per_stage_allocated_bytes[est.peak_stage] == pytest.approx(est.allocated_bytes)


def _costs(plan, framework="pytorch"):
    system = builtin_catalog().system("h100-sxm", plan.num_gpus)
    return step_costs(M, plan, get_cost_model("h100-sxm"), system, "cudnn", framework)


def test_eager_pipeline_sends_the_fp32_residual_stream():
    plan = _plan(pp=2, global_batch=4)
    assert _costs(plan).p2p_bytes == 1024 * 4096 * 4  # fp32 parameters: fp32 residual
    assert _costs(plan, "megatron").p2p_bytes == 1024 * 4096 * 2
    sp = _plan(tp=2, pp=2, global_batch=4, sequence_parallel=True)
    assert _costs(sp).p2p_bytes == 1024 * 4096 * 4 / 2  # each TP rank sends its shard


def test_gradient_accumulation_adds_into_the_fp32_grads():
    """Every micro-batch but the first adds its fp32 weight gradient into .grad: 12 B per
    parameter, (m - 1) / m of it per micro-batch."""
    layer = params_per_tp_rank(M, 1)["layer"]

    def acc(plan):
        ops = eager_extra_ops(M, plan)["layer_bwd"]
        return sum(2 * o.op.bytes * o.count for o in ops if o.name == "eager_grad_accumulate")

    assert acc(_plan(global_batch=1)) == 0
    assert acc(_plan(global_batch=4)) == pytest.approx(12.0 * 3 / 4 * layer, rel=1e-6)


def test_tp_collectives_cost_the_host():
    """Host work is the launched ops plus HOST_OPS_PER_COLLECTIVE per TP collective call:
    per layer 4 in the forward, 6 in the backward (with SP); none without TP."""
    one = _costs(_plan(global_batch=1))
    assert host_collectives(one, 32, 1, True, True) == 0
    assert host_work(one, 32, 1, True, True, 1) == host_launches(one, 32, 1, True, True, 1)
    c = _costs(_plan(tp=2, global_batch=1, sequence_parallel=True))
    assert (c.layer_fwd.collectives, c.layer_bwd.collectives) == (4, 6)
    calls = host_collectives(c, 32, 2, True, True)
    assert calls == 2 * (32 * 10 + c.first_fwd.collectives + c.first_bwd.collectives
                         + c.last_fwd.collectives + c.last_bwd.collectives)  # fmt: skip
    want = host_launches(c, 32, 2, True, True, 1) + HOST_OPS_PER_COLLECTIVE * calls
    assert host_work(c, 32, 2, True, True, 1) == pytest.approx(want)
