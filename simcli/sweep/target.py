"""What a sweep point runs: a results command as a library call, not a command line.

A spec's ``command`` names an entry of :data:`simcli.scenario.registry.COMMANDS` (``train``,
``predict gemm``, ``sparsity`` for ``sparsity compare``, ...): the pydantic config the
command's options come from and a function returning the JSON object that
``simcli <command> ... --format json`` prints. A point builds that config from its
parameters, with the validation the command line applies (:func:`simcli.options.validate`),
and calls the function, so it means exactly what the same command line means without
parsing argv or printing and re-reading JSON.

Parameter names are the commands' long option names without the dashes (``global-batch``;
``global_batch`` is accepted and normalised): one per config field, its first flag.
Values are taken as the command line takes them:

- ``True`` / ``False`` on a ``--flag/--no-flag`` option (strings ``true yes on 1`` are true);
- ``None``: the option is left out (the command's default);
- a list: one comma-joined value (``seq-lens: [8192, 32768]`` is ``--seq-lens 8192,32768``);
- numbers stay numbers for numeric options; anything else is its text (``str(value)``).

A point that fails is recorded with the one ``error: ...`` line the command prints (the
command's own :func:`~simcli.errors.user_errors` writes it). :meth:`Target.argv` gives the
equivalent command line, to reproduce a point by hand.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import time
import types
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import typer
from pydantic import BaseModel

from simcli.errors import user_errors
from simcli.options import flags, option_parameters, validate
from simcli.scenario.registry import (
    ScenarioCommand,
    UnknownCommand,
    command_names,
    scenario_command,
)
from simcli.sweep.errors import SweepError

# Options a spec may not set: a point's result is always the command's JSON object...
RESERVED = {"format", "help"}
# ...and the options that only say where a command writes its results are not parameters
OUTPUT_ONLY = {
    "output",
    "quiet",
    "trace",
    "trace-output",
    "trace-max-steps",
    "report-qps-points",
    "report-requests",
}
TRUE_TEXT = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class OptionInfo:
    name: str  # spec name: the long option without dashes, e.g. "global-batch"
    field: str  # the config field, e.g. "global_batch"
    flag: str  # "--global-batch"
    off_flag: str | None  # "--no-sequence-parallel" for --x/--no-x options
    is_flag: bool
    kind: Any  # what the command line reads: int, float, str, bool, Path (or X | None)
    required: bool = False
    default: Any = None  # the command's default (plain values only), for filters

    @property
    def numeric(self) -> bool:
        args = typing.get_args(self.kind) if isinstance(self.kind, types.UnionType) else ()
        return any(t in (int, float) for t in (self.kind, *args))


@dataclass
class Outcome:
    ok: bool
    outputs: dict[str, Any] | None  # the JSON object as the command prints it, decoded
    error: str
    wall_s: float
    outputs_json: str | None = None  # the same object encoded (compact), as stored


@dataclass(frozen=True)
class Target:
    """One runnable command: its name, its options by spec name, its library call."""

    command: str  # canonical: "train", "predict gemm", "sparsity compare"
    path: tuple[str, ...]
    options: dict[str, OptionInfo]
    scenario: ScenarioCommand

    def allowed(self) -> str:
        return ", ".join(sorted(self.options))

    def check_name(self, name: str, where: str) -> str:
        """The normalised name, or a SweepError naming the field and the allowed names."""
        norm = normalise_name(name)
        if norm in self.options:
            return norm
        close = difflib.get_close_matches(norm, list(self.options), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        why = ""
        if norm in RESERVED:
            why = " (a sweep always uses --format json)"
        elif norm in OUTPUT_ONLY:
            why = " (an output option: a sweep stores each point's JSON object)"
        raise SweepError(
            f"{where}: {name!r} is not an option of `simcli {self.command}`{why}; "
            f"{hint}allowed: {self.allowed()}"
        )

    def _option(self, name: str) -> OptionInfo:
        found = self.options.get(name)
        return found if found is not None else self.options[self.check_name(name, "params")]

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        """Config field -> value, as the command line would pass them (see the module doc).
        Names as in a spec (``global-batch`` or ``global_batch``)."""
        out: dict[str, Any] = {}
        for name, value in params.items():
            opt = self._option(name)
            if value is None:
                continue
            if opt.is_flag:
                if isinstance(value, str):
                    value = value.strip().lower() in TRUE_TEXT
                out[opt.field] = bool(value)
            elif isinstance(value, list | tuple):
                out[opt.field] = ",".join(_text(v) for v in value)
            elif opt.numeric and isinstance(value, int | float) and not isinstance(value, bool):
                out[opt.field] = value
            else:
                out[opt.field] = _text(value)
        return out

    def config(self, params: dict[str, Any]) -> BaseModel:
        """The command's config for a point; one ValueError line as the command gives."""
        values = self.values(params)
        for opt in self.options.values():
            if opt.required and opt.field not in values:
                raise ValueError(f"Missing option '{opt.flag}'.")
        return validate(self.scenario.config, values)

    def run(self, params: dict[str, Any]) -> Outcome:
        """The command's JSON object for a point, or its ``error: ...`` line."""
        out, err = io.StringIO(), io.StringIO()
        start = time.perf_counter()
        code: int | None = 0
        text = None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                with user_errors():
                    obj = self.scenario.run(self.config(params))
                    text = json.dumps(obj, separators=(",", ":"))  # fails as printing would
            except typer.Exit as exc:
                code = exc.exit_code
            except Exception as exc:  # with --debug user_errors re-raises; still one line
                first = (str(exc).strip().splitlines() or [""])[0]
                err.write(f"error: {type(exc).__name__}: {first}\n")
                code = 1
        wall_s = time.perf_counter() - start
        if text is not None and code == 0:
            return Outcome(True, json.loads(text), "", wall_s, text)
        lines = [ln.strip() for ln in err.getvalue().splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")]
        error = errors[-1] if errors else lines[-1] if lines else f"error: exit status {code}"
        return Outcome(False, None, error, wall_s)

    def argv(self, params: dict[str, Any]) -> list[str]:
        """The equivalent command line (after ``simcli``), ending in ``--format json``."""
        args = list(self.path)
        for name, value in params.items():
            opt = self._option(name)
            if value is None:
                continue
            if opt.is_flag:
                if isinstance(value, str):
                    value = value.strip().lower() in TRUE_TEXT
                if value:
                    args.append(opt.flag)
                elif opt.off_flag:
                    args.append(opt.off_flag)
                continue
            if isinstance(value, list | tuple):
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


def _options(model: type[BaseModel]) -> dict[str, OptionInfo]:
    """The config's fields as the command's options (flags as :mod:`simcli.options` makes
    them), by spec name."""
    out: dict[str, OptionInfo] = {}
    for param in option_parameters(model):
        field = model.model_fields[param.name]
        on, _, off = flags(param.name, field)[0].partition("/")
        is_flag = param.annotation in (bool, bool | None)
        if is_flag and not off:
            off = f"--no-{on[2:]}"
        name = normalise_name(on)
        if name in RESERVED:
            continue
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        out[name] = OptionInfo(
            name=name,
            field=param.name,
            flag=on,
            off_flag=off or None,
            is_flag=is_flag,
            kind=param.annotation,
            required=field.is_required(),
            default=_plain(default),
        )
    return out


@lru_cache(maxsize=64)
def resolve(command: str) -> Target:
    """The Target for a spec's ``command`` (e.g. ``train``, ``predict gemm``, ``sparsity``)."""
    try:
        scenario = scenario_command(command)
    except UnknownCommand:
        name = " ".join(str(command).split())
        names = command_names()
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise SweepError(
            f"command: {command!r} is not a command a sweep can run; {hint}"
            f"allowed: {', '.join(names)}"
        ) from None
    return Target(
        command=scenario.name,
        path=scenario.path,
        options=_options(scenario.config),
        scenario=scenario,
    )


__all__ = ["OptionInfo", "Outcome", "SweepError", "Target", "normalise_name", "resolve"]
