"""Capacity planning (``simcli serve plan``): the cheapest deployment that meets latency SLOs.

**Question.** Given a model, a workload (arrival rate, prompt and output length
distributions) and SLOs, which deployment -- GPU type, tensor parallelism, replica count,
scheduler, chunk size, and colocated or disaggregated prefill/decode pools -- serves it for
the fewest dollars per hour? Answered by search, every candidate judged by the
discrete-event simulator (:mod:`simcli.serving.simulator`).

**SLO.** A request *meets* the SLO when its TTFT <= ``ttft_s``, its TPOT <= ``tpot_s``
(requests with one output token have no TPOT) and its end-to-end latency <= ``e2e_s``
(unset ones always hold). A deployment meets the SLO when at least ``attainment`` of the
workload's requests do (DistServe's "SLO attainment", Zhong et al. OSDI 2024): 0.99 makes
the thresholds p99 targets, 0.9 p90 targets of the joint condition.

**Search.** A *config* is (gpu, tp, scheduler, chunk size -- only for ``sarathi`` --,
P:D ratio). A ratio makes the deployment disaggregated (:mod:`simcli.serving.disagg`):
its ``R`` replicas split into ``round(R x P / (P + D))`` prefill replicas (kept within
``[1, R - 1]``) and the rest decode, exactly as ``simcli serve --disaggregate --pd-ratio
P:D --replicas R`` splits them; both pools use the config's GPU, TP and scheduler, KV
moves over ``simcli serve``'s default link (``intra`` when every GPU of both pools fits in
one node, else ``inter``; no layer overlap). For each config the replica
count is the free variable: the fewest replicas that meet the SLO at the target QPS.
Attainment rises with replicas (more replicas, shorter queues; not strictly monotone
because routing and batching change, hence "monotone-ish"), so:

1. *Fit.* The step model is built for (model, gpu, tp); a model that does not fit (its
   one-line ``StepError``: weights, or no room for a KV block) skips the config with a
   note. A request longer than a replica's KV cache skips it the same way. Step models
   and the simulator's ``ServeConfig`` of every probe come from a
   :class:`DeploymentBuilder`: :mod:`simcli.scenario.serving` builds them through the
   same code as ``simcli serve`` (hardware, prices, KV swap rate, step model).
2. *Idle bound* (this and the work bound: :mod:`simcli.serving.plan_bounds`). Every
   request is priced alone on an idle replica (prefill, or its Sarathi chunks, then decode
   steps at its mean context): queueing and batching only make requests slower (and a KV
   transfer between pools adds time), so the fraction meeting the SLO there bounds the
   attainment of any replica count. Below the target (with 2% slack on the thresholds for
   the interpolation of a per-request mean), the config is infeasible without simulating.
3. *Work bound* ``R_lb`` on replicas. Each replica runs one iteration at a time, so in
   the window from the first arrival to the last arrival plus the latency limit it is
   busy at most that long, and every request meeting an E2E limit has all its work done
   inside it (one meeting a TTFT limit, its prefill). So ``R_lb`` = the busy seconds of
   the cheapest ``ceil(attainment x N)`` requests / the window (TTFT and E2E each give
   one; the larger holds). A request's busy seconds, from the step model:

   - a decode token runs in an iteration of at most ``B`` decodes (``B`` = the seats,
     ``max_batch_size``, Sarathi also ``<= chunk``, and what the KV cache holds at the
     mean context) and costs at least its share of a ``B``-decode step at its context
     (fixed share + attention per cached key, linear in the context);
   - a prompt token costs at least the per-token time of a full iteration of prefills
     of the mean prompt length (``max_tokens``, Sarathi ``chunk`` tokens);
   - ``vllm`` runs prefill-only and decode-only iterations, so the two add; ``orca`` and
     ``sarathi`` mix them, so busy time >= the larger of the decode seconds and every
     token (prompt and output) at the full-iteration rate;
   - disaggregated pools bound separately: the fewest ``R >= 2`` whose split has enough
     prefill replicas for the prefill seconds and decode replicas for the decode seconds.

   Approximate only through the step-time decomposition (a batch at the mean context
   stands for mixed contexts): in checks over 224 (config, workload) pairs (vllm, orca,
   sarathi; colocated, 1:1 and 1:2; TTFT-, TPOT-, E2E-bound and mixed SLOs) ``R_lb`` never
   exceeded the simulated minimum. A TPOT-only SLO gives no bound (queueing never breaks
   it), so ``R_lb = 1``. The search starts at ``R_est``: all requests' busy seconds over
   the arrival span plus the tightest latency limit (the steady-state replica count when
   runs are long; never below ``R_lb``).
4. *Cost pruning* (best first, like A*): configs wait in a heap keyed by a lower bound on
   their $/hour, first ``tp x price`` x the least replica count (1, or 2 disaggregated;
   no step model needed), then
   ``R_lb x tp x price`` once the step model is built. A config whose bound exceeds the
   $/hour of the ``top``-th deployment found so far is pruned, and a replica search never
   probes counts that cost more than that.
5. *Replica search.* Probe ``R_est``; grow by 1.5x until a count meets the SLO (at most
   ``max_replicas`` or the cost cap); bisect between the last failure (or ``R_lb - 1``)
   and the first success. If ``R - 1`` of the result was never simulated (the search
   leaned on ``R_lb``), it is probed, and the bisection restarts below if it passes, so
   every reported count ``R`` has ``R - 1`` simulated and failing (or ``R`` is the least
   the config allows: 1, or 2 when disaggregated). Probes are cached per simulated shape
   (two ratios that split ``R`` alike share one).
6. *Effort cap.* Every probe simulates the same ``num_requests`` requests (same seed,
   same arrivals); the simulator's per-request sink counts violations and stops the run
   as soon as more requests have missed the SLO than the attainment allows: a failing
   probe of an overloaded deployment costs a fraction of a full run.

**Ranking.** Feasible deployments by $/hour (GPUs x price), then by their SLO margin (the
smallest headroom ``1 - value / limit`` over the given limits, each value taken at the
SLO's percentile: the ``ceil(attainment x N)``-th smallest of the N requests', so p90 for
the default attainment 0.9), then by $ per million output tokens over the simulated run
(the simulator's ``cost_usd_per_million_output_tokens``: GPU-hours from first arrival to
last completion; lower when the run drains sooner), then by p99 end-to-end latency.
Deterministic for a seed: the search order, the requests and the simulator are.

**Per-pool search** (``--prefill-gpu-types/--decode-gpu-types``; Splitwise's pools of two
GPU types): each disaggregated ratio runs over the prefill x decode GPU cross product,
bounds use each pool's step model and price, and :meth:`Planner.trim_pools` then
minimises each pool's count (docs/disaggregation.md).

**Simplifications.** One replica shape per pool (both pools of a disaggregated
deployment share the TP and scheduler; without the per-pool search they share the GPU
too and their split is searched only through the given P:D ratios); the scheduler's other knobs
are ``simcli serve``'s defaults (``max_batch_size`` 256, vLLM's ``max_tokens``, block size
16, ``gpu_memory_utilization`` 0.9, prefix caching, least-outstanding routing, recompute
preemption, the vllm engine, no calibration profile), so ``simcli serve`` with the
reported flags and the same workload reproduces a deployment's figures exactly; no
pipeline parallelism; all requests count towards attainment (no warm-up trimming);
minimality is checked against ``R - 1`` only. A closed-loop workload (``--max-concurrency``,
:mod:`simcli.serving.load`) keeps the idle bound (latency counts from the send) but not the
work bound (sends come later than the arrival times), and runs on the event loop.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from costmodels.ops.select import provenance_fields
from costmodels.steps.engines import load_engine
from simcli.serving.batch import StepModelLike
from simcli.serving.plan_bounds import capacity_units, held_units, idle_attainment, replica_bounds
from simcli.serving.plan_inputs import (
    DEFAULT_GPUS,
    SLO,
    Candidate,
    PlanError,
    PlanSpace,
    Workload,
)
from simcli.serving.plan_result import (
    EVALUATED_STATUS,
    PROBE_METRICS,
    Deployment,
    PlanResult,
    Probe,
)
from simcli.serving.requests import (
    Request,
    RequestStream,
    outputs_within_model_len,
    synthetic_requests,
)
from simcli.serving.schedulers import SchedulerConfig, classic_scheduler
from simcli.serving.simulator import ServeConfig, Simulator
from workloads.models import ModelConfig


class _Missed(Exception):
    """Raised from the simulator's sink: the probe can no longer meet the attainment."""


