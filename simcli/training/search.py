"""Plan search (``simcli plan``): enumerate, prune, estimate in closed form, re-rank.

The space (Megatron-LM's knobs) is every ``tp`` that splits the model and fits in a node,
``pp`` dividing the layers, context-parallel ``cp`` (ring / Ulysses / TokenRing), the
data-parallel degree that fills the GPUs, micro-batch sizes dividing the per-replica
batch, ZeRO 0-3, recomputation none / selective / full, sequence parallelism on / off,
1F1B or interleaved 1F1B with ``vpp`` virtual stages, and expert parallelism for MoE
models. Pruning follows Galvatron (Miao et al. 2022) and Megatron-LM's own rules: TP
stays inside a node, ``pp * vpp`` divides the layers (even stages), context parallelism
keeps at least 512 tokens per rank, interleaving needs the micro-batch count to be a
multiple of ``pp``, ZeRO > 0 needs ``dp > 1``, ZeRO-2/3 are not combined with
pipelining, and whatever does not fit in memory is dropped (priced first, for all plans
at once, by :func:`~costmodels.steps.memory.memory_bytes_many`).

Speed: a plan's per-micro-batch costs depend only on (tp, sp, micro-batch, cp, cp kind,
ep, recompute), never on pp, dp or the schedule, so :func:`step_costs_many` prices every
distinct key with one ``predict_many`` call, and the iteration time of all plans is then
evaluated with numpy in closed form (:func:`pipeline_times`, the DP-gradient tail, ZeRO-3
exposure, the optimizer step), mirroring the discrete-event simulator for even stages.
The closed form is an estimate: the best plans by it (and any within 1 % of the last of
them) are re-run with :func:`~simcli.training.simulator.simulate_iteration`, and the
ranking and every reported time are the simulator's.

Stage balancing (``balance=True``) follows Galvatron-BMW (Wang et al. 2023, "Improving
Automatic Parallel Training via Balanced Memory Workload Optimization"): for 1F1B plans
it moves layers off the first stage (embedding, most micro-batches in flight) and the
last stage (LM head and loss) by a binary search on the largest stage time, subject to
every stage fitting in memory, then re-simulates. Not searched: a different strategy per
layer (Galvatron's per-layer dynamic programming), uneven interleaved chunks, TP comm
overlap and the non-Megatron frameworks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from costmodels.ops.select import get_cost_model
from costmodels.steps.memory import DRIVER_RESERVED_BYTES, estimate_memory, memory_bytes_many
from costmodels.steps.training import (
    CostModel,
    Phase,
    StepCosts,
    _frame,
    _sum_phase,
    _with_nodes,
    cp_comms,
    cp_exposed_s,
    ep_comm,
    group_nodes,
    op_groups,
    plan_fields,
    recompute_phase,
)
from hardware_specs.prices import gpu_price, gpu_prices
from hardware_specs.registry import Catalog, System, builtin_catalog
from hardware_specs.schema import DTYPE_BYTES, Dtype
from simcli.training.simulator import _dependency, interference, schedule, simulate_iteration
from workloads.decompose import (
    optimizer_ops,
    valid_tp_degrees,
)
from workloads.models import ModelConfig
from workloads.ops import Op, OpKind
from workloads.plan import (
    CP_KINDS,
    PP_SCHEDULES,
    PRECISIONS,
    RECOMPUTE,
    PlanError,
    TrainPlan,
    check_plan,
)

Objective = Literal["time", "cost"]
SCHEDULES = ("1f1b", "interleaved")
GIB = 1024**3
# Megatron's default DP gradient bucket (TrainPlan.grad_bucket_bytes); plans keep it.
_BUCKET_BYTES = TrainPlan.model_fields["grad_bucket_bytes"].default


# --------------------------------------------------------------------------- prices


def price_per_gpu_hour(gpu_id: str, override: float | None = None) -> tuple[float, str]:
    """The price used for ``gpu_id`` and where it comes from."""
    if override is not None and not override > 0:
        raise PlanError(f"--price-per-gpu-hour must be positive, got {override}")
    price = gpu_price(gpu_id, None if override is None else {"*": override})
    return price.usd_per_gpu_hour, price.source


# --------------------------------------------------------------------------- batched pricing


class _Pricer:
    """Collects distinct ops and prices them all in one ``predict_many`` call."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self._index: dict[Op, int] = {}
        self._ops: list[Op] = []
        self.times: np.ndarray = np.zeros(0)

    def add(self, op: Op) -> int:
        i = self._index.get(op)
        if i is None:
            i = self._index[op] = len(self._ops)
            self._ops.append(op)
        return i

    def collective(self, kind: str, nbytes: float, ranks: int, nodes: int, dtype: str) -> int:
        """Index of the op :func:`~costmodels.steps.training._collective_s` would price, or -1
        for the zero it returns without pricing."""
        if ranks <= 1 or nbytes <= 0:
            return -1
        op = Op(op=OpKind(kind), dtype=Dtype(dtype), bytes=int(nbytes), ranks=ranks)
        return self.add(_with_nodes(op, nodes))

    def run(self) -> None:
        n_done = len(self.times)
        if len(self._ops) > n_done:
            new = self.cost_model.predict_many(_frame(self._ops[n_done:]))
            self.times = np.concatenate([self.times, np.asarray(new, dtype=float)])

    def time(self, index: int) -> float:
        return 0.0 if index < 0 else float(self.times[index])


