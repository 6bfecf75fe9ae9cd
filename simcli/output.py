"""Printing results (table | json | csv) and writing files atomically."""

from __future__ import annotations

import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    import pandas as pd


class Format(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temp file in the same folder, then rename: never a half-written file."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OSError(f"output folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise cannot_write(path, exc) from None
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise cannot_write(path, exc) from None
        raise


def cannot_write(path: str | Path, exc: OSError) -> OSError:
    """``cannot write PATH: Permission denied``: the output the user named, never the temp
    file beside it that failed."""
    return OSError(f"cannot write {path}: {exc.strerror or type(exc).__name__}")


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """One JSON object, as ``--format json`` prints it (NaN/inf as null), written atomically."""
    atomic_write_text(path, json.dumps(jsonable(obj), indent=2) + "\n")


def atomic_write_csv(frame: pd.DataFrame, path: str | Path, float_format: str = "%.6g") -> None:
    buf = io.StringIO()
    frame.to_csv(buf, index=False, float_format=float_format)
    atomic_write_text(path, buf.getvalue())


def emit_records(
    records: Sequence[dict[str, Any]],
    fmt: Format,
    *,
    title: str = "",
    json_wrapper: dict[str, Any] | None = None,
    json_key: str = "rows",
) -> None:
    """Print rows as a rich table, CSV, or one JSON object (rows under ``json_key``)."""
    if fmt == Format.json:
        obj = dict(json_wrapper or {})
        obj[json_key] = [jsonable(dict(r)) for r in records]
        sys.stdout.write(json.dumps(obj, indent=2) + "\n")
    elif fmt == Format.csv:
        import pandas as pd  # here, not at the top: the CLI starts without pandas

        pd.DataFrame(list(records)).to_csv(sys.stdout, index=False, float_format="%.6g")
    else:
        table = Table(title=title or None)
        columns = list(records[0].keys()) if records else []
        for col in columns:
            table.add_column(col, overflow="fold")
        for rec in records:
            table.add_row(*(_fmt_cell(rec.get(c)) for c in columns))
        _console().print(table)


def emit_object(obj: dict[str, Any], fmt: Format, *, title: str = "") -> None:
    """Print one result object: a two-column table, one CSV row, or a JSON object."""
    if fmt == Format.json:
        sys.stdout.write(json.dumps(jsonable(obj), indent=2) + "\n")
    elif fmt == Format.csv:
        flat = {k: v for k, v in obj.items() if not isinstance(v, dict | list)}
        import pandas as pd

        pd.DataFrame([flat]).to_csv(sys.stdout, index=False, float_format="%.6g")
    else:
        table = Table(title=title or None, show_header=False)
        table.add_column("field", style="bold")
        table.add_column("value", overflow="fold")
        for key, value in obj.items():
            table.add_row(key, _fmt_cell(value))
        _console().print(table)


def _console() -> Console:
    """A terminal-width console, or a wide one when piped so ids are not wrapped."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def _fmt_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.4e}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt_cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_fmt_cell(v) for v in value)
    return str(value)
