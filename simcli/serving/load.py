"""Closed-loop load: a pool of clients with at most N requests in flight.

Serving benchmarks drive an engine in two ways. Open loop: requests arrive at times drawn
in advance (Poisson/gamma at ``--qps``, a replayed trace, or all at t = 0 with
``--qps inf``); the event loop and the compiled loop both simulate that. Closed loop:
arrivals depend on completions, which only the event loop sees, so this module gives it
the feedback:

- vLLM's ``benchmarks/benchmark_serving.py`` (``vllm bench serve``) ``--max-concurrency
  N``: the arrival process (``get_request``, gamma gaps of shape ``--burstiness`` and
  mean ``1 / --request-rate``, none at ``inf``) creates a task per request, and every
  task first acquires an ``asyncio.Semaphore(N)`` (``limited_request_func``); the task's
  timer (``RequestFuncOutput.ttft``/``latency``) starts inside ``request_func``, after
  the semaphore. So a request is *sent* at ``max(its arrival, a slot frees)``, slots go
  to waiting requests in arrival order (asyncio's semaphore wakes its waiters first in,
  first out), and TTFT/E2E count from the send.
- genai-perf (perf_analyzer's ``--concurrency-range``) and NVIDIA NIM's benchmarking
  guide: N clients, each sends its next request as soon as its previous one completes:
  the same pool with every arrival at t = 0 (``--qps inf --max-concurrency N``).

Here a request that has arrived but found no free slot waits at the client: at most one
such request is held (the stream is not read further until it is sent, its successors
arrive no earlier), so memory stays flat at any run length. A completion (or a refused
prompt, which vLLM answers at once with an error) frees a slot through a :class:`Release`
event at that instant, handled after the event that completed the request, so a replica
never sees a new request from inside its own iteration's bookkeeping.

The client-side wait (send - arrival) is reported (``client_wait_s_mean``/``_max``): the
benchmark's latencies exclude it, its duration (first send to last completion) does not.
"""

from __future__ import annotations

from typing import Any

from simcli.serving.requests import Request


class ClientPool:
    """``clients`` slots over a request stream; see the module docstring."""

    __slots__ = ("clients", "free", "blocked", "released", "waits", "wait_s", "max_wait_s")

    def __init__(self, clients: int) -> None:
        if clients < 1:
            raise ValueError(f"max concurrency {clients}; allowed: an integer >= 1")
        self.clients = clients
        self.free = clients
        self.blocked: Request | None = None  # arrived, waiting for a slot
        self.released: list = []  # Release events the loop pushes after the current event
        self.waits = 0  # requests that waited for a slot
        self.wait_s = 0.0
        self.max_wait_s = 0.0

    def request_done(self, req: Request) -> None:
        """A request completed at ``req.finish_s``: its slot frees at that instant."""
        self.released.append(Release(req.finish_s))  # type: ignore[arg-type]

    def send(self, sim: Any, req: Request, now_s: float) -> list:
        """Take a slot and hand ``req`` to the router at ``now_s`` (its send time)."""
        self.free -= 1
        wait = now_s - req.arrival_s
        if wait > 0:
            self.waits += 1
            self.wait_s += wait
            self.max_wait_s = max(self.max_wait_s, wait)
            req.arrival_s = now_s
            for s in req.seqs:  # FCFS order follows the send, as the engine sees it
                s.order = now_s
        refused = sim.rejected_too_long
        events = sim.arrive(req, now_s)
        if sim.rejected_too_long != refused:  # refused at once: the client is free again
            self.free += 1
        return events

    def summary(self, arrived: int) -> dict[str, float | int | None]:
        return {
            "max_concurrency": self.clients,
            "client_waits": self.waits,
            "client_wait_s_mean": self.wait_s / arrived if arrived else None,
            "client_wait_s_max": self.max_wait_s,
        }


class ClientArrival:
    """Event: a request reaches the client pool (at its arrival time, or when the stream
    was read, if later: it waited behind a request that had no slot)."""

    __slots__ = ("time_s", "request")

    def __init__(self, request: Request, time_s: float) -> None:
        self.time_s = time_s
        self.request = request

    def handle(self, sim: Any) -> list:
        pool: ClientPool = sim.clients
        if pool.free > 0:
            return pool.send(sim, self.request, self.time_s)
        pool.blocked = self.request  # the stream is read again once it is sent
        return []


class Release:
    """Event: a client's request completed; the waiting request (if any) is sent."""

    __slots__ = ("time_s",)

    def __init__(self, time_s: float) -> None:
        self.time_s = time_s

    def handle(self, sim: Any) -> list:
        pool: ClientPool = sim.clients
        pool.free += 1
        req = pool.blocked
        if req is None:
            return []
        pool.blocked = None
        return pool.send(sim, req, self.time_s)


__all__ = ["ClientArrival", "ClientPool", "Release"]
