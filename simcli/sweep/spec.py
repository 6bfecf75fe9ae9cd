"""The sweep spec (YAML), validated, and its expansion into points.

```yaml
command: train                  # or plan, serve, serve plan, step, sparsity, predict gemm, ...
fixed: {model: llama3-8b, seq-len: 4096, global-batch: 64}
grid:                           # cartesian product (last name varies fastest)
  gpu: [h100-sxm, a100-sxm-80gb]
  tp: [1, 2, 4, 8]
  pp: [1, 2]
zip:                            # equal-length lists taken together, crossed with grid
  gpus: [8, 16]
  recompute: [selective, full]
points:                         # explicit extra points (fixed is merged in)
  - {gpu: h200-sxm, tp: 8, pp: 1, gpus: 8}
filters: ["tp * pp <= gpus"]    # a point is kept only if every filter is true
seed: 0                         # passed as --seed to commands that take one
```

Parameter names are the command's long option names (``global-batch`` or
``global_batch``); each is checked against the fields of the command's config (the options
the command line has), so a typo is one line naming the field, the bad name, the closest
option and the allowed names. Filters use a small expression language:
numbers, strings, parameter names (``-`` written ``_``), arithmetic, comparisons, ``and``
``or`` ``not``, ``in`` over a literal list, and ``min max abs`` -- nothing else is
evaluated.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import itertools
import json
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from simcli.sweep.errors import SweepError
from simcli.sweep.target import Target, normalise_name, resolve

Scalar = str | int | float | bool | None
Value = Scalar | list[Scalar]


class SweepSpec(BaseModel):
    """A sweep: one command, the parameter values to run it with, filters and a seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str
    grid: dict[str, list[Value]] = {}
    zip: dict[str, list[Value]] = {}
    points: list[dict[str, Value]] = []
    fixed: dict[str, Value] = {}
    filters: list[str] = []
    seed: int = 0

    @field_validator("filters", mode="before")
    @classmethod
    def _one_filter(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


FIELDS = tuple(SweepSpec.model_fields)


@dataclass(frozen=True)
class Point:
    seq: int  # position in the expansion (export order)
    point_id: str
    params: dict[str, Any]


def point_id(command: str, params: dict[str, Any]) -> str:
    """Stable identity: a hash of the command and the canonical JSON of the parameters."""
    text = json.dumps({"command": command, "params": params}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# -- loading -----------------------------------------------------------------------------
def _one_line(exc: ValidationError, where: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    got = err.get("input")
    got_text = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
    return f"{where}: {loc}: {err['msg']}{got_text}"


def parse_spec(data: Any, where: str = "spec") -> SweepSpec:
    """Validate a spec document (a mapping); SweepError with one clear line otherwise."""
    if not isinstance(data, dict):
        raise SweepError(f"{where}: a sweep spec is a mapping; allowed fields: {', '.join(FIELDS)}")
    for key in data:
        if key not in FIELDS:
            close = difflib.get_close_matches(str(key), FIELDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SweepError(f"{where}: unknown field {key!r}; {hint}allowed: {', '.join(FIELDS)}")
    if "command" not in data:
        raise SweepError(f"{where}: command: missing; allowed: e.g. train, plan, predict gemm")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SweepError(_one_line(exc, where)) from None
    check_spec(spec, where)
    return spec


def load_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep spec {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0]
        raise SweepError(f"sweep spec {path} is not valid YAML: {first}") from None
    return parse_spec(data, str(path))


def check_spec(spec: SweepSpec, where: str = "spec") -> Target:
    """Every name against the command's options; lists non-empty; zips equal; filters parse."""
    target = resolve(spec.command)
    seen: dict[str, str] = {}
    for section in ("grid", "zip", "fixed"):
        for name, values in getattr(spec, section).items():
            norm = target.check_name(name, f"{where}: {section}.{name}")
            if norm in seen:
                raise SweepError(
                    f"{where}: {section}.{name}: also set in {seen[norm]}; "
                    "allowed: each parameter in one of grid, zip, fixed"
                )
            seen[norm] = f"{section}.{name}"
            if section != "fixed" and not values:
                raise SweepError(
                    f"{where}: {section}.{name}: empty list; allowed: at least one value"
                )
    lengths = {name: len(v) for name, v in spec.zip.items()}
    if len(set(lengths.values())) > 1:
        text = ", ".join(f"{k}={n}" for k, n in lengths.items())
        raise SweepError(f"{where}: zip: lists of unequal length ({text}); allowed: equal lengths")
    for i, pt in enumerate(spec.points):
        for name in pt:
            target.check_name(name, f"{where}: points[{i}].{name}")
    if not spec.grid and not spec.zip and not spec.points:
        raise SweepError(
            f"{where}: no points: grid, zip and points are all empty; allowed: at least one of them"
        )
    for i, text in enumerate(spec.filters):
        compile_filter(text, f"{where}: filters[{i}]", target)
    return target


# -- filters ------------------------------------------------------------------------------
_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMP = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_FUNCS = {"min": min, "max": max, "abs": abs}
FILTER_SYNTAX = (
    "numbers, strings, parameter names (- written _), + - * / // % **, comparisons, "
    "and/or/not, in [list], min/max/abs"
)


@dataclass(frozen=True)
class Filter:
    text: str
    tree: ast.Expression
    names: frozenset[str]
    defaults: dict[str, Any]

    def __call__(self, params: dict[str, Any]) -> bool:
        env = {**self.defaults, **{k.replace("-", "_"): v for k, v in params.items()}}
        if self.names - env.keys():
            return False  # a name the point leaves unset and the command has no default for
        try:
            return bool(_eval(self.tree.body, env))
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
            raise SweepError(
                f"filter {self.text!r} failed on {params}: {type(exc).__name__}: {exc}"
            ) from None


def compile_filter(text: str, where: str, target: Target) -> Filter:
    known = {n.replace("-", "_") for n in target.options}
    defaults = {
        n.replace("-", "_"): o.default for n, o in target.options.items() if o.default is not None
    }
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise SweepError(
            f"{where}: {text!r} is not an expression ({exc.msg}); allowed: {FILTER_SYNTAX}"
        ) from None
    names: set[str] = set()
    for node in ast.walk(tree):
        ok = (
            isinstance(
                node,
                ast.Expression
                | ast.BoolOp
                | ast.And
                | ast.Or
                | ast.UnaryOp
                | ast.Not
                | ast.USub
                | ast.UAdd
                | ast.BinOp
                | ast.Compare
                | ast.Name
                | ast.Load
                | ast.Constant
                | ast.List
                | ast.Tuple
                | ast.Call
                | ast.IfExp,
            )
            or type(node) in _BIN
            or type(node) in _CMP
        )
        if isinstance(node, ast.Call):
            ok = isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords
        if not ok:
            raise SweepError(
                f"{where}: {text!r}: {type(node).__name__} is not allowed; allowed: {FILTER_SYNTAX}"
            )
        if isinstance(node, ast.Name) and node.id not in _FUNCS:
            names.add(node.id)
    for name in sorted(names):
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SweepError(
                f"{where}: {text!r}: unknown name {name!r}; {hint}allowed: "
                f"{', '.join(sorted(known))}"
            )
    return Filter(text, tree, frozenset(names), defaults)


def _eval(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_eval(e, env) for e in node.elts]
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, env) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}[
            type(node.op)
        ](v)
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Pow) and abs(b) > 64:
            raise ValueError("exponent too large")
        return _BIN[type(node.op)](a, b)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval(comp, env)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, ast.Call):
        return _FUNCS[node.func.id](*(_eval(a, env) for a in node.args))  # type: ignore[union-attr]
    raise ValueError(f"{type(node).__name__} is not allowed")


