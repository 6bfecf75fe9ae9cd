"""``simcli trace import``: a profiler trace of a real step against simcli's prediction.

The workload the trace ran is stated in a config file (YAML or JSON), :class:`TraceConfig`:
what kind of step (``train``, ``prefill``, ``decode``), the model, GPU, engine, precision
and shapes, and how the trace marks steps and phases. :func:`resolve_trace` reads and
checks it once and resolves the model, the hardware (with its cost model,
:func:`~simcli.scenario.hardware.resolve_hardware`) and the workload;
:func:`run_trace` reads the trace, splits its GPU timeline into steps, classes and gaps
(:mod:`calibrate.trace`), prices the same workload through simcli's one decomposition and
returns both side by side. The predicted step is what ``simcli train`` simulates (one
iteration of the plan) or what ``simcli step`` prices (one engine iteration).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from calibrate.trace import (
    GAP_KINDS,
    ServingWorkload,
    TraceComparison,
    TrainWorkload,
    build_timeline,
    compare,
    load_trace,
    predict_serving,
    predict_train,
)
from calibrate.trace.fit import TracedStep, group_sums
from costmodels.steps.composition import shipped_composition
from simcli.scenario.hardware import Hardware, resolve_hardware
from simcli.training.simulator import simulate_iteration
from workloads.decompose.training import Framework
from workloads.models import ModelConfig, load_model
from workloads.plan import PRECISIONS, Recompute, make_plan

Kind = Literal["train", "prefill", "decode"]
Engine = Literal["megatron", "megatron-unfused", "pytorch-eager", "pytorch-compile", "vllm"]
PhaseName = Literal["forward", "backward", "optimizer"]
ENGINES_FOR: dict[str, tuple[str, ...]] = {
    "train": ("megatron", "megatron-unfused", "pytorch-eager", "pytorch-compile"),
    "prefill": ("vllm", "pytorch-eager"),
    "decode": ("vllm", "pytorch-eager"),
}
SERVING_PRECISIONS = ("bf16", "fp16")
# the step-model framework name of each training engine (workloads.decompose.engines)
FRAMEWORK: dict[str, Framework] = {
    "megatron": "megatron",
    "megatron-unfused": "megatron-unfused",
    "pytorch-eager": "pytorch",
    "pytorch-compile": "pytorch-compile",
}
TRAIN_ONLY = ("micro_batch", "global_batch", "seq_len", "recompute", "pp", "pp_rank", "dp",
              "zero", "sequence_parallel")  # fmt: skip
SERVING_ONLY = ("batch", "prompt_len", "context_len", "cuda_graphs")


class TraceConfigError(ValueError):
    """A trace config that cannot describe the traced workload; one line."""


class TraceConfig(BaseModel):
    """The workload a profiler trace ran (``--config FILE``, YAML or JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Kind = Field(description="train (one optimizer step) | prefill | decode")
    model: str = Field(description="Built-in model id or a HuggingFace-style config.json path.")
    gpu: str | None = Field(None, description="GPU id (see `simcli specs list`); or --gpu.")
    engine: Engine = Field(
        description="Software that ran the step: megatron | megatron-unfused | pytorch-eager "
        "| pytorch-compile (train); vllm | pytorch-eager (prefill, decode)."
    )
    precision: str | None = Field(
        None,
        description="train: bf16-mixed (default) | fp16-mixed | bf16 | fp8; serving: bf16 "
        "(default) | fp16.",
    )
    attn_backend: str = Field("", description="Attention kernels: flash | cudnn | efficient.")
    # train
    micro_batch: int = Field(1, ge=1, description="train: sequences per micro-batch.")
    global_batch: int | None = Field(
        None, ge=1, description="train: sequences per step; default micro_batch * dp."
    )
    seq_len: int | None = Field(None, ge=1, description="train: tokens per sequence.")
    recompute: Recompute = Field("none", description="train: activation recomputation.")
    tp: int = Field(1, ge=1, description="Tensor-parallel degree.")
    pp: int = Field(1, ge=1, description="train: pipeline stages.")
    pp_rank: int = Field(0, ge=0, description="train: the pipeline rank the trace is of.")
    dp: int = Field(1, ge=1, description="train: data-parallel degree.")
    zero: Literal[0, 1, 2, 3] = Field(0, description="train: ZeRO stage (3 = FSDP).")
    sequence_parallel: bool | None = Field(
        None, description="train: Megatron sequence parallelism; default on when tp > 1."
    )
    # serving
    batch: int | None = Field(None, ge=1, description="prefill/decode: sequences in the step.")
    prompt_len: int | None = Field(None, ge=1, description="prefill: prompt tokens per sequence.")
    context_len: int | None = Field(
        None, ge=0, description="decode: tokens already cached per sequence."
    )
    cuda_graphs: bool | None = Field(
        None,
        description="pytorch-eager decode: replayed from a CUDA graph (default) or launched "
        "eagerly (false).",
    )
    # the trace
    step_ms: float | None = Field(
        None,
        gt=0,
        description="Untraced step time in ms, when measured (the profiler slows the host, "
        "so a fitted host time per op is the profiled one without it).",
    )
    step_marker: str | None = Field(
        None,
        description="Annotation that delimits one step (NAME or NAME#N); default torch's "
        "ProfilerStep#N; none in the trace: the whole trace is one step.",
    )
    phase_markers: dict[PhaseName, str] = Field(
        default_factory=dict,
        description="record_function names of the phases, e.g. {forward: forward, backward: "
        "backward, optimizer: optimizer}: per-phase totals when the trace has them.",
    )

    @model_validator(mode="after")
    def _kind_fields(self) -> TraceConfig:
        allowed = ENGINES_FOR[self.kind]
        if self.engine not in allowed:
            raise ValueError(
                f"engine {self.engine!r} does not run kind {self.kind}; allowed: "
                f"{', '.join(allowed)}"
            )
        other = SERVING_ONLY if self.kind == "train" else TRAIN_ONLY
        stray = [f for f in other if f in self.model_fields_set]
        if self.kind == "prefill" and "context_len" in self.model_fields_set:
            stray.append("context_len")
        if self.kind == "decode" and "prompt_len" in self.model_fields_set:
            stray.append("prompt_len")
        if stray:
            raise ValueError(f"{', '.join(stray)}: not used by kind {self.kind}; remove them")
        needs = {"train": ("seq_len",), "prefill": ("batch", "prompt_len"),
                 "decode": ("batch", "context_len")}[self.kind]  # fmt: skip
        missing = [f for f in needs if getattr(self, f) is None]
        if missing:
            raise ValueError(f"kind {self.kind} needs {', '.join(missing)}")
        precisions = PRECISIONS if self.kind == "train" else SERVING_PRECISIONS
        if self.precision is not None and self.precision not in precisions:
            raise ValueError(
                f"precision {self.precision!r} for kind {self.kind}; allowed: "
                f"{', '.join(precisions)}"
            )
        if self.pp_rank >= self.pp:
            raise ValueError(f"pp_rank {self.pp_rank} >= pp {self.pp}; allowed: 0..{self.pp - 1}")
        return self

    @property
    def resolved_precision(self) -> str:
        return self.precision or ("bf16-mixed" if self.kind == "train" else "bf16")


def _one_line(exc: ValidationError, where: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg += f"; allowed: {', '.join(TraceConfig.model_fields)}"
    elif err["type"] == "missing":
        msg = "missing (required)"
    got = err.get("input")
    shown = (
        f" (got {got!r})" if loc and err["type"] != "missing" and not isinstance(got, dict) else ""
    )
    return f"{where}: {loc + ': ' if loc else ''}{msg}{shown}"


def load_trace_config(path: str | Path) -> TraceConfig:
    """Read and check a trace config; every problem is one :class:`TraceConfigError` line
    naming the file (or an OSError for a missing file)."""
    path = Path(path)
    if not path.is_file():
        raise OSError(f"config {path} does not exist")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise TraceConfigError(f"config {path} is not valid YAML/JSON: {first}") from None
    if not isinstance(data, dict):
        raise TraceConfigError(
            f"config {path}: expected a mapping of fields (kind, model, engine, ...), got "
            f"{type(data).__name__}"
        )
    try:
        return TraceConfig.model_validate(data)
    except ValidationError as exc:
        raise TraceConfigError(_one_line(exc, f"config {path}")) from None


def _model(config: TraceConfig, config_path: Path) -> ModelConfig:
    """The config's model: an id, or a config.json path (relative to the working folder
    or, failing that, to the config file's folder)."""
    name = config.model
    beside = config_path.parent / name
    if not Path(name).exists() and (name.endswith(".json") or "/" in name) and beside.exists():
        return load_model(str(beside))
    return load_model(name)


# --------------------------------------------------------------------------- scenario


@dataclass(frozen=True)
class TraceScenario:
    """``simcli trace import`` resolved: what :func:`run_trace` reads and prices."""

    config: TraceConfig
    config_path: Path
    trace_path: Path
    model: ModelConfig
    hardware: Hardware
    workload: TrainWorkload | ServingWorkload

    @property
    def title(self) -> str:
        c = self.config
        return f"{self.model.id} {c.kind} step on {self.hardware.gpu_id} ({c.engine})"


def resolve_trace(
    trace: str | Path,
    config_path: str | Path,
    *,
    gpu: str | None = None,
    profile: str | Path | None = None,
) -> TraceScenario:
    """Config, model, hardware and workload of one ``simcli trace import``; bad input is
    one ValueError/OSError line, before the (possibly large) trace is read."""
    trace, config_path = Path(trace), Path(config_path)
    if not trace.is_file():
        raise OSError(f"trace {trace} does not exist")
    config = load_trace_config(config_path)
    gpu_id = gpu or config.gpu
    if gpu_id is None:
        raise TraceConfigError(f"config {config_path}: no gpu; allowed: gpu in the config or --gpu")
    model = _model(config, config_path)
    workload: TrainWorkload | ServingWorkload
    if config.kind == "train":
        gpus = config.tp * config.pp * config.dp
        plan = make_plan(
            model,
            num_gpus=gpus,
            tp=config.tp,
            pp=config.pp,
            dp=config.dp,
            zero=config.zero,
            micro_batch=config.micro_batch,
            global_batch=config.global_batch or config.micro_batch * config.dp,
            seq_len=config.seq_len,
            recompute=config.recompute,
            sequence_parallel=config.sequence_parallel,
            precision=config.resolved_precision,
        )
        hardware = resolve_hardware(gpu_id, gpus, profile=profile)
        workload = TrainWorkload(
            model=model,
            plan=plan,
            framework=FRAMEWORK[config.engine],
            attn_backend=config.attn_backend,
            pp_rank=config.pp_rank,
        )
    else:
        hardware = resolve_hardware(gpu_id, config.tp, profile=profile)
        length = config.prompt_len if config.kind == "prefill" else config.context_len
        workload = ServingWorkload(
            model=model,
            phase="prefill" if config.kind == "prefill" else "decode",
            batch=config.batch or 1,
            length=int(length or 0),
            tp=config.tp,
            engine=config.engine,
            attn_backend=config.attn_backend or None,
            dtype=config.resolved_precision,
            cuda_graphs=config.cuda_graphs,
        )
    return TraceScenario(config, config_path, trace, model, hardware, workload)


# --------------------------------------------------------------------------- run


def _ms(value: float) -> float:
    return value * 1e3


def _records(frame: Any, seconds: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows of a frame with its ``*_s`` columns in milliseconds (``*_ms``)."""
    out = frame.copy()
    for col in seconds:
        out[col] = out[col] * 1e3
    out = out.rename(columns={col: col.removesuffix("_s") + "_ms" for col in seconds})
    return [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        for r in out.to_dict(orient="records")
    ]


@dataclass(frozen=True)
class TraceRun:
    """The comparison of one :class:`TraceScenario` (seconds inside, ms in its outputs)."""

    scenario: TraceScenario
    result: TraceComparison

    def class_records(self) -> list[dict[str, Any]]:
        """One row per op class: predicted and measured ms per step and the error."""
        cols = ["op_class", "label", "predicted_s", "measured_s", "error", "kernels_per_step"]
        return _records(self.result.classes[cols], ("predicted_s", "measured_s"))

    def unmatched_records(self) -> list[dict[str, Any]]:
        return _records(self.result.unmatched, ("measured_s",))

    def phase_records(self) -> list[dict[str, Any]]:
        cols = ("predicted_s", "measured_kernel_s", "measured_span_s")
        return _records(self.result.phases, cols)

    def step_records(self) -> list[dict[str, Any]]:
        frame = self.result.steps
        return _records(frame, tuple(c for c in frame.columns if c.endswith("_s")))

    def kernel_records(self, top: int | None = None) -> list[dict[str, Any]]:
        frame = self.result.kernels if top is None else self.result.kernels.head(top)
        return _records(frame, ("measured_s",))

    def gaps_ms(self) -> dict[str, float]:
        return {f"{k}_ms": _ms(v) for k, v in self.result.gaps_s().items()}

    def summary(self) -> dict[str, Any]:
        """The scalar fields of :meth:`to_dict` (table and CSV summaries)."""
        s, r, tl = self.scenario, self.result, self.result.timeline
        host = r.prediction.host_stall_s
        classes = r.classes
        return {
            "trace": str(s.trace_path),
            "kind": s.config.kind,
            "model": s.model.id,
            "gpu": s.hardware.gpu_id,
            "engine": s.config.engine,
            "cost_model": s.hardware.label,
            "device": tl.device,
            "steps_in_trace": len(tl.steps),
            "step_source": tl.step_source,
            "step_measured_ms": _ms(r.step_measured_s),
            "step_predicted_ms": _ms(r.step_predicted_s),
            "step_error": r.step_error,
            "kernel_measured_ms": _ms(float(classes["measured_s"].sum())),
            "kernel_predicted_ms": _ms(float(classes["predicted_s"].sum())),
            "gpu_busy_ms": _ms(tl.mean("busy_s")),
            "compute_ms": _ms(tl.mean("compute_s")),
            "comm_ms": _ms(tl.mean("comm_s")),
            "comm_overlapped_ms": _ms(tl.mean("comm_overlapped_s")),
            "host_stall_predicted_ms": None if host is None else _ms(host),
            "unmatched_kernels": int(r.unmatched["count"].sum()),
            "unmatched_ms": _ms(float(r.unmatched["measured_s"].sum())),
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``simcli trace import --format json``."""
        out = self.summary()
        out |= {
            "gaps": self.gaps_ms(),
            "classes": self.class_records(),
            "phases": self.phase_records(),
            "unmatched": self.unmatched_records(),
            "steps": self.step_records(),
            "top_kernels": self.kernel_records(top=20),
            "workload": self.scenario.config.model_dump(mode="json", exclude_defaults=True),
            "warnings": list(self.result.warnings),
        }
        return out


def run_trace(scenario: TraceScenario) -> TraceRun:
    """Read the trace, measure it, price the workload and compare (module docstring)."""
    s, hw, c = scenario, scenario.hardware, scenario.config
    trace = load_trace(s.trace_path)
    timeline = build_timeline(trace, step_marker=c.step_marker, phase_markers=c.phase_markers)
    w = s.workload
    if isinstance(w, TrainWorkload):
        comp = shipped_composition(hw.gpu_id)  # as `simcli train` prices the step
        prediction = predict_train(w, hw.cost_model, hw.system, comp)
        step_s = simulate_iteration(
            w.model,
            w.plan,
            system=hw.system,
            cost_model=hw.cost_model,
            attn_backend=w.attn_backend,
            framework=w.framework,
            composition=comp,
        ).iteration_s
    else:
        prediction = predict_serving(w, hw.cost_model, hw.gpu_id)
        step_s = prediction.step_s
    result = compare(timeline, prediction, step_predicted_s=step_s, phase_markers=c.phase_markers)
    return TraceRun(scenario, result)


def traced_step(
    trace: str | Path, config_path: str | Path, *, gpu: str | None = None
) -> TracedStep:
    """One training trace measured and priced without composition, by kernel group: an
    input of :func:`calibrate.trace.fit.fit_suite` (``simcli calibrate from-trace``)."""
    s = resolve_trace(trace, config_path, gpu=gpu)
    w, c = s.workload, s.config
    if not isinstance(w, TrainWorkload):
        raise TraceConfigError(
            f"config {s.config_path}: kind {c.kind}; allowed: train (composition factors are "
            "fitted from training steps)"
        )
    timeline = build_timeline(
        load_trace(s.trace_path), step_marker=c.step_marker, phase_markers=c.phase_markers
    )
    result = compare(timeline, predict_train(w, s.hardware.cost_model, s.hardware.system))
    label = f"{s.trace_path.name}"
    return TracedStep(
        w.framework,
        s.model.id,
        label,
        group_sums(result.classes, "measured_s"),
        group_sums(result.classes, "predicted_s"),
        step_s=c.step_ms / 1e3 if c.step_ms is not None else timeline.wall_s,
        ops=result.prediction.host_ops,
    )


__all__ = [
    "GAP_KINDS",
    "TraceConfig",
    "TraceConfigError",
    "TraceRun",
    "TraceScenario",
    "load_trace_config",
    "resolve_trace",
    "run_trace",
    "traced_step",
]
