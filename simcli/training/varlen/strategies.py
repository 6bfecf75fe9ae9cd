"""Layouts of a step: the static mesh, ByteScale's hybrid data parallelism and Hydraulis's
heterogeneous replicas (FlexSP is in :mod:`simcli.training.varlen.flexsp`)."""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from costmodels.steps.varlen import VarlenCoster
from simcli.training.varlen.config import VarlenError
from simcli.training.varlen.packing import Lane, eft, ffd
from workloads.decompose import valid_tp_degrees


@dataclass(frozen=True)
class StaticPlan:
    tp: int
    cp: int
    dp: int
    seq_len: int
    micro_batch: int = 1  # bins (sequences of seq_len) per micro-batch


def static_lanes(plan: StaticPlan, lengths: np.ndarray, padded: bool = True) -> list[Lane]:
    """The static layout: FFD into ``seq_len`` bins, bins round-robin over the DP ranks,
    ``plan.micro_batch`` bins per micro-batch, each bin padded to ``seq_len``."""
    bins = ffd(lengths, plan.seq_len)
    per_dp: list[list[list[int]]] = [[] for _ in range(plan.dp)]
    for i, b in enumerate(bins):
        per_dp[i % plan.dp].append(b)
    lanes = []
    bin_tokens = plan.seq_len // plan.cp
    for mine in per_dp:
        lane = Lane(plan.tp, plan.cp, bins=[], padded_tokens=[] if padded else None)
        for first in range(0, len(mine), plan.micro_batch):
            group = mine[first : first + plan.micro_batch]
            start = len(lane.docs)
            for d in (d for b in group for d in b):
                lane.add(d, plan.cp)
            assert lane.bins is not None
            lane.bins.append(list(range(start, len(lane.docs))))
            if lane.padded_tokens is not None:
                lane.padded_tokens.append(bin_tokens * len(group))
        lanes.append(lane)
    return lanes


def bytescale_lanes(coster: VarlenCoster, tp: int, lengths: np.ndarray) -> list[Lane]:
    """ByteScale-style HDP: each document on ``ceil(L / limit)`` TP groups (1 for most),
    shards and documents balanced by predicted time over the TP groups."""
    units = coster.num_gpus // tp
    limit = coster.limit(tp)
    c = np.maximum(1, np.ceil(lengths / limit)).astype(np.int64)
    if int(c.max()) > units:
        raise VarlenError(
            f"a {int(lengths.max())}-token document needs {int(c.max())} TP groups of "
            f"{limit} tokens each but there are {units}; allowed: more GPUs, larger tp, or "
            f"a smaller --seq-len"
        )
    cost = coster.doc_cost_s(tp, lengths, c)
    lanes = [Lane(tp, 1) for _ in range(units)]
    heap = [(0.0, u) for u in range(units)]
    # Longest work first: CP documents occupy several ranks at once, then LPT for the rest.
    for d in np.lexsort((-cost, -c)):
        k = int(c[d])
        taken = [heapq.heappop(heap) for _ in range(k)]
        for load, u in taken:
            lanes[u].add(int(d), k)
            heapq.heappush(heap, (load + float(cost[d]), u))
    return lanes


def bytescale_layout(coster: VarlenCoster, tp: int, lengths: np.ndarray) -> str:
    """``dpU`` plus ``cpK xN``: N documents split over K TP groups this step."""
    c = np.maximum(1, np.ceil(lengths / coster.limit(tp))).astype(np.int64)
    sharded = Counter(int(k) for k in c if k > 1)
    parts = [f"dp{coster.num_gpus // tp}"] + [f"cp{k}x{n}" for k, n in sorted(sharded.items())]
    return ",".join(parts)


@dataclass(frozen=True)
class ReplicaConfig:
    """A Hydraulis replica configuration: ``cp`` TP groups of ``tp`` GPUs (a CP group)."""

    tp: int
    cp: int

    @property
    def gpus(self) -> int:
        return self.tp * self.cp


def hydraulis_configs(
    coster: VarlenCoster, tp: int, block: int
) -> tuple[list[ReplicaConfig], list[int]]:
    """Candidate configurations of one block (wider TP, or CP, inside it) and the TP
    degrees they need priced."""
    valid = set(valid_tp_degrees(coster.model))
    out: list[ReplicaConfig] = []
    k = 1
    while tp * k <= block:
        if block % (tp * k) == 0:
            if tp * k in valid:
                out.append(ReplicaConfig(tp * k, 1))
            if k > 1:
                out.append(ReplicaConfig(tp, k))
        k *= 2
    return out, sorted({cfg.tp for cfg in out})


