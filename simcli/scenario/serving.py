"""Serving scenarios: ``simcli serve`` and ``simcli serve plan`` resolved once into frozen
objects that the simulator and the planner consume (``simcli step`` and the step models:
:mod:`simcli.scenario.step`, re-exported here).

The options (:mod:`simcli.scenario.serving_options`) are resolved here and nowhere else:
the model and draft models, the hardware (:func:`~simcli.scenario.hardware.resolve_hardware`:
GPU, count, op cost model, price), the step models priced with that hardware's cost model,
the simulator's :class:`~simcli.serving.simulator.ServeConfig` (scheduler, memory budget
``gpu_memory_utilization`` x GPU memory in ``block_size`` blocks, KV swap rate of the GPU's
PCIe link, price, SLOs, optional features) and the requests. ``serve plan`` builds every
candidate deployment through the same functions (:class:`CandidateDeployments`: each
candidate at a replica count is a :class:`ServeOptions`), so ``simcli serve`` with a
reported deployment's flags prices exactly what the planner simulated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from costmodels.ops.select import provenance_fields
from costmodels.steps.engines import load_engine
from costmodels.steps.serving_fidelity import serving_fidelity_fields
from hardware_specs.prices import gpu_price
from hardware_specs.registry import load_catalog
from simcli.scenario.hardware import Hardware, resolve_hardware
from simcli.scenario.image_options import image_fields, image_load, image_tokens
from simcli.scenario.serving_options import ServeOptions, ServePlanOptions
from simcli.scenario.serving_pools import (
    check_pool_gpus,
    mean_price,
    pool_fields,
    with_pool_prices,
)
from simcli.scenario.serving_precision import activation_dtype, check_precision
from simcli.scenario.sparsity_options import sparsity_fields
from simcli.scenario.step import (  # simcli step and the step models; re-exported
    StepOptions,
    StepScenario,
    build_step_model,
    engine_fields,
    model_len_limit,
    resolve_composition,
    resolve_step,
    run_step,
    weight_gib_per_gpu,
)
from simcli.serving.disagg import DisaggConfig
from simcli.serving.frontend import FrontendConfig
from simcli.serving.metrics import EnergyMeter, Metrics
from simcli.serving.plan_inputs import SLO, Candidate, PlanSpace, Workload
from simcli.serving.plan_result import PlanResult
from simcli.serving.planner import search_deployments
from simcli.serving.priority import PriorityMix, parse_priority_mix, with_priorities
from simcli.serving.requests import (
    Request,
    SyntheticSpec,
    synthetic_requests,
    trace_requests,
)
from simcli.serving.schedulers import SchedulerConfig
from simcli.serving.simulator import ServeConfig, ServeResult, Simulator
from simcli.serving.spec import RetrievalDraft, StreamingDraft
from simcli.serving.timeline import StepRecorder
from simcli.serving.traces import TraceSource, trace_source
from workloads.decompose.quant import kv_storage_dtype
from workloads.lengths import joint_dataset, parse_dist
from workloads.models import ModelConfig, load_model, with_moe_imbalance

# --------------------------------------------------------------------------- deployments


@dataclass(frozen=True)
class ServeDeployment:
    """One serving deployment resolved: its hardware, step models and the simulator's
    config. ``step`` serves every replica (the decode pool when disaggregated);
    ``prefill_step`` the prefill pool (``step`` unless its TP differs); ``draft_steps`` the
    speculative draft and, for a hierarchy, the tiny model."""

    hardware: Hardware  # GPU x tp*pp of ``step``
    prefill_hardware: Hardware
    config: ServeConfig
    step: Any
    prefill_step: Any
    draft_steps: tuple[Any, ...] = ()

    def kv_capacity_tokens(self) -> int:
        """KV tokens a replica holds: the memory budget after weights and workspace."""
        c = self.config
        return int(self.step.kv_capacity_tokens(c.block_size, c.gpu_memory_utilization))

    def simulator(self, *, energy: bool = False, **kw: Any) -> Simulator:
        """A simulator of this deployment (``kw``: :class:`Simulator`'s keyword arguments;
        ``energy``: price energy with the step model's power model, when it has one)."""
        disaggregated = self.config.disaggregation is not None
        drafts = self.draft_steps
        return Simulator(
            self.step,
            self.config,
            energy=EnergyMeter.for_step_model(self.step) if energy else None,
            prefill_step_model=self.prefill_step if disaggregated else None,
            decode_step_model=self.step if disaggregated else None,
            draft_step_model=drafts[0] if drafts else None,
            tiny_step_model=drafts[1] if len(drafts) > 1 else None,
            **kw,
        )


def serve_hardware(options: ServeOptions, tp: int, gpu: str | None = None) -> Hardware:
    """``gpu`` (default ``--gpu``; a pool's ``--prefill-gpu``/``--decode-gpu``) x ``tp *
    --pp`` with ``--profile`` and ``--price-per-gpu-hour``."""
    return resolve_hardware(
        gpu or options.gpu,  # type: ignore[arg-type]
        tp * options.pp,
        profile=options.profile,
        hardware_file=options.hardware,
        price_usd_per_gpu_hour=options.price_per_gpu_hour,
    )


def default_kv_transfer(options: ServeOptions, gpus_per_node: int) -> str:
    """``--kv-transfer`` when not given: ``intra`` (NVLink) when every GPU of both pools
    fits in one node, so no transfer leaves it; else ``inter`` (the NICs)."""
    o = options
    pools = o.pools()
    if pools is None or o.heterogeneous:  # two GPU types: two kinds of node
        return "inter"
    gpus = (pools[0] * o.prefill_tp_or_tp + pools[1] * o.decode_tp_or_tp) * o.pp
    return "intra" if gpus <= gpus_per_node else "inter"


def default_max_tokens(scheduler: str, model_len: int, hardware: Hardware) -> int:
    """``max_num_batched_tokens`` when ``--max-tokens`` is not given: vLLM V0's
    ``max(max_model_len, 2048)`` for the V0-style schedulers; vLLM V1's API-server
    default for ``vllm-v1``/``priority`` (``EngineArgs.get_batch_defaults``: 8192 on GPUs
    of 70 GiB or more other than A100, else 2048); TensorRT-LLM's ``max_num_tokens`` 8192
    (``BuildConfig``/LLM API default)."""
    if scheduler in ("vllm-v1", "priority"):
        gpu = hardware.gpu
        big = gpu.memory_gib >= 70 and "a100" not in gpu.id.lower()
        return 8192 if big else 2048
    if scheduler == "trtllm":
        return 8192
    return max(model_len, 2048)  # vLLM V0's default


def serve_config(
    options: ServeOptions,
    model: ModelConfig,
    hardware: Hardware,
    prefill_hardware: Hardware | None = None,
) -> ServeConfig:
    """The simulator's config of a deployment: scheduler, memory budget, routing, the
    optional features, and from ``hardware`` the KV swap rate and the price (disaggregated:
    ``hardware`` the decode pool's, ``prefill_hardware`` the prefill pool's, each pool
    priced by its own GPU; the run's price per GPU-hour is their GPU-weighted mean, so that
    GPU-hours x price is the sum of the pools' costs)."""
    o = options
    pools = o.pools()
    price = hardware.usd_per_gpu_hour
    branching = o.branching()
    if branching is not None and o.trace is None:  # extra branches draw the workload's DIST
        branching = branching.model_copy(update={"output_len": parse_dist(o.output_len, "output")})
    disaggregation = None
    if pools is not None:
        disaggregation = DisaggConfig(
            prefill_replicas=pools[0],
            decode_replicas=pools[1],
            prefill_gpus_per_replica=o.prefill_tp_or_tp * o.pp,
            decode_gpus_per_replica=o.decode_tp_or_tp * o.pp,
            kv_transfer=o.kv_transfer or default_kv_transfer(o, hardware.gpus_per_node),
            kv_transfer_overlap=o.kv_transfer_overlap,
            decode_router=o.decode_router or "kv_aware",
            **pool_fields(o, price, (prefill_hardware or hardware).usd_per_gpu_hour),
        )
        price = mean_price(disaggregation)
    limit = model_len_limit(model, o.max_model_len)
    # the engine's own token budget on this GPU when it runs its own scheduler
    gpu = hardware.gpu
    profile = load_engine(o.engine)
    eng = profile.defaults_for(gpu.id, gpu.memory_gib, o.tp)
    fe = profile.frontend  # the API server (parts with no figure count 0)
    frontend = FrontendConfig(
        request_s=fe.per_request_s or 0.0,
        per_prompt_token_s=fe.per_prompt_token_s or 0.0,
        per_output_token_s=fe.per_output_token_s or 0.0,
    )
    budget = eng.max_num_batched_tokens if o.scheduler == eng.scheduler else None
    max_tokens = o.max_tokens or budget or default_max_tokens(o.scheduler, limit, hardware)
    extra = {"chunked_prefill_size": o.max_tokens or budget} if o.scheduler == "sglang" else {}
    return ServeConfig(
        image_tokens_per_request=image_tokens(o, model),
        max_model_len=limit,
        replicas=o.total_replicas,
        gpus_per_replica=o.tp * o.pp,
        pp=o.pp,
        seed=o.seed,
        disaggregation=disaggregation,
        speculative=o.speculative(),
        branching=branching,
        scheduler=SchedulerConfig(
            kind=o.scheduler,
            max_batch_size=o.max_batch_size,
            max_tokens=max_tokens,
            chunk_size=o.chunk_size,
            preemption=o.preemption,
            scheduler_steps=o.num_scheduler_steps,
            **{k: v for k, v in extra.items() if v},
        ),
        router=o.router,
        block_size=o.block_size,
        gpu_memory_utilization=o.gpu_memory_utilization,
        prefix_caching=o.prefix_caching,
        swap_bytes_per_s=hardware.host_copy_bytes_per_s,
        slo_ttft_s=o.slo_ttft_s,
        slo_tpot_s=o.slo_tpot_s,
        price_per_gpu_hour=price,
        max_concurrency=o.max_concurrency,
        frontend=frontend,
    )


def resolve_deployment(
    options: ServeOptions, model: ModelConfig, drafts: tuple[ModelConfig, ...] = ()
) -> ServeDeployment:
    """Hardware, step models and simulator config of the deployment ``options`` describe
    (``drafts``: the loaded ``--draft-model`` and ``--spec-hierarchy`` models)."""
    o = options
    ptp, dtp = o.prefill_tp_or_tp, o.decode_tp_or_tp
    pgpu, dgpu = o.prefill_gpu_or_gpu, o.decode_gpu_or_gpu
    check_pool_gpus(o)  # each pool's GPU exists and holds the KV cache the other writes
    hardware = serve_hardware(o, dtp, dgpu)
    if o.disaggregate and o.kv_transfer == "intra":
        per_node = hardware.gpus_per_node
        if (ptp + dtp) * o.pp > per_node:
            raise ValueError(
                f"--kv-transfer intra needs a prefill and a decode replica in one node: "
                f"{ptp * o.pp} + {dtp * o.pp} GPUs > {per_node} per {o.gpu} node; allowed: "
                "--kv-transfer inter, or smaller replicas"
            )
    same = ptp == dtp and pgpu == dgpu  # one step model serves both pools
    pre_hw = hardware if not o.disaggregate or same else serve_hardware(o, ptp, pgpu)
    config = serve_config(o, model, hardware, pre_hw)
    images = image_load(o, model)  # priced on the pool that prefills
    sched = config.scheduler
    kw: dict[str, Any] = dict(
        pp=o.pp,
        engine=o.engine,
        attn_backend=o.attn_backend,
        weight_dtype=o.weight_dtype,
        kv_cache_dtype=o.kv_cache_dtype,
        weight_sparsity=o.weight_sparsity,
        activation_sparsity=o.activation_sparsity,
        composition=resolve_composition(o.composition),
        max_num_batched_tokens=o.chunk_size
        if o.scheduler == "sarathi"
        else sched.chunked_prefill_size
        if o.scheduler == "sglang"
        else sched.max_tokens,
        max_num_seqs=o.max_batch_size,
        scheduler_steps=o.num_scheduler_steps,
    )
    if o.disaggregate:
        pre = build_step_model(
            model, pre_hw, tp=ptp, attn_pattern=o.attn_pattern, images=images, **kw
        )
        step = (
            pre
            if same
            else build_step_model(model, hardware, tp=dtp, attn_pattern=o.attn_pattern, **kw)
        )
    else:
        step = pre = build_step_model(
            model, hardware, tp=o.tp, attn_pattern=o.attn_pattern, images=images, **kw
        )
    spec = config.speculative
    triforce = spec is not None and spec.retrieval_budget is not None
    built = tuple(build_step_model(d, hardware, tp=o.tp, **kw) for d in drafts[triforce:])
    draft_steps: tuple[Any, ...] = built
    if triforce:  # drafts[0] is the target itself, drafting over its retrieval cache
        seats = o.max_batch_size
        draft_steps = (
            RetrievalDraft(step, spec.retrieval_budget, spec.retrieval_chunk, seats),  # type: ignore[union-attr,arg-type]
            *(StreamingDraft(d, spec.tiny_cache or 1, seats) for d in built),  # type: ignore[union-attr]
        )
    return ServeDeployment(hardware, pre_hw, config, step, pre, draft_steps)


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Arrivals:
    """Where a run's requests come from: a replayed trace (``synthetic`` None), or
    synthetic arrivals whose lengths follow the DISTs or are resampled from a trace's rows
    (``empirical``). Every call of :meth:`requests` starts the stream afresh."""

    trace: Path | None
    num_requests: int | None
    synthetic: SyntheticSpec | None
    empirical: tuple[np.ndarray, np.ndarray] | None = None
    source: TraceSource | None = None  # how --trace is read (--trace-format)
    max_concurrency: int | None = None  # closed loop (the label says so)
    priority_mix: PriorityMix | None = None  # --priority-mix, drawn from priority_seed
    priority_seed: int = 0

    @property
    def replay(self) -> bool:
        return self.synthetic is None

    @property
    def expected(self) -> int | None:
        """Requests the run will simulate (None: every row of the trace)."""
        return self.num_requests if self.synthetic is None else self.synthetic.num_requests

    @property
    def label(self) -> str:
        base = "trace" if self.synthetic is None else f"qps {self.synthetic.qps:g}"
        if self.max_concurrency is not None:
            base += f", max concurrency {self.max_concurrency}"
        return base

    def _replay(self, n: int | None) -> Iterable[Request]:
        if self.source is not None:
            return self.source.requests(n)
        return trace_requests(self.trace, n)  # type: ignore[arg-type]

    def requests(self) -> Iterator[Request]:
        if self.synthetic is None:
            stream = self._replay(self.num_requests)
        else:
            stream = synthetic_requests(self.synthetic, self.empirical)
        if self.priority_mix is not None:
            return with_priorities(stream, self.priority_mix, self.priority_seed)
        return stream  # type: ignore[return-value]

    def at_rates(self, n: int) -> tuple[Callable[[float], Iterable[Request]], float | None, str]:
        """(requests of the first ``n`` at ``m`` x this run's arrival rate, the run's rate,
        why there is none): synthetic arrivals re-drawn at ``m x --qps`` with the same seed
        and lengths; a replayed trace's first ``n`` rows with arrival times divided by ``m``."""
        syn = self.synthetic
        if syn is not None and not np.isfinite(syn.qps):
            return (lambda m: iter(())), None, "every request arrives at t = 0 (--qps inf)"
        if syn is not None:

            def synthetic_at(m: float) -> Iterable[Request]:
                spec = syn.model_copy(update={"qps": syn.qps * m, "num_requests": n})
                stream = synthetic_requests(spec, self.empirical)
                if self.priority_mix is not None:
                    return with_priorities(stream, self.priority_mix, self.priority_seed)
                return stream

            return synthetic_at, syn.qps, ""
        arrivals = [r.arrival_s for r in self._replay(n)]
        span = arrivals[-1] - arrivals[0] if arrivals else 0.0
        if len(arrivals) < 2 or not span > 0:
            return (lambda m: iter(())), None, "the trace's arrivals span no time"

        def replay_at(m: float) -> Iterable[Request]:
            for r in self._replay(n):
                yield Request(
                    r.id, r.arrival_s / m, r.prompt_tokens, r.output_tokens, r.prefix_key,
                    r.prefix_tokens, priority=r.priority,
                )  # fmt: skip

        return replay_at, (len(arrivals) - 1) / span, ""


def resolve_arrivals(options: ServeOptions) -> Arrivals:
    """``--trace`` alone replays it; ``--qps`` draws synthetic arrivals (lengths from
    ``--trace``'s rows when given, else from the DISTs). A bad trace header or first row
    fails here, before anything is simulated."""
    o = options
    mix = parse_priority_mix(o.priority_mix) if o.priority_mix else None
    src = None
    if o.trace is not None:
        src = trace_source(o.trace, o.trace_format, o.trace_columns, o.trace_time_unit)
    mc = o.max_concurrency
    if src is not None and o.qps is None:
        src.check(need_arrivals=True)
        return Arrivals(
            o.trace, o.num_requests, None, source=src, max_concurrency=mc,
            priority_mix=mix, priority_seed=o.seed,
        )  # fmt: skip
    empirical = src.lengths() if src is not None else None
    spec = SyntheticSpec(
        qps=o.qps,  # type: ignore[arg-type]
        num_requests=o.num_requests or 1000,
        burstiness=o.arrival_cv,
        prompt_len=parse_dist(o.prompt_len) if empirical is None else None,
        output_len=parse_dist(o.output_len, "output") if empirical is None else None,
        joint=joint_dataset(o.prompt_len, o.output_len) if empirical is None else None,
        shared_prefix_len=o.shared_prefix_len,
        prefix_groups=o.prefix_groups,
        seed=o.seed,
    )
    return Arrivals(
        o.trace, o.num_requests, spec, empirical, src, mc, priority_mix=mix, priority_seed=o.seed
    )


# --------------------------------------------------------------------------- simcli serve


@dataclass(frozen=True)
class ServeScenario:
    """``simcli serve`` resolved: model, drafts, deployment and requests."""

    options: ServeOptions
    model: ModelConfig
    drafts: tuple[ModelConfig, ...]
    deployment: ServeDeployment
    arrivals: Arrivals
    branch_output_lengths: np.ndarray | None = None  # a trace's, resampled by branches

    @property
    def title(self) -> str:
        o = self.options
        pools = o.pools()
        if pools is not None:
            pre_gpu = f" {o.prefill_gpu_or_gpu}" if o.heterogeneous else ""
            where = (
                f"{pools[0]} x {o.prefill_tp_or_tp * o.pp}{pre_gpu} + {pools[1]} x "
                f"{o.decode_tp_or_tp * o.pp} {o.decode_gpu_or_gpu} (prefill + decode)"
            )
        else:
            where = f"{o.replicas} x {o.tp * o.pp} {o.gpu}"
        return f"serving {self.model.id} on {where}"

    def simulator(self, *, energy: bool = False, **kw: Any) -> Simulator:
        return self.deployment.simulator(
            energy=energy, branch_output_lengths=self.branch_output_lengths, **kw
        )

    def simulate(self, requests: Iterable[Request]) -> ServeResult:
        """The deployment serving ``requests`` (no energy, no sink: the report's sweep)."""
        return self.simulator().run(requests)

    def serving_fidelity(self) -> dict[str, Any]:
        """How far this engine's answers were from published results of the real engine
        (:func:`costmodels.steps.serving_fidelity.serving_fidelity_fields`)."""
        prov = provenance_fields(self.deployment.hardware.cost_model)
        return serving_fidelity_fields(
            self.options.engine,
            prov["op_model_expected_error_pct"],
            prov["op_model_provenance"],
        )

    def result_object(self, summary: dict, wall_s: float) -> dict[str, Any]:
        """What ``simcli serve`` prints: the deployment, then the simulator's summary."""
        o = self.options
        disaggregated = o.disaggregate
        drafts = self.drafts
        return {
            "model": self.model.id,
            "gpu": o.gpu,
            "tp": o.tp,
            "pp": o.pp,
            "engine": o.engine,
            **engine_fields(self.deployment.step),
            "weight_dtype": o.weight_dtype,
            "kv_cache_dtype": kv_storage_dtype(o.kv_cache_dtype, activation_dtype(o.weight_dtype)),
            **sparsity_fields(o),
            "replicas": o.total_replicas,
            "scheduler": o.scheduler,
            "router": o.router,
            "arrivals": self.arrivals.label,
            **image_fields(o, self.model),
            "prefill_tp": o.prefill_tp_or_tp if disaggregated else None,
            "decode_tp": o.decode_tp_or_tp if disaggregated else None,
            "draft_model": drafts[0].id if drafts else None,
            "spec_hierarchy": drafts[1].id if len(drafts) > 1 else None,
            "weight_gib_per_gpu": weight_gib_per_gpu(self.deployment.step),
            **provenance_fields(self.deployment.hardware.cost_model),
            **self.serving_fidelity(),
            # the prefill pool's op models (its own GPU type when heterogeneous)
            **{
                f"prefill_{k}": v if disaggregated else None
                for k, v in provenance_fields(self.deployment.prefill_hardware.cost_model).items()
            },
            **summary,
            "price_per_gpu_hour": self.deployment.config.price_per_gpu_hour,
            "simulation_wall_s": wall_s,
            "simulated_requests_per_wall_s": summary["requests_completed"] / wall_s
            if wall_s > 0
            else None,
        }


def resolve_drafts(options: ServeOptions, model: ModelConfig) -> tuple[ModelConfig, ...]:
    """``--draft-model`` and ``--spec-hierarchy``, each with the target's vocabulary."""
    triforce = options.triforce_kv_budget is not None
    if options.draft_model is None and not triforce:
        return ()
    drafts = [model] if triforce else []  # TriForce: the target drafts for itself
    for flag, ident in (
        ("--draft-model", options.draft_model),
        ("--spec-hierarchy", options.spec_hierarchy),
    ):
        if ident is None:
            continue
        draft = load_model(ident)
        if draft.vocab_size != model.vocab_size:
            raise ValueError(
                f"{flag} {ident} has a vocabulary of {draft.vocab_size} tokens, the target "
                f"{model.id} {model.vocab_size}; allowed: a draft with the target's vocabulary"
            )
        drafts.append(draft)
    return tuple(drafts)


def resolve_serve(options: ServeOptions) -> ServeScenario:
    """``simcli serve``'s options resolved once (see the module docstring)."""
    options.require()
    model = with_moe_imbalance(load_model(options.model), options.moe_imbalance)  # type: ignore[arg-type]
    load_catalog(options.hardware).gpu(options.gpu)  # type: ignore[arg-type]  # one line listing known ids
    drafts = resolve_drafts(options, model)
    arrivals = resolve_arrivals(options)
    lengths = None
    if options.branches > 1 and arrivals.source is not None:  # branches resample its outputs
        lengths = arrivals.source.lengths()[1]
    deployment = resolve_deployment(options, model, drafts)
    return ServeScenario(options, model, drafts, deployment, arrivals, lengths)


@dataclass(frozen=True)
class ServeRun:
    """One ``simcli serve`` run: the printed object, the simulator's result and metrics."""

    output: dict[str, Any]
    result: ServeResult
    metrics: Metrics
    wall_s: float


def run_serve(
    scenario: ServeScenario,
    *,
    sink: Callable[[Request], None] | None = None,
    progress: Callable[[int, int | None], None] | None = None,
    recorder: StepRecorder | None = None,
) -> ServeRun:
    """Simulate ``scenario`` (energy priced when the cost model has a power model).
    ``sink`` sees every finished request, ``progress(done, total)`` the completions,
    ``recorder`` every iteration (see :class:`~simcli.serving.simulator.Simulator`)."""
    t0 = time.perf_counter()
    sim = scenario.simulator(
        energy=True,
        sink=sink,
        progress=progress,
        progress_total=scenario.arrivals.expected,
        recorder=recorder,
    )
    result = sim.run(scenario.arrivals.requests())
    wall = time.perf_counter() - t0
    return ServeRun(scenario.result_object(result.summary, wall), result, sim.metrics, wall)


# --------------------------------------------------------------------------- simcli serve plan


class CandidateDeployments:
    """The planner's :class:`~simcli.serving.planner.DeploymentBuilder`: a candidate at a
    replica count is the :class:`ServeOptions` of ``simcli serve`` with the same flags,
    resolved by :func:`resolve_deployment` and :func:`serve_config` like any ``serve``
    run (same hardware, prices, KV swap rate and step models)."""

    def __init__(self, model: ModelConfig, space: PlanSpace, slo: SLO, workload: Workload):
        self.model, self.space, self.slo, self.workload = model, space, slo, workload
        catalog = load_catalog(space.hardware)
        pre, dec = space.pool_gpus if space.pool_search else ((), ())
        flags = ("--gpus-types", "--prefill-gpu-types", "--decode-gpu-types")
        for flag, gpus in zip(flags, (space.gpus, pre, dec), strict=True):
            for g in gpus:
                catalog.gpu(g)  # one-line error listing the known ids
                check_precision(
                    g, space.weight_dtype, space.kv_cache_dtype, gpu_flag=flag, catalog=catalog
                )
        self.prices = {g: gpu_price(g, space.prices).usd_per_gpu_hour for g in space.all_gpus}
        self.deployments: dict[tuple, ServeDeployment] = {}

    def usd_per_gpu_hour(self, gpu: str) -> float:
        return self.prices[gpu]

    def options(
        self, candidate: Candidate, replicas: int, pools: tuple[int, int] | None = None
    ) -> ServeOptions:
        """The ``simcli serve`` flags of ``candidate`` with ``replicas`` replicas (split by
        its ratio), or with explicit ``pools`` (prefill, decode) of a per-pool search."""
        c, sp, w, prices = candidate, self.space, self.workload, self.space.prices
        per_pool: dict[str, Any] = {}
        if c.per_pool:
            per_pool = {"decode_gpu": c.decode_gpu}
            if pools is not None:
                per_pool |= {"prefill_replicas": pools[0], "decode_replicas": pools[1]}
        return ServeOptions(
            model=self.model.id,
            gpu=c.gpu,
            tp=c.tp,
            replicas=replicas,
            scheduler=c.scheduler,  # type: ignore[arg-type]
            chunk_size=c.chunk_size,
            disaggregate=c.pd_ratio is not None,
            pd_ratio=c.pd_ratio if pools is None or not c.per_pool else None,
            **per_pool,
            max_batch_size=sp.max_batch_size,
            block_size=sp.block_size,
            gpu_memory_utilization=sp.gpu_memory_utilization,
            engine=sp.engine,
            attn_backend=sp.attn_backend,
            hardware=sp.hardware,
            weight_dtype=sp.weight_dtype,
            kv_cache_dtype=sp.kv_cache_dtype,
            attn_pattern=sp.attn_pattern,
            weight_sparsity=sp.weight_sparsity,
            activation_sparsity=sp.activation_sparsity,
            # a per-pool candidate's pools take their own prices (serve_config)
            price_per_gpu_hour=None if c.per_pool else prices.get(c.gpu, prices.get("*")),
            qps=w.qps,
            num_requests=w.num_requests,
            prompt_len=w.prompt_len,
            output_len=w.output_len,
            burstiness=w.burstiness,
            seed=w.seed,
            max_concurrency=w.max_concurrency,
            images_per_request=w.images_per_request,
            image_size=w.image_size,
            slo_ttft_s=self.slo.ttft_s,
            slo_tpot_s=self.slo.tpot_s,
        )

    def deployment(self, candidate: Candidate) -> ServeDeployment:
        """Hardware and step models, shared by candidates that differ only in P:D ratio."""
        c = candidate
        key = (c.gpu, c.decode_gpu_or_gpu, c.per_pool, c.tp, c.scheduler, c.chunk_size)
        dep = self.deployments.get(key)
        if dep is None:
            options = self.options(candidate, candidate.min_replicas)
            dep = self.deployments[key] = resolve_deployment(options, self.model)
        return dep

    def step_model(self, candidate: Candidate) -> Any:
        return self.deployment(candidate).step

    def prefill_step_model(self, candidate: Candidate) -> Any:
        return self.deployment(candidate).prefill_step

    def serve_config(
        self, candidate: Candidate, replicas: int, pools: tuple[int, int] | None = None
    ) -> ServeConfig:
        dep = self.deployment(candidate)
        options = self.options(candidate, replicas, pools)
        config = serve_config(options, self.model, dep.hardware, dep.prefill_hardware)
        if not candidate.per_pool:
            return config
        # each pool at the search's price of its GPU (--price-per-gpu-hour GPU=USD pairs)
        c = candidate
        return with_pool_prices(config, self.prices[c.gpu], self.prices[c.decode_gpu_or_gpu])


def plan_deployments(
    model: ModelConfig | str,
    workload: Workload,
    slo: SLO,
    space: PlanSpace | None = None,
    *,
    top: int = 5,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """The cheapest deployments of ``space`` meeting ``slo`` under ``workload``
    (:func:`simcli.serving.planner.search_deployments` with :class:`CandidateDeployments`).
    Raises :class:`~simcli.serving.plan_inputs.PlanError` (one line) when none does."""
    model = model if isinstance(model, ModelConfig) else load_model(model)
    space = space or PlanSpace()
    builder = CandidateDeployments(model, space, slo, workload)
    return search_deployments(model, workload, slo, space, builder, top=top, progress=progress)


@dataclass(frozen=True)
class ServePlanScenario:
    """``simcli serve plan`` resolved: model, search space, workload, SLO."""

    options: ServePlanOptions
    model: ModelConfig
    space: PlanSpace
    workload: Workload
    slo: SLO


def resolve_serve_plan(options: ServePlanOptions) -> ServePlanScenario:
    model = load_model(options.model)
    return ServePlanScenario(options, model, options.space(), options.workload(), options.slo())


def run_serve_plan(
    scenario: ServePlanScenario, *, progress: Callable[[int, int], None] | None = None
) -> PlanResult:
    """The search of ``scenario`` (``progress(done, total)`` as each config is settled)."""
    s = scenario
    return plan_deployments(
        s.model, s.workload, s.slo, s.space, top=s.options.top, progress=progress
    )


__all__ = [
    "Arrivals",
    "CandidateDeployments",
    "ServeDeployment",
    "ServeOptions",
    "ServePlanOptions",
    "ServePlanScenario",
    "ServeRun",
    "ServeScenario",
    "StepOptions",
    "StepScenario",
    "build_step_model",
    "model_len_limit",
    "plan_deployments",
    "resolve_arrivals",
    "resolve_deployment",
    "resolve_drafts",
    "resolve_serve",
    "resolve_serve_plan",
    "resolve_step",
    "run_serve",
    "run_serve_plan",
    "run_step",
    "serve_config",
    "serve_hardware",
]
