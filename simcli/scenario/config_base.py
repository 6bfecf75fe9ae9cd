"""The base of the command configs (``simcli serve``, ``serve plan``, ``step``): every
field's bounds and choices checked first, as one line naming the flag, the value and what is
allowed (with why, for a bound that is not obvious), and the upper bounds of serving sizes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcli.options import allowed_range, check_value, option_flag
from workloads.lengths import parse_dist
from workloads.ops import MAX_TOKENS

# Upper bounds of serving sizes: far above any deployment, and what keeps a typo such as
# --replicas 1e20 from running for ever (the simulator keeps an object per replica).
MAX_REPLICAS = 65_536
MAX_GPUS_PER_STAGE = 1024
MAX_SEQS = 2**20
MAX_REQUESTS = 2**31 - 1
TOKENS_WHY = "2^24 tokens, beyond any model's context window"
REPLICAS_WHY = "more than any deployment"
SEQS_WHY = "2^20 sequences, far above any engine's max_num_seqs"


def tokens_field(default: Any, *, gt: int = 0, ge: int | None = None, **kw: Any) -> Any:
    """A per-sequence token count, at most :data:`workloads.ops.MAX_TOKENS`."""
    bounds = {"ge": ge} if ge is not None else {"gt": gt}
    extra = {"le_why": TOKENS_WHY, **kw.pop("json_schema_extra", {})}
    return Field(default, le=MAX_TOKENS, json_schema_extra=extra, **bounds, **kw)


def count_field(default: Any, limit: int, why: str, **kw: Any) -> Any:
    """A positive count with an upper bound said in the error."""
    return Field(default, gt=0, le=limit, json_schema_extra={"le_why": why}, **kw)


class CommandConfig(BaseModel):
    """Base of the command configs: frozen, no unknown fields, and every field's bounds and
    choices checked before pydantic's own validation, so that a bad value reads like the
    rest of simcli's errors (``unknown --scheduler 'fifo'; allowed: vllm, orca, sarathi``,
    ``--qps 0.0 is invalid; allowed: a number > 0``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _bounds_and_choices(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                if data.get(name) is not None:
                    check_value(name, field, data[name])
        return data


def check_dist(text: str) -> str:
    """A length DIST string, parsed once so that a bad one is one ``LengthError`` line."""
    parse_dist(text)
    return text


__all__ = [
    "MAX_GPUS_PER_STAGE",
    "MAX_REPLICAS",
    "MAX_REQUESTS",
    "MAX_SEQS",
    "REPLICAS_WHY",
    "SEQS_WHY",
    "TOKENS_WHY",
    "CommandConfig",
    "allowed_range",
    "check_dist",
    "check_value",
    "count_field",
    "option_flag",
    "tokens_field",
]
