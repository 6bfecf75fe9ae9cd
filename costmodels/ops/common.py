"""Small vectorised helpers shared by the analytical models."""

from __future__ import annotations

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


def by_dtype(dtypes: np.ndarray, table: dict[str, float], what: str) -> np.ndarray:
    """Map a string array of dtypes through ``table``; unknown ones raise one clear line."""
    codes, uniq = factorize(dtypes)  # hashing over distinct values, not per-value masks
    missing = [str(d) for d in uniq if d not in table]
    if missing:
        allowed = ", ".join(sorted(str(k) for k in table))
        raise ValueError(f"{what} has no entry for dtype {missing[0]!r}; supported: {allowed}")
    return np.array([float(table[d]) for d in uniq] + [np.nan])[codes]


def peak_flops(dtypes: np.ndarray, gpu: GpuSpec) -> np.ndarray:
    table = {d.value: gpu.peak_flops_per_s(d) for d in gpu.peak_dense_tflops}
    return by_dtype(dtypes, table, f"GPU {gpu.id}")


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
