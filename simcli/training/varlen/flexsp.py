"""FlexSP: sequence-parallel groups of several sizes per step, documents assigned to sizes
by a mixed-integer linear program (scipy ``milp``, HiGHS) under a bisected makespan bound,
then LPT inside each size."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from costmodels.steps.varlen import VarlenCoster
from simcli.training.varlen.config import VarlenError
from simcli.training.varlen.packing import Lane, eft


@dataclass(frozen=True)
class FlexSPSolution:
    """An integer solution of the FlexSP assignment program at makespan bound ``bound_s``.

    ``groups[k]``: SP groups of ``k`` TP groups; ``assign[b][k]``: documents of bucket b on
    groups of size k; ``load_s[b][k]``: a bucket-b document's predicted time on size k."""

    sizes: tuple[int, ...]
    groups: dict[int, int]
    assign: list[dict[int, int]]
    bucket_docs: list[np.ndarray]
    load_s: list[dict[int, float]]
    bound_s: float
    units: int


def flexsp_buckets(lengths: np.ndarray, per_octave: int = 2) -> list[np.ndarray]:
    """Documents grouped into length buckets of ``2**(1/per_octave)`` width (FlexSP buckets
    sequences to keep its program small)."""
    key = np.floor(np.log2(np.maximum(lengths, 1)) * per_octave).astype(np.int64)
    return [np.flatnonzero(key == k) for k in np.unique(key)]


