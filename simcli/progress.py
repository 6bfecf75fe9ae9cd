"""Progress of long work, on stderr: a bar for people watching a terminal, a periodic
plain line for logs.

Simulators below the CLI take a plain ``progress(done, total)`` callback so that they do
not depend on rich; this module turns such callbacks into a rich bar when stderr is a
terminal, and otherwise (pipes, CI logs, nohup) into one plain line every
:data:`LINE_EVERY_S` once the work has run that long, so long work is never silent and
logs stay free of control codes. ``--quiet`` silences both; stdout is never touched, so
``--format json`` stays machine-clean.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_state = {"quiet": False}

# A bar appears only once the work has run this long: short commands stay silent.
SHOW_AFTER_S = float(os.environ.get("SIMCLI_PROGRESS_AFTER_S", "1.0"))
# Without a terminal: a plain progress line at most this often, the first after this long.
LINE_EVERY_S = float(os.environ.get("SIMCLI_PROGRESS_EVERY_S", "10.0"))

Advance = Callable[..., None]


def set_quiet(flag: bool) -> None:
    if flag:
        _state["quiet"] = True


def quiet() -> bool:
    return _state["quiet"]


def _stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def enabled() -> bool:
    """True when a bar would be drawn: stderr is a terminal and not ``--quiet``."""
    return not _state["quiet"] and _stderr_is_tty()


class _Bar:
    """A rich bar created lazily after :data:`SHOW_AFTER_S`, so quick runs print nothing."""

    def __init__(self, label: str, total: float | None, fields: tuple[str, ...]) -> None:
        self.label, self.total, self.fields = label, total, fields
        self.done = 0.0
        self.extra: dict[str, object] = {f: 0 for f in fields}
        self.start = time.perf_counter()
        self._rich = None
        self._task = None

    def _open(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
        columns += [TextColumn(f"{f} {{task.fields[{f}]}}") for f in self.fields]
        columns += [TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
        self._rich = Progress(*columns, console=Console(stderr=True), transient=True)
        self._rich.start()
        self._task = self._rich.add_task(self.label, total=self.total, **self.extra)
        self._rich.update(self._task, completed=self.done)

    def __call__(self, done: float | None = None, total: float | None = None, **extra) -> None:
        """``bar(done, total)`` sets the position; ``bar()`` advances by one."""
        self.done = self.done + 1 if done is None else done
        if total is not None:
            self.total = total
        self.extra.update(extra)
        if self._rich is None:
            if time.perf_counter() - self.start < SHOW_AFTER_S:
                return
            self._open()
        self._rich.update(self._task, completed=self.done, total=self.total, **extra)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()


class _Lines:
    """The bar's stand-in without a terminal: ``label: done/total (pct), elapsed`` on
    stderr, at most every :data:`LINE_EVERY_S`."""

    def __init__(self, label: str, total: float | None) -> None:
        self.label, self.total, self.done = label, total, 0.0
        self.start = self.last = time.perf_counter()

    def __call__(self, done: float | None = None, total: float | None = None, **extra) -> None:
        self.done = self.done + 1 if done is None else done
        if total is not None:
            self.total = total
        now = time.perf_counter()
        if now - self.last < LINE_EVERY_S:
            return
        self.last = now
        of = f"/{self.total:g}" if self.total else ""
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        more = "".join(f", {k} {v}" for k, v in extra.items())
        print(f"{self.label}: {self.done:g}{of}{pct}{more}, {now - self.start:.0f} s elapsed",
              file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        return None


def _noop(done: float | None = None, total: float | None = None, **extra) -> None:
    return None


@contextmanager
def progress_bar(
    label: str, total: float | None = None, fields: tuple[str, ...] = ()
) -> Iterator[Advance]:
    """Yield ``advance(done=None, total=None, **fields)``; draws only when :func:`enabled`.

    ``fields`` are extra counters shown beside the bar (e.g. ``failed`` for sweeps).
    """
    if _state["quiet"]:
        yield _noop
        return
    bar: _Bar | _Lines = _Bar(label, total, fields) if _stderr_is_tty() else _Lines(label, total)
    try:
        yield bar
    finally:
        bar.close()
