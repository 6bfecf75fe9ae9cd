"""Op types: the unit of work every cost model prices.

One flat schema mirrors the ``simcli predict`` CSV contract (DESIGN.md), so an op, a
CSV row and a row of an ops frame are the same thing. ``REQUIRED`` says which fields
each op kind needs; the scalar :class:`Op` validator and the vectorised
:func:`validate_frame` both read it, so they cannot disagree.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware_specs.schema import Dtype

if TYPE_CHECKING:  # pandas loads where a frame is built: `simcli predict gemm` needs none
    import pandas as pd


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
# ``flashinfer``: the serving engines' kernels (FlashInfer's paged decode and its FA3
# prefill on Hopper), forward only (calibrate/data/engine-kernels-*).
BACKENDS: dict[OpKind, tuple[str, ...]] = {
    OpKind.attn_fwd: ("flash", "cudnn", "flex", "efficient", "flashinfer"),
    OpKind.attn_bwd: ("flash", "cudnn", "flex", "efficient"),
    OpKind.attn_fwdbwd: ("flash", "cudnn", "flex", "efficient"),
    OpKind.attn_decode: ("flash", "cudnn", "flex", "efficient", "flashinfer"),
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
# `sparsity`: a gemm's weight (or MLP activation) sparsity, see :func:`parse_gemm_sparsity`.
# Optional in a stricter sense than EXTRA_COLUMNS: a validated frame has the column only
# when its input had it, so every frame, CSV and output without it is as before.
SPARSITY_COLUMN = "sparsity"
SPARSITY_ALLOWED = (
    "empty or dense, 2:4 (semi-structured, cuSPARSELt), unstructured:S with 0 <= S < 1 "
    "(fraction of zero weights, Flash-LLM), cats:F with 0 < F <= 1 (fraction of MLP neurons "
    "active per token, CATS)"
)


def parse_gemm_sparsity(text: Any) -> tuple[str, float]:
    """A gemm's sparsity: ``""``/``"dense"`` -> ("dense", 1.0); ``"2:4"`` -> ("2:4", 0.5);
    ``"unstructured:0.8"`` -> ("unstructured", 0.8); ``"cats:0.3"`` -> ("cats", 0.3).
    Anything else is one :class:`OpError` line listing the allowed forms."""
    t = "" if text is None else str(text).strip().lower()
    if t in ("dense", ""):
        return "dense", 1.0
    if t == "2:4":
        return "2:4", 0.5
    kind, _, value = t.partition(":")
    try:
        v = float(value)
    except ValueError:
        v = float("nan")
    if kind == "unstructured" and 0.0 <= v < 1.0:
        return kind, v
    if kind == "cats" and 0.0 < v <= 1.0:
        return kind, v
    raise OpError(f"sparsity {text!r} not understood; allowed: {SPARSITY_ALLOWED}")


def canonical_sparsity(text: Any) -> str:
    """The spelling the cost models key on: "" (dense), "2:4", "unstructured:S", "cats:F"."""
    kind, v = parse_gemm_sparsity(text)
    if kind == "dense":
        return ""
    return kind if kind == "2:4" else f"{kind}:{v:g}"


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

# The largest size a user may give (``simcli predict`` flags and ops CSVs; the decomposition
# builds its own ops unchecked): far above any real kernel, yet small enough that every
# product the cost models form stays finite and int64-safe. (bound, why), per column.
MAX_DIM = 2**31 - 1  # cuBLAS and CUDA grids take 32-bit signed sizes
MAX_TOKENS = 2**24  # 16,777,216 tokens per sequence: beyond any model's context window
MAX_HEADS = 4096
MAX_HEAD_DIM = 1024
MAX_BYTES = 2**40  # 1 TiB: more than any GPU's memory
MAX_RANKS = 2**20
MAX_NODES = 2**17
MAX_PARAMS = 2**40  # adamw's n: parameters stepped on one GPU
SIZE_LIMITS: dict[str, tuple[int, str]] = {
    "m": (MAX_DIM, "2^31 - 1, the 32-bit sizes cuBLAS and CUDA kernels take"),
    "n": (MAX_DIM, "2^31 - 1, the 32-bit sizes cuBLAS and CUDA kernels take"),
    "k": (MAX_DIM, "2^31 - 1, the 32-bit sizes cuBLAS and CUDA kernels take"),
    "batch": (MAX_DIM, "2^31 - 1, cuBLAS's 32-bit batch count"),
    "seq_q": (MAX_TOKENS, "2^24 tokens, beyond any model's context window"),
    "seq_kv": (MAX_TOKENS, "2^24 tokens, beyond any model's context window"),
    "heads_q": (MAX_HEADS, "4096 heads"),
    "heads_kv": (MAX_HEADS, "4096 heads"),
    "head_dim": (MAX_HEAD_DIM, "1024 channels per head"),
    "block_size": (MAX_TOKENS, "2^24 tokens"),
    "bytes": (MAX_BYTES, "2^40 bytes = 1 TiB per GPU, more than any GPU's memory"),
    "ranks": (MAX_RANKS, "2^20 GPUs"),
    "nodes": (MAX_NODES, "2^17 nodes"),
}
ADAMW_N_LIMIT = (MAX_PARAMS, "2^40 parameters on one GPU")


def size_limit(column: str, kind: OpKind | str | None = None) -> tuple[int, str]:
    """(largest allowed value, why) of an op size column; ``kind``: adamw's ``n`` counts
    parameters, not a matrix side."""
    if column == "n" and kind in (OpKind.adamw, OpKind.adamw.value):
        return ADAMW_N_LIMIT
    return SIZE_LIMITS[column]


def heads_hint(heads_q: int) -> str:
    """The ``allowed:`` part of a heads_kv that does not divide heads_q."""
    divisors = [d for d in range(1, min(int(heads_q), 4096) + 1) if heads_q % d == 0]
    return f"allowed: a heads_kv dividing heads_q ({', '.join(map(str, divisors))})"


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
    sparsity: str | None = Field(
        default=None, description=f"gemm only: weight/activation sparsity; {SPARSITY_ALLOWED}"
    )

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
        raise OpError(f"heads_q ({hq}) must be a multiple of heads_kv ({hkv}); {heads_hint(hq)}")
    if kind in COLLECTIVE_KINDS:
        ranks, nodes = values.get("ranks") or 2, values.get("nodes") or 1
        if ranks % nodes:
            raise OpError(f"ranks ({ranks}) must be a multiple of nodes ({nodes})")
    sparsity = values.get(SPARSITY_COLUMN)
    if sparsity and canonical_sparsity(sparsity) and kind != OpKind.gemm:
        raise OpError(f"op {kind.value!r} takes no sparsity ({sparsity!r}); allowed: gemm rows")


def ops_frame(ops: list[Op] | tuple[Op, ...]) -> pd.DataFrame:
    """Build a validated ops frame from :class:`Op` objects."""
    import pandas as pd

    sparse = any(o.sparsity for o in ops)
    columns = [*CSV_COLUMNS, *EXTRA_COLUMNS, *([SPARSITY_COLUMN] if sparse else [])]
    return normalise_frame(pd.DataFrame([o.row() for o in ops], columns=columns))


def _text_codes(series: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, cleaned): a text column stripped and lower-cased on its distinct values
    only (fast); the column is ``cleaned[codes]``, code -1 (missing) picking the trailing
    "" of ``cleaned``, so checks can run on the distinct values too."""
    import pandas as pd

    if isinstance(series.dtype, pd.CategoricalDtype):  # already coded (a fast CSV read)
        codes, uniques = series.cat.codes.to_numpy(), series.cat.categories
    else:  # pandas' string columns factorize as they are, others as objects
        text = isinstance(series.dtype, pd.StringDtype)
        values = series if text else series.astype(object)
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
    cleaned = np.array([str(u).strip().lower() for u in uniques] + [""], dtype=object)
    return codes, cleaned


