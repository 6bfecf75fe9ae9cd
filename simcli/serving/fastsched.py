"""The schedulers of the compiled serving loop: the admissions, victims and budgets of
:mod:`simcli.serving.schedulers` over the fast path's arrays.

Every decision is a function of :mod:`simcli.serving.policy` compiled here with numba
(``jit(policy.fn)``): the same code the event loop's scheduler classes call, so the two
loops take the same decisions (``tests/simcli/serving/test_schedulers.py`` and
``test_fastpath.py`` hold them equal request for request). What remains here is the
bookkeeping over arrays that the engine (:mod:`simcli.serving.engine`) does over objects.
"""

from __future__ import annotations

from simcli.serving import policy
from simcli.serving.fastlayout import (
    A_BJOIN,
    A_BNEW,
    A_BPAST,
    A_BPRE,
    A_DS,
    A_JN,
    A_JNR,
    A_PF,
    C_BS,
    C_CHUNK,
    C_KIND,
    C_MAX_SEQS,
    C_MAX_TOKENS,
    C_PCHUNK,
    C_PMAX,
    C_THRESH,
    F_ARRIVAL,
    G_STAMP,
    GF_DECAY,
    GF_MIN_RATIO,
    ORCA,
    PRIORITY,
    R_ADMITS,
    R_BNDEC,
    R_BNJOIN,
    R_BNPRE,
    R_DIT,
    R_N,
    R_NJOINS,
    R_NPREF,
    R_NUM_BLOCKS,
    R_PEAK,
    R_PREEMPTIONS,
    R_QUEUED,
    R_RESERVED,
    R_USED,
    R_WHEAD,
    R_WLEN,
    R_WM,
    R_WTAIL,
    RF_RATIO,
    S_ADMIT,
    S_BLOCKS,
    S_CTX,
    S_GEN,
    S_JOIN_DIT,
    S_MARK,
    S_NEXT,
    S_OUTPUT,
    S_PREEMPTED,
    S_PREF,
    S_PRIO,
    S_PROMPT,
    S_RES,
    S_RID,
    S_SLOT,
    S_TARGET,
    SGLANG,
    TRTLLM,
    TRTLLM_MU,
    VLLM,
    VLLM_V1,
    dec_remove,
    jit,
    pf_remove,
    w_append,
    w_popleft,
)

# the schedulers' decisions: the same functions the event loop's schedulers call
_victim_key = jit(policy.victim_key)
_key_greater = jit(policy.key_greater)
_queue_key = jit(policy.queue_key)
_ordered = jit(policy.ordered_queue)
_front = jit(policy.requeue_front)
_fits = jit(policy.admit_fits)
_chunk = jit(policy.chunk_tokens)
_per_chunk = jit(policy.allocates_per_chunk)
_sg_reserve = jit(policy.sglang_reserve)
_sg_admit = jit(policy.sglang_admit)
_sg_decayed = jit(policy.sglang_decayed)
_sg_done = jit(policy.sglang_retract_done)
_sg_ratio = jit(policy.sglang_ratio_after_retract)
SG_CLIP = policy.SGLANG_CLIP_NEW_TOKENS


# === scheduling ===========================================================================
@jit
def w_insert(RI, SI, SF, r, s, kind, left):
    """Engine.enqueue: by the policy's key in an ordered queue (after its equals), else at
    the back, or the front (``left``)."""
    if not _ordered(kind) or RI[r, R_WLEN] == 0:
        w_append(RI, SI, r, s, left)
        return
    k1, k2 = _queue_key(kind, SI[s, S_PRIO], SF[s, F_ARRIVAL])
    t = RI[r, R_WTAIL]
    l1, l2 = _queue_key(kind, SI[t, S_PRIO], SF[t, F_ARRIVAL])
    if not _key_greater(l1, l2, k1, k2):
        w_append(RI, SI, r, s, False)
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