def hydraulis_lanes(
    coster: VarlenCoster, tp: int, lengths: np.ndarray, configs: list[ReplicaConfig], block: int
) -> tuple[list[Lane], str]:
    """Hydraulis-style: choose the step's heterogeneous layout, then EFT/LPT on predicted
    time.

    A layout is a number of replicas of each candidate configuration: ``configs`` fit in a
    node-sized block (wider TP, or CP, inside it); merged groups of ``m`` blocks (CP across
    nodes) hold documents no block can. Candidates, each priced by the makespan of its EFT
    assignment: the configuration with the fewest GPU-seconds for the step's documents
    everywhere; half of the GPUs given to the runner-up; and 1, 2 or 4 replicas of each
    configuration that holds the step's longest document (the cheapest in-block one and
    every merged one), the rest as before."""
    n_gpus = coster.num_gpus
    blocks = n_gpus // block
    in_cfgs = [cfg for cfg in configs if coster.limit(cfg.tp) > 0]
    merged = {1 << i for i in range(1, int(math.log2(blocks)) + 1)} | ({blocks} - {1})
    types = in_cfgs + [ReplicaConfig(tp, m * block // tp) for m in sorted(merged)]
    costs = []
    for cfg in types:
        fits = lengths <= coster.limit(cfg.tp) * cfg.cp
        costs.append(np.where(fits, coster.doc_cost_s(cfg.tp, lengths, cfg.cp), math.inf))
    cheapest = np.min(np.vstack(costs), axis=0)
    if not np.all(np.isfinite(cheapest)):
        raise VarlenError(
            f"a {int(lengths.max())}-token document fits no group of {n_gpus} GPUs "
            f"at tp={tp} ({coster.limit(tp)} tokens per rank); allowed: more GPUs, larger "
            "tp, or a smaller --seq-len"
        )
    order = np.argsort(-cheapest, kind="stable")

    def gpu_seconds(t: int) -> float:
        ok = np.isfinite(costs[t])
        return float(costs[t][ok].sum()) * types[t].gpus / max(1, int(ok.sum()))

    ranked = sorted(range(len(in_cfgs)), key=gpu_seconds)
    base = in_cfgs.index(ReplicaConfig(tp, 1))  # tp divides every size: it fills any remainder

    def complete(partial: dict[int, int]) -> dict[int, int] | None:
        layout = {t: n for t, n in partial.items() if n > 0}
        free = n_gpus - sum(n * types[t].gpus for t, n in layout.items())
        for t in (ranked[0], base):
            n = max(0, free) // types[t].gpus
            if n:
                layout[t] = layout.get(t, 0) + n
                free -= n * types[t].gpus
        return layout if free == 0 else None

    longest = int(np.argmax(lengths))
    holds = [t for t in range(len(types)) if np.isfinite(costs[t][longest])]
    wide = sorted((t for t in holds if t < len(in_cfgs)), key=gpu_seconds)[:1]
    wide += [t for t in holds if t >= len(in_cfgs)]
    partials: list[dict[int, int]] = [{}]
    if len(ranked) > 1:
        partials.append({ranked[1]: (n_gpus // 2) // types[ranked[1]].gpus})
    partials += [{t: n} for t in wide for n in (1, 2, 4) if n * types[t].gpus <= n_gpus]

    best: tuple[float, list[int]] | None = None
    seen: set[tuple[int, ...]] = set()
    for partial in partials:
        layout = complete(partial)
        if layout is None:
            continue
        counts = [layout.get(t, 0) for t in range(len(types))]
        if tuple(counts) in seen:
            continue
        seen.add(tuple(counts))
        try:
            _, makespan = eft(costs, counts, order)
        except VarlenError:  # some document fits none of this layout's configurations
            continue
        if best is None or makespan < best[0]:
            best = (makespan, counts)
    if best is None:  # pragma: no cover - a replica of a config holding the longest fits all
        raise VarlenError("no Hydraulis layout holds every document")
    assigned, _ = eft(costs, best[1], order)
    lanes: list[Lane] = []
    names: Counter[str] = Counter()
    for t, per_lane in enumerate(assigned):
        cfg = types[t]
        for docs in per_lane:
            lane = Lane(cfg.tp, cfg.cp)
            for d in docs:
                lane.add(d, cfg.cp)
            lanes.append(lane)
            names[f"tp{cfg.tp}cp{cfg.cp}"] += 1
    return lanes, ",".join(f"{k}x{v}" for k, v in sorted(names.items()))
