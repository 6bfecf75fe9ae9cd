"""The serving simulator's fast path: a plain deployment simulated from arrays of arrivals.

Most runs are plain: one engine per replica (pp 1), no speculative decoding, branches,
disaggregation, shared prefixes, sliding-window KV, swap preemption, timeline recorder or
invariant checks. For them :func:`run` replaces the event objects, the ``Request`` and
``Sequence`` objects, the ``Batch`` objects and the per-iteration method calls of
:mod:`simcli.serving.engine` and :mod:`simcli.serving.schedulers` by one compiled loop over
flat arrays (:mod:`simcli.serving.fastkernel`, numba), and the per-sample histogram updates
of :class:`~simcli.serving.metrics.Metrics` by buffers reduced here in vectorised batches.
The mechanism is the same step for step -- every scheduler's admissions, token budgets and
preemption victims (the functions of :mod:`simcli.serving.policy`, compiled), the lockstep
decode batch with its per-residue block counting, recompute preemption, the routers, the
step prices and so the clock -- so a run reports what the general loop reports
(``tests/simcli/serving/test_fastpath.py`` compares every summary key, per-replica row
and per-request row on scenarios chosen to preempt, cap outputs and refuse prompts). Only
float sums are added in another order (histogram totals, KV-time, energy): they agree to
about 1e-12. It exists for speed (issue 18: a million requests in seconds).

This module is the kernel's driver: it builds the arrays, feeds the arrival chunks, prices
the few iterations the compiled tables do not cover with the step model itself, reduces
the buffers, calls the sink and progress hooks, and writes the engines' counters back.
Without numba the general loop runs instead (:func:`eligible` is False). numba costs about
0.7 s a process before the kernel's first iteration (its import, its compiler's start,
the cached kernel's load) -- the general loop's time for about 20,000 requests -- so a
stream known to be shorter than :data:`COMPILE_FROM_REQUESTS` runs on the general loop
unless the caller asks for the kernel (:func:`worth_compiling`; the serving planner does:
its many probes share one start).

Events at the same instant: an iteration that ends exactly when a request arrives is
finished first (the general loop orders such ties by when the events were created).
"""

from __future__ import annotations

import gc
import importlib.util
import math
import sys
import threading
from typing import Any

import numpy as np

from simcli.serving.requests import Request

FLUSH = 65536  # buffered samples per vectorised histogram update
# the kernel's start costs the general loop's time for about this many requests (2 cores)
COMPILE_FROM_REQUESTS = 20_000
POOL = 4096  # live sequences the arrays hold at first (doubled as needed)
_NONE: list = []  # an empty list never appended to
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
# numba compiles the kernel on its first call after an install (then loads it from its
# cache): a call still running after this long prints a note, so the pause is explained
COMPILE_NOTE_AFTER_S = 1.0
_warm = {"done": False}


def eligible(sim: Any, requests: object) -> bool:
    """Whether (``sim`` a :class:`~simcli.serving.simulator.Simulator`, which imports this
    module) :func:`run` can simulate ``requests`` on ``sim``: a
    :class:`~simcli.serving.requests.RequestStream` without shared prefixes, on a
    deployment without any of the features only the general loop models, with numba
    installed."""
    cfg = sim.config
    chunks = getattr(requests, "chunks", None)
    return (
        HAVE_NUMBA
        and chunks is not None
        and not getattr(requests, "shared_prefixes", True)
        and cfg.disaggregation is None
        and cfg.speculative is None
        and sim.branching is None
        and cfg.pp == 1
        and cfg.max_concurrency is None  # closed loop: completions feed arrivals (load.py)
        and cfg.scheduler.preemption == "recompute"
        and cfg.scheduler.scheduler_steps == 1  # vLLM V0 multi-step rounds
        and sim._capped_layout is None
        and sim.metrics.recorder is None
        and not sim.check
        and all(r.step_summary is not None for r in sim.replicas)
        and len({id(r.step_model) for r in sim.replicas}) == 1
        and len({r.blocks_per_engine for r in sim.replicas}) == 1
    )


def worth_compiling(requests: object, compiled: bool | None) -> bool:
    """Whether an :func:`eligible` run should take the kernel: ``compiled`` when the caller
    says, else unless the stream is known to be short (see the module)."""
    if compiled is not None:
        return compiled
    expected = getattr(requests, "expected", None)
    return expected is None or expected >= COMPILE_FROM_REQUESTS


