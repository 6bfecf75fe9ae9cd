"""Op types: the unit of work every cost model prices.

One flat schema mirrors the ``simcli predict`` CSV contract (DESIGN.md), so an op, a
CSV row and a row of an ops frame are the same thing. ``REQUIRED`` says which fields
each op kind needs; the scalar :class:`Op` validator and the vectorised
:func:`validate_frame` both read it, so they cannot disagree.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware_specs.schema import Dtype


class OpKind(StrEnum):
    gemm = "gemm"  # C[m,n] = A[m,k] . B[k,n], `batch` independent products
    attn_fwd = "attn_fwd"
    attn_bwd = "attn_bwd"
    attn_fwdbwd = "attn_fwdbwd"
    attn_decode = "attn_decode"  # seq_q new tokens (usually 1) over a KV cache of seq_kv
    attn_blocksparse_fwd = "attn_blocksparse_fwd"
    attn_blocksparse_bwd = "attn_blocksparse_bwd"
    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    all_to_all = "all_to_all"
    send_recv = "send_recv"
    copy = "copy"  # `bytes` read (and as many written)
    rmsnorm = "rmsnorm"  # m tokens x n hidden
    layernorm = "layernorm"
    swiglu = "swiglu"  # m tokens x n intermediate (reads gate and up, writes n)
    gelu = "gelu"
    rope = "rope"  # m tokens x n = heads * head_dim rotated
    softmax = "softmax"  # m rows x n columns
    cross_entropy = "cross_entropy"  # m tokens x n vocab logits
    embedding = "embedding"  # m tokens gathered from a table of width n
    residual_add = "residual_add"  # m x n, reads two, writes one
    adamw = "adamw"  # optimizer step over n parameters (dtype = parameter dtype)


ATTENTION_KINDS = {
    OpKind.attn_fwd,
    OpKind.attn_bwd,
    OpKind.attn_fwdbwd,
    OpKind.attn_decode,
    OpKind.attn_blocksparse_fwd,
    OpKind.attn_blocksparse_bwd,
}
COLLECTIVE_KINDS = {
    OpKind.all_reduce,
    OpKind.all_gather,
    OpKind.reduce_scatter,
    OpKind.all_to_all,
    OpKind.send_recv,
}
ELEMENTWISE_KINDS = {
    OpKind.copy,
    OpKind.rmsnorm,
    OpKind.layernorm,
    OpKind.swiglu,
    OpKind.gelu,
    OpKind.rope,
    OpKind.softmax,
    OpKind.cross_entropy,
    OpKind.embedding,
    OpKind.residual_add,
    OpKind.adamw,
}

_ATTN = ("batch", "seq_q", "seq_kv", "heads_q", "heads_kv", "head_dim")
_MN = ("m", "n")
REQUIRED: dict[OpKind, tuple[str, ...]] = {
    OpKind.gemm: ("m", "n", "k"),
    OpKind.attn_fwd: _ATTN,
    OpKind.attn_bwd: _ATTN,
    OpKind.attn_fwdbwd: _ATTN,
    OpKind.attn_decode: ("batch", "seq_kv", "heads_q", "heads_kv", "head_dim"),
    OpKind.attn_blocksparse_fwd: (*_ATTN, "density", "block_size"),
    OpKind.attn_blocksparse_bwd: (*_ATTN, "density", "block_size"),
    OpKind.all_reduce: ("bytes", "ranks"),
    OpKind.all_gather: ("bytes", "ranks"),
    OpKind.reduce_scatter: ("bytes", "ranks"),
    OpKind.all_to_all: ("bytes", "ranks"),
    OpKind.send_recv: ("bytes",),
    OpKind.copy: ("bytes",),
    OpKind.rmsnorm: _MN,
    OpKind.layernorm: _MN,
    OpKind.swiglu: _MN,
    OpKind.gelu: _MN,
    OpKind.rope: _MN,
    OpKind.softmax: _MN,
    OpKind.cross_entropy: _MN,
    OpKind.embedding: _MN,
    OpKind.residual_add: _MN,
    OpKind.adamw: ("n",),
}

# Kernel families per op kind; the first is the default when `backend` is empty.
BACKENDS: dict[OpKind, tuple[str, ...]] = {
    OpKind.attn_fwd: ("flash", "cudnn", "flex", "efficient"),
    OpKind.attn_bwd: ("flash", "cudnn", "flex", "efficient"),
    OpKind.attn_fwdbwd: ("flash", "cudnn", "flex", "efficient"),
    OpKind.attn_decode: ("flash", "flex", "efficient"),
    OpKind.attn_blocksparse_fwd: ("flex", "flash"),
    OpKind.attn_blocksparse_bwd: ("flex", "flash"),
}
for _kind in OpKind:
    BACKENDS.setdefault(_kind, ("default",))

# Contract columns in contract order, then optional extensions.
CSV_COLUMNS: tuple[str, ...] = (
    "op",
    "dtype",
    "m",
    "n",
    "k",
    "batch",
    "seq_q",
    "seq_kv",
    "heads_q",
    "heads_kv",
    "head_dim",
    "causal",
    "backend",
    "density",
    "block_size",
    "bytes",
    "ranks",
)
# `nodes`: how many nodes the `ranks` of a collective span (default 1, i.e. one node).
EXTRA_COLUMNS: tuple[str, ...] = ("nodes",)
INT_COLUMNS = (
    "m",
    "n",
    "k",
    "batch",
    "seq_q",
    "seq_kv",
    "heads_q",
    "heads_kv",
    "head_dim",
    "block_size",
    "bytes",
    "ranks",
    "nodes",
)
DEFAULT_DTYPE = Dtype.bf16


class OpError(ValueError):
    """An op or ops table that breaks the contract; one line for users."""


class Op(BaseModel):
    """One op; fields not used by its kind stay ``None``."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    op: OpKind
    dtype: Dtype = DEFAULT_DTYPE
    m: int | None = Field(default=None, gt=0)
    n: int | None = Field(default=None, gt=0)
    k: int | None = Field(default=None, gt=0)
    batch: int | None = Field(default=None, gt=0)
    seq_q: int | None = Field(default=None, gt=0)
    seq_kv: int | None = Field(default=None, gt=0)
    heads_q: int | None = Field(default=None, gt=0)
    heads_kv: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    causal: bool = False
    backend: str | None = None
    density: float | None = Field(default=None, gt=0, le=1)
    block_size: int | None = Field(default=None, gt=0)
    bytes: int | None = Field(default=None, gt=0)
    ranks: int | None = Field(default=None, gt=0)
    nodes: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_kind(self) -> Op:
        check_fields(self.op, self.model_dump())
        return self

    def row(self) -> dict[str, Any]:
        """This op as an ops-frame row (enums as their string values)."""
        d = self.model_dump()
        d["op"] = self.op.value
        d["dtype"] = self.dtype.value
        return d


