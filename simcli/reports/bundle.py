"""``--output DIR``: CSVs, ``config.json`` and ``report.html``, written all or nothing.

Everything is rendered in memory first, then written into a temporary folder beside the
target and moved into place, so an interrupted or failing run never leaves a partial
bundle: either the old files or the complete new set.
"""

from __future__ import annotations

import datetime as _dt
import enum
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simcli import __version__
from simcli.output import cannot_write

if TYPE_CHECKING:
    import pandas as pd

FILE_SUFFIXES = (".csv", ".json")


def output_is_dir(path: Path) -> bool:
    """``--output`` names a folder unless it ends in ``.csv`` / ``.json`` (a single file)."""
    return path.suffix.lower() not in FILE_SUFFIXES


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and value != value:  # NaN
        return None
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    if hasattr(value, "model_dump"):
        return _jsonable(value.model_dump(mode="json"))
    if isinstance(value, enum.Enum):
        return value.value
    return value


def config_document(command: str, inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """``config.json``: the command, its fully resolved inputs and what produced it."""
    doc = {
        "command": command,
        "simcli_version": __version__,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "inputs": inputs,
    }
    doc.update(extra)
    return _jsonable(doc)


class StagedBundle:
    """An ``--output DIR`` bundle assembled in a hidden folder beside ``folder``: large
    files can be streamed into :meth:`path` while the work runs, then :meth:`commit`
    writes the rest and moves everything into place (a new folder appears in one rename;
    in an existing folder each file is replaced atomically, and files of an earlier run
    that this one does not write are left alone). Leaving the ``with`` block without a
    commit removes the staging folder: no partial bundle."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        check_output_path(self.folder, "--output", kind="folder")
        parent = self.folder.parent if str(self.folder.parent) else Path(".")
        try:
            self.staging = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}.", dir=parent))
        except OSError as exc:
            raise cannot_write(self.folder, exc) from None

    def __enter__(self) -> StagedBundle:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    def path(self, name: str) -> Path:
        return self.staging / name

    def commit(
        self,
        *,
        csvs: dict[str, pd.DataFrame],
        config: dict[str, Any],
        report_html: str,
        extra_files: dict[str, str] | None = None,
    ) -> list[Path]:
        texts: dict[str, str] = {}
        for name, frame in csvs.items():
            buf = io.StringIO()
            frame.to_csv(buf, index=False, float_format="%.6g")
            texts[name] = buf.getvalue()
        texts["config.json"] = json.dumps(config, indent=2) + "\n"
        texts["report.html"] = report_html
        texts.update(extra_files or {})
        exists = self.folder.exists()
        if exists:
            check_output_path(self.folder, "--output", kind="folder")
        try:  # a failure names the output folder, never the staging folder beside it
            for name, text in texts.items():
                (self.staging / name).write_text(text, newline="")
            names = sorted(p.name for p in self.staging.iterdir())
            for name in names:
                os.chmod(self.staging / name, 0o644)
            if not exists:
                os.chmod(self.staging, 0o755)
                os.replace(self.staging, self.folder)  # one rename: the whole bundle at once
            else:
                for name in names:
                    os.replace(self.staging / name, self.folder / name)
        except OSError as exc:
            raise cannot_write(self.folder, exc) from None
        return [self.folder / n for n in names]


def write_output_dir(
    folder: Path,
    *,
    csvs: dict[str, pd.DataFrame],
    config: dict[str, Any],
    report_html: str,
    extra_files: dict[str, str] | None = None,
) -> list[Path]:
    """Write ``csvs`` (name -> frame), ``config.json`` and ``report.html`` into ``folder``
    (see :class:`StagedBundle`); returns the written paths. The folder's parent must
    exist; the folder itself is created."""
    with StagedBundle(folder) as bundle:
        return bundle.commit(
            csvs=csvs, config=config, report_html=report_html, extra_files=extra_files
        )


def cli_inputs() -> dict[str, Any]:
    """Every option of the running command after defaults (its click context's params),
    after the root's global options (``--debug``, ``--quiet``). Groups in between (e.g.
    ``predict``'s batch options under ``predict gemm``) are left out: their options were
    not part of this command."""
    try:  # typer >= 0.29 vendors click; earlier releases run on click itself
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return {}
    root = ctx.find_root()
    params: dict[str, Any] = dict(root.params) if root is not ctx else {}
    params.update(ctx.params)
    params.pop("version", None)
    return _jsonable(params)


def check_output_path(path: Path | None, option: str = "--output", kind: str = "auto") -> None:
    """Fail before any work when an output cannot be written, so no output is partial:
    a missing parent folder, an existing file where a folder is meant, or a folder where
    a file is meant. ``kind``: ``auto`` (a folder unless the name ends in .csv/.json),
    ``folder`` or ``file``."""
    if path is None:
        return
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OSError(
            f"{option} {path}: parent folder {parent} does not exist; allowed: a path in "
            "an existing folder"
        )
    folder = kind == "folder" or (kind == "auto" and output_is_dir(path))
    if folder and path.exists() and not path.is_dir():
        allowed = "a folder" if kind == "folder" else "a folder, or a name ending in .csv/.json"
        raise OSError(f"{option} {path} is an existing file; allowed: {allowed}")
    if not folder and path.is_dir():
        raise OSError(f"{option} {path} is a folder; allowed: a file name")
