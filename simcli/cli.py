"""The ``simcli`` command line: a thin layer over specs, workloads and cost models.

Commands load on demand: ``simcli specs list`` imports ``simcli.commands.specs`` and what
it needs, never the serving simulator, the plan search or pandas. :data:`COMMANDS` names
each command's module (its ``app``, a ``typer.Typer``); :class:`LazyGroup` builds a
command's click group the first time it is looked up, exactly as ``app.add_typer(module.app,
name=...)`` would. ``simcli --help`` lists every command without importing any: each one's
help line is read from the ``help=`` of its module's ``app = typer.Typer(...)`` (the
source, parsed; a module whose help is not a literal string is imported instead).
Start-up figures: ``python benchmarks/cli_startup.py``.
"""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from simcli import __version__
from simcli.errors import set_debug
from simcli.progress import set_quiet

# command name -> module whose `app` it is, in the order `simcli --help` lists them
COMMANDS: dict[str, str] = {
    "specs": "simcli.commands.specs",
    "models": "simcli.commands.models",
    "predict": "simcli.commands.predict",
    "calibrate": "simcli.commands.calibrate",
    "train": "simcli.commands.train",
    "plan": "simcli.commands.plan",
    "varlen": "simcli.commands.varlen",
    "step": "simcli.commands.step",
    "serve": "simcli.commands.serve",
    "sparsity": "simcli.commands.sparsity",
    "sweep": "simcli.commands.sweep",
    "trace": "simcli.commands.trace",
}


@cache
def source_help(module: str) -> str | None:
    """The literal ``help=`` of ``app = typer.Typer(...)`` in ``module``'s source, without
    importing it; None when there is none or it is not a literal string."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        if [getattr(t, "id", None) for t in node.targets] != ["app"]:
            continue
        for kw in node.value.keywords:
            if kw.arg == "help":
                try:
                    value = ast.literal_eval(kw.value)
                except ValueError:
                    return None
                return value if isinstance(value, str) else None
    return None


@contextmanager
def _loading() -> Iterator[None]:
    """Import a command without the cyclic garbage collector, then freeze what was built.

    A command's modules leave tens of thousands of long-lived objects (pydantic schemas,
    numpy, the cost models); the collector would walk them again and again while they load
    (over a hundred passes for ``simcli predict``) and once more at exit, ~60 ms of its
    start-up. :func:`gc.freeze` moves them to the permanent generation, which collections
    skip; the command runs with the collector on, as before. Frozen once per process: the
    CLI loads one command, and a process that loads many (tests) goes on collecting what
    it builds afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            gc.freeze()
        if enabled:
            gc.enable()


class _Commands(Mapping):
    """A group's commands: the eager ones, then :data:`COMMANDS` loaded when first read."""

    def __init__(self, group: LazyGroup, eager: dict[str, Any]) -> None:
        self.group, self.eager = group, eager

    def __getitem__(self, name: str) -> Any:
        if name not in self.eager:
            if name not in COMMANDS:
                raise KeyError(name)
            self.eager[name] = self.group.load(name)
        return self.eager[name]

    def __setitem__(self, name: str, command: Any) -> None:  # click's add_command
        self.eager[name] = command

    def __contains__(self, name: object) -> bool:
        return name in self.eager or name in COMMANDS

    def __iter__(self) -> Iterator[str]:
        yield from self.eager
        yield from (n for n in COMMANDS if n not in self.eager)

    def __len__(self) -> int:
        return len(set(self.eager) | set(COMMANDS))


class LazyGroup(TyperGroup):
    """The root group: :data:`COMMANDS` built on first use (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands(self, dict(self.commands))  # type: ignore[assignment]
        self._listing = False

    def load(self, name: str) -> Any:
        from typer.main import get_group_from_info
        from typer.models import TyperInfo

        with _loading():
            sub = importlib.import_module(COMMANDS[name]).app
        return get_group_from_info(
            TyperInfo(sub, name=name),
            pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=app.rich_markup_mode,
            suggest_commands=app.suggest_commands,
        )

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # names only: TyperGroup's reads every command

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        commands: _Commands = self.commands  # type: ignore[assignment]
        if self._listing and cmd_name in COMMANDS and cmd_name not in commands.eager:
            text = source_help(COMMANDS[cmd_name])
            if text is not None:  # a stand-in that carries the help line only
                return typer.core.TyperCommand(name=cmd_name, help=text)
        return commands.get(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    # Root-level usage errors (`simcli --bogus`, `simcli nosuchcmd`) are one line too, as
    # below the root (SimcliGroup).
    def make_context(self, info_name: Any, args: list[str], *rest: Any, **kwargs: Any) -> Any:
        from simcli.errors import usage_errors

        if not args:  # no_args_is_help: the help, as the eager app prints it
            return super().make_context(info_name, args, *rest, **kwargs)
        with usage_errors():
            return super().make_context(info_name, args, *rest, **kwargs)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        from simcli.errors import usage_errors

        with usage_errors():
            return super().resolve_command(ctx, args)


app = typer.Typer(
    name="simcli",
    cls=LazyGroup,
    help="Predict LLM training, serving and kernel times on GPUs you have not rented yet.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(flag: bool) -> None:
    if flag:
        typer.echo(f"simcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    quiet: bool = typer.Option(
        False, "--quiet", help="No progress bars (they are drawn on stderr, on terminals only)."
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    set_debug(debug)
    set_quiet(quiet)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
