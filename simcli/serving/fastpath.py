"""The serving simulator's fast path: a plain deployment simulated from arrays of arrivals.

Most runs are plain: one engine per replica (pp 1), no speculative decoding, branches,
disaggregation, shared prefixes, sliding-window KV, swap preemption, timeline recorder or
invariant checks. For them :func:`run` replaces the event objects, the ``Request`` and
``Sequence`` objects, the ``Batch`` objects and the per-iteration method calls of
:mod:`simcli.serving.engine` and :mod:`simcli.serving.schedulers` by one loop over flat
per-replica state, and the per-sample histogram updates of
:class:`~simcli.serving.metrics.Metrics` by buffers flushed in vectorised batches. The
mechanism is the same step for step -- the vLLM, Orca and Sarathi-Serve admissions and
token budgets, the watermark, the lockstep decode batch with its per-residue block
counting, preemption of the newest decode by recompute, the routers, the step prices and
so the clock -- so a run reports what the general loop reports
(``tests/simcli/serving/test_fastpath.py`` compares every summary key, per-replica row
and per-request row on scenarios chosen to preempt, cap outputs and refuse prompts). Only
float sums are added in another order (histogram totals, KV-time, energy): they agree to
about 1e-12. It exists for speed (issue 18: a million requests in seconds).

Events at the same instant: an iteration that ends exactly when a request arrives is
finished first (the general loop orders such ties by when the events were created).
"""

from __future__ import annotations

import gc
import heapq
import math
from array import array
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from simcli.serving.requests import Request, RequestChunk

if TYPE_CHECKING:
    from collections.abc import Iterable

    from simcli.serving.metrics import EnergyMeter

FLUSH = 65536  # buffered samples per vectorised histogram update
_NONE: list = []  # an empty list never appended to


def eligible(sim: Any, requests: object) -> bool:
    """Whether (``sim`` a :class:`~simcli.serving.simulator.Simulator`, which imports this
    module) :func:`run` can simulate ``requests`` on ``sim``: a
    :class:`~simcli.serving.requests.RequestStream` without shared prefixes, on a
    deployment without any of the features only the general loop models."""
    cfg = sim.config
    chunks = getattr(requests, "chunks", None)
    return (
        chunks is not None
        and not getattr(requests, "shared_prefixes", True)
        and cfg.disaggregation is None
        and cfg.speculative is None
        and sim.branching is None
        and cfg.pp == 1
        and cfg.scheduler.preemption == "recompute"
        and sim._capped_layout is None
        and sim.metrics.recorder is None
        and not sim.check
        and all(r.step_summary is not None for r in sim.replicas)
    )


class _Seq:
    """One request's sequence. A plain class on purpose: the class attributes are the
    defaults, so creating one sets three fields."""

    generated = 0
    ctx = 0  # tokens in the KV cache (valid outside the decode batch)
    prefilled = 0
    blocks = 0
    last_token_s = 0.0
    first_s = -1.0  # first token time; -1 before it
    preempted = 0
    slot = -1
    join_dit = 0
    res = 0
    finish_dit = 0

    def __init__(self, rid: int, arrival_s: float, prompt: int, output: int) -> None:
        self.rid = rid
        self.arrival_s = arrival_s
        self.prompt = prompt
        self.output = output
        self.target = prompt  # tokens to have in the KV cache before the next token


class _Rep:
    """One replica's engine: queues, KV block count, lockstep decode batch (as
    :class:`~simcli.serving.batch.DecodeBatch`: a context is ``ctx0[slot] + dit``)."""

    def __init__(
        self, index: int, num_blocks: int, watermark: float, bs: int, price: Any, decode: Any
    ) -> None:
        self.index = index
        self.price = price  # the step model's step_s_summary
        self.decode_price = decode  # its decode-only case: (n, context sum) -> s
        self.num_blocks = num_blocks
        self.wm = int(watermark * num_blocks)
        self.used = 0
        self.peak = 0
        self.waiting: deque[_Seq] = deque()
        self.prefilling: list[_Seq] = []
        self.seqs: list[_Seq] = []
        self.ctx0: list[int] = []
        self.n = 0
        self.dit = 0
        self.sum_ctx0 = 0
        self.res = [0] * bs
        self.finish: dict[int, list[_Seq]] = {}
        self.joins: list[_Seq] = []
        self.queued = 0
        self.last_dec_end = 0.0
        self.preemptions = 0
        self.busy_s = 0.0
        self.batch: tuple | None = None  # (prefill seqs, their new tokens, decodes, joined)
        self.end_s = 0.0
        self.prefill_memo: dict[int, float] = {}  # a lone first prefill's price by length


