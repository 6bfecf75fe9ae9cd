"""Large ops CSVs in and predictions out: the fast path of ``simcli predict --input
ops.csv --output pred.csv`` (issue 18: a million GEMM rows in about a second and a half).

The reference path reads the CSV with pandas as strings
(:func:`~simcli.scenario.predict.read_ops_csv`: initial spaces skipped, quotes honoured,
malformed files reported in one line), validates it (:func:`workloads.ops.normalise_frame`)
and writes the input rows plus ``predicted_ms`` with ``DataFrame.to_csv(float_format=
"%.6g")`` (:func:`simcli.output.atomic_write_csv`).

The fast path handles the CSVs that make up almost all input: no quotes, no whitespace, no
carriage return but in CRLF line ends, no byte-order mark, a header of distinct non-empty
contract names, every row as wide as the header, sizes written as plain integers. pyarrow's
CSV reader parses the sizes as integers, ``density`` as a float and the text columns as
dictionaries, and the same :func:`~workloads.ops.normalise_frame` validates them (numbers
and codes instead of strings; no Arrow compute kernels and no string conversion, which
cost more than the whole read). Written back, such a row is its input line (pandas quotes
nothing in it), a comma and the time: the output is assembled from the input's bytes
with numpy, the times formatted as ``%.6g`` by :func:`format_g6` (the rows it is unsure
of by Python). Anything else, and any file the validation refuses, goes the reference
way, which then reads and words the error as before; :func:`read_fast` only says None.

Compared with the reference on mixed CSVs, byte for byte, and on the formatting of floats
across their whole range: tests/simcli/scenario/test_ops_csv.py. Timed by
``benchmarks/predict_cli_speed.py``.
"""

from __future__ import annotations

import codecs
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, INT_COLUMNS, SPARSITY_COLUMN

if TYPE_CHECKING:
    import pandas as pd

PREDICTED = "predicted_ms"
# bytes that make pandas' reading differ from a plain split on commas and newlines
_SPECIAL = (b'"', b" ", b"\t", b"\r", b"\x00", b"\x0b", b"\x0c")
_TEXT = ("op", "dtype", "backend", "causal", "sparsity")
_KNOWN = {*CSV_COLUMNS, *EXTRA_COLUMNS, SPARSITY_COLUMN}
_LINES_PER_BLOCK = 1 << 16  # output assembled this many lines at a time (bounded memory)


@dataclass(frozen=True)
class FastOps:
    """An ops CSV read by the fast path: ``frame`` for :func:`~workloads.ops.
    normalise_frame` (sizes as floats, NaN when empty; text as categoricals; empty columns
    left out), and the file's bytes (``data``: LF line ends, no blank line, a newline at
    the end), which :func:`write_predictions` repeats."""

    frame: pd.DataFrame | None
    data: bytes


