"""Step costs of many training plans at once (the plan search): every distinct op priced in one
``predict_many`` call.

:func:`step_costs_many` is :func:`~costmodels.steps.training.step_costs` (framework
``megatron``) for many plans at once; :func:`collectives_s` and :func:`optimizer_s` are the
vectorised collective and optimizer-step prices the closed-form estimate
(:mod:`simcli.training.search_estimate`) sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from costmodels.steps.training import (
    CostModel,
    Phase,
    StepCosts,
    cp_comms,
    cp_exposed_s,
    ep_comm,
    group_nodes,
    op_groups,
    plan_fields,
    recompute_phase,
    sum_phase,
    with_nodes,
)
from hardware_specs.registry import System
from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose import optimizer_ops
from workloads.models import ModelConfig
from workloads.ops import Op, OpKind, ops_frame
from workloads.plan import TrainPlan

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
        """Index of the op :func:`~costmodels.steps.training.collective_s` would price, or -1
        for the zero it returns without pricing."""
        if ranks <= 1 or nbytes <= 0:
            return -1
        op = Op(op=OpKind(kind), dtype=Dtype(dtype), bytes=int(nbytes), ranks=ranks)
        return self.add(with_nodes(op, nodes))

    def run(self) -> None:
        n_done = len(self.times)
        if len(self._ops) > n_done:
            new = self.cost_model.predict_many(ops_frame(self._ops[n_done:]))
            self.times = np.concatenate([self.times, np.asarray(new, dtype=float)])

    def time(self, index: int) -> float:
        return 0.0 if index < 0 else float(self.times[index])


def unique_rows(cols: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
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


def collectives_s(
    cost_model: CostModel,
    kind: str,
    nbytes: np.ndarray,
    ranks: np.ndarray,
    nodes: np.ndarray,
    dtype: str,
) -> np.ndarray:
    """Vectorised ``collective_s``: each distinct (bytes, ranks, nodes) priced once."""
    nbytes = np.asarray(nbytes, dtype=float)
    ranks = np.broadcast_to(np.asarray(ranks, dtype=np.int64), nbytes.shape)
    nodes = np.broadcast_to(np.asarray(nodes, dtype=np.int64), nbytes.shape)
    out = np.zeros(nbytes.shape)
    ok = (ranks > 1) & (nbytes > 0)
    if not ok.any():
        return out
    uniq, inv = unique_rows([nbytes[ok].astype(np.int64), ranks[ok], nodes[ok]])
    ops = [
        with_nodes(Op(op=OpKind(kind), dtype=Dtype(dtype), bytes=int(b), ranks=int(r)), int(n))
        for b, r, n in uniq
    ]
    times = np.asarray(cost_model.predict_many(ops_frame(ops)), dtype=float)
    out[ok] = times[inv.reshape(-1)]
    return out


def optimizer_s(
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
    times = np.asarray(cost_model.predict_many(ops_frame(rows)), dtype=float)
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
        index = [[pricer.add(with_nodes(o.op, tp_nodes)) for o in g] for g in groups]
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
            plan.stage_stride >= system.node.gpus_per_node,
            plan.dp_stride,
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
            phases.append(sum_phase(g, t, plan, 1.0 / plan.cp))
        info["phases"] = phases

    out: list[StepCosts] = []
    for plan, key, req in zip(plans, plan_phase, comm, strict=True):
        layer_f, layer_b, f_f, f_b, l_f, l_b = phase_keys[key]["phases"]
        cp_f, cp_b = _cp_exposed(plan, req, pricer, layer_f, layer_b)
        ep_one = pricer.time(req["ep"])
        ep_f = ep_b = 2.0 * ep_one
        layer_f = replace(layer_f, cp_comm_s=cp_f, ep_comm_s=ep_f)
        layer_b = replace(layer_b, cp_comm_s=cp_b, ep_comm_s=ep_b)
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
    req: dict[str, Any] = {"ep": -1, "gpn": gpn}
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
        p2p_nodes = 2 if plan.stage_stride >= gpn else 1
        op = Op(op=OpKind.send_recv, dtype=Dtype(act), bytes=int(p2p_bytes), ranks=2)
        req["p2p"] = pricer.add(with_nodes(op, p2p_nodes))
    return req


def _cp_exposed(
    plan: TrainPlan, req: dict[str, Any], pricer: _Pricer, layer_f: Phase, layer_b: Phase
) -> tuple[float, float]:
    keys = ("a2a", "a2a_kv", "step_f", "step_b", "ag_kv", "rs_kv")
    times = {k: pricer.time(req[k]) for k in keys if k in req}
    attn_f, attn_b = layer_f.by_op_s.get("attn", 0.0), layer_b.by_op_s.get("attn_bwd", 0.0)
    return cp_exposed_s(plan, times, attn_f, attn_b, req["gpn"])
