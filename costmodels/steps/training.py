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
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from costmodels.ops.analytical import AnalyticalCostModel
from costmodels.ops.learned import LearnedCostModel
from costmodels.steps.composition import Composition
from costmodels.steps.mixer_scan import scale_training
from costmodels.steps.sparse_linear import eager_call_floor, sparsify_training_groups
from hardware_specs.registry import System
from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose import LayerOp, op_groups, params_per_tp_rank
from workloads.decompose.training import ATTENTION, Framework
from workloads.models import ModelConfig
from workloads.ops import Op, OpKind, ops_frame
from workloads.plan import PlanError, TrainPlan

CostModel = AnalyticalCostModel | LearnedCostModel

COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
# TP communication overlap (Megatron/Transformer Engine --tp-comm-overlap; Wang et al.
# 2022, "Overlap communication with dependent computation via decomposition"): each TP
# collective is split into chunks pipelined with the GEMM it feeds or follows, so at most
# the GEMMs' time can hide it and the first chunk stays exposed (1/4 at 4 chunks). What
# runs beside the GEMMs still slows them: COMM_INTERFERENCE seconds of compute per second
# of overlapped NVLink collective, measured on our DDP steps (see simcli.training.simulator).
TP_OVERLAP_CHUNKS = 4
# Seconds added to the compute stream per second of NVLink collective running beside it:
# NCCL's kernels take SMs and HBM bandwidth from the GEMMs they overlap. Fitted (0.7, the
# min-max error over 0.5..1.0) on the 2-GPU DDP steps of calibrate/data/steps-h200-x4,
# where a 6 GB fp32 all-reduce that the backward could hide three times over still added
# 70-80% of its duration; the 4-GPU DDP and the FSDP rows of that folder are the check.
COMM_INTERFERENCE = 0.7


# CPU offload (ZeRO-Offload, Ren et al. 2021; Megatron --optimizer-cpu-offload). The host's
# Adam streams fp32 master, m, v and the gradient in and master, m, v and the bf16 weight
# out: 30 B per parameter. Measured (calibrate/data/offload-h100-sxm, `python3 -m
# calibrate.steps.offload_bench`): torch's fused CPU AdamW with 16 threads steps 139 GB/s
# in those bytes on the lent H100 host (one process alone). With every GPU of a node
# offloading at once the host's memory bus bounds it: a 2-socket DDR5 server (8 channels x
# 4800 MT/s x 8 B = 307 GB/s per socket), ~60% of it streamed, over 8 GPUs = 46 GB/s per
# GPU, ASSUMED (not measurable on one lent GPU). The slower of the two counts.
CPU_ADAM_BYTES_PER_PARAM = 30.0
CPU_ADAM_PROCESS_BYTES_PER_S = 139e9
HOST_ADAM_BYTES_PER_S_PER_GPU = min(CPU_ADAM_PROCESS_BYTES_PER_S, 46e9)
# Pinned host <-> device copies run at 86.5% of the host link's raw rate (measured: 54.5
# GB/s of PCIe 5.0 x16's 63, 64 MiB-1 GiB, both directions; same data), and a copy on its
# own stream hid completely behind a bf16 GEMM chain (0.331 s together vs 0.330 s GEMMs
# alone, 0.156 s copy alone): no interference term for activation offload.
HOST_COPY_EFFICIENCY = 0.865


def optimizer_offload_s(n_params, grad_bytes: float, system: System):
    """Seconds of the host-side optimizer step for ``n_params`` parameters (a number or an
    array, as the plan search passes): the CPU Adam and the gradient copy down and weight
    copy up over the GPU's host link, pipelined in chunks (Megatron's HybridDeviceOptimizer
    overlaps them), so the slower one counts."""
    cpu_s = n_params * CPU_ADAM_BYTES_PER_PARAM / HOST_ADAM_BYTES_PER_S_PER_GPU
    copy_s = n_params * (grad_bytes + 2.0) / (system.host_link.bytes_per_s * HOST_COPY_EFFICIENCY)
    return np.maximum(cpu_s, copy_s)


