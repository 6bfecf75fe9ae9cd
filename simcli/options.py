"""CLI options generated from a pydantic config: one way to configure.

A command declares the pydantic model its inputs are (``TrainConfig``, ``ServeConfig``,
...); :func:`config_options` turns every field into a typer option (flag from the field
name or its ``cli`` alias list, type, default, help text from the description with the
allowed values of a ``Literal``), validates the values into the model, and hands the
command one frozen config. Help, JSON schema and validation then come from the same
fields and cannot drift. Options that are about output rather than the scenario
(``--format``, ``--output``, ``--quiet``) stay ordinary parameters of the command.

A field's ``json_schema_extra`` may carry ``cli``: the flag spellings (``["--gpu-types",
"--gpus-types"]``; the first is the canonical one), ``cli_type``: the type the command
line reads when it differs from the field's (a comma list parsed by a validator), and
``cli_hidden``: kept out of ``--help``; ``le_why`` / ``gt_why``: why an upper / lower bound
is what it is, said in the error (:func:`check_value`).
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import annotated_types
import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from typer.core import TyperGroup

from simcli.errors import usage_errors, user_errors
from simcli.progress import set_quiet

M = TypeVar("M", bound=BaseModel)


def literal_choices(annotation: Any) -> tuple[str, ...] | None:
    """The allowed values of a ``Literal`` (or ``Literal | None``) annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return tuple(str(a) for a in args)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for a in args:
            found = literal_choices(a)
            if found:
                return found
    return None


def _cli_type(field: FieldInfo) -> Any:
    """The Python type typer parses the option as."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "cli_type" in extra:
        return extra["cli_type"]
    ann = field.annotation
    optional = False
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        optional = len(args) < len(typing.get_args(ann))
        ann = args[0] if len(args) == 1 else str
    if typing.get_origin(ann) is Literal:
        values = typing.get_args(ann)
        ann = type(values[0]) if all(type(v) is type(values[0]) for v in values) else str
    if ann not in (int, float, str, bool, Path):
        ann = str
    return ann | None if optional else ann


def flags(name: str, field: FieldInfo) -> list[str]:
    """The option's spellings: the field's ``cli`` list, or ``--field-name``."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return list(extra.get("cli") or [f"--{name.replace('_', '-')}"])


def help_text(field: FieldInfo) -> str:
    """The description, with a Literal's allowed values appended when it does not list them."""
    text = (field.description or "").strip()
    choices = literal_choices(field.annotation)
    if choices and " | ".join(choices) not in text:
        text = f"{text} ({' | '.join(choices)})" if text else " | ".join(choices)
    return text


def option_parameters(model: type[BaseModel], exclude: tuple[str, ...] = ()) -> list[Any]:
    """One keyword-only ``inspect.Parameter`` with a ``typer.Option`` per field."""
    params = []
    for name, field in model.model_fields.items():
        if name in exclude:
            continue
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        cli_type = _cli_type(field)
        spellings = flags(name, field)
        if cli_type in (bool, bool | None) and "/" not in spellings[0]:
            spellings = [f"{spellings[0]}/--no-{spellings[0][2:]}", *spellings[1:]]
        default = ... if field.is_required() else field.get_default(call_default_factory=True)
        option = typer.Option(
            default, *spellings, help=help_text(field), hidden=bool(extra.get("cli_hidden"))
        )
        kind = inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(name, kind, default=option, annotation=cli_type))
    return params


def option_flag(name: str, field: FieldInfo) -> str:
    """The canonical spelling of a field's option (``--gpus-types`` of ``gpu_types``)."""
    return flags(name, field)[0].split("/")[0]


def _bounds(field: FieldInfo) -> tuple[float | None, bool, float | None, bool]:
    """(low, low is open, high, high is open) of a field's ``gt/ge/lt/le`` constraints."""
    lo = hi = None
    lo_open = hi_open = False
    for m in field.metadata:
        if isinstance(m, annotated_types.Gt):
            lo, lo_open = m.gt, True
        elif isinstance(m, annotated_types.Ge):
            lo, lo_open = m.ge, False
        elif isinstance(m, annotated_types.Lt):
            hi, hi_open = m.lt, True
        elif isinstance(m, annotated_types.Le):
            hi, hi_open = m.le, False
    return lo, lo_open, hi, hi_open  # type: ignore[return-value]


