"""The load options of ``simcli serve`` and ``serve plan`` (as serving benchmarks generate
load: :mod:`simcli.serving.load`, :mod:`simcli.serving.traces`,
:data:`workloads.lengths.DATASETS`): their fields, shared by both commands' models, and the
checks of their combinations. Kept apart from :mod:`simcli.scenario.serving_options` so
that one stays a list of fields."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from simcli.scenario.config_base import MAX_REQUESTS, CommandConfig, count_field
from workloads.lengths import DATASETS, dataset

QPS_HELP = "Mean arrival rate, requests/s (inf: every request at t = 0, offline)"
# --gamma-shape k is vLLM's --burstiness (CV = 1 / sqrt(k)); serve's --burstiness (the CV)
# stops at 100, the same bound as a shape
MIN_GAMMA_SHAPE = 1e-4
TraceFormat = Literal["auto", "simcli", "azure", "mooncake", "burstgpt", "vidur", "csv"]
TimeUnit = Literal["s", "ms", "us", "datetime"]

LOAD_FIELDS: dict[str, Any] = {
    "serve_qps": lambda: Field(
        None,
        gt=0,
        description=f"{QPS_HELP}; with --trace: resample its lengths.",
        json_schema_extra={"allow_inf": True},
    ),
    "plan_qps": lambda: Field(
        gt=0,
        description="Target arrival rate, requests/s (inf: every request at t = 0).",
        json_schema_extra={"allow_inf": True},
    ),
    "qps_sweep": lambda: Field(
        None,
        description="Run once per arrival rate, comma-separated requests/s (inf allowed), "
        "e.g. 1,2,4,8,inf: one row per rate in the output (instead of --qps).",
    ),
    "max_concurrency": lambda: count_field(
        None,
        MAX_REQUESTS,
        "2^31 - 1",
        description="Closed loop: at most N requests in flight, the next sent when one "
        "completes (vllm bench serve --max-concurrency; with --qps inf: N clients back to "
        "back, as genai-perf --concurrency). Latencies count from the send.",
    ),
    "gamma_shape": lambda: Field(
        None,
        ge=MIN_GAMMA_SHAPE,
        description="Gamma shape k of the inter-arrival gaps, as vllm bench serve "
        "--burstiness (1 Poisson, < 1 burstier, > 1 smoother; CV = 1/sqrt(k)); instead "
        "of --burstiness, which is the CV.",
        json_schema_extra={"gt_why": "a CV of 100 already puts nearly every arrival in one burst"},
    ),
    "dataset": lambda: Field(
        None,
        description="Request lengths of a serving benchmark's dataset, input and output "
        "drawn together (their correlation kept): " + ", ".join(DATASETS) + "; sets "
        "--prompt-len/--output-len (docs/workloads.md).",
    ),
    "trace_format": lambda: Field(
        "auto",
        description="--trace layout: auto (by its header) | simcli | azure (Splitwise/Azure "
        "LLM inference) | mooncake (JSON lines) | burstgpt | vidur | csv (--trace-columns).",
    ),
    "trace_columns": lambda: Field(
        None,
        description="--trace-format csv: arrival=COL,prompt=COL,output=COL (arrival may be "
        "left out with --qps).",
    ),
    "trace_time_unit": lambda: Field(
        "s", description="--trace-format csv: unit of the arrival column: s | ms | us | datetime"
    ),
}


def load_lengths(cls: type, data: object) -> object:
    """``--dataset NAME``: both length DISTs of that dataset (one joint draw); an output
    DIST ``dataset:NAME`` means its output side. Runs before validation."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    name = out.get("dataset")
    if name is not None:
        dataset(name)  # one line listing the datasets
        for key in ("prompt_len", "output_len"):
            given = out.get(key)
            if given is not None and given != cls.model_fields[key].default:  # type: ignore[attr-defined]
                raise ValueError(
                    f"--dataset {name} sets --{key.replace('_', '-')} (given {given!r}); "
                    "allowed: one of the two"
                )
        out["prompt_len"] = f"dataset:{name.strip().lower()}:input"
        out["output_len"] = f"dataset:{name.strip().lower()}:output"
    ol = out.get("output_len")
    if isinstance(ol, str) and ol.strip().lower().startswith("dataset:") and ol.count(":") == 1:
        out["output_len"] = ol.strip() + ":output"
    return out


def check_load(o: Any) -> None:
    """The load flags together (one line each): one of --burstiness and --gamma-shape;
    the trace flags need --trace; --qps-sweep instead of --qps."""
    if getattr(o, "gamma_shape", None) is not None and getattr(o, "burstiness", 1.0) != 1.0:
        raise ValueError(
            "--gamma-shape (vLLM's --burstiness) and --burstiness (the CV) say the same "
            "thing; allowed: one of the two"
        )
    if getattr(o, "trace", None) is not None and getattr(o, "dataset", None) is not None:
        raise ValueError(
            f"--dataset {o.dataset} with --trace: the trace's own lengths are used; allowed: "
            "one of the two"
        )
    if hasattr(o, "trace") and o.trace is None:
        for flag, bad in (
            ("--trace-format", o.trace_format != "auto"),
            ("--trace-columns", o.trace_columns is not None),
            ("--trace-time-unit", o.trace_time_unit != "s"),
        ):
            if bad:
                raise ValueError(f"{flag} needs --trace FILE")
    if getattr(o, "qps_sweep", None) is not None:
        if o.qps is not None:
            raise ValueError("--qps-sweep replaces --qps; allowed: one of the two")
        parse_rates(o.qps_sweep, "--qps-sweep")


def gamma_cv(o: Any) -> float:
    """CV of the gamma gaps: ``--burstiness``, or ``1/sqrt(--gamma-shape)``."""
    shape = getattr(o, "gamma_shape", None)
    return 1.0 / math.sqrt(shape) if shape is not None else getattr(o, "burstiness", 1.0)


def parse_rates(text: str, flag: str) -> tuple[float, ...]:
    """``1,2,4,inf`` -> (1.0, 2.0, 4.0, inf): positive rates, requests/s."""
    out = []
    for item in text.split(","):
        try:
            v = float(item.strip())
        except ValueError:
            v = math.nan
        if not v > 0:
            raise ValueError(
                f"{flag} {text!r}: {item.strip()!r} is not a rate; allowed: positive numbers "
                "or inf, comma-separated (e.g. 1,2,4,inf)"
            )
        out.append(v)
    return tuple(out)


class LoadOptions(CommandConfig):
    """The base of ``serve``'s and ``serve plan``'s options: the checks and derived values
    of the load flags (the fields are declared in each, from :data:`LOAD_FIELDS`, so that
    ``--help`` lists them beside their neighbours)."""

    @model_validator(mode="before")
    @classmethod
    def _load_lengths(cls, data: object) -> object:
        return load_lengths(cls, data)

    @model_validator(mode="after")
    def _load_flags(self) -> LoadOptions:
        check_load(self)
        return self

    @property
    def arrival_cv(self) -> float:
        return gamma_cv(self)

    def sweep_rates(self) -> tuple[float, ...]:
        """``--qps-sweep`` as rates, requests/s (``inf`` allowed)."""
        return parse_rates(getattr(self, "qps_sweep", None) or "", "--qps-sweep")


__all__ = [
    "LOAD_FIELDS",
    "QPS_HELP",
    "LoadOptions",
    "check_load",
    "gamma_cv",
    "load_lengths",
    "parse_rates",
]
