"""Discrete-event simulation of one training iteration, micro-batch by micro-batch.

Every rank of one pipeline (the ``pp`` ranks that share a TP/CP/DP coordinate; all
pipelines run the same schedule) has a compute stream and a communication stream.
Compute tasks are forward or backward passes of one model chunk for one micro-batch,
in the order the schedule gives each rank (GPipe; 1F1B, Narayanan et al. 2021 sec. 2.2;
interleaved 1F1B, ibid. sec. 2.2.2, in Megatron-LM's ``forward_backward_pipelining_with_
interleaving`` order). A task starts when its rank is free and its input has arrived:
the previous chunk's forward (or the next chunk's backward) plus the point-to-point
transfer. TP collectives sit inside the task times (on the critical path, unless the
plan overlaps them); DP gradient buckets are reduced on the communication stream as the
last micro-batch's backward produces them (Megatron's overlapped grad reduce), so only
the tail is exposed; ZeRO-3 parameter all-gathers are prefetched one layer ahead and
expose only what the layer's compute cannot hide. The optimizer step follows.

Uneven stages and the bubble therefore come out of the simulation, not out of the
``(p - 1) / m`` formula, which the tests check it reproduces for even stages.
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from costmodels.steps.composition import Composition
from costmodels.steps.memory import layer_activation_bytes
from costmodels.steps.training import (
    COMM_INTERFERENCE,
    CostModel,
    Framework,
    StepCosts,
    activation_offload_exposed_s,
    collective_s,
    grad_group_nodes,
    host_work,
    optimizer_offload_s,
    step_costs,
)
from hardware_specs.registry import System
from hardware_specs.schema import Dtype
from workloads.decompose import optimizer_ops
from workloads.models import ModelConfig
from workloads.ops import ops_frame
from workloads.plan import PlanError, TrainPlan, check_plan

PHASES = ("F", "B")


@dataclass(frozen=True)
class Task:
    rank: int
    chunk: int  # global model chunk index, 0 .. pp*vpp - 1
    mb: int
    phase: str  # "F" | "B"


@dataclass
class Span:
    """A simulated interval for reports and traces."""

    rank: int
    stream: str  # compute | dp-comm | pp-comm
    name: str
    start_s: float
    end_s: float


@dataclass
class TrainResult:
    iteration_s: float
    tokens_per_s: float
    mfu: float  # model FLOPs over the peak of the precision the GEMMs run in (mfu_peak_dtype)
    model_flops: float
    breakdown_s: dict[str, float]
    stages: list[dict[str, float]]
    spans: list[Span] = field(default_factory=list)
    costs: StepCosts | None = None
    num_microbatches: int = 0
    mfu_peak_dtype: str = "bf16"  # fp8 plans: normalised to the fp8 tensor-core peak

    def trace_events(self) -> list[dict]:
        """Chrome/Perfetto trace events: one process per pipeline rank, one thread per
        stream; times in microseconds as the format requires."""
        tids = {"compute": 0, "pp-comm": 1, "dp-comm": 2, "optimizer": 3}
        out: list[dict] = []
        ranks = sorted({s.rank for s in self.spans})
        for r in ranks:
            out.append(
                {"name": "process_name", "ph": "M", "pid": r, "tid": 0,
                 "args": {"name": f"pipeline rank {r}"}}
            )  # fmt: skip
            for stream, tid in tids.items():
                out.append(
                    {"name": "thread_name", "ph": "M", "pid": r, "tid": tid,
                     "args": {"name": stream}}
                )  # fmt: skip
        for s in self.spans:
            out.append(
                {
                    "name": s.name,
                    "cat": s.stream,
                    "ph": "X",
                    "pid": s.rank,
                    "tid": tids[s.stream],
                    "ts": s.start_s * 1e6,
                    "dur": max(0.0, (s.end_s - s.start_s) * 1e6),
                }
            )
        return out

    def write_trace(self, path: str | Path) -> None:
        from simcli.output import atomic_write_text

        atomic_write_text(Path(path), json.dumps({"traceEvents": self.trace_events()}))


# Seconds added to the compute stream per second of NVLink collective running beside it
# (costmodels.steps.training.COMM_INTERFERENCE, fitted on our DDP steps). Network-bound
# collectives move bytes (and load the GPU) slower, in proportion to the NIC / NVLink
# bandwidth ratio.
INTERFERENCE = COMM_INTERFERENCE


def interference(system: System, nodes: int) -> float:
    """:data:`INTERFERENCE` for a group inside one node; scaled down across nodes."""
    if nodes <= 1:
        return INTERFERENCE
    ratio = system.nominal_nic_bytes_per_s / system.node.intra_node_bytes_per_s
    return INTERFERENCE * min(1.0, ratio)


# --------------------------------------------------------------------------- schedules


def schedule(plan: TrainPlan) -> list[list[Task]]:
    """Per pipeline rank, its compute tasks in execution order."""
    p, v, m = plan.pp, plan.vpp, plan.num_microbatches
    out: list[list[Task]] = []
    for r in range(p):
        if plan.pp_schedule == "gpipe":
            tasks = [Task(r, r, j, "F") for j in range(m)] + [Task(r, r, j, "B") for j in range(m)]
        elif plan.pp_schedule == "1f1b":
            warm = min(p - r - 1, m)
            fs = [Task(r, r, j, "F") for j in range(m)]
            bs = [Task(r, r, j, "B") for j in range(m)]
            tasks = fs[:warm]
            for k in range(m - warm):
                tasks += [fs[warm + k], bs[k]]
            tasks += bs[m - warm :]
        else:
            tasks = _interleaved(r, p, v, m)
        out.append(tasks)
    return out


def _interleaved(r: int, p: int, v: int, m: int) -> list[Task]:
    """Megatron-LM's interleaved order: micro-batches in groups of p per chunk; warm-up
    of (p - r - 1) * 2 + (v - 1) * p forwards, then one forward / one backward."""
    total = m * v

    def unit(k: int, forward: bool) -> Task:
        local = (k // p) % v
        if not forward:
            local = v - 1 - local
        mb = (k // (p * v)) * p + k % p
        return Task(r, local * p + r, mb, "F" if forward else "B")

    warm = min((p - r - 1) * 2 + (v - 1) * p, total)
    tasks = [unit(k, True) for k in range(warm)]
    for k in range(total - warm):
        tasks += [unit(warm + k, True), unit(k, False)]
    tasks += [unit(k, False) for k in range(total - warm, total)]
    return tasks


# --------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class _Durations:
    fwd_s: tuple[float, ...]  # per chunk
    bwd_s: tuple[float, ...]
    layers: tuple[int, ...]


def _durations(
    model: ModelConfig, plan: TrainPlan, c: StepCosts, zero3_exposed: tuple
) -> _Durations:
    layers = plan.layers_per_chunk(model.num_layers)
    last = plan.num_chunks - 1
    zf, zb = zero3_exposed
    fwd, bwd = [], []
    for chunk, n in enumerate(layers):
        f = n * (c.layer_fwd.total_s + zf)
        b = n * (c.layer_bwd.total_s + c.layer_recompute.total_s + zb)
        if chunk == 0:
            f += c.first_fwd.total_s
            b += c.first_bwd.total_s
        if chunk == last:
            f += c.last_fwd.total_s
            b += c.last_bwd.total_s
        fwd.append(f)
        bwd.append(b)
    return _Durations(tuple(fwd), tuple(bwd), layers)


def _run_pipeline(
    plan: TrainPlan, dur: _Durations, p2p_s: float | np.ndarray, spans: list[Span] | None
) -> tuple[np.ndarray, dict[tuple[int, int], tuple[float, float]]]:
    """Event-driven list scheduling. Returns per-rank compute end times and, for each
    (rank, chunk), the (start, end) of its last backward (when its gradients are ready)."""
    order = schedule(plan)
    p, last_chunk = plan.pp, plan.num_chunks - 1
    # p2p[src, dst]: transfer time of one activation between two pipeline ranks
    p2p = np.broadcast_to(np.asarray(p2p_s, dtype=float), (p, p))
    done: dict[Task, float] = {}
    free = np.zeros(p)
    pos = [0] * p
    grads_ready: dict[tuple[int, int], tuple[float, float]] = {}
    remaining = sum(len(t) for t in order)
    # Ready times of tasks whose dependency finished; a heap of (time, rank) wakes ranks.
    heap: list[tuple[float, int]] = [(0.0, r) for r in range(p)]
    heapq.heapify(heap)
    while remaining:
        if not heap:
            raise RuntimeError("pipeline schedule deadlocked (a bug in the schedule order)")
        _, r = heapq.heappop(heap)
        progressed = False
        while pos[r] < len(order[r]):
            t = order[r][pos[r]]
            dep = task_dependency(t, last_chunk, p)
            if dep is not None and dep not in done:
                break
            arrive = 0.0
            if dep is not None:
                arrive = done[dep] + (p2p[dep.rank, r] if dep.rank != r else 0.0)
            start = max(free[r], arrive)
            length = dur.fwd_s[t.chunk] if t.phase == "F" else dur.bwd_s[t.chunk]
            end = start + length
            done[t] = end
            free[r] = end
            pos[r] += 1
            remaining -= 1
            progressed = True
            if t.phase == "B":
                grads_ready[(r, t.chunk)] = (start, end)
            if spans is not None:
                spans.append(Span(r, "compute", f"{t.phase} mb{t.mb} chunk{t.chunk}", start, end))
                if dep is not None and dep.rank != r and p2p[dep.rank, r] > 0:
                    spans.append(Span(r, "pp-comm", f"recv mb{t.mb}", done[dep], arrive))
            # wake the rank that consumes this task's output
            nxt = _consumer_rank(t, last_chunk, p)
            if nxt is not None:
                heapq.heappush(heap, (end, nxt))
        if progressed:
            heapq.heappush(heap, (free[r], r))
    return free, grads_ready


def _clean(seconds: float) -> float:
    """A difference of two sums of the same durations: float rounding can leave -1e-16
    where the answer is 0 (pp = 1 has no bubble), so tiny negatives are 0."""
    return 0.0 if seconds < 1e-12 else seconds


def task_dependency(t: Task, last_chunk: int, p: int) -> Task | None:
    """The task whose output ``t`` waits for (None: the first chunk's forward)."""
    if t.phase == "F":
        if t.chunk == 0:
            return None
        return Task((t.chunk - 1) % p, t.chunk - 1, t.mb, "F")
    if t.chunk == last_chunk:
        return Task(t.rank, t.chunk, t.mb, "F")
    return Task((t.chunk + 1) % p, t.chunk + 1, t.mb, "B")


def _consumer_rank(t: Task, last_chunk: int, p: int) -> int | None:
    if t.phase == "F":
        return (t.chunk + 1) % p if t.chunk < last_chunk else t.rank
    return (t.chunk - 1) % p if t.chunk > 0 else None


def simulate_iteration(
    model: ModelConfig,
    plan: TrainPlan,
    *,
    system: System,
    cost_model: CostModel,
    costs: StepCosts | None = None,
    attn_backend: str = "",
    framework: Framework = "megatron",
    keep_spans: bool = False,
    composition: Composition | None = None,
) -> TrainResult:
    """Simulate one iteration of ``plan`` for ``model`` on ``system`` (reference nodes or a
    described cluster, at least ``plan.num_gpus`` GPUs), its ops priced by ``cost_model``.

    Both are resolved by the caller (``simcli.scenario``); ``costs`` replaces the step
    costs :func:`~costmodels.steps.training.step_costs` would give (a sparse attention
    pattern, a batch priced at once by the plan search)."""
    check_plan(plan, model)
    if system.num_gpus < plan.num_gpus:
        raise PlanError(f"the plan needs {plan.num_gpus} GPUs; the cluster has {system.num_gpus}")
    c = costs
    if c is None:
        c = step_costs(model, plan, cost_model, system, attn_backend, framework, composition)
    opt_factor = 1.0 if composition is None else composition.factor(framework, "adamw")
    host_s = 0.0 if composition is None else composition.host_s_per_op(framework)
    offload = (0.0, 0.0)
    if plan.activation_offload > 0:
        # each layer's saved activations copied out in its forward, back in its backward
        nbytes = plan.activation_offload * layer_activation_bytes(
            model,
            micro_batch=plan.micro_batch,
            seq_len=plan.seq_len,
            tp=plan.tp,
            cp=plan.cp,
            sp=plan.sp,
            recompute=plan.recompute,
            precision=plan.precision,
            framework=framework,
        )
        offload = (
            activation_offload_exposed_s(nbytes, c.layer_fwd.compute_s, system),
            activation_offload_exposed_s(nbytes, c.layer_bwd.compute_s, system),
        )
    return _simulate(
        model, plan, system, cost_model, c, keep_spans, opt_factor, host_s, offload
    )


def _simulate(
    model: ModelConfig,
    plan: TrainPlan,
    system: System,
    cm: CostModel,
    c: StepCosts,
    keep_spans: bool,
    opt_factor: float = 1.0,
    host_s_per_op: float = 0.0,
    offload_s: tuple[float, float] = (0.0, 0.0),
) -> TrainResult:
    gpn = system.node.gpus_per_node
    dp = plan.data_parallel
    # Rank layout (plan.rank_order): stage r starts at rank r * stage_stride, its DP
    # group's ranks are dp_stride apart. Heterogeneous clusters and pods: a ring or a
    # point-to-point path crossing nodes runs at its slowest NIC / pod uplink share
    # (System.slowdown).
    stride, first_of = plan.dp_stride, plan.stage_stride
    # Gradients (and the distributed optimizer's / ZeRO's shards) reduce over the
    # data-parallel group *with* context parallelism, dp * cp ranks, as in Megatron-LM
    # (parallel_state.get_data_parallel_group(with_context_parallel=True)), NeMo and
    # PyTorch's context_parallel under DDP/FSDP: CP ranks hold the same weights and
    # different tokens. cp = 1: the plain DP group. Its node span: grad_group_nodes
    # (Megatron's order: dp * cp ranks tp apart; Llama 3's: the CP group's nodes times the
    # DP group's); its pod / NIC slowdown from its exact node set (stage_nodes).
    red = dp * plan.cp
    red_nodes = grad_group_nodes(plan, gpn)

    def stage_nodes(r: int) -> list[int]:
        first = r * first_of
        return sorted(
            {(first + c * plan.tp + d * stride) // gpn for c in range(plan.cp) for d in range(dp)}
        )

    dp_slow = [system.slowdown(stage_nodes(r)) for r in range(plan.pp)]
    # the nodes sending pipeline activations at once: a whole stage
    stage_nodes_n = max(1, (plan.tp * plan.cp * dp) // gpn)
    kappa = interference(system, red_nodes)
    # Collectives and optimizer steps priced once per distinct argument set (a plan has
    # many identical DP buckets; pricing one op at a time dominates otherwise).
    priced: dict[tuple, float] = {}

    def once_s(kind: str, nbytes: float, ranks: int, nodes: int, dtype: str) -> float:
        key = (kind, nbytes, ranks, nodes, dtype)
        if key not in priced:
            priced[key] = collective_s(cm, kind, nbytes, ranks, nodes, dtype)
        return priced[key]

    p2p = np.zeros((plan.pp, plan.pp))
    for a in range(plan.pp):
        for b in range(plan.pp):
            na, nb = (a * first_of) // gpn, (b * first_of) // gpn
            if a != b:
                slow = system.slowdown([na, nb], "send_recv", concurrent_nodes=stage_nodes_n)
                p2p[a, b] = c.p2p_s * (slow if na != nb else 1.0)
    grad_elt = plan.grad_bytes  # fp32 main grads under mixed precision unless chosen bf16
    param_elt = 1 if plan.precision == "fp8" else 2

    # ZeRO-2/3: each layer's gradients reduce-scattered after its backward, every
    # micro-batch (DeepSpeed ZeRO-2 and FSDP keep only the shard, so accumulation across
    # micro-batches and pipeline stages goes through the reduction); ZeRO-3 also
    # all-gathers each layer's parameters before its forward and backward. Prefetch and
    # the comm stream hide them behind the layer's compute (slowed by interference).
    zero3 = (0.0, 0.0)
    zero2_s = 0.0  # the ZeRO-2 reduce-scatter part, reported as DP communication
    if plan.zero >= 2 and red > 1:
        slow = dp_slow[0]
        rs = slow * once_s("reduce_scatter", c.layer_params * grad_elt, red, red_nodes, "fp32")
        gather = 0.0
        if plan.zero == 3:
            gather = slow * once_s("all_gather", c.layer_params * 2, red, red_nodes, "bf16")
        cf = c.layer_fwd.compute_s
        cb = c.layer_bwd.compute_s + c.layer_recompute.total_s
        zf = max(0.0, gather - cf) + kappa * min(gather, cf) if gather else 0.0
        zb = max(0.0, gather + rs - cb) + kappa * min(gather + rs, cb)
        zero3 = (zf, zb)
        if plan.zero == 2:
            zero2_s = zb
    per_layer = (zero3[0] + offload_s[0], zero3[1] + offload_s[1])
    dur = _durations(model, plan, c, per_layer)
    spans: list[Span] | None = [] if keep_spans else None
    compute_end, grads_ready = _run_pipeline(plan, dur, p2p, spans)

    # DP gradient reduction per rank: buckets of each chunk become ready during the
    # chunk's last backward and are reduced one after another on the comm stream.
    kind = "all_reduce" if plan.zero == 0 else "reduce_scatter"
    comm_end = compute_end.copy()
    if red > 1 and plan.zero < 2:
        for r in range(plan.pp):
            stream = overlapped = 0.0
            chunks = sorted(
                (ch for (rr, ch) in grads_ready if rr == r), key=lambda ch: grads_ready[(r, ch)]
            )
            for ch in chunks:
                start, end = grads_ready[(r, ch)]
                params = dur.layers[ch] * c.layer_params
                if ch == 0:
                    params += c.embedding_params
                if ch == plan.num_chunks - 1:
                    params += c.lm_head_params
                nbytes = params * grad_elt
                n_buckets = max(1, math.ceil(nbytes / plan.grad_bucket_bytes))
                t_bucket = dp_slow[r] * once_s(
                    kind, nbytes / n_buckets, red, red_nodes, "fp32" if grad_elt == 4 else "bf16"
                )
                for b in range(n_buckets):
                    ready = start + (end - start) * (b + 1) / n_buckets
                    if not plan.overlap_grad_reduce:
                        ready = compute_end[r]
                    s0 = max(stream, ready)
                    stream = s0 + t_bucket
                    overlapped += max(0.0, min(stream, compute_end[r]) - s0)
                    if spans is not None:
                        spans.append(Span(r, "dp-comm", f"{kind} chunk{ch} b{b}", s0, stream))
            # compute that ran beside the reduction was slowed by it (see INTERFERENCE)
            comm_end[r] = max(compute_end[r] + kappa * overlapped, stream)

    # Optimizer step on this rank's share, then (ZeRO-1/2, distributed optimizer) the
    # updated parameters all-gathered; overlapped with the next forward when grad
    # reduction is overlapped (Megatron's --overlap-param-gather), else exposed.
    shard = red if plan.zero >= 1 else 1  # the dp * cp group's share, as memory shards
    opt_end = np.zeros(plan.pp)
    param_gather = np.zeros(plan.pp)
    host_stall = np.zeros(plan.pp)
    for r in range(plan.pp):
        chunks = [ch for ch in range(plan.num_chunks) if plan.stage_of_chunk(ch) == r]
        params = sum(dur.layers[ch] * c.layer_params for ch in chunks)
        if 0 in chunks:
            params += c.embedding_params
        if plan.num_chunks - 1 in chunks:
            params += c.lm_head_params
        n_opt = max(1, math.ceil(params / shard))
        ops = [o.op for o in optimizer_ops(model, n_opt, Dtype(plan.master_dtype))]
        if ("adamw", n_opt) not in priced:
            priced[("adamw", n_opt)] = opt_factor * float(cm.predict_many(ops_frame(ops)).sum())
        opt_s = priced[("adamw", n_opt)]
        if plan.optimizer_offload > 0:
            f = plan.optimizer_offload
            opt_s = (1 - f) * opt_s + float(optimizer_offload_s(f * n_opt, grad_elt, system))
        if plan.zero in (1, 2) and red > 1 and not plan.overlap_grad_reduce:
            param_gather[r] = dp_slow[r] * once_s(
                "all_gather", params * param_elt, red, red_nodes, "bf16"
            )
        opt_end[r] = comm_end[r] + opt_s + param_gather[r]
        if spans is not None:
            spans.append(Span(r, "optimizer", "adamw", comm_end[r], comm_end[r] + opt_s))
        # An engine dispatching each op from its host runs no faster than the host
        # (composition.host_s_per_op; steady state of back-to-back iterations); its TP
        # collective calls cost the host more than an op (HOST_OPS_PER_COLLECTIVE).
        if host_s_per_op > 0.0:
            n_ops = host_work(
                c,
                sum(dur.layers[ch] for ch in chunks),
                plan.num_microbatches,
                0 in chunks,
                plan.num_chunks - 1 in chunks,
                len(ops),
            )
            host_stall[r] = max(0.0, n_ops * host_s_per_op - opt_end[r])
            opt_end[r] += host_stall[r]
    iteration_s = float(opt_end.max())

    tokens = plan.tokens_per_iteration
    flops = c.model_flops_per_microbatch * plan.num_microbatches * dp
    # MFU against the peak of the precision the GEMMs run in (fp8 plans: the fp8 peak, twice
    # bf16's on Hopper), so it never exceeds 1; the output names that precision
    peak_dtype = Dtype(plan.compute_dtype)
    peak = system.gpu.peak_flops_per_s(peak_dtype)
    mfu = flops / (iteration_s * plan.num_gpus * peak)

    m = plan.num_microbatches
    # Breakdown on the slowest rank, per micro-batch sums scaled by the rank's work.
    r_star = int(np.argmax(opt_end))
    chunks = [ch for ch in range(plan.num_chunks) if plan.stage_of_chunk(ch) == r_star]
    n_layers = sum(dur.layers[ch] for ch in chunks)
    tp_comm = m * n_layers * (c.layer_fwd.tp_comm_s + c.layer_bwd.tp_comm_s)
    cp_comm = m * n_layers * (c.layer_fwd.cp_comm_s + c.layer_bwd.cp_comm_s)
    ep_comm = m * n_layers * (c.layer_fwd.ep_comm_s + c.layer_bwd.ep_comm_s)
    busy = m * sum(dur.fwd_s[ch] + dur.bwd_s[ch] for ch in chunks)
    recompute = m * n_layers * c.layer_recompute.total_s
    zero3_s = m * n_layers * (zero3[0] + zero3[1])
    zero2_s = m * n_layers * zero2_s  # (zero3_s holds it too)
    offload_total = m * n_layers * (offload_s[0] + offload_s[1])
    compute = busy - tp_comm - cp_comm - ep_comm - recompute - zero3_s - offload_total
    opt_s_star = opt_end[r_star] - comm_end[r_star] - param_gather[r_star] - host_stall[r_star]
    breakdown = {
        "compute_s": compute,
        "recompute_s": recompute,
        "tp_comm_s": tp_comm,
        "cp_comm_s": cp_comm,
        "ep_comm_s": ep_comm,
        "zero3_exposed_s": zero3_s - zero2_s,
        "activation_offload_s": offload_total,
        "pp_bubble_s": _clean(float(compute_end[r_star] - busy)),
        "dp_comm_exposed_s": float(comm_end[r_star] - compute_end[r_star])
        + float(param_gather[r_star])
        + zero2_s,
        "optimizer_s": float(opt_s_star),
        "host_bound_s": float(host_stall[r_star]),
    }
    stages = []
    for r in range(plan.pp):
        ch_r = [ch for ch in range(plan.num_chunks) if plan.stage_of_chunk(ch) == r]
        busy_r = m * sum(dur.fwd_s[ch] + dur.bwd_s[ch] for ch in ch_r)
        stages.append(
            {
                "stage": r,
                "layers": sum(dur.layers[ch] for ch in ch_r),
                "busy_s": busy_r,
                "compute_end_s": float(compute_end[r]),
                "bubble_s": _clean(float(compute_end[r] - busy_r)),
                "dp_comm_exposed_s": float(comm_end[r] - compute_end[r]),
                "host_bound_s": float(host_stall[r]),
                "end_s": float(opt_end[r]),
            }
        )
    return TrainResult(
        iteration_s=iteration_s,
        tokens_per_s=tokens / iteration_s,
        mfu=mfu,
        mfu_peak_dtype=peak_dtype.value,
        model_flops=flops,
        breakdown_s=breakdown,
        stages=stages,
        spans=spans or [],
        costs=c,
        num_microbatches=m,
    )
