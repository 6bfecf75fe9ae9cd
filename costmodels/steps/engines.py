"""Engine profiles: what a real serving engine does around its GPU kernels.

simcli's step model prices an engine's kernels (:mod:`costmodels.steps.serving`); an
engine also chooses those kernels per GPU architecture, replays some steps from CUDA graphs
(padding the batch up to a captured size) and launches the others from the host, spends host
time on every iteration (scheduling, input preparation, sampling, output processing, which
some engines overlap with the GPU) and on every request in its API server, and ships
defaults (token budget, batch limit, KV block, scheduler). An :class:`EngineProfile` holds
all of that for one engine and version family, read from ``costmodels/data/engines/<id>.yaml``;
every number there names its source (``sources``, as :mod:`hardware_specs.schema` does) and
``docs/engines.md`` lists them.

:data:`ENGINE_IDS` is the one registry of engine ids (the CLI's ``--engine`` choices come
from it). :func:`load_engine` returns a profile; its methods answer the step model's and the
scenario's questions (kernels on an architecture, capture sizes, defaults on a GPU, host
seconds of an iteration, the API server's seconds per request).
"""

from __future__ import annotations

from bisect import bisect_left
from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "engines"
#: the engine ids shipped, one YAML file each (sorted; ``vllm`` is vLLM V1)
ENGINE_IDS: tuple[str, ...] = tuple(sorted(p.stem for p in DATA_DIR.glob("*.yaml")))
#: the type of an engine id field (``--engine``): one of :data:`ENGINE_IDS`
EngineId = Literal[ENGINE_IDS]  # type: ignore[valid-type]
#: architectures a kernel table may name (hardware_specs.schema.GpuSpec.architecture)
ARCHITECTURES = ("ampere", "ada", "hopper", "blackwell", "cdna3")
#: the op cost model's attention backends (costmodels/profiles/*.json: attention.backends)
OP_BACKENDS = ("flash", "cudnn", "efficient", "flex", "flashinfer")


