"""What the replicas did over time, recorded in bounded memory for reports and traces.

A :class:`StepRecorder` handed to the :class:`~simcli.serving.simulator.Simulator`
(``recorder=``) sees every engine iteration when it starts (``Metrics.iteration``) and every
request when it completes (``Metrics.request_done``). It keeps two things, each bounded
whatever the number of requests:

- ``samples``: per replica, at most ``max_samples / replicas`` iteration samples (time,
  batch, KV blocks, queue). When a replica's list fills up, every other sample is dropped
  and from then on only every ``2 x stride``-th iteration is kept, so the kept samples stay
  evenly spread over the iterations of the whole run (the report's timeline and
  ``timeline.csv``).
- for a Chrome/Perfetto trace (:meth:`trace_events`): the first ``max_trace_steps``
  iterations as slices with counters, and the first ``max_trace_requests`` requests as
  async spans; what is left out is counted and named in the trace's ``otherData``.

Times are simulated seconds; the trace converts them to microseconds, as the format needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simcli.serving.batch import Batch
    from simcli.serving.engine import Engine
    from simcli.serving.replica import Replica
    from simcli.serving.requests import Request

# Columns of one sample (``samples`` rows and timeline.csv, in this order).
SAMPLE_COLUMNS = (
    "time_s",
    "replica",
    "role",
    "engine",
    "step_s",
    "batch_seqs",
    "prefill_tokens",
    "decode_tokens",
    "kv_blocks_used",
    "kv_blocks_total",
    "queue_seqs",
)


class StepRecorder:
    """Iteration samples (downsampled) and, optionally, a capped trace of steps and requests.

    ``max_trace_steps`` / ``max_trace_requests`` 0: no trace is kept (only samples).
    """

    def __init__(
        self,
        *,
        max_samples: int = 4000,
        max_trace_steps: int = 0,
        max_trace_requests: int = 0,
    ) -> None:
        if max_samples < 1 or max_trace_steps < 0 or max_trace_requests < 0:
            raise ValueError(
                f"max_samples {max_samples}, max_trace_steps {max_trace_steps}, "
                f"max_trace_requests {max_trace_requests}; allowed: >= 1, >= 0, >= 0"
            )
        self.max_samples = max_samples
        self.max_trace_steps = max_trace_steps
        self.max_trace_requests = max_trace_requests
        self.per_replica_cap = max_samples
        self.roles: dict[int, str] = {}
        self.engines: dict[int, int] = {}
        self._samples: dict[int, list[tuple]] = {}
        self._seen: dict[int, int] = {}
        self._stride: dict[int, int] = {}
        self.steps: list[tuple] = []  # trace: (replica, engine, start_s, dt_s, new, dec, kv, q)
        self.steps_dropped = 0
        self.requests: list[tuple] = []  # trace: (id, replica, arrival, first, finish, p, o)
        self.requests_dropped = 0
        self.iterations = 0

    # --- hooks (called by the simulator) ---------------------------------------------------
    def bind(self, replicas: list[Replica]) -> None:
        """The simulator's replicas (their roles and engine counts), before the run."""
        self.roles = {r.index: r.role for r in replicas}
        self.engines = {r.index: len(r.engines) for r in replicas}
        self.per_replica_cap = max(50, self.max_samples // max(1, len(replicas)))
        for r in replicas:
            self._samples[r.index] = []
            self._seen[r.index] = 0
            self._stride[r.index] = 1

    def step(self, engine: Engine, batch: Batch, dt_s: float) -> None:
        """An iteration started on ``engine`` at ``engine.batch_start_s``, lasting ``dt_s``."""
        self.iterations += 1
        rep = engine.replica.index
        seen = self._seen.get(rep, 0)
        self._seen[rep] = seen + 1
        stride = self._stride.get(rep, 1)
        keep_sample = seen % stride == 0
        trace = self.max_trace_steps > 0
        if not keep_sample and not trace:
            return
        kv = engine.kv
        used = kv.used_blocks - kv.evictable_blocks
        queued = len(engine.waiting) + len(engine.swapped) + len(engine.incoming)
        new = sum(batch.prefill_new) if batch.prefills else 0
        dec = batch.n_decode
        start = engine.batch_start_s
        if keep_sample:
            rows = self._samples.setdefault(rep, [])
            rows.append(
                (start, dt_s, len(batch.prefills) + dec, new, dec, used, kv.num_blocks, queued,
                 engine.index)
            )  # fmt: skip
            if len(rows) >= self.per_replica_cap:
                del rows[1::2]
                self._stride[rep] = stride * 2
        if trace:
            if len(self.steps) < self.max_trace_steps:
                self.steps.append(
                    (rep, engine.index, start, dt_s, len(batch.prefills), new, dec, used, queued)
                )
            else:
                self.steps_dropped += 1

    def request(self, req: Request) -> None:
        """A request completed."""
        if self.max_trace_requests <= 0:
            return
        if len(self.requests) < self.max_trace_requests:
            self.requests.append(
                (req.id, req.replica, req.arrival_s, req.first_token_s, req.finish_s,
                 req.prompt_tokens, req.output_tokens)
            )  # fmt: skip
        else:
            self.requests_dropped += 1

    # --- results -------------------------------------------------------------------------
    def samples(self) -> list[dict[str, Any]]:
        """The kept iteration samples, by replica then time (rows of timeline.csv)."""
        out = []
        for rep in sorted(self._samples):
            role = self.roles.get(rep, "mixed")
            for start, dt, seqs, new, dec, used, total, queued, eng in sorted(
                self._samples[rep], key=lambda s: s[0]
            ):
                out.append(
                    dict(
                        zip(
                            SAMPLE_COLUMNS,
                            (start, rep, role, eng, dt, seqs, new, dec, used, total, queued),
                            strict=True,
                        )
                    )
                )
        return out

    def trace_events(self) -> list[dict]:
        """Chrome/Perfetto trace events: one process per replica, one thread per engine;
        each iteration an ``X`` slice (args: batch, prefill and decode tokens), counters of
        KV blocks in use and queued sequences, requests as nested async spans (queue +
        prefill, then decode). Times in microseconds as the format requires; metadata
        first, then every event in time order."""
        meta: list[dict] = []
        for rep in sorted(self.roles):
            role = self.roles[rep]
            meta.append(
                {"name": "process_name", "ph": "M", "ts": 0, "pid": rep, "tid": 0,
                 "args": {"name": f"replica {rep} ({role})"}}
            )  # fmt: skip
            meta.append(
                {"name": "process_sort_index", "ph": "M", "ts": 0, "pid": rep, "tid": 0,
                 "args": {"sort_index": rep}}
            )  # fmt: skip
            for e in range(self.engines.get(rep, 1)):
                name = "iterations" if self.engines.get(rep, 1) == 1 else f"engine {e}"
                meta.append(
                    {"name": "thread_name", "ph": "M", "ts": 0, "pid": rep, "tid": e,
                     "args": {"name": name}}
                )  # fmt: skip
        events: list[dict] = []
        for rep, eng, start, dt, n_pre, new, dec, used, queued in self.steps:
            kind = "prefill+decode" if new and dec else ("prefill" if new else "decode")
            ts = start * 1e6
            events.append(
                {
                    "name": kind,
                    "cat": "step",
                    "ph": "X",
                    "pid": rep,
                    "tid": eng,
                    "ts": ts,
                    "dur": max(0.0, dt * 1e6),
                    "args": {
                        "batch_seqs": n_pre + dec,
                        "prefill_seqs": n_pre,
                        "prefill_tokens": new,
                        "decode_tokens": dec,
                    },
                }
            )
            suffix = "" if self.engines.get(rep, 1) == 1 else f" (engine {eng})"
            events.append(
                {"name": f"KV blocks used{suffix}", "ph": "C", "pid": rep, "tid": eng,
                 "ts": ts, "args": {"blocks": used}}
            )  # fmt: skip
            events.append(
                {"name": f"queued sequences{suffix}", "ph": "C", "pid": rep, "tid": eng,
                 "ts": ts, "args": {"sequences": queued}}
            )  # fmt: skip
        for rid, rep, arrival, first, finish, prompt, output in self.requests:
            pid = rep if rep is not None else 0
            base = {"cat": "request", "id": rid, "pid": pid, "tid": 0}
            name = f"request {rid}"
            events += [
                {**base, "name": name, "ph": "b", "ts": arrival * 1e6,
                 "args": {"prompt_tokens": prompt, "output_tokens": output}},
                {**base, "name": "queue+prefill", "ph": "b", "ts": arrival * 1e6},
                {**base, "name": "queue+prefill", "ph": "e", "ts": first * 1e6},
                {**base, "name": "decode", "ph": "b", "ts": first * 1e6},
                {**base, "name": "decode", "ph": "e", "ts": finish * 1e6},
                {**base, "name": name, "ph": "e", "ts": finish * 1e6},
            ]  # fmt: skip
        events.sort(key=lambda ev: ev["ts"])  # stable: a request's own order is kept
        return meta + events

    def trace_document(self, **other: Any) -> dict[str, Any]:
        """``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``."""
        info = {
            "time_unit": "simulated seconds x 1e6 (microseconds)",
            "steps_traced": len(self.steps),
            "steps_left_out": self.steps_dropped,
            "requests_traced": len(self.requests),
            "requests_left_out": self.requests_dropped,
            **other,
        }
        return {"traceEvents": self.trace_events(), "displayTimeUnit": "ms", "otherData": info}

    def write_trace(self, path: str | Path, **other: Any) -> None:
        """Write :meth:`trace_document` atomically (temp file, then rename)."""
        from simcli.output import atomic_write_text

        atomic_write_text(Path(path), json.dumps(self.trace_document(**other)))


__all__ = ["SAMPLE_COLUMNS", "StepRecorder"]