def _decode_pricer(replica: Any) -> Any:
    """The step model's decode-only price ``(n, context sum) -> s``: its ``step_s_decode``
    when it has one, else ``step_s_summary`` with no prefills."""
    fn = getattr(replica.step_model, "step_s_decode", None)
    if fn is not None:
        return fn
    summary = replica.step_summary
    return lambda n, ctx_sum: summary(_NONE, _NONE, n, ctx_sum)


class _Buffers:
    """Finished requests and decode gaps waiting to be reduced in a vectorised batch into
    what ``Metrics.request_done`` and ``Metrics.tbt`` accumulate one by one (bounded:
    flushed at FLUSH)."""

    def __init__(self, metrics: Any) -> None:
        self.m = metrics
        self.arrival = array("d")
        self.first = array("d")
        self.finish = array("d")
        self.prompt = array("q")
        self.out = array("q")
        self.preempted = array("q")
        self.tbt = array("d")
        self.tbt_w = array("q")

    def flush(self) -> None:
        m = self.m
        if self.arrival:
            arr = np.array(self.arrival)
            first = np.array(self.first)
            fin = np.array(self.finish)
            out = np.array(self.out, dtype=np.int64)
            ttft = first - arr
            multi = out > 1
            tpot = (fin[multi] - first[multi]) / (out[multi] - 1)
            m.ttft.add_many(ttft)
            m.e2e.add_many(fin - arr)
            m.tpot.add_many(tpot)
            ok = ttft <= m.slo_ttft_s
            ok[multi] &= tpot <= m.slo_tpot_s
            m.completed += arr.size
            m.slo_met += int(ok.sum())
            m.prompt_tokens += int(np.array(self.prompt, dtype=np.int64).sum())
            m.output_tokens += int(out.sum())
            m.preempted_requests += int(np.count_nonzero(np.array(self.preempted)))
            m.first_arrival_s = min(m.first_arrival_s, float(arr.min()))
            m.last_finish_s = max(m.last_finish_s, float(fin.max()))
        if self.tbt:
            m.tbt_hist.add_many(np.array(self.tbt), np.array(self.tbt_w, dtype=np.int64))
        for a in (self.arrival, self.first, self.finish, self.prompt, self.out, self.preempted,
                  self.tbt, self.tbt_w):  # fmt: skip
            del a[:]


class _Iterations:
    """Each iteration's numbers, buffered and reduced in vectorised batches into what
    ``Metrics.iteration`` and ``EnergyMeter.add`` accumulate one by one (the same
    formulas; float sums in another order)."""

    def __init__(self, metrics: Any, num_blocks: int, meter: EnergyMeter | None) -> None:
        self.m = metrics
        self.num_blocks = num_blocks  # every replica's (one step model here)
        self.meter = meter
        self.dt = array("d")
        self.used = array("q")
        self.n_dec = array("q")
        self.ctx = array("q")
        self.pre_at = array("q")  # rows with prefill chunks: their count, sizes and past
        self.pre_len = array("q")
        self.pre_new = array("q")
        self.pre_past = array("q")

    def decode(self, dt: float, used: int, n_dec: int, ctx_sum: int) -> None:
        self.dt.append(dt)
        self.used.append(used)
        self.n_dec.append(n_dec)
        self.ctx.append(ctx_sum)
        if len(self.dt) >= FLUSH:
            self.flush()

    def mixed(
        self, dt: float, used: int, n_dec: int, ctx_sum: int, new: list[int], past: list[int]
    ) -> None:
        self.pre_at.append(len(self.dt))
        self.pre_len.append(len(new))
        self.pre_new.extend(new)
        self.pre_past.extend(past)
        self.decode(dt, used, n_dec, ctx_sum)

    def flush(self) -> None:
        if not self.dt:
            return
        m = self.m
        dt = np.frombuffer(self.dt, dtype=np.float64).copy()
        n_dec = np.frombuffer(self.n_dec, dtype=np.int64).copy()
        k = dt.size
        util = np.frombuffer(self.used, dtype=np.int64) / self.num_blocks
        m.iterations += k
        m.decode_seq_iters += int(n_dec.sum())
        m.kv_block_s += float(np.dot(util, dt))
        m.kv_util_max = max(m.kv_util_max, float(util.max()))
        m.engine_busy_s += float(dt.sum())
        lens = np.array(self.pre_len, dtype=np.int64)
        new = np.array(self.pre_new, dtype=np.int64)
        m.batched_tokens += int(new.sum()) + int(n_dec.sum())
        if self.meter is not None:
            self.meter.add_iterations(
                dt, n_dec, np.frombuffer(self.ctx, dtype=np.int64),
                np.repeat(np.array(self.pre_at, dtype=np.int64), lens), new,
                np.array(self.pre_past, dtype=np.int64),
            )  # fmt: skip
        for arr in (self.dt, self.used, self.n_dec, self.ctx, self.pre_at, self.pre_len,
                    self.pre_new, self.pre_past):  # fmt: skip
            del arr[:]