def check_fields(kind: OpKind, values: dict[str, Any]) -> None:
    """Per-kind rules shared by the scalar and vectorised paths."""
    missing = [f for f in REQUIRED[kind] if values.get(f) is None]
    if missing:
        raise OpError(f"op {kind.value!r} needs {', '.join(missing)}")
    backend = values.get("backend")
    if backend and backend not in BACKENDS[kind]:
        raise OpError(
            f"op {kind.value!r} has no backend {backend!r}; allowed: {', '.join(BACKENDS[kind])}"
        )
    hq, hkv = values.get("heads_q"), values.get("heads_kv")
    if kind in ATTENTION_KINDS and hq is not None and hkv is not None and hq % hkv:
        raise OpError(f"heads_q ({hq}) must be a multiple of heads_kv ({hkv})")
    if kind in COLLECTIVE_KINDS:
        ranks, nodes = values.get("ranks") or 2, values.get("nodes") or 1
        if ranks % nodes:
            raise OpError(f"ranks ({ranks}) must be a multiple of nodes ({nodes})")


def ops_frame(ops: list[Op] | tuple[Op, ...]) -> pd.DataFrame:
    """Build a validated ops frame from :class:`Op` objects."""
    return normalise_frame(
        pd.DataFrame([o.row() for o in ops], columns=[*CSV_COLUMNS, *EXTRA_COLUMNS])
    )


