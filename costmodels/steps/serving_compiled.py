"""A compiled copy of :class:`~costmodels.steps.serving.StepModel`'s scalar step pricing
(:mod:`costmodels.steps.serving_summary`), for the serving simulator's compiled loop
(:mod:`simcli.serving.fastkernel`).

It reads what :meth:`StepModel.summary_tables` hands over -- the step model's own
interpolation grids and decode shares -- packed by :func:`pack_tables` into a few arrays
the compiled code indexes in place, and performs ``step_s_summary``'s operations in the
same order, so a price is the same float bit for bit (tested over random batches in
``tests/simcli/serving/test_fastpath.py``). Where the Python path would leave its scalar
grids (more than 8 prefill chunks, sizes past the grids, an eager engine's prefill, a step
model that reprices attention) it returns NaN and the caller prices the step with the step
model. numba is imported only by whoever imports this module.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# without numba's reference counting: these functions allocate nothing (see fastkernel)
_jit = njit(cache=True, _nrt=False)

# --- price tables: PI int64 (flags, then where each grid starts in PG), PF float64
# scalars, PG every 1-D grid end to end, W2 the prefill attention grids (w1, wfill), WDEC
# the decode attention grid, DT each decode batch size's share (base, weight, row)
P_MIXED_OK, P_LAYERS, P_DEC_MAX = range(3)
(O_N, O_P, O_TOKX, O_TOKT, O_SEQX, O_SEQT, O_SEQTD, O_DECB, O_DECKV,
 O_END) = range(3, 13)  # fmt: skip
PF_F, PF_IDLE, PF_FLOOR, PF_IDLE_FLOOR = range(4)


def pack_tables(tables: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """The kernel's price arrays from ``StepModel.summary_tables`` (its order: flags,
    scalars, n, p, tok_x, tok_total, seq_x, seq_total, seq_total_dec, w1, wfill, dec_b,
    dec_kv, wdec, base, weight, row). Few arrays and no views: the compiled code indexes
    them in place."""
    ints, floats = tables[0], tables[1]
    n, p, tok_x, tok_t, seq_x, seq_t, seq_td, w1, wfill, dec_b, dec_kv, wdec = tables[2:14]
    grids = [n, p, tok_x, tok_t, seq_x, seq_t, seq_td, dec_b, dec_kv]
    starts = np.cumsum([0] + [g.size for g in grids])
    PI = np.concatenate([ints[:3], starts]).astype(np.int64)
    PG = np.concatenate(grids).astype(np.float64)
    W2 = np.ascontiguousarray(np.stack([w1, wfill]), dtype=np.float64)
    DT = np.ascontiguousarray(np.stack([tables[14], tables[15], tables[16].astype(np.float64)]))
    return PI, np.asarray(floats, np.float64), PG, W2, np.ascontiguousarray(wdec), DT


# === pricing: StepModel.step_s_summary's scalar path on its grids ======================
@_jit
def _bracket(PI, PG, o, x):
    """serving_grid.bracket on grid number ``o`` of PG: i, w with
    x = (1 - w) grid[i] + w grid[i + 1] (bisect_right, i clamped below the last)."""
    lo0 = PI[o]
    hi0 = PI[o + 1]
    lo, hi = lo0, hi0
    while lo < hi:
        mid = (lo + hi) >> 1
        if x < PG[mid]:
            hi = mid
        else:
            lo = mid + 1
    i = lo - 1
    if i >= hi0 - 1:
        i = hi0 - 2
    g0 = PG[i]
    return i - lo0, (x - g0) / (PG[i + 1] - g0)


@_jit
def _last(PI, PG, o):
    return PG[PI[o + 1] - 1]


@_jit
def _bilinear(A, a, i, wi, j, wj):
    """(1 - wi)((1 - wj) A[a, i, j] + ...) as serving_summary writes it."""
    return (1 - wi) * ((1 - wj) * A[a, i, j] + wj * A[a, i, j + 1]) + wi * (
        (1 - wj) * A[a, i + 1, j] + wj * A[a, i + 1, j + 1]
    )


@_jit
def _grid_total_s(PI, PG, T, S, decodes):
    """SummaryPricing._grid_total_s."""
    i, w = _bracket(PI, PG, O_TOKX, T)
    t0 = PI[O_TOKT] + i
    tok = PG[t0] + w * (PG[t0 + 1] - PG[t0])
    i, w = _bracket(PI, PG, O_SEQX, S)
    s0 = PI[O_SEQTD if decodes else O_SEQT] + i
    return tok + PG[s0] + w * (PG[s0 + 1] - PG[s0])


@_jit
def price_decode(PI, PF, PG, WDEC, DT, n, ctx_sum):
    """SummaryPricing.step_s_decode; NaN where it leaves the grids (the caller prices it)."""
    if n > PI[P_DEC_MAX]:
        return np.nan
    row = int(DT[2, n])
    if row < 0:
        return np.nan
    kv = ctx_sum / n + 1.0
    if kv > _last(PI, PG, O_DECKV):
        return np.nan
    j, wj = _bracket(PI, PG, O_DECKV, kv)
    wi = DT[1, n]
    dec = (1 - wi) * ((1 - wj) * WDEC[row, j] + wj * WDEC[row, j + 1]) + wi * (
        (1 - wj) * WDEC[row + 1, j] + wj * WDEC[row + 1, j + 1]
    )
    return DT[0, n] + PI[P_LAYERS] * (PF[PF_F] * dec + PF[PF_IDLE_FLOOR])


@_jit
def price_mixed(PI, PF, PG, W2, WDEC, DT, new, past, k, n_dec, ctx_sum):
    """SummaryPricing.step_s_summary of ``k`` prefill chunks (``new[:k]`` tokens over
    ``past[:k]`` cached) and ``n_dec`` decodes over ``ctx_sum`` cached tokens; NaN where
    the Python path would leave its scalar grids (the caller then prices it with the step
    model)."""
    if k == 0:
        return price_decode(PI, PF, PG, WDEC, DT, n_dec, ctx_sum)
    if not PI[P_MIXED_OK] or k > 8:
        return np.nan
    n_hi, p_hi = _last(PI, PG, O_N), _last(PI, PG, O_P)
    tot = 0.0
    top = 0.0
    T = n_dec
    for c in range(k):
        n = new[c]
        p = past[c]
        if n > n_hi or p > p_hi:
            return np.nan
        i, wi = _bracket(PI, PG, O_N, n)
        j, wj = _bracket(PI, PG, O_P, p)
        v1 = _bilinear(W2, 0, i, wi, j, wj)
        vf = _bilinear(W2, 1, i, wi, j, wj)
        tot += vf
        top = max(top, v1)
        T += n
    pre = max(tot, top)
    f, idle, floor = PF[PF_F], PF[PF_IDLE], PF[PF_FLOOR]
    attn = 0.0
    attn += f * pre + idle * floor * 1
    if n_dec:
        kv = ctx_sum / n_dec + 1.0
        if n_dec > _last(PI, PG, O_DECB) or kv > _last(PI, PG, O_DECKV):
            return np.nan
        i, wi = _bracket(PI, PG, O_DECB, n_dec)
        j, wj = _bracket(PI, PG, O_DECKV, kv)
        dec = (1 - wi) * ((1 - wj) * WDEC[i, j] + wj * WDEC[i, j + 1]) + wi * (
            (1 - wj) * WDEC[i + 1, j] + wj * WDEC[i + 1, j + 1]
        )
        attn += f * dec + idle * floor
    S = k + n_dec
    if _last(PI, PG, O_TOKX) < T or _last(PI, PG, O_SEQX) < S:
        return np.nan
    return _grid_total_s(PI, PG, T, S, n_dec > 0) + PI[P_LAYERS] * attn
