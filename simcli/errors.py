"""One-line errors for users, tracebacks only with ``--debug``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer

try:  # typer >= 0.29 vendors click; earlier releases run on click itself
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import UsageError

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 1

_state = {"debug": False}


def set_debug(flag: bool) -> None:
    _state["debug"] = flag


def debug_enabled() -> bool:
    return _state["debug"]


def _one_line(exc: BaseException) -> str:
    from pydantic import ValidationError  # here, not for `simcli --help` (start-up)

    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        loc = ".".join(str(p) for p in err["loc"])
        if not loc:  # a model validator's own message (it names its fields)
            return msg
        got = (
            f" (got {err['input']!r})"
            if "input" in err and not isinstance(err["input"], dict)
            else ""
        )
        return f"{exc.title}: {loc}: {msg}{got}"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def usage_message(exc: BaseException) -> str:
    """A click/typer usage error (bad or missing option value, unknown option or command)
    as one line: its message without pydantic's ``Value error, `` prefix."""
    fmt = getattr(exc, "format_message", None)
    text = (fmt() if callable(fmt) else str(exc)).strip() or type(exc).__name__
    return " ".join(text.replace("Value error, ", "").split())


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Print ``error: message`` to stderr and return the Exit to raise."""
    sys.stderr.write(f"error: {message}\n")
    return typer.Exit(code)


@contextmanager
def usage_errors() -> Iterator[None]:
    """Click usage errors (a value that does not parse, ``--format xml``, a missing or
    unknown option) as one ``error: ...`` line and exit 2, like every other bad input,
    instead of click's or rich's multi-line usage box."""
    try:
        yield
    except UsageError as exc:
        if debug_enabled():
            raise
        raise fail(usage_message(exc)) from None


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn known failures into one line on stderr and a non-zero exit."""
    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except (ValueError, OSError, KeyError) as exc:
        if debug_enabled():
            raise
        raise fail(_one_line(exc)) from None
    except Exception as exc:  # a bug: still one line, and a way to see more
        if debug_enabled():
            raise
        raise fail(
            f"internal error ({type(exc).__name__}: {_one_line(exc)}); rerun with --debug",
            EXIT_INTERNAL,
        ) from None
