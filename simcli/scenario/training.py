"""Training scenarios: the inputs of ``simcli train`` and ``simcli plan`` as pydantic
configs, resolved once into frozen scenarios, and run.

:class:`TrainConfig` and :class:`PlanConfig` *are* the commands' options (flag, type,
default and help text come from their fields through :func:`simcli.options.config_options`),
so the CLI, the JSON schema and the validation cannot drift apart. :func:`resolve_train` /
:func:`resolve_plan` turn a config into a :class:`TrainScenario` / :class:`PlanScenario`:
the model, the parallel plan (or the search space), the hardware with its cost model and
price (:func:`~simcli.scenario.hardware.resolve_hardware`), the framework and the
attention kernel or sparsity pattern. :func:`run_train` / :func:`run_plan` run the
simulator or the search on those resolved objects only and return what the command emits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from costmodels.steps.composition import Composition, load_composition, shipped_composition
from costmodels.steps.memory import MemoryEstimate, estimate_memory
from hardware_specs.prices import gpu_price
from hardware_specs.published import mfu_note
from hardware_specs.registry import MAX_GPUS
from simcli.scenario import sparsity_options as so
from simcli.scenario.hardware import CostModel, Hardware, resolve_hardware
from simcli.scenario.training_costs import scenario_step_costs
from simcli.training.search import Objective, SearchResult, gpu_counts, search_plans
from simcli.training.search_estimate import memory_capacity_bytes
from simcli.training.search_space import COMPUTE_DTYPE, SearchSpace
from simcli.training.simulator import TrainResult, simulate_iteration
from simcli.training.to_train import to_train_fields
from workloads.models import ModelConfig, load_model, moe_imbalance_field, with_moe_imbalance
from workloads.ops import MAX_TOKENS
from workloads.plan import (
    EXPERTS_IMPL_HELP,
    PRECISIONS,
    RANK_ORDERS,
    CPKind,
    ExpertsImpl,
    PlanError,
    PPSchedule,
    Precision,
    RankOrder,
    Recompute,
    TPComm,
    TrainPlan,
    make_plan,
)
from workloads.sparsity import Pattern, parse_pattern

GIB = 1024**3
TrainFramework = Literal["megatron", "pytorch", "pytorch-compile"]


def parse_int_list(text: str, example: str, least: int = 1) -> tuple[int, ...] | None:
    """A comma list of integers >= ``least`` (``"4,8"``); empty text is None."""
    if not text.strip():
        return None
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"not a comma list of integers; allowed: e.g. {example}") from None
    if any(v < least for v in values):
        raise ValueError(f"has a value < {least}; allowed: {_kind(least)}")
    if any(v > MAX_LIST_VALUE for v in values):
        raise ValueError(f"has a value > {MAX_LIST_VALUE:,}; allowed: {_kind(least)} up to that")
    return values


def _kind(least: int) -> str:
    return "positive integers" if least == 1 else f"integers >= {least}"


def _int_list(value: Any, example: str, least: int = 1) -> Any:
    if isinstance(value, str):
        return parse_int_list(value, example, least)
    if isinstance(value, list | tuple) and any(isinstance(v, int) and v < least for v in value):
        raise ValueError(f"has a value < {least}; allowed: {_kind(least)}")
    return value


DEFAULT_MEMORY_MARGIN = "2%"
# Upper bounds of the sizes (a typo such as --seq-len 1e26 is one line, not an overflow)
MAX_LIST_VALUE = 1 << 20  # degrees and layer counts in comma lists
MAX_SEQUENCES = 2**31 - 1
MAX_LAYERS = 100_000
GPUS_WHY = "2^20 GPUs, beyond any cluster simcli models"
SEQS_WHY = "2^31 - 1 sequences"
TOKENS_WHY = "2^24 tokens, beyond any model's context window"
LAYERS_WHY = "more virtual stages than any model has layers"


def memory_margin_bytes(text: str, capacity_bytes: float) -> float:
    """``--memory-margin``: memory a plan must leave free, as GiB (``4GiB``, ``4 GiB``),
    a percentage of the usable memory (``2%``) or a fraction of it (``0.02``). The
    default 2% covers the memory estimator's error on our traced steps (within 1.4%)
    and allocator growth between steps; multi-GPU estimates run 3-8% high (FSDP)."""
    t = text.strip().lower().replace(" ", "")
    try:
        if t.endswith("gib"):
            value = float(t[:-3]) * GIB
        elif t.endswith("%"):
            value = float(t[:-1]) / 100 * capacity_bytes
        else:
            frac = float(t)
            if frac >= 1:
                raise ValueError
            value = frac * capacity_bytes
    except ValueError:
        raise ValueError(
            f"not a memory margin: {text!r}; allowed: GiB (4GiB), a percentage (2%) or a "
            "fraction below 1 (0.02)"
        ) from None
    if value < 0 or value >= capacity_bytes:
        raise ValueError(f"memory margin {text!r} is negative or the whole GPU")
    return value


def _check_margin(value: str) -> str:
    memory_margin_bytes(value, 80 * GIB)  # syntax and range (the GPU checks its own)
    return value


_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

# Memory options train and plan share (pydantic copies a FieldInfo per model)
_FP8_PARAMS = Field(
    False,
    description="fp8: keep the layers' weights in fp8 only (Megatron --fp8-param-gather, "
    "NeMo fp8_params).",
)
_GRAD_REDUCE_DTYPE = Field(
    None,
    description="Gradient buffer / DP reduction dtype (Megatron --grad-reduce-in-bf16, "
    "NeMo grad_sync_dtype); default fp32 under mixed precision.",
)
_MEMORY_MARGIN = Field(
    DEFAULT_MEMORY_MARGIN,
    description="Memory to leave free: GiB (4GiB), % (2%) or a fraction (0.02) of the "
    "GPU's usable memory.",
)


class TrainConfig(BaseModel):
    """``simcli train``: one training iteration of one parallel plan."""

    model_config = _CONFIG

    model: str = Field(description="Built-in model id or a HuggingFace-style config.json path.")
    gpu: str = Field(description="GPU id (see `simcli specs list`).")
    gpus: int = Field(
        ge=1,
        le=MAX_GPUS,
        json_schema_extra={"le_why": GPUS_WHY},
        description="GPUs in the job (reference nodes unless --cluster).",
    )
    tp: int = Field(
        1,
        ge=1,
        le=MAX_GPUS,
        json_schema_extra={"le_why": GPUS_WHY},
        description="Tensor-parallel degree (GPUs per TP group).",
    )
    pp: int = Field(
        1,
        ge=1,
        le=MAX_GPUS,
        json_schema_extra={"le_why": GPUS_WHY},
        description="Pipeline-parallel stages.",
    )
    dp: int | None = Field(
        None, ge=1, description="Data-parallel degree; default: gpus / (tp * pp * cp)."
    )
    vpp: int = Field(
        1,
        ge=1,
        le=MAX_LAYERS,
        json_schema_extra={"le_why": LAYERS_WHY},
        description="Virtual pipeline stages per rank (interleaved).",
    )
    cp: int = Field(
        1,
        ge=1,
        le=MAX_GPUS,
        json_schema_extra={"le_why": GPUS_WHY},
        description="Context-parallel degree (each sequence split cp ways).",
    )
    cp_kind: CPKind = Field(
        "ring",
        description="Context parallelism: ring attention, Ulysses all-to-all, TokenRing, "
        "allgather (K/V all-gathered, Llama 3) or hierarchical (Ulysses in a node x ring).",
    )
    ep: int = Field(
        1,
        ge=1,
        le=MAX_GPUS,
        json_schema_extra={"le_why": GPUS_WHY},
        description="Expert-parallel degree (MoE models, within DP).",
    )
    moe_imbalance: float = moe_imbalance_field()
    zero: Literal[0, 1, 2, 3] = Field(
        0, description="ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 parameters."
    )
    micro_batch: int = Field(
        1,
        ge=1,
        le=MAX_SEQUENCES,
        json_schema_extra={"le_why": SEQS_WHY},
        description="Sequences per micro-batch.",
    )
    global_batch: int = Field(
        ge=1,
        le=MAX_SEQUENCES,
        json_schema_extra={"le_why": SEQS_WHY},
        description="Sequences per iteration.",
    )
    seq_len: int = Field(
        ge=1,
        le=MAX_TOKENS,
        json_schema_extra={"le_why": TOKENS_WHY},
        description="Tokens per sequence.",
    )
    pp_schedule: PPSchedule = Field("1f1b", description="Pipeline schedule.")
    recompute: Recompute = Field("none", description="Activation recomputation.")
    sequence_parallel: bool | None = Field(
        None,
        description="Megatron sequence parallelism; default: on when tp > 1.",
        json_schema_extra={"cli": ["--sequence-parallel/--no-sequence-parallel"]},
    )
    precision: Precision = Field("bf16-mixed", description="Training precision.")
    tp_comm: TPComm = Field(
        "plain",
        description="TP collectives: on the critical path, overlapped with the GEMMs, or "
        "Ladder Residual.",
    )
    layer_split: tuple[int, ...] | None = Field(
        None,
        description="Layers per model chunk (pp*vpp entries), e.g. 0,11,11,10 (0: the "
        "embedding or the LM head alone); default: even.",
    )
    first_stage_layers: int | None = Field(
        None,
        ge=0,
        le=MAX_LAYERS,
        description="Layers on the first pipeline stage, the rest even (Megatron's "
        "--decoder-first-pipeline-num-layers; 0: the embedding alone).",
    )
    last_stage_layers: int | None = Field(
        None,
        ge=0,
        le=MAX_LAYERS,
        description="Layers on the last pipeline stage (0: the LM head and loss alone).",
    )
    fp8_params: bool = _FP8_PARAMS
    grad_reduce_dtype: Literal["fp32", "bf16"] | None = _GRAD_REDUCE_DTYPE
    memory_margin: str = _MEMORY_MARGIN
    rank_order: RankOrder = Field(
        "tp-cp-dp-pp",
        description="Rank layout, fastest-varying first: tp-cp-dp-pp (Megatron-LM) or "
        "tp-cp-pp-dp (Llama 3: data parallelism outermost, across pods).",
    )
    optimizer_offload: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of the optimizer state held and stepped on the host CPU "
        "(ZeRO-Offload, Megatron --optimizer-offload-fraction).",
    )
    activation_offload: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of each rank's layers whose saved activations are copied to "
        "host memory (TE/Megatron CPU offloading).",
    )
    framework: TrainFramework = Field(
        "megatron",
        description="Training software: megatron (fused kernels), pytorch (eager) or "
        "pytorch-compile (torch.compile'd blocks; fp8 = torchao float8).",
    )
    experts_impl: ExpertsImpl = Field("auto", description=EXPERTS_IMPL_HELP)
    attn_backend: str = Field(
        "", description="Attention kernel family: flash | cudnn | flex | efficient; '': default."
    )
    attn_pattern: str | None = Field(
        None,
        description="Sparse attention pattern for every layer (e.g. window:4096, nsa, "
        "hybrid:dense_every=4,inner=nsa; see `simcli sparsity compare`).",
    )
    weight_sparsity: so.TrainWeightSparsity = so.weight_sparsity_field(training=True)
    activation_sparsity: so.TrainActivationSparsity = so.activation_sparsity_field(training=True)
    profile: Path | None = Field(None, description="Calibration profile (JSON).")
    composition: Path | None = Field(
        None,
        description="Composition factors from `simcli calibrate from-trace` (JSON); default: "
        "the ones shipped for the GPU (pytorch and pytorch-compile engines, H100/H200).",
    )
    hardware: Path | None = Field(None, description="Extra hardware spec file (YAML/JSON).")
    cluster: Path | None = Field(
        None,
        description="Hardware file describing one cluster (node groups, measured NIC "
        "bandwidths) instead of reference nodes on a fat-tree.",
    )
    ignore_memory: bool = Field(
        False, description="Report a plan even if it does not fit in GPU memory."
    )
    train_tokens: float | None = Field(
        None,
        gt=0,
        description="Tokens to train on (e.g. 1e12): also report days, GPU-hours and US$ to train.",
    )
    price_usd_per_gpu_hour: float | None = Field(
        None,
        gt=0,
        description="US$ per GPU-hour for --train-tokens; default: the built-in price table.",
        json_schema_extra={"cli": ["--price-per-gpu-hour"]},
    )

    @field_validator("layer_split", mode="before")
    @classmethod
    def _layer_split(cls, value: Any) -> Any:
        return _int_list(value, "7,8,8,9", least=0)

    @field_validator("memory_margin")
    @classmethod
    def _margin(cls, value: str) -> str:
        return _check_margin(value)


class PlanConfig(BaseModel):
    """``simcli plan``: the best parallel plans for a model, GPU type and batch."""

    model_config = _CONFIG

    model: str = Field(description="Built-in model id or a HuggingFace-style config.json path.")
    moe_imbalance: float = moe_imbalance_field()
    gpu: str = Field(description="GPU id (see `simcli specs list`).")
    gpus: int = Field(
        ge=1,
        le=MAX_GPUS,
        json_schema_extra={"le_why": GPUS_WHY},
        description="GPUs in the job (reference nodes).",
    )
    seq_len: int = Field(
        ge=1,
        le=MAX_TOKENS,
        json_schema_extra={"le_why": TOKENS_WHY},
        description="Tokens per sequence.",
    )
    global_batch: int = Field(
        ge=1,
        le=MAX_SEQUENCES,
        json_schema_extra={"le_why": SEQS_WHY},
        description="Sequences per iteration.",
    )
    top: int = Field(5, ge=1, le=10_000, description="How many plans to return.")
    objective: Objective = Field(
        "time",
        description="time: iteration time on --gpus GPUs; cost: US$ per iteration "
        "(GPU-hours x price), also trying --gpus/2, /4, ...",
    )
    balance: bool = Field(
        False,
        description="Also try uneven pipeline stages balancing time and memory (Galvatron-BMW).",
    )
    max_tp: int | None = Field(
        None,
        ge=1,
        le=MAX_GPUS,
        description="Largest tensor-parallel degree; default: GPUs per node.",
    )
    tp: tuple[int, ...] | None = Field(
        None, description="Only these tensor-parallel degrees, e.g. 4,8; default: all."
    )
    pp: tuple[int, ...] | None = Field(
        None, description="Only these pipeline-parallel degrees, e.g. 4,8; default: all."
    )
    max_pp: int | None = Field(
        None, ge=1, le=MAX_GPUS, description="Largest pipeline-parallel degree."
    )
    max_cp: int | None = Field(
        None, ge=1, le=MAX_GPUS, description="Largest context-parallel degree."
    )
    min_cp_tokens: int = Field(
        512,
        ge=0,
        le=MAX_TOKENS,
        description="Prune context parallelism below this many tokens per rank.",
    )
    max_micro_batch: int | None = Field(
        None, ge=1, le=MAX_SEQUENCES, description="Largest micro-batch, in sequences."
    )
    fp8_params: bool = _FP8_PARAMS
    grad_reduce_dtype: Literal["fp32", "bf16"] | None = _GRAD_REDUCE_DTYPE
    optimizer_offload: tuple[float, ...] | None = Field(
        None,
        description="Optimizer-state shares on the host CPU to try, e.g. 0,1 (ZeRO-Offload); "
        "default: none.",
    )
    rank_order: tuple[str, ...] | None = Field(
        None,
        description="Rank layouts to try: tp-cp-dp-pp (Megatron-LM, default), tp-cp-pp-dp "
        "(Llama 3), or both comma-separated.",
    )
    memory_margin: str = _MEMORY_MARGIN
    precision: Precision = Field("bf16-mixed", description="Training precision.")
    cluster: Path | None = Field(
        None,
        description="Hardware file describing one cluster (node groups, NICs, fabric) "
        "instead of reference nodes on a fat-tree.",
    )
    price_usd_per_gpu_hour: float | None = Field(
        None,
        gt=0,
        description="US$ per GPU-hour; default: the built-in price table.",
        json_schema_extra={"cli": ["--price-per-gpu-hour"]},
    )
    train_tokens: float | None = Field(
        None,
        gt=0,
        description="Tokens to train on (e.g. 1e12): also report days, GPU-hours and US$ to "
        "train for each plan.",
    )
    profile: Path | None = Field(None, description="Calibration profile (JSON).")
    hardware: Path | None = Field(None, description="Extra hardware spec file (YAML/JSON).")

    @field_validator("tp", "pp", mode="before")
    @classmethod
    def _degrees(cls, value: Any) -> Any:
        return _int_list(value, "2,4,8")

    @field_validator("rank_order", mode="before")
    @classmethod
    def _orders(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = tuple(x.strip() for x in value.split(",") if x.strip())
        bad = [x for x in value or () if x not in RANK_ORDERS]
        if bad:
            raise ValueError(f"unknown rank order {bad[0]!r}; allowed: {', '.join(RANK_ORDERS)}")
        return value

    @field_validator("optimizer_offload", mode="before")
    @classmethod
    def _offloads(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return tuple(float(x) for x in value.split(","))
            except ValueError:
                raise ValueError("not a comma list of shares; allowed: e.g. 0,1") from None
        return value

    @field_validator("memory_margin")
    @classmethod
    def _margin(cls, value: str) -> str:
        return _check_margin(value)


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class TrainScenario:
    """One training iteration, resolved: what :func:`run_train` simulates."""

    config: TrainConfig
    model: ModelConfig
    plan: TrainPlan
    hardware: Hardware
    framework: TrainFramework
    attn_backend: str
    attn_pattern: Pattern | None
    # with a sparsity pattern: plan.tp GPUs of the same kind, which price the dense
    # attention the pattern is scaled against (SparsityPricer)
    tp_hardware: Hardware | None = None
    # per-engine kernel-group factors fitted from whole-step traces (or none)
    composition: Composition | None = None

    def cost_model(self, num_gpus: int) -> CostModel:
        """The resolved cost model of ``num_gpus`` GPUs of this scenario's type."""
        for hw in (self.hardware, self.tp_hardware):
            if hw is not None and hw.num_gpus == num_gpus:
                return hw.cost_model
        raise ValueError(f"no hardware of {num_gpus} GPUs was resolved for this scenario")


