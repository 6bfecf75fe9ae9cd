"""The serving fast path's loop, compiled with numba: flat arrays in, the same mechanism out.

:mod:`simcli.serving.fastpath` drives it; this module holds only the compiled part. Every
sequence, replica, queue, decode batch and heap is a row or a column of a numpy array
(the layouts are the ``S_*``, ``R_*`` ... column numbers below), so the whole loop -- the
routers, the vLLM / Orca / Sarathi-Serve admissions, the lockstep decode batch with its
per-residue block counting, recompute preemption of the newest decode, the step prices
and the clock -- runs without the interpreter. It mirrors, line for line, the Python
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

import numpy as np
from numba import njit

from costmodels.steps.serving_compiled import price_decode, price_mixed
from simcli.serving import policy

# Compiled without numba's reference counting (``_nrt=False``): the kernel allocates
# nothing, only indexes the arrays its driver owns, and the counting of every array passed
# to every helper cost two thirds of its time.
_jit = njit(cache=True, _nrt=False)

# the schedulers' decisions: the same functions the event loop's schedulers call
_victim_key = _jit(policy.victim_key)
_key_greater = _jit(policy.key_greater)
_queue_key = _jit(policy.queue_key)
_ordered = _jit(policy.ordered_queue)
_front = _jit(policy.requeue_front)
_fits = _jit(policy.admit_fits)
_chunk = _jit(policy.chunk_tokens)
_per_chunk = _jit(policy.allocates_per_chunk)
_sg_reserve = _jit(policy.sglang_reserve)
_sg_admit = _jit(policy.sglang_admit)
_sg_decayed = _jit(policy.sglang_decayed)
_sg_done = _jit(policy.sglang_retract_done)
_sg_ratio = _jit(policy.sglang_ratio_after_retract)
SG_CLIP = policy.SGLANG_CLIP_NEW_TOKENS

# --- return codes --------------------------------------------------------------------
DONE, NEED_ARRIVALS, FLUSH, GROW, PROGRESS, PRICE = range(6)

# --- configuration (CFG, int64) ------------------------------------------------------
(C_KIND, C_BS, C_MAX_SEQS, C_MAX_TOKENS, C_CHUNK, C_ROUTER, C_NREP, C_FLUSH, C_THRESH,
 C_PCHUNK, C_PMAX) = range(11)  # fmt: skip
NCFG = 11
# the policy codes (simcli.serving.policy)
VLLM, ORCA, SARATHI = policy.VLLM, policy.ORCA, policy.SARATHI
VLLM_V1, SGLANG, TRTLLM, PRIORITY = policy.VLLM_V1, policy.SGLANG, policy.TRTLLM, policy.PRIORITY
LEAST_OUTSTANDING, ROUND_ROBIN, KV_AWARE = range(3)

# --- global counters (G, int64) and clocks (GF, float64) -------------------------------
(G_SEQ_NO, G_HEAPN, G_FREE, G_FREE_N, G_COMPLETED, G_PROG_NEXT, G_PROG_EVERY, G_PROG_DUE,
 G_RR, G_POS, G_PEND, G_GROW, G_TBT_N, G_IT_N, G_PRE_N, G_PRE2_N, G_DONE_N,
 G_STAMP) = range(18)  # fmt: skip
NG = 18
GF_NOW, GF_PRICE, GF_MIN_RATIO, GF_DECAY = range(4)
NGF = 4

# --- a sequence (SI int64, SF float64; rows of a pool with a free list) ----------------
(S_RID, S_PROMPT, S_OUTPUT, S_TARGET, S_GEN, S_CTX, S_PREF, S_BLOCKS, S_PREEMPTED, S_SLOT,
 S_JOIN_DIT, S_RES, S_FINISH_DIT, S_NEXT, S_MARK, S_PRIO, S_ADMIT) = range(17)  # fmt: skip
NSI = 17
F_ARRIVAL, F_LAST, F_FIRST = range(3)
NSF = 3

# --- a replica's engine (RI int64, RF float64) ----------------------------------------
(R_NUM_BLOCKS, R_WM, R_USED, R_PEAK, R_N, R_DIT, R_SUM_CTX0, R_QUEUED, R_PREEMPTIONS,
 R_WHEAD, R_WTAIL, R_WLEN, R_NPREF, R_NJOINS, R_BUSY, R_BNPRE, R_BNDEC, R_BNJOIN, R_FHN,
 R_FCOUNT, R_OUTS, R_RESERVED, R_ADMITS) = range(23)  # fmt: skip
NRI = 23
RF_LAST_DEC_END, RF_BUSY_S, RF_RATIO = range(3)
NRF = 3
# a replica's lists (RA int64 [replica, list, item]): prefilling (in order), the decode
# batch's sequences and their ctx0, joins since the last decode iteration and their ids,
# the batch in flight (prefill sequences, their new tokens and cached tokens, joined)
A_PF, A_DS, A_DC0, A_JN, A_JNR, A_BPRE, A_BNEW, A_BPAST, A_BJOIN = range(9)
NRA = 9
# a replica's finish heap (FH int64 [replica, field, entry]): key, sequence, its id
H_KEY, H_SEQ, H_RID = range(3)
# the event heap (EH float64 [field, entry]): iteration end, order, replica
E_T, E_O, E_R = range(3)

# --- buffered metrics (BI int64, BF float64 [row, column]) -------------------------------
(B_TBTW, B_IT_USED, B_IT_NDEC, B_IT_CTX, B_PRE_AT, B_PRE_LEN, B_PRE_NEW, B_PRE_PAST,
 B_D_RID, B_D_REPLICA, B_D_PROMPT, B_D_OUTPUT, B_D_PREEMPTED, B_D_PRIO) = range(14)  # fmt: skip
NBI = 14
BF_TBT, BF_IT_DT, BF_D_ARRIVAL, BF_D_FIRST, BF_D_FINISH = range(5)
NBF = 5


# === heaps ==============================================================================
@_jit
def _ev_less(EH, a, b):
    return EH[E_T, a] < EH[E_T, b] or (EH[E_T, a] == EH[E_T, b] and EH[E_O, a] < EH[E_O, b])


@_jit
def _ev_swap(EH, a, b):
    for f in range(3):
        EH[f, a], EH[f, b] = EH[f, b], EH[f, a]


@_jit
def _ev_push(G, EH, t, r):
    """Push an iteration's end (t, order, replica) on the event heap (heapq's order)."""
    G[G_SEQ_NO] += 1
    k = G[G_HEAPN]
    G[G_HEAPN] = k + 1
    EH[E_T, k], EH[E_O, k], EH[E_R, k] = t, G[G_SEQ_NO], r
    while k > 0:
        up = (k - 1) >> 1
        if not _ev_less(EH, k, up):
            break
        _ev_swap(EH, k, up)
        k = up


@_jit
def _ev_pop(G, EH):
    t, r = EH[E_T, 0], int(EH[E_R, 0])
    last = G[G_HEAPN] - 1
    G[G_HEAPN] = last
    if last > 0:
        for f in range(3):
            EH[f, 0] = EH[f, last]
        k = 0
        while True:
            c = 2 * k + 1
            if c >= last:
                break
            if c + 1 < last and _ev_less(EH, c + 1, c):
                c += 1
            if not _ev_less(EH, c, k):
                break
            _ev_swap(EH, k, c)
            k = c
    return t, r


@_jit
def _fh_swap(FH, r, a, b):
    for f in range(3):
        FH[r, f, a], FH[r, f, b] = FH[r, f, b], FH[r, f, a]


@_jit
def _fh_push(FH, RI, r, key, s, rid):
    """Push (finish iteration << 32 | insertion count) on replica r's finish heap: the
    general loop's dict of buckets by finish iteration, in insertion order."""
    k = RI[r, R_FHN]
    RI[r, R_FHN] = k + 1
    FH[r, H_KEY, k], FH[r, H_SEQ, k], FH[r, H_RID, k] = key, s, rid
    while k > 0:
        up = (k - 1) >> 1
        if FH[r, H_KEY, k] >= FH[r, H_KEY, up]:
            break
        _fh_swap(FH, r, k, up)
        k = up


