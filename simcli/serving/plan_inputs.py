"""Inputs of the serving capacity planner (``simcli serve plan``): the SLO, the workload,
the space of deployments searched, and one candidate of that space.

Prefill:decode ratios split a replica count exactly as ``simcli serve --disaggregate
--pd-ratio P:D --replicas R`` does (:func:`split_replicas`, used by both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from costmodels.steps.engines import EngineId
from simcli.serving.policy import SchedulerKind
from simcli.serving.requests import SyntheticSpec
from workloads.lengths import joint_dataset, parse_dist
from workloads.sparsity import parse_pattern

DEFAULT_GPUS = ("h100-sxm", "h200-sxm", "a100-sxm-80gb")


class PlanError(ValueError):
    """A planning input or outcome for users; the message is one line."""


# --------------------------------------------------------------------------- inputs


class SLO(BaseModel):
    """Per-request latency thresholds and the fraction of requests that must meet all."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_s: float | None = Field(default=None, gt=0, description="time to first token")
    tpot_s: float | None = Field(default=None, gt=0, description="time per output token")
    e2e_s: float | None = Field(default=None, gt=0, description="end-to-end latency")
    attainment: float = Field(default=0.9, gt=0, le=1, description="fraction meeting all")

    @model_validator(mode="after")
    def _some_threshold(self) -> SLO:
        if self.ttft_s is None and self.tpot_s is None and self.e2e_s is None:
            raise ValueError(
                "no SLO given; allowed: at least one of --slo-ttft-s, --slo-tpot-s, --slo-e2e-s"
            )
        return self

    def limits(self, slack: float = 1.0) -> tuple[float, float, float]:
        inf = math.inf
        return (
            self.ttft_s * slack if self.ttft_s is not None else inf,
            self.tpot_s * slack if self.tpot_s is not None else inf,
            self.e2e_s * slack if self.e2e_s is not None else inf,
        )

    def max_misses(self, n: int) -> int:
        """Requests that may miss the SLO out of ``n`` while the attainment still holds."""
        return n - math.ceil(self.attainment * n - 1e-9)

    @property
    def percentile(self) -> str:
        """The percentile the limits are targets of: ``p90`` for attainment 0.9, ``p99.9``
        for 0.999 (the fraction of requests that must meet every limit)."""
        return f"p{round(self.attainment * 100, 6):g}"

    def at_percentile(self, values: Sequence[float]) -> float:
        """The statistic a limit is judged on: the ``ceil(attainment x n)``-th smallest of
        the ``n`` requests' values (nearest rank), so that it is within the limit exactly
        when enough requests meet that limit."""
        n = len(values)
        if not n:
            return math.nan
        k = math.ceil(self.attainment * n - 1e-9)
        return float(np.partition(np.asarray(values, dtype=np.float64), k - 1)[k - 1])

    def text(self) -> str:
        """``TTFT <= 0.5 s and TPOT <= 0.03 s for 90% of requests (p90 targets)``."""
        names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
        parts = [f"{names[k]} <= {v:g} s" for k, v in self.judged().items()]
        share = f"{round(self.attainment * 100, 6):g}%"
        return f"{' and '.join(parts)} for {share} of requests ({self.percentile} targets)"

    def judged(self) -> dict[str, float]:
        """The limits given (metric -> seconds), in the order ttft, tpot, e2e."""
        pairs = (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s), ("e2e_s", self.e2e_s))
        return {k: v for k, v in pairs if v is not None}