@dataclass(frozen=True)
class PlanScenario:
    """One plan search, resolved: what :func:`run_plan` searches."""

    config: PlanConfig
    model: ModelConfig
    space: SearchSpace
    # one per GPU count searched: the job's first, then the cost objective's halvings
    hardware: tuple[Hardware, ...]


def _precisions(hardware: Hardware) -> list[str]:
    """The precisions whose tensor cores ``hardware``'s GPU has."""
    have = {d.value for d in hardware.gpu.peak_dense_tflops}
    return [p for p in PRECISIONS if COMPUTE_DTYPE[p] in have]


def resolve_train(config: TrainConfig) -> TrainScenario:
    """Model, plan, hardware (GPU, count, cluster, catalog, cost model, price), framework
    and attention of one ``simcli train`` run; bad input is one :class:`ValueError` line."""
    model = with_moe_imbalance(load_model(config.model), config.moe_imbalance)
    plan = make_plan(
        model,
        num_gpus=config.gpus,
        tp=config.tp,
        pp=config.pp,
        dp=config.dp,
        vpp=config.vpp,
        cp=config.cp,
        cp_kind=config.cp_kind,
        ep=config.ep,
        zero=config.zero,
        micro_batch=config.micro_batch,
        global_batch=config.global_batch,
        seq_len=config.seq_len,
        pp_schedule=config.pp_schedule,
        recompute=config.recompute,
        sequence_parallel=config.sequence_parallel,
        precision=config.precision,
        tp_comm=config.tp_comm,
        layer_split=config.layer_split,
        first_stage_layers=config.first_stage_layers,
        last_stage_layers=config.last_stage_layers,
        fp8_params=config.fp8_params,
        grad_reduce_dtype=config.grad_reduce_dtype,
        optimizer_offload=config.optimizer_offload,
        activation_offload=config.activation_offload,
        rank_order=config.rank_order,
        experts_impl=config.experts_impl,
    )
    if config.experts_impl != "auto" and config.framework != "pytorch":
        raise PlanError(f"--experts-impl {config.experts_impl} is transformers' eager experts; "
                        "allowed: --framework pytorch, or --experts-impl auto")  # fmt: skip
    files = {
        "profile": config.profile,
        "hardware_file": config.hardware,
        "cluster_file": config.cluster,
    }
    hardware = resolve_hardware(
        config.gpu, config.gpus, price_usd_per_gpu_hour=config.price_usd_per_gpu_hour, **files
    )
    if plan.compute_dtype == "fp8" and "fp8" not in _precisions(hardware):
        raise PlanError(
            f"--precision fp8 needs fp8 tensor cores; {config.gpu} has none; allowed: "
            f"{', '.join(_precisions(hardware))}"
        )
    # an explicit --attn-pattern, else the architecture's own sliding windows (gpt-oss, Gemma)
    pattern_text = config.attn_pattern or model.native_attn_pattern
    pattern = parse_pattern(pattern_text) if pattern_text is not None else None
    tp_hardware = None
    if pattern is not None and plan.tp != config.gpus:
        tp_hardware = resolve_hardware(config.gpu, plan.tp, **files)
    return TrainScenario(
        config=config,
        model=model,
        plan=plan,
        hardware=hardware,
        framework=config.framework,
        attn_backend=config.attn_backend,
        attn_pattern=pattern,
        tp_hardware=tp_hardware,
        composition=(
            load_composition(config.composition)
            if config.composition is not None
            else shipped_composition(config.gpu)
        ),
    )


