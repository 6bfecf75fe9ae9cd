"""The results store: one row per point, embedded (SQLite file or Parquet dataset).

Row columns (both stores):

| column | meaning |
|---|---|
| point_id | hash of (command, canonical JSON of params): the unique key |
| seq | the point's position in the spec's expansion (export order) |
| command | e.g. ``train``, ``predict gemm`` |
| params_json | the point's parameters (option names as in the spec, normalised to dashes) |
| ok | 1 when the command succeeded |
| outputs_json | the command's JSON object (``--format json``), null when it failed |
| error | the command's one ``error: ...`` line, empty when it succeeded |
| simcli_version | the simcli that computed the row |
| profile_id | the calibration profile / cost-model label the point used |
| wall_s | seconds the point took inside its worker |
| finished_utc | when it finished (ISO 8601, UTC) |

Resume: a rerun skips every point_id already stored, done or failed (``--retry-failed``
reruns failed ones and replaces their rows). SQLite commits each batch of results as it
arrives (WAL mode), so a crash loses only points still running. The Parquet store writes
one part file per batch (atomically: temp file, then rename), so a crash loses at most the
open batch; when a point was retried its last row wins on read.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from simcli.sweep.errors import SweepError

COLUMNS = (
    "point_id",
    "seq",
    "command",
    "params_json",
    "ok",
    "outputs_json",
    "error",
    "simcli_version",
    "profile_id",
    "wall_s",
    "finished_utc",
)
STORE_KINDS = ("sqlite", "parquet")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS points (
    point_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    command TEXT NOT NULL,
    params_json TEXT NOT NULL,
    ok INTEGER NOT NULL,
    outputs_json TEXT,
    error TEXT NOT NULL,
    simcli_version TEXT NOT NULL,
    profile_id TEXT NOT NULL,
    wall_s REAL NOT NULL,
    finished_utc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def default_path(spec_path: Path, kind: str) -> Path:
    """The store of a spec when --results is not given: ``NAME.results.sqlite`` (or a
    ``.parquet`` folder) in the current folder, never beside the spec (specs ship in the
    source tree, e.g. examples/sweeps/)."""
    suffix = ".sqlite" if kind == "sqlite" else ".parquet"
    return Path(spec_path.stem + ".results" + suffix)


def summary_rows(path: Path) -> int:
    """Points stored at ``path`` (0 when it holds none or cannot be read)."""
    try:
        store = open_store(path)
    except Exception:  # noqa: BLE001 - a half-created store holds no points
        return 0
    try:
        return len(store.frame())
    finally:
        store.close()


def remove_store(path: Path) -> None:
    """Delete a store (file, or Parquet folder)."""
    import shutil

    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def detect_kind(path: Path) -> str:
    if path.is_dir():
        return "parquet"
    return "sqlite"


class SqliteStore:
    kind = "sqlite"

    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise SweepError(f"store {self.path} does not exist")
        if create and not self.path.parent.is_dir():
            raise SweepError(f"store {self.path}: folder {self.path.parent} does not exist")
        if self.path.is_file():
            with open(self.path, "rb") as fh:
                head = fh.read(16)
            if head and head != b"SQLite format 3\x00":
                raise SweepError(f"store {self.path} is not an SQLite file (a sweep store?)")
        try:
            self.db = sqlite3.connect(self.path, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            if create:
                self.db.executescript(_SCHEMA)
                self.db.commit()
            cols = [r[1] for r in self.db.execute("PRAGMA table_info(points)")]
        except sqlite3.DatabaseError as exc:
            raise SweepError(f"store {self.path} is unreadable: {exc}") from None
        if tuple(cols) != COLUMNS:
            raise SweepError(
                f"store {self.path} is not a simcli sweep store (no points table with the "
                f"columns {', '.join(COLUMNS)})"
            )

    def done(self) -> dict[str, bool]:
        """point_id -> ok, for every stored point."""
        return {pid: bool(ok) for pid, ok in self.db.execute("SELECT point_id, ok FROM points")}

    def write(self, rows: list[dict[str, Any]], *, replace: bool = False) -> None:
        """Insert rows and commit; an id already stored is kept unless ``replace``."""
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        sql = f"{verb} INTO points ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
        self.db.executemany(sql, [tuple(r[c] for c in COLUMNS) for r in rows])
        self.db.commit()

    def set_meta(self, values: dict[str, Any]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [(k, json.dumps(v)) for k, v in values.items()],
        )
        self.db.commit()

    def meta(self) -> dict[str, Any]:
        try:
            return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM meta")}
        except sqlite3.DatabaseError:
            return {}

    def frame(self) -> pd.DataFrame:
        frame = pd.read_sql_query(
            f"SELECT {', '.join(COLUMNS)} FROM points ORDER BY seq, point_id", self.db
        )
        frame["ok"] = frame["ok"].astype(bool)
        return frame

    def flush(self) -> None:
        self.db.commit()

    def close(self) -> None:
        self.db.close()


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SweepError("--store parquet needs pyarrow: pip install 'simcli[parquet]'") from None
    return pa, pq


class ParquetStore:
    """A folder of ``part-NNNNNN.parquet`` files and ``meta.json``."""

    kind = "parquet"
    batch_rows = 512
    batch_s = 2.0

    def __init__(self, path: Path, *, create: bool) -> None:
        self.pa, self.pq = _pyarrow()
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise SweepError(f"store {self.path} is a file; allowed: a Parquet store folder")
        if not self.path.is_dir():
            if not create:
                raise SweepError(f"store {self.path} does not exist")
            if not self.path.parent.is_dir():
                raise SweepError(f"store {self.path}: folder {self.path.parent} does not exist")
            self.path.mkdir()
        elif not create and not (self.path / "meta.json").is_file() and not self._parts():
            raise SweepError(f"store {self.path} is not a simcli sweep store (no parts, no meta)")
        self._buffer: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self.schema = self.pa.schema(
            [
                ("point_id", self.pa.string()),
                ("seq", self.pa.int64()),
                ("command", self.pa.string()),
                ("params_json", self.pa.string()),
                ("ok", self.pa.bool_()),
                ("outputs_json", self.pa.string()),
                ("error", self.pa.string()),
                ("simcli_version", self.pa.string()),
                ("profile_id", self.pa.string()),
                ("wall_s", self.pa.float64()),
                ("finished_utc", self.pa.string()),
            ]
        )

    def _parts(self) -> list[Path]:
        return sorted(self.path.glob("part-*.parquet"))

    def _read(self, columns: list[str] | None = None) -> pd.DataFrame:
        frames = []
        for part in self._parts():
            try:
                frames.append(self.pq.read_table(part, columns=columns).to_pandas())
            except Exception as exc:  # pyarrow raises its own types
                raise SweepError(f"store part {part} is unreadable: {exc}") from None
        cols = columns or list(COLUMNS)
        if not frames:
            return pd.DataFrame({c: [] for c in cols})
        frame = pd.concat(frames, ignore_index=True)
        return frame.drop_duplicates("point_id", keep="last").reset_index(drop=True)

    def done(self) -> dict[str, bool]:
        frame = self._read(["point_id", "ok"])
        done = dict(zip(frame["point_id"], frame["ok"].astype(bool), strict=True))
        done.update({r["point_id"]: bool(r["ok"]) for r in self._buffer})
        return done

    def write(self, rows: list[dict[str, Any]], *, replace: bool = False) -> None:
        self._buffer.extend(rows)
        if (
            len(self._buffer) >= self.batch_rows
            or time.monotonic() - self._last_flush >= self.batch_s
        ):
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._buffer:
            return
        table = self.pa.Table.from_pylist(
            [{c: r[c] for c in COLUMNS} for r in self._buffer], schema=self.schema
        )
        parts = self._parts()
        n = int(parts[-1].stem.split("-")[1]) + 1 if parts else 0
        fd, tmp = tempfile.mkstemp(prefix=".part-", suffix=".tmp", dir=self.path)
        os.close(fd)
        try:
            self.pq.write_table(table, tmp)
            os.replace(tmp, self.path / f"part-{n:06d}.parquet")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._buffer = []

    def set_meta(self, values: dict[str, Any]) -> None:
        meta = {**self.meta(), **values}
        fd, tmp = tempfile.mkstemp(prefix=".meta-", suffix=".tmp", dir=self.path)
        with os.fdopen(fd, "w") as fh:
            json.dump(meta, fh, indent=2)
        os.replace(tmp, self.path / "meta.json")

    def meta(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / "meta.json").read_text())
        except (OSError, ValueError):
            return {}

    def frame(self) -> pd.DataFrame:
        frame = self._read()
        frame = frame.sort_values(["seq", "point_id"], kind="stable").reset_index(drop=True)
        frame["ok"] = frame["ok"].astype(bool)
        return frame

    def close(self) -> None:
        self.flush()


Store = SqliteStore | ParquetStore


def open_store(path: str | Path, kind: str | None = None, *, create: bool = False) -> Store:
    """Open (or with ``create`` make) a store; ``kind`` None detects it from the path."""
    path = Path(path)
    kind = kind or detect_kind(path)
    if kind not in STORE_KINDS:
        raise SweepError(f"--store {kind!r}; allowed: {', '.join(STORE_KINDS)}")
    if kind == "parquet":
        return ParquetStore(path, create=create)
    return SqliteStore(path, create=create)