def _unique_rows(cols: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(np.stack(cols, 1), axis=0, return_inverse=True)`` for non-negative
    integer columns, via one mixed-radix int64 key (much faster than ``axis=0``)."""
    cols = [np.asarray(c, dtype=np.int64) for c in cols]
    radix = [int(c.max()) + 1 if len(c) else 1 for c in cols]
    if math.prod(radix) >= 2**62 or any(int(c.min(initial=0)) < 0 for c in cols):
        uniq, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        return uniq, inv.reshape(-1)
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c, r in zip(cols, radix, strict=True):
        key = key * r + c
    ukey, first, inv = np.unique(key, return_index=True, return_inverse=True)
    del ukey
    return np.stack([c[first] for c in cols], axis=1), inv.reshape(-1)


def _collectives(
    cost_model: CostModel,
    kind: str,
    nbytes: np.ndarray,
    ranks: np.ndarray,
    nodes: np.ndarray,
    dtype: str,
) -> np.ndarray:
    """Vectorised ``_collective_s``: each distinct (bytes, ranks, nodes) priced once."""
    nbytes = np.asarray(nbytes, dtype=float)
    ranks = np.broadcast_to(np.asarray(ranks, dtype=np.int64), nbytes.shape)
    nodes = np.broadcast_to(np.asarray(nodes, dtype=np.int64), nbytes.shape)
    out = np.zeros(nbytes.shape)
    ok = (ranks > 1) & (nbytes > 0)
    if not ok.any():
        return out
    uniq, inv = _unique_rows([nbytes[ok].astype(np.int64), ranks[ok], nodes[ok]])
    ops = [
        _with_nodes(Op(op=OpKind(kind), dtype=Dtype(dtype), bytes=int(b), ranks=int(r)), int(n))
        for b, r, n in uniq
    ]
    times = np.asarray(cost_model.predict_many(_frame(ops)), dtype=float)
    out[ok] = times[inv.reshape(-1)]
    return out


def _optimizer_s(
    cost_model: CostModel, model: ModelConfig, n_params: np.ndarray, master_dtype: str
) -> np.ndarray:
    """Vectorised optimizer step of the simulator: AdamW over ``n_params`` per rank."""
    n_params = np.asarray(n_params, dtype=np.int64)
    uniq, inv = np.unique(n_params, return_inverse=True)
    rows: list[Op] = []
    owner: list[int] = []
    for i, n in enumerate(uniq):
        for lo in optimizer_ops(model, int(n), Dtype(master_dtype)):
            rows.append(lo.op)
            owner.append(i)
    times = np.asarray(cost_model.predict_many(_frame(rows)), dtype=float)
    per = np.bincount(np.asarray(owner), weights=times, minlength=len(uniq))
    return per[inv.reshape(-1)]


# --------------------------------------------------------------------------- step costs


def step_costs_many(
    model: ModelConfig,
    plans: Sequence[TrainPlan],
    cost_model: CostModel,
    system: System,
    attn_backend: str = "",
    op_cache: dict | None = None,
) -> list[StepCosts]:
    """:func:`~costmodels.steps.training.step_costs` (framework ``megatron``) for many plans,
    with every distinct op priced once in one ``predict_many`` call.

    It mirrors ``step_costs`` line by line (the tests check they agree); the per-call
    cost of building and validating an ops frame is what it saves: ~1 ms per distinct
    (tp, sp, micro-batch, cp) instead of ~20 ms per plan.
    """
    gpn = system.node.gpus_per_node
    pricer = _Pricer(cost_model)
    # op lists depend on the model only, not on the cost model: a caller pricing several
    # systems (the cost objective's GPU counts) passes one cache for all of them
    op_lists: dict[tuple, list] = op_cache if op_cache is not None else {}

    # 1. the ops of every distinct phase key
    phase_keys: dict[tuple, dict[str, Any]] = {}
    plan_phase: list[tuple] = []
    for plan in plans:
        key = (
            plan.tp,
            plan.sp,
            plan.micro_batch,
            plan.cp,
            plan.seq_len,
            plan.compute_dtype,
            plan.tp_comm,
        )
        plan_phase.append(key)
        if key in phase_keys:
            continue
        tp = plan.tp
        okey = ("groups", model.id, *key[:6], attn_backend)
        if okey not in op_lists:
            op_lists[okey] = op_groups(model, plan, attn_backend, "megatron")
        groups = op_lists[okey]
        tp_nodes = group_nodes(tp, 1, gpn)
        index = [[pricer.add(_with_nodes(o.op, tp_nodes)) for o in g] for g in groups]
        phase_keys[key] = {"plan": plan, "groups": groups, "index": index}

    # 2. the communication ops of every plan
    comm: list[dict[str, Any]] = []
    seen: dict[tuple, dict[str, Any]] = {}
    for plan in plans:
        key = (
            plan.tp,
            plan.sp,
            plan.micro_batch,
            plan.cp,
            plan.cp_kind,
            plan.ep,
            plan.seq_len,
            plan.activation_dtype,
            plan.pp > 1,
            plan.tp * plan.cp * plan.data_parallel >= system.node.gpus_per_node,
        )
        if key not in seen:
            seen[key] = _comm_requests(model, plan, system, pricer)
        comm.append(seen[key])
    pricer.run()

    # 3. sum the phases of each key, then assemble each plan's StepCosts
    for info in phase_keys.values():
        plan = info["plan"]
        phases = []
        for g, idx in zip(info["groups"], info["index"], strict=True):
            t = pricer.times[np.asarray(idx, dtype=np.int64)] if idx else np.zeros(0)
            phases.append(_sum_phase(g, t, plan, 1.0 / plan.cp))
        info["phases"] = phases

    out: list[StepCosts] = []
    for plan, key, req in zip(plans, plan_phase, comm, strict=True):
        layer_f, layer_b, f_f, f_b, l_f, l_b = phase_keys[key]["phases"]
        cp_f, cp_b = _cp_exposed(plan, req, pricer, layer_f, layer_b)
        ep_one = pricer.time(req["ep"])
        ep_f = ep_b = 2.0 * ep_one
        layer_f = Phase(layer_f.compute_s, layer_f.tp_comm_s, cp_f, ep_f, layer_f.by_op_s)
        layer_b = Phase(layer_b.compute_s, layer_b.tp_comm_s, cp_b, ep_b, layer_b.by_op_s)
        out.append(
            StepCosts(
                layer_fwd=layer_f,
                layer_bwd=layer_b,
                layer_recompute=recompute_phase(plan, layer_f),
                first_fwd=f_f,
                first_bwd=f_b,
                last_fwd=l_f,
                last_bwd=l_b,
                p2p_bytes=req["p2p_bytes"],
                p2p_s=pricer.time(req["p2p"]) if plan.pp > 1 else 0.0,
                **plan_fields(model, plan),
            )
        )
    return out


def _comm_requests(
    model: ModelConfig, plan: TrainPlan, system: System, pricer: _Pricer
) -> dict[str, Any]:
    """The CP, EP and pipeline p2p ops of ``plan`` (:func:`cp_comms`, :func:`ep_comm` and
    ``step_costs``'s p2p), registered with the pricer."""
    gpn = system.node.gpus_per_node
    act = plan.activation_dtype
    elt = DTYPE_BYTES[Dtype(act)]
    req: dict[str, Any] = {"ep": -1}
    for key, c in cp_comms(model, plan, gpn).items():
        req[key] = pricer.collective(c.kind, c.nbytes, c.ranks, c.nodes, c.dtype)
    ep = ep_comm(model, plan, gpn)
    if ep is not None:
        req["ep"] = pricer.collective(ep.kind, ep.nbytes, ep.ranks, ep.nodes, ep.dtype)
    cp = plan.cp
    tokens = plan.micro_batch * (plan.seq_len // cp)
    p2p_bytes = tokens * model.hidden_size * elt / (plan.tp if plan.sp else 1)
    req["p2p_bytes"] = p2p_bytes
    req["p2p"] = -1
    if plan.pp > 1:
        stage_span = plan.tp * cp * plan.data_parallel
        p2p_nodes = 2 if stage_span >= gpn else 1
        op = Op(op=OpKind.send_recv, dtype=Dtype(act), bytes=int(p2p_bytes), ranks=2)
        req["p2p"] = pricer.add(_with_nodes(op, p2p_nodes))
    return req


def _cp_exposed(
    plan: TrainPlan, req: dict[str, Any], pricer: _Pricer, layer_f: Phase, layer_b: Phase
) -> tuple[float, float]:
    keys = ("a2a", "a2a_kv", "step_f", "step_b")
    times = {k: pricer.time(req[k]) for k in keys if k in req}
    attn_f, attn_b = layer_f.by_op_s.get("attn", 0.0), layer_b.by_op_s.get("attn_bwd", 0.0)
    return cp_exposed_s(plan, times, attn_f, attn_b)


# --------------------------------------------------------------------------- closed form


def pipeline_times(
    p: np.ndarray,
    v: np.ndarray,
    m: np.ndarray,
    f_mid: np.ndarray,
    b_mid: np.ndarray,
    first: tuple[np.ndarray, np.ndarray],
    last: tuple[np.ndarray, np.ndarray],
    c: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """When pipeline ranks 0, 1 and p-1 finish computing, for 1F1B (``v == 1``) and
    interleaved 1F1B, every model chunk taking ``f_mid`` / ``b_mid`` forward / backward
    plus the first chunk's ``first = (fwd, bwd)`` and the last chunk's ``last`` extras,
    ``c`` seconds per point-to-point transfer.

    Derived from, and checked against, the simulator's list scheduling:
    each rank r is busy ``m * W_r`` (W_r its chunks' work per micro-batch) and idle for
    the other ranks' share of one pass of the first ``p`` chunks (the fill and drain:
    ``(p - 1)(F + B)`` for even stages, Narayanan et al. 2021 sec. 2.2); the makespan is the
    largest over ranks. Transfers: interleaved adds ``2 (p v - 1) c`` (hidden in steady
    state by its deeper warm-up). 1F1B also cannot run faster than one round trip of
    ``p`` micro-batches, ``(m + p - 1) S / p + k(p, m) c`` with S the work of all stages
    and ``k = 2 (p - 1) + 2 max(0, m - 2 - (m - 2) // p)`` transfers on the critical path
    (exact for even stages). Ranks finish in order, each one backward and one transfer
    after the next.
    """
    ef, eb = first
    lf, lb = last
    fb = f_mid + b_mid
    n = p * v
    first_x = ef + eb
    last_x = lf + lb
    single = n == 1
    w0 = v * fb + first_x + np.where(p == 1, last_x, 0.0)
    wl = v * fb + last_x
    g0 = p * fb + first_x + np.where(v == 1, last_x, 0.0)
    g0_0 = fb + first_x + np.where(single, last_x, 0.0)
    g0_l = fb + np.where(v == 1, last_x, 0.0)
    tc = m * w0 + g0 - g0_0
    tc = np.where(p > 1, np.maximum(tc, m * wl + g0 - g0_l), tc)
    tc = np.where(p > 2, np.maximum(tc, m * v * fb + g0 - fb), tc)
    k = 2 * (p - 1) + 2 * np.maximum(0, (m - 2) - np.floor_divide(m - 2, p))
    t_1f1b = np.maximum(tc + 2 * (p - 1) * c, (m + p - 1) * g0 / p + k * c)
    t = np.where(v == 1, t_1f1b, tc + 2 * (n - 1) * c)
    b0 = b_mid + eb + np.where(single, lb, 0.0)
    end1 = np.where(p > 1, t - (b0 + c), t)
    endl = np.where(p > 1, end1 - np.maximum(p - 2, 0) * (b_mid + c), t)
    return t, end1, endl


# Interleaved 1F1B with point-to-point transfers above this fraction of a chunk's
# forward + backward leaves the closed form (it under-estimates by up to ~15 % from 0.4
# on); those plans are scheduled exactly by :func:`_pipeline_exact`.
EXACT_P2P_RATIO = 0.25
# ... and that is needed only for plans whose lower bound is within this of the best.
BOUND_SLACK = 0.25


@lru_cache(maxsize=256)
def _task_graph(p: int, v: int, m: int) -> tuple[np.ndarray, ...]:
    """The simulator's interleaved schedule as arrays: for each compute task, its rank's
    previous task and its dependency (indices, -1 for none), whether the dependency
    crosses ranks (a transfer), its duration class (3 * phase + chunk type; phase 0 F,
    1 B; chunk type 0 middle, 1 first, 2 last), its rank, and the tasks grouped by
    level of the dependency graph (every task's inputs lie in earlier levels)."""
    plan = TrainPlan(num_gpus=p, pp=p, vpp=v, pp_schedule="interleaved", global_batch=m,
                     seq_len=2)  # fmt: skip
    order = schedule(plan)
    last = plan.num_chunks - 1
    index = {t: i for i, t in enumerate(t for tasks in order for t in tasks)}
    n = len(index)
    prev = np.full(n, -1, dtype=np.int64)
    dep = np.full(n, -1, dtype=np.int64)
    cross = np.zeros(n, dtype=bool)
    cls = np.zeros(n, dtype=np.int64)
    rank = np.zeros(n, dtype=np.int64)
    for r, tasks in enumerate(order):
        for j, t in enumerate(tasks):
            i = index[t]
            prev[i] = index[tasks[j - 1]] if j else -1
            d = _dependency(t, last, p)
            if d is not None:
                dep[i] = index[d]
                cross[i] = d.rank != r
            kind = 1 if t.chunk == 0 else (2 if t.chunk == last else 0)
            cls[i] = 3 * (0 if t.phase == "F" else 1) + kind
            rank[i] = r
    # a topological order: run the ranks round-robin, each as far as its inputs allow
    level = np.zeros(n, dtype=np.int64)
    pos = [0] * p
    done = np.zeros(n, dtype=bool)
    remaining = n
    while remaining:
        progressed = False
        for r, tasks in enumerate(order):
            while pos[r] < len(tasks):
                i = index[tasks[pos[r]]]
                if dep[i] >= 0 and not done[dep[i]]:
                    break
                a = level[prev[i]] if prev[i] >= 0 else 0
                b = level[dep[i]] if dep[i] >= 0 else 0
                level[i] = max(a, b) + 1
                done[i] = True
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")
    by_level = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[by_level], np.arange(1, level.max() + 2))
    return prev, dep, cross, cls, rank, by_level, bounds


def _pipeline_exact(
    p: np.ndarray,
    v: np.ndarray,
    m: np.ndarray,
    f_mid: np.ndarray,
    b_mid: np.ndarray,
    first: tuple[np.ndarray, np.ndarray],
    last: tuple[np.ndarray, np.ndarray],
    c: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pipeline_times` by the simulator's rule (a task starts when its rank is
    free and its input has arrived), i.e. the longest path of the task graph, evaluated
    level by level for all plans sharing a (pp, vpp, micro-batches) shape. Exact."""
    out = [np.zeros(len(p)) for _ in range(3)]
    uniq, inv = np.unique(np.stack([p, v, m], axis=1), axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    for g, (pp_, vv, mm) in enumerate(uniq.tolist()):
        idx = np.flatnonzero(inv == g)
        prev, dep, cross, cls, rank, by_level, bounds = _task_graph(pp_, vv, mm)
        dur = np.stack(
            [
                f_mid[idx],
                f_mid[idx] + first[0][idx],
                f_mid[idx] + last[0][idx],
                b_mid[idx],
                b_mid[idx] + first[1][idx],
                b_mid[idx] + last[1][idx],
            ]
        )
        hop = np.where(cross[:, None], c[idx][None, :], 0.0)
        n = len(prev)
        end = np.zeros((n + 1, len(idx)))  # row n: "no task", time 0
        lo = 0
        for hi in bounds:
            ids = by_level[lo:hi]
            lo = hi
            start = np.maximum(end[prev[ids]], end[dep[ids]] + hop[ids])
            end[ids] = start + dur[cls[ids]]
        finish = np.zeros((pp_, len(idx)))
        np.maximum.at(finish, rank, end[:n])
        out[0][idx] = finish[0]
        out[1][idx] = finish[min(1, pp_ - 1)]
        out[2][idx] = finish[pp_ - 1]
    return out[0], out[1], out[2]


def _dp_stream_end(
    end: np.ndarray,
    v: np.ndarray,
    gap: np.ndarray,
    chunk_of: Any,
) -> np.ndarray:
    """When a rank's DP gradient reduction finishes (the simulator's comm stream), and
    for how long it ran in all.

    Local chunk ``l`` (0 = the one whose backward is last) finishes its last backward at
    ``end - l * gap`` (``gap = p (b + c)``: ``p`` backwards and transfers of the drain);
    its ``nb`` buckets of ``tb`` seconds become ready evenly over that backward (``bd``)
    and are reduced one after another: ``max(prev + nb tb, start + bd/nb + nb tb,
    end + tb)`` is the exact end of that sequence. ``chunk_of(l, idx)`` gives the
    (nb, tb, bd) arrays of local chunk ``l`` for configs ``idx``. Every bucket is ready
    by the rank's compute end, so the stream is busy from then until it finishes: the
    time it ran beside compute is ``busy - max(0, stream - end)``.
    """
    stream = np.full(end.shape, -np.inf)
    busy = np.zeros(end.shape)
    vmax = int(v.max()) if len(v) else 1
    for ell in range(vmax - 1, -1, -1):
        idx = np.flatnonzero(v > ell)
        if not len(idx):
            continue
        nb, tb, bd = chunk_of(ell, idx)
        e = end[idx] - ell * gap[idx]
        s = e - bd
        stream[idx] = np.maximum.reduce([stream[idx] + nb * tb, s + bd / nb + nb * tb, e + tb])
        busy[idx] += nb * tb
    return stream, busy


# --------------------------------------------------------------------------- enumeration


@dataclass(frozen=True)
class SearchSpace:
    """Which knobs the search varies; the defaults are the whole (pruned) space."""

    max_tp: int | None = None  # default: GPUs per node (TP stays inside a node)
    tp: tuple[int, ...] | None = None  # only these degrees (default: all that pass)
    pp: tuple[int, ...] | None = None
    max_pp: int | None = None
    max_cp: int | None = None
    # Galvatron-style prune of hopeless context parallelism: below ~512 tokens per rank
    # the ring's KV exchanges no longer hide behind the attention blocks and the GEMMs
    # shrink (the cost model puts GPT-3 at seq 2048 >10% off the best from cp=8 on).
    min_tokens_per_cp_rank: int = 512
    max_micro_batch: int | None = None
    max_vpp: int | None = None
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    schedules: tuple[str, ...] = SCHEDULES
    cp_kinds: tuple[str, ...] = CP_KINDS
    sequence_parallel: tuple[bool, ...] = (True, False)
    precision: str = "bf16-mixed"

    def __post_init__(self) -> None:
        for name, values, allowed in (
            ("recompute", self.recompute, RECOMPUTE),
            ("schedule", self.schedules, SCHEDULES),
            ("cp_kind", self.cp_kinds, CP_KINDS),
            ("zero", self.zero, (0, 1, 2, 3)),
        ):
            bad = [x for x in values if x not in allowed]
            if bad or not values:
                raise PlanError(
                    f"{name} choices {list(values)} are invalid; allowed: "
                    f"{', '.join(map(str, allowed))}"
                )
        if self.precision not in PRECISIONS:
            raise PlanError(
                f"precision {self.precision!r} is invalid; allowed: {', '.join(PRECISIONS)}"
            )


_COLUMNS = ("tp", "pp", "cp", "dp", "ep", "vpp", "mb", "m", "zero", "rec", "sp", "kind")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_plans(
    model: ModelConfig,
    num_gpus: int,
    seq_len: int,
    global_batch: int,
    gpus_per_node: int,
    space: SearchSpace | None = None,
) -> dict[str, np.ndarray]:
    """Every plan of the pruned space as columns of equal length (see ``_COLUMNS``:
    ``rec`` indexes RECOMPUTE, ``kind`` CP_KINDS, ``sp`` is 0/1; ``vpp == 1`` is 1F1B)."""
    space = space or SearchSpace()
    max_tp = space.max_tp or (max(space.tp) if space.tp else gpus_per_node)
    layers = model.num_layers
    blocks: list[np.ndarray] = []
    rec_codes = [RECOMPUTE.index(r) for r in space.recompute]
    for tp in valid_tp_degrees(model):
        if tp > max_tp or num_gpus % tp or (space.tp and tp not in space.tp):
            continue
        for pp in _divisors(num_gpus // tp):
            if layers % pp or (space.max_pp and pp > space.max_pp):
                continue
            if space.pp and pp not in space.pp:
                continue
            for cp in _divisors(num_gpus // (tp * pp)):
                if cp > 1 and (
                    seq_len % (2 * cp)
                    or (space.max_cp and cp > space.max_cp)
                    or seq_len // cp < space.min_tokens_per_cp_rank
                ):
                    continue
                dp = num_gpus // (tp * pp * cp)
                if global_batch % dp:
                    continue
                kinds = [0]
                if cp > 1:
                    heads = model.num_heads // tp
                    kinds = [
                        CP_KINDS.index(k)
                        for k in space.cp_kinds
                        if not (k == "ulysses" and heads % cp)
                    ]
                    if not kinds:
                        continue
                eps = [1]
                if model.num_experts > 1:
                    eps = [e for e in _divisors(dp) if model.num_experts % e == 0]
                zeros = [z for z in space.zero if (z == 0 or dp > 1) and (z < 2 or pp == 1)]
                if not zeros:
                    continue
                sps = [1, 0] if tp > 1 else [0]
                sps = [s for s in sps if bool(s) in space.sequence_parallel] or sps[:1]
                for mb in _divisors(global_batch // dp):
                    if space.max_micro_batch and mb > space.max_micro_batch:
                        continue
                    m = global_batch // (dp * mb)
                    vpps = []
                    if "1f1b" in space.schedules:
                        vpps.append(1)
                    if "interleaved" in space.schedules and pp > 1 and m % pp == 0:
                        vpps += [
                            v
                            for v in _divisors(layers // pp)
                            if v > 1 and not (space.max_vpp and v > space.max_vpp)
                        ]
                    if not vpps:
                        continue
                    grid = np.stack(
                        np.meshgrid(vpps, zeros, rec_codes, sps, kinds, eps, indexing="ij"),
                        axis=-1,
                    ).reshape(-1, 6)
                    block = np.empty((len(grid), len(_COLUMNS)), dtype=np.int64)
                    block[:, 0:5] = (tp, pp, cp, dp, 0)
                    block[:, 4] = grid[:, 5]
                    block[:, 5] = grid[:, 0]
                    block[:, 6] = mb
                    block[:, 7] = m
                    block[:, 8:12] = grid[:, 1:5]
                    blocks.append(block)
    table = np.concatenate(blocks) if blocks else np.zeros((0, len(_COLUMNS)), np.int64)
    return {c: table[:, i] for i, c in enumerate(_COLUMNS)}


def _rows(table: dict[str, np.ndarray], idx: np.ndarray | slice) -> dict[str, np.ndarray]:
    return {k: v[idx] for k, v in table.items()}


def plan_from_row(
    table: dict[str, np.ndarray],
    i: int,
    *,
    num_gpus: int,
    seq_len: int,
    global_batch: int,
    precision: str,
    layer_split: tuple[int, ...] | None = None,
) -> TrainPlan:
    """The TrainPlan of row ``i`` of an enumerated table."""
    tp, pp, vpp = int(table["tp"][i]), int(table["pp"][i]), int(table["vpp"][i])
    return TrainPlan(
        num_gpus=num_gpus,
        tp=tp,
        pp=pp,
        cp=int(table["cp"][i]),
        dp=int(table["dp"][i]),
        ep=int(table["ep"][i]),
        vpp=vpp,
        zero=int(table["zero"][i]),  # type: ignore[arg-type]
        micro_batch=int(table["mb"][i]),
        global_batch=global_batch,
        seq_len=seq_len,
        pp_schedule="interleaved" if vpp > 1 else "1f1b",
        recompute=RECOMPUTE[int(table["rec"][i])],  # type: ignore[arg-type]
        sequence_parallel=bool(table["sp"][i]) if tp > 1 else False,
        precision=precision,  # type: ignore[arg-type]
        cp_kind=CP_KINDS[int(table["kind"][i])],  # type: ignore[arg-type]
        layer_split=layer_split,
    )


# --------------------------------------------------------------------------- fast estimate


@dataclass
class _Context:
    model: ModelConfig
    system: System
    cost_model: CostModel
    num_gpus: int
    seq_len: int
    global_batch: int
    precision: str
    attn_backend: str = ""
    op_cache: dict = field(default_factory=dict)

    @property
    def gpn(self) -> int:
        return self.system.node.gpus_per_node


def _key_costs(ctx: _Context, table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-plan step-cost scalars, each distinct (tp, sp, mb, cp, kind, ep, recompute)
    priced once through :func:`step_costs_many`."""
    cols = ("tp", "sp", "mb", "cp", "kind", "ep", "rec")
    uniq, inv = _unique_rows([table[c] for c in cols])
    reps = []
    for tp, sp, mb, cp, kind, ep, rec in uniq.tolist():
        reps.append(
            TrainPlan(
                num_gpus=tp * cp * ep,
                tp=tp,
                cp=cp,
                ep=ep,
                micro_batch=mb,
                global_batch=mb * ep,
                seq_len=ctx.seq_len,
                sequence_parallel=bool(sp) if tp > 1 else False,
                precision=ctx.precision,  # type: ignore[arg-type]
                cp_kind=CP_KINDS[kind],  # type: ignore[arg-type]
                recompute=RECOMPUTE[rec],  # type: ignore[arg-type]
            )
        )
    costs = step_costs_many(
        ctx.model, reps, ctx.cost_model, ctx.system, ctx.attn_backend, ctx.op_cache
    )
    fields = {
        "lf": lambda c: c.layer_fwd.total_s,
        "lb": lambda c: c.layer_bwd.total_s,
        "lf_compute": lambda c: c.layer_fwd.compute_s,
        "lb_compute": lambda c: c.layer_bwd.compute_s,
        "rc": lambda c: c.layer_recompute.total_s,
        "ef": lambda c: c.first_fwd.total_s,
        "eb": lambda c: c.first_bwd.total_s,
        "lf_x": lambda c: c.last_fwd.total_s,
        "lb_x": lambda c: c.last_bwd.total_s,
        "p2p_bytes": lambda c: c.p2p_bytes,
        "layer_params": lambda c: c.layer_params,
        "emb_params": lambda c: c.embedding_params,
        "lm_params": lambda c: c.lm_head_params,
        "flops_mb": lambda c: c.model_flops_per_microbatch,
    }
    out = {}
    for name, get in fields.items():
        out[name] = np.array([get(c) for c in costs], dtype=float)[inv]
    return out


def estimate_iteration_s(
    ctx: _Context, table: dict[str, np.ndarray], balance: bool = False, exact: bool = False
) -> dict[str, np.ndarray]:
    """Closed-form iteration time of every plan in ``table`` (even stages), mirroring
    ``simulator._simulate``: chunk durations, the pipeline, the DP-gradient tail on the
    comm stream, ZeRO-3 exposure and the optimizer step; plus MFU's FLOPs. With
    ``balance``, also ``balanced_s``: the estimate with the best uneven 1F1B split.

    ``loose`` marks interleaved plans whose transfers exceed :data:`EXACT_P2P_RATIO` of
    a chunk's work: there the closed form is a lower bound (up to ~15 % low); with
    ``exact`` their pipeline is list-scheduled instead (:func:`_pipeline_exact`)."""
    k = _key_costs(ctx, table)
    cm, gpn = ctx.cost_model, ctx.gpn
    tp, pp, cp, dp = table["tp"], table["pp"], table["cp"], table["dp"]
    v, m, zero = table["vpp"], table["m"], table["zero"]
    n_chunks = pp * v
    lc = ctx.model.num_layers // n_chunks
    dp_nodes = _group_nodes_many(dp, tp * cp, gpn)
    # compute slowed by the NCCL kernels running beside it (simulator.interference)
    kappa_of = {int(x): interference(ctx.system, int(x)) for x in np.unique(dp_nodes)}
    kappa = np.array([kappa_of[int(x)] for x in dp_nodes]) if len(dp_nodes) else np.zeros(0)
    grad_elt = 2 if ctx.precision == "bf16" else 4

    # ZeRO-3: per-layer parameter all-gather and gradient reduce-scatter, prefetched.
    z3 = (zero == 3) & (dp > 1)
    zf = np.zeros(len(tp))
    zb = np.zeros(len(tp))
    if z3.any():
        i = np.flatnonzero(z3)
        lp = k["layer_params"][i]
        gather = _collectives(cm, "all_gather", lp * 2, dp[i], dp_nodes[i], "bf16")
        rs = _collectives(cm, "reduce_scatter", lp * grad_elt, dp[i], dp_nodes[i], "fp32")
        cf = k["lf_compute"][i]
        cb = k["lb_compute"][i] + k["rc"][i]
        kz = kappa[i]
        zf[i] = np.maximum(0.0, gather - cf) + kz * np.minimum(gather, cf)
        zb[i] = np.maximum(0.0, gather + rs - cb) + kz * np.minimum(gather + rs, cb)

    f_mid = lc * (k["lf"] + zf)
    b_mid = lc * (k["lb"] + k["rc"] + zb)
    act_nodes = np.where(tp * cp * dp >= gpn, 2, 1)
    c = np.zeros(len(tp))
    piped = pp > 1
    if piped.any():
        i = np.flatnonzero(piped)
        c[i] = _collectives(
            cm, "send_recv", k["p2p_bytes"][i], 2, act_nodes[i], _act_dtype(ctx.precision)
        )
    first = (k["ef"], k["eb"])
    last = (k["lf_x"], k["lb_x"])
    t0, t1, tl = pipeline_times(pp, v, m, f_mid, b_mid, first, last, c)
    loose = (v > 1) & (c > EXACT_P2P_RATIO * (f_mid + b_mid))
    heavy = np.flatnonzero(loose)
    if exact and len(heavy):
        ex = _pipeline_exact(
            pp[heavy], v[heavy], m[heavy], f_mid[heavy], b_mid[heavy],
            (first[0][heavy], first[1][heavy]), (last[0][heavy], last[1][heavy]), c[heavy],
        )  # fmt: skip
        t0[heavy], t1[heavy], tl[heavy] = ex

    # DP gradient reduction, per rank type (0, a middle one, p-1). Chunk types: 0 a
    # middle chunk, 1 the first (embedding), 2 the last (LM head), 3 both (one chunk).
    lp = k["layer_params"]
    params = np.stack(
        [
            lc * lp,
            lc * lp + k["emb_params"],
            lc * lp + k["lm_params"],
            lc * lp + k["emb_params"] + k["lm_params"],
        ]
    )
    bwd = np.stack([b_mid, b_mid + k["eb"], b_mid + k["lb_x"], b_mid + k["eb"] + k["lb_x"]])
    reduce_dp = (dp > 1) & (zero != 3)
    nbytes = params * grad_elt
    nb = np.maximum(1, np.ceil(nbytes / _BUCKET_BYTES))
    tb = np.zeros(nb.shape)
    for code, coll in ((0, "all_reduce"), (1, "reduce_scatter")):
        i = np.flatnonzero(reduce_dp & ((zero == 0) == (code == 0)))
        if len(i):
            r = np.broadcast_to(dp[i], (4, len(i))).reshape(-1)
            nd = np.broadcast_to(dp_nodes[i], (4, len(i))).reshape(-1)
            per = (nbytes[:, i] / nb[:, i]).reshape(-1)
            tb[:, i] = _collectives(cm, coll, per, r, nd, _grad_dtype(grad_elt)).reshape(4, -1)
    gap = pp * (b_mid + c)

    def chunk_types(rank: str, ell: int, idx: np.ndarray) -> np.ndarray:
        if rank == "0":
            return np.where(n_chunks[idx] == 1, 3, 1 if ell == 0 else 0)
        if rank == "l":
            return np.where(v[idx] - 1 == ell, 2, 0)
        return np.zeros(len(idx), dtype=np.int64)

    ends = {"0": t0, "1": t1, "l": tl}
    comm_end = {}
    red = np.flatnonzero(reduce_dp)
    for rank, end in ends.items():
        ce = end.copy()
        if len(red):

            def chunk_of(ell: int, sub: np.ndarray, rank: str = rank) -> tuple:
                j = red[sub]
                t = chunk_types(rank, ell, j)
                return nb[t, j], tb[t, j], bwd[t, j]

            stream, busy = _dp_stream_end(end[red], v[red], gap[red], chunk_of)
            # the part of the reduction that ran beside compute slowed it (interference)
            beside = busy - np.maximum(0.0, stream - end[red])
            ce[red] = np.maximum(end[red] + kappa[red] * beside, stream)
        comm_end[rank] = ce

    # Optimizer step on each rank's share (ZeRO >= 1: 1/dp of it).
    shard = np.where(zero >= 1, dp, 1)
    rank_params = {
        "0": v * lc * lp + k["emb_params"] + np.where(pp == 1, k["lm_params"], 0),
        "1": v * lc * lp,
        "l": v * lc * lp + k["lm_params"],
    }
    master = "bf16" if ctx.precision == "bf16" else "fp32"
    iteration = np.zeros(len(tp))
    for rank, params in rank_params.items():
        n_opt = np.maximum(1, np.ceil(params / shard))
        exists = np.ones(len(tp), bool) if rank == "0" else (pp > 2 if rank == "1" else pp > 1)
        i = np.flatnonzero(exists)
        if not len(i):
            continue
        opt = _optimizer_s(cm, ctx.model, n_opt[i], master)
        iteration[i] = np.maximum(iteration[i], comm_end[rank][i] + opt)
    out = {
        "iteration_s": iteration,
        "model_flops": k["flops_mb"] * m * dp,
        "loose": loose & (not exact),
    }
    if balance:
        # Galvatron-BMW: 1F1B's compute-bound makespan is (m - 1) max_r W_r + sum_r W_r
        # (see pipeline_times); an uneven split lowers max_r W_r, the sum stays.
        bal = iteration.copy()
        i = np.flatnonzero((pp > 1) & (v == 1))
        if len(i):
            p_, m_, lc_, c_ = pp[i], m[i], lc[i], c[i]
            u = (f_mid[i] + b_mid[i]) / lc_
            e0 = k["ef"][i] + k["eb"][i]
            el = k["lf_x"][i] + k["lb_x"][i]
            s0 = p_ * lc_ * u + e0 + el
            w_bal = balanced_stage_work(ctx.model.num_layers, p_, u, e0, el)
            kk = 2 * (p_ - 1) + 2 * np.maximum(0, (m_ - 2) - np.floor_divide(m_ - 2, p_))
            round_trip = (m_ + p_ - 1) * s0 / p_ + kk * c_
            t_bal = np.maximum((m_ - 1) * w_bal + s0 + 2 * (p_ - 1) * c_, round_trip)
            bal[i] = iteration[i] - np.maximum(0.0, t0[i] - t_bal)
        out["balanced_s"] = bal
    return out


def _group_nodes_many(size: np.ndarray, stride: np.ndarray, gpn: int) -> np.ndarray:
    """Vectorised :func:`~costmodels.steps.training.group_nodes`."""
    per_node = np.maximum(1, gpn // np.maximum(stride, 1))
    spread = np.maximum(1, -(-size // per_node))
    return np.where(size <= 1, 1, np.where(stride >= gpn, size, spread))


def _act_dtype(precision: str) -> str:
    return "fp16" if precision == "fp16-mixed" else "bf16"


def _grad_dtype(grad_elt: int) -> str:
    return "fp32" if grad_elt == 4 else "bf16"


# --------------------------------------------------------------------------- memory


def _memory_bytes(ctx: _Context, table: dict[str, np.ndarray]) -> np.ndarray:
    """Peak bytes per GPU of every plan (:func:`~costmodels.steps.memory.memory_bytes_many`)."""
    return np.asarray(
        memory_bytes_many(
            ctx.model,
            ctx.system.gpu,
            tp=table["tp"],
            pp=table["pp"],
            cp=table["cp"],
            dp=table["dp"],
            vpp=table["vpp"],
            ep=table["ep"],
            zero=table["zero"],
            micro_batch=table["mb"],
            num_microbatches=table["m"],
            seq_len=ctx.seq_len,
            recompute=table["rec"],  # codes: the index in RECOMPUTE
            sp=table["sp"].astype(bool),
            precision=ctx.precision,
            pp_schedule=np.where(table["vpp"] > 1, PP_SCHEDULES.index("interleaved"), 0),
        ),
        dtype=float,
    )


def memory_capacity_bytes(system: System) -> float:
    """What a plan may use: the GPU's memory less what the driver keeps."""
    return system.gpu.memory_bytes - DRIVER_RESERVED_BYTES


# --------------------------------------------------------------------------- stage balancing


def balanced_stage_work(
    layers: int,
    p: np.ndarray,
    per_layer: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    iters: int = 50,
) -> np.ndarray:
    """Smallest achievable largest stage work (per micro-batch) over contiguous splits of
    ``layers`` identical layers into ``p`` stages of at least one layer, the first stage
    carrying ``first`` and the last ``last`` extra seconds (vectorised bisection; memory
    is checked later, per plan, by :func:`balance_split`)."""
    lo = np.maximum(per_layer * layers / p, np.maximum(first, last) + per_layer)
    hi = np.maximum(first, last) + per_layer * layers

    def capacity(t: np.ndarray) -> np.ndarray:
        a0 = np.floor((t - first) / per_layer + 1e-9)
        al = np.floor((t - last) / per_layer + 1e-9)
        am = np.floor(t / per_layer + 1e-9)
        ok = (a0 >= 1) & (al >= 1)
        return np.where(ok, a0 + al + (p - 2) * am, 0)

    for _ in range(iters):
        mid = (lo + hi) / 2
        feasible = capacity(mid) >= layers
        hi = np.where(feasible, mid, hi)
        lo = np.where(feasible, lo, mid)
    return hi


def balance_split(
    layers: int,
    work: Sequence[float] | np.ndarray,
    per_layer: float,
    max_layers: Sequence[int] | None = None,
) -> tuple[int, ...] | None:
    """Galvatron-BMW's stage partition for one pipeline: layers per stage minimising the
    largest stage time ``work[r] + n_r * per_layer`` (``work``: the stage's fixed extra
    seconds, embedding or LM head) subject to ``1 <= n_r <= max_layers[r]`` (what fits
    in the stage's memory). Binary search over the candidate makespans, then layers are
    taken back from the most loaded stages. None when no split fits."""
    p = len(work)
    caps = list(max_layers) if max_layers is not None else [layers] * p
    if any(c < 1 for c in caps) or sum(caps) < layers or layers < p:
        return None
    cands = sorted({w + n * per_layer for w in work for n in range(1, layers + 1)})

    def alloc(t: float) -> list[int] | None:
        a = [min(caps[r], int(math.floor((t - work[r]) / per_layer + 1e-9))) for r in range(p)]
        if min(a) < 1 or sum(a) < layers:
            return None
        return a

    lo, hi = 0, len(cands) - 1
    if alloc(cands[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if alloc(cands[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    split = alloc(cands[lo])
    assert split is not None
    surplus = sum(split) - layers
    while surplus > 0:
        # take a layer from the most loaded stage that can spare one
        r = max(
            (r for r in range(p) if split[r] > 1),
            key=lambda r: (work[r] + split[r] * per_layer, r),
        )
        split[r] -= 1
        surplus -= 1
    return tuple(split)


# --------------------------------------------------------------------------- the search


@dataclass
class RankedPlan:
    """One plan of the answer, with the simulator's numbers."""

    plan: TrainPlan
    iteration_s: float  # simulate_iteration
    estimate_s: float  # the closed form that selected it
    tokens_per_s: float
    mfu: float
    peak_memory_bytes: float
    capacity_bytes: float
    cost_usd_per_iteration: float
    balanced: bool = False
    breakdown_s: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        p = self.plan
        return {
            "num_gpus": p.num_gpus,
            "tp": p.tp,
            "pp": p.pp,
            "dp": p.data_parallel,
            "cp": p.cp,
            "cp_kind": p.cp_kind if p.cp > 1 else "",
            "ep": p.ep,
            "vpp": p.vpp,
            "pp_schedule": p.pp_schedule,
            "zero": p.zero,
            "micro_batch": p.micro_batch,
            "num_microbatches": p.num_microbatches,
            "recompute": p.recompute,
            "sequence_parallel": p.sp,
            "precision": p.precision,
            "layer_split": list(p.layer_split) if p.layer_split else None,
            "balanced": self.balanced,
            "iteration_s": self.iteration_s,
            "estimate_s": self.estimate_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "peak_memory_gib": self.peak_memory_bytes / GIB,
            "memory_capacity_gib": self.capacity_bytes / GIB,
            "gpu_hours_per_iteration": self.iteration_s * p.num_gpus / 3600.0,
            "cost_usd_per_iteration": self.cost_usd_per_iteration,
        }


@dataclass
class SearchResult:
    model: str
    gpu: str
    num_gpus: int
    seq_len: int
    global_batch: int
    objective: str
    configs_evaluated: int  # enumerated plans, each memory-checked
    configs_fit: int  # of them, the ones that fit (their time estimated)
    simulated: int  # simulator runs (plans re-ranked, balanced variants included)
    search_seconds: float
    price_usd_per_gpu_hour: float
    price_source: str
    plans: list[RankedPlan]
    estimate_max_rel_error: float  # |closed form / simulator - 1| over the re-run plans
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # with collect=True: every enumerated plan, its memory and closed-form time (reports)
    evaluated: dict[str, np.ndarray] | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "num_gpus": self.num_gpus,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "objective": self.objective,
            "configs_evaluated": self.configs_evaluated,
            "configs_fit": self.configs_fit,
            "simulated": self.simulated,
            "search_seconds": self.search_seconds,
            "configs_per_s": self.configs_evaluated / max(self.search_seconds, 1e-9),
            "estimate_max_rel_error": self.estimate_max_rel_error,
            "phase_seconds": dict(self.phase_seconds),
            "price_usd_per_gpu_hour": self.price_usd_per_gpu_hour,
            "price_source": self.price_source,
        }


@dataclass
class _Candidate:
    ctx: _Context
    plan: TrainPlan
    estimate_s: float
    balanced_s: float
    score: float


def gpu_counts(num_gpus: int, objective: Objective) -> list[int]:
    """GPU counts searched: the given one for ``time``; for ``cost`` also its halvings,
    since with a fixed count cost is time times a constant (fewer GPUs can be cheaper
    per iteration when they run at a higher MFU)."""
    counts = [num_gpus]
    if objective == "cost":
        n = num_gpus
        while n % 2 == 0 and n > 1:
            n //= 2
            counts.append(n)
    return counts


def search_plans(
    model: ModelConfig,
    gpu_id: str,
    num_gpus: int,
    *,
    seq_len: int,
    global_batch: int,
    top: int = 5,
    objective: Objective = "time",
    balance: bool = False,
    space: SearchSpace | None = None,
    price_usd_per_gpu_hour: float | None = None,
    catalog: Catalog | None = None,
    profile: Any = None,
    attn_backend: str = "",
    margin: float = 0.01,
    collect: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Search the plan space (see the module docstring); ``top`` plans ranked by the
    simulator's iteration time (``time``) or cost per iteration (``cost``).

    ``margin``: plans whose estimate is within this fraction of the ``top``-th best are
    re-simulated too, so an estimate error cannot push a better plan out of the answer.
    ``collect``: keep every enumerated plan with its memory and closed-form time in
    ``SearchResult.evaluated`` (for the time/memory Pareto chart of reports).
    ``progress(done, total)``: called after each GPU count is estimated and each plan
    is simulated.
    """
    t_start = time.perf_counter()
    if objective not in ("time", "cost"):
        raise PlanError(f"unknown objective {objective!r}; allowed: time, cost")
    if top < 1:
        raise PlanError(f"--top must be >= 1, got {top}")
    for name, value in (
        ("--gpus", num_gpus),
        ("--seq-len", seq_len),
        ("--global-batch", global_batch),
    ):
        if value < 1:
            raise PlanError(f"{name} must be positive, got {value}")
    space = space or SearchSpace()
    cat = catalog if catalog is not None else builtin_catalog()
    gpu = cat.gpu(gpu_id)
    compute = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16": "bf16", "fp8": "fp8"}
    if compute[space.precision] not in {d.value for d in gpu.peak_dense_tflops}:
        raise PlanError(
            f"precision {space.precision} needs {compute[space.precision]} "
            f"tensor cores; {gpu_id} has none"
        )
    price, source = (
        price_per_gpu_hour(gpu_id, price_usd_per_gpu_hour)
        if objective == "cost" or price_usd_per_gpu_hour is not None or gpu_id in gpu_prices()
        else (float("nan"), "no price known for this GPU")
    )
    if model.position == "learned" and seq_len > model.max_seq_len:
        raise PlanError(
            f"seq_len={seq_len} exceeds the learned position table of {model.id}; "
            f"allowed: <= {model.max_seq_len}"
        )

    evaluated = fit = 0
    op_cache: dict = {}
    phases = dict.fromkeys(("enumerate", "memory", "estimate", "simulate"), 0.0)
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] += now - clock
        clock = now

    candidates: list[_Candidate] = []
    collected: list[dict[str, np.ndarray]] = []
    counts = list(gpu_counts(num_gpus, objective))
    report = progress or (lambda done, total: None)
    total_steps = len(counts) + top + min(top, 5)
    for step, count in enumerate(counts):
        report(step, total_steps)
        system = cat.system(gpu_id, count)
        cm = get_cost_model(gpu_id, profile=profile, num_gpus=count, catalog=cat)
        ctx = _Context(
            model, system, cm, count, seq_len, global_batch, space.precision, attn_backend, op_cache
        )
        table = enumerate_plans(model, count, seq_len, global_batch, system.gpus_per_node, space)
        lap("enumerate")
        n = len(table["tp"])
        evaluated += n
        if not n:
            continue
        mem = _memory_bytes(ctx, table)
        ok = np.flatnonzero(mem <= memory_capacity_bytes(system))
        lap("memory")
        fit += len(ok)
        if collect:
            collected.append(
                {**table, "num_gpus": np.full(n, count), "memory_bytes": mem.astype(float)}
            )
        if not len(ok):
            continue
        sub = _rows(table, ok)
        est = estimate_iteration_s(ctx, sub, balance=balance)
        # branch and bound: where the closed form is only a lower bound, schedule the
        # plans exactly if that bound leaves them within reach of the best
        near = est["iteration_s"] <= (1.0 + BOUND_SLACK) * est["iteration_s"].min()
        redo = np.flatnonzero(est["loose"] & near)
        if len(redo):
            again = estimate_iteration_s(ctx, _rows(sub, redo), balance=balance, exact=True)
            for name in ("iteration_s", "balanced_s"):
                if name in est:
                    est[name][redo] = again[name]
        t_even = est["iteration_s"]
        t_best = np.minimum(t_even, est.get("balanced_s", t_even))
        if collect:
            full = np.full(n, np.nan)
            full[ok] = t_best
            collected[-1]["estimate_s"] = full
        factor = count * price / 3600.0 if objective == "cost" else 1.0
        score = t_best * factor
        # keep only what could make the answer: the best few hundred by score
        keep = np.argsort(score, kind="stable")[: max(4 * top, 50)]
        for j in keep:
            plan = plan_from_row(
                sub,
                int(j),
                num_gpus=count,
                seq_len=seq_len,
                global_batch=global_batch,
                precision=space.precision,
            )
            candidates.append(
                _Candidate(ctx, plan, float(t_even[j]), float(t_best[j]), float(score[j]))
            )
        lap("estimate")
    if not candidates:
        if not evaluated:
            raise PlanError(
                f"no valid plan for {model.id} on {num_gpus} GPUs (global_batch="
                f"{global_batch}, seq_len={seq_len}) in the search space; allowed: a "
                "global batch divisible by some data-parallel degree, and --tp/--pp "
                "values that split the model and the GPUs"
            )
        raise PlanError(
            f"no plan of {model.id} fits in {gpu_id} memory ({gpu.memory_gib:g} GiB) on "
            f"{num_gpus} GPUs ({evaluated} plans tried); allowed: more GPUs, a shorter "
            "sequence or a smaller batch"
        )

    candidates.sort(key=lambda c: c.score)
    cut = candidates[min(top, len(candidates)) - 1].score * (1.0 + margin)
    chosen = [c for c in candidates if c.score <= cut][: top + min(top, 5)]
    report(len(counts), len(counts) + len(chosen))
    results = _simulate_candidates(
        chosen,
        gpu_id,
        cat,
        price,
        balance,
        lambda i, n: report(len(counts) + i, len(counts) + n),
    )
    errors = [abs(r.estimate_s / r.iteration_s - 1.0) for r in results if not r.balanced]
    lap("simulate")
    key = (lambda r: r.cost_usd_per_iteration) if objective == "cost" else (lambda r: r.iteration_s)
    results.sort(key=key)
    # one entry per plan (a balanced variant replaces its even twin when better)
    seen: set[tuple] = set()
    unique: list[RankedPlan] = []
    for r in results:
        ident = tuple((k, v) for k, v in r.plan.model_dump().items() if k != "layer_split")
        if ident in seen:
            continue
        seen.add(ident)
        unique.append(r)
    return SearchResult(
        model=model.id,
        gpu=gpu_id,
        num_gpus=num_gpus,
        seq_len=seq_len,
        global_batch=global_batch,
        objective=objective,
        configs_evaluated=evaluated,
        configs_fit=fit,
        simulated=len(results),
        search_seconds=time.perf_counter() - t_start,
        price_usd_per_gpu_hour=price,
        price_source=source,
        plans=unique[:top],
        estimate_max_rel_error=max(errors) if errors else 0.0,
        phase_seconds=phases,
        evaluated=_decode_collected(collected, price) if collect else None,
    )


def _decode_collected(parts: list[dict[str, np.ndarray]], price: float) -> dict[str, np.ndarray]:
    """Readable columns of every enumerated plan (codes decoded, units in names)."""
    if not parts:
        return {}
    cols = {k: np.concatenate([p.get(k, np.full(len(p["tp"]), np.nan)) for p in parts])
            for k in (*_COLUMNS, "num_gpus", "memory_bytes", "estimate_s")}  # fmt: skip
    est = cols["estimate_s"].astype(float)
    return {
        "num_gpus": cols["num_gpus"],
        "tp": cols["tp"],
        "pp": cols["pp"],
        "dp": cols["dp"],
        "cp": cols["cp"],
        "cp_kind": np.where(cols["cp"] > 1, np.array(CP_KINDS)[cols["kind"]], ""),
        "ep": cols["ep"],
        "vpp": cols["vpp"],
        "zero": cols["zero"],
        "micro_batch": cols["mb"],
        "num_microbatches": cols["m"],
        "recompute": np.array(RECOMPUTE)[cols["rec"]],
        "sequence_parallel": cols["sp"].astype(bool),
        "peak_memory_gib": cols["memory_bytes"] / GIB,
        "fits": np.isfinite(est),
        "estimate_s": est,
        "cost_usd_per_iteration_estimate": est * cols["num_gpus"] * price / 3600.0,
    }


def _simulate_candidates(
    chosen: list[_Candidate],
    gpu_id: str,
    cat: Catalog,
    price: float,
    balance: bool,
    done: Callable[[int, int], None] | None = None,
) -> list[RankedPlan]:
    """The simulator's result for each candidate that fits, and for its balanced split
    where that is estimated to help. Step costs come from :func:`step_costs_many`, one
    batch per system (they equal ``step_costs``; the simulator itself does the rest)."""
    work: list[tuple[_Candidate, TrainPlan, bool]] = []
    for cand in chosen:
        ctx, plan = cand.ctx, cand.plan
        work.append((cand, plan, False))
        if balance and plan.pp > 1 and plan.vpp == 1 and cand.balanced_s < cand.estimate_s:
            split = _balanced_split(ctx, plan)
            if split is not None and split != plan.layers_per_chunk(ctx.model.num_layers):
                work.append((cand, plan.model_copy(update={"layer_split": split}), True))
    fitting = []
    for cand, variant, balanced in work:
        check_plan(variant, cand.ctx.model)
        mem = estimate_memory(cand.ctx.model, variant, cand.ctx.system.gpu)
        if mem.fits:
            fitting.append((cand, variant, balanced, mem))
    costs: dict[int, StepCosts] = {}
    for ctx in {id(c.ctx): c.ctx for c, *_ in fitting}.values():
        mine = [i for i, (c, *_) in enumerate(fitting) if c.ctx is ctx]
        plans = [fitting[i][1] for i in mine]
        batch = step_costs_many(
            ctx.model, plans, ctx.cost_model, ctx.system, ctx.attn_backend, ctx.op_cache
        )
        costs.update(zip(mine, batch, strict=True))
    out: list[RankedPlan] = []
    for i, (cand, variant, balanced, mem) in enumerate(fitting):
        ctx = cand.ctx
        res = simulate_iteration(
            ctx.model,
            variant,
            gpu_id,
            cost_model=ctx.cost_model,
            catalog=cat,
            attn_backend=ctx.attn_backend,
            costs=costs[i],
            system=ctx.system,
        )
        out.append(
            RankedPlan(
                plan=variant,
                iteration_s=res.iteration_s,
                estimate_s=cand.balanced_s if balanced else cand.estimate_s,
                tokens_per_s=res.tokens_per_s,
                mfu=res.mfu,
                peak_memory_bytes=float(mem.total_bytes),
                capacity_bytes=float(mem.capacity_bytes),
                cost_usd_per_iteration=res.iteration_s * variant.num_gpus * price / 3600.0,
                balanced=balanced,
                breakdown_s=dict(res.breakdown_s),
            )
        )
        if done is not None:
            done(i + 1, len(fitting))
    return out


def _balanced_split(ctx: _Context, plan: TrainPlan) -> tuple[int, ...] | None:
    """Layers per stage for ``plan`` (1F1B) balancing time under each stage's memory."""
    (c,) = step_costs_many(
        ctx.model, [plan], ctx.cost_model, ctx.system, ctx.attn_backend, ctx.op_cache
    )
    per_layer = c.layer_fwd.total_s + c.layer_bwd.total_s + c.layer_recompute.total_s
    work = [0.0] * plan.pp
    work[0] += c.first_fwd.total_s + c.first_bwd.total_s
    work[-1] += c.last_fwd.total_s + c.last_bwd.total_s
    caps = _stage_layer_caps(ctx, plan)
    return balance_split(ctx.model.num_layers, work, per_layer, caps)


def _stage_layer_caps(ctx: _Context, plan: TrainPlan) -> list[int] | None:
    """Most layers each pipeline stage can hold within the GPU's memory.

    A stage's memory depends only on its own layer count and position, and is affine in
    the layer count (weights, gradients, optimizer state and stored activations all
    scale with it), so two probe splits of :func:`estimate_memory` give each stage's line.
    """
    p, layers = plan.pp, ctx.model.num_layers
    if layers < 2 * p - 1:
        return None
    s1 = tuple([1] * (p - 1) + [layers - (p - 1)])
    s2 = tuple([2] * (p - 1) + [layers - 2 * (p - 1)])
    m1 = estimate_memory(ctx.model, plan.model_copy(update={"layer_split": s1}), ctx.system.gpu)
    m2 = estimate_memory(ctx.model, plan.model_copy(update={"layer_split": s2}), ctx.system.gpu)
    cap = m1.capacity_bytes
    caps = []
    for r in range(p):
        y1, y2 = m1.per_stage_total_bytes[r], m2.per_stage_total_bytes[r]
        slope = (y2 - y1) / (s2[r] - s1[r])
        if slope <= 0:
            caps.append(layers)
            continue
        caps.append(int(min(layers, math.floor(s1[r] + (cap - y1) / slope + 1e-9))))
    return caps
