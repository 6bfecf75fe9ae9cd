"""The inputs of ``simcli serve`` and ``simcli serve plan`` (``simcli step``'s are in
:mod:`simcli.scenario.step_options`, re-exported here): one pydantic model per command
whose fields are its options (flag, type, default, help with the unit), so that help, JSON
schema and validation come from one place (:func:`simcli.options.config_options` turns the
fields into typer options). Options that are about output (``--format``, ``--output``,
``--trace-output``, ``--quiet``, the report's QPS sweep) stay parameters of the command.

Every bad value is one line naming the flag, the value and what is allowed: the bounds and
choices of every field are checked first (:class:`CommandConfig`), then the combinations of
flags (each model's ``after`` validator), then what needs files or the catalog (the
resolvers of :mod:`simcli.scenario.serving`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from costmodels.steps.engines import EngineId, load_engine
from hardware_specs.registry import load_catalog
from simcli.scenario import sparsity_options as so
from simcli.scenario.config_base import (
    MAX_GPUS_PER_STAGE,
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_SEQS,
    REPLICAS_WHY,
    SEQS_WHY,
    CommandConfig,
    allowed_range,
    check_dist,
    check_value,
    count_field,
    option_flag,
    tokens_field,
)
from simcli.scenario.image_options import IMAGE_FIELDS, check_image_size
from simcli.scenario.load_options import LOAD_FIELDS, LoadOptions, TimeUnit, TraceFormat
from simcli.scenario.serving_engine_options import (
    BLOCK_HELP,
    CHUNK_HELP,
    SEQS_HELP,
    attn_backend_field,
    composition_field,
    engine_field,
    hardware_field,
    profile_field,
    serve_engine_defaults,
)
from simcli.scenario.serving_features import branch_config, spec_config, unit_floats
from simcli.scenario.serving_pools import check_pool_options, default_pool_gpu, two_gpu_types
from simcli.scenario.serving_precision import (
    KV_CACHE_DTYPE_HELP,
    WEIGHT_DTYPE_HELP,
    KvCacheDtype,
    WeightDtype,
    check_engine_precision,
)
from simcli.scenario.step_options import StepOptions  # its own module; re-exported
from simcli.serving.branches import BranchConfig
from simcli.serving.plan_inputs import (
    DEFAULT_GPUS,
    SLO,
    PlanError,
    PlanSpace,
    Workload,
    pd_weights,
    split_replicas,
)
from simcli.serving.priority import parse_priority_mix
from simcli.serving.schedulers import ENGINE_SCHEDULERS, SCHEDULERS, SchedulerKind
from simcli.serving.spec import SpecConfig
from workloads.models import moe_imbalance_field

SCHED_HELP = ", ".join(SCHEDULERS) + " (docs/schedulers.md)."
DIST_HELP = "e.g. fixed:512, uniform:128:1024, lognormal:512:1:4096"
PERCENTILE_HELP = (
    "met by --attainment of the requests: a p90 target by default (--attainment 0.99: p99)"
)


# --------------------------------------------------------------------------- simcli serve


# The gamma arrival process has shape 1 / CV^2: beyond CV 100 (shape 1e-4) one gap holds
# almost all the time and the shape underflows to 0 (serve --burstiness 1e308 divided by it)
MAX_BURSTINESS = 100.0
BURSTINESS_WHY = "a CV of 100 already puts nearly every arrival in one burst"


class ServeOptions(LoadOptions):
    """``simcli serve``: one deployment (model, GPUs, parallelism, scheduler, engine and the
    optional disaggregation, speculative decoding and multi-branch features) and the
    requests it serves. Not to be confused with the simulator's
    :class:`~simcli.serving.simulator.ServeConfig`, which :mod:`simcli.scenario.serving`
    resolves from these options and the hardware."""

    model: str | None = Field(None, description="Built-in model id or config.json (required).")
    moe_imbalance: float = moe_imbalance_field()
    gpu: str | None = Field(None, description="GPU id (see `simcli specs list`; required).")
    tp: int = count_field(
        1, MAX_GPUS_PER_STAGE, "GPUs per replica", description="Tensor-parallel GPUs per replica."
    )
    pp: int = count_field(
        1,
        MAX_GPUS_PER_STAGE,
        "stages per replica",
        description="Pipeline stages per replica (pp batches in flight, KV split pp ways).",
    )
    replicas: int = count_field(
        1, MAX_REPLICAS, REPLICAS_WHY, description="Model replicas behind the router."
    )
    scheduler: SchedulerKind | None = Field(
        None, description="Replica scheduler (default: the engine's): " + SCHED_HELP
    )
    num_scheduler_steps: int = Field(
        1, gt=0, le=64, description="vLLM V0's --num-scheduler-steps: decode rounds of N steps "
        "scheduled once (host work once per round, new requests wait for the round's end, "
        "tokens streamed per round; --engine vllm-v0 only)."
    )  # fmt: skip
    priority_mix: str | None = Field(
        None, description="Request priority classes CLASS:SHARE,... (e.g. 0:0.2,1:0.8; lower "
        "served first by --scheduler priority), drawn from --seed."
    )  # fmt: skip
    router: Literal["round_robin", "least_outstanding", "kv_aware"] = Field(
        "least_outstanding",
        description="Request routing: round_robin | least_outstanding | kv_aware",
    )
    qps: float | None = LOAD_FIELDS["serve_qps"]()
    qps_sweep: str | None = LOAD_FIELDS["qps_sweep"]()
    max_concurrency: int | None = LOAD_FIELDS["max_concurrency"]()
    burstiness: float = Field(
        1.0,
        gt=0,
        le=MAX_BURSTINESS,
        description="CV of inter-arrival gaps: 1 Poisson, >1 bursty (gamma).",
        json_schema_extra={"le_why": BURSTINESS_WHY},
    )
    gamma_shape: float | None = LOAD_FIELDS["gamma_shape"]()
    trace: Path | None = Field(
        None,
        description="CSV arrival_s,prompt_tokens,output_tokens[,prefix_id,prefix_tokens] to "
        "replay (arrival times in seconds), or a public trace (--trace-format).",
    )
    trace_format: TraceFormat = LOAD_FIELDS["trace_format"]()
    trace_columns: str | None = LOAD_FIELDS["trace_columns"]()
    trace_time_unit: TimeUnit = LOAD_FIELDS["trace_time_unit"]()
    num_requests: int | None = count_field(
        None,
        MAX_REQUESTS,
        "2^31 - 1",
        description="Requests to simulate (default 1000; a trace: all rows).",
    )
    prompt_len: str = Field(
        "lognormal:512:1:4096", description=f"Prompt length DIST, tokens ({DIST_HELP})."
    )
    output_len: str = Field("lognormal:128:1:2048", description="Output length DIST, tokens.")
    images_per_request: int = IMAGE_FIELDS["images_per_request"]()
    image_size: str = IMAGE_FIELDS["image_size"]()
    dataset: str | None = LOAD_FIELDS["dataset"]()
    shared_prefix_len: int = tokens_field(
        0, ge=0, description="Shared prefix prepended to every prompt, tokens."
    )
    prefix_groups: int = Field(1, gt=0, description="Distinct shared prefixes.")
    prefix_caching: bool = Field(True, description="Reuse cached prefix KV blocks.")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed of arrivals and lengths.")
    preemption: Literal["recompute", "swap"] = Field(
        "recompute", description="What a preempted sequence loses: recompute | swap"
    )
    chunk_size: int = tokens_field(None, description=CHUNK_HELP)
    max_batch_size: int = count_field(None, MAX_SEQS, SEQS_WHY, description=SEQS_HELP)
    max_tokens: int | None = tokens_field(
        None, description="Tokens per iteration, vllm/orca (default max(model context, 2048))."
    )
    block_size: int = tokens_field(None, description=BLOCK_HELP)
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory for weights + KV."
    )
    slo_ttft_s: float | None = Field(
        None,
        gt=0,
        description="TTFT SLO, seconds, per request: goodput and slo_attainment count the "
        "requests within it (no percentile; the output gives p50/p90/p99).",
    )
    slo_tpot_s: float | None = Field(
        None,
        gt=0,
        description="TPOT SLO, seconds, per request: goodput and slo_attainment count the "
        "requests within it.",
    )
    price_per_gpu_hour: float | None = Field(
        None, gt=0, description="US$ per GPU-hour (default: the price table)."
    )
    engine: EngineId = engine_field()
    attn_backend: str | None = attn_backend_field()
    hardware: Path | None = hardware_field()
    weight_dtype: WeightDtype = Field("bf16", description=WEIGHT_DTYPE_HELP)
    kv_cache_dtype: KvCacheDtype = Field("auto", description=KV_CACHE_DTYPE_HELP)
    weight_sparsity: so.WeightSparsity = so.weight_sparsity_field()
    activation_sparsity: so.ActivationSparsity = so.activation_sparsity_field()
    max_model_len: int | None = tokens_field(
        None,
        description="Longest prompt + output a replica accepts, as vLLM's --max-model-len "
        "(default: the model's max_position_embeddings): longer prompts are refused "
        "(counted, not simulated), outputs cut so prompt + output fits.",
    )
    attn_pattern: str | None = Field(
        None,
        description="Sparse attention pattern of the served model (e.g. window:4096, nsa; see "
        "`simcli sparsity compare`).",
    )
    profile: Path | None = profile_field()
    composition: Path | None = composition_field()
    disaggregate: bool = Field(False, description="Separate prefill and decode pools.")
    prefill_replicas: int | None = count_field(
        None,
        MAX_REPLICAS,
        REPLICAS_WHY,
        description="Disaggregation: prefill replicas.",
    )
    decode_replicas: int | None = count_field(
        None,
        MAX_REPLICAS,
        REPLICAS_WHY,
        description="Disaggregation: decode replicas.",
    )
    pd_ratio: str | None = Field(
        None, description="Disaggregation: split --replicas P:D (e.g. 1:2)."
    )
    prefill_tp: int | None = count_field(
        None, MAX_GPUS_PER_STAGE, "GPUs per replica", description="Prefill TP (default --tp)."
    )
    decode_tp: int | None = count_field(
        None, MAX_GPUS_PER_STAGE, "GPUs per replica", description="Decode TP (default --tp)."
    )
    prefill_gpu: str | None = Field(None, description="Disaggregation: prefill GPU (--gpu).")
    decode_gpu: str | None = Field(None, description="Disaggregation: decode GPU (--gpu).")
    kv_transfer: Literal["inter", "intra"] | None = Field(
        None,
        description="KV link: inter (the NICs) | intra (NVLink inside one node); default: "
        "intra when both pools fit in one node, else inter (the output's kv_transfer).",
    )
    kv_transfer_overlap: bool = Field(
        False, description="Send KV layer by layer during the prefill."
    )
    decode_router: Literal["kv_aware", "least_outstanding", "round_robin"] | None = Field(
        None,
        description="Decode pool routing: kv_aware (default) | least_outstanding | round_robin.",
    )
    draft_model: str | None = Field(
        None, description="Speculative decoding: draft model id or config.json."
    )
    spec_k: int | None = Field(None, gt=0, description="Draft tokens per step (4).")
    spec_acceptance: float | None = Field(
        None, ge=0, le=1, description="Per-token acceptance rate of the drafts (0.7)."
    )
    spec_acceptance_per_position: str | None = Field(
        None, description="Acceptance per draft position: a1,a2,...,ak (each in [0, 1])."
    )
    spec_drafts: int | None = Field(
        None, gt=0, description="SpecTr: draft sequences verified together (1)."
    )
    spec_hierarchy: str | None = Field(
        None, description="TriForce: a tiny model id drafting for the draft."
    )
    spec_tiny_k: int | None = Field(None, gt=0, description="Tiny-model draft length, tokens (2).")
    spec_tiny_acceptance: float | None = Field(
        None, ge=0, le=1, description="Tiny-model acceptance rate (0.6)."
    )
    spectr_acceptance: Literal["kseq", "independent-bound"] | None = Field(
        None,
        description="SpecTr acceptance of --spec-drafts N > 1: kseq (default; k-sequential "
        "selection under a two-class token model) | independent-bound (1 - (1 - a)^N).",
    )
    triforce_kv_budget: int | None = tokens_field(
        None,
        description="TriForce: the target drafts for itself over a retrieval KV cache of "
        "this many tokens (4096 in the paper); no --draft-model; --spec-hierarchy names the "
        "tiny model. Defaults then: --spec-k 6, --spec-tiny-k 1, --spec-acceptance 0.9.",
    )
    triforce_chunk_size: int | None = tokens_field(
        None, description="TriForce: KV chunk the retrieval selects, tokens (8)."
    )
    triforce_tiny_cache: int | None = tokens_field(
        None, description="TriForce: StreamingLLM cache of the tiny model, tokens (256)."
    )
    branches: int = Field(1, gt=0, le=1024, description="Sampled branches per request (N).")
    branches_stop: int | None = Field(
        None, gt=0, description="Finished branches that complete a request (M; default N)."
    )
    prune: Literal["none", "sart"] | None = Field(None, description="Branch pruning: none | sart.")
    prune_interval: int | None = Field(
        None, gt=0, description="Decode steps between pruning checks (64)."
    )
    prune_threshold: float | None = Field(
        None, ge=0, le=1, description="SART phase-1 score threshold alpha (0.2)."
    )
    prune_max: int | None = Field(
        None, ge=0, description="SART phase-1 most pruned branches beta (default N - M)."
    )
    branch_accuracy: float | None = Field(
        None, ge=0, le=1, description="Probability that one branch answers right (0.6)."
    )
    branch_length_correlation: float | None = Field(
        None,
        ge=-1,
        le=1,
        description="Latent correlation of a branch's correctness with its length rank "
        "among its request's branches; < 0: longer less often right (-0.3).",
    )
    branch_question_correlation: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Latent correlation of the branches of one question (hard questions "
        "fail together) (0.5).",
    )
    prm_noise: float | None = Field(
        None,
        ge=0,
        le=100,
        description="Noise of the process-reward scores that pruning and prm-best use: 0 "
        "separates right from wrong branches, large values are a coin toss (1.0).",
    )
    branch_wrong_answers: int | None = Field(
        None, gt=0, le=1_000_000, description="Distinct wrong answers a branch may reach (4)."
    )
    answer_selection: Literal["majority", "prm-best"] | None = Field(
        None,
        description="Answer of a request from its finished branches: majority (vote) | "
        "prm-best (best PRM score).",
    )

    @field_validator("image_size")
    @classmethod
    def _image_size(cls, v: str) -> str:
        return check_image_size(v)

    @field_validator("prompt_len", "output_len")
    @classmethod
    def _dist(cls, v: str) -> str:
        return check_dist(v)

    _pool_gpu = model_validator(mode="before")(default_pool_gpu)

    @model_validator(mode="before")
    @classmethod
    def _engine_defaults(cls, data: Any) -> Any:
        return serve_engine_defaults(data)

    @model_validator(mode="after")
    def _combinations(self) -> ServeOptions:
        check_engine_precision(self.engine, self.weight_dtype, self.kv_cache_dtype)
        so.check_sparsity_options(self)
        spec = self.speculative()
        branching = self.branching()
        if not self.disaggregate:
            for flag, value in (
                ("--prefill-replicas", self.prefill_replicas),
                ("--decode-replicas", self.decode_replicas),
                ("--pd-ratio", self.pd_ratio),
                ("--prefill-tp", self.prefill_tp),
                ("--decode-tp", self.decode_tp),
                ("--kv-transfer", self.kv_transfer),
                ("--decode-router", self.decode_router),
                ("--prefill-gpu", self.prefill_gpu),
                ("--decode-gpu", self.decode_gpu),
            ):
                if value is not None:
                    raise ValueError(f"{flag} needs --disaggregate")
            if self.kv_transfer_overlap:
                raise ValueError("--kv-transfer-overlap needs --disaggregate")
        else:
            if spec is not None:
                raise ValueError(
                    "--draft-model with --disaggregate is not modelled; allowed: one of the two"
                )
            if branching is not None:
                raise ValueError(
                    "--branches with --disaggregate is not modelled; allowed: one of the two"
                )
            self.pools()
            check_pool_options(self)
        if spec is not None and self.pp > 1:
            raise ValueError(f"--draft-model with --pp {self.pp}; allowed: --pp 1 (as in vLLM)")
        if self.priority_mix is not None:
            parse_priority_mix(self.priority_mix)
        if self.num_scheduler_steps > 1 and self.engine != "vllm-v0":
            raise ValueError(
                f"--num-scheduler-steps {self.num_scheduler_steps} with --engine {self.engine}: "
                "multi-step scheduling is vLLM V0's; allowed: --engine vllm-v0, or 1"
            )
        if self.num_scheduler_steps > 1 and (self.scheduler != "vllm" or spec or branching
                                             or self.disaggregate):  # fmt: skip
            raise ValueError(
                f"--num-scheduler-steps {self.num_scheduler_steps} runs vLLM 0.6's multi-step "
                "rounds, without chunked prefill, drafts, branches or disaggregation; allowed: "
                "--scheduler vllm alone, or --num-scheduler-steps 1"
            )
        flags = {"--preemption swap": self.preemption == "swap", "--disaggregate":
                 self.disaggregate, "--draft-model": spec, "--branches": branching}  # fmt: skip
        for flag, on in flags.items():
            if self.scheduler in ENGINE_SCHEDULERS and on:
                raise ValueError(f"--scheduler {self.scheduler} with {flag} is not modelled; "
                                 "allowed: --scheduler vllm, orca or sarathi for it")  # fmt: skip
        return self

    def require(self) -> None:
        """What a run needs beyond the defaults (the callback also runs for ``serve plan``,
        so these are not field requirements)."""
        for flag, value in (("--model", self.model), ("--gpu", self.gpu)):
            if value is None:
                raise ValueError(f"{flag} is required (or run `simcli serve plan`)")
        if self.qps is None and self.trace is None and self.qps_sweep is None:
            raise ValueError("give --qps X (synthetic arrivals) or --trace FILE (replay), or both")

    # --- derived ------------------------------------------------------------------------
    @property
    def prefill_tp_or_tp(self) -> int:
        return self.prefill_tp or self.tp

    @property
    def decode_tp_or_tp(self) -> int:
        return self.decode_tp or self.tp

    prefill_gpu_or_gpu = property(lambda self: self.prefill_gpu or self.gpu)
    decode_gpu_or_gpu = property(lambda self: self.decode_gpu or self.gpu)
    heterogeneous = property(two_gpu_types)

    @property
    def total_replicas(self) -> int:
        """Replicas of the deployment (disaggregated: prefill + decode pools)."""
        pools = self.pools()
        return self.replicas if pools is None else sum(pools)

    def pools(self) -> tuple[int, int] | None:
        """(prefill, decode) replicas of a disaggregated deployment, from
        --prefill-replicas/--decode-replicas or --pd-ratio P:D of --replicas."""
        if not self.disaggregate:
            return None
        pre, dec, ratio, replicas = (
            self.prefill_replicas,
            self.decode_replicas,
            self.pd_ratio,
            self.replicas,
        )
        if pre is not None or dec is not None:
            if pre is None or dec is None or ratio is not None:
                raise ValueError(
                    "give both --prefill-replicas and --decode-replicas, or --pd-ratio P:D with "
                    "--replicas (not both ways)"
                )
            if replicas not in (1, pre + dec):
                raise ValueError(
                    f"--replicas {replicas} != --prefill-replicas {pre} + --decode-replicas "
                    f"{dec}; allowed: leave --replicas out, or their sum"
                )
            return pre, dec
        if ratio is None:
            raise ValueError(
                "--disaggregate needs --prefill-replicas P --decode-replicas D, or --pd-ratio"
            )
        try:
            pd_weights(ratio)
        except PlanError:
            raise ValueError(
                f"--pd-ratio {ratio!r} is invalid; allowed: P:D, two positive numbers"
            ) from None
        if replicas < 2:
            raise ValueError(f"--pd-ratio splits --replicas {replicas}; allowed: --replicas >= 2")
        return split_replicas(replicas, ratio)

    def speculative(self) -> SpecConfig | None:
        """The speculative-decoding config of ``--draft-model``, ``--triforce-*`` and
        ``--spec-*`` (:func:`~simcli.scenario.serving_features.spec_config`)."""
        return spec_config(self)

    def branching(self) -> BranchConfig | None:
        """The multi-branch config of ``--branches``, ``--prune*`` and the branch quality
        options (:func:`~simcli.scenario.serving_features.branch_config`)."""
        return branch_config(self)


# --------------------------------------------------------------------------- simcli serve plan


def parse_list(text: str) -> tuple[str, ...]:
    """``a, b,c`` -> ("a", "b", "c"); empty is a :class:`PlanError`."""
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise PlanError("empty; allowed: a comma list, e.g. a,b")
    return values


def parse_ints(text: str) -> tuple[int, ...]:
    """``1,2,4`` -> (1, 2, 4), each a positive integer."""
    try:
        values = tuple(int(v) for v in parse_list(text))
    except ValueError:
        raise PlanError("not a comma list of integers; allowed: e.g. 1,2,4") from None
    if any(v < 1 for v in values):
        raise PlanError("a value < 1; allowed: positive integers")
    return values


def parse_ratios(text: str) -> tuple[str | None, ...]:
    """``none,1:1,1:2`` -> (None, "1:1", "1:2"), each P:D checked."""
    out: list[str | None] = []
    for item in parse_list(text):
        if item.lower() in ("none", "0", "off"):
            out.append(None)
        else:
            pd_weights(item)
            out.append(item)
    return tuple(out)


def parse_prices(text: str | None) -> dict[str, float]:
    """``2.5`` (every GPU) or ``h100-sxm=2.5,h200-sxm=3.7`` (the rest from the table) ->
    {"*": 2.5} or {"h100-sxm": 2.5, "h200-sxm": 3.7}."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for item in parse_list(text):
        gpu, sep, value = item.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not (price > 0 and math.isfinite(price)) or (sep and not gpu.strip()):
            raise PlanError(
                "not a price; allowed: a positive number (US$ per GPU-hour) for every GPU, or "
                "GPU=USD pairs such as h100-sxm=2.5,h200-sxm=3.7"
            )
        out[gpu.strip() if sep else "*"] = price
    return out