class EngineError(ValueError):
    """An engine id or profile file that cannot be used; the message is one line."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Sourced(_Spec):
    """A part of a profile whose every number (and list of numbers) names its source."""

    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _sources_name_fields(self) -> _Sourced:
        unknown = set(self.sources) - set(type(self).model_fields)
        if unknown:
            raise ValueError(f"sources name unknown fields: {sorted(unknown)}")
        return self

    def unsourced_numbers(self) -> list[str]:
        """Numeric fields (numbers, lists of numbers) set in the file without a source."""
        out = []
        for name in type(self).model_fields:
            if name == "sources" or name not in self.model_fields_set:
                continue
            v = getattr(self, name)
            numeric = isinstance(v, int | float) and not isinstance(v, bool)
            numeric = numeric or (isinstance(v, tuple | list) and any(
                isinstance(x, int | float) for x in v))  # fmt: skip
            if numeric and name not in self.sources:
                out.append(name)
        return out


class Kernels(_Sourced):
    """The attention kernels an engine dispatches to on one GPU architecture, and the op
    cost model's backend that prices each (``*_backend``: one field, so a newly calibrated
    backend is a one-line data change)."""

    prefill_kernel: str = Field(description="what the engine runs for prefill attention")
    decode_kernel: str = Field(description="what the engine runs for paged decode attention")
    prefill_backend: Literal[OP_BACKENDS] = Field(description="op backend that prices it")  # type: ignore[valid-type]
    decode_backend: Literal[OP_BACKENDS] = Field(description="op backend that prices it")  # type: ignore[valid-type]
    decode_kv_reads: Literal["per_kv_head", "per_query_head"] = Field(
        "per_kv_head",
        description="how often decode attention reads a KV head: once for its query group "
        "(GQA-aware kernels), or once per query head (a kernel with one thread block per "
        "query head, e.g. TensorRT-LLM's masked MHA before XQA): priced as that many heads",
    )


class CudaGraphs(_Sourced):
    """Which steps replay CUDA graphs. ``decode``: decode-only batches; ``mixed``: batches
    with prefill tokens. ``full``: the whole forward in one graph; ``piecewise``: every
    kernel but attention in graphs (attention launched from the host between the pieces);
    ``none``: every kernel launched from the host. ``capture_sizes``: the token counts
    captured (a batch is padded up to the next one; above the largest it runs eagerly);
    ``exact``: a graph per batch size, no padding (our measured eager engine). The largest
    size is capped per GPU tier (:class:`Tier`) and by ``max_capture_per_seq`` x
    max_num_seqs when set."""

    decode: Literal["full", "piecewise", "none"]
    mixed: Literal["piecewise", "none"]
    capture_sizes: tuple[int, ...] = ()
    exact: bool = False
    max_capture_per_seq: int | None = Field(None, gt=0)


class HostWork(_Sourced):
    """Host seconds of one iteration, ``per_step_s + per_seq_s * seqs + per_token_s *
    tokens`` (scheduler, input preparation, sampling, output processing), serial with the
    GPU or hidden behind it (``overlap``: the iteration costs ``max(gpu, host)``).
    ``launch_s_per_kernel``: host seconds per kernel launched outside CUDA graphs (its
    launch-bound floor, ``kernels x launch_s_per_kernel``; 0 where launches keep up with
    the GPU's own per-kernel floor)."""

    per_step_s: float = Field(0.0, ge=0)
    per_seq_s: float = Field(0.0, ge=0)
    per_token_s: float = Field(0.0, ge=0)
    overlap: bool = False
    launch_s_per_kernel: float = Field(0.0, ge=0)

    def step_s(self, num_seqs: int, num_tokens: int) -> float:
        """Host seconds of an iteration of ``num_seqs`` sequences and ``num_tokens`` tokens."""
        return self.per_step_s + self.per_seq_s * num_seqs + self.per_token_s * num_tokens


class Frontend(_Sourced):
    """The API server's work per request: HTTP and request handling, tokenising the
    prompt, detokenising and streaming each output token; ``in_engine_process``: whether it
    shares the engine's process (and its GIL) or runs in its own. ``None``: no public
    figure (not priced)."""

    per_request_s: float | None = Field(None, ge=0)
    per_prompt_token_s: float | None = Field(None, ge=0)
    per_output_token_s: float | None = Field(None, ge=0)
    in_engine_process: bool


class Tier(_Sourced):
    """Defaults that depend on the GPU: the first tier whose bounds hold applies
    (``min_memory_gib`` <= memory < ``max_memory_gib``, no id prefix in ``exclude_gpus``,
    tp >= ``min_tp``)."""

    min_memory_gib: float = 0.0
    max_memory_gib: float | None = None
    exclude_gpus: tuple[str, ...] = ()
    min_tp: int = 1
    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    cuda_graph_max_bs: int | None = Field(None, gt=0)

    def holds(self, gpu_id: str, memory_gib: float, tp: int) -> bool:
        return (
            memory_gib >= self.min_memory_gib
            and (self.max_memory_gib is None or memory_gib < self.max_memory_gib)
            and not any(gpu_id.startswith(p) for p in self.exclude_gpus)
            and tp >= self.min_tp
        )


class Defaults(_Sourced):
    """What the engine runs with when the user does not say. ``scheduler``: the policy the
    simulator should use for this engine (``vllm`` = V0 prefill-first, ``sarathi`` = a
    chunked decode-first token budget, ``vllm-v1``, ``sglang``, ``trtllm`` = reserve the
    whole sequence, GUARANTEED_NO_EVICT): one of the simulator's scheduler kinds
    (``simcli.serving.schedulers``; a test checks each profile's)."""

    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_num_seqs: int = Field(gt=0)
    block_size: int = Field(gt=0)
    chunked_prefill: bool
    preemption: Literal["recompute", "swap", "none"]
    scheduler: str
    # what the KV-cache memory fraction (--gpu-memory-utilization) is a fraction of: the
    # GPU's total memory, from which the engine's other memory is then taken (vLLM's
    # gpu_memory_utilization, SGLang's mem_fraction_static), or the memory left free
    # after weights, activations and runtime (TensorRT-LLM's free_gpu_memory_fraction)
    memory_fraction_of: Literal["total", "free"] = "total"
    tiers: tuple[Tier, ...] = ()


class EngineDefaults(_Spec):
    """An engine's defaults resolved for one GPU and TP degree."""

    max_num_batched_tokens: int | None
    max_num_seqs: int
    block_size: int
    chunked_prefill: bool
    preemption: str
    scheduler: str
    cuda_graph_max_bs: int | None


class EngineProfile(_Spec):
    """One engine and version family (see the module docstring)."""

    id: str
    name: str
    version_family: str
    decompose: Literal["vllm", "pytorch-eager"] = Field(
        description="kernels of a layer (workloads.decompose.engines): fused or eager"
    )
    kernels: dict[str, Kernels] = Field(description="architecture (or 'default') -> kernels")
    cuda_graphs: CudaGraphs
    host: HostWork
    frontend: Frontend
    defaults: Defaults
    notes: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> EngineProfile:
        bad = sorted(set(self.kernels) - set(ARCHITECTURES) - {"default"})
        if bad:
            raise ValueError(f"kernels for unknown architecture {bad[0]!r}")
        if "default" not in self.kernels:
            raise ValueError("kernels need a 'default' entry")
        sizes = self.cuda_graphs.capture_sizes
        if list(sizes) != sorted(set(sizes)) or any(s < 1 for s in sizes):
            raise ValueError("cuda_graphs.capture_sizes must be increasing positive integers")
        return self

    def parts(self) -> list[tuple[str, _Sourced]]:
        """Every sourced part, by its place in the file (for the source check)."""
        out: list[tuple[str, _Sourced]] = [(f"kernels.{a}", k) for a, k in self.kernels.items()]
        out += [("cuda_graphs", self.cuda_graphs), ("host", self.host),
                ("frontend", self.frontend), ("defaults", self.defaults)]  # fmt: skip
        out += [(f"defaults.tiers[{i}]", t) for i, t in enumerate(self.defaults.tiers)]
        return out

    def unsourced_numbers(self) -> list[str]:
        return [f"{where}.{n}" for where, p in self.parts() for n in p.unsourced_numbers()]

    # --- what the step model and the scenario ask ---------------------------------------
    def kernels_for(self, architecture: str) -> Kernels:
        """The attention kernels on ``architecture`` (its entry, else ``default``)."""
        return self.kernels.get(architecture, self.kernels["default"])

    def tier(self, gpu_id: str, memory_gib: float, tp: int = 1) -> Tier | None:
        return next((t for t in self.defaults.tiers if t.holds(gpu_id, memory_gib, tp)), None)

    def defaults_for(self, gpu_id: str, memory_gib: float, tp: int = 1) -> EngineDefaults:
        """The defaults on ``tp`` GPUs ``gpu_id`` of ``memory_gib`` each."""
        d, t = self.defaults, self.tier(gpu_id, memory_gib, tp)

        def pick(name: str) -> int | None:
            tier_value = getattr(t, name) if t is not None else None
            return tier_value if tier_value else getattr(d, name, None)

        return EngineDefaults(
            max_num_batched_tokens=pick("max_num_batched_tokens"),
            max_num_seqs=pick("max_num_seqs"),
            block_size=d.block_size,
            chunked_prefill=d.chunked_prefill,
            preemption=d.preemption,
            scheduler=d.scheduler,
            cuda_graph_max_bs=t.cuda_graph_max_bs if t is not None else None,
        )

    def capture_sizes(
        self,
        gpu_id: str = "",
        memory_gib: float = 0.0,
        tp: int = 1,
        max_num_seqs: int | None = None,
    ) -> tuple[int, ...]:
        """The batch (token) sizes captured as CUDA graphs on this GPU: the engine's list up
        to its cap on the GPU's tier and ``max_capture_per_seq`` x ``max_num_seqs``."""
        g = self.cuda_graphs
        sizes = g.capture_sizes
        cap = self.defaults_for(gpu_id, memory_gib, tp).cuda_graph_max_bs
        if g.max_capture_per_seq is not None and max_num_seqs is not None:
            per = g.max_capture_per_seq * max_num_seqs
            cap = per if cap is None else min(cap, per)
        if cap is not None:
            sizes = tuple(s for s in sizes if s <= cap)
        return sizes

    def frontend_ingress_s(self, prompt_tokens: int) -> float:
        """API-server seconds before a request reaches the engine: request handling and
        tokenising ``prompt_tokens`` (unknown parts count 0)."""
        f = self.frontend
        return (f.per_request_s or 0.0) + (f.per_prompt_token_s or 0.0) * prompt_tokens

    def frontend_egress_s(self, output_tokens: int = 1) -> float:
        """API-server seconds to detokenise and stream ``output_tokens`` tokens."""
        return (self.frontend.per_output_token_s or 0.0) * output_tokens

    def combine_s(self, gpu_s: float, host_s: float) -> float:
        """An iteration's price: ``gpu + host`` (serial) or ``max(gpu, host)`` (overlapped)."""
        return max(gpu_s, host_s) if self.host.overlap else gpu_s + host_s


def padded_size(sizes: tuple[int, ...] | list[int], n: int) -> int | None:
    """The smallest captured size >= ``n`` (None above the largest)."""
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


@cache
def load_engine(engine_id: str) -> EngineProfile:
    """The shipped profile of ``engine_id``; one line naming the allowed ids otherwise."""
    if engine_id not in ENGINE_IDS:
        raise EngineError(f"unknown engine {engine_id!r}; allowed: {', '.join(ENGINE_IDS)}")
    path = DATA_DIR / f"{engine_id}.yaml"
    try:
        profile = EngineProfile.model_validate(yaml.safe_load(path.read_text()))
    except (ValidationError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()
        raise EngineError(f"engine profile {path}: {' '.join(first[:3])}") from None
    if profile.id != engine_id:
        raise EngineError(f"engine profile {path} has id {profile.id!r}; allowed: {engine_id!r}")
    return profile


__all__ = [
    "ENGINE_IDS",
    "EngineId",
    "EngineDefaults",
    "EngineError",
    "EngineProfile",
    "load_engine",
    "padded_size",
]