class _Judge:
    """Per-request SLO check as requests finish (the simulator's ``sink``); keeps each
    request's TTFT, TPOT (0 for a one-token output: it meets any TPOT limit) and E2E for
    the statistics the limits are judged on (:meth:`at_slo`)."""

    __slots__ = ("ttft", "tpot", "e2e", "budget", "good", "bad", "slo", "seen")

    def __init__(self, slo: SLO, n: int) -> None:
        self.slo = slo
        self.ttft, self.tpot, self.e2e = slo.limits()
        self.budget = slo.max_misses(n)
        self.good = self.bad = 0
        self.seen: tuple[list[float], list[float], list[float]] = ([], [], [])

    def __call__(self, req: Request) -> None:
        first, fin, out = req.first_token_s, req.finish_s, req.output_tokens
        ttft = first - req.arrival_s  # type: ignore[operator]
        e2e = fin - req.arrival_s  # type: ignore[operator]
        tpot = (fin - first) / (out - 1) if out > 1 else 0.0  # type: ignore[operator]
        self.seen[0].append(ttft)
        self.seen[1].append(tpot)
        self.seen[2].append(e2e)
        if ttft <= self.ttft and e2e <= self.e2e and tpot <= self.tpot:
            self.good += 1
        else:
            self.bad += 1
            if self.bad > self.budget:
                raise _Missed

    def at_slo(self) -> dict[str, float]:
        """TTFT, TPOT and E2E at the SLO's percentile over every request (nearest rank)."""
        names = ("ttft_s", "tpot_s", "e2e_s")
        return {k: self.slo.at_percentile(v) for k, v in zip(names, self.seen, strict=True)}


