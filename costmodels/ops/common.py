"""Small vectorised helpers shared by the analytical models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hardware_specs.schema import DTYPE_BYTES, Dtype, GpuSpec

ELEMENT_BYTES: dict[str, float] = {d.value: float(b) for d, b in DTYPE_BYTES.items()}
# GEMM output bytes: fp8 scaled matmuls write bf16, int8 accumulates into int32.
GEMM_OUT_BYTES: dict[str, float] = {**ELEMENT_BYTES, Dtype.fp8: 2, Dtype.int8: 4}


class NotFittedError(RuntimeError):
    """Predicting with a fittable model (learned corrections, energy) before ``fit``."""


@dataclass(frozen=True)
class Work:
    """Per-row results of an analytical model: time and the algorithmic work behind it."""

    time_s: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray


# rows a cost model prices at once (larger inputs go chunk by chunk, see in_chunks)
CHUNK_ROWS = 1 << 16


def in_chunks(work_columns: Callable[[dict[str, np.ndarray]], Work], cols: dict) -> Work:
    """``work_columns(cols)`` computed :data:`CHUNK_ROWS` rows at a time and joined: the
    same values for models that price every row on its own, with each chunk's arrays in
    the CPU caches and memory bounded by the chunk, not the input."""
    rows = len(next(iter(cols.values())))
    parts = [
        work_columns({k: v[i : i + CHUNK_ROWS] for k, v in cols.items()})
        for i in range(0, rows, CHUNK_ROWS)
    ]
    return Work(
        time_s=np.concatenate([p.time_s for p in parts]),
        flops=np.concatenate([p.flops for p in parts]),
        bytes=np.concatenate([p.bytes for p in parts]),
    )


# below this many values a dict beats pandas' hash table (and spares importing pandas)
_SMALL = 256


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pandas.factorize(values)``: (codes, distinct values in order of appearance), code
    -1 for a missing value (None or NaN). Small arrays (the ops of one step or one
    command) are hashed in a dict, large ones by pandas, imported only then."""
    if len(values) > _SMALL:
        import pandas as pd

        return pd.factorize(values)
    seen: dict = {}
    codes = np.empty(len(values), dtype=np.intp)
    for i, v in enumerate(values.tolist() if isinstance(values, np.ndarray) else values):
        codes[i] = -1 if v is None or v != v else seen.setdefault(v, len(seen))
    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":  # as pandas: same dtype
        return codes, np.array(list(seen), dtype=values.dtype)
    uniq = np.empty(len(seen), dtype=object)
    uniq[:] = list(seen)
    return codes, uniq


def distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values) with ``values == uniq[codes]``, in no particular order
    (:func:`factorize` keeps the order of appearance). Short ASCII text, the op, dtype and
    backend columns of a large ops frame, is packed into one integer per value and sorted
    (~10x faster than hashing the strings); anything else goes to :func:`factorize`."""
    if (
        isinstance(values, np.ndarray)
        and values.dtype.kind == "U"
        and 0 < values.dtype.itemsize <= 32
        and len(values) > _SMALL
    ):
        width = values.dtype.itemsize // 4
        chars = np.ascontiguousarray(values).view(np.uint32).reshape(len(values), width)
        if int(chars.max(initial=0)) < 256:
            key = np.zeros(len(values), dtype=np.uint64)
            for i in range(width):
                key |= chars[:, i].astype(np.uint64) << np.uint64(8 * i)
            found = _peel(key)
            if found is not None:
                codes, first = found
                return codes, values[first]
            _, first, codes = np.unique(key, return_index=True, return_inverse=True)
            return codes.reshape(-1), values[first]
    return factorize(values)


def _peel(key: np.ndarray, most: int = 16) -> tuple[np.ndarray, np.ndarray] | None:
    """(codes, index of each distinct value's first row) of an integer array with at most
    ``most`` distinct values, found one value at a time (a few vector passes each: faster
    than sorting when they are few); None when there are more."""
    codes = np.empty(len(key), dtype=np.intp)
    todo = np.ones(len(key), dtype=bool)
    first: list[int] = []
    start = 0
    for code in range(most):
        j = start + int(np.argmax(todo[start:])) if start < len(key) else 0
        if start >= len(key) or not todo[j]:
            return codes, np.array(first, dtype=np.intp)
        hit = key == key[j]
        codes[hit] = code
        todo &= ~hit
        first.append(j)
        start = j + 1
    return (codes, np.array(first, dtype=np.intp)) if not todo.any() else None


def by_dtype(dtypes: np.ndarray, table: dict[str, float], what: str) -> np.ndarray:
    """Map a string array of dtypes through ``table``; unknown ones raise one clear line."""
    codes, uniq = distinct(dtypes)  # over distinct values, not per-value masks
    if any(d not in table for d in uniq.tolist()):
        codes, uniq = factorize(dtypes)  # the first unknown in row order, for the message
    missing = [str(d) for d in uniq if d not in table]
    if missing:
        allowed = ", ".join(sorted(str(k) for k in table))
        raise ValueError(f"{what} has no entry for dtype {missing[0]!r}; supported: {allowed}")
    return np.array([float(table[d]) for d in uniq] + [np.nan])[codes]


def by_dtypes(dtypes: np.ndarray, *tables: tuple[dict[str, float], str]) -> list[np.ndarray]:
    """``[by_dtype(dtypes, table, what) for table, what in tables]``, finding the distinct
    dtypes once (the same values, and the same error for the first table that lacks one)."""
    codes, uniq = distinct(dtypes)
    keys = uniq.tolist()
    if any(d not in table for table, _ in tables for d in keys):
        return [by_dtype(dtypes, table, what) for table, what in tables]
    return [np.array([float(table[d]) for d in keys] + [np.nan])[codes] for table, _ in tables]


def peak_flops_table(gpu: GpuSpec) -> dict[str, float]:
    """Dense peak FLOP/s of ``gpu`` by dtype name."""
    return {d.value: gpu.peak_flops_per_s(d) for d in gpu.peak_dense_tflops}


def peak_flops(dtypes: np.ndarray, gpu: GpuSpec) -> np.ndarray:
    return by_dtype(dtypes, peak_flops_table(gpu), f"GPU {gpu.id}")


def cdiv(a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    """Ceiling division on float arrays of non-negative integers."""
    return np.ceil(a / b)


def floor_sum(n: np.ndarray, m: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_{i=0}^{n-1} floor((a*i + b) / m), vectorised, for n >= 0, m >= 1 and a, b >= 0.

    The Euclid-like reduction of the classic floor-sum identity; used for exact causal
    tile counts without looping over query blocks. Integer-valued float64 arrays in,
    exact while the intermediate products stay below 2**53.
    """
    n, m, a, b = (np.asarray(x, dtype=np.float64).copy() for x in (n, m, a, b))
    n = np.maximum(n, 0)
    total = np.zeros_like(n)
    active = n > 0
    while active.any():
        # a >= m: pull out the whole part of the slope.
        q = np.floor(a / m)
        total += np.where(active, n * (n - 1) / 2 * q, 0)
        a = a - q * m
        # b >= m: pull out the whole part of the offset.
        q = np.floor(b / m)
        total += np.where(active, n * q, 0)
        b = b - q * m
        y_max = a * n + b
        active &= y_max >= m
        # Swap roles: count lattice points under the line with axes exchanged.
        n_new = np.floor(y_max / m)
        b_new = np.mod(y_max, m)
        n, m, a, b = (
            np.where(active, n_new, 0),
            np.where(active, a, 1),
            np.where(active, m, 0),
            np.where(active, b_new, 0),
        )
    return total