def _schedulers(text: str) -> str:
    for s in parse_list(text):
        if s not in SCHEDULERS:
            raise PlanError(f"unknown scheduler {s!r}; allowed: {', '.join(SCHEDULERS)}")
    return text


class ServePlanOptions(LoadOptions):
    """``simcli serve plan``: the deployments searched, the workload at the target rate and
    the SLOs (see :mod:`simcli.serving.planner`)."""

    model: str = Field(description="Built-in model id or config.json.")
    gpu_types: str = Field(
        ",".join(DEFAULT_GPUS),
        description="GPU ids to consider, comma-separated (see `simcli specs list`); the "
        "default list drops GPUs without fp8 for fp8 weights or KV cache.",
        json_schema_extra={"cli": ["--gpus-types", "--gpu-types"]},
    )
    tp: str = Field("1,2,4", description="Tensor-parallel degrees to consider, comma-separated.")
    schedulers: str | None = Field(
        None,
        description="Schedulers to consider, comma-separated (default: the engine's own; "
        "disaggregated ratios run the closest classic one): " + SCHED_HELP,
    )
    chunk_sizes: str = Field(
        "512,2048",
        description="Sarathi token budgets per iteration to consider, tokens, comma-separated.",
    )
    pd_ratios: str = Field(
        "none,1:1,1:2",
        description="Prefill:decode pool splits to consider (`simcli serve --disaggregate "
        "--pd-ratio`); none = prefill and decode on every replica.",
    )
    prefill_gpu_types: str | None = Field(None, description="Per-pool search: prefill GPU ids.")
    decode_gpu_types: str | None = Field(None, description="Per-pool search: decode GPU ids.")
    qps: float = LOAD_FIELDS["plan_qps"]()
    max_concurrency: int | None = LOAD_FIELDS["max_concurrency"]()
    prompt_len: str = Field(
        "lognormal:512:1:4096", description=f"Prompt length DIST, tokens ({DIST_HELP})."
    )
    output_len: str = Field("lognormal:128:1:2048", description="Output length DIST, tokens.")
    images_per_request: int = IMAGE_FIELDS["images_per_request"]()
    image_size: str = IMAGE_FIELDS["image_size"]()
    dataset: str | None = LOAD_FIELDS["dataset"]()
    num_requests: int = count_field(
        1000,
        MAX_REQUESTS,
        "2^31 - 1",
        description="Requests simulated per probe (same ones every probe).",
    )
    burstiness: float = Field(
        1.0,
        gt=0,
        le=MAX_BURSTINESS,
        description="CV of inter-arrival gaps: 1 Poisson, >1 bursty (gamma).",
        json_schema_extra={"le_why": BURSTINESS_WHY},
    )
    gamma_shape: float | None = LOAD_FIELDS["gamma_shape"]()
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed of arrivals and lengths.")
    slo_ttft_s: float | None = Field(
        None, gt=0, description=f"TTFT limit, seconds, {PERCENTILE_HELP}."
    )
    slo_tpot_s: float | None = Field(
        None, gt=0, description=f"TPOT limit, seconds, {PERCENTILE_HELP}."
    )
    slo_e2e_s: float | None = Field(
        None, gt=0, description=f"End-to-end latency limit, seconds, {PERCENTILE_HELP}."
    )
    attainment: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Fraction of requests that must meet every given limit, so the limits "
        "are targets of this percentile: 0.9 (the default) p90, 0.99 p99.",
    )
    max_replicas: int = count_field(
        64, MAX_REPLICAS, REPLICAS_WHY, description="Most replicas to consider."
    )
    max_batch_size: int | None = count_field(None, MAX_SEQS, SEQS_WHY, description=SEQS_HELP)
    engine: EngineId = engine_field()
    attn_backend: str | None = attn_backend_field()
    hardware: Path | None = hardware_field()
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory for weights + KV."
    )
    weight_dtype: WeightDtype = Field("bf16", description=WEIGHT_DTYPE_HELP)
    kv_cache_dtype: KvCacheDtype = Field("auto", description=KV_CACHE_DTYPE_HELP)
    weight_sparsity: so.WeightSparsity = so.weight_sparsity_field()
    activation_sparsity: so.ActivationSparsity = so.activation_sparsity_field()
    attn_pattern: str | None = Field(
        None,
        description="Sparse attention pattern of every deployment (as `simcli serve "
        "--attn-pattern`): its decode reads and the KV it allocates (a window frees old "
        "blocks, so more sequences fit).",
    )
    top: int = Field(5, gt=0, description="How many deployments to return.")
    price: str | None = Field(
        None,
        description="US$ per GPU-hour: one number for all GPUs, or GPU=USD pairs "
        "(default: the price table).",
        json_schema_extra={"cli": ["--price-per-gpu-hour"]},
    )

    @field_validator("image_size")
    @classmethod
    def _image_size(cls, v: str) -> str:
        return check_image_size(v)

    @field_validator("prompt_len", "output_len")
    @classmethod
    def _dist(cls, v: str) -> str:
        return check_dist(v)

    @field_validator("gpu_types", "prefill_gpu_types", "decode_gpu_types")
    @classmethod
    def _gpu_list(cls, v: str | None) -> str | None:
        if v is not None:
            parse_list(v)
        return v

    @field_validator("tp", "chunk_sizes")
    @classmethod
    def _int_list(cls, v: str) -> str:
        parse_ints(v)
        return v

    @field_validator("schedulers")
    @classmethod
    def _scheduler_list(cls, v: str | None) -> str | None:
        return None if v is None else _schedulers(v)

    @field_validator("pd_ratios")
    @classmethod
    def _ratio_list(cls, v: str) -> str:
        parse_ratios(v)
        return v

    @field_validator("price")
    @classmethod
    def _price_list(cls, v: str | None) -> str | None:
        parse_prices(v)
        return v

    @model_validator(mode="after")
    def _some_slo(self) -> ServePlanOptions:
        self.slo()
        self.space()  # a per-pool search needs a P:D ratio
        check_engine_precision(self.engine, self.weight_dtype, self.kv_cache_dtype)
        so.check_sparsity_options(self)
        return self

    def space(self) -> PlanSpace:
        gpus = parse_list(self.gpu_types)
        if self.gpu_types == ",".join(DEFAULT_GPUS) and (
            self.weight_dtype == "fp8" or self.kv_cache_dtype.startswith("fp8")
        ):
            # the default list: only the GPUs that run fp8 (named GPUs are checked and
            # refused one by one in CandidateDeployments)
            catalog = load_catalog(self.hardware)
            gpus = [g for g in gpus if catalog.gpu(g).supports("fp8")]
        pre, dec = self.prefill_gpu_types, self.decode_gpu_types
        return PlanSpace(
            gpus=gpus,
            prefill_gpus=parse_list(pre) if pre else None,
            decode_gpus=parse_list(dec) if dec else None,
            tp=parse_ints(self.tp),
            schedulers=parse_list(self.schedulers)  # type: ignore[arg-type]
            if self.schedulers
            else (load_engine(self.engine).defaults.scheduler,),
            chunk_sizes=parse_ints(self.chunk_sizes),
            pd_ratios=parse_ratios(self.pd_ratios),
            max_replicas=self.max_replicas,
            max_batch_size=self.max_batch_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            engine=self.engine,
            attn_backend=self.attn_backend,
            hardware=self.hardware,
            weight_dtype=self.weight_dtype,
            kv_cache_dtype=self.kv_cache_dtype,
            prices=parse_prices(self.price),
            attn_pattern=self.attn_pattern,
            weight_sparsity=self.weight_sparsity,
            activation_sparsity=self.activation_sparsity,
        )

    def workload(self) -> Workload:
        return Workload(
            qps=self.qps,
            prompt_len=self.prompt_len,
            output_len=self.output_len,
            num_requests=self.num_requests,
            burstiness=self.arrival_cv,
            seed=self.seed,
            max_concurrency=self.max_concurrency,
            images_per_request=self.images_per_request,
            image_size=self.image_size,
        )

    def slo(self) -> SLO:
        return SLO(
            ttft_s=self.slo_ttft_s,
            tpot_s=self.slo_tpot_s,
            e2e_s=self.slo_e2e_s,
            attainment=self.attainment,
        )


__all__ = [
    "CommandConfig",
    "ServeOptions",
    "ServePlanOptions",
    "StepOptions",
    "allowed_range",
    "check_value",
    "option_flag",
    "parse_ints",
    "parse_list",
    "parse_prices",
    "parse_ratios",
    "unit_floats",
]