@_jit
def _fh_pop(FH, RI, r):
    s, rid = FH[r, H_SEQ, 0], FH[r, H_RID, 0]
    last = RI[r, R_FHN] - 1
    RI[r, R_FHN] = last
    if last > 0:
        for f in range(3):
            FH[r, f, 0] = FH[r, f, last]
        k = 0
        while True:
            c = 2 * k + 1
            if c >= last:
                break
            if c + 1 < last and FH[r, H_KEY, c + 1] < FH[r, H_KEY, c]:
                c += 1
            if FH[r, H_KEY, c] >= FH[r, H_KEY, k]:
                break
            _fh_swap(FH, r, k, c)
            k = c
    return s, rid


# === the waiting queue: a linked list through the sequence pool (preempted at its head) ===
@_jit
def _w_append(RI, SI, r, s, left):
    SI[s, S_NEXT] = -1
    if RI[r, R_WLEN] == 0:
        RI[r, R_WHEAD] = s
        RI[r, R_WTAIL] = s
    elif left:
        h = RI[r, R_WHEAD]
        SI[s, S_NEXT] = h
        RI[r, R_WHEAD] = s
    else:
        t = RI[r, R_WTAIL]
        SI[t, S_NEXT] = s
        RI[r, R_WTAIL] = s
    RI[r, R_WLEN] += 1