class _Loop:
    """The fast path's state and its loop (see the module docstring)."""

    def __init__(self, sim: Any) -> None:
        cfg = sim.config
        self.sim = sim
        self.cfg = cfg
        self.bs = cfg.block_size
        sc = cfg.scheduler
        self.kind = sc.kind
        self.max_seqs = (
            min(sc.max_batch_size, sc.chunk_size) if sc.kind == "sarathi" else (sc.max_batch_size)
        )
        self.max_tokens = sc.max_tokens
        self.chunk = sc.chunk_size
        self.m = sim.metrics
        self.buf = _Buffers(sim.metrics)
        self.reps = [
            _Rep(
                r.index,
                r.blocks_per_engine,
                sc.watermark,
                self.bs,
                r.step_summary,
                _decode_pricer(r),
            )
            for r in sim.replicas
        ]
        meters = {id(r.energy): r.energy for r in sim.replicas if r.energy is not None}
        assert len(meters) <= 1  # one step model, so one meter (or none)
        meter = next(iter(meters.values()), None)
        self.its = _Iterations(sim.metrics, sim.replicas[0].blocks_per_engine, meter)
        self.completed = 0
        self.outs = [0] * len(self.reps)  # unfinished requests per replica (the routers')
        self.heap: list[tuple[float, int, int]] = []  # (iteration end, order, replica)
        self.seq_no = 0
        self.sink = sim.metrics.sink

    # --- the decode batch ----------------------------------------------------------------
    def _dec_add(self, r: _Rep, s: _Seq) -> None:
        n = r.n
        c0 = s.ctx - r.dit
        r.ctx0.append(c0)
        r.seqs.append(s)
        r.sum_ctx0 += c0
        r.n = n + 1
        s.slot = n
        s.join_dit = r.dit
        key = c0 % self.bs
        s.res = key
        r.res[key] += 1
        fd = r.dit + s.output - s.generated
        s.finish_dit = fd
        bucket = r.finish.get(fd)
        if bucket is None:
            r.finish[fd] = [s]
        else:
            bucket.append(s)

    def _dec_remove(self, r: _Rep, s: _Seq) -> None:
        """Leave the decode batch (``last_token_s``, ``ctx``, ``generated`` and ``blocks``
        brought up to date)."""
        d = r.dit - s.join_dit
        if d > 0:
            s.last_token_s = r.last_dec_end
        s.ctx += d
        s.generated += d
        slot = s.slot
        last = r.n - 1
        ctx0 = r.ctx0
        r.sum_ctx0 -= ctx0[slot]
        if slot != last:
            moved = r.seqs[last]
            r.seqs[slot] = moved
            ctx0[slot] = ctx0[last]
            moved.slot = slot
        r.seqs.pop()
        ctx0.pop()
        r.n = last
        r.res[s.res] -= 1
        s.slot = -1
        s.blocks = -(-s.ctx // self.bs)

    # --- scheduling ----------------------------------------------------------------------
    def _admit(self, r: _Rep, pre: list, new: list, past: list, room: int, chunked: bool) -> None:
        """Admit waiting sequences FCFS while seats, tokens and KV blocks allow
        (``Scheduler._admit``)."""
        waiting = r.waiting
        bs = self.bs
        max_seqs = self.max_seqs
        while waiting and r.n + len(r.prefilling) < max_seqs:
            s = waiting[0]
            target = s.target
            cost = -(-target // bs)
            if chunked:
                if room <= 0:
                    break
                n = target if target < room else room
            else:
                n = target
                if n > room and pre:
                    break
            mark = r.wm if (r.n or r.prefilling) else 0
            if r.num_blocks - r.used - cost < mark:
                break
            waiting.popleft()
            r.queued -= cost
            s.blocks = cost
            r.used += cost
            if r.used > r.peak:
                r.peak = r.used
            s.prefilled = 0
            r.prefilling.append(s)
            pre.append(s)
            new.append(n)
            past.append(0)
            room -= n

    def _decodes(self, r: _Rep) -> tuple[int, list]:
        """Blocks for every decode's next token, preempting the newest by recompute while
        they do not fit (``Engine.reserve_decode_blocks``); the decodes and the sequences
        that joined since the last decode iteration."""
        bs = self.bs
        need = r.res[-r.dit % bs]
        while need > r.num_blocks - r.used and r.n:
            seqs = r.seqs
            victim = seqs[0]
            for s in seqs:
                if s.arrival_s > victim.arrival_s:
                    victim = s
            if victim.res == -r.dit % bs:
                need -= 1
            self._dec_remove(r, victim)
            r.used -= victim.blocks
            victim.blocks = 0
            victim.preempted += 1
            r.preemptions += 1
            victim.target = victim.ctx + 1
            victim.prefilled = 0
            victim.ctx = 0
            r.waiting.appendleft(victim)
            r.queued += -(-victim.target // bs)
        if need > 0:
            r.used += need
            if r.used > r.peak:
                r.peak = r.used
        joined: list = []
        if r.n and r.joins:
            seen: dict[int, _Seq] = {}
            for s in r.joins:
                if s.slot >= 0:
                    seen[id(s)] = s
            joined = list(seen.values())
            r.joins = []
        return r.n, joined

    def _schedule(self, r: _Rep) -> tuple | None:
        pre: list[_Seq] = []
        new: list[int] = []
        past: list[int] = []
        kind = self.kind
        n_dec = 0
        joined: list = []
        if kind == "vllm":
            if r.waiting:
                self._admit(r, pre, new, past, self.max_tokens, False)
                if pre:
                    return pre, new, past, 0, joined
            if not r.n:
                return None
            n_dec, joined = self._decodes(r)
            if n_dec:
                return pre, new, past, n_dec, joined
            if r.waiting:  # everything was preempted: prefill again
                self._admit(r, pre, new, past, self.max_tokens, False)
            return (pre, new, past, 0, joined) if pre else None
        if r.n:
            n_dec, joined = self._decodes(r)
        if kind == "orca":
            if r.waiting:
                self._admit(r, pre, new, past, self.max_tokens - n_dec, False)
        else:  # sarathi
            room = self.chunk - n_dec
            for s in r.prefilling:
                if room <= 0:
                    break
                todo = s.target - s.prefilled
                k = todo if todo < room else room
                pre.append(s)
                new.append(k)
                past.append(s.prefilled)
                room -= k
            if room > 0 and r.waiting:
                self._admit(r, pre, new, past, room, True)
        return (pre, new, past, n_dec, joined) if pre or n_dec else None

    def _start(self, r: _Rep, now: float) -> bool:
        """Schedule, price and launch ``r``'s next iteration if there is work
        (``Engine.try_start``; ``Metrics.iteration`` through :class:`_Iterations`)."""
        if r.n and not r.waiting and not r.prefilling:  # decode-only, whatever the scheduler
            n_dec = r.n
            need = r.res[-r.dit % self.bs]
            if need > r.num_blocks - r.used or r.joins:
                n_dec, joined = self._decodes(r)
                if not n_dec:  # everything was preempted: prefill again
                    return self._start(r, now)
            else:
                joined = _NONE
                if need:
                    r.used += need
                    if r.used > r.peak:
                        r.peak = r.used
            ctx_sum = r.sum_ctx0 + n_dec * r.dit
            dt = r.decode_price(n_dec, ctx_sum) + 0.0
            r.batch = (_NONE, _NONE, _NONE, n_dec, joined)
            self.its.decode(dt, r.used, n_dec, ctx_sum)
        else:
            batch = self._schedule(r)
            if batch is None:
                return False
            pre, new, past, n_dec, _ = batch
            ctx_sum = r.sum_ctx0 + r.n * r.dit if n_dec else 0
            if n_dec or len(new) != 1 or past[0]:
                dt = r.price(new, past, n_dec, ctx_sum) + 0.0
            else:  # a lone first prefill: priced by its length alone
                dt = r.prefill_memo.get(new[0])
                if dt is None:
                    dt = r.prefill_memo[new[0]] = r.price(new, past, 0, 0) + 0.0
            r.batch = batch
            self.its.mixed(dt, r.used, n_dec, ctx_sum, new, past)
        r.busy_s += dt
        r.end_s = now + dt
        return True

    # --- an iteration's end --------------------------------------------------------------
    def _prefilled(self, r: _Rep, pre: list[_Seq], new: list[int], now: float) -> None:
        """Engine.finish_batch's prefill part: the chunks ran; finished prompts produce
        their first token and join the decode batch (or finish)."""
        buf = self.buf
        for s, k in zip(pre, new, strict=True):
            s.prefilled += k
            if s.prefilled < s.target:
                continue
            r.prefilling.remove(s)
            s.ctx = s.target
            s.generated += 1
            if s.first_s < 0:
                s.first_s = now
            else:  # its first token after a recompute preemption
                buf.tbt.append(now - s.last_token_s)
                buf.tbt_w.append(1)
            s.last_token_s = now
            if s.generated >= s.output:
                self._done(r, s, now)
            else:
                self._dec_add(r, s)
                r.joins.append(s)

    def _done(self, r: _Rep, s: _Seq, now: float) -> None:
        """``s`` produced its last token: free its blocks, record the request
        (``Engine.finish_sequence`` and ``Metrics.request_done``)."""
        r.used -= s.blocks
        s.blocks = 0
        self.outs[r.index] -= 1
        buf = self.buf
        buf.arrival.append(s.arrival_s)
        buf.first.append(s.first_s)
        buf.finish.append(now)
        buf.prompt.append(s.prompt)
        buf.out.append(s.output)
        buf.preempted.append(s.preempted)
        if self.sink is not None:
            req = Request(s.rid, s.arrival_s, s.prompt, s.output)
            req.first_token_s = s.first_s
            req.finish_s = now
            req.replica = r.index
            req.preemptions = s.preempted
            self.sink(req)
        self.completed += 1
        m = self.m
        if self.completed >= m._progress_next:
            m._progress_next += m._progress_every
            m.progress(self.completed, m.progress_total)

    # --- the loop ------------------------------------------------------------------------
    def _advance(self, until: float) -> float:
        """Finish every iteration ending by ``until`` and start each engine's next, in time
        order; the time of the last one (-1: none). The decode iteration that follows a
        decode iteration -- most of them -- is handled inline here; the rest by
        :meth:`_finish` and :meth:`_start`."""
        heap = self.heap
        if not heap or heap[0][0] > until:
            return -1.0
        pop, push = heapq.heappop, heapq.heappush
        reps = self.reps
        bs = self.bs
        tbt, tbt_w = self.buf.tbt, self.buf.tbt_w
        its = self.its
        i_dt, i_used, i_ndec, i_ctx = its.dt, its.used, its.n_dec, its.ctx
        seq_no = self.seq_no
        now = -1.0
        while heap and heap[0][0] <= until:
            now, _, i = pop(heap)
            r = reps[i]
            pre, new, _, n_dec, joined = r.batch  # type: ignore[misc]
            r.batch = None
            if n_dec:  # Engine.finish_batch's decode part
                dit = r.dit = r.dit + 1
                old = n_dec - len(joined)
                if old:
                    tbt.append(now - r.last_dec_end)
                    tbt_w.append(old)
                for s in joined:
                    tbt.append(now - s.last_token_s)
                    tbt_w.append(1)
                r.last_dec_end = now
                done = r.finish.pop(dit, None)
                if done:
                    for s in done:  # skip stale entries (preempted, maybe rejoined)
                        if s.slot >= 0 and s.finish_dit == dit:
                            s.finish_dit = -1
                            self._dec_remove(r, s)
                            self._done(r, s, now)
            if pre:
                self._prefilled(r, pre, new, now)
            n = r.n
            if n and not r.waiting and not r.prefilling:
                need = r.res[-r.dit % bs]
                if need <= r.num_blocks - r.used:  # decode-only, nothing preempted
                    if need:
                        used = r.used = r.used + need
                        if used > r.peak:
                            r.peak = used
                    joined = _NONE
                    if r.joins:  # Scheduler._decodes: who joined since, once each
                        joined = [x for x in r.joins if x.slot >= 0]
                        if len(joined) > 1:
                            joined = list({id(x): x for x in joined}.values())
                        r.joins = []
                    ctx_sum = r.sum_ctx0 + n * r.dit
                    dt = r.decode_price(n, ctx_sum) + 0.0
                    r.batch = (_NONE, _NONE, _NONE, n, joined)
                    i_dt.append(dt)
                    i_used.append(r.used)
                    i_ndec.append(n)
                    i_ctx.append(ctx_sum)
                    r.busy_s += dt
                    end = r.end_s = now + dt
                    seq_no += 1
                    push(heap, (end, seq_no, i))
                    continue
            if self._start(r, now):
                seq_no += 1
                push(heap, (r.end_s, seq_no, i))
        self.seq_no = seq_no
        if len(i_dt) >= FLUSH:
            its.flush()
        if len(tbt) >= FLUSH or len(self.buf.arrival) >= FLUSH:
            self.buf.flush()
        return now

    def run(self, chunks: Iterable[RequestChunk]) -> float:
        """Simulate every request of ``chunks``; the time of the last event."""
        sim = self.sim
        reps = self.reps
        heap = self.heap
        push = heapq.heappush
        start, advance = self._start, self._advance
        router = self.cfg.router
        outs = self.outs  # unfinished requests per replica
        rr = 0
        nrep = len(reps)
        bs = self.bs
        now = 0.0
        for chunk in chunks:
            arrivals, prompts, outputs = sim.admissible(chunk)
            rid = chunk.first_id
            for ta, p, o in zip(arrivals, prompts, outputs, strict=True):
                if o == 0:  # refused: longer than the max model length
                    rid += 1
                    continue
                if heap and heap[0][0] <= ta:
                    advance(ta)
                now = ta
                if router == "least_outstanding":  # the first of the fewest
                    r = reps[outs.index(min(outs))]
                elif router == "round_robin":
                    r = reps[rr]
                    rr = (rr + 1) % nrep
                else:  # kv_aware without prefixes: most free blocks net of queued demand
                    r = reps[0]
                    score = (r.num_blocks - r.used - r.queued, -outs[0])
                    for x in reps:
                        sx = (x.num_blocks - x.used - x.queued, -outs[x.index])
                        if sx > score:
                            r, score = x, sx
                s = _Seq(rid, ta, p, o)
                rid += 1
                outs[r.index] += 1
                r.waiting.append(s)
                r.queued += -(-p // bs)
                if r.batch is None and start(r, ta):
                    self.seq_no += 1
                    push(heap, (r.end_s, self.seq_no, r.index))
        last = advance(math.inf)
        now = max(now, last)
        self.buf.flush()
        self.its.flush()
        for r, rep in zip(reps, sim.replicas, strict=True):
            eng = rep.engines[0]
            eng.preemptions = r.preemptions
            eng.busy_s = r.busy_s
            eng.kv.used_blocks = r.used
            eng.kv.peak_used_blocks = r.peak
            rep.outstanding = eng.outstanding = outs[r.index]
        return now


def run(sim: Any, requests: Any) -> float:
    """Simulate ``requests`` (a RequestStream; see :func:`eligible`) on ``sim``'s replicas,
    leaving the results where :meth:`Simulator.result` reads them; the time of the last
    event. The cyclic garbage collector is paused meanwhile: the loop makes no reference
    cycles (refcounting frees all it drops), and its collections of the live sequences
    cost several percent."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _Loop(sim).run(requests.chunks())
    finally:
        if paused:
            gc.enable()


__all__ = ["eligible", "run"]