def resolve_plan(config: PlanConfig) -> PlanScenario:
    """Model, search space and the hardware of every GPU count the search tries (with
    prices) of one ``simcli plan`` run; bad input is one :class:`ValueError` line."""
    model = with_moe_imbalance(load_model(config.model), config.moe_imbalance)
    space = SearchSpace(
        max_tp=config.max_tp,
        tp=config.tp,
        pp=config.pp,
        max_pp=config.max_pp,
        max_cp=config.max_cp,
        min_tokens_per_cp_rank=config.min_cp_tokens,
        max_micro_batch=config.max_micro_batch,
        precision=config.precision,
        optimizer_offload=config.optimizer_offload or (0.0,),
        rank_orders=config.rank_order or ("tp-cp-dp-pp",),
        fp8_params=config.fp8_params,
        grad_reduce_dtype=config.grad_reduce_dtype,
    )
    hardware = tuple(
        resolve_hardware(
            config.gpu,
            count,
            profile=config.profile,
            hardware_file=config.hardware,
            cluster_file=config.cluster,
            price_usd_per_gpu_hour=config.price_usd_per_gpu_hour,
        )
        for count in gpu_counts(config.gpus, config.objective)
    )
    if config.objective == "cost" and hardware[0].price is None:
        gpu_price(config.gpu)  # no price known: one line naming the known GPUs
    return PlanScenario(config=config, model=model, space=space, hardware=hardware)


