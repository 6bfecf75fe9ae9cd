"""The engine's frontend (API server): the work a request meets before and after the GPU.

A served request first passes the API server: HTTP handling, request validation and
tokenisation of its prompt, then a hand-off to the engine (a queue in vLLM V0's own process,
a ZMQ socket to vLLM V1's engine core or SGLang's scheduler, a C++ executor in TensorRT-LLM);
every generated token comes back the same way (detokenisation, a server-sent event). A
benchmark client measures TTFT and end-to-end latency over all of it, so a simulator that
prices only the engine's iterations is optimistic by this much at light load (issue 29).

Model: one frontend worker serves requests first come, first served (Python's event loop
and the GIL make an API server process one request's CPU work at a time), so a request
reaches the engine at

    d_i = max(a_i, d_{i-1}) + s_i,    s_i = request_s + per_prompt_token_s * prompt_i

(Lindley's recursion of a single FIFO server). It is evaluated for a whole chunk of
arrivals at once: with S the cumulative service times, ``d_i = S_i + max_{j<=i}(a_j -
S_{j-1})``, a cumulative maximum (the same operations, in the same order, one request or
a chunk at a time, so both serving loops see the same times). Each token's delivery then
adds ``per_output_token_s``: TTFT and end-to-end latency grow by
``(d_i - a_i) + per_output_token_s``, the gaps between tokens do not. Detokenisation's
CPU time is not queued with tokenisation (it runs on another worker in V1, SGLang and
TensorRT-LLM; in vLLM V0 it is part of the engine's per-iteration host time, which the
engine profile prices). A closed loop (``queue`` False) adds each request's own frontend
time to its latency without the queue: the simulator makes its sends.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simcli.serving.requests import Request, RequestChunk, RequestStream


class FrontendConfig(BaseModel):
    """Per-request API-server work; all zero = the engine alone (simcli's old default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_s: float = Field(0.0, ge=0, description="fixed work per request, seconds")
    per_prompt_token_s: float = Field(0.0, ge=0, description="tokenisation, s per prompt token")
    per_output_token_s: float = Field(
        0.0, ge=0, description="detokenisation and streaming, s per output token"
    )

    @property
    def active(self) -> bool:
        return bool(self.request_s or self.per_prompt_token_s or self.per_output_token_s)

    def service_s(self, prompt_tokens: np.ndarray) -> np.ndarray:
        """Ingress work of each request (seconds)."""
        p = np.asarray(prompt_tokens, dtype=float)
        return self.request_s + self.per_prompt_token_s * p


class Frontend:
    """The FIFO frontend over a stream of arrival chunks. It keeps the running sum of
    service times ``S`` and the running maximum ``M`` of ``a_j - S_{j-1}``, so a chunk of
    any size (one request, or thousands) gives bit-identical times: ``d_i = S_i + M_i``."""

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.total_s = 0.0  # S: service time of every request so far
        self.lead_s = -np.inf  # M

    def admit(
        self, arrival_s: np.ndarray, prompt_tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(engine arrival times, latency each request's client sees beyond the engine's)
        of a chunk of requests sorted by arrival."""
        a = np.asarray(arrival_s, dtype=float)
        if a.size == 0:
            return a.copy(), a.copy()
        s = self.config.service_s(prompt_tokens)
        cum = np.cumsum(np.concatenate(([self.total_s], s)))  # sequential, as one by one
        lead = np.maximum.accumulate(np.concatenate(([self.lead_s], a - cum[:-1])))[1:]
        d = cum[1:] + lead
        self.total_s, self.lead_s = float(cum[-1]), float(lead[-1])
        return d, (d - a) + self.config.per_output_token_s


def with_frontend(
    requests: Iterable[Request], config: FrontendConfig, queue: bool = True
) -> Iterable[Request]:
    """``requests`` as the engine receives them behind ``config``'s frontend: each reaches
    the engine when the frontend has handled it (``queue``: one FIFO worker, Lindley's
    recursion; else its own ingress time, no waiting: a closed loop, whose sends the
    simulator makes) and carries the latency the client sees beyond the engine's. A
    :class:`RequestStream` stays one (the compiled loop reads its chunks)."""
    out_s = config.per_output_token_s
    if isinstance(requests, RequestStream):
        src = requests

        def chunks() -> Iterator[RequestChunk]:
            fe = Frontend(config)
            last = -np.inf
            for c in src.chunks():
                a = c.arrival_s
                if a.size and not (_sorted(a, last) and (c.prompt_tokens >= 1).all()):
                    yield c  # unchanged: the simulator refuses it with its own message
                    continue
                last = float(a[-1]) if a.size else last
                if queue:
                    ready, extra = fe.admit(c.arrival_s, c.prompt_tokens)
                    yield c._replace(arrival_s=ready, frontend_in_s=extra - out_s)
                else:
                    yield c._replace(frontend_in_s=config.service_s(c.prompt_tokens))

        stream = RequestStream(chunks, src.shared_prefixes, src.expected)
        stream.priorities = src.priorities
        stream.frontend_out_s = out_s
        return stream
    return _each(requests, config, queue)


def _sorted(a: np.ndarray, last: float) -> bool:
    """Finite arrival times in order, after ``last``."""
    return bool(np.isfinite(a).all() and a[0] >= last and (np.diff(a) >= 0).all())


def _each(requests: Iterable[Request], config: FrontendConfig, queue: bool) -> Iterator[Request]:
    fe = Frontend(config)
    last = -np.inf
    for req in requests:
        if not (req.arrival_s >= last and np.isfinite(req.arrival_s)) or req.prompt_tokens < 1:
            yield req  # unchanged: the simulator refuses it with its own message
            continue
        last = req.arrival_s
        one = np.array([req.prompt_tokens])
        if queue:
            ready, extra = fe.admit(np.array([req.arrival_s]), one)
            req.arrival_s = float(ready[0])
            req.frontend_in_s = float(extra[0]) - config.per_output_token_s
        else:
            req.frontend_in_s = float(config.service_s(one)[0])
        req.frontend_out_s = config.per_output_token_s
        yield req


__all__ = ["Frontend", "FrontendConfig", "with_frontend"]