class Workload(BaseModel):
    """Synthetic Poisson/gamma arrivals at the target rate (``simcli serve``'s generator)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    qps: float = Field(gt=0, description="target arrival rate, requests per second")
    prompt_len: str = Field(default="lognormal:512:1:4096", description="prompt length DIST")
    output_len: str = Field(default="lognormal:128:1:2048", description="output length DIST")
    num_requests: int = Field(default=1000, gt=0, description="requests simulated per probe")
    burstiness: float = Field(default=1.0, gt=0, description="CV of inter-arrival gaps")
    seed: int = 0
    max_concurrency: int | None = Field(
        default=None,
        gt=0,
        description="closed loop: at most this many requests in flight (simcli.serving.load)",
    )
    images_per_request: int = Field(default=0, ge=0, description="images per request")
    image_size: str = Field(default="1024x1024", description="pixels per image, WxH")

    @field_validator("prompt_len", "output_len")
    @classmethod
    def _dist(cls, v: str) -> str:
        parse_dist(v)  # one-line LengthError for a bad DIST
        return v

    def spec(self) -> SyntheticSpec:
        return SyntheticSpec(
            qps=self.qps,
            num_requests=self.num_requests,
            burstiness=self.burstiness,
            prompt_len=parse_dist(self.prompt_len),
            output_len=parse_dist(self.output_len, "output"),
            joint=joint_dataset(self.prompt_len, self.output_len),
            seed=self.seed,
        )


class PlanSpace(BaseModel):
    """The deployments searched. ``chunk_sizes`` apply to ``sarathi`` only (its token
    budget per iteration); ``vllm`` and ``orca`` are one config each per (gpu, tp)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: tuple[str, ...] = DEFAULT_GPUS
    tp: tuple[int, ...] = (1, 2, 4)
    schedulers: tuple[SchedulerKind, ...] = ("vllm", "sarathi")
    chunk_sizes: tuple[int, ...] = (512, 2048)
    pd_ratios: tuple[str | None, ...] = Field(
        default=(None, "1:1", "1:2"),
        description="None: prefill and decode on every replica; 'P:D': disaggregated pools "
        "splitting the replicas P:D (as `simcli serve --disaggregate --pd-ratio`)",
    )
    prefill_gpus: tuple[str, ...] | None = Field(
        default=None,
        description="per-pool search (Splitwise's heterogeneous pools): GPU ids of the "
        "prefill pool of the disaggregated configs (None: gpus, or no per-pool search)",
    )
    decode_gpus: tuple[str, ...] | None = Field(
        default=None,
        description="per-pool search: GPU ids of the decode pool (None: gpus, or no per-pool "
        "search)",
    )
    max_replicas: int = Field(default=64, gt=0)
    max_batch_size: int | None = Field(
        default=None, gt=0, description="running sequences per replica (None: the engine's)"
    )
    block_size: int | None = Field(default=None, gt=0, description="None: the engine's")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    engine: EngineId = Field(default="vllm", description="engine profile of every deployment")
    attn_backend: str | None = Field(
        default=None, description="attention op backend (None: the engine's per GPU)"
    )
    hardware: Path | None = Field(default=None, description="extra hardware spec file")
    weight_dtype: Literal["bf16", "fp16", "fp8", "int8", "int4", "mxfp4"] = Field(
        default="bf16", description="weight precision (workloads.decompose.quant)"
    )
    kv_cache_dtype: Literal["auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="auto", description="KV-cache element type (auto: the activation dtype)"
    )
    prices: dict[str, float] = Field(
        default_factory=dict, description="US$ per GPU-hour overrides by GPU id; '*' for all"
    )
    attn_pattern: str | None = Field(
        default=None,
        description="sparse attention pattern of every deployment (`simcli serve "
        "--attn-pattern`): its decode reads and the KV it allocates",
    )
    weight_sparsity: str | None = Field(
        default=None, description="linear layers' weight sparsity (`simcli serve`'s flag)"
    )
    activation_sparsity: str | None = Field(
        default=None, description="MLP activation sparsity (`simcli serve`'s flag)"
    )

    @field_validator("gpus", "tp", "schedulers", "chunk_sizes", "pd_ratios")
    @classmethod
    def _non_empty_unique(cls, v: tuple) -> tuple:
        if not v:
            raise ValueError("empty list; allowed: at least one value")
        return tuple(dict.fromkeys(v))

    @field_validator("prefill_gpus", "decode_gpus")
    @classmethod
    def _pool_gpus(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and not v:
            raise ValueError("empty list; allowed: at least one GPU id")
        return None if v is None else tuple(dict.fromkeys(v))

    @model_validator(mode="after")
    def _pool_search(self) -> PlanSpace:
        if self.pool_search and not any(self.pd_ratios):
            raise ValueError(
                "--prefill-gpu-types/--decode-gpu-types search disaggregated pools, but "
                "--pd-ratios has none; allowed: at least one P:D ratio (e.g. none,1:1,1:2)"
            )
        return self

    @property
    def pool_search(self) -> bool:
        """Disaggregated configs search each pool's GPU type and count (the prefill x
        decode GPU cross product, trimmed pool by pool)."""
        return self.prefill_gpus is not None or self.decode_gpus is not None

    @property
    def pool_gpus(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(prefill, decode) GPU ids of the per-pool search."""
        return self.prefill_gpus or self.gpus, self.decode_gpus or self.gpus

    @property
    def all_gpus(self) -> tuple[str, ...]:
        """Every GPU id the search may price, in first-seen order."""
        pre, dec = self.pool_gpus if self.pool_search else ((), ())
        return tuple(dict.fromkeys((*self.gpus, *pre, *dec)))

    @field_validator("tp", "chunk_sizes")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(x < 1 for x in v):
            raise ValueError(f"values must be positive integers, got {list(v)}")
        return v

    @field_validator("pd_ratios")
    @classmethod
    def _ratios(cls, v: tuple[str | None, ...]) -> tuple[str | None, ...]:
        for r in v:
            if r is not None:
                pd_weights(r)
        return v

    @field_validator("attn_pattern")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        if v is not None:
            parse_pattern(v)  # one-line error naming the allowed patterns
        return v

    @field_validator("prices")
    @classmethod
    def _prices(cls, v: dict[str, float]) -> dict[str, float]:
        for k, p in v.items():
            if not (p > 0 and math.isfinite(p)):
                raise ValueError(f"price for {k} must be a positive number, got {p}")
        return v


def pd_weights(ratio: str) -> tuple[float, float]:
    """``"P:D"`` -> (P, D), two positive numbers."""
    try:
        pw, dw = (float(x) for x in ratio.split(":"))
    except ValueError:
        pw = dw = math.nan
    if not (pw > 0 and dw > 0 and math.isfinite(pw) and math.isfinite(dw)):
        raise PlanError(f"pd ratio {ratio!r} is invalid; allowed: P:D, two positive numbers")
    return pw, dw


def split_replicas(replicas: int, ratio: str) -> tuple[int, int]:
    """(prefill, decode) replicas of ``replicas`` split ``ratio`` ``"P:D"``: prefill =
    round(R x P / (P + D)) kept within [1, R - 1] (``simcli serve --pd-ratio`` and the
    planner's disaggregated candidates)."""
    pw, dw = pd_weights(ratio)
    pre = min(max(round(replicas * pw / (pw + dw)), 1), replicas - 1)
    return pre, replicas - pre


@dataclass(frozen=True)
class Candidate:
    """One point of a :class:`PlanSpace`; its replica count is what the search finds.
    ``decode_gpu`` (per-pool search only): the decode pool's GPU, ``gpu`` then the prefill
    pool's; such a candidate's counts are searched pool by pool."""

    gpu: str
    tp: int
    scheduler: str
    chunk_size: int | None  # sarathi only
    pd_ratio: str | None = None  # disaggregated prefill:decode pools
    decode_gpu: str | None = None  # per-pool search: the decode pool's GPU

    @property
    def per_pool(self) -> bool:
        return self.decode_gpu is not None

    @property
    def decode_gpu_or_gpu(self) -> str:
        return self.decode_gpu or self.gpu

    @property
    def label(self) -> str:
        chunk = f" chunk={self.chunk_size}" if self.chunk_size else ""
        pd = f" pd={self.pd_ratio}" if self.pd_ratio else ""
        gpu = f"{self.gpu}->{self.decode_gpu}" if self.per_pool else self.gpu
        return f"{gpu} tp={self.tp} {self.scheduler}{chunk}{pd}"

    @property
    def min_replicas(self) -> int:
        return 2 if self.pd_ratio else 1

    def shape(self, replicas: int, pools: tuple[int, int] | None = None) -> tuple:
        """What is simulated: equal for two ratios that split ``replicas`` alike
        (``pools``: a per-pool search's explicit (prefill, decode) counts)."""
        shape = (
            self.gpu,
            self.tp,
            self.scheduler,
            self.chunk_size,
            pools or self.pools(replicas) or replicas,
        )
        return (*shape, self.decode_gpu) if self.decode_gpu not in (None, self.gpu) else shape

    def pools(self, replicas: int) -> tuple[int, int] | None:
        """(prefill, decode) replicas of a disaggregated config, as ``simcli serve
        --pd-ratio`` splits ``--replicas``: prefill = round(R x P / (P + D)) within
        [1, R - 1]."""
        if not self.pd_ratio:
            return None
        return split_replicas(replicas, self.pd_ratio)


__all__ = [
    "DEFAULT_GPUS",
    "SLO",
    "Candidate",
    "PlanError",
    "PlanSpace",
    "Workload",
    "pd_weights",
    "split_replicas",
]
