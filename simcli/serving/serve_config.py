"""The serving simulator's configuration: everything about a deployment except the
model's step times (what :class:`~simcli.serving.simulator.Simulator` runs)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcli.serving.branches import BranchConfig
from simcli.serving.disagg import DisaggConfig
from simcli.serving.frontend import FrontendConfig
from simcli.serving.schedulers import SchedulerConfig
from simcli.serving.spec import SpecConfig


class SimulationError(ValueError):
    """A request or configuration the simulator cannot serve; one line for users."""


class ServeConfig(BaseModel):
    """Everything about the serving deployment except the model's step times."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(default=1, gt=0)
    gpus_per_replica: int = Field(default=1, gt=0, description="tp x pp")
    pp: int = Field(default=1, gt=0, description="pipeline stages (virtual engines)")
    scheduler: SchedulerConfig = SchedulerConfig()
    router: Literal["round_robin", "least_outstanding", "kv_aware"] = "least_outstanding"
    block_size: int = Field(default=16, gt=0, description="tokens per KV block")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    prefix_caching: bool = True
    swap_bytes_per_s: float = Field(
        default=25e9, gt=0, description="host<->GPU copy rate per GPU for KV swapping"
    )
    slo_ttft_s: float | None = Field(default=None, gt=0)
    slo_tpot_s: float | None = Field(default=None, gt=0)
    price_per_gpu_hour: float | None = Field(default=None, ge=0)
    seed: int = Field(default=0, description="seeds speculative acceptance and branches")
    disaggregation: DisaggConfig | None = Field(
        default=None, description="prefill and decode pools (replicas = their sum)"
    )
    speculative: SpecConfig | None = None
    branching: BranchConfig | None = None
    max_model_len: int | None = Field(
        default=None,
        gt=0,
        description="longest prompt + output served (vLLM's max_model_len): longer prompts "
        "are refused, longer outputs cut (requests.output_within_model_len); None: no limit",
    )
    max_concurrency: int | None = Field(
        default=None,
        gt=0,
        description="closed loop: at most this many requests in flight, the next one sent "
        "when one completes (vllm bench serve --max-concurrency; simcli.serving.load); "
        "None: open loop, every request sent at its arrival time",
    )
    image_tokens_per_request: int = Field(
        default=0,
        ge=0,
        description="a vision-language model's image tokens added to every prompt "
        "(simcli.scenario.image_options); its encoder is priced by the step model",
    )
    frontend: FrontendConfig = Field(
        default=FrontendConfig(),
        description="the engine's API server (simcli.serving.frontend): its time is in the "
        "latencies clients see; all zero = the engine alone",
    )

    @model_validator(mode="after")
    def _check(self) -> ServeConfig:
        d = self.disaggregation
        if d is not None and d.prefill_replicas + d.decode_replicas != self.replicas:
            raise ValueError(
                f"replicas {self.replicas} != {d.prefill_replicas} prefill + "
                f"{d.decode_replicas} decode replicas; allowed: replicas = their sum"
            )
        if self.speculative is not None and self.pp > 1:
            raise ValueError(
                f"speculative decoding with pp={self.pp}; allowed: pp = 1 (as in vLLM)"
            )
        if d is not None and self.branching is not None and self.branching.branches > 1:
            raise ValueError(
                "multi-branch requests with disaggregation are not modelled; allowed: one "
                "of the two"
            )
        if d is not None and self.speculative is not None:
            raise ValueError(
                "speculative decoding with disaggregation is not modelled (the draft's KV "
                "would move too); allowed: one of the two"
            )
        return self

    @property
    def gpus(self) -> int:
        """GPUs of the whole deployment."""
        d = self.disaggregation
        if d is None:
            return self.replicas * self.gpus_per_replica
        g = self.gpus_per_replica
        return d.prefill_replicas * (d.prefill_gpus_per_replica or g) + d.decode_replicas * (
            d.decode_gpus_per_replica or g
        )


__all__ = ["ServeConfig", "SimulationError"]
