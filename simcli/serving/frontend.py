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
S_{j-1})``, a cumulative maximum. Each token's delivery then adds ``per_output_token_s``:
TTFT and end-to-end latency grow by ``(d_i - a_i) + per_output_token_s``, the gaps between
tokens do not. Detokenisation's CPU time is not queued with tokenisation (it runs on
another worker in V1, SGLang and TensorRT-LLM; in vLLM V0 it is part of the engine's
per-iteration host time, which the engine profile prices).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


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
    """The FIFO frontend over a stream of arrival chunks (keeps when it is next free)."""

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.free_s = -np.inf

    def admit(
        self, arrival_s: np.ndarray, prompt_tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(engine arrival times, latency each request's client sees beyond the engine's)
        of a chunk of requests sorted by arrival."""
        a = np.asarray(arrival_s, dtype=float)
        if a.size == 0:
            return a.copy(), a.copy()
        s = self.config.service_s(prompt_tokens)
        cum = np.cumsum(s)
        before = cum - s  # S_{i-1}
        x = a - before
        x[0] = max(x[0], self.free_s)  # still busy with the previous chunk's requests
        d = cum + np.maximum.accumulate(x)
        self.free_s = float(d[-1])
        return d, (d - a) + self.config.per_output_token_s


__all__ = ["Frontend", "FrontendConfig"]
