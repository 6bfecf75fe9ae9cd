"""Per-micro-batch costs of the pieces a training iteration is built from.

One call prices every op of one transformer layer (forward, backward, recompute), of the
first stage (embedding) and of the last stage (final norm, LM head, loss) for one
micro-batch on one rank, with the calibrated cost model, in one vectorised
``predict_many``. The simulator then only adds and schedules these numbers, which is
what makes thousands of plans per second possible: the costs depend on (tp, sp,
micro-batch, sequence / cp, precision) and not on pp, dp or the schedule.

Placement (Megatron-LM rank order, TP fastest): a TP group of ``tp`` ranks spans
``ceil(tp / gpus_per_node)`` nodes; a CP group (stride tp) ``ceil(tp*cp / gpn)``.

Context parallelism (Liu et al. 2023, ring attention; Jacobs et al. 2023, DeepSpeed-
Ulysses; Wang et al. 2024, TokenRing): each rank holds ``seq/cp`` tokens, so every
token-wise op runs on ``seq/cp`` tokens and causal attention is load-balanced (Megatron
CP's 2*cp chunking) to 1/cp of the full causal attention. Ring: ``cp-1`` KV exchanges
overlapped with the attention blocks (backward moves KV and dKV); Ulysses: all-to-alls
of Q, K, V and the output, not overlapped; TokenRing: both ring directions, half the
per-step bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from costmodels.ops.analytical import AnalyticalCostModel
from costmodels.ops.learned import LearnedCostModel
from hardware_specs.registry import System
from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.layers import (
    LayerOp,
    layer_backward_ops,
    layer_forward_ops,
    model_step_ops,
    params_per_tp_rank,
)
from workloads.models import ModelConfig
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, Op, OpKind, normalise_frame
from workloads.plan import TrainPlan

CostModel = AnalyticalCostModel | LearnedCostModel
Framework = Literal["megatron", "megatron-unfused", "pytorch"]

COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
ATTENTION = {"attn_fwd", "attn_bwd", "attn_fwdbwd"}
# Fraction of a TP collective hidden behind the GEMMs it is chunked with (Megatron's
# --tp-comm-overlap, Wang et al. 2022 "Overlap communication with dependent computation"):
# pipelined chunks leave the first and last chunk exposed, about a quarter at 4 chunks.
TP_OVERLAP_HIDDEN = 0.75


@dataclass(frozen=True)
class Phase:
    """Seconds of one layer (or stage extra) for one micro-batch, split by kind."""

    compute_s: float = 0.0
    tp_comm_s: float = 0.0
    cp_comm_s: float = 0.0  # exposed context-parallel communication
    ep_comm_s: float = 0.0  # expert-parallel all-to-alls
    by_op_s: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s


@dataclass(frozen=True)
class StepCosts:
    """Costs of one micro-batch on one rank; see the module docstring."""

    layer_fwd: Phase
    layer_bwd: Phase
    layer_recompute: Phase  # forward work repeated in the backward pass
    first_fwd: Phase
    first_bwd: Phase
    last_fwd: Phase
    last_bwd: Phase
    p2p_bytes: float  # activation (or its gradient) sent between pipeline stages
    p2p_s: float
    layer_params: int  # per TP rank (and per EP rank for experts)
    embedding_params: int
    lm_head_params: int
    model_flops_per_microbatch: float  # 6 N T + attention, whole model, one micro-batch


def _frame(ops: list[Op]) -> pd.DataFrame:
    return normalise_frame(
        pd.DataFrame([o.row() for o in ops], columns=[*CSV_COLUMNS, *EXTRA_COLUMNS])
    )


def group_nodes(size: int, stride: int, gpus_per_node: int) -> int:
    """Nodes spanned by a group of ``size`` ranks ``stride`` apart (Megatron rank order)."""
    if size <= 1:
        return 1
    if stride >= gpus_per_node:
        return size
    return max(1, math.ceil(size / (gpus_per_node // stride)))


def _with_nodes(op: Op, nodes: int) -> Op:
    if op.op.value in COLLECTIVES and nodes > 1:
        return op.model_copy(update={"nodes": nodes})
    return op


def _sum_phase(
    items: list[LayerOp], times: np.ndarray, plan: TrainPlan, attn_scale: float
) -> Phase:
    compute = tp = 0.0
    by_op: dict[str, float] = {}
    for item, t in zip(items, times, strict=True):
        kind = item.op.op.value
        sec = float(t) * item.count
        if kind in ATTENTION:
            sec *= attn_scale
        if kind in COLLECTIVES:
            tp += sec
        else:
            compute += sec
        by_op[item.name] = by_op.get(item.name, 0.0) + sec
    if plan.tp_comm == "overlap":
        tp *= 1.0 - TP_OVERLAP_HIDDEN
    elif plan.tp_comm == "ladder":
        # Ladder Residual (Zhang et al. 2025): block i's all-reduce runs while block i+1
        # computes on the not-yet-reduced residual, so only comm beyond compute shows.
        tp = max(0.0, tp - compute)
    return Phase(compute_s=compute, tp_comm_s=tp, by_op_s=by_op)


def op_groups(
    model: ModelConfig, plan: TrainPlan, attn_backend: str = "", framework: Framework = "megatron"
) -> list[list[LayerOp]]:
    """The ops of one micro-batch on one rank, unpriced, in six groups: layer forward,
    layer backward, first-stage forward / backward, last-stage forward / backward.
    Attention ops are those of the full sequence under context parallelism (the caller
    scales them by 1/cp). Shared by :func:`step_costs` and the batched plan search."""
    tp, cp, mb = plan.tp, plan.cp, plan.micro_batch
    seq_local = plan.seq_len // cp
    dtype = plan.compute_dtype
    args = dict(tp=tp, sequence_parallel=plan.sp, dtype=dtype, attn_backend=attn_backend)
    fwd = layer_forward_ops(model, mb, seq_local, **args)
    bwd = layer_backward_ops(model, mb, seq_local, **args)
    # Causal attention of the local queries against the whole sequence, balanced over cp
    # ranks: 1/cp of the full causal attention (priced at full length, then scaled).
    if cp > 1:
        full_f = {o.name: o for o in layer_forward_ops(model, mb, plan.seq_len, **args)}
        full_b = {o.name: o for o in layer_backward_ops(model, mb, plan.seq_len, **args)}
        fwd = [full_f[o.name] if o.op.op.value in ATTENTION else o for o in fwd]
        bwd = [full_b[o.name] if o.op.op.value in ATTENTION else o for o in bwd]
    stage_args = dict(tp=tp, sequence_parallel=plan.sp, dtype=dtype)
    first_f = model_step_ops(model, mb, seq_local, phase="forward", stage="first", **stage_args)
    first_b = model_step_ops(model, mb, seq_local, phase="backward", stage="first", **stage_args)
    last_f = model_step_ops(model, mb, seq_local, phase="forward", stage="last", **stage_args)
    last_b = model_step_ops(model, mb, seq_local, phase="backward", stage="last", **stage_args)
    if framework == "pytorch":
        extra = eager_extra_ops(model, plan)
        fwd, bwd = fwd + extra["layer_fwd"], bwd + extra["layer_bwd"]
        first_f, first_b = first_f + extra["first_fwd"], first_b + extra["first_bwd"]
        last_f, last_b = last_f + extra["last_fwd"], last_b + extra["last_bwd"]
    elif framework == "megatron-unfused":
        if cp > 1:
            raise ValueError("framework megatron-unfused does not model context parallelism")
        fwd, bwd = _unfused_attention(model, plan, fwd, bwd)
    elif framework != "megatron":
        raise ValueError(
            f"unknown framework {framework!r}; allowed: megatron, megatron-unfused, pytorch"
        )
    if plan.compute_dtype == "fp8":
        fwd, bwd = fwd + _fp8_casts(model, plan, "fwd"), bwd + _fp8_casts(model, plan, "bwd")
    return [fwd, bwd, first_f, first_b, last_f, last_b]


def step_costs(
    model: ModelConfig,
    plan: TrainPlan,
    cost_model: CostModel,
    system: System,
    attn_backend: str = "",
    framework: Framework = "megatron",
) -> StepCosts:
    """Price one micro-batch of ``plan`` on one rank (see the module docstring).

    ``framework``: ``megatron`` prices fused kernels (the layer ops as they are);
    ``megatron-unfused`` replaces the flash kernel by Megatron-LM's pre-FlashAttention
    core attention (see :func:`_unfused_attention`); ``pytorch`` adds the extra memory
    traffic of a plain eager PyTorch model under
    autocast (see :func:`eager_extra_ops`)."""
    gpn = system.node.gpus_per_node
    tp, cp, mb = plan.tp, plan.cp, plan.micro_batch
    seq_local = plan.seq_len // cp
    act_dtype = plan.activation_dtype
    attn_scale = 1.0 / cp
    groups = op_groups(model, plan, attn_backend, framework)
    tp_nodes = group_nodes(tp, 1, gpn)
    ops = [_with_nodes(o.op, tp_nodes) for g in groups for o in g]
    times = cost_model.predict_many(_frame(ops))
    parts: list[np.ndarray] = []
    start = 0
    for g in groups:
        parts.append(times[start : start + len(g)])
        start += len(g)
    phases = [_sum_phase(g, t, plan, attn_scale) for g, t in zip(groups, parts, strict=True)]
    layer_f, layer_b, f_f, f_b, l_f, l_b = phases

    # Context-parallel and expert-parallel communication of one layer.
    cp_f, cp_b = _cp_comm(model, plan, cost_model, system, layer_f, layer_b)
    ep_f, ep_b = _ep_comm(model, plan, cost_model, system)
    layer_f = Phase(layer_f.compute_s, layer_f.tp_comm_s, cp_f, ep_f, layer_f.by_op_s)
    layer_b = Phase(layer_b.compute_s, layer_b.tp_comm_s, cp_b, ep_b, layer_b.by_op_s)

    recompute = recompute_phase(plan, layer_f)

    elt = DTYPE_BYTES[Dtype(act_dtype)]
    tokens = mb * seq_local
    p2p_bytes = tokens * model.hidden_size * elt / (tp if plan.sp else 1)
    stage_span = tp * cp * plan.data_parallel
    p2p_nodes = 2 if stage_span >= gpn else 1
    p2p_op = Op(op=OpKind.send_recv, dtype=Dtype(act_dtype), bytes=int(p2p_bytes), ranks=2)
    p2p_op = _with_nodes(p2p_op, p2p_nodes)
    p2p_s = float(cost_model.predict_many(_frame([p2p_op]))[0]) if plan.pp > 1 else 0.0

    return StepCosts(
        layer_fwd=layer_f,
        layer_bwd=layer_b,
        layer_recompute=recompute,
        first_fwd=f_f,
        first_bwd=f_b,
        last_fwd=l_f,
        last_bwd=l_b,
        p2p_bytes=p2p_bytes,
        p2p_s=p2p_s,
        **plan_fields(model, plan),
    )


def recompute_phase(plan: TrainPlan, layer_f: Phase) -> Phase:
    """Forward work a layer repeats in its backward: all of it (full), only the core
    attention (selective, Korthikanti et al. 2022 sec. 4.2), or none."""
    if plan.recompute == "full":
        return layer_f
    if plan.recompute == "selective":
        attn = sum(s for n, s in layer_f.by_op_s.items() if n == "attn" or n.startswith("attn_"))
        return Phase(compute_s=attn, by_op_s={"attn": attn})
    return Phase()


def plan_fields(model: ModelConfig, plan: TrainPlan) -> dict[str, Any]:
    """The StepCosts fields that depend on the plan alone (parameters, model FLOPs)."""
    params = params_per_tp_rank(model, plan.tp)
    return {
        "layer_params": _layer_params_per_rank(model, plan, params["layer"]),
        "embedding_params": params["embedding"],
        "lm_head_params": params["lm_head"] + params["final_norm"],
        "model_flops_per_microbatch": model_flops(
            model, plan.micro_batch * plan.seq_len, plan.seq_len
        ),
    }


def _layer_params_per_rank(model: ModelConfig, plan: TrainPlan, per_tp_rank: int) -> int:
    """Expert weights are further split over ``ep`` ranks."""
    if model.num_experts == 1 or plan.ep == 1:
        return per_tp_rank
    gates = 3 if model.activation == "swiglu" else 2
    expert = model.num_experts * gates * model.hidden_size * model.expert_ffn_hidden_size
    expert_per_rank = expert // plan.tp
    return per_tp_rank - expert_per_rank + expert_per_rank // plan.ep


def model_flops(model: ModelConfig, tokens: int, seq_len: int) -> float:
    """Model FLOPs of forward + backward for ``tokens`` tokens in sequences of ``seq_len``:
    6 x active parameters x tokens plus causal attention (Narayanan et al. 2021, eq. 3
    counts the full 2 x s^2 score/context matmuls; causal masking halves them, as in
    PaLM's MFU definition of Chowdhery et al. 2022, appendix B)."""
    n_active = model.num_active_params - model.vocab_size * model.hidden_size * (
        0 if model.tie_embeddings else 1
    )
    dense = 6.0 * n_active * tokens
    attn = 6.0 * model.num_layers * 2.0 * model.num_heads * model.head_dim * seq_len * tokens / 2
    return dense + attn


def _collective_s(
    cost_model: CostModel, kind: str, nbytes: float, ranks: int, nodes: int, dtype: str
) -> float:
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    op = Op(op=OpKind(kind), dtype=Dtype(dtype), bytes=int(nbytes), ranks=ranks)
    return float(cost_model.predict_many(_frame([_with_nodes(op, nodes)]))[0])


@dataclass(frozen=True)
class Comm:
    """One collective of a plan's layer, before pricing (see :func:`_collective_s`)."""

    kind: str
    nbytes: float
    ranks: int
    nodes: int
    dtype: str


def cp_comms(model: ModelConfig, plan: TrainPlan, gpus_per_node: int) -> dict[str, Comm]:
    """The context-parallel collectives of one layer: Ulysses' all-to-alls (``a2a`` of Q
    and of the output, ``a2a_kv``), or one ring step's K/V send (``step_f``; ``step_b``
    also returns their gradients)."""
    cp = plan.cp
    if cp == 1:
        return {}
    nodes = group_nodes(cp, plan.tp, gpus_per_node)
    act = plan.activation_dtype
    elt = DTYPE_BYTES[Dtype(act)]
    tokens = plan.micro_batch * plan.seq_len // cp
    kv_heads = max(1, model.num_kv_heads // plan.tp)
    q_heads = model.num_heads // plan.tp
    kv_bytes = 2.0 * tokens * kv_heads * model.head_dim * elt
    if plan.cp_kind == "ulysses":
        # all-to-all of Q, K, V before attention and of the output after; the same in
        # backward for the gradients. Each rank's send buffer is its whole local tensor.
        q_bytes = tokens * q_heads * model.head_dim * elt
        return {
            "a2a": Comm("all_to_all", q_bytes, cp, nodes, act),
            "a2a_kv": Comm("all_to_all", kv_bytes, cp, nodes, act),
        }
    # Ring: TokenRing splits each step over both directions of the ring, halving the
    # bytes on the slower direction; the ring's slowest hop leaves the node.
    p2p_nodes = 2 if nodes > 1 else 1
    step = kv_bytes / (2.0 if plan.cp_kind == "tokenring" else 1.0)
    return {
        "step_f": Comm("send_recv", step, 2, p2p_nodes, "bf16"),
        "step_b": Comm("send_recv", 2.0 * step, 2, p2p_nodes, "bf16"),
    }


def cp_exposed_s(
    plan: TrainPlan, times_s: dict[str, float], attn_f_s: float, attn_b_s: float
) -> tuple[float, float]:
    """Exposed CP communication per layer (forward, backward) from the priced
    :func:`cp_comms`: Ulysses' all-to-alls are on the critical path; a ring's cp - 1
    steps each overlap one attention block (1/cp of the local attention work)."""
    cp = plan.cp
    if cp == 1:
        return 0.0, 0.0
    if plan.cp_kind == "ulysses":
        one = 2.0 * times_s["a2a"] + times_s["a2a_kv"]
        return one, one
    exposed_f = (cp - 1) * max(0.0, times_s["step_f"] - attn_f_s / cp)
    exposed_b = (cp - 1) * max(0.0, times_s["step_b"] - attn_b_s / cp)
    return exposed_f, exposed_b


def ep_comm(model: ModelConfig, plan: TrainPlan, gpus_per_node: int) -> Comm | None:
    """Token dispatch (and, priced the same, combine) all-to-all of an expert-parallel MoE
    layer (GShard); None without expert parallelism."""
    if model.num_experts == 1 or plan.ep == 1:
        return None
    nodes = group_nodes(plan.ep, plan.tp * plan.cp, gpus_per_node)
    elt = DTYPE_BYTES[Dtype(plan.activation_dtype)]
    tokens = plan.micro_batch * plan.seq_len // plan.cp
    nbytes = tokens * model.experts_per_token * model.hidden_size * elt
    return Comm("all_to_all", nbytes, plan.ep, nodes, plan.activation_dtype)


def _cp_comm(
    model: ModelConfig,
    plan: TrainPlan,
    cost_model: CostModel,
    system: System,
    layer_f: Phase,
    layer_b: Phase,
) -> tuple[float, float]:
    """Exposed context-parallel communication per layer (forward, backward)."""
    comms = cp_comms(model, plan, system.node.gpus_per_node)
    times = {
        k: _collective_s(cost_model, c.kind, c.nbytes, c.ranks, c.nodes, c.dtype)
        for k, c in comms.items()
    }
    attn_f, attn_b = layer_f.by_op_s.get("attn", 0.0), layer_b.by_op_s.get("attn_bwd", 0.0)
    return cp_exposed_s(plan, times, attn_f, attn_b)


def _ep_comm(
    model: ModelConfig, plan: TrainPlan, cost_model: CostModel, system: System
) -> tuple[float, float]:
    """Dispatch and combine all-to-alls of an expert-parallel MoE layer, each direction."""
    c = ep_comm(model, plan, system.node.gpus_per_node)
    if c is None:
        return 0.0, 0.0
    one = _collective_s(cost_model, c.kind, c.nbytes, c.ranks, c.nodes, c.dtype)
    return 2.0 * one, 2.0 * one


def _traffic(name: str, traffic_bytes: float, kernels: int = 1) -> LayerOp:
    """Memory-bound eager kernels as ``copy`` ops: a copy of b bytes moves 2b."""
    per = max(1, int(traffic_bytes / (2 * kernels)))
    return LayerOp(name, Op(op=OpKind.copy, dtype=Dtype.bf16, bytes=per), count=kernels)


# Backward traffic of the eager pointwise ops relative to their forward: each autograd
# node reads the incoming gradient and its saved inputs and writes the input gradient(s).
EAGER_BACKWARD_RATIO = 2.0


def eager_extra_ops(model: ModelConfig, plan: TrainPlan) -> dict[str, list[LayerOp]]:
    """Extra HBM traffic of a plain eager PyTorch Llama under ``torch.autocast(bf16)``
    with fp32 parameters (calibrate/steps/train_step.py), beyond the fused kernels the
    layer ops price. Derived from the tensors each eager kernel reads and writes:

    - the residual stream stays fp32 (fp32 embedding, RMSNorm computes in fp32), X = 4Th;
    - RMSNorm as pow, mean, two muls (7X instead of a fused X);
    - autocast casts every Linear's input to bf16 (q, k, v, gate, up: 1.5X each) and
      every weight fp32 -> bf16 once per forward (6 bytes per parameter), and the bf16
      weight gradients back to fp32 (6 bytes per parameter) in backward;
    - RoPE as mul, neg, cat, mul, add, cast with fp32 cos/sin (18 bytes per bf16 element
      instead of 2 fused); the attention output transpose is a copy; SiLU and the gate
      multiply are two kernels (5 instead of 3 tensors); fp32 + bf16 residual adds;
    - cross-entropy upcasts the bf16 logits to fp32, log-softmax, NLL and their
      backward (18 logits-sized bf16 traffic units instead of 6 fused);
    - the fp32 embedding's backward zero-fills and scatters a vocab x hidden gradient.
    """
    tp = plan.tp
    t = plan.micro_batch * plan.seq_len // plan.cp
    h = model.hidden_size
    x = 4.0 * t * h
    q = 2.0 * t * model.num_heads * model.head_dim / tp
    k = 2.0 * t * max(1, model.num_kv_heads // tp) * model.head_dim
    f = 2.0 * t * model.ffn_hidden_size / tp
    casts = 3 + (2 if model.activation == "swiglu" else 1)
    layer_params = params_per_tp_rank(model, tp)["layer"]
    shard = plan.data_parallel * plan.cp if plan.zero == 3 else 1
    fwd = [
        _traffic("eager_rmsnorm", 2 * 6.0 * x, 8),
        _traffic("eager_input_casts", casts * 1.5 * x, casts),
        _traffic("eager_rope", 16.0 * (q + k), 10),
        _traffic("eager_attn_out_copy", 2.0 * q),
        _traffic("eager_residual_fp32", 2.0 * x, 2),
        _traffic("eager_silu_mul", 2.0 * f, 1),
        # FSDP with bf16 MixedPrecision casts only its shard before the all-gather
        _traffic("eager_weight_cast", 6.0 * layer_params / shard, 7),
    ]
    bwd = [
        _traffic(o.name + "_bwd", 2 * o.op.bytes * o.count * EAGER_BACKWARD_RATIO, o.count)
        for o in fwd
        if o.name != "eager_weight_cast"
    ]
    bwd.append(_traffic("eager_wgrad_cast", 6.0 * layer_params, 7))
    vocab = -(-model.vocab_size // tp)
    logits = 2.0 * t * vocab
    head = params_per_tp_rank(model, tp)["lm_head"]
    return {
        "layer_fwd": fwd,
        "layer_bwd": bwd,
        "first_fwd": [],
        "first_bwd": [_traffic("eager_embedding_grad", 2.0 * 4.0 * vocab * h, 2)],
        "last_fwd": [
            _traffic("eager_final_norm", 6.0 * x + 1.5 * x, 6),
            _traffic("eager_lm_head_weight_cast", 6.0 * head / shard),
            _traffic("eager_cross_entropy", 7.0 * logits - 3.0 * logits, 2),
        ],
        "last_bwd": [
            _traffic("eager_final_norm_bwd", (6.0 * x + 1.5 * x) * EAGER_BACKWARD_RATIO, 6),
            _traffic("eager_lm_head_wgrad_cast", 6.0 * head),
            _traffic("eager_cross_entropy_bwd", 11.0 * logits - 3.0 * logits, 3),
        ],
    }


# Attention dropout probability of the Megatron-LM GPT runs (Korthikanti et al. 2022 sec. 4).
ATTENTION_DROPOUT = 0.1


def _unfused_attention(
    model: ModelConfig, plan: TrainPlan, fwd: list[LayerOp], bwd: list[LayerOp]
) -> tuple[list[LayerOp], list[LayerOp]]:
    """Megatron-LM's core attention before FlashAttention (Korthikanti et al. 2022, fig. 4
    and eq. 1's 5as^2b term): batched Q K^T over the whole s x s square (no causal
    skipping), the fused scale-mask-softmax, dropout with a byte mask, and the batched
    scores x V; the backward runs two GEMMs per forward GEMM, the softmax backward and
    the dropout backward. The s x s tensors are the cost the flash kernel removes."""
    b, s = plan.micro_batch, plan.seq_len
    heads = model.num_heads // plan.tp
    d = model.head_dim
    dt = Dtype(plan.activation_dtype)
    bh = b * heads
    elems = bh * s * s

    def gemm(name: str, m: int, n: int, k: int) -> LayerOp:
        return LayerOp(name, Op(op=OpKind.gemm, dtype=dt, m=m, n=n, k=k, batch=bh))

    softmax = Op(op=OpKind.softmax, dtype=dt, m=bh * s, n=s)
    softmax_bwd = Op(op=OpKind.softmax, dtype=dt, m=bh * s * 3 // 2, n=s)
    # dropout forward: read scores, write output and a 1-byte mask (5 bytes per element
    # in fp16); backward: read the gradient and the mask, write the gradient (5 bytes).
    drop = _traffic("attn_dropout", 5.0 * elems) if ATTENTION_DROPOUT else None
    drop_b = _traffic("attn_dropout_bwd", 5.0 * elems) if ATTENTION_DROPOUT else None
    core_f = [gemm("attn_scores", s, s, d), LayerOp("attn_softmax", softmax)]
    core_f += [drop] if drop else []
    core_f += [gemm("attn_context", s, d, s)]
    core_b = [gemm("attn_context_dgrad", s, s, d), gemm("attn_context_vgrad", s, d, s)]
    core_b += [drop_b] if drop_b else []
    core_b += [LayerOp("attn_softmax_bwd", softmax_bwd)]
    core_b += [gemm("attn_scores_qgrad", s, d, s), gemm("attn_scores_kgrad", s, d, s)]
    out_f = [x for o in fwd for x in (core_f if o.op.op.value in ATTENTION else [o])]
    out_b = [x for o in bwd for x in (core_b if o.op.op.value in ATTENTION else [o])]
    return out_f, out_b


def _fp8_casts(model: ModelConfig, plan: TrainPlan, phase: str) -> list[LayerOp]:
    """FP8 GEMMs need their operands quantised (Micikevicius et al. 2022, "FP8 formats for
    deep learning"; Transformer Engine): each GEMM input is read in bf16 and written in
    fp8 plus, on Hopper, a transposed fp8 copy for the other GEMMs of the backward (4
    bytes of traffic per element). Forward: the inputs of QKV, output, up and down
    projections; backward: the gradients of their outputs. Weights are cast once per
    iteration (negligible next to activations at training batch sizes)."""
    tp = plan.tp
    t = plan.micro_batch * plan.seq_len // plan.cp
    h = model.hidden_size
    q = model.num_heads * model.head_dim / tp
    kv = max(1, model.num_kv_heads // tp) * model.head_dim
    f = model.ffn_hidden_size / tp * (2 if model.activation == "swiglu" else 1)
    fwd_widths = [h, q, h, model.ffn_hidden_size / tp]
    widths = fwd_widths if phase == "fwd" else [q + 2 * kv, h, f, h]
    return [_traffic(f"fp8_cast_{phase}", 4.0 * t * sum(widths), len(widths))]
