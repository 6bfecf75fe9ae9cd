"""Scheduling priorities of requests: a ``--priority-mix`` of classes drawn from the seed.

vLLM's ``--scheduling-policy priority`` serves a lower ``priority`` value first
(:class:`~simcli.serving.schedulers.PriorityScheduler`); a workload names its classes and
their shares, e.g. ``0:0.2,1:0.8`` (a fifth of the requests in class 0). The draw uses
its own generator seeded by the run's seed, so adding a mix leaves the arrival times and
lengths of a run unchanged. A replayed trace may instead carry a ``priority`` column
(:func:`~simcli.serving.requests.trace_requests`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from simcli.serving.requests import RequestChunk, RequestStream

PriorityMix = tuple[tuple[int, float], ...]
_SALT = 0x5052494F  # "PRIO": keeps this draw apart from the arrivals' generator


def parse_priority_mix(text: str) -> PriorityMix:
    """``"0:0.2,1:0.8"`` -> ((0, 0.2), (1, 0.8)); ValueError (one line) when malformed."""
    allowed = (
        "allowed: CLASS:SHARE pairs such as 0:0.2,1:0.8 (integer classes, shares > 0 summing to 1)"
    )
    out: dict[int, float] = {}
    for part in text.split(","):
        cls, sep, share = part.strip().partition(":")
        try:
            c, w = int(cls), float(share)
        except ValueError:
            c, w = 0, math.nan
        if not sep or not math.isfinite(w) or w <= 0 or c in out:
            raise ValueError(f"--priority-mix {text!r} is invalid; {allowed}")
        out[c] = w
    if abs(sum(out.values()) - 1.0) > 1e-6:
        raise ValueError(f"--priority-mix {text!r} shares sum to {sum(out.values()):g}; {allowed}")
    return tuple(sorted(out.items()))


def with_priorities(stream: RequestStream, mix: PriorityMix, seed: int) -> RequestStream:
    """``stream`` with each request's priority class drawn from ``mix`` (seeded)."""
    classes = np.array([c for c, _ in mix], dtype=np.int64)
    shares = np.array([w for _, w in mix], dtype=float)
    shares /= shares.sum()

    def chunks() -> Iterator[RequestChunk]:
        rng = np.random.default_rng((seed, _SALT))
        for c in stream.chunks():
            yield c._replace(priority=classes[rng.choice(classes.size, len(c.arrival_s), p=shares)])

    out = RequestStream(chunks, stream.shared_prefixes, stream.expected)
    out.priorities = True
    return out


__all__ = ["PriorityMix", "parse_priority_mix", "with_priorities"]
