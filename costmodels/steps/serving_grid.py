"""The numerical machinery of the serving step model: op frames of templates on grids,
pricing with the launch cost swapped for a kernel floor, the grids themselves and their
interpolation, and the launch queue of an eager (host-dispatched) step."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from costmodels.ops.analytical import frame_columns
from costmodels.ops.gemm import weight_only_gemm_work
from workloads.decompose import OpTemplate
from workloads.decompose.quant import weight_only_bytes
from workloads.ops import (
    CSV_COLUMNS,
    EXTRA_COLUMNS,
    INT_COLUMNS,
    SPARSITY_COLUMN,
    normalise_frame,
)


class StepError(ValueError):
    """A step-model input that cannot be priced; the message is one line for users."""


# numeric op columns: the integer ones and the block-sparse density
_NUMERIC = (*INT_COLUMNS, "density")


def frame_of(
    tpls: Sequence[OpTemplate], x: np.ndarray, dtype: str, strided_scale: float = 1.0
) -> pd.DataFrame:
    """An ops frame with every template at every x (template-major rows)."""
    n, k = len(x), len(tpls)
    num = {c: np.full(k * n, np.nan) for c in _NUMERIC}
    op = np.empty(k * n, dtype=object)
    dt = np.full(k * n, dtype, dtype=object)
    for idx, t in enumerate(tpls):
        sl = slice(idx * n, (idx + 1) * n)
        op[sl] = t.op
        for c, v in t.fields_at(x, strided_scale).items():
            if c == "dtype":
                dt[sl] = v
            elif v is not None:
                num[c][sl] = v
    cols: dict[str, Any] = {"op": op, "dtype": dt, **num}
    cols["causal"] = np.zeros(k * n, dtype=bool)
    cols["backend"] = np.full(k * n, "", dtype=object)
    columns = [*CSV_COLUMNS, *EXTRA_COLUMNS]
    if any(t.sparsity for t in tpls):  # only then: dense frames stay as they were
        cols[SPARSITY_COLUMN] = np.repeat([t.sparsity or "" for t in tpls], n).astype(object)
        columns.append(SPARSITY_COLUMN)
    return normalise_frame(pd.DataFrame(cols).reindex(columns=columns))


def attention_frame(
    op: str, dtype: str, dims: dict, backend: str, batch: Any, seq_q: Any, seq_kv: Any
) -> pd.DataFrame:
    """Rows of ``attn_fwd`` (causal) or ``attn_decode`` at these sizes, heads and head dim
    from ``dims``, priced by the op backend ``backend``."""
    size = len(batch)
    cols: dict[str, Any] = {
        "op": op,
        "dtype": dtype,
        "batch": np.asarray(batch).astype(np.int64),
        "seq_q": np.asarray(seq_q).astype(np.int64),
        "seq_kv": np.asarray(seq_kv).astype(np.int64),
        **{k: np.full(size, dims[k]) for k in ("heads_q", "heads_kv", "head_dim")},
        "backend": backend,
    }
    if op == "attn_fwd":
        cols["causal"] = np.ones(size, dtype=bool)
    return normalise_frame(pd.DataFrame(cols).reindex(columns=[*CSV_COLUMNS, *EXTRA_COLUMNS]))


@dataclass
class Pricer:
    """Prices op rows with the cost model and swaps the fitted launch cost for a floor."""

    cost_model: Any
    launch_s: dict[str, float]
    dtype: str
    strided_scale: float = 1.0  # bytes multiplier of strided eager kernels

    def __post_init__(self) -> None:
        self.analytical = getattr(self.cost_model, "base", self.cost_model)

    def work(
        self, frame: pd.DataFrame, launch: np.ndarray, analytical_s: np.ndarray | None = None
    ) -> np.ndarray:
        """Seconds per row with the launch removed: ``t * (t_an - launch) / t_an`` (the
        learned correction scales the analytical time; keep its ratio on the rest).

        ``analytical_s``: the analytical time of what actually runs when ``frame`` only
        describes its calibrated twin (a weight-only quantised GEMM priced from the bf16
        GEMM, decode attention over an fp8 cache from the bf16 one): the twin's learned
        correction is kept, ``t * (analytical_s - launch) / t_an``."""
        t = np.asarray(self.cost_model.predict_many(frame, validated=True), dtype=float)
        if self.analytical is self.cost_model:
            ta = t
        else:
            ta = np.asarray(self.analytical.predict_many(frame, validated=True), dtype=float)
        run = ta if analytical_s is None else analytical_s
        return t * np.maximum(run - launch, 0.0) / np.maximum(ta, 1e-30)

    def analytical_of(self, frame: pd.DataFrame) -> np.ndarray:
        """The analytical model's seconds per row."""
        return np.asarray(self.analytical.predict_many(frame, validated=True), dtype=float)

    def weight_only_s(self, frame: pd.DataFrame, bits: np.ndarray) -> np.ndarray:
        """Analytical seconds per row, the rows with ``bits > 0`` priced as weight-only
        quantised GEMMs with B stored in that many bits
        (:func:`costmodels.ops.gemm.weight_only_gemm_work`)."""
        run = self.analytical_of(frame)
        mask = bits > 0
        gpu = getattr(self.analytical, "gpu", None)
        params = getattr(self.analytical, "params", None)
        if gpu is None or params is None:
            raise StepError(
                "weight-only quantised GEMMs need an analytical GEMM model (the cost model "
                f"{type(self.analytical).__name__} has none); allowed: --weight-dtype bf16, "
                "fp16 or fp8"
            )
        cols = frame_columns(frame.loc[mask])
        b = bits[mask]
        w = weight_only_gemm_work(
            cols["m"], cols["n"], cols["k"], cols["batch"], cols["dtype"], b,
            np.array([weight_only_bytes(int(v)) for v in b]), gpu, params.gemm,
        )  # fmt: skip
        run[mask] = w.time_s
        return run

    def eager_sparse_s(self, frame: pd.DataFrame, run: np.ndarray | None) -> np.ndarray:
        """Analytical seconds per row (or ``run``), the 2:4 rows as torch's eager
        ``_cslt_sparse_mm`` call runs them: at least its per-call plan set-up
        (:func:`costmodels.ops.sparse_gemm.sparse_gemm_work`, ``eager=True``). The ops'
        models price 2:4 as the kernel alone (a CUDA-graph replay)."""
        from costmodels.ops.sparse_gemm import sparse_gemm_work

        run = self.analytical_of(frame) if run is None else run.copy()
        mask = frame[SPARSITY_COLUMN].to_numpy() == "2:4"
        gpu = getattr(self.analytical, "gpu", None)
        params = getattr(self.analytical, "params", None)
        if mask.any() and gpu is not None and params is not None:
            c = frame_columns(frame.loc[mask])
            w = sparse_gemm_work(
                c["m"], c["n"], c["k"], c["batch"], c["dtype"], "2:4", gpu,
                dense=params.gemm, eager=True,
            )  # fmt: skip
            run[mask] = w.time_s
        return run

    def templates(
        self, tpls: Sequence[OpTemplate], x: np.ndarray, *, eager: bool = False
    ) -> np.ndarray:
        """[len(tpls), len(x)] seconds of work per template instance (MoE: x active);
        ``eager``: 2:4 GEMMs as eager torch calls (:meth:`eager_sparse_s`)."""
        real = [t for t in tpls if t.op]
        out = np.zeros((len(tpls), len(x)))
        if not real:
            return out
        frame = frame_of(real, x, self.dtype, self.strided_scale)
        launch = np.repeat([self.launch_s[t.launch] for t in real], len(x))
        bits = np.repeat([t.weight_bits or 0 for t in real], len(x))
        run = self.weight_only_s(frame, bits) if bits.any() else None
        if eager and any(t.sparsity == "2:4" for t in real):
            run = self.eager_sparse_s(frame, run)
        w = self.work(frame, launch, run).reshape(len(real), len(x))
        j = 0
        for i, t in enumerate(tpls):
            if not t.op:
                continue
            out[i] = w[j] * t.instances_at(x)
            j += 1
        return out