# --------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class TrainRun:
    """The simulated iteration of a :class:`TrainScenario` and its memory estimate."""

    scenario: TrainScenario
    result: TrainResult
    memory: MemoryEstimate
    margin_bytes: float = 0.0  # --memory-margin, resolved

    def mfu_note(self) -> str | None:
        """Why an MFU above every published run on this GPU is printed (None if not)."""
        if self.result.mfu_peak_dtype not in ("bf16", "fp16"):
            return None  # published ceilings are against the bf16 peak
        return mfu_note(self.scenario.config.gpu, self.result.mfu, self.scenario.config.gpus)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``simcli train``."""
        s, res, mem = self.scenario, self.result, self.memory
        gpus, plan = s.config.gpus, s.plan
        return {
            "model": s.model.id,
            "gpu": s.config.gpu,
            "num_gpus": gpus,
            "cost_model": s.hardware.label,
            **s.hardware.provenance_fields(),
            "iteration_s": res.iteration_s,
            "tokens_per_s": res.tokens_per_s,
            "tokens_per_s_per_gpu": res.tokens_per_s / gpus,
            "mfu": res.mfu,
            "mfu_peak_dtype": res.mfu_peak_dtype,
            "mfu_note": self.mfu_note(),
            "model_tflops_per_gpu": res.model_flops / res.iteration_s / gpus / 1e12,
            "peak_memory_gib": mem.total_bytes / GIB,
            "memory_capacity_gib": mem.capacity_bytes / GIB,
            "memory_headroom_gib": (mem.capacity_bytes - mem.total_bytes) / GIB,
            "memory_margin_gib": self.margin_bytes / GIB,
            "fits": mem.total_bytes + self.margin_bytes <= mem.capacity_bytes,
            "num_microbatches": res.num_microbatches,
            "breakdown_s": res.breakdown_s,
            "memory_gib": mem.breakdown_gib(),
            "stages": res.stages,
            "plan": plan.model_dump(mode="json") | {"dp": plan.data_parallel, "sp": plan.sp},
            "attn_pattern": s.attn_pattern.spec if s.attn_pattern is not None else None,
            **so.sparsity_fields(s.config),
            **self.to_train(),
        }

    def to_train(self) -> dict[str, Any]:
        """``--train-tokens``: days, GPU-hours and US$ to train (nothing without it)."""
        c = self.scenario.config
        if c.train_tokens is None:
            return {}
        return to_train_fields(
            iteration_s=self.result.iteration_s,
            tokens_per_iteration=self.scenario.plan.tokens_per_iteration,
            num_gpus=c.gpus,
            usd_per_gpu_hour=self.scenario.hardware.usd_per_gpu_hour,
            train_tokens=c.train_tokens,
        )

    def flat(self) -> dict[str, Any]:
        """The CSV row of ``simcli train``: the object with its breakdowns as columns."""
        out = self.to_dict()
        out |= {f"breakdown_{k}": v for k, v in self.result.breakdown_s.items()}
        out |= {f"memory_{k}_gib": v for k, v in self.memory.breakdown_gib().items()}
        return out


def run_train(scenario: TrainScenario, *, keep_spans: bool = False) -> TrainRun:
    """Simulate the scenario's iteration and estimate its memory; a plan that does not fit
    is one :class:`PlanError` line unless the config says ``ignore_memory``. ``keep_spans``
    keeps the timeline (traces, report bundles)."""
    s, hw = scenario, scenario.hardware
    costs = scenario_step_costs(s)  # a sparse attention pattern, 2:4 linear layers
    # (the cost model prices the first node's NICs; the simulator scales the scale-out
    # traffic of other nodes by their bandwidth, see System.slowdown)
    result = simulate_iteration(
        s.model,
        s.plan,
        system=hw.system,
        cost_model=hw.cost_model,
        costs=costs,
        attn_backend=s.attn_backend,
        framework=s.framework,
        keep_spans=keep_spans,
        composition=s.composition,
    )
    memory = estimate_memory(s.model, s.plan, hw.gpu, framework=s.framework)
    margin = memory_margin_bytes(s.config.memory_margin, memory.capacity_bytes)
    if memory.total_bytes + margin > memory.capacity_bytes and not s.config.ignore_memory:
        raise PlanError(
            f"plan does not fit: peak {memory.total_bytes / GIB:.1f} GiB per GPU on pipeline "
            f"rank {memory.peak_stage} + margin {margin / GIB:.1f} GiB > "
            f"{memory.capacity_bytes / GIB:.1f} GiB of {s.config.gpu}; allowed: plans that "
            "fit (try --recompute selective|full, a higher --zero, more --tp/--pp, a smaller "
            "--micro-batch, --fp8-params, --grad-reduce-dtype bf16, --optimizer-offload, "
            "--activation-offload, a smaller --memory-margin) or --ignore-memory"
        )
    return TrainRun(scenario=s, result=result, memory=memory, margin_bytes=margin)


def run_plan(
    scenario: PlanScenario,
    *,
    collect: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Search the scenario's plan space: the ranked plans ``simcli plan`` prints.
    ``collect`` keeps every enumerated plan (report bundles); ``progress(done, total)``
    is told how far the search is."""
    c = scenario.config
    return search_plans(
        scenario.model,
        scenario.hardware,
        seq_len=c.seq_len,
        global_batch=c.global_batch,
        top=c.top,
        objective=c.objective,
        balance=c.balance,
        space=scenario.space,
        memory_margin_bytes=memory_margin_bytes(
            c.memory_margin, memory_capacity_bytes(scenario.hardware[0].system)
        ),
        collect=collect,
        progress=progress,
    )


