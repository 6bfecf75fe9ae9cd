"""The simcli command a sweep point runs, and running it in-process.

A point runs the real CLI command through click, with ``--format json``, so a sweep point
means exactly what the same command line means. The spec's parameter names are the
command's long option names without the dashes (``global-batch``; ``global_batch`` is
accepted and normalised). Values become arguments:

- ``True`` / ``False`` on a ``--flag/--no-flag`` option: ``--flag`` / ``--no-flag``; on a
  plain flag: ``--flag`` / nothing;
- ``None``: the option is left out (the command's default);
- a list: one comma-joined value (``--seq-lens 8192,32768``), or the option repeated
  when the option takes several values;
- anything else: ``str(value)``.

The click tree is built once per process (``typer.main.get_command``) and reused, so the
cost model and catalog caches of a worker stay warm from point to point.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# Commands a sweep may name: these top-level commands and their subcommands.
TOP_LEVEL = ("train", "plan", "serve", "step", "sparsity", "predict")
# A short name for a group that only runs through one subcommand.
ALIASES = {"sparsity": "sparsity compare"}
# Options a spec may not set: the point's output format is always JSON.
RESERVED = {"format", "help"}


class SweepError(ValueError):
    """A bad sweep spec or store: one line naming the field, the value, what is allowed."""


@dataclass(frozen=True)
class OptionInfo:
    name: str  # spec name: the long option without dashes, e.g. "global-batch"
    flag: str  # "--global-batch"
    off_flag: str | None  # "--no-sequence-parallel" for --x/--no-x options
    is_flag: bool
    multiple: bool
    default: Any = None  # the command's default (plain values only), for filters


@dataclass(frozen=True)
class Target:
    """One runnable command: its path under ``simcli`` and its options by spec name."""

    command: str  # canonical: "train", "predict gemm", "sparsity compare"
    path: tuple[str, ...]
    options: dict[str, OptionInfo]

    def allowed(self) -> str:
        return ", ".join(sorted(self.options))

    def check_name(self, name: str, where: str) -> str:
        """The normalised name, or a SweepError naming the field and the allowed names."""
        norm = normalise_name(name)
        if norm in self.options:
            return norm
        close = difflib.get_close_matches(norm, list(self.options), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        reserved = " (a sweep always uses --format json)" if norm in RESERVED else ""
        raise SweepError(
            f"{where}: {name!r} is not an option of `simcli {self.command}`{reserved}; "
            f"{hint}allowed: {self.allowed()}"
        )

    def argv(self, params: dict[str, Any]) -> list[str]:
        """The command line of one point (after ``simcli``), ending in ``--format json``."""
        args = list(self.path)
        for name, value in params.items():
            opt = self.options[name]
            if value is None:
                continue
            if opt.is_flag:
                if isinstance(value, str):
                    value = value.strip().lower() in ("1", "true", "yes", "on")
                if value:
                    args.append(opt.flag)
                elif opt.off_flag:
                    args.append(opt.off_flag)
                continue
            if isinstance(value, list | tuple):
                if opt.multiple:
                    for v in value:
                        args += [opt.flag, _text(v)]
                    continue
                value = ",".join(_text(v) for v in value)
            args += [opt.flag, _text(value)]
        return [*args, "--format", "json"]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str):
        return getattr(value, "value", value)  # enums: their value
    return None


def normalise_name(name: str) -> str:
    return str(name).strip().lstrip("-").replace("_", "-")


@lru_cache(maxsize=1)
def root_command() -> Any:
    """simcli's click command tree (built once per process)."""
    import typer

    from simcli.cli import app

    return typer.main.get_command(app)


def _is_group(cmd: Any) -> bool:
    return hasattr(cmd, "commands")


def _runnable(cmd: Any) -> bool:
    return not _is_group(cmd) or bool(getattr(cmd, "invoke_without_command", False))


@lru_cache(maxsize=1)
def sweepable() -> dict[str, tuple[str, ...]]:
    """Command name -> click path, for every command a sweep may run."""
    root = root_command()
    out: dict[str, tuple[str, ...]] = {}
    for top in TOP_LEVEL:
        cmd = root.commands.get(top)
        if cmd is None:
            continue
        if _runnable(cmd):
            out[top] = (top,)
        for sub in getattr(cmd, "commands", {}):
            out[f"{top} {sub}"] = (top, sub)
    for alias, real in ALIASES.items():
        if alias not in out and real in out:
            out[alias] = out[real]
    return out


def _options(cmd: Any) -> dict[str, OptionInfo]:
    out: dict[str, OptionInfo] = {}
    for param in cmd.params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        longs = [o for o in param.opts if o.startswith("--")]
        if not longs:
            continue
        flag = longs[0]
        name = normalise_name(flag)
        if name in RESERVED:
            continue
        secondary = [o for o in getattr(param, "secondary_opts", []) if o.startswith("--")]
        out[name] = OptionInfo(
            name=name,
            flag=flag,
            off_flag=secondary[0] if secondary else None,
            is_flag=bool(getattr(param, "is_flag", False)),
            multiple=bool(getattr(param, "multiple", False)),
            default=_plain(getattr(param, "default", None)),
        )
    return out


@lru_cache(maxsize=64)
def resolve(command: str) -> Target:
    """The Target for a spec's ``command`` (e.g. ``train``, ``predict gemm``, ``sparsity``)."""
    name = " ".join(str(command).split())
    table = sweepable()
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise SweepError(
            f"command: {command!r} is not a command a sweep can run; {hint}"
            f"allowed: {', '.join(sorted(table))}"
        )
    path = table[name]
    cmd = root_command()
    for part in path:
        cmd = cmd.commands[part]
    canonical = " ".join(path)
    return Target(command=canonical, path=path, options=_options(cmd))


@dataclass
class Outcome:
    ok: bool
    outputs: dict[str, Any] | None
    error: str
    wall_s: float


def invoke(argv: list[str]) -> Outcome:
    """Run ``simcli ARGV`` in this process; JSON from stdout, the error line from stderr."""
    import typer

    root = root_command()
    out, err = io.StringIO(), io.StringIO()
    code = 0
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with root.make_context("simcli", list(argv)) as ctx:
                root.invoke(ctx)
        except typer.Exit as exc:
            code = exc.exit_code
        except SystemExit as exc:  # plain click's Exit / sys.exit
            code = exc.code if isinstance(exc.code, int) else 1
        except typer.Abort:
            code, _ = 1, err.write("error: aborted\n")
        except Exception as exc:
            message = getattr(exc, "format_message", None)
            text = message() if callable(message) else f"{type(exc).__name__}: {exc}"
            code = getattr(exc, "exit_code", 1) or 1
            err.write(f"error: {text}\n")
    wall_s = time.perf_counter() - start
    if code == 0:
        try:
            obj = json.loads(out.getvalue())
        except ValueError:
            return Outcome(False, None, "error: the command printed no JSON object", wall_s)
        if not isinstance(obj, dict):
            obj = {"result": obj}
        return Outcome(True, obj, "", wall_s)
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    error = lines[-1].strip() if lines else f"error: exit status {code}"
    for ln in lines:  # the one `error: ...` line, if the command printed others too
        if ln.startswith("error:"):
            error = ln.strip()
    return Outcome(False, None, error, wall_s)