def normalise_frame(frame: pd.DataFrame, *, row_offset: int = 0) -> pd.DataFrame:
    """Validate an ops table (e.g. a CSV) and return it with canonical dtypes.

    Vectorised over rows; the first problem found raises :class:`OpError` naming the
    row (1-based, header excluded, plus ``row_offset``), the column, the value and what
    is allowed. Sizes become float64 (NaN when empty; exact up to 2**53), ``causal`` a
    bool, ``op``/``dtype``/``backend`` lower-case strings.
    """
    known = set(CSV_COLUMNS) | set(EXTRA_COLUMNS)
    unknown = [c for c in frame.columns if c not in known]
    if unknown:
        raise OpError(
            f"unknown column(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(CSV_COLUMNS)}"
            f" (optional: {', '.join(EXTRA_COLUMNS)})"
        )
    if "op" not in frame.columns:
        raise OpError("missing column 'op'")
    out = pd.DataFrame(index=pd.RangeIndex(len(frame)))
    n_rows = len(frame)

    def where(mask: np.ndarray) -> int:
        return int(np.flatnonzero(mask)[0]) + 1 + row_offset

    def raw_at(series: pd.Series, row: int) -> object:
        return series.iloc[row - 1 - row_offset]

    # op
    op_raw = frame["op"].astype("string").str.strip().str.lower()
    valid_ops = {k.value for k in OpKind}
    bad = ~op_raw.isin(valid_ops).to_numpy(dtype=bool)
    if bad.any():
        i = where(bad)
        raise OpError(
            f"row {i}: unknown op {raw_at(frame['op'], i)!r}; "
            f"allowed: {', '.join(sorted(valid_ops))}"
        )
    out["op"] = op_raw.astype(object).to_numpy()

    # dtype
    if "dtype" in frame.columns:
        dt = frame["dtype"].astype("string").str.strip().str.lower().fillna("")
        dt = dt.mask(dt == "", DEFAULT_DTYPE.value)
    else:
        dt = pd.Series([DEFAULT_DTYPE.value] * n_rows, dtype="string")
    valid_dt = {d.value for d in Dtype}
    bad = ~dt.isin(valid_dt).to_numpy(dtype=bool)
    if bad.any():
        i = where(bad)
        raise OpError(
            f"row {i}: unknown dtype {raw_at(dt, i)!r}; allowed: {', '.join(sorted(valid_dt))}"
        )
    out["dtype"] = dt.astype(object).to_numpy()

    # integer columns
    for col in INT_COLUMNS:
        if col not in frame.columns:
            out[col] = np.full(n_rows, np.nan)
            continue
        raw = frame[col]
        as_str = raw.astype("string").str.strip()
        empty = as_str.isna() | (as_str == "")
        num = pd.to_numeric(as_str.mask(empty), errors="coerce")
        not_number = (~empty & num.isna()).to_numpy(dtype=bool)
        with np.errstate(invalid="ignore"):
            not_int = (~empty & num.notna() & (num != np.floor(num))).to_numpy(dtype=bool)
            non_pos = (~empty & num.notna() & (num <= 0)).to_numpy(dtype=bool)
        for mask, what in (
            (not_number, "an integer"),
            (not_int, "an integer"),
            (non_pos, "positive"),
        ):
            if mask.any():
                i = where(mask)
                raise OpError(f"row {i}: column {col!r} must be {what} > 0, got {raw_at(raw, i)!r}")
        too_big = (num > 2**62).to_numpy(dtype=bool, na_value=False)
        if too_big.any():
            i = where(too_big)
            raise OpError(f"row {i}: column {col!r} value {raw_at(raw, i)!r} is too large")
        out[col] = num.to_numpy(dtype="float64", na_value=np.nan)

    # causal
    if "causal" in frame.columns:
        c = frame["causal"].astype("string").str.strip().str.lower().fillna("")
        truthy, falsy = {"1", "true", "yes", "y", "t"}, {"", "0", "false", "no", "n", "f"}
        bad = ~c.isin(truthy | falsy).to_numpy(dtype=bool)
        if bad.any():
            i = where(bad)
            raise OpError(
                f"row {i}: column 'causal' must be true/false/1/0, "
                f"got {raw_at(frame['causal'], i)!r}"
            )
        out["causal"] = c.isin(truthy).to_numpy(dtype=bool)
    else:
        out["causal"] = np.zeros(n_rows, dtype=bool)

    # backend
    if "backend" in frame.columns:
        b = frame["backend"].astype("string").str.strip().str.lower().fillna("")
        out["backend"] = b.astype(object).to_numpy()
    else:
        out["backend"] = np.array([""] * n_rows, dtype=object)

    # density
    if "density" in frame.columns:
        raw = frame["density"]
        s = raw.astype("string").str.strip()
        empty = s.isna() | (s == "")
        dens = pd.to_numeric(s.mask(empty), errors="coerce")
        bad = (~empty & (dens.isna() | (dens <= 0) | (dens > 1))).to_numpy(
            dtype=bool, na_value=True
        )
        if bad.any():
            i = where(bad)
            raise OpError(f"row {i}: column 'density' must be in (0, 1], got {raw_at(raw, i)!r}")
        out["density"] = dens.astype("float64").to_numpy(na_value=np.nan)
    else:
        out["density"] = np.full(n_rows, np.nan)

    out = out[[*CSV_COLUMNS, *EXTRA_COLUMNS]]
    _check_kinds(out, row_offset)
    return out


