"""The compiled serving loop's state layout and its data-structure primitives.

Every sequence, replica, queue, decode batch and heap of the fast path is a row or a
column of a numpy array; this module names the columns (``S_*``, ``R_*``, ... below) and
holds the compiled primitives over them: the event and finish heaps, the waiting queue (a
linked list through the sequence pool) and the lockstep decode batch
(:class:`simcli.serving.batch.DecodeBatch` as arrays). :mod:`simcli.serving.fastsched`
(the schedulers) and :mod:`simcli.serving.fastkernel` (the loop) build on it.
"""

from __future__ import annotations

from numba import njit

from simcli.serving import policy

# Compiled without numba's reference counting (``_nrt=False``): the kernel allocates
# nothing, only indexes the arrays its driver owns, and the counting of every array passed
# to every helper cost two thirds of its time.
jit = njit(cache=True, _nrt=False)

# --- return codes --------------------------------------------------------------------
DONE, NEED_ARRIVALS, FLUSH, GROW, PROGRESS, PRICE = range(6)

# --- configuration (CFG, int64) ------------------------------------------------------
(C_KIND, C_BS, C_MAX_SEQS, C_MAX_TOKENS, C_CHUNK, C_ROUTER, C_NREP, C_FLUSH, C_THRESH,
 C_PCHUNK, C_PMAX) = range(11)  # fmt: skip
NCFG = 11
# the policy codes (simcli.serving.policy)
VLLM, ORCA, SARATHI = policy.VLLM, policy.ORCA, policy.SARATHI
VLLM_V1, SGLANG, TRTLLM, PRIORITY = policy.VLLM_V1, policy.SGLANG, policy.TRTLLM, policy.PRIORITY
TRTLLM_MU = policy.TRTLLM_MU
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
@jit
def _ev_less(EH, a, b):
    return EH[E_T, a] < EH[E_T, b] or (EH[E_T, a] == EH[E_T, b] and EH[E_O, a] < EH[E_O, b])


@jit
def _ev_swap(EH, a, b):
    for f in range(3):
        EH[f, a], EH[f, b] = EH[f, b], EH[f, a]


@jit
def ev_push(G, EH, t, r):
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


@jit
def ev_pop(G, EH):
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


@jit
def _fh_swap(FH, r, a, b):
    for f in range(3):
        FH[r, f, a], FH[r, f, b] = FH[r, f, b], FH[r, f, a]


@jit
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


@jit
def fh_pop(FH, RI, r):
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
@jit
def w_append(RI, SI, r, s, left):
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


@jit
def w_popleft(RI, SI, r):
    s = RI[r, R_WHEAD]
    nxt = SI[s, S_NEXT]
    RI[r, R_WHEAD] = nxt
    if nxt < 0:
        RI[r, R_WTAIL] = -1
    RI[r, R_WLEN] -= 1
    return s


@jit
def pf_remove(RI, RA, r, s):
    """``engine.prefilling.remove(s)``: the partly prefilled list keeps its order."""
    m = RI[r, R_NPREF]
    q = 0
    while RA[r, A_PF, q] != s:
        q += 1
    while q < m - 1:
        RA[r, A_PF, q] = RA[r, A_PF, q + 1]
        q += 1
    RI[r, R_NPREF] = m - 1


# === the decode batch (DecodeBatch: a context is ctx0[slot] + dit) ========================
@jit
def dec_add(G, RI, SI, RA, RES, FH, bs, ms, r, s):
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


@jit
def dec_remove(RI, RF, SI, SF, RA, RES, bs, r, s):
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
