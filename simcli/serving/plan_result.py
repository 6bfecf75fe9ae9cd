"""Outcomes of the serving capacity planner: a probe (one simulated replica count), a
feasible deployment, and the search's result with its JSON/CSV records."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from costmodels.steps.serving_fidelity import serving_fidelity_fields
from simcli.serving.plan_inputs import SLO, Candidate, Workload


@dataclass
class Probe:
    replicas: int
    passed: bool
    attainment: float  # over all requests; an upper bound when stopped early
    stopped_early: bool
    summary: dict[str, Any] | None  # the simulator's summary of a complete run
    # TTFT, TPOT, E2E at the SLO's percentile (SLO.at_percentile; None when stopped early)
    at_slo: dict[str, float] | None = None
    pools: tuple[int, int] | None = None  # (prefill, decode) replicas when disaggregated


@dataclass
class Deployment:
    candidate: Candidate
    replicas: int
    usd_per_gpu_hour: float
    probe: Probe
    fewer: Probe | None  # replicas - 1, simulated and missing the SLO (None: replicas == 1)
    slo: SLO | None = None  # what the deployment meets (for its margin)
    # per-pool search (Candidate.per_pool): the (prefill, decode) counts found, the decode
    # pool's price (usd_per_gpu_hour is the prefill pool's), and the probes with one
    # prefill / one decode replica fewer (None where the pool has one)
    pools: tuple[int, int] | None = None
    decode_usd_per_gpu_hour: float | None = None
    fewer_prefill: Probe | None = None
    fewer_decode: Probe | None = None

    @property
    def shape(self) -> tuple:
        """What was simulated (:meth:`Candidate.shape`)."""
        return self.candidate.shape(self.replicas, self.pools)

    @property
    def pool_counts(self) -> tuple[int, int] | None:
        """(prefill, decode) replicas, or None when colocated."""
        return self.pools or self.candidate.pools(self.replicas)

    @property
    def gpus(self) -> int:
        return self.replicas * self.candidate.tp

    @property
    def usd_per_hour(self) -> float:
        if self.decode_usd_per_gpu_hour in (None, self.usd_per_gpu_hour):
            return self.gpus * self.usd_per_gpu_hour
        p, d = self.pool_counts  # type: ignore[misc]
        tp = self.candidate.tp
        return tp * (p * self.usd_per_gpu_hour + d * self.decode_usd_per_gpu_hour)

    @property
    def mean_usd_per_gpu_hour(self) -> float:
        """US$ per GPU-hour over the deployment's GPUs (the pools' GPU-weighted mean)."""
        if self.decode_usd_per_gpu_hour in (None, self.usd_per_gpu_hour):
            return self.usd_per_gpu_hour
        return self.usd_per_hour / self.gpus

    @property
    def usd_per_million_output_tokens(self) -> float:
        s = self.probe.summary or {}
        tokens = s.get("output_tokens") or 0
        return (
            self.usd_per_hour * s.get("duration_s", 0.0) / 3600.0 / tokens * 1e6
            if tokens
            else math.inf
        )

    @property
    def slo_margin(self) -> float:
        """The smallest headroom ``1 - value / limit`` over the given limits, each value at
        the SLO's percentile (0: one sits on its limit; NaN without the statistics)."""
        return slo_margin(self.slo, self.probe.at_slo)

    def sort_key(self) -> tuple:
        """Cost ($/hour), then the larger SLO margin, then $ per million output tokens,
        then p99 E2E, then the config (deterministic)."""
        s = self.probe.summary or {}
        c = self.candidate
        margin = self.slo_margin
        return (
            round(self.usd_per_hour, 9),
            -round(margin, 9) if math.isfinite(margin) else math.inf,
            round(self.usd_per_million_output_tokens, 9),
            s.get("e2e_s_p99", math.inf),
            c.gpu,
            c.tp,
            c.scheduler,
            c.chunk_size or 0,
            c.pd_ratio or "",
            c.decode_gpu or "",
            self.pool_counts or (),
        )

    def record(self, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        """The deployment as a row; ``settings``: the search's engine and precision
        (:data:`SETTING_COLUMNS`), the same for every deployment."""
        s = self.probe.summary or {}
        c = self.candidate
        pools = self.pool_counts
        return {
            "gpu": c.gpu,
            "tp": c.tp,
            "replicas": self.replicas,
            "scheduler": c.scheduler,
            "chunk_size": c.chunk_size,
            "pd_ratio": c.pd_ratio,
            "prefill_replicas": pools[0] if pools else None,
            "decode_replicas": pools[1] if pools else None,
            "gpus": self.gpus,
            "usd_per_gpu_hour": self.mean_usd_per_gpu_hour,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_million_output_tokens": self.usd_per_million_output_tokens,
            "slo_attainment": self.probe.attainment,
            **slo_columns(self.slo, self.probe),
            **{k: (settings or {}).get(k) for k in SETTING_COLUMNS},
            **{
                k: s.get(k)
                for k in (
                    "ttft_s_p50",
                    "ttft_s_p99",
                    "tpot_s_p50",
                    "tpot_s_p99",
                    "e2e_s_p50",
                    "e2e_s_p99",
                    "throughput_tokens_per_s",
                    "preemptions",
                    "kv_capacity_tokens_per_replica",
                )
            },
            # attainment with one replica fewer (an upper bound when that run stopped early)
            "attainment_one_fewer": self.fewer.attainment if self.fewer else None,
            **pool_columns(c, pools, self.usd_per_gpu_hour, self.decode_usd_per_gpu_hour),
            "attainment_one_fewer_prefill": self.fewer_prefill.attainment
            if self.fewer_prefill
            else None,
            "attainment_one_fewer_decode": self.fewer_decode.attainment
            if self.fewer_decode
            else None,
        }


def pool_columns(
    c: Candidate,
    pools: tuple[int, int] | None,
    usd_per_gpu_hour: float,
    decode_usd_per_gpu_hour: float | None,
) -> dict[str, Any]:
    """Each pool's GPU type, TP, GPUs and price (None when colocated): the flags of
    ``simcli serve --disaggregate --prefill-gpu --decode-gpu --prefill-replicas
    --decode-replicas``."""
    if pools is None:
        keys = ("gpu", "tp", "gpus", "usd_per_gpu_hour")
        return {f"{p}_{k}": None for p in ("prefill", "decode") for k in keys}
    dec_price = usd_per_gpu_hour if decode_usd_per_gpu_hour is None else decode_usd_per_gpu_hour
    return {
        "prefill_gpu": c.gpu,
        "prefill_tp": c.tp,
        "prefill_gpus": pools[0] * c.tp,
        "prefill_usd_per_gpu_hour": usd_per_gpu_hour,
        "decode_gpu": c.decode_gpu_or_gpu,
        "decode_tp": c.tp,
        "decode_gpus": pools[1] * c.tp,
        "decode_usd_per_gpu_hour": dec_price,
    }


def slo_margin(slo: SLO | None, at_slo: dict[str, float] | None) -> float:
    """``min(1 - value / limit)`` over the SLO's limits, values at its percentile."""
    if slo is None or not at_slo:
        return math.nan
    return min(1.0 - at_slo[k] / limit for k, limit in slo.judged().items())


def slo_columns(slo: SLO | None, probe: Probe) -> dict[str, Any]:
    """The columns that say what the SLO was judged on: its percentile (``p90`` for
    attainment 0.9), TTFT/TPOT/E2E at that percentile and the margin."""
    at = probe.at_slo or {}
    return {
        "slo_percentile": slo.percentile if slo is not None else None,
        **{f"{k}_at_slo_percentile": at.get(k) for k in ("ttft_s", "tpot_s", "e2e_s")},
        "slo_margin": slo_margin(slo, probe.at_slo) if probe.at_slo else None,
    }


# The search's deployment settings repeated on every row of ``records`` and ``evaluated`` (a
# row is then the flags of a `simcli serve` run).
SETTING_COLUMNS = ("engine", "weight_dtype", "kv_cache_dtype")

# Simulator metrics of a probe that ``PlanResult.evaluated`` reports (None when stopped early).
PROBE_METRICS = (
    "ttft_s_p50",
    "ttft_s_p99",
    "tpot_s_p50",
    "tpot_s_p99",
    "e2e_s_p50",
    "e2e_s_p99",
    "throughput_tokens_per_s",
    "goodput_requests_per_s",
    "preemptions",
    "kv_capacity_tokens_per_replica",
)

# ``status`` of a row of ``PlanResult.evaluated``: a simulated deployment is ``ranked`` (one
# of the returned ones), ``meets_slo``, ``misses_slo`` or ``stopped_early`` (missed: the run
# stopped once too many requests had missed); a config never simulated is ``skipped``
# (model or request does not fit), ``infeasible`` (idle or work bound) or ``pruned`` (its
# cost bound above the top deployments).
EVALUATED_STATUS = (
    "ranked",
    "meets_slo",
    "misses_slo",
    "stopped_early",
    "skipped",
    "infeasible",
    "pruned",
)


@dataclass
class PlanResult:
    model: str
    slo: SLO
    workload: Workload
    deployments: list[Deployment]
    configs_evaluated: int = 0
    # configs_evaluated = feasible + pruned + skipped + infeasible; simulated overlaps them
    configs_feasible: int = 0  # a replica count met the SLO (the top ones are reported)
    configs_pruned: int = 0  # cost bound above the top-k, or search cut at the cost cap
    configs_skipped: int = 0  # model or request does not fit
    configs_infeasible: int = 0  # SLO not met at any replica count up to --max-replicas
    configs_simulated: int = 0  # at least one simulation run
    simulations_run: int = 0
    simulations_stopped_early: int = 0
    search_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    best_infeasible: tuple[float, str, bool] | None = None  # attainment, where, upper bound
    fewest_over_cap: tuple[int, str] | None = None  # smallest R_lb above --max-replicas
    # every candidate searched: (candidate, outcome, note, its probes by replicas); see evaluated()
    searched: list[tuple[Candidate, str, str, dict[int, Probe]]] = field(default_factory=list)
    prices: dict[str, float] = field(default_factory=dict)  # gpu -> US$ per GPU-hour
    cost_model_labels: dict[str, str] = field(default_factory=dict)  # gpu -> StepModel.label
    # gpu -> op_model_provenance / op_model_expected_error_pct of its step model
    op_provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    # engine, precision, memory fraction, max model length and what it refused or cut
    settings: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "qps": self.workload.qps,
            "prompt_len": self.workload.prompt_len,
            "output_len": self.workload.output_len,
            "num_requests": self.workload.num_requests,
            "seed": self.workload.seed,
            # closed loop only (an open-loop plan's output is unchanged)
            **(
                {"max_concurrency": self.workload.max_concurrency}
                if self.workload.max_concurrency is not None
                else {}
            ),
            # a vision-language model's images only (a text plan's output is unchanged)
            **(
                {"images_per_request": w.images_per_request, "image_size": w.image_size}
                if (w := self.workload).images_per_request
                else {}
            ),
            "slo": self.slo.model_dump(),
            "slo_percentile": self.slo.percentile,
            **self.settings,
            "configs_evaluated": self.configs_evaluated,
            "configs_feasible": self.configs_feasible,
            "configs_pruned": self.configs_pruned,
            "configs_skipped": self.configs_skipped,
            "configs_infeasible": self.configs_infeasible,
            "configs_simulated": self.configs_simulated,
            "simulations_run": self.simulations_run,
            "simulations_stopped_early": self.simulations_stopped_early,
            "search_seconds": self.search_seconds,
            "notes": list(self.notes),
        }

    def records(self) -> list[dict[str, Any]]:
        """The ranked deployments, each with how far its answer is expected to be from the
        real engine (its GPU's op models and the engine's published-results validation;
        a per-pool deployment: the decode pool's op models, the larger error)."""
        out = []
        engine = str(self.settings.get("engine") or "vllm")
        for i, d in enumerate(self.deployments):
            c = d.candidate
            provs = [self.op_provenance.get(g, {}) for g in (c.gpu, c.decode_gpu_or_gpu)]
            prov = max(provs, key=lambda p: p.get("op_model_expected_error_pct") or 0.0)
            fields = {
                "op_model_provenance": prov.get("op_model_provenance"),
                "op_model_expected_error_pct": prov.get("op_model_expected_error_pct"),
            }
            fields |= serving_fidelity_fields(
                engine, fields["op_model_expected_error_pct"], fields["op_model_provenance"]
            )
            out.append({"rank": i + 1, **d.record(self.settings), **fields})
        return out

    def evaluated(self) -> list[dict[str, Any]]:
        """Every deployment the search looked at: one row per (config, replica count)
        simulated, and one row (``replicas`` None) per config left without a simulation.
        ``status`` is one of :data:`EVALUATED_STATUS`; ``rank`` is set for the returned
        deployments."""
        ranks = {(d.candidate, d.replicas, d.pools): i + 1 for i, d in enumerate(self.deployments)}
        prices = {d.candidate.gpu: d.usd_per_gpu_hour for d in self.deployments}
        rows: list[dict[str, Any]] = []
        for c, outcome, note, probes in self.searched:
            price = prices.get(c.gpu, self.prices.get(c.gpu, math.nan))
            dec_price = self.prices.get(c.decode_gpu_or_gpu, math.nan) if c.per_pool else None
            base = {
                "config": c.label,
                "gpu": c.gpu,
                "tp": c.tp,
                "scheduler": c.scheduler,
                "chunk_size": c.chunk_size,
                "pd_ratio": c.pd_ratio,
                **{k: self.settings.get(k) for k in SETTING_COLUMNS},
                "usd_per_gpu_hour": price,
            }
            if not probes:
                rows.append({"rank": None, **base, "replicas": None, "status": outcome,
                             "note": note})  # fmt: skip
                continue
            ordered = sorted(probes.values(), key=lambda p: (p.replicas, p.pools or ()))
            seen: set[int] = set()
            for pr in ordered:
                if id(pr) in seen:  # a probe once (a ratio's count and its explicit pools)
                    continue
                seen.add(id(pr))
                r = pr.replicas
                pools = pr.pools or c.pools(r)
                explicit = pools if c.per_pool else None
                s = pr.summary or {}
                gpus = r * c.tp
                tokens = s.get("output_tokens") or 0
                usd_h = gpus * price
                if dec_price not in (None, price) and pools is not None:
                    usd_h = c.tp * (pools[0] * price + pools[1] * dec_price)
                rank = ranks.get((c, r, explicit))
                if rank is not None:
                    status = "ranked"
                elif pr.passed:
                    status = "meets_slo"
                else:
                    status = "stopped_early" if pr.stopped_early else "misses_slo"
                rows.append(
                    {
                        "rank": rank,
                        **base,
                        "replicas": r,
                        "prefill_replicas": pools[0] if pools else None,
                        "decode_replicas": pools[1] if pools else None,
                        "gpus": gpus,
                        "usd_per_hour": usd_h,
                        "usd_per_million_output_tokens": usd_h
                        * s["duration_s"]
                        / 3600.0
                        / tokens
                        * 1e6
                        if tokens
                        else None,
                        "meets_slo": pr.passed,
                        "slo_attainment": pr.attainment,
                        **slo_columns(self.slo, pr),
                        "stopped_early": pr.stopped_early,
                        "status": status,
                        **{k: s.get(k) for k in PROBE_METRICS},
                        "note": "",
                        **pool_columns(c, pools, price, dec_price),
                    }
                )
                if dec_price not in (None, price):  # the pools' GPU-weighted mean
                    rows[-1]["usd_per_gpu_hour"] = usd_h / gpus if gpus else math.nan
        return rows


__all__ = [
    "EVALUATED_STATUS",
    "PROBE_METRICS",
    "SETTING_COLUMNS",
    "Deployment",
    "PlanResult",
    "Probe",
]