def int_grid(hi: int, dense: int = 256, aligned: int = 16384) -> np.ndarray:
    """Every integer to ``dense``, both sides of each multiple of 64 to ``aligned`` (GEMM
    tiles step there), then 1% apart; exact interpolation where the time is piecewise
    linear between multiples of 64."""
    hi = max(int(hi), dense + 1)
    a = np.arange(1, dense + 1)
    top = min(aligned, hi)
    b = np.arange(64 * (dense // 64), top + 64, 64)
    parts = [a, b, b + 1]
    if hi > aligned:
        parts.append(np.round(np.geomspace(aligned, hi, int(math.log(hi / aligned) / 0.01) + 2)))
    g = np.unique(np.concatenate(parts).astype(np.int64))
    return g[g <= max(hi, dense)]


def attn_axis(hi: int, zero: bool = False) -> np.ndarray:
    """Attention lengths: integers to 16, multiples of 64 (and +1) to 2048 (128-key blocks
    step there), then 4% apart."""
    parts = [np.arange(1, 17), np.arange(64, 2049, 64), np.arange(65, 2049, 64)]
    parts.append(np.round(np.geomspace(2048, hi, int(math.log(hi / 2048) / 0.04) + 2)))
    if zero:
        parts.append(np.array([0]))
    g = np.unique(np.concatenate(parts).astype(np.int64))
    return g[g <= hi]


def decode_axes(b_hi: int, kv_hi: int) -> tuple[np.ndarray, np.ndarray]:
    b = np.unique(np.concatenate([np.arange(1, 65), np.round(np.geomspace(64, b_hi, 120))]))
    kv = np.unique(
        np.concatenate([np.arange(1, 33), np.round(np.geomspace(32, kv_hi, 260))])
    ).astype(np.int64)
    return b.astype(np.int64), kv


def bracket(grid: list, x: float) -> tuple[int, float]:
    """Index i and weight w with x = (1 - w) grid[i] + w grid[i + 1] (x inside the grid)."""
    i = bisect_right(grid, x) - 1
    if i >= len(grid) - 1:
        i = len(grid) - 2
    g0 = grid[i]
    return i, (x - g0) / (grid[i + 1] - g0)


# Host time per dispatched torch call of the eager engine: the median over the six eager
# (not graph) decode steps in calibrate/data/steps-h100/eager-decode, each solved for the
# constant that makes `launch_queue_s` reproduce its measured time (host-bound steps:
# 21.5-27.9 ms for 1,259 calls). Re-derive with `derive_host_dispatch_s()`; the prefill rows
# it is validated on are not used. The spread (16.7-21.8 us) is drift of the VM's host
# speed within one session; the median is robust to it. It is a property of the host CPU
# and the PyTorch version, not of the GPU: on a later H100 lease whose host was faster,
# eager decode and eager prefill 1x512 timed alternately took the same host time per step
# (15.0 ms each, ~11.9 us per call).
EAGER_HOST_DISPATCH_S = 20.93e-6

def launch_queue_s(
    host_s: float,
    head: np.ndarray,
    layer: np.ndarray,
    layers: int,
    tail: np.ndarray,
) -> float:
    """GPU finish time of a stream of kernels that the host dispatches one per ``host_s``.

    Kernel k (1-based) can start when the host has dispatched it (``k * host_s``) and the
    previous kernel has finished: ``end_k = max(k c, end_{k-1}) + g_k``, whose closed form is
    ``end_N = max_k (k c + sum_{i >= k} g_i)`` (the max-plus form of a single-server queue
    with deterministic arrivals, e.g. Baccelli et al. 1992, ch. 1). With ``layers``
    identical copies of ``layer`` between ``head`` and ``tail``, the maximum over the layers
    is at the first (GPU-bound: ``G_layer >= m c``) or the last (host-bound) copy, so the
    cost is O(ops per layer). Neither ``max(host, gpu)`` nor their sum: host-bound stretches
    (many small kernels) and GPU-bound ones (big GEMMs) within a layer do not cancel.
    """
    c = host_s

    def best(g: np.ndarray) -> float:  # max_q (q c + sum_{i >= q} g_i), q = 1..len(g)
        if len(g) == 0:
            return -math.inf
        suf = np.cumsum(g[::-1])[::-1]
        return float(np.max(np.arange(1, len(g) + 1) * c + suf))

    a, m = len(head), len(layer)
    g_layer, g_tail = float(layer.sum()), float(tail.sum())
    terms = [best(head) + layers * g_layer + g_tail]
    if layers > 0:
        terms.append(a * c + best(layer) + (layers - 1) * max(m * c, g_layer) + g_tail)
    terms.append((a + layers * m) * c + best(tail))
    return max(terms)




def monotone(a: np.ndarray, *axes: int) -> np.ndarray:
    for ax in axes:
        a = np.maximum.accumulate(a, axis=ax)
    return a


def bilinear(
    xa: np.ndarray, ya: np.ndarray, grid: np.ndarray, x: np.ndarray, y: np.ndarray
) -> np.ndarray:
    i = np.clip(np.searchsorted(xa, x, side="right") - 1, 0, len(xa) - 2)
    j = np.clip(np.searchsorted(ya, y, side="right") - 1, 0, len(ya) - 2)
    wi = (x - xa[i]) / (xa[i + 1] - xa[i])
    wj = (y - ya[j]) / (ya[j + 1] - ya[j])
    return (1 - wi) * ((1 - wj) * grid[i, j] + wj * grid[i, j + 1]) + wi * (
        (1 - wj) * grid[i + 1, j] + wj * grid[i + 1, j + 1]
    )


def launch_costs(params: Any, backend: str) -> dict[str, float]:
    """The fitted per-call launch costs the cost model's times carry (0 if unknown)."""
    if params is None:
        return {"gemm": 0.0, "ew": 0.0, "coll": 0.0, "fwd": 0.0, "decode": 0.0, "block_m": 128}
    be = params.attention.backends.get(backend)
    if be is None:
        raise StepError(
            f"no attention parameters for backend {backend!r}; "
            f"allowed: {', '.join(params.attention.backends)}"
        )
    return {
        "gemm": params.gemm.launch_s,
        "ew": params.elementwise.launch_s,
        "coll": 0.0,  # collectives keep their latency (NCCL's base latency in a graph too)
        "fwd": be.launch_s,
        "decode": params.attention.decode_launch_s,
        "block_m": float(be.block_m),
    }


def strided_scale(params: Any) -> float:
    """Bytes multiplier for eager kernels on the non-vectorised (broadcast, strided,
    mixed-dtype) path: copy efficiency / the achieved HBM fraction of the calibrated eager
    ``rope`` microbenchmark, whose 5 kernels (mul, neg of a half, cat, mul, add) move 10
    input-sized tensor passes for the 2 its ``rope`` op counts (calibrate/bench/
    elementwise.py)."""
    if params is None:
        return 1.0
    eff = params.elementwise.memory_efficiency
    copy = eff.get("copy", eff.get("default", 0.75))
    rope = eff.get("rope", eff.get("default", 0.75)) * 10.0 / 2.0
    return max(1.0, copy / min(rope, copy))