def _check_kinds(out: pd.DataFrame, row_offset: int) -> None:
    ops = out["op"].to_numpy()
    for kind in OpKind:
        mask = ops == kind.value
        if not mask.any():
            continue
        sub = out.loc[mask]
        rows = np.flatnonzero(mask)
        for col in REQUIRED[kind]:
            missing = sub[col].isna().to_numpy()
            if missing.any():
                i = rows[np.flatnonzero(missing)[0]] + 1 + row_offset
                raise OpError(f"row {i}: op {kind.value!r} needs column {col!r}")
        backends = sub["backend"].to_numpy()
        bad = (backends != "") & ~np.isin(backends, BACKENDS[kind])
        if bad.any():
            j = np.flatnonzero(bad)[0]
            raise OpError(
                f"row {rows[j] + 1 + row_offset}: op {kind.value!r} has no backend "
                f"{backends[j]!r}; allowed: {', '.join(BACKENDS[kind])}"
            )
        if kind in ATTENTION_KINDS:
            hq = sub["heads_q"].to_numpy(dtype="int64")
            hkv = sub["heads_kv"].to_numpy(dtype="int64")  # required, so never NaN here
            bad = hq % hkv != 0
            if bad.any():
                j = np.flatnonzero(bad)[0]
                raise OpError(
                    f"row {rows[j] + 1 + row_offset}: heads_q ({hq[j]}) must be a multiple of "
                    f"heads_kv ({hkv[j]})"
                )
        if kind in COLLECTIVE_KINDS:
            ranks = sub["ranks"].fillna(2).to_numpy(dtype="int64")
            nodes = sub["nodes"].fillna(1).to_numpy(dtype="int64")
            bad = ranks % nodes != 0
            if bad.any():
                j = np.flatnonzero(bad)[0]
                raise OpError(
                    f"row {rows[j] + 1 + row_offset}: ranks ({ranks[j]}) must be a multiple of "
                    f"nodes ({nodes[j]})"
                )