@_jit
def _w_insert(RI, SI, SF, r, s, kind, left):
    """Engine.enqueue: by the policy's key in an ordered queue (after its equals), else at
    the back, or the front (``left``)."""
    if not _ordered(kind) or RI[r, R_WLEN] == 0:
        _w_append(RI, SI, r, s, left)
        return
    k1, k2 = _queue_key(kind, SI[s, S_PRIO], SF[s, F_ARRIVAL])
    t = RI[r, R_WTAIL]
    l1, l2 = _queue_key(kind, SI[t, S_PRIO], SF[t, F_ARRIVAL])
    if not _key_greater(l1, l2, k1, k2):
        _w_append(RI, SI, r, s, False)
        return
    prev = -1
    cur = RI[r, R_WHEAD]
    while cur >= 0:
        c1, c2 = _queue_key(kind, SI[cur, S_PRIO], SF[cur, F_ARRIVAL])
        if _key_greater(c1, c2, k1, k2):
            break
        prev = cur
        cur = SI[cur, S_NEXT]
    SI[s, S_NEXT] = cur
    if prev < 0:
        RI[r, R_WHEAD] = s
    else:
        SI[prev, S_NEXT] = s
    RI[r, R_WLEN] += 1


@_jit
def _w_popleft(RI, SI, r):
    s = RI[r, R_WHEAD]
    nxt = SI[s, S_NEXT]
    RI[r, R_WHEAD] = nxt
    if nxt < 0:
        RI[r, R_WTAIL] = -1
    RI[r, R_WLEN] -= 1
    return s


# === the decode batch (DecodeBatch: a context is ctx0[slot] + dit) ========================
@_jit
def _dec_add(G, RI, SI, RA, RES, FH, bs, ms, r, s):
    n = RI[r, R_N]
    dit = RI[r, R_DIT]
    c0 = SI[s, S_CTX] - dit
    RA[r, A_DC0, n] = c0
    RA[r, A_DS, n] = s
    RI[r, R_SUM_CTX0] += c0
    RI[r, R_N] = n + 1
    SI[s, S_SLOT] = n
    SI[s, S_JOIN_DIT] = dit
    key = c0 % bs
    SI[s, S_RES] = key
    RES[r, key] += 1
    fd = dit + SI[s, S_OUTPUT] - SI[s, S_GEN]
    SI[s, S_FINISH_DIT] = fd
    RI[r, R_FCOUNT] += 1
    _fh_push(FH, RI, r, (fd << 32) | RI[r, R_FCOUNT], s, SI[s, S_RID])
    if RI[r, R_FHN] > FH.shape[2] - ms:
        G[G_GROW] = 1  # room for one more iteration's joins only: grow before the next


