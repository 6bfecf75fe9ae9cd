"""Pattern strings: :func:`parse_pattern` (syntax in :data:`SYNTAX` and the package
docstring)."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import ValidationError

from workloads.sparsity.basic import (
    CausalPattern,
    ChunkPattern,
    DensePattern,
    Pattern,
    WindowPattern,
)
from workloads.sparsity.errors import SparsityError
from workloads.sparsity.hybrid import HybridPattern
from workloads.sparsity.nsa import NSAPattern
from workloads.sparsity.s2 import S2Pattern
from workloads.sparsity.topk import AdaSpaPattern, SALEPattern, TopKPattern

SYNTAX: dict[str, str] = {
    "dense": "dense",
    "causal": "causal",
    "window": "window:W[:sinks=S]",
    "chunk": "chunk:C",
    "topk": "topk:density=D|k=K[,block=B][:per_head]",
    "s2": "s2:local=L,stride=S[,block=B]",
    "nsa": "nsa[:l=32,d=16,lsel=64,n=16,w=512,local=2]",
    "sale": "sale:density=D[,est_bits=4,block=B]",
    "adaspa": "adaspa:search_every=N,density=D[,spread=S,block=B]",
    "hybrid": "hybrid:dense_every=K|dense_fraction=F,inner=PATTERN",
}
ALLOWED = ", ".join(SYNTAX.values())

_CLASSES: dict[str, type[Pattern]] = {
    "dense": DensePattern,
    "causal": CausalPattern,
    "window": WindowPattern,
    "chunk": ChunkPattern,
    "topk": TopKPattern,
    "s2": S2Pattern,
    "nsa": NSAPattern,
    "sale": SALEPattern,
    "adaspa": AdaSpaPattern,
    "hybrid": HybridPattern,
}


# per kind: parameter -> type ("int", "float", "flag"); window's bare first value is W
_PARAMS: dict[str, dict[str, str]] = {
    "dense": {},
    "causal": {},
    "window": {"window": "int", "w": "int", "sinks": "int"},
    "chunk": {"chunk": "int"},
    "topk": {"density": "float", "k": "int", "block": "int", "per_head": "flag"},
    "s2": {"local": "int", "stride": "int", "block": "int"},
    "nsa": {"l": "int", "d": "int", "lsel": "int", "n": "int", "w": "int", "local": "int"},
    "sale": {"density": "float", "est_bits": "int", "block": "int"},
    "adaspa": {"search_every": "int", "density": "float", "spread": "float", "block": "int"},
    "hybrid": {"dense_every": "int", "dense_fraction": "float"},
}


def _bad(text: str, kind: str, what: str) -> SparsityError:
    return SparsityError(f"bad sparsity pattern {text!r}: {what}; allowed: {SYNTAX[kind]}")


def _value(text: str, kind: str, name: str, raw: str, typ: str) -> int | float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise _bad(text, kind, f"{name}={raw!r} is not a number")
    if typ == "int":
        if not value.is_integer():
            raise _bad(text, kind, f"{name}={raw!r} is not an integer")
        return int(value)
    return value


def parse_pattern(text: str) -> Pattern:
    """Parse a pattern string (syntax: :mod:`workloads.sparsity`); any problem is one
    :class:`SparsityError` line naming the value and the valid choices."""
    if not isinstance(text, str) or not text.strip():
        raise SparsityError(f"empty sparsity pattern; allowed: {ALLOWED}")
    raw = text.strip()
    kind, sep, rest = raw.partition(":")
    kind = kind.strip().lower()
    if kind not in _CLASSES:
        raise SparsityError(f"unknown sparsity pattern {raw!r}; allowed: {ALLOWED}")
    fields: dict[str, Any] = {}
    inner_text = None
    if kind == "hybrid":
        head, found, inner_text = rest.partition("inner=")
        if not found or not inner_text.strip():
            raise _bad(raw, kind, "inner=PATTERN is missing")
        rest = head.rstrip(",: ")
    tokens = [t.strip() for t in re.split(r"[,:]", rest)] if sep and rest.strip() else []
    spec = _PARAMS[kind]
    for pos, token in enumerate(tokens):
        if not token:
            raise _bad(raw, kind, "empty parameter")
        name, eq, value = (s.strip() for s in token.partition("="))
        if not eq:
            if kind in ("window", "chunk") and pos == 0:
                name, value = kind, token
            elif spec.get(name) == "flag":
                value = "1"
            else:
                allowed = ", ".join(spec) or "no parameters"
                raise _bad(raw, kind, f"{token!r} is not NAME=VALUE ({kind} takes {allowed})")
        name = "window" if (kind == "window" and name == "w") else name
        if name not in spec:
            allowed = ", ".join(spec) or "no parameters"
            raise _bad(raw, kind, f"unknown parameter {name!r} ({kind} takes {allowed})")
        if name in fields:
            raise _bad(raw, kind, f"{name} given twice")
        if spec[name] == "flag":
            if eq and value.lower() not in ("1", "true", "yes"):
                raise _bad(raw, kind, f"{name} is a flag (write :{name})")
            fields[name] = True
        else:
            fields[name] = _value(raw, kind, name, value, spec[name])
    if inner_text is not None:
        try:
            fields["inner"] = parse_pattern(inner_text)
        except SparsityError as exc:
            raise SparsityError(f"bad inner pattern of {raw!r}: {exc}") from None
        if isinstance(fields["inner"], HybridPattern):
            raise _bad(raw, kind, "inner cannot be another hybrid")
    try:
        return _CLASSES[kind](**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        what = f"{where}={err['input']!r}: {msg}" if where else msg
        raise _bad(raw, kind, what) from None