def _decode_pricer(replica: Any) -> Any:
    """The step model's decode-only price ``(n, context sum) -> s``: its ``step_s_decode``
    when it has one, else ``step_s_summary`` with no prefills."""
    fn = getattr(replica.step_model, "step_s_decode", None)
    if fn is not None:
        return fn
    summary = replica.step_summary
    return lambda n, ctx_sum: summary(_NONE, _NONE, n, ctx_sum)


def _tables(step_model: Any, max_seqs: int) -> tuple[np.ndarray, ...]:
    """The kernel's price tables: the step model's own, or empty ones (every iteration then
    priced here) for a step model without them."""
    fn = getattr(step_model, "summary_tables", None)
    if fn is not None:
        return fn(max_seqs)
    z = np.zeros(2)
    return (np.zeros(13, np.int64), np.zeros(4), z, np.zeros((2, 2, 2)), np.zeros((2, 2)),
            np.full((3, 1), -1.0))  # fmt: skip


class _Driver:
    """The kernel's arrays for one run, and what it hands back (see the module)."""

    def __init__(self, sim: Any) -> None:
        from simcli.serving import fastkernel as K
        from simcli.serving import fastlayout as L

        self.K, self.L = K, L
        cfg = sim.config
        sc = cfg.scheduler
        self.sim = sim
        self.m = sim.metrics
        # the frontend's time per request id (simcli.serving.frontend), None: no frontend
        self.fe_in: np.ndarray | None = None
        self.fe_out = sim.config.frontend.per_output_token_s
        reps = sim.replicas
        sched = reps[0].scheduler  # the event loop's scheduler: its seats and policy
        max_seqs = sched.max_seqs
        self.st, self.buf = K.state_arrays(len(reps), cfg.block_size, max_seqs, POOL, FLUSH)
        G, GF, CFG, RI, RF = self.st[0], self.st[1], self.st[2], self.st[3], self.st[4]
        CFG[L.C_KIND] = sched.kind_code
        CFG[L.C_BS] = cfg.block_size
        CFG[L.C_MAX_SEQS] = max_seqs
        CFG[L.C_MAX_TOKENS] = sc.max_tokens
        CFG[L.C_CHUNK] = sc.chunk_size
        CFG[L.C_ROUTER] = {"least_outstanding": L.LEAST_OUTSTANDING,
                           "round_robin": L.ROUND_ROBIN}.get(cfg.router, L.KV_AWARE)  # fmt: skip
        CFG[L.C_NREP] = len(reps)
        CFG[L.C_FLUSH] = FLUSH
        CFG[L.C_THRESH] = sc.long_prefill_token_threshold
        CFG[L.C_PCHUNK] = sc.chunked_prefill_size
        CFG[L.C_PMAX] = sc.max_prefill_tokens
        if sc.kind == "sglang":
            GF[L.GF_MIN_RATIO], GF[L.GF_DECAY] = sched.min_ratio, sched.decay
            RF[:, L.RF_RATIO] = sched.init_ratio
        for i, r in enumerate(reps):
            RI[i, L.R_NUM_BLOCKS] = r.blocks_per_engine
            RI[i, L.R_WM] = int(sc.watermark * r.blocks_per_engine)
        every, nxt = self.m._progress_every, self.m._progress_next
        G[L.G_PROG_EVERY] = every
        G[L.G_PROG_NEXT] = nxt if math.isfinite(nxt) else np.iinfo(np.int64).max
        self.tables = _tables(reps[0].step_model, max_seqs)
        self.price = reps[0].step_summary
        self.decode_price = _decode_pricer(reps[0])
        meters = {id(r.energy): r.energy for r in reps if r.energy is not None}
        assert len(meters) <= 1  # one step model, so one meter (or none)
        self.meter = next(iter(meters.values()), None)
        self.num_blocks = reps[0].blocks_per_engine

    def _call(
        self, a: np.ndarray, p: np.ndarray, o: np.ndarray, q: np.ndarray, first: int, final: bool
    ) -> None:
        """Run the kernel over one chunk of arrivals (or the end), acting on each return."""
        K, L = self.K, self.L
        self.st[0][L.G_POS] = 0
        while True:
            code = self._simulate(a, p, o, q, first, final)
            if code == L.NEED_ARRIVALS or code == L.DONE:
                return
            if code == L.FLUSH:
                self.flush()
            elif code == L.PRICE:
                self._price_pending()
            elif code == L.GROW:
                self.st = K.grow(self.st)
            else:  # PROGRESS: a call at each mark passed (completed was the mark then)
                G = self.st[0]
                due, every = int(G[L.G_PROG_DUE]), int(G[L.G_PROG_EVERY])
                G[L.G_PROG_DUE] = 0
                for j in range(due, 0, -1):
                    self.m.progress(int(G[L.G_PROG_NEXT]) - j * every, self.m.progress_total)

    def _simulate(
        self, a: np.ndarray, p: np.ndarray, o: np.ndarray, q: np.ndarray, first: int, final: bool
    ):
        """One kernel call; the first of the process says so on stderr if it compiles."""
        args = (self.st, self.buf, self.tables, a, p, o, q, first, final)
        if _warm["done"]:
            return self.K.simulate(*args)
        from simcli.progress import quiet

        note = threading.Timer(COMPILE_NOTE_AFTER_S, _compile_note)
        if not quiet():
            note.start()
        try:
            return self.K.simulate(*args)
        finally:
            note.cancel()
            _warm["done"] = True

    def _price_pending(self) -> None:
        """Price the batch the kernel left pending with the step model itself."""
        L = self.L
        G, GF, RI, RA = self.st[0], self.st[1], self.st[3], self.st[7]
        r = int(G[L.G_PEND])
        n_dec, k = int(RI[r, L.R_BNDEC]), int(RI[r, L.R_BNPRE])
        ctx_sum = int(RI[r, L.R_SUM_CTX0] + n_dec * RI[r, L.R_DIT]) if n_dec else 0
        if k:
            new = RA[r, L.A_BNEW, :k].tolist()
            past = RA[r, L.A_BPAST, :k].tolist()
            GF[L.GF_PRICE] = self.price(new, past, n_dec, ctx_sum) + 0.0
        else:
            GF[L.GF_PRICE] = self.decode_price(n_dec, ctx_sum) + 0.0

    def _frontend(self, first_id: int, extra: np.ndarray) -> None:
        """Keep the frontend's time of requests ``first_id ..`` (grown by doubling)."""
        end = first_id + extra.size
        if self.fe_in is None or self.fe_in.size < end:
            grown = np.zeros(max(end, 2 * (0 if self.fe_in is None else self.fe_in.size)))
            if self.fe_in is not None:
                grown[: self.fe_in.size] = self.fe_in
            self.fe_in = grown
        self.fe_in[first_id:end] = extra

    def run(self, chunks: Any) -> float:
        """Simulate every request of ``chunks``; the time of the last event."""
        sim = self.sim
        for chunk in chunks:
            a, p, o = sim.admissible(chunk)
            q = getattr(chunk, "priority", None)
            q = np.zeros(a.size, np.int64) if q is None else np.ascontiguousarray(q, np.int64)
            if getattr(chunk, "frontend_in_s", None) is not None:
                self._frontend(chunk.first_id, chunk.frontend_in_s)
            self._call(a, p, o, q, chunk.first_id, False)
        empty = np.zeros(0, np.int64)
        self._call(np.zeros(0), empty, empty, empty, 0, True)
        self.flush()
        L = self.L
        RI, RF = self.st[3], self.st[4]
        for i, rep in enumerate(sim.replicas):
            eng = rep.engines[0]
            eng.preemptions = int(RI[i, L.R_PREEMPTIONS])
            eng.busy_s = float(RF[i, L.RF_BUSY_S])
            eng.kv.used_blocks = int(RI[i, L.R_USED])
            eng.kv.peak_used_blocks = int(RI[i, L.R_PEAK])
            rep.outstanding = eng.outstanding = int(RI[i, L.R_OUTS])
        return float(self.st[1][L.GF_NOW])

    # --- the buffers, reduced into Metrics (and the energy meter) -------------------------
    def flush(self) -> None:
        """What ``Metrics.iteration``, ``Metrics.tbt``, ``Metrics.request_done`` and
        ``EnergyMeter.add`` accumulate one by one, from the buffered samples."""
        L = self.L
        G = self.st[0]
        BI, BF = self.buf
        m = self.m
        k = int(G[L.G_IT_N])
        if k:
            dt = BF[:k, L.BF_IT_DT].copy()
            n_dec = BI[:k, L.B_IT_NDEC].copy()
            util = BI[:k, L.B_IT_USED] / self.num_blocks
            m.iterations += k
            m.decode_seq_iters += int(n_dec.sum())
            m.kv_block_s += float(np.dot(util, dt))
            m.kv_util_max = max(m.kv_util_max, float(util.max()))
            m.engine_busy_s += float(dt.sum())
            npre, nch = int(G[L.G_PRE_N]), int(G[L.G_PRE2_N])
            new = BI[:nch, L.B_PRE_NEW].copy()
            m.batched_tokens += int(new.sum()) + int(n_dec.sum())
            if self.meter is not None:
                at = np.repeat(BI[:npre, L.B_PRE_AT], BI[:npre, L.B_PRE_LEN])
                ctx = BI[:k, L.B_IT_CTX].copy()
                self.meter.add_iterations(dt, n_dec, ctx, at, new, BI[:nch, L.B_PRE_PAST].copy())
        d = int(G[L.G_DONE_N])
        if d and (self.fe_in is not None or self.fe_out):  # as the client sees it
            if self.fe_in is not None:
                BF[:d, L.BF_D_ARRIVAL] -= self.fe_in[BI[:d, L.B_D_RID]]
            BF[:d, L.BF_D_FIRST] += self.fe_out
            BF[:d, L.BF_D_FINISH] += self.fe_out
        if d:
            arr = BF[:d, L.BF_D_ARRIVAL].copy()
            first = BF[:d, L.BF_D_FIRST].copy()
            fin = BF[:d, L.BF_D_FINISH].copy()
            out = BI[:d, L.B_D_OUTPUT].copy()
            ttft = first - arr
            multi = out > 1
            tpot = (fin[multi] - first[multi]) / (out[multi] - 1)
            m.ttft.add_many(ttft)
            m.e2e.add_many(fin - arr)
            m.tpot.add_many(tpot)
            ok = ttft <= m.slo_ttft_s
            ok[multi] &= tpot <= m.slo_tpot_s
            m.completed += d
            m.slo_met += int(ok.sum())
            m.prompt_tokens += int(BI[:d, L.B_D_PROMPT].sum())
            m.output_tokens += int(out.sum())
            m.preempted_requests += int(np.count_nonzero(BI[:d, L.B_D_PREEMPTED]))
            if m.track_priority:
                prio = BI[:d, L.B_D_PRIO]
                for c in np.unique(prio).tolist():
                    sel = prio == c
                    hs = m.priority_hists(int(c))
                    hs[0].add_many(ttft[sel])
                    hs[2].add_many((fin - arr)[sel])
                    hs[1].add_many((fin[sel & multi] - first[sel & multi]) / (out[sel & multi] - 1))
            m.first_arrival_s = min(m.first_arrival_s, float(arr.min()))
            m.last_finish_s = max(m.last_finish_s, float(fin.max()))
            if m.sink is not None:
                self._sink(d)
        t = int(G[L.G_TBT_N])
        if t:
            m.tbt_hist.add_many(BF[:t, L.BF_TBT].copy(), BI[:t, L.B_TBTW].copy())
        for c in (L.G_IT_N, L.G_PRE_N, L.G_PRE2_N, L.G_DONE_N, L.G_TBT_N):
            G[c] = 0

    def _sink(self, d: int) -> None:
        """The per-request rows, in the order the requests finished."""
        L = self.L
        BI, BF = self.buf
        cols = [L.B_D_RID, L.B_D_REPLICA, L.B_D_PROMPT, L.B_D_OUTPUT, L.B_D_PREEMPTED,
                L.B_D_PRIO]  # fmt: skip
        fcols = [L.BF_D_ARRIVAL, L.BF_D_FIRST, L.BF_D_FINISH]
        sink = self.m.sink
        for (rid, rep, prompt, out, pre, prio), (a, f, fin) in zip(
            BI[:d, cols].tolist(), BF[:d, fcols].tolist(), strict=True
        ):
            req = Request(rid, a, prompt, out, priority=prio)
            req.first_token_s = f
            req.finish_s = fin
            req.replica = rep
            req.preemptions = pre
            sink(req)


def _compile_note() -> None:
    print(
        "simcli: compiling the serving simulator's kernel (numba; once after an install, "
        "about 10 s)",
        file=sys.stderr,
        flush=True,
    )


def run(sim: Any, requests: Any) -> float:
    """Simulate ``requests`` (a RequestStream; see :func:`eligible`) on ``sim``'s replicas,
    leaving the results where :meth:`Simulator.result` reads them; the time of the last
    event. The cyclic garbage collector is paused meanwhile (the driver makes no cycles)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _Driver(sim).run(requests.chunks())
    finally:
        if paused:
            gc.enable()


__all__ = ["eligible", "run"]