# -- expansion ----------------------------------------------------------------------------
def expand(spec: SweepSpec, where: str = "spec") -> list[Point]:
    """grid x zip (then explicit points), fixed merged in, seed added, filtered, deduplicated."""
    target = check_spec(spec, where)
    norm = {normalise_name(k): v for k, v in spec.fixed.items()}
    filters = [
        compile_filter(t, f"{where}: filters[{i}]", target) for i, t in enumerate(spec.filters)
    ]
    combos: list[dict[str, Any]] = []
    if spec.grid or spec.zip:
        gnames = [normalise_name(k) for k in spec.grid]
        znames = [normalise_name(k) for k in spec.zip]
        zipped = list(zip(*spec.zip.values(), strict=True)) if spec.zip else [()]
        for gvals in itertools.product(*spec.grid.values()):
            for zvals in zipped:
                combos.append(
                    {
                        **norm,
                        **dict(zip(gnames, gvals, strict=True)),
                        **dict(zip(znames, zvals, strict=True)),
                    }
                )
    for pt in spec.points:
        combos.append({**norm, **{normalise_name(k): v for k, v in pt.items()}})
    takes_seed = "seed" in target.options
    points: list[Point] = []
    seen: set[str] = set()
    for params in combos:
        if takes_seed and "seed" not in params:
            params["seed"] = spec.seed
        if not all(f(params) for f in filters):
            continue
        params = dict(sorted(params.items()))
        pid = point_id(target.command, params)
        if pid in seen:
            continue
        seen.add(pid)
        points.append(Point(len(points), pid, params))
    return points


def spec_document(spec: SweepSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json")