def _clean_text(series: pd.Series) -> np.ndarray:
    """Strip and lower-case a text column; done on its distinct values only (fast)."""
    codes, cleaned = _text_codes(series)
    return cleaned[codes]


def _parse_digits(series: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`_parse_numbers` of an Arrow-backed string column whose cells are all empty
    or plain ASCII digits (at most 15: exact in float64 whichever way they are parsed),
    computed by Arrow; None for any other column (pandas parses those)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.chunked_array(pa.array(series.array))
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        return None
    length = pc.binary_length(arr)
    empty = pc.fill_null(pc.equal(length, 0), True)
    digits = pc.and_(pc.ascii_is_decimal(arr), pc.less_equal(length, 15))
    if not pc.all(pc.or_(empty, pc.fill_null(digits, False))).as_py():
        return None
    values = pc.cast(pc.if_else(empty, pa.scalar(None, arr.type), arr), pa.float64())
    empty_np = empty.to_numpy()
    return values.to_numpy(), empty_np, np.zeros(len(empty_np), dtype=bool)


def _parse_numbers(series: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, empty, unparsable) for a column of numbers, numeric or text."""
    import pandas as pd

    if isinstance(series.dtype, pd.StringDtype) and series.dtype.storage == "pyarrow":
        fast = _parse_digits(series)
        if fast is not None:
            return fast
    if pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series.dtype):
        values = series.to_numpy(dtype="float64", na_value=np.nan)
        empty = np.isnan(values)
        return values, empty, np.zeros(len(values), dtype=bool)
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    missing = np.isnan(values)
    empty = missing.copy()
    if missing.any():
        # only cells that failed to parse need a closer look: blank, or junk
        idx = np.flatnonzero(missing)
        text = series.iloc[idx].astype(object)
        blank = text.isna().to_numpy() | (text.astype(str).str.strip() == "").to_numpy()
        empty[idx] = blank
    return values, empty, missing & ~empty


def normalise_frame(frame: pd.DataFrame, *, row_offset: int = 0) -> pd.DataFrame:
    """Validate an ops table (e.g. a CSV) and return it with canonical dtypes.

    Vectorised over rows; the first problem found raises :class:`OpError` naming the
    row (1-based, header excluded, plus ``row_offset``), the column, the value and what
    is allowed. Sizes become float64 (NaN when empty; exact up to 2**53), ``causal`` a
    bool, ``op``/``dtype``/``backend`` lower-case strings.
    """
    known = set(CSV_COLUMNS) | set(EXTRA_COLUMNS) | {SPARSITY_COLUMN}
    unknown = [c for c in frame.columns if c not in known]
    if unknown:
        raise OpError(
            f"unknown column(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(CSV_COLUMNS)}"
            f" (optional: {', '.join((*EXTRA_COLUMNS, SPARSITY_COLUMN))})"
        )
    if "op" not in frame.columns:
        raise OpError("missing column 'op'")
    n_rows = len(frame)
    out: dict[str, np.ndarray] = {}

    def first_bad(mask: np.ndarray, column: str, message: str) -> None:
        if mask.any():
            j = int(np.flatnonzero(mask)[0])
            value = frame[column].iloc[j]
            raise OpError(message.format(row=j + 1 + row_offset, value=repr(value)))

    valid_ops = sorted(k.value for k in OpKind)
    codes, cleaned = _text_codes(frame["op"])
    out["op"] = cleaned[codes]
    first_bad(
        ~np.isin(cleaned, valid_ops)[codes],
        "op",
        "row {row}: unknown op {value}; allowed: " + ", ".join(valid_ops),
    )

    valid_dt = sorted(d.value for d in Dtype)
    if "dtype" in frame.columns:
        codes, dt = _text_codes(frame["dtype"])
        dt[dt == ""] = DEFAULT_DTYPE.value
        first_bad(
            ~np.isin(dt, valid_dt)[codes],
            "dtype",
            "row {row}: unknown dtype {value}; allowed: " + ", ".join(valid_dt),
        )
        out["dtype"] = dt[codes]
    else:
        out["dtype"] = np.full(n_rows, DEFAULT_DTYPE.value, dtype=object)

    for col in INT_COLUMNS:
        if col not in frame.columns:
            out[col] = np.full(n_rows, np.nan)
            continue
        values, empty, junk = _parse_numbers(frame[col])
        first_bad(junk, col, f"row {{row}}: column {col!r} must be an integer > 0, got {{value}}")
        with np.errstate(invalid="ignore"):
            first_bad(
                ~empty & (values != np.floor(values)),
                col,
                f"row {{row}}: column {col!r} must be an integer > 0, got {{value}}",
            )
            first_bad(
                ~empty & (values <= 0),
                col,
                f"row {{row}}: column {col!r} must be positive > 0, got {{value}}",
            )
            first_bad(
                ~empty & (values > 2**53),
                col,
                f"row {{row}}: column {col!r} value {{value}} is too large",
            )
        out[col] = values

    if "causal" in frame.columns:
        codes, c = _text_codes(frame["causal"])
        truthy, falsy = (
            ["1", "true", "yes", "y", "t", "1.0"],
            ["", "0", "false", "no", "n", "f", "0.0"],
        )
        first_bad(
            ~np.isin(c, truthy + falsy)[codes],
            "causal",
            "row {row}: column 'causal' must be true/false/1/0, got {value}",
        )
        out["causal"] = np.isin(c, truthy)[codes]
    else:
        out["causal"] = np.zeros(n_rows, dtype=bool)

    out["backend"] = (
        _clean_text(frame["backend"])
        if "backend" in frame.columns
        else np.full(n_rows, "", dtype=object)
    )

    if "density" in frame.columns:
        dens, empty, junk = _parse_numbers(frame["density"])
        with np.errstate(invalid="ignore"):
            bad = junk | (~empty & ((dens <= 0) | (dens > 1)))
        first_bad(bad, "density", "row {row}: column 'density' must be in (0, 1], got {value}")
        out["density"] = dens
    else:
        out["density"] = np.full(n_rows, np.nan)

    columns = (*CSV_COLUMNS, *EXTRA_COLUMNS)
    if SPARSITY_COLUMN in frame.columns:
        codes, sp = _text_codes(frame[SPARSITY_COLUMN])
        canon = []
        for j, value in enumerate(sp):  # the distinct values only
            try:
                canon.append(canonical_sparsity(value))
            except OpError:
                first_bad(codes == j, SPARSITY_COLUMN, "row {row}: column 'sparsity' {value} "
                          f"not understood; allowed: {SPARSITY_ALLOWED}")  # fmt: skip
        out[SPARSITY_COLUMN] = np.array(canon, dtype=object)[codes]
        first_bad(
            (out[SPARSITY_COLUMN] != "") & (out["op"] != OpKind.gemm.value),
            SPARSITY_COLUMN,
            "row {row}: sparsity {value} on a non-gemm op; allowed: gemm rows only",
        )
        columns = (*columns, SPARSITY_COLUMN)

    import pandas as pd

    # text stays object (pandas 3 would make Arrow strings of it: slower to build and to
    # read back, and the same values)
    result = pd.DataFrame(
        {
            c: pd.Series(out[c], dtype=object, copy=False) if out[c].dtype == object else out[c]
            for c in columns
        }
    )
    _check_kinds(result, row_offset)
    return result


def _check_kinds(out: pd.DataFrame, row_offset: int) -> None:
    import pandas as pd

    ops = out["op"].to_numpy()
    present = set(pd.unique(ops))  # one hash pass; a kind absent costs nothing below
    for kind in OpKind:
        if kind.value not in present:
            continue
        mask = ops == kind.value
        sub = out if len(present) == 1 else out.loc[mask]  # one kind: no copy of the frame
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
                    f"heads_kv ({hkv[j]}); {heads_hint(int(hq[j]))}"
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


def check_size_limits(frame: pd.DataFrame, *, row_offset: int = 0) -> None:
    """Refuse sizes above :data:`SIZE_LIMITS` in a validated ops frame (a user's CSV): the
    first one raises :class:`OpError` naming the row, the column, the value and the bound."""
    is_adamw = frame["op"].to_numpy() == OpKind.adamw.value
    for col in INT_COLUMNS:
        values = frame[col].to_numpy(dtype="float64")
        bound = np.where(is_adamw, size_limit(col, OpKind.adamw)[0], SIZE_LIMITS[col][0])
        with np.errstate(invalid="ignore"):
            bad = values > bound
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            limit, why = size_limit(col, frame["op"].iloc[j])
            raise OpError(
                f"row {j + 1 + row_offset}: column {col!r} value {values[j]:.0f} is too large; "
                f"allowed: at most {limit} ({why})"
            )