def solve_flexsp_milp(
    doc_cost: dict[int, np.ndarray],
    fits: dict[int, np.ndarray],
    buckets: list[np.ndarray],
    units: int,
    bound_s: float,
    time_limit_s: float = 1.0,
) -> FlexSPSolution | None:
    """Can every document finish within ``bound_s``? The program (after FlexSP, Wang et al.
    2025, sec. 4, aggregated over buckets and group sizes):

    variables ``y_k`` (groups of size k, integer), ``z_bk`` (bucket-b documents on size-k
    groups, integer);
    ``sum_k k y_k <= units``; ``sum_k z_bk = n_b``; ``sum_b t_bk z_bk <= bound * y_k``
    (a size's work fits its groups); ``z_bk = 0`` unless every bucket-b document fits a
    size-k group's memory and takes at most ``bound`` there;
    minimise GPU-seconds ``sum k t_bk z_bk``. Returns None when infeasible."""
    sizes = tuple(sorted(doc_cost))
    pairs: list[tuple[int, int, float]] = []
    for b, docs in enumerate(buckets):
        for k in sizes:
            if not np.all(fits[k][docs]):
                continue
            t = doc_cost[k][docs]
            if float(t.max()) <= bound_s:
                pairs.append((b, k, float(t.mean())))
    nk, nz = len(sizes), len(pairs)
    n = nk + nz
    rows, lo, hi = [], [], []
    row = np.zeros(n)
    row[:nk] = sizes
    rows.append(row)
    lo.append(-np.inf)
    hi.append(units)
    for b, docs in enumerate(buckets):
        row = np.zeros(n)
        for j, (bb, _, _) in enumerate(pairs):
            if bb == b:
                row[nk + j] = 1.0
        if not row.any():
            return None
        rows.append(row)
        lo.append(len(docs))
        hi.append(len(docs))
    for i, k in enumerate(sizes):
        row = np.zeros(n)
        row[i] = -bound_s
        for j, (_, kk, t) in enumerate(pairs):
            if kk == k:
                row[nk + j] = t
        rows.append(row)
        lo.append(-np.inf)
        hi.append(0.0)
    c = np.zeros(n)
    for j, (_, k, t) in enumerate(pairs):
        c[nk + j] = k * t
    upper = np.array([units // k for k in sizes] + [len(buckets[b]) for b, _, _ in pairs])
    res = milp(
        c=c,
        constraints=LinearConstraint(np.vstack(rows), np.array(lo), np.array(hi)),
        integrality=np.ones(n),
        bounds=Bounds(np.zeros(n), upper.astype(float)),
        options={"time_limit": time_limit_s, "mip_rel_gap": 1e-2},
    )
    if res.x is None or res.status not in (0, 1):
        return None
    x = np.rint(res.x).astype(np.int64)
    groups = {k: int(x[i]) for i, k in enumerate(sizes)}
    assign: list[dict[int, int]] = [{} for _ in buckets]
    load: list[dict[int, float]] = [{} for _ in buckets]
    for j, (b, k, t) in enumerate(pairs):
        assign[b][k] = int(x[nk + j])
        load[b][k] = t
    return FlexSPSolution(sizes, groups, assign, buckets, load, bound_s, units)


def flexsp_realise(
    sol: FlexSPSolution, doc_cost: dict[int, np.ndarray], lengths: np.ndarray, tp: int
) -> tuple[list[Lane], float]:
    """Turn an aggregated solution into groups: in each bucket the longest documents go
    to the largest groups chosen, then LPT on predicted time inside each group size."""
    per_size: dict[int, list[int]] = {k: [] for k in sol.sizes}
    for b, docs in enumerate(sol.bucket_docs):
        ordered = docs[np.argsort(-lengths[docs], kind="stable")]
        pos = 0
        for k in sorted(sol.assign[b], reverse=True):
            n = sol.assign[b][k]
            per_size[k].extend(int(d) for d in ordered[pos : pos + n])
            pos += n
    lanes: list[Lane] = []
    makespan = 0.0
    for k in sol.sizes:
        docs = per_size[k]
        if not sol.groups[k]:
            continue
        group = [Lane(tp, k) for _ in range(sol.groups[k])]
        heap = [(0.0, i) for i in range(len(group))]
        for d in sorted(docs, key=lambda d: -doc_cost[k][d]):
            load, i = heapq.heappop(heap)
            group[i].add(d, k)
            heapq.heappush(heap, (load + float(doc_cost[k][d]), i))
        makespan = max(makespan, max(h[0] for h in heap))
        lanes.extend(group)
    return lanes, makespan


def flexsp_lanes(
    coster: VarlenCoster, tp: int, lengths: np.ndarray, iterations: int = 10
) -> tuple[list[Lane], str]:
    """FlexSP-style: bisection on the makespan bound, one MILP per bound
    (:func:`solve_flexsp_milp`), the best realised plan kept."""
    units = coster.num_gpus // tp
    limit = coster.limit(tp)
    sizes = sorted({1 << i for i in range(int(math.log2(units)) + 1)} | {units})
    doc_cost = {k: coster.doc_cost_s(tp, lengths, k) for k in sizes}
    fits = {k: lengths <= limit * k for k in sizes}
    for k in sizes:
        doc_cost[k] = np.where(fits[k], doc_cost[k], math.inf)
    if not np.all(fits[sizes[-1]]):
        raise VarlenError(
            f"a {int(lengths.max())}-token document does not fit {sizes[-1]} TP groups of "
            f"{limit} tokens; allowed: more GPUs, larger tp, or a smaller --seq-len"
        )
    buckets = flexsp_buckets(lengths)
    gpu_s = np.min(np.vstack([k * doc_cost[k] for k in sizes]), axis=0)
    lo = max(float(gpu_s.sum()) / units, float(np.min(np.vstack(list(doc_cost.values())), 0).max()))
    # A feasible start (and upper bound): every document on groups of the smallest size
    # that holds them all, assigned by EFT.
    k_all = next(k for k in sizes if np.all(fits[k]))
    assigned, hi = eft([doc_cost[k_all]], [units // k_all])
    best_lanes = []
    for docs in assigned[0]:
        lane = Lane(tp, k_all)
        for d in docs:
            lane.add(d, k_all)
        best_lanes.append(lane)
    best_span, best_groups = hi, {k_all: units // k_all}
    for _ in range(iterations):
        if hi - lo <= 0.01 * hi:
            break
        mid = 0.5 * (lo + hi)
        sol = solve_flexsp_milp(doc_cost, fits, buckets, units, mid)
        if sol is None:
            lo = mid
            continue
        hi = mid
        lanes, span = flexsp_realise(sol, doc_cost, lengths, tp)
        if span < best_span:
            best_lanes, best_span, best_groups = lanes, span, sol.groups
    layout = ",".join(f"sp{k}x{n}" for k, n in sorted(best_groups.items()) if n)
    return best_lanes, layout
