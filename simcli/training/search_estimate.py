"""Closed-form iteration time of many plans at once (the plan search's estimate).

A plan's per-micro-batch costs depend only on (tp, sp, micro-batch, cp, cp kind, ep,
recompute), never on pp, dp or the schedule, so they are priced once per distinct key
(:func:`~costmodels.steps.training_many.step_costs_many`), and the iteration time of all
plans is then evaluated with numpy (:func:`pipeline_times`, the DP-gradient tail, ZeRO-3
exposure, the optimizer step), mirroring the discrete-event simulator for even stages.
Also here: every plan's peak memory and the Galvatron-BMW stage balancing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from costmodels.steps.memory import DRIVER_RESERVED_BYTES, memory_bytes_many
from costmodels.steps.training import CostModel, optimizer_offload_s
from costmodels.steps.training_many import (
    collectives_s,
    optimizer_s,
    step_costs_many,
    unique_rows,
)
from hardware_specs.registry import System
from simcli.training.search_space import trim_layers
from simcli.training.simulator import interference, schedule, task_dependency
from workloads.models import ModelConfig
from workloads.plan import CP_KINDS, PP_SCHEDULES, RECOMPUTE, TP_COMMS, TrainPlan

# Megatron's default DP gradient bucket (TrainPlan.grad_bucket_bytes); plans keep it.
_BUCKET_BYTES = TrainPlan.model_fields["grad_bucket_bytes"].default


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
            d = task_dependency(t, last, p)
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


# --------------------------------------------------------------------------- fast estimate


@dataclass
class EstimateContext:
    model: ModelConfig
    system: System
    cost_model: CostModel
    num_gpus: int
    seq_len: int
    global_batch: int
    precision: str
    attn_backend: str = ""
    op_cache: dict = field(default_factory=dict)
    grad_bytes: int | None = None  # None: the precision's default (fp32 under mixed)
    fp8_params: bool = False
    memory_margin_bytes: float = 0.0  # memory a plan must leave free

    @property
    def gpn(self) -> int:
        return self.system.node.gpus_per_node


def _key_costs(ctx: EstimateContext, table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-plan step-cost scalars, each distinct (tp, sp, mb, cp, kind, ep, recompute, tp comm)
    priced once through :func:`step_costs_many`."""
    cols = ("tp", "sp", "mb", "cp", "kind", "ep", "rec", "tpc")
    uniq, inv = unique_rows([table[c] for c in cols])
    reps = []
    for tp, sp, mb, cp, kind, ep, rec, tpc in uniq.tolist():
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
                tp_comm=TP_COMMS[tpc] if tp > 1 else "plain",  # type: ignore[arg-type]
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
    ctx: EstimateContext, table: dict[str, np.ndarray], balance: bool = False, exact: bool = False
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
    # stage layouts (search_space.TRIMS): the first / last chunk holds d0 / dl layers
    # fewer than the others' lc
    trim = table.get("trim", np.zeros(len(tp), dtype=np.int64))
    d0, dl = trim_layers(trim)
    lc = (ctx.model.num_layers + d0 + dl) // n_chunks
    # rank layout (TrainPlan.dp_stride / stage_stride): Megatron's or Llama 3's order
    llama = table.get("ord", np.zeros(len(tp), dtype=np.int64)) == 1
    dp_stride = np.where(llama, tp * cp * pp, tp * cp)
    stage_stride = np.where(llama, tp * cp, tp * cp * dp)
    # Gradients reduce over the data-parallel group with context parallelism, dp * cp
    # ranks (Megatron-LM's get_data_parallel_group(with_context_parallel=True); the
    # simulator's ``red``): its node span as costmodels.steps.training.grad_group_nodes
    # (Megatron's order, or pp == 1: dp * cp ranks tp apart; Llama 3's: the CP group's
    # nodes times the DP group's)
    dpcp = dp * cp
    uniform = ~llama | (pp == 1)
    red_nodes = np.where(
        uniform,
        _group_nodes_many(dpcp, tp, gpn),
        _group_nodes_many(cp, tp, gpn) * _group_nodes_many(dp, dp_stride, gpn),
    )
    # pods / heterogeneous NICs (System.slowdown): the first stage's reduction group,
    # and the first pipeline hop, as the simulator prices them per stage and per pair.
    # The group's nodes as first + i * stride: tp apart (uniform), the DP group's node
    # stride (Llama 3's order, a CP block inside a node), else the mean gap between its
    # first and last node (the simulator's exact node set has that mean gap)
    last_node = ((cp - 1) * tp + (dp - 1) * dp_stride) // gpn
    mean_gap = np.maximum(1, np.rint(last_node / np.maximum(red_nodes - 1, 1))).astype(np.int64)
    node_stride = np.where(
        uniform,
        np.where(tp >= gpn, tp // gpn, 1),
        np.where(tp * cp <= gpn, np.where(dp_stride >= gpn, dp_stride // gpn, 1), mean_gap),
    )
    dp_slow = ctx.system.slowdown_many(0, node_stride, red_nodes, "all_reduce")
    hop_slow = np.where(
        stage_stride >= gpn,
        ctx.system.slowdown_many(
            0, np.maximum(1, stage_stride // gpn), 2, "send_recv",
            concurrent_nodes=np.maximum(1, (tp * cp * dp) // gpn),
        ),
        1.0,
    )  # fmt: skip
    # compute slowed by the NCCL kernels running beside it (simulator.interference)
    kappa_of = {int(x): interference(ctx.system, int(x)) for x in np.unique(red_nodes)}
    kappa = np.array([kappa_of[int(x)] for x in red_nodes]) if len(red_nodes) else np.zeros(0)
    grad_elt = ctx.grad_bytes or (2 if ctx.precision == "bf16" else 4)

    # ZeRO-2/3: per-layer gradient reduce-scatter every micro-batch; ZeRO-3 also the
    # parameter all-gather; prefetched (simulator._simulate).
    z3 = (zero >= 2) & (dpcp > 1)
    zf = np.zeros(len(tp))
    zb = np.zeros(len(tp))
    if z3.any():
        i = np.flatnonzero(z3)
        lp = k["layer_params"][i]
        gather = np.where(zero[i] == 3, dp_slow[i], 0.0) * collectives_s(
            cm, "all_gather", lp * 2, dpcp[i], red_nodes[i], "bf16"
        )
        rs = dp_slow[i] * collectives_s(
            cm, "reduce_scatter", lp * grad_elt, dpcp[i], red_nodes[i], "fp32"
        )
        cf = k["lf_compute"][i]
        cb = k["lb_compute"][i] + k["rc"][i]
        kz = kappa[i]
        zf[i] = np.maximum(0.0, gather - cf) + kz * np.minimum(gather, cf)
        zb[i] = np.maximum(0.0, gather + rs - cb) + kz * np.minimum(gather + rs, cb)

    f_mid = lc * (k["lf"] + zf)
    b_mid = lc * (k["lb"] + k["rc"] + zb)
    act_nodes = np.where(stage_stride >= gpn, 2, 1)
    c = np.zeros(len(tp))
    piped = pp > 1
    if piped.any():
        i = np.flatnonzero(piped)
        c[i] = hop_slow[i] * collectives_s(
            cm, "send_recv", k["p2p_bytes"][i], 2, act_nodes[i], _act_dtype(ctx.precision)
        )
    f_layer, b_layer = k["lf"] + zf, k["lb"] + k["rc"] + zb
    ef, eb = k["ef"] - d0 * f_layer, k["eb"] - d0 * b_layer
    lf_x, lb_x = k["lf_x"] - dl * f_layer, k["lb_x"] - dl * b_layer
    first = (ef, eb)
    last = (lf_x, lb_x)
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
            (lc - d0) * lp + k["emb_params"],
            (lc - dl) * lp + k["lm_params"],
            lc * lp + k["emb_params"] + k["lm_params"],
        ]
    )
    bwd = np.stack([b_mid, b_mid + eb, b_mid + lb_x, b_mid + k["eb"] + k["lb_x"]])
    reduce_dp = (dpcp > 1) & (zero < 2)
    nbytes = params * grad_elt
    nb = np.maximum(1, np.ceil(nbytes / _BUCKET_BYTES))
    tb = np.zeros(nb.shape)
    for code, coll in ((0, "all_reduce"), (1, "reduce_scatter")):
        i = np.flatnonzero(reduce_dp & ((zero == 0) == (code == 0)))
        if len(i):
            r = np.broadcast_to(dpcp[i], (4, len(i))).reshape(-1)
            nd = np.broadcast_to(red_nodes[i], (4, len(i))).reshape(-1)
            per = (nbytes[:, i] / nb[:, i]).reshape(-1)
            tb[:, i] = dp_slow[i] * collectives_s(
                cm, coll, per, r, nd, _grad_dtype(grad_elt)
            ).reshape(4, -1)
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

    # Optimizer step on each rank's share (ZeRO >= 1: 1/(dp * cp) of it).
    shard = np.where(zero >= 1, dpcp, 1)
    rank_params = {
        "0": (v * lc - d0) * lp + k["emb_params"] + np.where(pp == 1, k["lm_params"], 0),
        "1": v * lc * lp,
        "l": (v * lc - dl) * lp + k["lm_params"],
    }
    master = "bf16" if ctx.precision == "bf16" else "fp32"
    iteration = np.zeros(len(tp))
    for rank, params in rank_params.items():
        n_opt = np.maximum(1, np.ceil(params / shard))
        exists = np.ones(len(tp), bool) if rank == "0" else (pp > 2 if rank == "1" else pp > 1)
        i = np.flatnonzero(exists)
        if not len(i):
            continue
        opt = optimizer_s(cm, ctx.model, n_opt[i], master)
        if "off" in table:
            # the offloaded share steps on the host (costmodels.steps.training)
            f = table["off"][i] / 100.0
            host = optimizer_offload_s(f * n_opt[i], grad_elt, ctx.system)
            opt = (1 - f) * opt + np.where(f > 0, host, 0.0)
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
        i = np.flatnonzero((pp > 1) & (v == 1) & (trim == 0))
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
    # an uneven split: the next node count dividing the group (as group_nodes does)
    for _ in range(int(np.max(size, initial=1))):
        uneven = (size % spread) != 0
        if not uneven.any():
            break
        spread = np.where(uneven, spread + 1, spread)
    return np.where(size <= 1, 1, np.where(stride >= gpn, size, spread))


def _act_dtype(precision: str) -> str:
    return "fp16" if precision == "fp16-mixed" else "bf16"


def _grad_dtype(grad_elt: int) -> str:
    return "fp32" if grad_elt == 4 else "bf16"


# --------------------------------------------------------------------------- memory


def plan_memory_bytes(ctx: EstimateContext, table: dict[str, np.ndarray]) -> np.ndarray:
    """Peak bytes per GPU of every plan (:func:`~costmodels.steps.memory.memory_bytes_many`)."""
    trims = trim_layers(table["trim"]) if "trim" in table else (0, 0)
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
            cp_kind=table["kind"],  # codes: the index in CP_KINDS
            trim_first=trims[0],
            trim_last=trims[1],
            fp8_params=ctx.fp8_params,
            grad_bytes=ctx.grad_bytes,
            optimizer_offload=table["off"] / 100.0 if "off" in table else 0.0,
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