def read_fast(path: Path) -> FastOps | None:
    """The ops CSV at ``path`` read by the fast path, or None when it is not a file that
    path is sure of (see the module docstring) or cannot be read: the caller then reads
    it with :func:`~simcli.scenario.predict.read_ops_csv`."""
    try:
        data = Path(path).read_bytes().replace(b"\r\n", b"\n")
    except OSError:
        return None
    if not data or data.startswith((codecs.BOM_UTF8, b"\n")) or any(c in data for c in _SPECIAL):
        return None
    while b"\n\n" in data:  # blank lines: pandas skips them (so does the parse below)
        data = data.replace(b"\n\n", b"\n")
    if not data.endswith(b"\n"):
        data += b"\n"
    end = data.find(b"\n")
    try:
        names = (data if end < 0 else data[:end]).decode("utf-8").split(",")
    except UnicodeDecodeError:
        return None
    if "op" not in names or len(set(names)) != len(names) or not set(names) <= _KNOWN:
        return None
    import pandas as pd

    try:  # pyarrow comes with the parquet extra; without it, the pandas path reads
        import pyarrow as pa
        import pyarrow.csv as pcsv
    except ImportError:
        return None

    types = {
        n: pa.dictionary(pa.int32(), pa.string())
        if n in _TEXT
        else pa.float64()
        if n == "density"
        else pa.int64()
        for n in names
    }
    try:
        table = pcsv.read_csv(
            pa.BufferReader(data),
            convert_options=pcsv.ConvertOptions(
                column_types=types, null_values=[""], strings_can_be_null=False
            ),
            memory_pool=pa.system_memory_pool(),  # freed to malloc, which numpy reuses
        )
    except (pa.ArrowInvalid, pa.ArrowException):
        return None
    if table.num_rows == 0 or table.column_names != names:
        return None
    # an empty column validates as an absent one: left out (no array of NaN or "")
    numbers = [n for n in names if n not in _TEXT and table.column(n).null_count < len(table)]
    block = np.empty((len(numbers), table.num_rows))  # the frame's float block, filled in place
    for row, name in zip(block, numbers, strict=True):
        column = table.column(name)
        start = 0
        for chunk in column.chunks:
            row[start : start + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
            start += len(chunk)
        if name == "density" and np.isnan(row).sum() != column.null_count:
            return None  # "nan" written out: pandas reads it as text, and refuses it
        if name in INT_COLUMNS and (np.abs(row) > 2.0**53).any():
            return None  # beyond exact integers: the reference parses and words them
    frame = pd.DataFrame(block.T, columns=numbers, copy=False)
    for name in (n for n in names if n in _TEXT):
        cat = _categorical(pd, table.column(name).chunks)
        if name == "op" or list(cat.categories) != [""]:
            frame[name] = cat
    return FastOps(frame=frame, data=data)


def _categorical(pd, chunks: list) -> pd.Categorical:
    """Dictionary-encoded chunks as one categorical (the chunks' dictionaries merged)."""
    categories: dict[str, int] = {}
    codes = []
    for chunk in chunks:
        words = chunk.dictionary.to_pylist()
        remap = np.array([categories.setdefault(w, len(categories)) for w in words] + [-1])
        index = chunk.indices.to_numpy(zero_copy_only=False)
        codes.append(remap[np.where(np.isnan(index), -1, index).astype(np.int64)])
    return pd.Categorical.from_codes(
        np.concatenate(codes) if codes else np.zeros(0, dtype=np.int64),
        categories=pd.Index(list(categories), dtype=object),
    )


# --------------------------------------------------------------------------- "%.6g"


def format_g6(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``"%.6g" % v`` of every value as pandas writes it with ``float_format="%.6g"``
    (NaN as an empty field), as a byte matrix and the length of each row's text.

    The six significant digits are those of ``v * 10**(5 - e)`` rounded to an integer,
    one correctly rounded operation by an exact power of ten (1e-10 from the true value
    at most); rows within 1e-9 of a rounding tie, and values that are not positive and
    finite or lie beyond 1e+-17, are formatted by Python instead."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    ok = np.isfinite(v) & (v >= 1e-17) & (v < 1e17)
    safe = np.where(ok, v, 1.0)
    exp10 = np.floor(np.log10(safe)).astype(np.int64)
    scaled = _scaled(safe, 5 - exp10)
    for _ in range(2):  # log10 rounded across a power of ten: one step back
        low, high = scaled < 1e5, scaled >= 1e6
        if not (low.any() or high.any()):
            break
        exp10 = exp10 - low + high
        scaled = _scaled(safe, 5 - exp10)
    whole = np.floor(scaled)
    frac = scaled - whole
    unsure = ~ok | (np.abs(frac - 0.5) < 1e-9) | (scaled < 1e5) | (scaled >= 1e6)
    m = (whole + (frac > 0.5)).astype(np.int64)  # six digits, 100000..1000000
    carry = m == 1_000_000
    m[carry] = 100_000
    exp10 = exp10 + carry
    digits = np.empty((n, 6), dtype=np.uint8)  # m's digits as ASCII
    rest = m.astype(np.int32)
    for i in range(5, -1, -1):
        tens = rest // 10
        digits[:, i] = rest - tens * 10 + 48
        rest = tens
    kept = np.full(n, 6, dtype=np.int64)  # significant digits written: trailing zeros off
    trailing = np.ones(n, dtype=bool)
    for i in range(5, 0, -1):
        trailing &= digits[:, i] == 48
        kept -= trailing

    width = 13
    out = np.full((n, width), 48, dtype=np.uint8)
    size = np.zeros(n, dtype=np.int64)
    for x in range(-4, 6):  # fixed notation: %g keeps it for exponents -4..5
        rows = np.flatnonzero(exp10 == x)
        if not len(rows):
            continue
        d, k = digits[rows], kept[rows]
        if x >= 0:  # ddd.ddd: x + 1 digits, the point, the rest
            out[rows, : x + 1] = d[:, : x + 1]
            out[rows, x + 1] = 46
            out[rows, x + 2 : 7] = d[:, x + 1 :]
            size[rows] = np.where(k > x + 1, k + 1, x + 1)
        else:  # 0.000ddd: the point, -x - 1 zeros, six digits
            lead = -x - 1
            out[rows, 1] = 46
            out[rows, 2 + lead : 8 + lead] = d
            size[rows] = 2 + lead + k
    rows = np.flatnonzero((exp10 < -4) | (exp10 >= 6))
    if len(rows):  # d.ddddde+XX
        d, k, e = digits[rows], kept[rows], exp10[rows]
        out[rows, 0] = d[:, 0]
        out[rows, 1] = 46
        out[rows, 2:7] = d[:, 1:]
        mantissa = np.where(k > 1, k + 1, 1)
        big = np.abs(e)
        tail = np.full((len(rows), 5), 48, dtype=np.uint8)
        tail[:, 0] = 101  # e
        tail[:, 1] = np.where(e < 0, 45, 43)  # - or +
        three = big >= 100
        tail[:, 2] = np.where(three, big // 100 + 48, big // 10 + 48)
        tail[:, 3] = np.where(three, big // 10 % 10 + 48, big % 10 + 48)
        tail[:, 4] = big % 10 + 48
        count = np.where(three, 5, 4)
        cols = mantissa[:, None] + np.arange(5)
        keep = np.arange(5) < count[:, None]
        out[np.repeat(rows, count), cols[keep]] = tail[keep]
        size[rows] = mantissa + count
    for i in np.flatnonzero(unsure):  # Python's own formatting (rare)
        x = float(v[i])
        text = b"" if x != x else ("%.6g" % x).encode()  # noqa: UP031 (as pandas writes)
        out[i, : len(text)] = np.frombuffer(text, dtype=np.uint8)
        size[i] = len(text)
    return out, size


def _scaled(v: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``v * 10**shift``, one correctly rounded operation by an exact power of ten."""
    up = np.clip(shift, 0, 22).astype(float)
    down = np.clip(-shift, 0, 22).astype(float)
    return v * 10.0**up / 10.0**down


# --------------------------------------------------------------------------- writing


def write_predictions(ops: FastOps, predicted_ms: np.ndarray, path: Path) -> None:
    """The input rows of ``ops`` plus ``predicted_ms``, as the reference writes them
    (header, then per row its input line, a comma and the time), atomically: into a
    temporary file beside ``path``, renamed when complete."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OSError(f"output folder {folder} does not exist")
    raw = np.frombuffer(ops.data, dtype=np.uint8)
    newlines = np.flatnonzero(raw == 10)  # the header's, then one per row
    if len(newlines) != len(predicted_ms) + 1:
        raise ValueError("internal: the fast CSV path lost track of the rows")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(ops.data[: newlines[0]] + b"," + PREDICTED.encode() + b"\n")
            for i in range(0, len(predicted_ms), _LINES_PER_BLOCK):
                first, last = newlines[i], newlines[min(i + _LINES_PER_BLOCK, len(newlines) - 1)]
                block = raw[first + 1 : last + 1]  # these rows, each with its newline
                row_ends = newlines[i + 1 : i + 1 + _LINES_PER_BLOCK] - (first + 1)
                text, size = format_g6(predicted_ms[i : i + _LINES_PER_BLOCK])
                fh.write(_with_times(block, row_ends, text, size))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _with_times(
    block: np.ndarray, row_ends: np.ndarray, text: np.ndarray, size: np.ndarray
) -> bytes:
    """``block`` (rows, each ending in a newline at ``row_ends``) with ``"," + text`` put
    before each row's newline."""
    rows, width = text.shape
    inserted = np.empty((rows, width + 1), dtype=np.uint8)
    inserted[:, 0] = 44  # ,
    inserted[:, 1:] = text
    keep = np.arange(width + 1) <= size[:, None]
    return np.insert(block, np.repeat(row_ends, size + 1), inserted[keep]).tobytes()


__all__ = ["PREDICTED", "FastOps", "format_g6", "read_fast", "write_predictions"]
