"""Documents of a step, and the lanes that process them: sampling, first-fit-decreasing
packing, earliest-finish-time assignment, and pricing a plan micro-batch by micro-batch."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from costmodels.steps.varlen import VarlenCoster
from simcli.training.varlen.config import VarlenError
from workloads.lengths import LengthDist


def sample_steps(
    dist: LengthDist, tokens_per_step: int, steps: int, seed: int, seq_len: int
) -> list[np.ndarray]:
    """Documents of every step: drawn in order until the step holds at least
    ``tokens_per_step`` tokens; documents longer than ``seq_len`` are cut into
    ``seq_len`` pieces (as pre-training loaders do). One generator, seeded once."""
    rng = np.random.default_rng(seed)
    pool = dist.sample(256, rng)
    chunk = int(min(1 << 16, max(256, 2 * tokens_per_step / max(1.0, float(pool.mean())))))
    pos = 0
    out: list[np.ndarray] = []
    for _ in range(steps):
        docs: list[int] = []
        total = 0
        while total < tokens_per_step:
            if pos == len(pool):
                pool, pos = dist.sample(chunk, rng), 0
            L = int(pool[pos])
            pos += 1
            while seq_len < L:
                docs.append(seq_len)
                total += seq_len
                L -= seq_len
            docs.append(L)
            total += L
        out.append(np.asarray(docs, dtype=np.int64))
    return out


@dataclass
class Lane:
    """GPUs that run micro-batches together: one TP group (``cp == 1``) or a CP group of
    ``cp`` TP groups. ``docs[i]`` is held split over ``shards[i]`` ranks: a CP group's
    documents have ``shards == cp``; a ByteScale rank holds ``1/shards`` of a long document
    whose other shards sit on other lanes. ``bins`` fixes the micro-batches (static);
    otherwise they are packed first-fit-decreasing up to the memory limit."""

    tp: int
    cp: int
    docs: list[int] = field(default_factory=list)
    shards: list[int] = field(default_factory=list)
    bins: list[list[int]] | None = None  # micro-batches as positions into docs
    padded_tokens: list[int] | None = None  # per micro-batch: per-GPU tokens padded to

    @property
    def gpus(self) -> int:
        return self.tp * self.cp

    def add(self, doc: int, shards: int) -> None:
        self.docs.append(doc)
        self.shards.append(shards)


@dataclass
class LaneCost:
    busy_s: float
    micro_batches: int
    tokens_per_rank_max: float  # largest micro-batch per rank, padding included
    fill_max: float  # tokens_per_rank_max / the memory limit
    padding_tokens: float


def ffd(sizes: np.ndarray, capacity: float) -> list[list[int]]:
    """First-fit-decreasing bin packing; returns positions per bin (items larger than the
    capacity get a bin of their own)."""
    order = np.argsort(-np.asarray(sizes, dtype=float), kind="stable")
    bins: list[list[int]] = []
    room: list[float] = []
    for i in order:
        s = float(sizes[i])
        for j, r in enumerate(room):
            if s <= r + 1e-9:
                bins[j].append(int(i))
                room[j] = r - s
                break
        else:
            bins.append([int(i)])
            room.append(capacity - s)
    return bins


def eft(
    costs: list[np.ndarray], counts: list[int], order: np.ndarray | None = None
) -> tuple[list[list[list[int]]], float]:
    """Greedy LPT / earliest-finish-time over heterogeneous lanes: documents in decreasing
    order of their cheapest cost, each to the lane where it would finish first.
    ``costs[t][d]`` is document d's time on a lane of type t (inf: does not fit);
    ``counts[t]`` lanes of type t. Returns documents per lane per type and the makespan."""
    best = np.min(np.vstack(costs), axis=0) if costs else np.zeros(0)
    if order is None:
        order = np.argsort(-best, kind="stable")
    heaps = [[(0.0, i) for i in range(n)] for n in counts]
    out: list[list[list[int]]] = [[[] for _ in range(n)] for n in counts]
    live = [t for t, n in enumerate(counts) if n > 0]
    for d in order:
        pick, finish = -1, math.inf
        for t in live:
            cost = costs[t][d]
            if cost == math.inf:
                continue
            f = heaps[t][0][0] + cost
            if f < finish:
                pick, finish = t, f
        if pick < 0:
            raise VarlenError(f"document {d} fits no lane of the layout")
        _, lane = heapq.heappop(heaps[pick])
        heapq.heappush(heaps[pick], (finish, lane))
        out[pick][lane].append(int(d))
    return out, max((load for hs in heaps for load, _ in hs), default=0.0)


def lane_cost(coster: VarlenCoster, lane: Lane, lengths: np.ndarray) -> LaneCost:
    """Price one lane micro-batch by micro-batch (see :mod:`simcli.training.varlen`)."""
    if not lane.docs:
        return LaneCost(0.0, 0, 0.0, 0.0, 0.0)
    L = lengths[np.asarray(lane.docs)].astype(float)
    c = np.asarray(lane.shards, dtype=float)
    per_rank = L / c
    limit = coster.limit(lane.tp)
    bins = lane.bins if lane.bins is not None else ffd(per_rank, limit)
    attn_f, attn_b = coster.attention_s(lane.tp, L)
    attn_f, attn_b = attn_f / c, attn_b / c  # per rank
    fwd_passes = 2.0 if coster.recompute == "full" else 1.0
    busy = pad = 0.0
    peak = 0.0
    for j, positions in enumerate(bins):
        idx = np.asarray(positions)
        tok = float(per_rank[idx].sum())
        run = max(tok, float(lane.padded_tokens[j])) if lane.padded_tokens else tok
        pad += (run - tok) * lane.cp
        peak = max(peak, run)
        busy += float(coster.linear_s(lane.tp, run))
        busy += float(fwd_passes * attn_f[idx].sum() + attn_b[idx].sum())
        for deg in np.unique(c[idx]):
            if deg <= 1:
                continue
            sel = idx[c[idx] == deg]
            busy += coster.ring_exposed_s(
                lane.tp,
                int(deg),
                float(per_rank[sel].sum()),
                float(attn_f[sel].sum()),
                float(attn_b[sel].sum()),
            )
    return LaneCost(busy, len(bins), peak, peak / limit if limit else math.inf, pad)


@dataclass
class StepOutcome:
    """One strategy on one step."""

    step_s: float
    busy_s: np.ndarray  # per GPU
    tokens: int
    padding_tokens: float
    fill_max: float
    tokens_per_rank_max: float
    fallback: bool
    lanes: list[Lane]
    layout: str

    @property
    def imbalance(self) -> float:
        mean = float(self.busy_s.mean())
        return float(self.busy_s.max()) / mean if mean > 0 else 1.0


def evaluate(
    coster: VarlenCoster, lanes: list[Lane], lengths: np.ndarray, layout: str = ""
) -> StepOutcome:
    """Price a plan: step time = the busiest lane + the optimizer step."""
    busy: list[np.ndarray] = []
    pad = fill = peak = 0.0
    for lane in lanes:
        lc = lane_cost(coster, lane, lengths)
        busy.append(np.full(lane.gpus, lc.busy_s))
        pad += lc.padding_tokens
        fill = max(fill, lc.fill_max)
        peak = max(peak, lc.tokens_per_rank_max)
    per_gpu = np.concatenate(busy) if busy else np.zeros(1)
    return StepOutcome(
        step_s=float(per_gpu.max()) + coster.optimizer_s,
        busy_s=per_gpu,
        tokens=int(lengths.sum()),
        padding_tokens=pad,
        fill_max=fill,
        tokens_per_rank_max=peak,
        fallback=False,
        lanes=lanes,
        layout=layout,
    )