class DeploymentBuilder(Protocol):
    """What the search needs priced for a candidate (implemented by
    :class:`simcli.scenario.serving.CandidateDeployments`, through ``simcli serve``'s
    code): its GPU's price, its step model (a one-line ``ValueError`` when the model does
    not fit) and the simulator's config at a replica count."""

    def usd_per_gpu_hour(self, gpu: str) -> float: ...

    def step_model(self, candidate: Candidate) -> StepModelLike: ...

    def prefill_step_model(self, candidate: Candidate) -> StepModelLike: ...

    def serve_config(
        self, candidate: Candidate, replicas: int, pools: tuple[int, int] | None = None
    ) -> ServeConfig: ...


@dataclass
class _State:
    config: Candidate
    step: Any = None  # every replica's (disaggregated: the decode pool's)
    pre_step: Any = None  # per-pool search: the prefill pool's
    sched: SchedulerConfig | None = None
    kv_capacity: int = 0  # a (decode) replica's KV tokens
    block_size: int = 16  # the candidate's KV block (its engine's default unless given)
    r_lb: int = 1
    r_est: int = 1
    pool_lb: tuple[int, int] = (1, 1)  # per-pool search: fewest (prefill, decode) replicas
    probes: dict[int, Probe] = field(default_factory=dict)
    pool_probes: dict[tuple[int, int], Probe] = field(default_factory=dict)  # explicit pools
    outcome: str = ""  # how the search left the config (see EVALUATED_STATUS)
    note: str = ""


