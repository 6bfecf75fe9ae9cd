"""The serving fast path's loop, compiled with numba: flat arrays in, the same mechanism out.

:mod:`simcli.serving.fastpath` drives it; this module holds only the compiled part. Every
sequence, replica, queue, decode batch and heap is a row or a column of a numpy array
(the layouts are the ``S_*``, ``R_*`` ... column numbers of
:mod:`simcli.serving.fastlayout`), so the whole loop -- the routers, the schedulers'
admissions, budgets and preemptions (:mod:`simcli.serving.fastsched`, calling the policy
functions of :mod:`simcli.serving.policy`), the lockstep decode batch with its
per-residue block counting, the step prices and the clock -- runs without the
interpreter. It mirrors, line for line, the Python
methods of the general loop (:mod:`simcli.serving.engine`, :mod:`simcli.serving.schedulers`)
and prices with the compiled copy of the step model's scalar pricing
(:mod:`costmodels.steps.serving_compiled`); the tests
(``tests/simcli/serving/test_fastpath.py``) hold every summary key and per-request row
equal to the general loop's, and the prices equal to ``StepModel.step_s_summary`` bit for
bit.

The kernel returns to its driver at safe points, between two events, with a code saying
why: the arrivals of the chunk are used up (``NEED_ARRIVALS``), everything is simulated
(``DONE``), the metric buffers are full (``FLUSH``), a sequence pool or heap needs room
(``GROW``), progress is due (``PROGRESS``), or an iteration needs a price the compiled
tables do not cover (``PRICE``: a batch off the step model's grids, an eager engine's
prefill, a step model that prices attention its own way). The driver acts and calls again;
all state lives in the arrays, so the loop resumes where it stopped.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba.core.registry import CPUDispatcher

from costmodels.steps import serving_compiled
from costmodels.steps.serving_compiled import price_decode, price_mixed
from simcli.serving import fastlayout, fastsched, policy
from simcli.serving.fastlayout import (
    A_BJOIN,
    A_BNEW,
    A_BPAST,
    A_BPRE,
    A_JN,
    A_JNR,
    B_D_OUTPUT,
    B_D_PREEMPTED,
    B_D_PRIO,
    B_D_PROMPT,
    B_D_REPLICA,
    B_D_RID,
    B_IT_CTX,
    B_IT_NDEC,
    B_IT_USED,
    B_PRE_AT,
    B_PRE_LEN,
    B_PRE_NEW,
    B_PRE_PAST,
    B_TBTW,
    BF_D_ARRIVAL,
    BF_D_FINISH,
    BF_D_FIRST,
    BF_IT_DT,
    BF_TBT,
    C_BS,
    C_FLUSH,
    C_KIND,
    C_MAX_SEQS,
    C_NREP,
    C_ROUTER,
    DONE,
    E_T,
    F_ARRIVAL,
    F_FIRST,
    F_LAST,
    FLUSH,
    G_COMPLETED,
    G_DONE_N,
    G_FREE,
    G_FREE_N,
    G_GROW,
    G_HEAPN,
    G_IT_N,
    G_PEND,
    G_POS,
    G_PRE2_N,
    G_PRE_N,
    G_PROG_DUE,
    G_PROG_EVERY,
    G_PROG_NEXT,
    G_RR,
    G_TBT_N,
    GF_NOW,
    GF_PRICE,
    GROW,
    H_KEY,
    LEAST_OUTSTANDING,
    NBF,
    NBI,
    NCFG,
    NEED_ARRIVALS,
    NG,
    NGF,
    NRA,
    NRF,
    NRI,
    NSF,
    NSI,
    PRICE,
    PROGRESS,
    R_BNDEC,
    R_BNJOIN,
    R_BNPRE,
    R_BUSY,
    R_DIT,
    R_FHN,
    R_N,
    R_NJOINS,
    R_NPREF,
    R_NUM_BLOCKS,
    R_OUTS,
    R_QUEUED,
    R_RESERVED,
    R_SUM_CTX0,
    R_USED,
    R_WHEAD,
    R_WLEN,
    R_WTAIL,
    RF_BUSY_S,
    RF_LAST_DEC_END,
    ROUND_ROBIN,
    S_BLOCKS,
    S_CTX,
    S_FINISH_DIT,
    S_GEN,
    S_NEXT,
    S_OUTPUT,
    S_PREEMPTED,
    S_PREF,
    S_PRIO,
    S_PROMPT,
    S_RID,
    S_SLOT,
    S_TARGET,
    SGLANG,
    TRTLLM,
    dec_add,
    dec_remove,
    ev_pop,
    ev_push,
    fh_pop,
    jit,
    pf_remove,
)
from simcli.serving.fastsched import (
    decodes,
    reserve,
    schedule,
    w_insert,
)


@jit
def _launch(G, RI, RF, RA, EH, BI, BF, r, dt, now):
    """Record the iteration (Metrics.iteration through the buffers) and put its end on the
    event heap."""
    n_dec = RI[r, R_BNDEC]
    k = RI[r, R_BNPRE]
    it = G[G_IT_N]
    if k:
        p = G[G_PRE_N]
        BI[p, B_PRE_AT], BI[p, B_PRE_LEN] = it, k
        G[G_PRE_N] = p + 1
        q = G[G_PRE2_N]
        for c in range(k):
            BI[q + c, B_PRE_NEW], BI[q + c, B_PRE_PAST] = RA[r, A_BNEW, c], RA[r, A_BPAST, c]
        G[G_PRE2_N] = q + k
    BF[it, BF_IT_DT] = dt
    BI[it, B_IT_USED] = RI[r, R_USED]
    BI[it, B_IT_NDEC] = n_dec
    BI[it, B_IT_CTX] = RI[r, R_SUM_CTX0] + n_dec * RI[r, R_DIT] if n_dec else 0
    G[G_IT_N] = it + 1
    RF[r, RF_BUSY_S] += dt
    RI[r, R_BUSY] = 1
    ev_push(G, EH, now + dt, r)


@jit
def _start(G, GF, RI, RF, SI, SF, RA, RES, EH, BI, BF, CFG, PI, PF, PG, W2, WDEC, DT, r, now):
    """Engine.try_start: schedule, price and launch r's next iteration if there is work.
    Returns whether one was launched; a batch the tables cannot price is left pending for
    the driver (G_PEND) and counts as launched."""
    bs = CFG[C_BS]
    kind = CFG[C_KIND]
    while True:
        if RI[r, R_N] and not RI[r, R_WLEN] and not RI[r, R_NPREF] and kind != SGLANG:
            need = RES[r, -RI[r, R_DIT] % bs]
            RI[r, R_BNPRE] = 0
            if need > RI[r, R_NUM_BLOCKS] - RI[r, R_USED] or RI[r, R_NJOINS]:
                n_dec = decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r)
                if not n_dec:  # everything was preempted: prefill again
                    continue
            else:
                n_dec = RI[r, R_N]
                RI[r, R_BNJOIN] = 0
                if need:
                    reserve(RI, r, need)
            RI[r, R_BNDEC] = n_dec
            ctx_sum = RI[r, R_SUM_CTX0] + n_dec * RI[r, R_DIT]
            dt = price_decode(PI, PF, PG, WDEC, DT, n_dec, ctx_sum)
        else:
            if not schedule(G, GF, RI, RF, SI, SF, RA, RES, CFG, r):
                return False
            n_dec = RI[r, R_BNDEC]
            ctx_sum = RI[r, R_SUM_CTX0] + RI[r, R_N] * RI[r, R_DIT] if n_dec else 0
            k = RI[r, R_BNPRE]
            dt = price_mixed(
                PI, PF, PG, W2, WDEC, DT, RA[r, A_BNEW], RA[r, A_BPAST], k, n_dec, ctx_sum
            )
        if np.isnan(dt):
            G[G_PEND] = r
            return True
        _launch(G, RI, RF, RA, EH, BI, BF, r, dt + 0.0, now)
        return True


# === an iteration's end ===================================================================
@jit
def _done(G, RI, SI, SF, BI, BF, CFG, r, s, now):
    """Engine.finish_sequence and Metrics.request_done (buffered); the pool row freed."""
    if CFG[C_KIND] == TRTLLM:
        bs = CFG[C_BS]
        RI[r, R_RESERVED] -= -(-(SI[s, S_PROMPT] + SI[s, S_OUTPUT] - 1) // bs)
    RI[r, R_USED] -= SI[s, S_BLOCKS]
    SI[s, S_BLOCKS] = 0
    RI[r, R_OUTS] -= 1
    d = G[G_DONE_N]
    BI[d, B_D_RID] = SI[s, S_RID]
    BI[d, B_D_REPLICA] = r
    BI[d, B_D_PROMPT] = SI[s, S_PROMPT]
    BI[d, B_D_OUTPUT] = SI[s, S_OUTPUT]
    BI[d, B_D_PREEMPTED] = SI[s, S_PREEMPTED]
    BI[d, B_D_PRIO] = SI[s, S_PRIO]
    BF[d, BF_D_ARRIVAL] = SF[s, F_ARRIVAL]
    BF[d, BF_D_FIRST] = SF[s, F_FIRST]
    BF[d, BF_D_FINISH] = now
    G[G_DONE_N] = d + 1
    SI[s, S_RID] = -1  # stale references (finish heap, joins) no longer match
    SI[s, S_NEXT] = G[G_FREE]
    G[G_FREE] = s
    G[G_FREE_N] += 1
    G[G_COMPLETED] += 1
    if G[G_COMPLETED] >= G[G_PROG_NEXT]:
        G[G_PROG_NEXT] += G[G_PROG_EVERY]
        G[G_PROG_DUE] += 1


@jit
def _tbt(G, BI, BF, gap, weight):
    i = G[G_TBT_N]
    BF[i, BF_TBT] = gap
    BI[i, B_TBTW] = weight
    G[G_TBT_N] = i + 1


@jit
def _prefilled(G, RI, SI, SF, RA, RES, FH, BI, BF, CFG, r, now):
    """Engine.finish_batch's prefill part: finished prompts produce their first token and
    join the decode batch (or finish)."""
    for c in range(RI[r, R_BNPRE]):
        s = RA[r, A_BPRE, c]
        SI[s, S_PREF] += RA[r, A_BNEW, c]
        if SI[s, S_PREF] < SI[s, S_TARGET]:
            continue
        pf_remove(RI, RA, r, s)
        SI[s, S_CTX] = SI[s, S_TARGET]
        SI[s, S_GEN] += 1
        if SF[s, F_FIRST] < 0:
            SF[s, F_FIRST] = now
        else:  # its first token after a recompute preemption
            _tbt(G, BI, BF, now - SF[s, F_LAST], 1)
        SF[s, F_LAST] = now
        if SI[s, S_GEN] >= SI[s, S_OUTPUT]:
            _done(G, RI, SI, SF, BI, BF, CFG, r, s, now)
        else:
            dec_add(G, RI, SI, RA, RES, FH, CFG[C_BS], CFG[C_MAX_SEQS], r, s)
            j = RI[r, R_NJOINS]
            RA[r, A_JN, j], RA[r, A_JNR, j] = s, SI[s, S_RID]
            RI[r, R_NJOINS] = j + 1


@jit
def _finish(G, RI, RF, SI, SF, RA, RES, FH, BI, BF, CFG, r, now):
    """Engine.finish_batch: the decodes' tokens (gaps, finished sequences), then the
    prefill chunks."""
    RI[r, R_BUSY] = 0
    n_dec = RI[r, R_BNDEC]
    if n_dec:
        dit = RI[r, R_DIT] + 1
        RI[r, R_DIT] = dit
        nj = RI[r, R_BNJOIN]
        old = n_dec - nj
        if old:
            _tbt(G, BI, BF, now - RF[r, RF_LAST_DEC_END], old)
        for q in range(nj):
            _tbt(G, BI, BF, now - SF[RA[r, A_BJOIN, q], F_LAST], 1)
        RF[r, RF_LAST_DEC_END] = now
        while RI[r, R_FHN] and (FH[r, H_KEY, 0] >> 32) == dit:
            s, rid = fh_pop(FH, RI, r)
            # skip stale entries (finished, preempted, maybe rejoined)
            if SI[s, S_RID] == rid and SI[s, S_SLOT] >= 0 and SI[s, S_FINISH_DIT] == dit:
                SI[s, S_FINISH_DIT] = -1
                dec_remove(RI, RF, SI, SF, RA, RES, CFG[C_BS], r, s)
                _done(G, RI, SI, SF, BI, BF, CFG, r, s, now)
    if RI[r, R_BNPRE]:
        _prefilled(G, RI, SI, SF, RA, RES, FH, BI, BF, CFG, r, now)


# === arrivals ==============================================================================
@jit
def _route(G, RI, CFG):
    """The router's replica for the next arrival (Router.pick without prefixes)."""
    nrep = CFG[C_NREP]
    router = CFG[C_ROUTER]
    if router == LEAST_OUTSTANDING:  # the first of the fewest
        best = 0
        for x in range(1, nrep):
            if RI[x, R_OUTS] < RI[best, R_OUTS]:
                best = x
        return best
    if router == ROUND_ROBIN:
        r = G[G_RR]
        G[G_RR] = (r + 1) % nrep
        return r
    # kv_aware: most free blocks net of queued demand, then fewest outstanding
    best = 0
    f0 = RI[0, R_NUM_BLOCKS] - RI[0, R_USED] - RI[0, R_QUEUED]
    o0 = -RI[0, R_OUTS]
    for x in range(nrep):
        fx = RI[x, R_NUM_BLOCKS] - RI[x, R_USED] - RI[x, R_QUEUED]
        ox = -RI[x, R_OUTS]
        if fx > f0 or (fx == f0 and ox > o0):
            best, f0, o0 = x, fx, ox
    return best