@_jit
def _dec_remove(RI, RF, SI, SF, RA, RES, bs, r, s):
    """Leave the decode batch (last token time, context, generated and blocks updated)."""
    d = RI[r, R_DIT] - SI[s, S_JOIN_DIT]
    if d > 0:
        SF[s, F_LAST] = RF[r, RF_LAST_DEC_END]
    SI[s, S_CTX] += d
    SI[s, S_GEN] += d
    slot = SI[s, S_SLOT]
    last = RI[r, R_N] - 1
    RI[r, R_SUM_CTX0] -= RA[r, A_DC0, slot]
    if slot != last:
        moved = RA[r, A_DS, last]
        RA[r, A_DS, slot] = moved
        RA[r, A_DC0, slot] = RA[r, A_DC0, last]
        SI[moved, S_SLOT] = slot
    RI[r, R_N] = last
    RES[r, SI[s, S_RES]] -= 1
    SI[s, S_SLOT] = -1
    SI[s, S_BLOCKS] = -(-SI[s, S_CTX] // bs)


# === scheduling ===========================================================================
@_jit
def _reserve(RI, r, blocks):
    RI[r, R_USED] += blocks
    if RI[r, R_USED] > RI[r, R_PEAK]:
        RI[r, R_PEAK] = RI[r, R_USED]


@_jit
def _batch_prefill(RI, RA, r, s, k, past):
    b = RI[r, R_BNPRE]
    RA[r, A_BPRE, b], RA[r, A_BNEW, b], RA[r, A_BPAST, b] = s, k, past
    RI[r, R_BNPRE] = b + 1


@_jit
def _admit_one(RI, SI, RA, kind, bs, r, s, cost, k):
    """Engine.admit of the queue's head ``s`` with ``cost`` blocks, into the batch with
    ``k`` prefill tokens."""
    _w_popleft(RI, SI, r)
    RI[r, R_QUEUED] -= -(-SI[s, S_TARGET] // bs)
    SI[s, S_BLOCKS] = cost
    _reserve(RI, r, cost)
    SI[s, S_PREF] = 0
    RI[r, R_ADMITS] += 1
    SI[s, S_ADMIT] = RI[r, R_ADMITS]
    if kind == TRTLLM:
        RI[r, R_RESERVED] += -(-(SI[s, S_PROMPT] + SI[s, S_OUTPUT] - 1) // bs)
    RA[r, A_PF, RI[r, R_NPREF]] = s
    RI[r, R_NPREF] += 1
    _batch_prefill(RI, RA, r, s, k, 0)


@_jit
def _admit(RI, SI, RA, CFG, r, room, chunked):
    """Scheduler._admit: waiting sequences in queue order into the batch while seats,
    tokens and the policy's KV test allow; the room left."""
    kind, bs, ms = CFG[C_KIND], CFG[C_BS], CFG[C_MAX_SEQS]
    per = _per_chunk(kind)
    while RI[r, R_WLEN] and RI[r, R_N] + RI[r, R_NPREF] < ms:
        s = RI[r, R_WHEAD]
        target = SI[s, S_TARGET]
        if chunked and room <= 0:
            break
        if per:
            k = _chunk(kind, target, room, CFG[C_THRESH])
            cost = -(-k // bs)
        else:
            cost = -(-target // bs)
            if chunked:
                k = _chunk(kind, target, room, 0)
            else:
                k = target
                if k > room and RI[r, R_BNPRE]:
                    break
        final = -(-(SI[s, S_PROMPT] + SI[s, S_OUTPUT] - 1) // bs) if kind == TRTLLM else 0
        free = RI[r, R_NUM_BLOCKS] - RI[r, R_USED]
        running = RI[r, R_N] > 0 or RI[r, R_NPREF] > 0
        if not _fits(kind, free, cost, RI[r, R_WM], running, RI[r, R_RESERVED], final,
                     RI[r, R_NUM_BLOCKS]):  # fmt: skip
            break
        _admit_one(RI, SI, RA, kind, bs, r, s, cost, k)
        room -= k
    return room


@_jit
def _take_joins(G, RI, SI, RA, r):
    """The sequences that joined since the last decode iteration and are still decoding,
    once each in first-join order, into the batch's joined list; the joins cleared."""
    G[G_STAMP] += 1
    stamp = G[G_STAMP]
    b = 0
    for q in range(RI[r, R_NJOINS]):
        s = RA[r, A_JN, q]
        if SI[s, S_RID] == RA[r, A_JNR, q] and SI[s, S_SLOT] >= 0 and SI[s, S_MARK] != stamp:
            SI[s, S_MARK] = stamp
            RA[r, A_BJOIN, b] = s
            b += 1
    RI[r, R_BNJOIN] = b
    RI[r, R_NJOINS] = 0


@_jit
def _victim(RI, SI, SF, RA, kind, r, with_dec, with_pf, from_q):
    """Engine.victim: the running sequence with the largest policy key (with ``with_dec``
    the decode batch in slot order, then with ``with_pf`` the partial prefills from index
    ``from_q``)."""
    best = -1
    b1 = b2 = 0.0
    dit = RI[r, R_DIT]
    for q in range(RI[r, R_N] if with_dec else 0):
        s = RA[r, A_DS, q]
        gen = SI[s, S_GEN] + dit - SI[s, S_JOIN_DIT]
        k1, k2 = _victim_key(kind, SI[s, S_PRIO], SF[s, F_ARRIVAL], SI[s, S_ADMIT], gen,
                             SI[s, S_PROMPT])  # fmt: skip
        if best < 0 or _key_greater(k1, k2, b1, b2):
            best, b1, b2 = s, k1, k2
    if with_pf:
        for q in range(from_q, RI[r, R_NPREF]):
            s = RA[r, A_PF, q]
            k1, k2 = _victim_key(kind, SI[s, S_PRIO], SF[s, F_ARRIVAL], SI[s, S_ADMIT],
                                 SI[s, S_GEN], SI[s, S_PROMPT])  # fmt: skip
            if best < 0 or _key_greater(k1, k2, b1, b2):
                best, b1, b2 = s, k1, k2
    return best


@_jit
def _preempt_dec(RI, RF, SI, SF, RA, RES, bs, kind, r, victim):
    """Engine.preempt by recompute: leave the decode batch, free the KV, wait again."""
    _dec_remove(RI, RF, SI, SF, RA, RES, bs, r, victim)
    RI[r, R_USED] -= SI[victim, S_BLOCKS]
    SI[victim, S_BLOCKS] = 0
    SI[victim, S_PREEMPTED] += 1
    RI[r, R_PREEMPTIONS] += 1
    SI[victim, S_TARGET] = SI[victim, S_CTX] + 1
    SI[victim, S_PREF] = 0
    SI[victim, S_CTX] = 0
    _w_insert(RI, SI, SF, r, victim, kind, _front(kind))
    RI[r, R_QUEUED] += -(-SI[victim, S_TARGET] // bs)


@_jit
def _preempt_pf(RI, SI, SF, RA, bs, kind, r, s):
    """Engine.preempt_prefill: a partly prefilled sequence freed and requeued."""
    m = RI[r, R_NPREF]
    q = 0
    while RA[r, A_PF, q] != s:
        q += 1
    while q < m - 1:
        RA[r, A_PF, q] = RA[r, A_PF, q + 1]
        q += 1
    RI[r, R_NPREF] = m - 1
    RI[r, R_USED] -= SI[s, S_BLOCKS]
    SI[s, S_BLOCKS] = 0
    SI[s, S_PREEMPTED] += 1
    RI[r, R_PREEMPTIONS] += 1
    SI[s, S_PREF] = 0
    _w_insert(RI, SI, SF, r, s, kind, _front(kind))
    RI[r, R_QUEUED] += -(-SI[s, S_TARGET] // bs)


@_jit
def _decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r):
    """Engine.reserve_decode_blocks and Scheduler._decodes: a block for every decode's next
    token, preempting the policy's victims by recompute while they do not fit; the decodes'
    count (the batch's joined list holds those that joined since the last decode
    iteration)."""
    due = -RI[r, R_DIT] % bs
    need = RES[r, due]
    partial = _per_chunk(kind)
    while need > RI[r, R_NUM_BLOCKS] - RI[r, R_USED] and RI[r, R_N]:
        victim = _victim(RI, SI, SF, RA, kind, r, True, partial, 0)
        if SI[victim, S_SLOT] < 0:  # a partial prefill
            _preempt_pf(RI, SI, SF, RA, bs, kind, r, victim)
            continue
        if SI[victim, S_RES] == due:
            need -= 1
        _preempt_dec(RI, RF, SI, SF, RA, RES, bs, kind, r, victim)
    if need > 0:
        _reserve(RI, r, need)
    RI[r, R_BNJOIN] = 0
    if RI[r, R_N] and RI[r, R_NJOINS]:
        _take_joins(G, RI, SI, RA, r)
    return RI[r, R_N]


@_jit
def _v1_partials(RI, SI, SF, RA, CFG, r, room):
    """VllmV1Scheduler.schedule's partial prefills: each one's next chunk, its blocks
    allocated, preempting the policy's victim among it and those after it when short."""
    kind, bs = CFG[C_KIND], CFG[C_BS]
    q = 0
    while q < RI[r, R_NPREF]:
        if room <= 0:
            break
        s = RA[r, A_PF, q]
        k = _chunk(kind, SI[s, S_TARGET] - SI[s, S_PREF], room, CFG[C_THRESH])
        need = -(-(SI[s, S_PREF] + k) // bs) - SI[s, S_BLOCKS]
        if need < 0:
            need = 0
        gone = False
        while need > RI[r, R_NUM_BLOCKS] - RI[r, R_USED]:
            v = _victim(RI, SI, SF, RA, kind, r, False, True, q)
            _preempt_pf(RI, SI, SF, RA, bs, kind, r, v)
            if v == s:
                gone = True
                break
        if gone:
            continue
        _reserve(RI, r, need)
        SI[s, S_BLOCKS] += need
        _batch_prefill(RI, RA, r, s, k, SI[s, S_PREF])
        room -= k
        q += 1
    return room


@_jit
def _sg_prefill(RI, RF, SI, SF, RA, CFG, r):
    """SglangScheduler._prefill: the chunked request's next chunk, then new requests FCFS
    under the chunk and prefill budgets and the ratio-reserved KV; whether any."""
    kind, bs, ms = CFG[C_KIND], CFG[C_BS], CFG[C_MAX_SEQS]
    if not RI[r, R_NPREF] and not RI[r, R_WLEN]:
        return False
    if not RI[r, R_NPREF] and RI[r, R_N] >= ms:
        return False
    ratio = RF[r, RF_RATIO]
    rem_total = float((RI[r, R_NUM_BLOCKS] - RI[r, R_USED]) * bs)
    dit = RI[r, R_DIT]
    for q in range(RI[r, R_N]):
        s = RA[r, A_DS, q]
        gen = SI[s, S_GEN] + dit - SI[s, S_JOIN_DIT]
        rem_total -= _sg_reserve(SI[s, S_OUTPUT] - gen, ratio)
    rem_chunk = CFG[C_PCHUNK]
    rem_input = CFG[C_PMAX]
    for q in range(RI[r, R_NPREF]):
        s = RA[r, A_PF, q]
        todo = SI[s, S_TARGET] - SI[s, S_PREF]
        n = min(todo, rem_chunk, int(rem_total))
        if n <= 0:
            continue
        need = -(-(SI[s, S_PREF] + n) // bs) - SI[s, S_BLOCKS]
        if need < 0:
            need = 0
        if need > RI[r, R_NUM_BLOCKS] - RI[r, R_USED]:
            continue
        _reserve(RI, r, need)
        SI[s, S_BLOCKS] += need
        _batch_prefill(RI, RA, r, s, n, SI[s, S_PREF])
        rem_total -= n
        if n == todo:
            rem_total -= min(SI[s, S_OUTPUT] - SI[s, S_GEN], SG_CLIP)
        rem_chunk -= n
        rem_input -= n
    while RI[r, R_WLEN] and RI[r, R_N] + RI[r, R_NPREF] < ms:
        if rem_total <= 0 or rem_input <= 0 or rem_chunk <= 0:
            break
        s = RI[r, R_WHEAD]
        extend = SI[s, S_TARGET]
        max_new = SI[s, S_OUTPUT] - SI[s, S_GEN]
        if not _sg_admit(rem_total, extend, max_new):
            break
        if extend > rem_input and RI[r, R_BNPRE]:
            break
        n = extend if extend <= rem_chunk else rem_chunk
        cost = -(-n // bs)
        free = RI[r, R_NUM_BLOCKS] - RI[r, R_USED]
        running = RI[r, R_N] > 0 or RI[r, R_NPREF] > 0
        if not _fits(kind, free, cost, RI[r, R_WM], running, RI[r, R_RESERVED], 0,
                     RI[r, R_NUM_BLOCKS]):  # fmt: skip
            break
        _admit_one(RI, SI, RA, kind, bs, r, s, cost, n)
        rem_total -= n
        if n == extend:
            rem_total -= min(max_new, SG_CLIP)
        rem_chunk -= n
        rem_input -= n
    return RI[r, R_BNPRE] > 0


@_jit
def _sg_decode(G, GF, RI, RF, SI, SF, RA, RES, CFG, r):
    """SglangScheduler.schedule's decode step: retract when the next tokens do not fit
    (then the ratio's new estimate), else decay the ratio; the decodes' count."""
    kind, bs = CFG[C_KIND], CFG[C_BS]
    due = -RI[r, R_DIT] % bs
    retracted = RES[r, due] > RI[r, R_NUM_BLOCKS] - RI[r, R_USED]
    while retracted:
        v = _victim(RI, SI, SF, RA, kind, r, True, False, 0)
        _preempt_dec(RI, RF, SI, SF, RA, RES, bs, kind, r, v)
        if not RI[r, R_N]:
            break
        free = RI[r, R_NUM_BLOCKS] - RI[r, R_USED]
        if _sg_done(free * bs, RI[r, R_N]) and RES[r, -RI[r, R_DIT] % bs] <= free:
            break
    if retracted:
        decoded = 0
        max_new = 0
        dit = RI[r, R_DIT]
        for q in range(RI[r, R_N]):
            s = RA[r, A_DS, q]
            decoded += SI[s, S_GEN] + dit - SI[s, S_JOIN_DIT]
            max_new += SI[s, S_OUTPUT]
        RF[r, RF_RATIO] = _sg_ratio(decoded, max_new, RI[r, R_N])
    else:
        RF[r, RF_RATIO] = _sg_decayed(RF[r, RF_RATIO], GF[GF_MIN_RATIO], GF[GF_DECAY])
    if not RI[r, R_N]:
        return 0
    return _decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r)


@_jit
def _schedule(G, GF, RI, RF, SI, SF, RA, RES, CFG, r):
    """Scheduler.schedule of replica r into its batch lists; whether there is work."""
    bs = CFG[C_BS]
    RI[r, R_BNPRE] = 0
    RI[r, R_BNDEC] = 0
    RI[r, R_BNJOIN] = 0
    kind = CFG[C_KIND]
    if kind == VLLM:
        if RI[r, R_WLEN]:
            _admit(RI, SI, RA, CFG, r, CFG[C_MAX_TOKENS], False)
            if RI[r, R_BNPRE]:
                return True
        if not RI[r, R_N]:
            return False
        n_dec = _decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r)
        if n_dec:
            RI[r, R_BNDEC] = n_dec
            return True
        if RI[r, R_WLEN]:  # everything was preempted: prefill again
            _admit(RI, SI, RA, CFG, r, CFG[C_MAX_TOKENS], False)
        return RI[r, R_BNPRE] > 0
    if kind == SGLANG:
        if _sg_prefill(RI, RF, SI, SF, RA, CFG, r):
            return True
        if not RI[r, R_N]:
            return False
        n_dec = _sg_decode(G, GF, RI, RF, SI, SF, RA, RES, CFG, r)
        if not n_dec:  # everything retracted: prefill again
            return _sg_prefill(RI, RF, SI, SF, RA, CFG, r)
        RI[r, R_BNDEC] = n_dec
        return True
    n_dec = 0
    pre0 = RI[r, R_PREEMPTIONS]
    if RI[r, R_N]:
        n_dec = _decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r)
    RI[r, R_BNDEC] = n_dec
    if kind in (ORCA, TRTLLM):
        if RI[r, R_WLEN]:
            _admit(RI, SI, RA, CFG, r, CFG[C_MAX_TOKENS] - n_dec, False)
    elif kind in (VLLM_V1, PRIORITY):
        room = _v1_partials(RI, SI, SF, RA, CFG, r, CFG[C_MAX_TOKENS] - n_dec)
        if room > 0 and RI[r, R_WLEN] and RI[r, R_PREEMPTIONS] == pre0:
            _admit(RI, SI, RA, CFG, r, room, True)
    else:  # sarathi: decodes, then partly-done prefills, then new ones, in the budget
        room = CFG[C_CHUNK] - n_dec
        for q in range(RI[r, R_NPREF]):
            if room <= 0:
                break
            s = RA[r, A_PF, q]
            todo = SI[s, S_TARGET] - SI[s, S_PREF]
            k = todo if todo < room else room
            _batch_prefill(RI, RA, r, s, k, SI[s, S_PREF])
            room -= k
        if room > 0 and RI[r, R_WLEN]:
            _admit(RI, SI, RA, CFG, r, room, True)
    return RI[r, R_BNPRE] > 0 or n_dec > 0


@_jit
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
    _ev_push(G, EH, now + dt, r)


@_jit
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
                n_dec = _decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r)
                if not n_dec:  # everything was preempted: prefill again
                    continue
            else:
                n_dec = RI[r, R_N]
                RI[r, R_BNJOIN] = 0
                if need:
                    _reserve(RI, r, need)
            RI[r, R_BNDEC] = n_dec
            ctx_sum = RI[r, R_SUM_CTX0] + n_dec * RI[r, R_DIT]
            dt = price_decode(PI, PF, PG, WDEC, DT, n_dec, ctx_sum)
        else:
            if not _schedule(G, GF, RI, RF, SI, SF, RA, RES, CFG, r):
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
@_jit
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


@_jit
def _tbt(G, BI, BF, gap, weight):
    i = G[G_TBT_N]
    BF[i, BF_TBT] = gap
    BI[i, B_TBTW] = weight
    G[G_TBT_N] = i + 1


@_jit
def _prefilled(G, RI, SI, SF, RA, RES, FH, BI, BF, CFG, r, now):
    """Engine.finish_batch's prefill part: finished prompts produce their first token and
    join the decode batch (or finish)."""
    for c in range(RI[r, R_BNPRE]):
        s = RA[r, A_BPRE, c]
        SI[s, S_PREF] += RA[r, A_BNEW, c]
        if SI[s, S_PREF] < SI[s, S_TARGET]:
            continue
        m = RI[r, R_NPREF]  # prefilling.remove(s), in order
        q = 0
        while RA[r, A_PF, q] != s:
            q += 1
        while q < m - 1:
            RA[r, A_PF, q] = RA[r, A_PF, q + 1]
            q += 1
        RI[r, R_NPREF] = m - 1
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
            _dec_add(G, RI, SI, RA, RES, FH, CFG[C_BS], CFG[C_MAX_SEQS], r, s)
            j = RI[r, R_NJOINS]
            RA[r, A_JN, j], RA[r, A_JNR, j] = s, SI[s, S_RID]
            RI[r, R_NJOINS] = j + 1


@_jit
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
            s, rid = _fh_pop(FH, RI, r)
            # skip stale entries (finished, preempted, maybe rejoined)
            if SI[s, S_RID] == rid and SI[s, S_SLOT] >= 0 and SI[s, S_FINISH_DIT] == dit:
                SI[s, S_FINISH_DIT] = -1
                _dec_remove(RI, RF, SI, SF, RA, RES, CFG[C_BS], r, s)
                _done(G, RI, SI, SF, BI, BF, CFG, r, s, now)
    if RI[r, R_BNPRE]:
        _prefilled(G, RI, SI, SF, RA, RES, FH, BI, BF, CFG, r, now)


# === arrivals ==============================================================================
@_jit
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


@_jit
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
    _w_insert(RI, SI, SF, r, s, CFG[C_KIND], False)
    RI[r, R_QUEUED] += -(-p // CFG[C_BS])
    return r


# === the loop ==============================================================================
@_jit
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
        now, r = _ev_pop(G, EH)
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