def _num(x: float) -> str:
    """A bound as written: whole numbers in full (16777216, not 1.67772e+07)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _is_int(field: FieldInfo) -> bool:
    """An ``int`` (or ``int | None``) field."""
    args = [a for a in typing.get_args(field.annotation) if a is not type(None)]
    return field.annotation is int or args == [int]


def allowed_range(field: FieldInfo) -> str | None:
    """``a number > 0``, ``0 < value <= 1``, ``1 to 1024`` (an integer field bounded on both
    sides), ... for a field with bounds (None without)."""
    lo, lo_open, hi, hi_open = _bounds(field)
    if lo is not None and hi is not None and _is_int(field):
        first = math.floor(lo) + 1 if lo_open else math.ceil(lo)
        last = math.ceil(hi) - 1 if hi_open else math.floor(hi)
        return f"{first} to {last}"
    low = None if lo is None else f"{_num(lo)} {'<' if lo_open else '<='}"
    high = None if hi is None else f"{'<' if hi_open else '<='} {_num(hi)}"
    if low and high:
        return f"{low} value {high}"
    if low:
        return f"a number {'>' if lo_open else '>='} {_num(lo)}"
    if high:
        return f"a number {high}"
    return None


def check_value(name: str, field: FieldInfo, value: Any) -> None:
    """A field's choices (``Literal``) and bounds, as simcli's one-line errors."""
    flag = option_flag(name, field)
    choices = literal_choices(field.annotation)
    if choices is not None:
        if str(value) not in choices:
            raise ValueError(f"unknown {flag} {value!r}; allowed: {', '.join(choices)}")
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    allowed = allowed_range(field)
    if allowed is None:
        return
    lo, lo_open, hi, hi_open = _bounds(field)
    low = lo is not None and (value <= lo if lo_open else value < lo)
    high = hi is not None and (value >= hi if hi_open else value > hi)
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    inf_ok = value == math.inf and extra.get("allow_inf")  # e.g. --qps inf: offline
    if low or high or not (math.isfinite(value) or inf_ok):
        why = extra.get("le_why" if high else "gt_why") if (low or high) else None
        because = f" ({why})" if why else ""
        raise ValueError(f"{flag} {value} is invalid; allowed: {allowed}{because}")


class OptionError(ValueError):
    """A command-line value its config rejects; one line naming the flag."""


def validate(model: type[M], values: dict[str, Any]) -> M:
    """``model.model_validate(values)`` with the first error as one line naming the flag
    (``--tp 0: Input should be greater than or equal to 1``)."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        field = model.model_fields.get(name)
        flag = flags(name, field)[0].split("/")[0] if field is not None else name
        got = values.get(name, err.get("input"))
        msg = err["msg"].removeprefix("Value error, ")
        extra = field.json_schema_extra if field is not None else None
        why = isinstance(extra, dict) and ("le_why" in extra or "gt_why" in extra)
        if why and name in values and err["type"] in BOUND_ERRORS:
            try:
                check_value(name, field, got)  # "--m 0 is invalid; allowed: 0 < value <= ..."
            except ValueError as bound:
                raise OptionError(str(bound)) from None
        raise OptionError(f"{flag} {got}: {msg}" if name in values else msg) from None


BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def config_options(
    model: type[M], *, exclude: tuple[str, ...] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate ``command(config: model, **other_options)``: the command's options become
    the model's fields (minus ``exclude``) followed by its own other parameters."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        # resolve string annotations (``from __future__ import annotations`` in the command's
        # module) here, where the command's globals are known: typer reads the wrapper's
        hints = typing.get_type_hints(command)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(command).parameters.values()
            if p.name != "config"
        ]
        fields = option_parameters(model, exclude)
        names = {p.name for p in fields}

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            values = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            with user_errors():
                config = validate(model, values)
            return command(config, **kwargs)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in (*fields, *own)]
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__
        return wrapper

    return decorate


# --------------------------------------------------------------------------- command groups

QUIET_HELP = "No progress bars (the same as `simcli --quiet ...`)."


def _quiet_callback(value: bool) -> bool:
    if value:
        set_quiet(True)
    return value


@functools.cache
def _quiet_template() -> Any:
    """typer's own ``--quiet`` flag (built through its public API, so it works on every
    typer release), not passed to the command function."""
    holder = typer.Typer()

    @holder.command()
    def _holder(
        quiet: bool = typer.Option(False, "--quiet", help=QUIET_HELP, callback=_quiet_callback),
    ) -> None:  # pragma: no cover (never run)
        pass

    return typer.main.get_command(holder).params[0]


def _quiet_option() -> Any:
    option = copy.copy(_quiet_template())
    option.expose_value = False  # handled by its callback: the command never sees it
    return option


def _has_option(command: Any, flag: str) -> bool:
    return any(flag in getattr(p, "opts", ()) for p in command.params)


class SimcliGroup(TyperGroup):
    """The click group of every ``simcli`` command (``typer.Typer(cls=SimcliGroup)``).

    - ``--quiet`` works after the command too (``simcli serve ... --quiet``): added to the
      group and to each of its commands that does not declare its own;
    - help is plain text: rich markup would eat ``[calibrate]`` and turn ``:A:`` in
      ``uniform:A:B`` into an emoji;
    - ``Usage:`` shows ``COMMAND [ARGS]...`` only where there are subcommands;
    - usage errors (a value that does not parse, ``--format xml``, a missing option) are one
      ``error: ...`` line and exit 2, as every other bad input (:func:`usage_errors`).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for command in (self, *self.commands.values()):
            if hasattr(command, "rich_markup_mode"):
                command.rich_markup_mode = None
            if not _has_option(command, "--quiet"):
                command.params.append(_quiet_option())

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        if not self.commands and pieces and pieces[-1] == self.subcommand_metavar:
            pieces.pop()
        return pieces

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with usage_errors():  # also the subcommand's parsing, done here
            return super().invoke(ctx)