@jit
def _arrive(G, RI, SI, SF, CFG, t, rid, p, o, prio):
    """Route a request and queue it (in the policy's order); its replica."""
    r = _route(G, RI, CFG)
    s = G[G_FREE]
    G[G_FREE] = SI[s, S_NEXT]
    G[G_FREE_N] -= 1
    for c in range(NSI):
        SI[s, c] = 0
    SI[s, S_RID], SI[s, S_PROMPT], SI[s, S_OUTPUT], SI[s, S_TARGET] = rid, p, o, p
    SI[s, S_SLOT] = -1
    SI[s, S_PRIO] = prio
    SF[s, F_ARRIVAL], SF[s, F_LAST], SF[s, F_FIRST] = t, 0.0, -1.0
    RI[r, R_OUTS] += 1
    w_insert(RI, SI, SF, r, s, CFG[C_KIND], False)
    RI[r, R_QUEUED] += -(-p // CFG[C_BS])
    return r


# === the loop ==============================================================================
@jit
def simulate(st, buf, pt, arr_t, arr_p, arr_o, arr_q, first_rid, final):
    """Run until a reason to return (the module's codes). ``arr_*``: the current chunk's
    arrivals (outputs 0: refused; ``arr_q`` their priorities), read from G_POS on;
    ``final``: no chunk follows it. A pending price (G_PEND >= 0) must have been written
    to GF_PRICE by the driver."""
    G, GF, CFG, RI, RF, SI, SF, RA, RES, FH, EH = st
    BI, BF = buf
    PI, PF, PG, W2, WDEC, DT = pt
    full = CFG[C_FLUSH]
    n_arr = arr_t.size
    while True:
        r = G[G_PEND]
        if r >= 0:
            G[G_PEND] = -1
            _launch(G, RI, RF, RA, EH, BI, BF, r, GF[GF_PRICE] + 0.0, GF[GF_NOW])
        # a safe point: between two events
        if (G[G_IT_N] >= full or G[G_TBT_N] >= full or G[G_DONE_N] >= full
                or G[G_PRE2_N] >= full):  # fmt: skip
            return FLUSH
        if G[G_PROG_DUE]:
            return PROGRESS
        if G[G_GROW]:
            return GROW
        pos = G[G_POS]
        if pos < n_arr:
            o = arr_o[pos]
            if o == 0:  # refused: longer than the max model length
                G[G_POS] = pos + 1
                continue
            ta = arr_t[pos]
            if not G[G_HEAPN] or EH[E_T, 0] > ta:
                if G[G_FREE_N] == 0:
                    G[G_GROW] = 2
                    return GROW
                G[G_POS] = pos + 1
                if ta > GF[GF_NOW]:
                    GF[GF_NOW] = ta
                r = _arrive(G, RI, SI, SF, CFG, ta, first_rid + pos, arr_p[pos], o, arr_q[pos])
                if not RI[r, R_BUSY]:
                    _start(
                        G, GF, RI, RF, SI, SF, RA, RES, EH, BI, BF, CFG, PI, PF, PG, W2, WDEC, DT,
                        r, ta,
                    )  # fmt: skip
                    if G[G_PEND] >= 0:
                        return PRICE
                continue
        elif not final:
            return NEED_ARRIVALS
        elif not G[G_HEAPN]:
            return DONE
        now, r = ev_pop(G, EH)
        if now > GF[GF_NOW]:
            GF[GF_NOW] = now
        _finish(G, RI, RF, SI, SF, RA, RES, FH, BI, BF, CFG, r, now)
        _start(G, GF, RI, RF, SI, SF, RA, RES, EH, BI, BF, CFG, PI, PF, PG, W2, WDEC, DT, r, now)
        if G[G_PEND] >= 0:
            return PRICE


FINISH_HEAP_PER_SEAT = 4  # a finish heap's first room, in decode seats (doubled as needed)


def state_arrays(nrep: int, bs: int, max_seqs: int, pool: int, buffer: int) -> tuple[tuple, tuple]:
    """Fresh state and buffer arrays (see the column numbers above); the caller fills the
    configuration and the replicas' block counts."""
    i8, f8 = np.int64, np.float64
    G = np.zeros(NG, i8)
    G[G_PEND] = -1
    G[G_FREE], G[G_FREE_N] = 0, pool
    SI = np.zeros((pool, NSI), i8)
    SI[:, S_NEXT] = np.arange(1, pool + 1)
    SI[-1, S_NEXT] = -1
    SI[:, S_RID] = -1
    RI = np.zeros((nrep, NRI), i8)
    RI[:, R_WHEAD] = RI[:, R_WTAIL] = -1
    st = (
        G, np.zeros(NGF, f8), np.zeros(NCFG, i8), RI, np.zeros((nrep, NRF), f8), SI,
        np.zeros((pool, NSF), f8), np.zeros((nrep, NRA, max_seqs + 1), i8),
        np.zeros((nrep, bs), i8), np.zeros((nrep, 3, FINISH_HEAP_PER_SEAT * max_seqs), i8),
        np.zeros((3, nrep), f8),
    )  # fmt: skip
    cap = buffer + 2 * max_seqs + 2  # one event past the flush mark fits
    return st, (np.zeros((cap, NBI), i8), np.zeros((cap, NBF), f8))


def grow(st: tuple) -> tuple:
    """The state with twice the room where G_GROW asks for it (1: finish heaps, 2: the
    sequence pool)."""
    G, GF, CFG, RI, RF, SI, SF, RA, RES, FH, EH = st
    if G[G_GROW] == 1:
        FH2 = np.zeros((FH.shape[0], 3, 2 * FH.shape[2]), np.int64)
        FH2[:, :, : FH.shape[2]] = FH
        FH = FH2
    else:
        pool = SI.shape[0]
        SI2 = np.zeros((2 * pool, NSI), np.int64)
        SI2[:pool] = SI
        SI2[pool:, S_RID] = -1
        SI2[pool:, S_NEXT] = np.arange(pool + 1, 2 * pool + 1)
        SI2[-1, S_NEXT] = G[G_FREE]
        SF2 = np.zeros((2 * pool, NSF), np.float64)
        SF2[:pool] = SF
        G[G_FREE] = pool
        G[G_FREE_N] += pool
        SI, SF = SI2, SF2
    G[G_GROW] = 0
    return G, GF, CFG, RI, RF, SI, SF, RA, RES, FH, EH


def _drop_stale_caches() -> None:
    """numba checks only a function's own file when it loads a cached compile, but the
    kernel's code spans this module, :mod:`fastsched`, :mod:`fastlayout`, :mod:`policy`
    and :mod:`costmodels.steps.serving_compiled`: an edit to any of them must drop every
    cached piece, or ``simulate`` would run code compiled from the old sources. A digest of
    their sources kept beside numba's cache decides (best effort: an unwritable cache is
    left to numba)."""
    mods = (policy, fastlayout, fastsched, serving_compiled)
    files = (*(m.__file__ for m in mods), __file__)
    digest = hashlib.sha256(b"".join(Path(f).read_bytes() for f in files)).hexdigest()
    try:
        stamp = Path(simulate._cache._cache_path) / "simcli-serving-kernel.sources"
        if stamp.exists() and stamp.read_text() == digest:
            return
        for ns in (globals(), vars(fastsched), vars(fastlayout)):
            for obj in list(ns.values()):
                if isinstance(obj, CPUDispatcher) and getattr(obj, "_cache", None) is not None:
                    obj._cache.flush()
        stamp.write_text(digest)
    except (AttributeError, OSError):
        pass


_drop_stale_caches()