def activation_offload_exposed_s(nbytes: float, compute_s: float, system: System) -> float:
    """Seconds a layer's activation copy to (forward) or from (backward) the host adds
    when it runs beside the layer's compute on a copy stream (TE cpu_offload): what the
    compute cannot hide."""
    return max(0.0, nbytes / (system.host_link.bytes_per_s * HOST_COPY_EFFICIENCY) - compute_s)


def tp_overlap_exposed_s(comm_s: float, gemm_s: float) -> float:
    """Seconds a phase's TP collectives add under chunked overlap with its GEMMs: what
    the GEMMs cannot hide, the first chunk, and the interference of the hidden part."""
    hidden = min(comm_s, gemm_s) * (1.0 - 1.0 / TP_OVERLAP_CHUNKS)
    return comm_s - hidden + COMM_INTERFERENCE * hidden


@dataclass(frozen=True)
class Phase:
    """Seconds of one layer (or stage extra) for one micro-batch, split by kind."""

    compute_s: float = 0.0
    tp_comm_s: float = 0.0
    cp_comm_s: float = 0.0  # exposed context-parallel communication
    ep_comm_s: float = 0.0  # expert-parallel all-to-alls
    by_op_s: dict[str, float] = field(default_factory=dict)
    launches: int = 0  # op instances the host dispatches (collectives excluded)
    collectives: int = 0  # TP collective calls the host dispatches

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


