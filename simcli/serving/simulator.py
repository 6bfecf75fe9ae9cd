"""The discrete-event serving simulator: arrivals, routing, replica iterations.

Events sit in one heap ordered by ``(time_s, insertion order)``; each event's ``handle``
returns the events that follow (an :class:`Arrival` routes its request and yields the next
arrival plus any iteration it starts; a replica's ``BatchDone`` yields its next iteration).
Arrivals are pulled from a stream one at a time, so the heap holds one arrival plus at
most one iteration per engine: memory does not grow with the number of requests.

Each engine iteration calls ``StepModel.step_s`` exactly once (the contract in
``simcli.serving``); everything else per iteration is O(1) Python plus one numpy add (see
``batch.DecodeBatch``). A speculative iteration calls the draft's ``step_s`` and the
target's ``verify_step_s`` once each instead (:mod:`simcli.serving.spec`). A plain
deployment given a :class:`~simcli.serving.requests.RequestStream` of 20,000 requests or
more runs :mod:`simcli.serving.fastpath` instead: the same mechanism compiled with numba
over flat arrays, about 20 times faster once numba has started (~0.7 s a process).

Optional features, each off by default and each a field of :class:`ServeConfig`:

- ``disaggregation`` (:mod:`simcli.serving.disagg`): prefill and decode pools, each with
  its own step model (TP), joined by priced KV transfers.
- ``speculative`` (:mod:`simcli.serving.spec`): a draft model on every replica's GPUs.
- ``branching`` (:mod:`simcli.serving.branches`): N branches per request, early stopping
  at M, SART-style pruning.
- ``max_concurrency`` (:mod:`simcli.serving.load`): a closed loop, at most N requests in
  flight (completions release the next sends, so it runs on this loop, never the kernel).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from simcli.serving import fastpath
from simcli.serving.batch import CappedDecodeBatch, StepModelLike
from simcli.serving.branches import BranchConfig, BranchState, BranchStats
from simcli.serving.disagg import (
    DisaggConfig,
    Disaggregation,
    KVTransferModel,
    check_compatible,
    default_transfer,
    pool_summary,
)
from simcli.serving.frontend import with_frontend
from simcli.serving.load import ClientArrival, ClientPool
from simcli.serving.metrics import EnergyMeter, Metrics
from simcli.serving.replica import Replica
from simcli.serving.requests import (
    Request,
    RequestChunk,
    output_within_model_len,
    outputs_within_model_len,
    with_image_tokens,
)
from simcli.serving.router import make_router
from simcli.serving.schedulers import ENGINE_SCHEDULERS, make_scheduler
from simcli.serving.serve_config import ServeConfig, SimulationError
from simcli.serving.spec import (
    SpecConfig,
    SpecCost,
    SpecDecodeBatch,
    SpecStats,
    spec_kv_capacity_tokens,
)
from simcli.serving.timeline import StepRecorder


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
    """The event loop over a deployment's replicas.

    Step models: ``step_model`` serves every replica; with disaggregation
    ``prefill_step_model`` / ``decode_step_model`` (default ``step_model``) serve the two
    pools (their TP may differ). ``draft_step_model`` (and ``tiny_step_model`` for a
    speculative hierarchy) price the drafts of ``config.speculative``. ``kv_transfer``
    prices KV transfers (default: from the prefill step model's cost model).
    ``branch_output_lengths``: output lengths that branches resample when
    ``config.branching.output_len`` is not given (a trace's). ``kv_capacity_tokens``
    overrides every replica's KV capacity. ``progress(completed, total)`` is called about
    200 times as requests complete (``progress_total`` the number expected, None when
    unknown) and once at the end; ``recorder`` (a
    :class:`~simcli.serving.timeline.StepRecorder`) sees every iteration and completion.
    """

    def __init__(
        self,
        step_model: StepModelLike,
        config: ServeConfig,
        *,
        kv_capacity_tokens: int | None = None,
        sink: Callable[[Request], None] | None = None,
        energy: EnergyMeter | None = None,
        check: bool = False,
        prefill_step_model: StepModelLike | None = None,
        decode_step_model: StepModelLike | None = None,
        draft_step_model: object = None,
        tiny_step_model: object = None,
        kv_transfer: KVTransferModel | None = None,
        branch_output_lengths: np.ndarray | None = None,
        progress: Callable[[int, int | None], None] | None = None,
        progress_total: int | None = None,
        recorder: StepRecorder | None = None,
    ) -> None:
        self.config = config
        self.step_model = step_model
        self.decode_step_model = (
            decode_step_model
            if config.disaggregation is not None and decode_step_model
            else step_model
        )
        bs = config.block_size
        util = config.gpu_memory_utilization
        spec = config.speculative
        dis = config.disaggregation
        self.metrics = Metrics(
            slo_ttft_s=config.slo_ttft_s, slo_tpot_s=config.slo_tpot_s, sink=sink, energy=energy
        )
        sched = make_scheduler(config.scheduler)
        # per priority class metrics with a priority scheduler (and with requests that
        # carry priorities: run() turns it on)
        self.metrics.track_priority = config.scheduler.kind == "priority"
        if config.scheduler.kind in ENGINE_SCHEDULERS and (
            dis is not None
            or spec is not None
            or (config.branching is not None and config.branching.branches > 1)
            or config.scheduler.preemption == "swap"
        ):
            raise SimulationError(
                f"scheduler {config.scheduler.kind} with disaggregation, speculative decoding, "
                "branches or swap preemption is not modelled; allowed: vllm, orca or sarathi"
            )
        gpr = config.gpus_per_replica
        if spec is not None:
            if draft_step_model is None:
                raise SimulationError(
                    "speculative decoding needs the draft model's steps (draft_step_model)"
                )
            if spec.tiny_k and tiny_step_model is None:
                raise SimulationError(
                    "a speculative hierarchy needs the tiny model's steps (tiny_step_model)"
                )
            _check_vocab(step_model, draft_step_model, "draft")
            if spec.tiny_k:
                _check_vocab(step_model, tiny_step_model, "tiny draft")
        drafts = [
            d for d in (draft_step_model, tiny_step_model if spec and spec.tiny_k else None) if d
        ]

        def capacity(model: StepModelLike, with_drafts: bool) -> int:
            if kv_capacity_tokens is not None:
                return kv_capacity_tokens
            if with_drafts and drafts:
                try:
                    return spec_kv_capacity_tokens(model, drafts, bs, util)
                except ValueError as exc:
                    raise SimulationError(str(exc).splitlines()[0]) from None
            return int(model.kv_capacity_tokens(bs, util))

        def check_blocks(tokens: int) -> None:
            if tokens // bs // config.pp < 1:
                raise SimulationError(
                    f"no room for the KV cache: {tokens} tokens per replica "
                    f"(block size {bs}, pp {config.pp}); allowed: a model that leaves GPU memory "
                    "for at least one KV block (more --tp/--pp, a bigger GPU, a higher "
                    "--gpu-memory-utilization)"
                )

        def build(
            index: int, model: StepModelLike, cap: int, gpus: int, meter: EnergyMeter | None
        ) -> Replica:
            spec_cost = decode_batch = None
            kv_bytes = None
            layout = getattr(model, "kv_layout", None)
            units = 1
            if layout is not None and layout.special:
                if spec is not None or self.branching is not None:
                    raise SimulationError(
                        "a sliding-window KV layout (--attn-pattern window:...) is not "
                        "simulated together with speculative decoding or branches; allowed: "
                        "one of them"
                    )
                units = layout.units

                def decode_batch(i: int) -> CappedDecodeBatch:
                    return CappedDecodeBatch(bs, layout)

            if spec is not None:
                spec_cost = SpecCost(spec, model, draft_step_model, tiny_step_model)
                stats = self.spec_stats

                def decode_batch(i: int, _r: int = index) -> SpecDecodeBatch:
                    rng = np.random.default_rng((config.seed, _r, i, 0x5BEC))
                    return SpecDecodeBatch(bs, spec, rng, stats)

                kv_bytes = float(model.kv_bytes_per_token) + sum(
                    float(d.kv_bytes_per_token) for d in drafts
                )
            rep = Replica(
                index,
                model,
                sched,
                self.metrics,
                kv_capacity_tokens=cap,
                block_size=bs,
                pp=config.pp,
                prefix_caching=config.prefix_caching,
                watermark=config.scheduler.watermark,
                swap_bytes_per_s=config.swap_bytes_per_s * gpus,
                spec=spec_cost,
                decode_batch=decode_batch,
                kv_bytes_per_token=kv_bytes,
                gpus=gpus,
                block_units=units,
            )
            rep.energy = meter
            rep.branch_stats = self.branch_stats  # type: ignore[assignment]
            return rep

        self.spec_stats = SpecStats() if spec is not None else None
        self.draft_steps = tuple(drafts)
        self.branching = (
            config.branching
            if config.branching is not None and config.branching.branches > 1
            else None
        )
        self.branch_stats = BranchStats() if self.branching is not None else None
        self.branch_output_lengths = branch_output_lengths
        self.disagg: Disaggregation | None = None
        if dis is None:
            cap = capacity(step_model, True)
            check_blocks(cap)
            self.replicas = [build(i, step_model, cap, gpr, energy) for i in range(config.replicas)]
            self.entry = self.replicas
            self.kv_capacity_tokens = cap
            self.prefill_capacity_tokens = cap
        else:
            pre_model = prefill_step_model or step_model
            dec_model = decode_step_model or step_model
            pre_cap, dec_cap = capacity(pre_model, False), capacity(dec_model, True)
            check_blocks(pre_cap)
            check_blocks(dec_cap)
            pg = dis.prefill_gpus_per_replica or gpr
            dg = dis.decode_gpus_per_replica or gpr
            pre_meter = _meter_for(pre_model, energy)
            dec_meter = _meter_for(dec_model, energy)
            pre = [build(i, pre_model, pre_cap, pg, pre_meter) for i in range(dis.prefill_replicas)]
            dec = [
                build(dis.prefill_replicas + i, dec_model, dec_cap, dg, dec_meter)
                for i in range(dis.decode_replicas)
            ]
            try:  # the decode pool reads what the prefill pool wrote
                check_compatible(pre_model, dec_model)
                if kv_transfer is None:
                    kv_transfer = default_transfer(dis, pre_model, dec_model, pg, dg)
            except ValueError as exc:
                raise SimulationError(str(exc).splitlines()[0]) from None
            self.disagg = Disaggregation(dis, pre, dec, kv_transfer, sched.max_seqs, self.metrics)
            self.replicas = pre + dec
            self.entry = pre
            self.kv_capacity_tokens = dec_cap
            self.prefill_capacity_tokens = pre_cap
        self.engine_capacity_tokens = self.kv_capacity_tokens // bs // config.pp * bs
        self.prefill_engine_capacity_tokens = self.prefill_capacity_tokens // bs // config.pp * bs
        self.lookahead = spec.lookahead if spec is not None else 1
        # a capped (sliding-window) KV layout: a request fits by the units it holds at most
        layout = getattr(self.decode_step_model, "kv_layout", None)
        self._capped_layout = layout if layout is not None and layout.special else None
        self.router = make_router(config.router)
        self.metrics.set_progress(progress, progress_total)
        if recorder is not None:
            recorder.bind(self.replicas)
            self.metrics.recorder = recorder
        self.check = check
        self.now_s = 0.0
        self.arrived = 0
        self.rejected_too_long = 0  # prompts beyond max_model_len: refused, not simulated
        self.output_capped = 0  # requests whose output (or a branch's) was cut to fit
        self._stream: Iterator[Request] | None = None
        self._last_arrival_s = 0.0
        # closed loop (simcli.serving.load): arrivals wait for a client slot; completions
        # free slots through Release events that run() pushes after the current event
        self.clients = ClientPool(config.max_concurrency) if config.max_concurrency else None
        if self.clients is not None:
            user_sink, pool = self.metrics.sink, self.clients

            def sink(req: Request) -> None:
                pool.request_done(req)
                if user_sink is not None:
                    user_sink(req)

            self.metrics.sink = sink

    # --- events -----------------------------------------------------------------------------
    def arrive(self, req: Request, now_s: float) -> list:
        limit = self.config.max_model_len
        out = output_within_model_len(req.prompt_tokens, req.output_tokens, limit)
        if out == 0:  # vLLM refuses the prompt: counted, never routed
            self.rejected_too_long += 1
            nxt = self._next_arrival(now_s)
            return [nxt] if nxt is not None else []
        capped = out != req.output_tokens
        if capped:
            req = req.with_output(out)
        if self.branching is not None:
            st = BranchState.draw(self.branching, req, self.config.seed, self.branch_output_lengths)
            if limit is not None:  # every branch stops at the limit too
                cut = np.minimum(st.lengths, max(1, limit - req.prompt_tokens))
                capped = capped or bool((cut != st.lengths).any())
                st.lengths = cut
            req.branch = st
            req.seqs_left = self.branching.m
            out = int(st.lengths.max())
            bs = self.config.block_size
            root = -(-req.prompt_tokens // bs) + (self.branching.branches - 1) * (
                1 if req.prompt_tokens % bs else 0
            )
            if root * bs > self.prefill_engine_capacity_tokens:
                raise SimulationError(
                    f"request {req.id}'s prompt of {req.prompt_tokens} tokens and "
                    f"{self.branching.branches} branches need {root} KV blocks but a replica "
                    f"holds {self.prefill_engine_capacity_tokens // bs}; allowed: fewer "
                    "branches, shorter prompts or more KV room"
                )
        need = req.prompt_tokens + out - 2 + self.lookahead
        if not self._fits(need, req.prompt_tokens):
            raise self._too_big(req.id, need, req.prompt_tokens, out)
        self.output_capped += capped
        self.arrived += 1
        replica = self.router.choose(self.entry, req)
        events = replica.add_request(req, now_s)
        nxt = self._next_arrival(now_s)
        if nxt is not None:
            events.append(nxt)
        return events

    def _too_big(self, rid: int, need: int, prompt: int, out: int) -> SimulationError:
        lay = self._capped_layout
        held = (
            f" (its window layers hold at most {lay.cap_tokens(self.config.block_size)})"
            if lay is not None
            else ""
        )
        return SimulationError(
            f"request {rid} needs {need} tokens of KV cache (prompt {prompt} + output {out}"
            f"{f' + lookahead {self.lookahead - 1}' if self.lookahead > 1 else ''}){held} "
            f"but a replica{' engine' if self.config.pp > 1 else ''} holds "
            f"{min(self.engine_capacity_tokens, self.prefill_engine_capacity_tokens)}; "
            "allowed: shorter requests or more KV room (more --tp, a bigger GPU)"
        )

    def admissible(self, chunk: RequestChunk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fast path's :meth:`arrive` and stream checks of a chunk, vectorised: arrival
        times, prompts and outputs (0: refused, the prompt beyond ``max_model_len``; cut
        to fit it otherwise). Counts the arrivals, refusals and cuts; raises what
        :meth:`arrive` would for the chunk's first bad request (no capped layout here)."""
        a, p, o = chunk.arrival_s, chunk.prompt_tokens, chunk.output_tokens
        out = outputs_within_model_len(p, o, self.config.max_model_len)
        prev = np.concatenate(([self._last_arrival_s], a[:-1]))
        bad_stream = ~(a >= prev) | ~np.isfinite(a) | (p < 1) | (o < 1)
        served = out > 0
        need = p + out - 2 + self.lookahead
        bad_fit = served & (
            (need > self.engine_capacity_tokens) | (p > self.prefill_engine_capacity_tokens)
        )
        bad = np.flatnonzero(bad_stream | bad_fit)
        if bad.size:
            i = int(bad[0])
            rid = chunk.first_id + i
            err = _bad_request(rid, float(a[i]), float(prev[i]), int(p[i]), int(o[i]))
            raise err or self._too_big(rid, int(need[i]), int(p[i]), int(out[i]))
        self._last_arrival_s = float(a[-1])
        self.rejected_too_long += int((~served).sum())
        self.output_capped += int((served & (out != o)).sum())
        self.arrived += int(served.sum())
        return (np.ascontiguousarray(a, dtype=np.float64), np.ascontiguousarray(p, dtype=np.int64),
                np.ascontiguousarray(out, dtype=np.int64))  # fmt: skip

    def _fits(self, need: int, prompt: int) -> bool:
        """Whether a request's ``need`` tokens of KV (its prompt's on the prefill side) fit
        one engine; with a capped layout, by the block units it holds at most (a window
        model serves contexts longer than its cache)."""
        lay = self._capped_layout
        if lay is None:
            return need <= self.engine_capacity_tokens and (
                prompt <= self.prefill_engine_capacity_tokens
            )
        bs = self.config.block_size
        return lay.held_units(need, bs) <= lay.capacity_units(
            self.engine_capacity_tokens, bs
        ) and lay.held_units(prompt, bs) <= lay.capacity_units(
            self.prefill_engine_capacity_tokens, bs
        )

    def _next_arrival(self, now_s: float = 0.0) -> Arrival | ClientArrival | None:
        """The stream's next request as an event: an :class:`Arrival` at its time, or in
        a closed loop a :class:`~simcli.serving.load.ClientArrival` no earlier than
        ``now_s`` (the stream is read when the previous request was sent)."""
        assert self._stream is not None
        req = next(self._stream, None)
        if req is None:
            return None
        err = _bad_request(
            req.id, req.arrival_s, self._last_arrival_s, req.prompt_tokens, req.output_tokens
        )
        if err is not None:
            raise err
        self._last_arrival_s = req.arrival_s
        if self.clients is not None:
            return ClientArrival(req, max(req.arrival_s, now_s))
        return Arrival(req)

    # --- the loop ---------------------------------------------------------------------------
    def run(self, requests: Iterable[Request], compiled: bool | None = None) -> ServeResult:
        """Simulate ``requests`` (sorted by arrival); a plain deployment given a
        :class:`~simcli.serving.requests.RequestStream` runs on the compiled fast path
        (:mod:`simcli.serving.fastpath`, the same result sooner) when that pays:
        ``compiled`` True / False forces the choice, None leaves it to the stream's size
        (:func:`~simcli.serving.fastpath.worth_compiling`)."""
        if getattr(requests, "priorities", False):
            self.metrics.track_priority = True
        if self.config.frontend.active:  # the API server in front of the engines
            requests = with_frontend(requests, self.config.frontend, self.clients is None)
        if self.config.image_tokens_per_request:  # a vision-language model's images
            requests = with_image_tokens(requests, self.config.image_tokens_per_request)
        if fastpath.eligible(self, requests) and fastpath.worth_compiling(requests, compiled):
            self.now_s = fastpath.run(self, requests)
            if not self.arrived and not self.rejected_too_long:
                raise SimulationError("no requests to simulate; allowed: at least one request")
            return self._finish_run()
        self._stream = iter(requests)
        first = self._next_arrival()
        if first is None:
            raise SimulationError("no requests to simulate; allowed: at least one request")
        heap: list = [(first.time_s, 0, first)]
        counter = itertools.count(1)
        push, pop = heapq.heappush, heapq.heappop
        now = 0.0
        check = self.check
        released = self.clients.released if self.clients is not None else []
        while heap:
            t, _, ev = pop(heap)
            if t < now:
                raise SimulationError(f"internal: time went backwards ({t} < {now})")
            now = t
            for nxt in ev.handle(self):
                push(heap, (nxt.time_s, next(counter), nxt))
            if released:  # closed loop: client slots freed by this event's completions
                for nxt in released:
                    push(heap, (nxt.time_s, next(counter), nxt))
                released.clear()
            if check:
                self.now_s = now
                for r in self.replicas:
                    r.check()
        self.now_s = now
        return self._finish_run()

    def _finish_run(self) -> ServeResult:
        m = self.metrics
        if m.progress is not None:
            m.progress(m.completed, m.progress_total or m.completed)
        if self.arrived == 0:
            raise SimulationError(
                f"every one of the {self.rejected_too_long} requests has a prompt longer than "
                f"the max model length {self.config.max_model_len}; allowed: prompts of at "
                "most that many tokens (--max-model-len, up to the model's "
                "max_position_embeddings)"
            )
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
        out["max_model_len"] = cfg.max_model_len
        out["requests_rejected_too_long"] = self.rejected_too_long
        out["requests_output_capped"] = self.output_capped
        out["preemptions"] = sum(e.preemptions for e in engines)
        hits = sum(e.kv.prefix_hits for e in engines)
        out["prefix_cache_hits"] = hits
        out["prefix_cache_hit_tokens"] = sum(e.kv.prefix_hit_tokens for e in engines)
        gpus = cfg.gpus
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
        meters = {id(r.energy): r.energy for r in self.replicas if r.energy is not None}
        if m.energy is not None or meters:
            # iterations priced by the power model, idle power for the rest of the run
            # idle GPUs at their own idle power (pools of two GPU types differ)
            idle_ws = {mt.idle_w for mt in meters.values()}
            if len(idle_ws) > 1:
                idle_j = sum(
                    max(r.gpus * dur - sum(e.busy_s * r.gpus / r.pp for e in r.engines), 0.0)
                    * r.energy.idle_w  # type: ignore[union-attr]
                    for r in self.replicas
                )
            else:
                busy_gpu_s = sum(e.busy_s * r.gpus / r.pp for r in self.replicas for e in r.engines)
                idle_gpu_s = max(gpus * dur - busy_gpu_s, 0.0)
                idle_w = next(iter(idle_ws)) if meters else m.energy.idle_w  # type: ignore[union-attr]
                idle_j = idle_gpu_s * idle_w
            joules = sum(mt.busy_joules() for mt in meters.values()) + idle_j
            out["energy_kwh"] = joules / 3.6e6
            out["energy_j_per_output_token"] = joules / m.output_tokens if m.output_tokens else None
        else:
            out["energy_kwh"] = None
            out["energy_j_per_output_token"] = None
        out |= self._feature_summary()
        out |= self._kv_layout_summary()
        if self.clients is not None:  # closed loop only (open-loop output unchanged)
            out |= self.clients.summary(self.arrived)
        per = []
        for r in self.replicas:
            per.append(
                {
                    "replica": r.index,
                    "role": r.role,
                    "preemptions": sum(e.preemptions for e in r.engines),
                    "peak_kv_blocks": max(e.kv.peak_used_blocks for e in r.engines),
                    "kv_blocks": r.blocks_per_engine * len(r.engines),
                }
            )
        return ServeResult(summary=out, per_replica=per)

    def _kv_layout_summary(self) -> dict[str, float | int | str | None]:
        """With a sparse attention pattern: what its KV layout holds per sequence and how
        many more (fewer) sequences of ``max_model_len`` tokens fit than with dense KV.
        Absent without a pattern (dense output unchanged)."""
        model = self.decode_step_model
        layout = getattr(model, "kv_layout", None)
        if layout is None:
            return {}
        bs = self.config.block_size
        units = layout.units
        length = self.config.max_model_len
        out: dict[str, float | int | str | None] = {
            "kv_layout": layout.note,
            "kv_tokens_per_seq_cap": layout.cap_tokens(bs),
            "kv_bytes_per_token_factor": layout.bytes_factor,
        }
        if length:
            dense_blocks = -(-int(length) // bs)
            held = layout.held_units(int(length), bs)
            # pattern blocks (units) per replica over what one sequence holds; dense: the
            # same memory without the pattern's extra bytes per token
            out["kv_seqs_at_max_len"] = self.kv_capacity_tokens // bs * units // held
            dense_tokens = int(self.kv_capacity_tokens * layout.bytes_factor)
            out["kv_seqs_at_max_len_dense"] = dense_tokens // bs // dense_blocks
            out["kv_capacity_gain"] = units * dense_blocks / held / layout.bytes_factor
        return out

    def _feature_summary(self) -> dict[str, float | int | str | None]:
        """Keys of the optional features (None when a feature is off)."""
        cfg = self.config
        out: dict[str, float | int | str | None] = {}
        d, dis = self.disagg, cfg.disaggregation
        st = d.stats if d is not None else None
        n = st.count if st is not None else 0
        out["disaggregated"] = dis is not None
        out["prefill_replicas"] = dis.prefill_replicas if dis else None
        out["decode_replicas"] = dis.decode_replicas if dis else None
        out["kv_transfer"] = dis.kv_transfer if dis else None
        out["kv_capacity_tokens_prefill_replica"] = self.prefill_capacity_tokens if dis else None
        out["kv_transfers"] = n if dis else None
        out["kv_transfer_s_mean"] = st.transfer_s / n if n else None  # type: ignore[union-attr]
        out["kv_transfer_s_max"] = st.max_transfer_s if n else None  # type: ignore[union-attr]
        out["kv_transfer_exposed_s_mean"] = st.exposed_s / n if n else None  # type: ignore[union-attr]
        out["kv_transfer_wait_s_mean"] = st.wait_s / n if n else None  # type: ignore[union-attr]
        h = self.metrics.handoff
        out["kv_handoff_s_p50"] = h.quantile(0.5) if h.n else None
        out["kv_handoff_s_p99"] = h.quantile(0.99) if h.n else None
        out["kv_transfer_bytes"] = st.bytes if st is not None else None
        out |= pool_summary(
            dis,
            d.prefill if d is not None else [],
            d.decode if d is not None else [],
            self.metrics.duration_s,
            cfg.price_per_gpu_hour,
        )
        sp, ss = cfg.speculative, self.spec_stats
        out["spec_k"] = sp.k if sp else None
        out["spec_drafts"] = sp.drafts if sp else None
        out["spec_expected_accepted"] = sp.expected_accepted if sp else None
        steps = ss.seq_steps if ss is not None else 0
        out["spec_steps"] = steps if sp else None
        out["spec_accepted_tokens_per_step"] = ss.accepted / steps if steps else None  # type: ignore[union-attr]
        out["spec_tokens_per_step"] = ss.emitted / steps if steps else None  # type: ignore[union-attr]
        multi = sp is not None and sp.drafts > 1
        out["spectr_acceptance"] = sp.spectr if multi else None  # type: ignore[union-attr]
        out["spec_acceptance_single"] = float(sp.single_draft.mean()) if sp else None
        out["spec_acceptance_per_position"] = (
            ",".join(f"{a:.4g}" for a in sp.per_position) if sp else None
        )
        tri = sp is not None and sp.retrieval_budget is not None
        caches = [getattr(d, "cache_bytes_per_gpu", lambda: None)() for d in self.draft_steps]
        out["triforce_kv_budget"] = sp.retrieval_budget if tri else None  # type: ignore[union-attr]
        out["triforce_tiny_acceptance"] = sp.tiny_acceptance if tri and sp.tiny_k else None  # type: ignore[union-attr]
        out["triforce_acceptance"] = float(sp.per_position.mean()) if tri else None  # type: ignore[union-attr]
        out["triforce_retrieval_cache_gib_per_gpu"] = (
            caches[0] / 2**30 if tri and caches and caches[0] is not None else None
        )
        out["triforce_tiny_cache_gib_per_gpu"] = (
            caches[1] / 2**30 if tri and len(caches) > 1 and caches[1] is not None else None
        )
        b, bst = self.branching, self.branch_stats
        out["branches"] = b.branches if b else 1
        out["branches_stop"] = b.m if b else 1
        out["prune"] = b.prune if b else None
        out["branches_finished"] = bst.finished if bst else None
        out["branches_pruned"] = bst.pruned if bst else None
        out["branches_cancelled"] = bst.cancelled if bst else None
        out["branch_tokens_cancelled"] = bst.cancelled_tokens if bst else None
        out["answer_selection"] = b.answer if b else None
        out["answer_accuracy"] = (
            bst.answered_correct / bst.answered if bst and bst.answered else None
        )
        out["finished_branch_accuracy"] = (
            bst.finished_correct / bst.finished if bst and bst.finished else None
        )
        return out


def _bad_request(
    rid: int, arrival_s: float, previous_s: float, prompt: int, output: int
) -> SimulationError | None:
    """What is wrong with a request of a stream (out of order, not a time, empty), if
    anything: the stream checks of both loops."""
    if not arrival_s >= previous_s or not math.isfinite(arrival_s):
        return SimulationError(
            f"request {rid} arrives at {arrival_s} s, before the previous one "
            f"({previous_s} s); allowed: requests sorted by arrival time"
        )
    if prompt < 1 or output < 1:
        return SimulationError(
            f"request {rid} has prompt {prompt} and output {output} tokens; allowed: both >= 1"
        )
    return None


def _check_vocab(target: object, draft: object, what: str) -> None:
    tv = getattr(getattr(target, "model", None), "vocab_size", None)
    dm = getattr(draft, "model", None)
    dv = getattr(dm, "vocab_size", None)
    if tv is not None and dv is not None and tv != dv:
        raise SimulationError(
            f"{what} model {dm.id} has a vocabulary of {dv} tokens, the target "  # type: ignore[union-attr]
            f"{target.model.id} {tv}; allowed: a {what} model with the target's vocabulary"  # type: ignore[attr-defined]
        )


def _meter_for(model: StepModelLike, default: EnergyMeter | None) -> EnergyMeter | None:
    """A pool's own energy meter when energy is wanted (its TP differs from the run's)."""
    if default is None:
        return None
    return EnergyMeter.for_step_model(model) or default


def simulate(
    step_model: StepModelLike,
    requests: Iterable[Request],
    config: ServeConfig,
    *,
    kv_capacity_tokens: int | None = None,
    sink: Callable[[Request], None] | None = None,
    energy: EnergyMeter | None = None,
    check: bool = False,
    prefill_step_model: StepModelLike | None = None,
    decode_step_model: StepModelLike | None = None,
    draft_step_model: object = None,
    tiny_step_model: object = None,
    kv_transfer: KVTransferModel | None = None,
    branch_output_lengths: np.ndarray | None = None,
    progress: Callable[[int, int | None], None] | None = None,
    progress_total: int | None = None,
    recorder: StepRecorder | None = None,
) -> ServeResult:
    """Run ``requests`` (sorted by arrival) through ``config.replicas`` replicas (see
    :class:`Simulator` for the keyword arguments)."""
    return Simulator(
        step_model,
        config,
        kv_capacity_tokens=kv_capacity_tokens,
        sink=sink,
        energy=energy,
        check=check,
        prefill_step_model=prefill_step_model,
        decode_step_model=decode_step_model,
        draft_step_model=draft_step_model,
        tiny_step_model=tiny_step_model,
        kv_transfer=kv_transfer,
        branch_output_lengths=branch_output_lengths,
        progress=progress,
        progress_total=progress_total,
        recorder=recorder,
    ).run(requests)


__all__ = [
    "Arrival",
    "BranchConfig",
    "DisaggConfig",
    "KVTransferModel",
    "ServeConfig",
    "ServeResult",
    "SimulationError",
    "Simulator",
    "SpecConfig",
    "simulate",
]
