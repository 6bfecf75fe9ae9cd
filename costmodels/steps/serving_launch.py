"""How a serving engine launches one iteration and what its host adds: the step model's
use of an :class:`~costmodels.steps.engines.EngineProfile`.

A decode-only batch within the engine's CUDA-graph capture sizes replays the graph of the
next size up (its token-linear kernels run on the padded rows, attention on the real
sequences); a batch with prefill tokens does in piecewise mode, with attention launched
from the host between the pieces; every other batch launches its kernels from the host,
each at the stream floor and the whole at least ``kernels x launch_s`` (the host's seconds
per launch). The engine's host work per iteration is then added (serial) or overlapped
(``max``). The measured eager engine (``exact``) replays a graph at the exact decode batch
and runs its prefill through the launch queue of :mod:`costmodels.steps.serving_grid`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from costmodels.steps.engines import EngineProfile, HostWork, padded_size

GRAPH, STREAM = "graph", "stream"  # launch contexts: graph replay, launched from the host


@dataclass(frozen=True)
class EngineLaunch:
    """An engine's launch modes and host work on one GPU (see the module docstring)."""

    caps: tuple[int, ...]  # capture sizes on this GPU (tokens of a replayed batch)
    decode_graph: bool  # decode-only batches replay graphs
    decode_attn_stream: bool  # ... piecewise: their attention launched from the host
    mixed_graph: bool  # batches with prefill replay piecewise graphs
    exact: bool  # graphs at the exact batch, prefill eager (the measured eager engine)
    host: HostWork
    prefill_host: HostWork | None = None  # multi-step: an iteration with prefill, unamortised

    @classmethod
    def of(
        cls, profile: EngineProfile, gpu_id: str, memory_gib: float, tp: int, max_num_seqs: int
    ) -> EngineLaunch:
        g = profile.cuda_graphs
        return cls(
            caps=profile.capture_sizes(gpu_id, memory_gib, tp, max_num_seqs),
            decode_graph=g.decode != "none",
            decode_attn_stream=g.decode == "piecewise",
            mixed_graph=g.mixed == "piecewise",
            exact=g.exact,
            host=profile.host,
        )

    def with_scheduler_steps(self, n: int) -> EngineLaunch:
        """vLLM V0's multi-step scheduling (``--num-scheduler-steps n``): the scheduler,
        input preparation and output processing run once per ``n`` decode steps (vLLM
        v0.6.0 blog), so each decode iteration carries ``1/n`` of the host work. A prefill
        is a single step of its own (``_get_num_lookahead_slots(is_prefill=True)`` is 0)
        and carries all of it."""
        if n == 1:
            return self
        h = self.host
        host = h.model_copy(
            update={k: getattr(h, k) / n for k in ("per_step_s", "per_seq_s", "per_token_s")}
        )
        return dataclasses.replace(self, host=host, prefill_host=h)

    @property
    def cap_max(self) -> int:
        return self.caps[-1] if self.caps else 0

    @property
    def overlap(self) -> bool:
        return self.host.overlap

    @property
    def launch_s(self) -> float:
        """Host seconds per kernel launched outside graphs (0: launches keep up)."""
        return self.host.launch_s_per_kernel

    def plan(self, n_pre: int, T: int) -> tuple[str, int, bool]:
        """(context, tokens the token-linear kernels run on, attention launched from the
        host) of an iteration of ``T`` tokens with ``n_pre`` prefill chunks."""
        if self.exact:
            return (STREAM, T, True) if n_pre else (GRAPH, T, False)
        if n_pre == 0 and self.decode_graph and self.cap_max >= T:
            return GRAPH, padded_size(self.caps, T), self.decode_attn_stream  # type: ignore[return-value]
        if n_pre and self.mixed_graph and self.cap_max >= T:
            return GRAPH, padded_size(self.caps, T), True  # type: ignore[return-value]
        return STREAM, T, True

    def combine(self, gpu_s: float, S: int, T: int, n_pre: int = 0) -> float:
        """The iteration's price: ``gpu + host`` or ``max(gpu, host)`` (overlapped)."""
        host = self.prefill_host if n_pre and self.prefill_host is not None else self.host
        h = host.step_s(S, T)
        return max(gpu_s, h) if host.overlap else gpu_s + h

    def describe(self, profile: EngineProfile, n_pre: int, S: int, T: int) -> dict:
        """What ``simcli step`` reports of the launch: the graph mode used, the padded
        tokens, the host seconds and whether they overlap the GPU."""
        ctx, Tg, _ = self.plan(n_pre, T)
        mode = profile.cuda_graphs.mixed if n_pre else profile.cuda_graphs.decode
        return {
            "cuda_graph": mode if ctx == GRAPH else "none",
            "padded_tokens": int(Tg),
            "host_s": self.host.step_s(S, T),
            "host_overlapped": self.overlap,
        }


@dataclass
class IterationCost:
    """One iteration priced: its total seconds, one layer's attention, and (when asked) the
    per-template seconds it was summed from."""

    total: float
    attn: float  # one layer's attention, seconds
    tok: np.ndarray | None = None  # per-instance seconds of the token templates
    seq: np.ndarray | None = None  # per-step seconds of the sequence templates
    eager: bool = False  # the eager engine's launch queue priced it


def decode_summary(dc: np.ndarray) -> tuple[int, int]:
    """(count, context sum) of the decodes: all a step's price needs of them."""
    return int(dc.size), int(dc.sum())


__all__ = ["GRAPH", "STREAM", "EngineLaunch", "IterationCost", "decode_summary"]