@jit
def reserve(RI, r, blocks):
    RI[r, R_USED] += blocks
    if RI[r, R_USED] > RI[r, R_PEAK]:
        RI[r, R_PEAK] = RI[r, R_USED]


@jit
def _batch_prefill(RI, RA, r, s, k, past):
    b = RI[r, R_BNPRE]
    RA[r, A_BPRE, b], RA[r, A_BNEW, b], RA[r, A_BPAST, b] = s, k, past
    RI[r, R_BNPRE] = b + 1


@jit
def _admit_one(RI, SI, RA, kind, bs, r, s, cost, k):
    """Engine.admit of the queue's head ``s`` with ``cost`` blocks, into the batch with
    ``k`` prefill tokens."""
    w_popleft(RI, SI, r)
    RI[r, R_QUEUED] -= -(-SI[s, S_TARGET] // bs)
    SI[s, S_BLOCKS] = cost
    reserve(RI, r, cost)
    SI[s, S_PREF] = 0
    RI[r, R_ADMITS] += 1
    SI[s, S_ADMIT] = RI[r, R_ADMITS]
    if kind == TRTLLM:
        RI[r, R_RESERVED] += -(-(SI[s, S_PROMPT] + SI[s, S_OUTPUT] - 1) // bs)
    RA[r, A_PF, RI[r, R_NPREF]] = s
    RI[r, R_NPREF] += 1
    _batch_prefill(RI, RA, r, s, k, 0)


@jit
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


@jit
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


@jit
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


@jit
def _preempt_dec(RI, RF, SI, SF, RA, RES, bs, kind, r, victim):
    """Engine.preempt by recompute: leave the decode batch, free the KV, wait again."""
    dec_remove(RI, RF, SI, SF, RA, RES, bs, r, victim)
    RI[r, R_USED] -= SI[victim, S_BLOCKS]
    SI[victim, S_BLOCKS] = 0
    SI[victim, S_PREEMPTED] += 1
    RI[r, R_PREEMPTIONS] += 1
    SI[victim, S_TARGET] = SI[victim, S_CTX] + 1
    SI[victim, S_PREF] = 0
    SI[victim, S_CTX] = 0
    w_insert(RI, SI, SF, r, victim, kind, _front(kind))
    RI[r, R_QUEUED] += -(-SI[victim, S_TARGET] // bs)


@jit
def _preempt_pf(RI, SI, SF, RA, bs, kind, r, s):
    """Engine.preempt_prefill: a partly prefilled sequence freed and requeued."""
    pf_remove(RI, RA, r, s)
    RI[r, R_USED] -= SI[s, S_BLOCKS]
    SI[s, S_BLOCKS] = 0
    SI[s, S_PREEMPTED] += 1
    RI[r, R_PREEMPTIONS] += 1
    SI[s, S_PREF] = 0
    w_insert(RI, SI, SF, r, s, kind, _front(kind))
    RI[r, R_QUEUED] += -(-SI[s, S_TARGET] // bs)


@jit
def decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r):
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
        reserve(RI, r, need)
    RI[r, R_BNJOIN] = 0
    if RI[r, R_N] and RI[r, R_NJOINS]:
        _take_joins(G, RI, SI, RA, r)
    return RI[r, R_N]


@jit
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
        reserve(RI, r, need)
        SI[s, S_BLOCKS] += need
        _batch_prefill(RI, RA, r, s, k, SI[s, S_PREF])
        room -= k
        q += 1
    return room


@jit
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
        reserve(RI, r, need)
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


@jit
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
    return decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r)


@jit
def schedule(G, GF, RI, RF, SI, SF, RA, RES, CFG, r):
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
        n_dec = decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r)
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
        n_dec = decodes(G, RI, RF, SI, SF, RA, RES, bs, kind, r)
    RI[r, R_BNDEC] = n_dec
    if kind in (ORCA, TRTLLM, TRTLLM_MU):
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
