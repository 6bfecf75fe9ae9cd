"""The serving planner's bounds (steps 2 and 3 of :mod:`simcli.serving.planner`): what a
config can reach without simulating it.

- :func:`idle_attainment`: the fraction of requests meeting the SLO alone on an idle
  replica, an upper bound on the attainment of any replica count (queueing and batching
  only make requests slower);
- :func:`replica_bounds`: the work bound ``R_lb`` on replicas (the busy seconds of the
  cheapest ``ceil(attainment x N)`` requests over the window they must finish in) and the
  search's start ``R_est``, both priced by the config's step models;
- :func:`held_units` / :func:`capacity_units`: KV block units a sequence holds and a
  replica has (a sparse-attention KV layout's capped counts).

The reasoning and the checks behind them are in the planner's module docstring.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from simcli.serving.plan_inputs import SLO, Candidate
from simcli.serving.schedulers import SchedulerConfig

IDLE_SLACK = 1.02  # idle-bound thresholds relaxed by 2% (mean-context step interpolation)


def held_units(step: Any, tokens: int, block_size: int) -> int:
    """KV block units a sequence of ``tokens`` holds at most on ``step``'s replica: whole
    blocks, or a sparse-attention KV layout's capped count (``step.kv_layout``,
    :class:`costmodels.steps.sparse.KvLayout`: a sliding window frees old blocks)."""
    layout = getattr(step, "kv_layout", None)
    if layout is None:
        return -(-int(tokens) // block_size)
    return int(layout.held_units(tokens, block_size))


def capacity_units(step: Any, kv_capacity_tokens: int, block_size: int) -> int:
    """KV block units of a replica of ``kv_capacity_tokens`` (see :func:`held_units`)."""
    layout = getattr(step, "kv_layout", None)
    if layout is None:
        return int(kv_capacity_tokens) // block_size
    return int(layout.capacity_units(kv_capacity_tokens, block_size))


def idle_attainment(
    c: Candidate, step: Any, pre_step: Any, prompts: np.ndarray, outputs: np.ndarray, slo: SLO
) -> float:
    """Fraction of requests meeting the SLO (2% slack) alone on an idle replica of ``c``
    (per-pool search: the prompt on an idle prefill replica, ``pre_step``, its decode on an
    idle decode one, ``step``)."""
    sm = pre_step if pre_step is not None else step
    none = np.zeros(0, np.int64)
    ttft_of: dict[int, float] = {}
    for p in np.unique(prompts).tolist():
        if c.scheduler == "sarathi":
            t, done = 0.0, 0
            while done < p:
                n = min(c.chunk_size, p - done)  # type: ignore[type-var]
                t += sm.step_s(np.array([n]), np.array([done]), none)
                done += n
        else:
            t = sm.step_s(np.array([p]), np.array([0]), none)
        ttft_of[p] = t
    ttft = np.array([ttft_of[p] for p in prompts.tolist()])
    ctx = prompts + outputs // 2
    sm = step
    dec_of = {x: sm.step_s(none, none, np.array([x])) for x in np.unique(ctx).tolist()}
    tpot = np.array([dec_of[x] for x in ctx.tolist()])
    e2e = ttft + (outputs - 1) * tpot
    lt, lp, le = slo.limits(IDLE_SLACK)
    ok = (ttft <= lt) & (e2e <= le) & ((outputs <= 1) | (tpot <= lp))
    return float(ok.mean())


class ReplicaBounds(NamedTuple):
    r_lb: int  # fewest replicas the work bound allows
    r_est: int  # where the replica search starts (>= r_lb)
    pool_lb: tuple[int, int] = (1, 1)  # disaggregated: fewest (prefill, decode) replicas


def replica_bounds(
    c: Candidate,
    step: Any,
    pre_step: Any,
    sched: SchedulerConfig,
    kv_capacity: int,
    block_size: int,
    arrivals: np.ndarray,
    prompts: np.ndarray,
    outputs: np.ndarray,
    slo: SLO,
    max_replicas: int,
) -> ReplicaBounds:
    """``R_lb`` and ``R_est`` (the planner's module docstring, step 3) of ``c`` for the
    served requests (``arrivals``, ``prompts``, ``outputs``): ``step`` is a (decode)
    replica's step model, ``pre_step`` the prefill pool's, ``kv_capacity`` a (decode)
    replica's KV tokens in blocks of ``block_size``."""
    sm = step
    none = np.zeros(0, np.int64)
    decodes = np.maximum(outputs - 1, 0).astype(float)
    ctx = prompts + decodes / 2.0  # mean context of a request's decode steps
    seats, budget = sched.max_batch_size, sched.max_tokens
    if c.scheduler == "sarathi":
        seats = min(seats, c.chunk_size)  # type: ignore[type-var]
        budget = c.chunk_size  # type: ignore[assignment]
    c_mean = max(2, round(float(ctx.mean())))
    kv_seats = kv_capacity // c_mean
    if getattr(sm, "kv_layout", None) is not None:  # a pattern's KV: by block units
        bs = block_size
        kv_seats = capacity_units(sm, kv_capacity, bs) // held_units(sm, c_mean, bs)
    b = max(1, min(seats, kv_seats))
    # a decode token at context x in a batch of b: fixed share + attention over x keys
    one = sm.step_s(none, none, np.ones(b, np.int64)) / b
    at_mean = sm.step_s(none, none, np.full(b, c_mean)) / b
    per_key = max(at_mean - one, 0.0) / (c_mean - 1)
    dec = decodes * (one + per_key * ctx)
    plen = max(1, min(round(float(prompts.mean())), budget))
    k = max(1, budget // plen)
    pre_sm = pre_step if pre_step is not None else sm  # the prefill pool's
    tok_s = pre_sm.step_s(np.full(k, plen), np.zeros(k, np.int64), none) / (k * plen)
    pre = prompts * tok_s
    t0, t1 = arrivals[0], arrivals[-1]
    n_all = len(prompts)
    n_good = math.ceil(slo.attainment * n_all - 1e-9)
    windows = [t1 - t0 + v for v in (slo.e2e_s, slo.ttft_s) if v is not None]  # E2E first
    slack = min(v for v in (slo.e2e_s, slo.ttft_s, math.inf) if v is not None)
    span = t1 - t0 + (0.0 if math.isinf(slack) else slack)

    def least(x: np.ndarray, m: int) -> float:
        return float(np.sort(x)[:m].sum())

    def up(x: float) -> int:
        return math.ceil(x - 1e-9)

    if c.pd_ratio:  # separate pools: each does its own share of the work
        need_pre = max([least(pre, n_good) / w for w in windows], default=0.0)
        need_dec = least(dec, n_good) / windows[0] if slo.e2e_s is not None else 0.0
        pool_lb = (max(1, up(need_pre)), max(1, up(need_dec)))
        r_lb = fewest_split(c, up(need_pre), up(need_dec), 2, max_replicas)
        est = fewest_split(c, up(pre.sum() / span), up(dec.sum() / span), r_lb, max_replicas)
        return ReplicaBounds(r_lb, est, pool_lb)
    if c.scheduler == "vllm":  # prefill-only and decode-only iterations
        full = pre + dec

        def work(m: int) -> float:
            return least(full, m)
    else:  # mixed iterations: decode seats and the per-token floor both bind
        toks = (prompts + decodes) * tok_s

        def work(m: int) -> float:
            return max(least(dec, m), least(toks, m))

    need = 0.0
    if slo.e2e_s is not None:
        need = work(n_good) / windows[0]
    if slo.ttft_s is not None:
        need = max(need, least(pre, n_good) / windows[-1])
    r_lb = max(1, up(need))
    r_est = up(work(n_all) / span) if span > 0 else r_lb
    return ReplicaBounds(r_lb, max(r_lb, r_est))


def fewest_split(c: Candidate, pre: int, dec: int, start: int, max_replicas: int) -> int:
    """Fewest replicas >= ``start`` whose P:D split has >= ``pre`` prefill and >= ``dec``
    decode replicas (``max_replicas + 1`` when none within reach)."""
    r = max(start, 2, pre + dec)
    while r <= max_replicas:
        p, d = c.pools(r)  # type: ignore[misc]
        if p >= pre and d >= dec:
            return r
        r += 1
    return r


__all__ = [
    "IDLE_SLACK",
    "ReplicaBounds",
    "capacity_units",
    "fewest_split",
    "held_units",
    "idle_attainment",
    "replica_bounds",
]
