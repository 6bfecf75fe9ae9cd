"""A compiled copy of :class:`~costmodels.steps.serving.StepModel`'s scalar step pricing
(:mod:`costmodels.steps.serving_summary`), for the serving simulator's compiled loop
(:mod:`simcli.serving.fastkernel`).

It reads what :meth:`StepModel.summary_tables` hands over -- the step model's own
interpolation grids and decode shares, packed into a few arrays the compiled code indexes
in place (their layout is :mod:`costmodels.steps.serving_summary`'s) -- and performs
``step_s_summary``'s operations in the same order, so a price is the same float bit for
bit (tested over random batches in ``tests/simcli/serving/test_fastpath.py``). Where the
Python path would leave its scalar grids (more than 8 prefill chunks, sizes past the
grids, an eager engine's prefill, a step model that reprices attention) it returns NaN
and the caller prices the step with the step model. numba is imported only by whoever
imports this module.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from costmodels.steps.serving_summary import (  # the layout of summary_tables
    O_CAPS,
    O_DECB,
    O_DECKV,
    O_N,
    O_P,
    O_SEQK,
    O_SEQT,
    O_SEQT_S,
    O_SEQTD,
    O_SEQTD_S,
    O_SEQX,
    O_TOKK,
    O_TOKT,
    O_TOKT_S,
    O_TOKX,
    P_CAP_MAX,
    P_DEC_MAX,
    P_LAYERS,
    P_MIXED_GRAPH,
    P_MIXED_OK,
    P_OVERLAP,
    PF_FLOORS,
    PF_FS,
    PF_HA,
    PF_HB,
    PF_HC,
    PF_IDLES,
    PF_LAUNCH,
)

# without numba's reference counting: these functions allocate nothing (see fastkernel)
_jit = njit(cache=True, _nrt=False)


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
def _grid_total_s(PI, PG, T, S, decodes, graph):
    """SummaryPricing._grid_total_s in the graph or the host-launched context."""
    i, w = _bracket(PI, PG, O_TOKX, T)
    t0 = PI[O_TOKT if graph else O_TOKT_S] + i
    tok = PG[t0] + w * (PG[t0 + 1] - PG[t0])
    i, w = _bracket(PI, PG, O_SEQX, S)
    if graph:
        s0 = PI[O_SEQTD if decodes else O_SEQT] + i
    else:
        s0 = PI[O_SEQTD_S if decodes else O_SEQT_S] + i
    return tok + PG[s0] + w * (PG[s0 + 1] - PG[s0])


@_jit
def _kernels(PI, PG, T, S, k, n_dec):
    """StepModel._kernels: kernels one iteration launches."""
    i, w = _bracket(PI, PG, O_TOKX, T)
    a0 = PI[O_TOKK] + i
    n = PG[a0] + w * (PG[a0 + 1] - PG[a0])
    i, w = _bracket(PI, PG, O_SEQX, S)
    b0 = PI[O_SEQK] + i
    n = n + (PG[b0] + w * (PG[b0 + 1] - PG[b0]))
    return n + PI[P_LAYERS] * ((k > 0) + (n_dec > 0))


@_jit
def _padded(PI, PG, T):
    """engines.padded_size: the smallest capture size >= T (T <= the largest)."""
    lo, hi = PI[O_CAPS], PI[O_CAPS + 1]
    while lo < hi:
        mid = (lo + hi) >> 1
        if PG[mid] < T:
            lo = mid + 1
        else:
            hi = mid
    return int(PG[lo])


@_jit
def _combine(PI, gpu, h):
    """EngineProfile.combine_s: serial or overlapped host work."""
    if PI[P_OVERLAP]:
        return max(gpu, h)
    return gpu + h


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
    gpu = DT[0, n] + PI[P_LAYERS] * (DT[3, n] * dec + DT[4, n])
    if DT[5, n]:
        gpu = max(gpu, DT[5, n])
    return _combine(PI, gpu, DT[6, n])


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
    # StepModel._plan of a batch with prefills: piecewise graphs (padded) or host launches;
    # attention is launched from the host either way
    graph = PI[P_MIXED_GRAPH] != 0 and PI[P_CAP_MAX] >= T
    Tg = _padded(PI, PG, T) if graph else T
    f, idle, floor = PF[PF_FS], PF[PF_IDLES], PF[PF_FLOORS]
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
    if _last(PI, PG, O_TOKX) < Tg or _last(PI, PG, O_SEQX) < S:
        return np.nan
    gpu = _grid_total_s(PI, PG, Tg, S, n_dec > 0, graph) + PI[P_LAYERS] * attn
    if not graph and PF[PF_LAUNCH]:  # StepModel._finish
        gpu = max(gpu, _kernels(PI, PG, T, S, k, n_dec) * PF[PF_LAUNCH])
    h = PF[PF_HA] + PF[PF_HB] * S + PF[PF_HC] * T
    return _combine(PI, gpu, h)