class Planner:
    """One search; :meth:`run` returns a :class:`PlanResult`."""

    def __init__(
        self,
        model: ModelConfig,
        space: PlanSpace,
        slo: SLO,
        workload: Workload,
        top: int,
        builder: DeploymentBuilder,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.progress = progress
        if top < 1:
            raise PlanError(f"--top {top} is invalid; allowed: a positive integer")
        self.model = model
        self.space, self.slo, self.workload, self.top = space, slo, workload, top
        self.builder = builder
        self.prices = {g: builder.usd_per_gpu_hour(g) for g in space.all_gpus}
        # every deployment serves at most the model's max_position_embeddings (what `simcli
        # serve` defaults --max-model-len to): longer prompts are refused, outputs cut, once
        # here for all probes and bounds, as the simulator would for each
        limit = self.limit = model.max_seq_len
        chunks = list(synthetic_requests(workload.spec()).chunks())
        arrival = np.concatenate([c.arrival_s for c in chunks])
        prompt = np.concatenate([c.prompt_tokens for c in chunks])
        wanted = np.concatenate([c.output_tokens for c in chunks])
        out = outputs_within_model_len(prompt, wanted, limit)
        served = out > 0
        rejected = int((~served).sum())
        capped = int((served & (out != wanted)).sum())
        arrivals = arrival[served]
        if not arrivals.size:
            raise PlanError(
                f"every one of the {rejected} requests has a prompt longer than {model.id}'s "
                f"max model length {limit}; allowed: shorter prompts (--prompt-len)"
            )
        self.arrivals = arrivals
        self.prompts = prompt[served]
        self.outputs = out[served]
        settings = {
            "engine": space.engine,
            "engine_version_family": load_engine(space.engine).version_family,
            "weight_dtype": space.weight_dtype,
            "kv_cache_dtype": space.kv_cache_dtype,
            "gpu_memory_utilization": space.gpu_memory_utilization,
            "max_model_len": limit,
            "requests_rejected_too_long": rejected,
            "requests_output_capped": capped,
        }
        self.result = PlanResult(
            self.model.id, slo, workload, [], prices=dict(self.prices), settings=settings
        )
        for key in ("attn_pattern", "weight_sparsity", "activation_sparsity"):
            if getattr(space, key) is not None:  # dense output unchanged
                settings[key] = getattr(space, key)
        if rejected or capped:
            self.result.notes.append(
                f"{rejected} of the workload's {rejected + len(arrivals)} requests have a "
                f"prompt longer than the max model length {limit} and are refused (not "
                f"simulated), {capped} outputs cut so prompt + output fits, as vLLM serves them"
            )
        self._done = 0
        self._total = 0
        self._probes: dict[tuple, Probe] = {}  # by deployment shape, across configs

    # --- workload ----------------------------------------------------------------------
    def requests(self) -> RequestStream:
        """The workload's served requests (ids renumbered past the refused ones)."""
        return RequestStream.from_arrays(self.arrivals, self.prompts, self.outputs)

    # --- configs -----------------------------------------------------------------------
    def configs(self) -> list[Candidate]:
        """The space's configs; with a per-pool search every disaggregated ratio runs over
        the cross product of prefill and decode GPU types."""
        sp = self.space
        out = []
        pairs = [(p, d) for p in sp.pool_gpus[0] for d in sp.pool_gpus[1]]
        for tp in sp.tp:
            for s in sp.schedulers:
                for r in sp.pd_ratios:
                    # the engines' own schedulers model colocated serving: disaggregated
                    # pools run the closest classic one (as `simcli serve` does)
                    k = s if r is None else classic_scheduler(s)
                    for c in sp.chunk_sizes if k == "sarathi" else (None,):
                        if r is not None and sp.pool_search:
                            out.extend(Candidate(p, tp, k, c, r, d) for p, d in pairs)
                        else:
                            out.extend(Candidate(g, tp, k, c, r) for g in sp.gpus)
        out = list(dict.fromkeys(out))  # an engine's and a classic scheduler can meet
        if not sp.pool_search:  # the order of earlier releases: by GPU first
            order = {g: i for i, g in enumerate(sp.gpus)}
            out.sort(key=lambda c: order[c.gpu])
        return out

    def usd_per_hour(
        self, c: Candidate, replicas: int, pools: tuple[int, int] | None = None
    ) -> float:
        """$/hour of ``c`` at ``replicas`` (a per-pool candidate: each pool at its GPU's
        price; ``pools`` its explicit counts)."""
        if not c.per_pool:
            return replicas * c.tp * self.prices[c.gpu]
        p, d = pools or c.pools(replicas)  # type: ignore[misc]
        if c.decode_gpu == c.gpu:
            return (p + d) * c.tp * self.prices[c.gpu]
        return c.tp * (p * self.prices[c.gpu] + d * self.prices[c.decode_gpu_or_gpu])

    def _prepare(self, st: _State) -> str | None:
        """Build the step model and the bounds; a note when the config is out."""
        c = st.config
        try:
            st.step = self.builder.step_model(c)
            st.pre_step = self.builder.prefill_step_model(c) if c.per_pool else st.step
            base = self.builder.serve_config(c, c.min_replicas)
            labels = self.result.cost_model_labels
            labels.setdefault(c.decode_gpu_or_gpu, str(getattr(st.step, "label", "")))
            labels.setdefault(c.gpu, str(getattr(st.pre_step, "label", "")))
            provs = self.result.op_provenance
            provs.setdefault(c.decode_gpu_or_gpu, provenance_fields(st.step.cost_model))
            provs.setdefault(c.gpu, provenance_fields(st.pre_step.cost_model))
            st.kv_capacity = int(
                st.step.kv_capacity_tokens(base.block_size, base.gpu_memory_utilization)
            )
            pre_capacity = int(
                st.pre_step.kv_capacity_tokens(base.block_size, base.gpu_memory_utilization)
            )
        except ValueError as exc:  # StepError / ModelError: the model does not fit
            return str(exc).splitlines()[0]
        bs = base.block_size
        layout = getattr(st.step, "kv_layout", None)
        if layout is not None and not any(n.startswith("KV layout") for n in self.result.notes):
            dense = layout.units * -(-self.limit // bs)
            gain = dense / layout.held_units(self.limit, bs) / layout.bytes_factor
            own = self.model.native_attn_pattern
            what = (
                f"--attn-pattern {self.space.attn_pattern}"
                if self.space.attn_pattern is not None
                else f"the model's own attention ({own})" if own else "the model's own layers"
            )
            self.result.notes.append(
                f"KV layout of {what}: {layout.note}; a "
                f"replica seats {gain:.2f}x the sequences of {self.limit} tokens it seats "
                "with dense KV"
            )
        longest = int((self.prompts + self.outputs - 1).max())
        if held_units(st.step, longest, bs) > capacity_units(st.step, st.kv_capacity, bs):
            return f"a request needs {longest} tokens of KV cache, a replica holds {st.kv_capacity}"
        prompt = int(self.prompts.max())
        if c.per_pool and held_units(st.pre_step, prompt, bs) > capacity_units(
            st.pre_step, pre_capacity, bs
        ):
            return (
                f"a prompt needs {prompt} tokens of KV cache, a {c.gpu} prefill replica holds "
                f"{pre_capacity}"
            )
        st.sched = base.scheduler
        st.block_size = base.block_size
        return None

    # --- probes ------------------------------------------------------------------------
    def probe(self, st: _State, replicas: int, pools: tuple[int, int] | None = None) -> Probe:
        """Simulate ``st``'s config at ``replicas`` (split by its ratio), or at explicit
        ``pools`` (prefill, decode) in a per-pool search; cached by simulated shape."""
        c = st.config
        shape = c.shape(replicas, pools)
        mine = st.probes if pools is None else st.pool_probes
        key: Any = replicas if pools is None else pools
        hit = mine.get(key) or self._probes.get(shape)
        if hit is not None:  # two P:D ratios can split a count the same way
            mine[key] = hit
            return hit
        n = len(self.arrivals)
        judge = _Judge(self.slo, n)
        cfg = self.builder.serve_config(c, replicas, pools)
        if c.per_pool:  # each pool its own step model and KV capacity
            sim = Simulator(
                st.step, cfg, prefill_step_model=st.pre_step, decode_step_model=st.step, sink=judge
            )
        else:
            sim = Simulator(st.step, cfg, kv_capacity_tokens=st.kv_capacity, sink=judge)
        self.result.simulations_run += 1
        try:
            # the compiled loop: its start (~0.7 s) is shared by every probe of the search
            summary = sim.run(self.requests(), compiled=True).summary
        except _Missed:
            self.result.simulations_stopped_early += 1
            probe = Probe(replicas, False, (n - judge.bad) / n, True, None)
        else:
            att = judge.good / n
            probe = Probe(
                replicas, judge.bad <= judge.budget, att, False, dict(summary), judge.at_slo()
            )
        probe.pools = pools or c.pools(replicas)
        mine[key] = self._probes[shape] = probe
        return probe

    def trim_pools(self, st: _State, hi: Probe) -> tuple[Probe, Probe | None, Probe | None]:
        """Per-pool search: from the ratio's fewest passing count, take replicas off one pool
        at a time while the SLO still holds -- the pool whose replica costs more first --
        until one replica fewer in either pool (simulated) misses it. Returns (the passing
        probe, the failing probe with one prefill replica fewer, with one decode replica
        fewer; None where that pool has one replica)."""
        c = st.config
        pools = hi.pools or c.pools(hi.replicas)
        assert pools is not None
        dearer_decode = self.prices[c.decode_gpu_or_gpu] > self.prices[c.gpu]
        order = (1, 0) if dearer_decode else (0, 1)
        while True:
            fewer: dict[int, Probe | None] = {0: None, 1: None}
            progressed = False
            for which in order:
                while pools[which] > 1:
                    trial = (pools[0] - 1, pools[1]) if which == 0 else (pools[0], pools[1] - 1)
                    p = self.probe(st, sum(trial), trial)
                    if not p.passed:
                        fewer[which] = p
                        break
                    hi, pools, progressed = p, trial, True
            if not progressed:  # both neighbours of the final counts simulated and failing
                break
        return hi, fewer[0], fewer[1]

    def search_replicas(self, st: _State, cap: int) -> tuple[Probe | None, Probe | None]:
        """(the probe of the fewest replicas meeting the SLO, or None within ``cap``; the
        best failing probe). Every count below ``R_lb`` is taken to fail, but the count
        returned always has ``R - 1`` simulated and failing (or ``R = 1``)."""
        lo = max(st.r_lb, st.config.min_replicas) - 1  # counts <= lo fail
        r = max(st.r_lb, min(st.r_est, cap))
        hi: Probe | None = None
        best_fail: Probe | None = None

        def fails(p: Probe) -> None:
            nonlocal best_fail
            if best_fail is None or p.attainment >= best_fail.attainment:
                best_fail = p

        while hi is None:  # grow geometrically to the first count that passes
            p = self.probe(st, r)
            if p.passed:
                hi = p
                break
            fails(p)
            lo = r
            if r >= cap:
                return None, best_fail
            r = min(cap, max(r + 1, math.ceil(1.5 * r)))
        while True:
            while hi.replicas - lo > 1:  # bisect (lo, hi]
                p = self.probe(st, (hi.replicas + lo) // 2)
                if p.passed:
                    hi = p
                else:
                    fails(p)
                    lo = p.replicas
            below = hi.replicas - 1
            if below < st.config.min_replicas or below in st.probes:
                return hi, best_fail
            p = self.probe(st, below)  # R_lb is approximate: confirm the neighbour
            if not p.passed:
                fails(p)
                return hi, best_fail
            hi, lo = p, st.config.min_replicas - 1

    # --- driver ------------------------------------------------------------------------
    def _kth_cost(self) -> float:
        costs = {d.shape: d.usd_per_hour for d in self.result.deployments}
        if len(costs) < self.top:
            return math.inf
        return sorted(costs.values())[self.top - 1]

    def run(self) -> PlanResult:
        t0 = time.perf_counter()
        res = self.result
        configs = self.configs()
        res.configs_evaluated = len(configs)
        self._total = len(configs)
        states = [_State(c) for c in configs]
        # (lower bound on $/hour, level 0: fewest replicas / 1: R_lb, order, state)
        heap: list[tuple[float, int, int, _State]] = []
        for i, st in enumerate(states):
            c = st.config
            heapq.heappush(heap, (self.usd_per_hour(c, c.min_replicas), 0, i, st))
        pruned: list[str] = []
        skipped: dict[tuple[str, int, str], list[str]] = {}  # (gpu, tp, why) -> configs
        while heap:
            bound, level, i, st = heapq.heappop(heap)
            c = st.config
            price = self.prices[c.gpu]
            if bound > self._kth_cost() + 1e-9:
                pruned.append(c.label)
                self._finish(st, "pruned", "cost bound above the top deployments")
                continue
            if level == 0:
                why = self._prepare(st)
                if why is not None:
                    res.configs_skipped += 1
                    skipped.setdefault((c.gpu, c.tp, why), []).append(c.label)
                    self._finish(st, "skipped", why)
                    continue
                idle = idle_attainment(
                    c, st.step, st.pre_step, self.prompts, self.outputs, self.slo
                )
                if idle < self.slo.attainment:
                    res.configs_infeasible += 1
                    res.notes.append(
                        f"{c.label}: infeasible: only {idle:.1%} of requests meet the SLO even "
                        f"alone on an idle replica (need {self.slo.attainment:.1%})"
                    )
                    self._note_best(idle, f"{c.label} (idle replica)")
                    self._finish(st, "infeasible", f"idle replica: {idle:.1%} meet the SLO")
                    continue
                assert st.sched is not None  # set by _prepare
                st.r_lb, st.r_est, st.pool_lb = replica_bounds(
                    c, st.step, st.pre_step, st.sched, st.kv_capacity, st.block_size,
                    self.arrivals, self.prompts, self.outputs, self.slo, self.space.max_replicas,
                )  # fmt: skip
                if self.workload.max_concurrency is not None:
                    # closed loop: requests are sent later than their arrival times (a
                    # client waits for a slot), so the work bound's window does not hold
                    st.r_lb = c.min_replicas
                    st.r_est = max(st.r_lb, min(st.r_est, self.space.max_replicas))
                    st.pool_lb = (1, 1)
                # per-pool search: each pool at least its own work bound
                lb = self.usd_per_hour(c, st.r_lb, st.pool_lb if c.per_pool else None)
                heapq.heappush(heap, (lb, 1, i, st))
                continue
            if st.r_lb > self.space.max_replicas:
                res.configs_infeasible += 1
                res.notes.append(
                    f"{c.label}: infeasible: the work bound needs {st.r_lb} replicas "
                    f"(--max-replicas {self.space.max_replicas})"
                )
                if res.fewest_over_cap is None or st.r_lb < res.fewest_over_cap[0]:
                    res.fewest_over_cap = (st.r_lb, c.label)
                self._finish(st, "infeasible", f"work bound needs {st.r_lb} replicas")
                continue
            kth = self._kth_cost()
            cap = self.space.max_replicas
            if math.isfinite(kth):
                cheapest = min(price, self.prices[c.decode_gpu_or_gpu])
                cap = min(cap, int(math.floor((kth + 1e-9) / (c.tp * cheapest))))
            if (sum(st.pool_lb) if c.per_pool else st.r_lb) > cap:
                pruned.append(c.label)
                self._finish(st, "pruned", "cost bound above the top deployments")
                continue
            res.configs_simulated += 1
            passed, best_fail = self.search_replicas(st, cap)
            if passed is None:
                assert best_fail is not None
                self._note_best(
                    best_fail.attainment,
                    f"{c.label} x{best_fail.replicas}",
                    upper=best_fail.stopped_early,
                )
                if cap < self.space.max_replicas:
                    pruned.append(c.label)
                    self._finish(st, "pruned", "cost bound above the top deployments")
                else:
                    res.configs_infeasible += 1
                    res.notes.append(
                        f"{c.label}: infeasible: {best_fail.attainment:.1%} of requests meet the "
                        f"SLO with {cap} replicas (--max-replicas)"
                    )
                    self._finish(st, "infeasible", f"SLO missed with {cap} replicas")
                continue
            if c.per_pool:  # fewest replicas pool by pool, each checked one fewer
                passed, f_pre, f_dec = self.trim_pools(st, passed)
                fewers = [f for f in (f_pre, f_dec) if f is not None]
                fewer = max(fewers, key=lambda f: f.attainment) if fewers else None
                res.deployments.append(
                    Deployment(
                        c,
                        passed.replicas,
                        price,
                        passed,
                        fewer,
                        self.slo,
                        pools=passed.pools,
                        decode_usd_per_gpu_hour=self.prices[c.decode_gpu_or_gpu],
                        fewer_prefill=f_pre,
                        fewer_decode=f_dec,
                    )  # fmt: skip
                )
            else:
                fewer = st.probes.get(passed.replicas - 1)
                res.deployments.append(
                    Deployment(c, passed.replicas, price, passed, fewer, self.slo)
                )
            self._finish(st, "feasible")
        for (gpu, tp, why), labels in skipped.items():
            n = len(labels)
            res.notes.insert(0, f"{gpu} tp={tp}: skipped ({n} config{'s' * (n > 1)}): {why}")
        res.configs_pruned = len(pruned)
        if pruned:
            more = f" and {len(pruned) - 8} more" if len(pruned) > 8 else ""
            res.notes.append(
                f"{len(pruned)} configs pruned, their cost bound above the top {self.top}: "
                f"{', '.join(pruned[:8])}{more}"
            )
        res.configs_feasible = len(res.deployments)
        res.deployments.sort(key=Deployment.sort_key)
        seen: set[tuple] = set()
        unique = []
        for d in res.deployments:  # one entry per simulated shape (P:D ratios can coincide)
            shape = d.shape
            if shape not in seen:
                seen.add(shape)
                unique.append(d)
        res.deployments = unique[: self.top]
        res.searched = [
            (st.config, st.outcome, st.note, {**st.probes, **st.pool_probes}) for st in states
        ]
        res.search_seconds = time.perf_counter() - t0
        return res

    def _finish(self, st: _State, outcome: str, note: str = "") -> None:
        """The search is done with ``st``'s config: record how, report progress."""
        st.outcome, st.note = outcome, note
        self._done += 1
        if self.progress is not None:
            self.progress(self._done, self._total)

    def _note_best(self, attainment: float, where: str, upper: bool = False) -> None:
        best = self.result.best_infeasible
        if best is None or attainment > best[0]:
            self.result.best_infeasible = (attainment, where, upper)


def search_deployments(
    model: ModelConfig,
    workload: Workload,
    slo: SLO,
    space: PlanSpace,
    builder: DeploymentBuilder,
    *,
    top: int = 5,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Search ``space`` for the cheapest deployments meeting ``slo`` under ``workload``,
    every candidate priced by ``builder``. ``progress(done, total)`` is called as each
    config is settled (total: the configs). (``simcli.scenario.serving.plan_deployments``
    is this search with ``simcli serve``'s builder.)

    Raises :class:`PlanError` (one line) when no deployment meets the SLO."""
    planner = Planner(model, space, slo, workload, top, builder, progress)
    result = planner.run()
    if not result.deployments:
        if result.configs_skipped == result.configs_evaluated:
            raise PlanError(f"{result.model} fits none of the configs searched: {result.notes[0]}")
        best, over = result.best_infeasible, result.fewest_over_cap
        if best is not None:
            at_most = "at most " if best[2] else ""
            why = f"; best: {at_most}{best[0]:.1%} of requests, on {best[1]}"
        elif over is not None:
            why = f"; the work bound needs {over[0]} replicas of {over[1]}"
        else:
            why = ""
        raise PlanError(
            f"no deployment meets the SLO ({slo.text()}) at {workload.qps:g} qps within "
            f"{planner.space.max_replicas} replicas{why}; allowed: looser SLOs, a lower "
            "--attainment, more --max-replicas, other --gpus-types/--tp"
        )
    return result


__all__ = [
    "DEFAULT_GPUS",
    "EVALUATED_STATUS",
    "PROBE_METRICS",
    "SLO",
    "Candidate",
    "Deployment",
    "DeploymentBuilder",
    "PlanError",
    "PlanResult",
    "PlanSpace",
    "Planner",
    "Probe",
    "Workload",
    "search_deployments",
]