def group_nodes(size: int, stride: int, gpus_per_node: int) -> int:
    """Nodes spanned by a group of ``size`` ranks ``stride`` apart (Megatron rank order).

    A group split unevenly over nodes (3 ranks of stride 4 on 8-GPU nodes: 2 + 1) is
    priced as spread over the next node count that divides it (3): its ring crosses the
    network as often as that, and the collective models assume equal ranks per node."""
    if size <= 1:
        return 1
    if stride >= gpus_per_node:
        return size
    nodes = max(1, math.ceil(size / max(1, gpus_per_node // stride)))
    while size % nodes:
        nodes += 1
    return nodes


def grad_group_nodes(plan: TrainPlan, gpus_per_node: int) -> int:
    """Nodes spanned by the gradient-reduction group: data-parallel with context
    parallelism, ``dp * cp`` ranks (Megatron-LM's
    ``get_data_parallel_group(with_context_parallel=True)``).

    Megatron's order (tp-cp-dp-pp) makes it one group of ``dp * cp`` ranks ``tp`` apart.
    Llama 3's (tp-cp-pp-dp) does not: ``dp`` blocks of ``cp`` ranks ``tp`` apart, the
    blocks ``dp_stride`` apart; priced as the CP group's nodes times the DP group's,
    exact when a block sits inside one node or spans whole nodes (power-of-two sizes),
    and the uniform count when ``pp == 1`` makes the two orders equal."""
    dp, cp, tp = plan.data_parallel, plan.cp, plan.tp
    if plan.rank_order == "tp-cp-dp-pp" or plan.pp == 1:
        return group_nodes(dp * cp, tp, gpus_per_node)
    return group_nodes(cp, tp, gpus_per_node) * group_nodes(dp, plan.dp_stride, gpus_per_node)


def with_nodes(op: Op, nodes: int) -> Op:
    if op.op.value in COLLECTIVES and nodes > 1:
        return op.model_copy(update={"nodes": nodes})
    return op


def sum_phase(items: list[LayerOp], times: np.ndarray, plan: TrainPlan, attn_scale: float) -> Phase:
    compute = tp = gemm = 0.0
    launches = colls = 0
    by_op: dict[str, float] = {}
    for item, t in zip(items, times, strict=True):
        kind = item.op.op.value
        sec = float(t) * item.count
        if kind in ATTENTION:
            sec *= attn_scale
        if kind in COLLECTIVES:
            tp += sec
            colls += item.count
        else:
            compute += sec
            launches += item.count
            gemm += sec if kind == "gemm" else 0.0
        by_op[item.name] = by_op.get(item.name, 0.0) + sec
    if plan.tp_comm == "overlap":
        tp = tp_overlap_exposed_s(tp, gemm)
    elif plan.tp_comm == "ladder":
        # Ladder Residual (Zhang et al. 2025): block i's all-reduce runs while block i+1
        # computes on the not-yet-reduced residual, so only comm beyond compute shows.
        tp = max(0.0, tp - compute)
    return Phase(
        compute_s=compute, tp_comm_s=tp, by_op_s=by_op, launches=launches, collectives=colls
    )


def step_costs(
    model: ModelConfig,
    plan: TrainPlan,
    cost_model: CostModel,
    system: System,
    attn_backend: str = "",
    framework: Framework = "megatron",
    composition: Composition | None = None,
    weight_sparsity: str | None = None,
) -> StepCosts:
    """Price one micro-batch of ``plan`` on one rank (see the module docstring).

    ``framework``: the engine whose ops :func:`workloads.decompose.op_groups` lists
    (``megatron`` fused kernels, ``megatron-unfused`` pre-FlashAttention core attention,
    ``pytorch`` eager PyTorch under autocast, ``pytorch-compile`` compiled blocks).
    ``composition``: per-group factors fitted from whole-step traces
    (:mod:`costmodels.steps.composition`), applied to every op but collectives.
    ``weight_sparsity``: ``2:4`` linear layers (:mod:`costmodels.steps.sparse_linear`)."""
    gpn = system.node.gpus_per_node
    tp, cp, mb = plan.tp, plan.cp, plan.micro_batch
    seq_local = plan.seq_len // cp
    act_dtype = plan.activation_dtype
    attn_scale = 1.0 / cp
    groups = op_groups(model, plan, attn_backend, framework)
    if weight_sparsity:
        groups = sparsify_training_groups(groups, weight_sparsity, system.gpu)
    tp_nodes = group_nodes(tp, 1, gpn)
    ops = [with_nodes(o.op, tp_nodes) for g in groups for o in g]
    times = cost_model.predict_many(ops_frame(ops))
    times = scale_training(groups, times, model)
    if weight_sparsity:
        times = eager_call_floor(times, ops, framework, system.gpu)
    if composition is not None:
        times = times * composition.factors_for(framework, [o.op.value for o in ops])
    parts: list[np.ndarray] = []
    start = 0
    for g in groups:
        parts.append(times[start : start + len(g)])
        start += len(g)
    phases = [sum_phase(g, t, plan, attn_scale) for g, t in zip(groups, parts, strict=True)]
    layer_f, layer_b, f_f, f_b, l_f, l_b = phases

    # Context-parallel and expert-parallel communication of one layer.
    cp_f, cp_b = cp_comm_s(model, plan, cost_model, system, layer_f, layer_b)
    ep_f, ep_b = _ep_comm(model, plan, cost_model, system)
    layer_f = replace(layer_f, cp_comm_s=cp_f, ep_comm_s=ep_f)
    layer_b = replace(layer_b, cp_comm_s=cp_b, ep_comm_s=ep_b)

    recompute = recompute_phase(plan, layer_f)

    # What a pipeline stage sends: its output, one hidden vector per token (the sequence
    # shard under SP). Megatron's residual stream is in the activation dtype; eager
    # PyTorch under autocast keeps fp32 parameters, so its residual stream, and the
    # activation and gradient sent between stages, are fp32 (calibrate/steps/par_step.py).
    p2p_dtype = act_dtype
    if framework in ("pytorch", "pytorch-compile") and plan.master_dtype == "fp32":
        p2p_dtype = "fp32"
    elt = DTYPE_BYTES[Dtype(p2p_dtype)]
    tokens = mb * seq_local
    p2p_bytes = tokens * model.hidden_size * elt / (tp if plan.sp else 1)
    p2p_nodes = 2 if plan.stage_stride >= gpn else 1
    p2p_op = Op(op=OpKind.send_recv, dtype=Dtype(p2p_dtype), bytes=int(p2p_bytes), ranks=2)
    p2p_op = with_nodes(p2p_op, p2p_nodes)
    p2p_s = float(cost_model.predict_many(ops_frame([p2p_op]))[0]) if plan.pp > 1 else 0.0

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
        names = [n for n in layer_f.by_op_s if n == "attn" or n.startswith("attn_")]
        attn = sum(layer_f.by_op_s[n] for n in names)
        return Phase(compute_s=attn, by_op_s={"attn": attn}, launches=len(names))
    return Phase()


def host_launches(
    c: StepCosts, layers: int, microbatches: int, first: bool, last: bool, optimizer_ops: int
) -> int:
    """Op instances one rank's host dispatches in an iteration: every micro-batch's
    forward, backward and recomputed forward of its ``layers``, the embedding (``first``)
    and head (``last``) stages, then the optimizer's ops; what a composition's
    ``host_s_per_op`` multiplies (:mod:`costmodels.steps.composition`)."""
    per_layer = c.layer_fwd.launches + c.layer_bwd.launches + c.layer_recompute.launches
    per_mb = layers * per_layer
    if first:
        per_mb += c.first_fwd.launches + c.first_bwd.launches
    if last:
        per_mb += c.last_fwd.launches + c.last_bwd.launches
    return microbatches * per_mb + optimizer_ops


# Host time of one tensor-parallel collective call of an eager engine, in ops of its
# ``host_s_per_op``: the NCCL call and the autograd machinery around it (Megatron's
# sequence-parallel regions written as Python autograd functions, the async handles and
# waits of the backward's overlapped re-gather and reduce-scatter, the shard buffers).
# Measured on 4 H200s (calibrate/data/steps-par-h200-x4/host, one device call): TP steps
# of 1k tokens took 1.8x the host time per op of one-GPU steps of the same models on the
# same machine. Fitted (calibrate.trace.tp_host) on llama3.2-1b-like at TP 2 and 4 against
# that machine's own one-GPU host time per op: 6.9 and 7.9 ops per collective; held out,
# llama2-small-mha on the same machine is predicted within 3.2%.
HOST_OPS_PER_COLLECTIVE = 7.4


def host_collectives(c: StepCosts, layers: int, microbatches: int, first: bool, last: bool) -> int:
    """TP collective calls one rank's host dispatches in an iteration (the region
    collectives, re-gathers and the vocab-parallel loss's all-reduces of every micro-batch
    of its ``layers``, embedding and head)."""
    per_layer = c.layer_fwd.collectives + c.layer_bwd.collectives
    per_layer += c.layer_recompute.collectives
    per_mb = layers * per_layer
    if first:
        per_mb += c.first_fwd.collectives + c.first_bwd.collectives
    if last:
        per_mb += c.last_fwd.collectives + c.last_bwd.collectives
    return microbatches * per_mb


def host_work(
    c: StepCosts, layers: int, microbatches: int, first: bool, last: bool, optimizer_ops: int
) -> float:
    """One rank's host work per iteration in ops of ``host_s_per_op``: the ops it launches
    (:func:`host_launches`) and its TP collective calls at
    :data:`HOST_OPS_PER_COLLECTIVE` each."""
    ops = host_launches(c, layers, microbatches, first, last, optimizer_ops)
    calls = host_collectives(c, layers, microbatches, first, last)
    return ops + HOST_OPS_PER_COLLECTIVE * calls


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
    gates = 3 if model.gated_mlp else 2
    expert = model.num_experts * gates * model.hidden_size * model.expert_ffn_hidden_size
    expert_per_rank = expert // plan.tp
    if model.num_dense_layers:  # the mean layer: routed experts in the MoE layers' share
        expert_per_rank = expert_per_rank * model.moe_layers // model.num_layers
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
    if model.is_mla:  # Q K^T at the QK head width, P V at the value width
        width = model.attention_matmul_width
        return dense + 6.0 * model.attention_layers * 2.0 * width * seq_len * tokens / 2
    width = model.num_heads * model.head_dim
    attn = 6.0 * model.attention_layers * 2.0 * width * seq_len * tokens / 2
    return dense + attn


def collective_s(
    cost_model: CostModel, kind: str, nbytes: float, ranks: int, nodes: int, dtype: str
) -> float:
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    op = Op(op=OpKind(kind), dtype=Dtype(dtype), bytes=int(nbytes), ranks=ranks)
    return float(cost_model.predict_many(ops_frame([with_nodes(op, nodes)]))[0])


@dataclass(frozen=True)
class Comm:
    """One collective of a plan's layer, before pricing (see :func:`collective_s`)."""

    kind: str
    nbytes: float
    ranks: int
    nodes: int
    dtype: str


def hierarchical_split(cp: int, tp: int, gpus_per_node: int) -> tuple[int, int]:
    """(Ulysses degree inside a node, ring degree across nodes) of hierarchical CP: the
    largest divisor of ``cp`` whose CP ranks (stride ``tp``) fit in one node."""
    return (u := math.gcd(cp, max(1, gpus_per_node // tp))), cp // u


def _a2a_kv(kv_heads: int, ranks: int, tokens: int, head_dim: int, elt: int) -> tuple[str, float]:
    """Ulysses' K/V exchange over ``ranks``: an all-to-all when the KV heads split over
    them; with fewer KV heads than ranks (GQA), each rank needs whole heads, so K and V
    are replicated: every rank gathers its ceil(kv / ranks) heads over the full sequence."""
    if kv_heads % ranks == 0:
        return "all_to_all", 2.0 * tokens * kv_heads * head_dim * elt
    per_rank = -(-kv_heads // ranks)
    return "all_gather", 2.0 * tokens * ranks * per_rank * head_dim * elt


def cp_comms(model: ModelConfig, plan: TrainPlan, gpus_per_node: int) -> dict[str, Comm]:
    """The context-parallel collectives of one layer: Ulysses' all-to-alls (``a2a`` of Q
    and of the output, ``a2a_kv``), one ring step's K/V send (``step_f``; ``step_b`` also
    returns their gradients), the all-gathered K/V (``ag_kv``) and the reduce-scattered
    K/V gradients (``rs_kv``), or hierarchical CP's intra-node all-to-alls and inter-node
    ring steps."""
    cp = plan.cp
    if cp == 1:
        return {}
    nodes = group_nodes(cp, plan.tp, gpus_per_node)
    act = plan.activation_dtype
    elt = DTYPE_BYTES[Dtype(act)]
    tokens = plan.micro_batch * plan.seq_len // cp
    kv_heads = max(1, model.num_kv_heads // plan.tp)
    q_heads = model.num_heads // plan.tp
    d = model.head_dim
    kv_bytes = 2.0 * tokens * kv_heads * d * elt
    q_bytes = tokens * q_heads * d * elt
    if plan.cp_kind == "ulysses":
        # all-to-all of Q, K, V before attention and of the output after; the same in
        # backward for the gradients. Each rank's send buffer is its whole local tensor.
        kind, nbytes = _a2a_kv(kv_heads, cp, tokens, d, elt)
        return {
            "a2a": Comm("all_to_all", q_bytes, cp, nodes, act),
            "a2a_kv": Comm(kind, nbytes, cp, nodes, act),
        }
    if plan.cp_kind == "allgather":
        # Llama 3 (Grattafiori et al. 2024, sec. 3.3.2): K and V all-gathered before the
        # local queries' attention (cheap under GQA), not kept for the backward, which
        # gathers them again and reduce-scatters their gradients.
        return {
            "ag_kv": Comm("all_gather", kv_bytes * cp, cp, nodes, act),
            "rs_kv": Comm("reduce_scatter", kv_bytes * cp, cp, nodes, "fp32"),
        }
    if plan.cp_kind == "hierarchical":
        # USP (Fang & Zhao 2024) / Megatron's a2a+p2p: Ulysses over the u CP ranks of a
        # node (NVLink), then a ring over the r node groups; each ring step moves the
        # K/V of the rank's heads, the same bytes as its local K/V.
        u, r = hierarchical_split(cp, plan.tp, gpus_per_node)
        if q_heads % u:
            raise PlanError(
                f"hierarchical cp={cp} runs Ulysses over the {u} CP ranks of a node, which "
                f"must divide the {q_heads} query heads per TP rank; allowed: cp_kind ring, "
                "allgather, or a cp whose in-node part divides the heads"
            )
        kind, nbytes = _a2a_kv(kv_heads, u, tokens, d, elt)
        return {
            "a2a": Comm("all_to_all", q_bytes, u, 1, act),
            "a2a_kv": Comm(kind, nbytes, u, 1, act),
            "step_f": Comm("send_recv", kv_bytes, 2, 2 if r > 1 and nodes > 1 else 1, "bf16"),
            "step_b": Comm("send_recv", 2.0 * kv_bytes, 2, 2 if r > 1 and nodes > 1 else 1,
                           "bf16"),
        }  # fmt: skip
    # Ring: TokenRing splits each step over both directions of the ring, halving the
    # bytes on the slower direction; the ring's slowest hop leaves the node.
    p2p_nodes = 2 if nodes > 1 else 1
    step = kv_bytes / (2.0 if plan.cp_kind == "tokenring" else 1.0)
    return {
        "step_f": Comm("send_recv", step, 2, p2p_nodes, "bf16"),
        "step_b": Comm("send_recv", 2.0 * step, 2, p2p_nodes, "bf16"),
    }


def cp_exposed_s(
    plan: TrainPlan, times_s: dict[str, float], attn_f_s: float, attn_b_s: float,
    gpus_per_node: int = 8,
) -> tuple[float, float]:  # fmt: skip
    """Exposed CP communication per layer (forward, backward) from the priced
    :func:`cp_comms`: Ulysses' all-to-alls and the all-gathered K/V are on the critical
    path; a ring's steps each overlap one attention block (1/steps of the local attention
    work); hierarchical CP pays its all-to-alls and a ring over the node groups."""
    cp = plan.cp
    if cp == 1:
        return 0.0, 0.0
    if plan.cp_kind == "ulysses":
        one = 2.0 * times_s["a2a"] + times_s["a2a_kv"]
        return one, one
    if plan.cp_kind == "allgather":
        return times_s["ag_kv"], times_s["ag_kv"] + times_s["rs_kv"]
    steps = cp
    a2a = 0.0
    if plan.cp_kind == "hierarchical":
        steps = hierarchical_split(cp, plan.tp, gpus_per_node)[1]
        a2a = 2.0 * times_s["a2a"] + times_s["a2a_kv"]
    exposed_f = a2a + (steps - 1) * max(0.0, times_s["step_f"] - attn_f_s / steps)
    exposed_b = a2a + (steps - 1) * max(0.0, times_s["step_b"] - attn_b_s / steps)
    return exposed_f, exposed_b


def ep_comm(model: ModelConfig, plan: TrainPlan, gpus_per_node: int) -> Comm | None:
    """Token dispatch (and, priced the same, combine) all-to-all of an expert-parallel MoE
    layer (GShard); None without expert parallelism. Under routing skew the busiest EP
    rank receives ``moe_imbalance`` times the mean rank's tokens and every rank waits for
    it, so the per-rank bytes scale by that factor (the busiest rank's volume). A model
    mixing dense and MoE layers pays it in the MoE layers' share of the mean layer."""
    if model.num_experts == 1 or plan.ep == 1:
        return None
    nodes = group_nodes(plan.ep, plan.dp_stride, gpus_per_node)
    elt = DTYPE_BYTES[Dtype(plan.activation_dtype)]
    tokens = plan.micro_batch * plan.seq_len // plan.cp
    nbytes = tokens * model.experts_per_token * model.hidden_size * elt
    if model.moe_imbalance != 1.0:
        nbytes = nbytes * model.moe_imbalance
    if model.num_dense_layers:
        nbytes = nbytes * model.moe_layers / model.num_layers
    return Comm("all_to_all", nbytes, plan.ep, nodes, plan.activation_dtype)


def cp_comm_s(
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
        k: collective_s(cost_model, c.kind, c.nbytes, c.ranks, c.nodes, c.dtype)
        for k, c in comms.items()
    }
    attn_f, attn_b = layer_f.by_op_s.get("attn", 0.0), layer_b.by_op_s.get("attn_bwd", 0.0)
    return cp_exposed_s(plan, times, attn_f, attn_b, system.node.gpus_per_node)


def _ep_comm(
    model: ModelConfig, plan: TrainPlan, cost_model: CostModel, system: System
) -> tuple[float, float]:
    """Dispatch and combine all-to-alls of an expert-parallel MoE layer, each direction."""
    c = ep_comm(model, plan, system.node.gpus_per_node)
    if c is None:
        return 0.0, 0.0
    one = collective_s(cost_model, c.kind, c.nbytes, c.ranks, c.nodes, c.dtype)
    return 2.0 * one, 2.0 * one
