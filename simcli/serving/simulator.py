"""The discrete-event serving simulator: arrivals, routing, replica iterations.

Events sit in one heap ordered by ``(time_s, insertion order)``; each event's ``handle``
returns the events that follow (an :class:`Arrival` routes its request and yields the next
arrival plus any iteration it starts; a replica's ``BatchDone`` yields its next iteration).
Arrivals are pulled from a stream one at a time, so the heap holds one arrival plus at
most one iteration per engine: memory does not grow with the number of requests.

Each engine iteration calls ``StepModel.step_s`` exactly once (the contract in
``simcli.serving``); everything else per iteration is O(1) Python plus one numpy add (see
``replica.DecodeBatch``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simcli.serving.metrics import EnergyMeter, Metrics
from simcli.serving.replica import Replica, StepModelLike
from simcli.serving.requests import Request
from simcli.serving.router import make_router
from simcli.serving.schedulers import SchedulerConfig, make_scheduler


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


class Arrival:
    """Event: a request reaches the router."""

    __slots__ = ("time_s", "request")

    def __init__(self, request: Request) -> None:
        self.time_s = request.arrival_s
        self.request = request

    def handle(self, sim: Simulator) -> list:
        return sim.arrive(self.request, self.time_s)


@dataclass
class ServeResult:
    summary: dict[str, float | int | str | None]
    per_replica: list[dict[str, float | int]] = field(default_factory=list)


class Simulator:
    def __init__(
        self,
        step_model: StepModelLike,
        config: ServeConfig,
        *,
        kv_capacity_tokens: int | None = None,
        sink: Callable[[Request], None] | None = None,
        energy: EnergyMeter | None = None,
        check: bool = False,
    ) -> None:
        self.config = config
        self.step_model = step_model
        bs = config.block_size
        if kv_capacity_tokens is None:
            kv_capacity_tokens = int(
                step_model.kv_capacity_tokens(bs, config.gpu_memory_utilization)
            )
        blocks = kv_capacity_tokens // bs // config.pp
        if blocks < 1:
            raise SimulationError(
                f"no room for the KV cache: {kv_capacity_tokens} tokens per replica "
                f"(block size {bs}, pp {config.pp}); allowed: a model that leaves GPU memory "
                "for at least one KV block (more --tp/--pp, a bigger GPU, a higher "
                "--gpu-memory-utilization)"
            )
        self.kv_capacity_tokens = kv_capacity_tokens
        self.engine_capacity_tokens = blocks * bs
        self.metrics = Metrics(
            slo_ttft_s=config.slo_ttft_s, slo_tpot_s=config.slo_tpot_s, sink=sink, energy=energy
        )
        sched = make_scheduler(config.scheduler)
        self.replicas = [
            Replica(
                i,
                step_model,
                sched,
                self.metrics,
                kv_capacity_tokens=kv_capacity_tokens,
                block_size=bs,
                pp=config.pp,
                prefix_caching=config.prefix_caching,
                watermark=config.scheduler.watermark,
                swap_bytes_per_s=config.swap_bytes_per_s * config.gpus_per_replica,
            )
            for i in range(config.replicas)
        ]
        self.router = make_router(config.router)
        self.check = check
        self.now_s = 0.0
        self.arrived = 0
        self._stream: Iterator[Request] | None = None
        self._last_arrival_s = 0.0

    # --- events -----------------------------------------------------------------------------
    def arrive(self, req: Request, now_s: float) -> list:
        need = req.prompt_tokens + req.output_tokens - 1
        if need > self.engine_capacity_tokens:
            raise SimulationError(
                f"request {req.id} needs {need} tokens of KV cache (prompt "
                f"{req.prompt_tokens} + output {req.output_tokens}) but a replica"
                f"{' engine' if self.config.pp > 1 else ''} holds "
                f"{self.engine_capacity_tokens}; allowed: shorter requests or more KV room "
                "(more --tp, a bigger GPU)"
            )
        self.arrived += 1
        replica = self.router.choose(self.replicas, req)
        events = replica.add_request(req, now_s)
        nxt = self._next_arrival()
        if nxt is not None:
            events.append(nxt)
        return events

    def _next_arrival(self) -> Arrival | None:
        assert self._stream is not None
        req = next(self._stream, None)
        if req is None:
            return None
        if not req.arrival_s >= self._last_arrival_s or not math.isfinite(req.arrival_s):
            raise SimulationError(
                f"request {req.id} arrives at {req.arrival_s} s, before the previous one "
                f"({self._last_arrival_s} s); allowed: requests sorted by arrival time"
            )
        if req.prompt_tokens < 1 or req.output_tokens < 1:
            raise SimulationError(
                f"request {req.id} has prompt {req.prompt_tokens} and output "
                f"{req.output_tokens} tokens; allowed: both >= 1"
            )
        self._last_arrival_s = req.arrival_s
        return Arrival(req)

    # --- the loop ---------------------------------------------------------------------------
    def run(self, requests: Iterable[Request]) -> ServeResult:
        self._stream = iter(requests)
        first = self._next_arrival()
        if first is None:
            raise SimulationError("no requests to simulate; allowed: at least one request")
        heap: list = [(first.time_s, 0, first)]
        counter = itertools.count(1)
        push, pop = heapq.heappush, heapq.heappop
        now = 0.0
        check = self.check
        while heap:
            t, _, ev = pop(heap)
            if t < now:
                raise SimulationError(f"internal: time went backwards ({t} < {now})")
            now = t
            for nxt in ev.handle(self):
                push(heap, (nxt.time_s, next(counter), nxt))
            if check:
                self.now_s = now
                for r in self.replicas:
                    r.check()
        self.now_s = now
        if self.metrics.completed != self.arrived:
            raise SimulationError(
                f"internal: {self.arrived - self.metrics.completed} of {self.arrived} "
                "requests never finished (a scheduler could not make progress)"
            )
        return self.result()

    def result(self) -> ServeResult:
        cfg = self.config
        m = self.metrics
        out: dict[str, float | int | str | None] = dict(m.summary())
        dur = m.duration_s
        engines = [e for r in self.replicas for e in r.engines]
        out["kv_util_mean"] = m.kv_block_s / (len(engines) * dur) if dur > 0 else math.nan
        out["kv_util_max"] = m.kv_util_max
        out["kv_capacity_tokens_per_replica"] = self.kv_capacity_tokens
        out["preemptions"] = sum(e.preemptions for e in engines)
        hits = sum(e.kv.prefix_hits for e in engines)
        out["prefix_cache_hits"] = hits
        out["prefix_cache_hit_tokens"] = sum(e.kv.prefix_hit_tokens for e in engines)
        gpus = cfg.replicas * cfg.gpus_per_replica
        gpu_hours = gpus * dur / 3600.0
        out["gpus"] = gpus
        out["gpu_hours"] = gpu_hours
        price = cfg.price_per_gpu_hour
        out["cost_usd"] = gpu_hours * price if price is not None else None
        out["cost_usd_per_million_output_tokens"] = (
            gpu_hours * price / m.output_tokens * 1e6
            if price is not None and m.output_tokens
            else None
        )
        if m.energy is not None:
            # iterations priced by the power model, idle power for the rest of the run
            busy_gpu_s = m.engine_busy_s * cfg.gpus_per_replica / cfg.pp
            idle_gpu_s = max(gpus * dur - busy_gpu_s, 0.0)
            joules = m.energy.busy_joules() + idle_gpu_s * m.energy.idle_w
            out["energy_kwh"] = joules / 3.6e6
            out["energy_j_per_output_token"] = joules / m.output_tokens if m.output_tokens else None
        else:
            out["energy_kwh"] = None
            out["energy_j_per_output_token"] = None
        per = []
        for r in self.replicas:
            per.append(
                {
                    "replica": r.index,
                    "preemptions": sum(e.preemptions for e in r.engines),
                    "peak_kv_blocks": max(e.kv.peak_used_blocks for e in r.engines),
                    "kv_blocks": r.blocks_per_engine * len(r.engines),
                }
            )
        return ServeResult(summary=out, per_replica=per)


def simulate(
    step_model: StepModelLike,
    requests: Iterable[Request],
    config: ServeConfig,
    **kwargs: object,
) -> ServeResult:
    """Run ``requests`` (sorted by arrival) through ``config.replicas`` replicas."""
    return Simulator(step_model, config, **kwargs).run(requests)  # type: ignore[arg-type]


__all__ = ["Arrival", "ServeConfig", "ServeResult", "SimulationError", "Simulator", "simulate"]