def plan_records(result: SearchResult, train_tokens: float | None = None) -> list[dict]:
    """The ranked plans of ``simcli plan``; with ``train_tokens``, each one's days,
    GPU-hours and US$ to train."""
    out = []
    price = result.price_usd_per_gpu_hour
    for i, p in enumerate(result.plans):
        row = {"rank": i + 1, **p.record()}
        if train_tokens is not None:
            row |= to_train_fields(
                iteration_s=p.iteration_s,
                tokens_per_iteration=result.global_batch * result.seq_len,
                num_gpus=p.plan.num_gpus,
                usd_per_gpu_hour=None if math.isnan(price) else price,
                train_tokens=train_tokens,
            )
        out.append(row)
    return out


def plan_mfu_note(result: SearchResult, config: PlanConfig) -> str | None:
    """Why the best plan's MFU is above every published run on this GPU (None if not)."""
    if config.precision == "fp8":
        return None  # fp8 MFU is against the fp8 peak; published ceilings are bf16
    best = result.plans[0]
    return mfu_note(config.gpu, best.mfu, best.plan.num_gpus)


def plan_object(result: SearchResult, config: PlanConfig) -> dict[str, Any]:
    """The JSON object of ``simcli plan`` (and of its sweep points)."""
    return {
        **result.summary(),
        "plans": plan_records(result, config.train_tokens),
        "pareto": [p.record() for p in result.pareto],  # closed-form times
        "mfu_note": plan_mfu_note(result, config),
    }


__all__ = [
    "PlanConfig",
    "plan_mfu_note",
    "plan_object",
    "plan_records",
    "PlanScenario",
    "TrainConfig",
    "TrainRun",
    "TrainScenario",
    "parse_int_list",
    "resolve_plan",
    "resolve_train",
    "run_plan",
    "run_train",
]
