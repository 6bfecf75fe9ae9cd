"""Public request-trace formats, read by column mapping into simcli's request streams.

``simcli serve --trace FILE --trace-format FMT`` replays (or, with ``--qps``, resamples the
lengths of) a trace in any of these formats; ``auto`` (the default) tells them apart by
the header (or, for JSON lines, the first record's keys):

- ``simcli``: ``arrival_s`` (s), ``prompt_tokens``, ``output_tokens`` (optional
  ``prefix_id``, ``prefix_tokens``);
- ``azure``: ``TIMESTAMP`` (date-time), ``ContextTokens``, ``GeneratedTokens``;
- ``mooncake`` (JSON lines): ``timestamp`` (ms), ``input_length``, ``output_length``;
- ``burstgpt``: ``Timestamp`` (s), ``Request tokens``, ``Response tokens``;
- ``vidur``: ``arrived_at`` (s; absent in length-only files), ``num_prefill_tokens``,
  ``num_decode_tokens``;
- ``csv``: ``--trace-columns arrival=COL,prompt=COL,output=COL`` and ``--trace-time-unit
  s|ms|us|datetime``.

Sources of the layouts: Azure LLM inference traces 2023/2024 (Splitwise, Patel et al. ISCA
2024; github.com/Azure/AzurePublicDataset ``AzureLLMInferenceTrace_{code,conv}.csv``),
Mooncake (Qin et al. FAST 2025; ``mooncake_trace.jsonl`` of github.com/kvcache-ai/Mooncake:
``timestamp`` in ms since the first request, ``hash_ids`` one id per 512-token block),
BurstGPT (Wang et al. 2024; github.com/HPMLL/BurstGPT ``data/BurstGPT_*.csv``), Vidur
(Agrawal et al. MLSys 2024; github.com/microsoft/vidur ``data/processed_traces/*.csv``,
read by its ``TraceReplayRequestGenerator``).

What is read, and what is not: arrival times are made relative to the first row (a trace
that starts at 3600 s replays from 0); BurstGPT rows with 0 response tokens are its failed
requests (``Log Type`` aside, its ``*_without_fails`` files drop them) and are skipped, as
are Azure/BurstGPT/Mooncake rows with 0 prompt tokens; Mooncake's ``hash_ids`` (prefix
reuse at block granularity) are not read -- simcli's prefix cache takes one shared prefix
per request (the simcli format's ``prefix_id``/``prefix_tokens``); BurstGPT's ``Model`` and
``Log Type`` columns are not filtered on (cut the file to one model first). Rows must be in
arrival order.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from simcli.serving.requests import (
    CHUNK,
    RequestStream,
    TraceError,
    line_count,
    trace_chunk,
    trace_lengths,
    trace_requests,
)

TRACE_FORMATS = ("auto", "simcli", "azure", "mooncake", "burstgpt", "vidur", "csv")
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "datetime": 0.0}


@dataclass(frozen=True)
class Layout:
    """Where a format keeps arrival, prompt and output: column names, the arrival unit
    (seconds per unit; 0: ISO date-times), and whether 0-token rows are skipped."""

    name: str
    arrival: str | None
    prompt: str
    output: str
    unit_s: float
    skip_zero: bool = False
    arrival_optional: bool = False


LAYOUTS = {
    "azure": Layout("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", 0.0, True),
    "mooncake": Layout("mooncake", "timestamp", "input_length", "output_length", 1e-3, True),
    "burstgpt": Layout("burstgpt", "Timestamp", "Request tokens", "Response tokens", 1.0, True),
    "vidur": Layout(
        "vidur",
        "arrived_at",
        "num_prefill_tokens",
        "num_decode_tokens",
        1.0,
        arrival_optional=True,
    ),  # fmt: skip
}


def parse_columns(text: str, unit: str = "s") -> Layout:
    """``--trace-columns arrival=COL,prompt=COL,output=COL`` (arrival may be left out for
    length resampling) and ``--trace-time-unit``; a bad one is one :class:`TraceError`."""
    want = ("arrival", "prompt", "output")
    cols: dict[str, str] = {}
    for item in text.split(","):
        key, sep, col = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in want or not col.strip() or key in cols:
            raise TraceError(
                f"--trace-columns {text!r}: bad item {item.strip()!r}; allowed: "
                "arrival=COL,prompt=COL,output=COL (each once; arrival optional with --qps)"
            )
        cols[key] = col.strip()
    missing = [k for k in ("prompt", "output") if k not in cols]
    if missing:
        raise TraceError(
            f"--trace-columns {text!r} names no {' or '.join(missing)} column; allowed: "
            "arrival=COL,prompt=COL,output=COL"
        )
    if unit not in TIME_UNITS:
        raise TraceError(f"unknown --trace-time-unit {unit!r}; allowed: {', '.join(TIME_UNITS)}")
    return Layout(
        "csv", cols.get("arrival"), cols["prompt"], cols["output"], TIME_UNITS[unit]
    )  # fmt: skip


def _first_line(path: Path) -> str:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            return fh.readline()
    except FileNotFoundError:
        raise TraceError(f"trace {path} does not exist") from None
    except IsADirectoryError:
        raise TraceError(f"trace {path} is a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"trace {path} cannot be read: {str(exc).splitlines()[0]}") from None


def detect_format(path: Path) -> str:
    """The format of a trace file from its header (``auto``); one line when none fits."""
    line = _first_line(path).strip()
    if not line:
        raise TraceError(f"trace {path} is empty")
    if line.startswith("{"):
        try:
            keys = set(json.loads(line))
        except (json.JSONDecodeError, TypeError):
            keys = set()
        if {"input_length", "output_length"} <= keys:
            return "mooncake"
        raise TraceError(
            f"trace {path}: a JSON-lines record with keys {', '.join(sorted(keys))}; "
            "allowed (mooncake): timestamp, input_length, output_length[, hash_ids]"
        )
    header = [h.strip() for h in next(csv.reader([line]))]
    names = {h.lower() for h in header}
    if {"arrival_s", "prompt_tokens", "output_tokens"} <= names:
        return "simcli"
    for fmt, lay in LAYOUTS.items():
        if lay.prompt in header and lay.output in header:
            return fmt
    raise TraceError(
        f"trace {path} has columns {','.join(header)!r}, no known format; allowed: "
        "simcli (arrival_s,prompt_tokens,output_tokens), azure (TIMESTAMP,ContextTokens,"
        "GeneratedTokens), burstgpt (Timestamp,Request tokens,Response tokens), vidur "
        "(arrived_at,num_prefill_tokens,num_decode_tokens), mooncake (JSON lines), or "
        "--trace-format csv --trace-columns arrival=COL,prompt=COL,output=COL"
    )


@dataclass(frozen=True)
class TraceSource:
    """A trace file and how to read it (``format`` resolved from ``auto``)."""

    path: Path
    format: str
    layout: Layout | None  # None: the simcli format (requests.trace_requests)

    def check(self, need_arrivals: bool) -> None:
        """Fail now (one line) on a bad header or first row, or missing arrivals."""
        if self.layout is None:
            next(iter(trace_requests(self.path, 1)), None)
            return
        if need_arrivals and self.layout.arrival is None:
            raise TraceError(
                f"trace {self.path} ({self.format}) has no arrival column; give --qps X to "
                "draw arrivals (its lengths are resampled), or name one in --trace-columns"
            )
        next(self.rows(need_arrivals), None)

    def requests(self, num_requests: int | None = None) -> RequestStream:
        """Replay: the first ``num_requests`` rows, :data:`CHUNK` at a time."""
        if self.layout is None:
            return trace_requests(self.path, num_requests)
        rows = line_count(self.path) - (self.format != "mooncake")
        expected = rows if num_requests is None else min(rows, num_requests)

        def chunks() -> Iterator:
            batch: list[tuple[float, int, int, int, int]] = []
            rid = 0
            for arrival, prompt, output in self.rows(True):
                if num_requests is not None and rid + len(batch) >= num_requests:
                    break
                batch.append((arrival, prompt, output, -1, 0))
                if len(batch) == CHUNK:
                    yield trace_chunk(rid, batch)
                    rid += len(batch)
                    batch = []
            if batch:
                yield trace_chunk(rid, batch)

        return RequestStream(chunks, False, max(expected, 0))

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """All ``(prompt, output)`` token counts, for resampling with ``--qps``."""
        if self.layout is None:
            return trace_lengths(self.path)
        p: list[int] = []
        o: list[int] = []
        for _, prompt, output in self.rows(False):
            p.append(prompt)
            o.append(output)
        return np.asarray(p, dtype=np.int64), np.asarray(o, dtype=np.int64)

    def rows(self, arrivals: bool) -> Iterator[tuple[float, int, int]]:
        """Validated ``(arrival_s from the first row, prompt, output)``; arrivals 0 when
        not wanted."""
        assert self.layout is not None
        lay = self.layout
        where = f"trace {self.path} ({self.format})"
        records = _json_records(self.path, where) if self.format == "mooncake" else None
        if records is None:
            records = _csv_records(self.path, where, lay)
        first: float | None = None
        last = -math.inf
        seen = 0
        for line, rec in records:
            prompt = _count(where, line, lay.prompt, rec.get(lay.prompt))
            output = _count(where, line, lay.output, rec.get(lay.output))
            if lay.skip_zero and (prompt == 0 or output == 0):
                continue
            if prompt < 1 or output < 1:
                col = lay.prompt if prompt < 1 else lay.output
                raise TraceError(f"{where} line {line}: {col} is 0; allowed: >= 1 tokens")
            t = 0.0
            if arrivals and lay.arrival is not None:
                if lay.arrival not in rec:  # a length-only file (Vidur's arXiv one)
                    raise TraceError(
                        f"{where} has no column {lay.arrival!r}: lengths only; give --qps X "
                        "to draw arrivals (its lengths are resampled)"
                    )
                t = _time(where, line, lay.arrival, rec[lay.arrival], lay.unit_s)
                if t < last:
                    raise TraceError(
                        f"{where} line {line}: {lay.arrival} is before the previous row's; "
                        "allowed: rows sorted by arrival"
                    )
                last = t
                if first is None:
                    first = t
                t -= first
            seen += 1
            yield t, prompt, output
        if seen == 0:
            raise TraceError(f"{where} has no requests (no rows, or every row skipped)")


def _csv_records(path: Path, where: str, lay: Layout) -> Iterator[tuple[int, dict]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader, [])]
            need = [c for c in (lay.arrival, lay.prompt, lay.output) if c is not None]
            missing = [c for c in need if c not in header]
            if missing and lay.arrival_optional and missing == [lay.arrival]:
                lay_arrival_absent = True
            elif missing:
                raise TraceError(
                    f"{where} has no column {', '.join(repr(m) for m in missing)}; "
                    f"its columns: {','.join(header) or '(none)'}"
                )
            else:
                lay_arrival_absent = False
            index = {c: header.index(c) for c in need if c in header}
            if lay_arrival_absent:
                index.pop(lay.arrival, None)  # type: ignore[arg-type]
            for row in reader:
                if not any(c.strip() for c in row):
                    continue
                if len(row) < len(header):
                    raise TraceError(
                        f"{where} line {reader.line_num}: {len(row)} values, expected "
                        f"{len(header)} ({','.join(header)})"
                    )
                yield reader.line_num, {c: row[i] for c, i in index.items()}
        except csv.Error as exc:
            raise TraceError(f"{where} line {reader.line_num}: {exc}") from None
        except UnicodeDecodeError:
            raise TraceError(f"{where} line {reader.line_num}: not UTF-8 text") from None


def _json_records(path: Path, where: str) -> Iterator[tuple[int, dict]]:
    with path.open(encoding="utf-8") as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where} line {line}: not JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise TraceError(f"{where} line {line}: not a JSON object")
            missing = [k for k in ("timestamp", "input_length", "output_length") if k not in rec]
            if missing:
                raise TraceError(
                    f"{where} line {line} has no key {', '.join(repr(m) for m in missing)}; "
                    f"its keys: {', '.join(rec) or '(none)'}"
                )
            yield line, rec


def _count(where: str, line: int, col: str, cell: object) -> int:
    try:
        value = float(str(cell).strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not value.is_integer() or value < 0:
        raise TraceError(
            f"{where} line {line}: {col} {str(cell).strip()!r} is invalid; allowed: an integer >= 0"
        )
    return int(value)


def _time(where: str, line: int, col: str, cell: object, unit_s: float) -> float:
    text = str(cell).strip()
    if unit_s == 0.0:  # an ISO date-time (Azure: "2023-11-16 18:15:46.6805900")
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            raise TraceError(
                f"{where} line {line}: {col} {text!r} is not a date-time; allowed: "
                "YYYY-MM-DD HH:MM:SS[.fraction]"
            ) from None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where} line {line}: {col} {text!r} is invalid; allowed: a time >= 0")
    return value * unit_s if unit_s >= 1 else value / round(1.0 / unit_s)  # 1900 ms: 1.9 s


def trace_source(
    path: str | Path, fmt: str = "auto", columns: str | None = None, unit: str = "s"
) -> TraceSource:
    """How to read ``path``: ``fmt`` (``auto``: by its header), ``columns``/``unit`` for
    ``csv``. Every problem is one :class:`TraceError` line."""
    p = Path(path)
    if fmt not in TRACE_FORMATS:
        raise TraceError(f"unknown --trace-format {fmt!r}; allowed: {', '.join(TRACE_FORMATS)}")
    if columns is not None and fmt not in ("csv", "auto"):
        raise TraceError(f"--trace-columns is for --trace-format csv, not {fmt}")
    if fmt == "auto":
        fmt = "csv" if columns is not None else detect_format(p)
    if fmt == "csv":
        if columns is None:
            raise TraceError("--trace-format csv needs --trace-columns arrival=COL,prompt=COL,"
                             "output=COL")  # fmt: skip
        return TraceSource(p, "csv", parse_columns(columns, unit))
    _first_line(p)  # a missing file fails here
    return TraceSource(p, fmt, None if fmt == "simcli" else LAYOUTS[fmt])


__all__ = ["LAYOUTS", "TIME_UNITS", "TRACE_FORMATS", "TraceSource", "detect_format",
           "parse_columns", "trace_source"]  # fmt: skip
