"""Request routing across replicas.

- ``round_robin``: replica ``i mod R`` for the i-th request; blind to load.
- ``least_outstanding``: the replica with the fewest unfinished requests (ties: lowest
  index), like a least-connections load balancer.
- ``kv_aware``: a replica holding the request's shared prefix in its cache wins (prefix
  affinity, as in SGLang's cache-aware router / llm-d's prefix scorer), the most free KV
  blocks net of its queue's demand otherwise, then the fewest unfinished requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from simcli.serving.replica import Replica
from simcli.serving.requests import Request

ROUTERS = ("round_robin", "least_outstanding", "kv_aware")


class Router:
    def choose(self, replicas: Sequence[Replica], req: Request) -> Replica:
        raise NotImplementedError


class RoundRobin(Router):
    def __init__(self) -> None:
        self.next = 0

    def choose(self, replicas: Sequence[Replica], req: Request) -> Replica:
        r = replicas[self.next]
        self.next = (self.next + 1) % len(replicas)
        return r


class LeastOutstanding(Router):
    def choose(self, replicas: Sequence[Replica], req: Request) -> Replica:
        best = replicas[0]
        for r in replicas:
            if r.outstanding < best.outstanding:
                best = r
        return best


class KVAware(Router):
    def choose(self, replicas: Sequence[Replica], req: Request) -> Replica:
        candidates = replicas
        if req.prefix_key is not None:
            hits = [r for r in replicas if r.has_prefix(req)]
            if hits:
                candidates = hits
        best = candidates[0]
        best_score = (best.available_blocks, -best.outstanding)
        for r in candidates:
            score = (r.available_blocks, -r.outstanding)
            if score > best_score:
                best, best_score = r, score
        return best


def make_router(kind: str) -> Router:
    table = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding, "kv_aware": KVAware}
    if kind not in table:
        raise ValueError(f"unknown router {kind!r}; allowed: {', '.join(ROUTERS)}")
    return table[kind]()


__all__ = ["ROUTERS", "KVAware", "LeastOutstanding", "RoundRobin", "Router", "make_router"]
