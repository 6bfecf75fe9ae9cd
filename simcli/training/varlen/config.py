"""What ``simcli varlen`` simulates: :class:`VarlenConfig`, and its one-line error."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from workloads.lengths import LengthDist

Strategy = Literal["static", "hydraulis", "bytescale", "flexsp"]
STRATEGIES: tuple[str, ...] = ("static", "hydraulis", "bytescale", "flexsp")


class VarlenError(ValueError):
    """An impossible variable-length simulation; one line: what, the value, what is allowed."""


class VarlenConfig(BaseModel):
    """What ``simcli varlen`` simulates (the model, GPU and cost model come separately)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    lengths: LengthDist = Field(description="document-length distribution")
    num_gpus: int = Field(gt=0, description="GPUs in the job")
    tp: int = Field(default=1, gt=0, description="tensor-parallel degree of every replica")
    cp: int | None = Field(
        default=None, gt=0, description="static plan's CP degree; default: the smallest that fits"
    )
    seq_len: int | None = Field(
        default=None,
        gt=0,
        description="static context length; longer documents are split into seq_len pieces "
        "for every strategy; default: the distribution's maximum length",
    )
    tokens_per_step: int = Field(gt=0, description="tokens of documents per global batch")
    steps: int = Field(default=50, gt=0, le=100_000, description="steps simulated")
    seed: int = Field(default=0, ge=0, description="seed of the document sampler")
    strategies: tuple[Strategy, ...] = Field(default=STRATEGIES, min_length=1)
    recompute: Literal["none", "full"] = Field(
        default="none", description="full: keep only layer inputs, recompute the forward"
    )
    memory_fraction: float = Field(
        default=0.9, gt=0, le=1, description="share of GPU memory usable (allocator, context)"
    )
    attn_backend: str = Field(default="", description="attention kernel family ('' = default)")

    @model_validator(mode="after")
    def _check(self) -> VarlenConfig:
        if self.num_gpus % self.tp:
            raise ValueError(
                f"tp={self.tp} does not divide num_gpus={self.num_gpus}; allowed: divisors "
                f"of {self.num_gpus}"
            )
        if len(set(self.strategies)) != len(self.strategies):
            raise ValueError(f"strategies {list(self.strategies)} repeat; list each once")
        return self


def make_varlen_config(**fields: object) -> VarlenConfig:
    """Build a config; any problem is one :class:`VarlenError` line."""
    try:
        return VarlenConfig(**fields)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        got = err.get("input")
        shown = f" (got {got!r})" if where and not isinstance(got, dict | BaseModel) else ""
        raise VarlenError(f"{where}: {msg}{shown}" if where else msg) from None
