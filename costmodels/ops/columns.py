"""An ops frame or one :class:`~workloads.ops.Op` as plain numpy columns: what every
vectorised cost model reads (strings as str arrays, sizes as float64 with NaN when empty).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from costmodels.ops.common import factorize
from workloads.ops import (
    CSV_COLUMNS,
    EXTRA_COLUMNS,
    SPARSITY_COLUMN,
    Op,
    OpKind,
    canonical_sparsity,
)

if TYPE_CHECKING:
    import pandas as pd

_STR_COLUMNS = ("op", "dtype", "backend")
Columns = dict[str, np.ndarray]


def frame_columns(frame: pd.DataFrame) -> Columns:
    """A normalised ops frame as plain numpy arrays (strings as str arrays)."""
    cols: Columns = {}
    for c in (*CSV_COLUMNS, *EXTRA_COLUMNS):
        if c in _STR_COLUMNS:
            cols[c] = _text(frame[c])
        elif c == "causal":
            cols[c] = frame[c].to_numpy(dtype=bool)
        else:
            cols[c] = frame[c].to_numpy(dtype=float, na_value=np.nan)
    if SPARSITY_COLUMN in frame.columns:  # optional: only frames that name it carry it
        cols[SPARSITY_COLUMN] = _text(frame[SPARSITY_COLUMN])
    return cols


def _text(series: pd.Series) -> np.ndarray:
    """A text column as a str array ("" where missing), via its few distinct values."""
    codes, uniq = factorize(series.to_numpy())
    return np.append(np.asarray(uniq, dtype=str), "")[codes]  # code -1 (missing) -> ""


def op_columns(op: Op) -> Columns:
    row = op.row()
    cols: Columns = {}
    for c in (*CSV_COLUMNS, *EXTRA_COLUMNS):
        v = row[c]
        if c in _STR_COLUMNS:
            cols[c] = np.array([v or ""], dtype=str)
        elif c == "causal":
            cols[c] = np.array([bool(v)])
        else:
            cols[c] = np.array([np.nan if v is None else float(v)])
    if op.sparsity:
        cols[SPARSITY_COLUMN] = np.array([canonical_sparsity(op.sparsity)], dtype=str)
    return cols


def sparse_gemm_rows(cols: Columns) -> np.ndarray:
    """Rows that are gemms with a (non-dense) ``sparsity``: the sparse-GEMM model prices
    them, and no learned dense-GEMM correction applies to them."""
    sp = cols.get(SPARSITY_COLUMN)
    if sp is None:
        return np.zeros(len(cols["op"]), dtype=bool)
    return (sp != "") & (cols["op"] == OpKind.gemm.value)
