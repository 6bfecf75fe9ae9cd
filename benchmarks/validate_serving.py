"""`simcli serve` against published serving results of real engines (vLLM V0/V1, SGLang,
TensorRT-LLM on A100/H100/H200). Validation only: nothing of simcli is fitted on these
numbers (benchmarks/data/serving_published.yaml; its sources, mappings and exclusions are in
docs/serving_published.md).

Each row carries its own `simcli:` mapping (serve option -> value), so what is simulated is
data that can be reviewed; this script adds the request count (capped) and the seed, then
runs the row through the library exactly as `simcli serve` does (option validation with the
CLI's one-line errors, then the registered `serve` scenario). Rows whose options do not exist
yet (engines, closed-loop load and dataset lengths being added under issue 29) are listed as
not runnable with that one-line error.

Run:  python benchmarks/validate_serving.py [--format table|json|csv] [--rows GLOBS]
          [--jobs N] [--quick] [--stand-ins]
MAE here is the mean absolute percentage error, 100 * |predicted / published - 1|.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import io
import json
import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from costmodels.steps.serving_fidelity import FIDELITY_PATH, summarise

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = Path(__file__).resolve().parent / "data" / "serving_published.yaml"

Engine = Literal["vllm", "vllm-v0", "sglang", "trtllm", "trtllm-0.6"]
Metric = Literal[
    "ttft", "tpot", "itl", "e2e", "output_throughput", "total_throughput", "request_throughput"
]
Statistic = Literal["mean", "median", "p99", "total", "per_gpu"]
Unit = Literal["ms", "s", "tokens/s", "tokens/s/gpu", "requests/s"]

# metric -> class reported by this script; the latency classes are every class but throughput
METRIC_CLASS: dict[str, str] = {
    "ttft": "ttft",
    "tpot": "tpot_itl",
    "itl": "tpot_itl",
    "e2e": "e2e",
    "output_throughput": "throughput",
    "total_throughput": "throughput",
    "request_throughput": "throughput",
}
CLASSES = ("ttft", "tpot_itl", "e2e", "throughput")
LATENCY_CLASSES = ("ttft", "tpot_itl", "e2e")
# (metric, statistic) -> the key of `simcli serve --format json` (ITL is simcli's TBT: the
# gap between consecutive tokens of a request)
_LATENCY_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "tbt_s", "e2e": "e2e_s"}
_STAT_SUFFIX = {"mean": "mean", "median": "p50", "p99": "p99"}
_THROUGHPUT_KEYS = {
    "output_throughput": "throughput_tokens_per_s",
    "total_throughput": "total_tokens_per_s",
    "request_throughput": "throughput_requests_per_s",
}
# a published value in its unit times this is seconds or per-second (converted once, here)
UNIT_TO_SI: dict[str, float] = {
    "ms": 1e-3, "s": 1.0, "tokens/s": 1.0, "tokens/s/gpu": 1.0, "requests/s": 1.0,
}  # fmt: skip
_UNITS_OF = {
    "ttft": ("ms", "s"),
    "tpot": ("ms", "s"),
    "itl": ("ms", "s"),
    "e2e": ("ms", "s"),
    "output_throughput": ("tokens/s", "tokens/s/gpu"),
    "total_throughput": ("tokens/s", "tokens/s/gpu"),
    "request_throughput": ("requests/s",),
}
BEYOND_PCT = 25.0  # the bound for a single (not near-saturation) row


def output_key(metric: str, statistic: str) -> str:
    """The serve JSON key holding ``metric``'s ``statistic``; ValueError when it has none."""
    if metric in _LATENCY_KEYS:
        if statistic not in _STAT_SUFFIX:
            raise ValueError(f"{metric} {statistic!r}; allowed: mean, median, p99")
        return f"{_LATENCY_KEYS[metric]}_{_STAT_SUFFIX[statistic]}"
    if statistic not in ("total", "per_gpu"):
        raise ValueError(f"{metric} {statistic!r}; allowed: total, per_gpu")
    return _THROUGHPUT_KEYS[metric]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Load(_Frozen):
    """How requests arrive: all at once (offline), Poisson at a rate, a closed loop of
    ``concurrency`` outstanding requests, or static batches of ``concurrency``."""

    kind: Literal["offline", "poisson", "closed_loop", "static_batch"]
    rate_per_s: float | None = Field(None, gt=0)
    concurrency: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _needs(self) -> Load:
        if (self.kind == "poisson") != (self.rate_per_s is not None):
            raise ValueError("load: rate_per_s is for (and required by) kind poisson")
        needs_c = self.kind in ("closed_loop", "static_batch")
        if needs_c != (self.concurrency is not None):
            raise ValueError("load: concurrency is for (and required by) closed_loop/static_batch")
        return self


class Row(_Frozen):
    """One published number and the full configuration it was measured under."""

    id: str
    source: str
    engine: Engine
    engine_version: str
    engine_args: dict[str, Any] = {}
    gpu: str
    gpus: int = Field(gt=0)
    tp: int = Field(gt=0)
    model: str
    model_as_published: str
    weights: str
    kv_cache: str
    dataset: str
    input_tokens: str
    output_tokens: str
    load: Load
    num_requests: int = Field(gt=0)
    metric: Metric
    statistic: Statistic
    value: float = Field(gt=0)
    unit: Unit
    near_saturation: bool
    flags: list[str] = []
    note: str | None = None
    simcli: dict[str, Any]

    @model_validator(mode="after")
    def _consistent(self) -> Row:
        output_key(self.metric, self.statistic)
        if self.unit not in _UNITS_OF[self.metric]:
            raise ValueError(
                f"{self.id}: unit {self.unit!r} for {self.metric}; "
                f"allowed: {', '.join(_UNITS_OF[self.metric])}"
            )
        if (self.statistic == "per_gpu") != (self.unit == "tokens/s/gpu"):
            raise ValueError(f"{self.id}: statistic per_gpu goes with unit tokens/s/gpu")
        sim = self.simcli
        for key, want in (("model", self.model), ("gpu", self.gpu), ("tp", self.tp)):
            if sim.get(key, 1 if key == "tp" else None) != want:
                raise ValueError(
                    f"{self.id}: simcli {key} {sim.get(key)!r} is not the row's {want!r}"
                )
        if sim.get("engine", "vllm") != self.engine:
            raise ValueError(
                f"{self.id}: simcli engine {sim.get('engine')!r} is not {self.engine!r}"
            )
        if self.gpus != self.tp * sim.get("pp", 1) * sim.get("replicas", 1):
            raise ValueError(
                f"{self.id}: gpus {self.gpus} != tp x pp x replicas of its simcli options"
            )
        if "num_requests" in sim or "seed" in sim:
            raise ValueError(f"{self.id}: the runner sets num_requests and seed; not in simcli")
        return self

    @property
    def metric_class(self) -> str:
        return METRIC_CLASS[self.metric]


class Source(_Frozen):
    url: str
    title: str
    date: str
    note: str


class Excluded(_Frozen):
    source: str
    reason: str


class Published(_Frozen):
    """The whole file: sources, the request cap, the quick subset, the stand-ins of
    ``--stand-ins``, the excluded rows and the rows."""

    request_cap: int = Field(gt=0)
    seed: int = Field(ge=0)
    sources: dict[str, Source]
    quick: list[str]
    stand_ins: dict[str, dict[str, Any]]
    excluded: list[Excluded]
    rows: list[Row]

    @model_validator(mode="after")
    def _references(self) -> Published:
        ids = [r.id for r in self.rows]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate row ids: {', '.join(dup)}")
        for r in self.rows:
            if r.source not in self.sources:
                raise ValueError(
                    f"{r.id}: unknown source {r.source!r}; allowed: {', '.join(self.sources)}"
                )
        missing = sorted(set(self.quick) - set(ids))
        if missing:
            raise ValueError(f"quick rows not in rows: {', '.join(missing)}")
        return self


def load_published(path: Path = PUBLISHED) -> Published:
    return Published.model_validate(yaml.safe_load(path.read_text()))


def serve_values(
    row: Row, request_cap: int, seed: int, stand_ins: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The `simcli serve` options of ``row``: its own mapping, num_requests capped at
    ``request_cap``, the seed; with ``stand_ins``, and only when simcli refuses the row's
    own options, today's stand-ins for the published values they name."""
    values = _typed({**row.simcli, "num_requests": min(row.num_requests, request_cap)})
    values["seed"] = seed
    if not stand_ins or _accepted(values):
        return values
    subbed = dict(values)
    for option, table in stand_ins.items():
        key = "inf" if subbed.get(option) == math.inf else str(subbed.get(option))
        if option in subbed and key in table:
            subbed[option] = table[key]
    return _typed(subbed)


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    # typed as the command line types them (click reads `--qps inf` as a float), so that
    # the same checks apply: YAML's plain `inf` is a string
    return {k: math.inf if v == "inf" else v for k, v in values.items()}


def _accepted(values: dict[str, Any]) -> bool:
    from simcli.options import validate
    from simcli.scenario.serving_options import ServeOptions

    try:
        validate(ServeOptions, values)
    except ValueError:
        return False
    return True


def one_line(exc: BaseException) -> str:
    """The first line of an error; a pydantic error as ``where: message``."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        return f"{where}: {msg}" if where else msg
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def simulate(values: dict[str, Any]) -> dict[str, Any]:
    """What `simcli serve ... --format json` prints for these options (same validation, same
    scenario function); ValueError with the CLI's one-line message for a bad option."""
    from simcli.options import validate
    from simcli.scenario.registry import scenario_command
    from simcli.scenario.serving_options import ServeOptions

    config = validate(ServeOptions, values)
    config.require()
    return scenario_command("serve").run(config)


def predict_row(
    row: Row, values: dict[str, Any], run: Callable[[dict[str, Any]], dict[str, Any]] = simulate
) -> dict[str, Any]:
    """One row's result: published and predicted in SI units and the error in percent, or
    the one-line reason it cannot run."""
    out: dict[str, Any] = {
        "id": row.id,
        "source": row.source,
        "engine": row.engine,
        "gpu": row.gpu,
        "metric": row.metric,
        "statistic": row.statistic,
        "metric_class": row.metric_class,
        "near_saturation": row.near_saturation,
        "published": row.value * UNIT_TO_SI[row.unit],
        "unit_si": "s" if row.metric_class != "throughput" else row.unit.removesuffix("/gpu"),
        "predicted": None,
        "error_pct": None,
        "error": None,
    }
    start = time.perf_counter()
    try:
        result = run(values)
        value = result.get(output_key(row.metric, row.statistic))
        if value is None or not math.isfinite(value):
            raise ValueError(f"serve gave no {output_key(row.metric, row.statistic)}")
        if row.statistic == "per_gpu":
            value /= row.gpus
        out["predicted"] = value
        out["error_pct"] = 100.0 * (value / out["published"] - 1.0)
    except Exception as exc:  # one line per row: the run goes on
        out["error"] = one_line(exc)
    out["wall_s"] = time.perf_counter() - start
    return out


def _run_one(args: tuple[dict[str, Any], dict[str, Any], bool]) -> dict[str, Any]:
    row, values, stand_in = args
    return {**predict_row(Row.model_validate(row), values), "stand_in": stand_in}


def run_rows(
    rows: list[Row], published: Published, *, jobs: int = 1, stand_ins: bool = False
) -> list[dict[str, Any]]:
    subs = published.stand_ins if stand_ins else None
    work = []
    for r in rows:
        values = serve_values(r, published.request_cap, published.seed, subs)
        own = serve_values(r, published.request_cap, published.seed)
        work.append((r.model_dump(), values, values != own))
    if jobs <= 1:
        return [_run_one(w) for w in work]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_run_one, work))


# --------------------------------------------------------------------------- summaries


def mae(errors: Iterable[float]) -> float | None:
    """Mean absolute percentage error of signed errors in percent (None for none)."""
    values = [abs(e) for e in errors]
    return sum(values) / len(values) if values else None


def _group(results: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for r in results:
        groups[r[key]].append(r["error_pct"])
    return {k: _stats(v) for k, v in sorted(groups.items())}


def _stats(errors: list[float]) -> dict[str, Any]:
    return {
        "rows": len(errors),
        "mae_pct": mae(errors),
        "mean_signed_pct": sum(errors) / len(errors) if errors else None,
        "max_abs_pct": max((abs(e) for e in errors), default=None),
    }


def summarize(results: list[dict[str, Any]], worst: int = 10) -> dict[str, Any]:
    """MAE over runnable rows: near-saturation rows in their own section (kept, not in the
    main figures), by engine / metric class / GPU, the worst rows and the rows that cannot
    run yet."""
    ran = [r for r in results if r["error"] is None]
    main = [r for r in ran if not r["near_saturation"]]
    sat = [r for r in ran if r["near_saturation"]]
    latency = [r for r in main if r["metric_class"] in LATENCY_CLASSES]
    return {
        "rows": len(results),
        "runnable": len(ran),
        "not_runnable": len(results) - len(ran),
        "all": _stats([r["error_pct"] for r in main]),
        "latency": _stats([r["error_pct"] for r in latency]),
        "all_with_near_saturation": _stats([r["error_pct"] for r in ran]),
        "by_engine": _group(main, "engine"),
        "by_metric_class": _group(main, "metric_class"),
        "by_gpu": _group(main, "gpu"),
        "near_saturation": {
            **_stats([r["error_pct"] for r in sat]),
            "by_metric_class": _group(sat, "metric_class"),
        },
        "beyond_pct": BEYOND_PCT,
        "rows_beyond": [r["id"] for r in main if abs(r["error_pct"]) > BEYOND_PCT],
        "worst": [
            {k: r[k] for k in ("id", "error_pct", "near_saturation")}
            for r in sorted(ran, key=lambda r: -abs(r["error_pct"]))[:worst]
        ],
        "cannot_run": _errors(results),
    }


def _errors(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that cannot run, grouped by their error with numbers blanked (``max_concurrency
    1`` and ``max_concurrency 5`` are one reason); each group shows its first error."""
    groups: dict[str, tuple[str, list[str]]] = {}
    for r in results:
        if r["error"] is not None:
            key = re.sub(r"\d+(\.\d+)?", "N", r["error"])
            groups.setdefault(key, (r["error"], []))[1].append(r["id"])
    return [
        {"error": e, "rows": len(ids), "ids": ids}
        for e, ids in sorted(groups.values(), key=lambda g: -len(g[1]))
    ]


# --------------------------------------------------------------------------- output


def _pct(x: float | None) -> str:
    return "    -" if x is None else f"{x:5.1f}"


def _fmt_value(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    return f"{1e3 * x:.2f} ms" if unit == "s" else f"{x:,.1f} {unit}"


def table(results: list[dict[str, Any]], summary: dict[str, Any], stand_ins: bool) -> str:
    lines: list[str] = []
    add = lines.append
    if stand_ins:
        add("*** STAND-INS: today's options stand in for the ones being added (see the YAML's")
        add("*** stand_ins); a baseline to compare with after the merge, NOT the validation ***\n")
    add(f"{'row':58s} {'published':>18s} {'predicted':>18s} {'error':>7s}")
    for r in results:
        mark = " (near saturation)" if r["near_saturation"] else ""
        mark += " [stand-in]" if r.get("stand_in") else ""
        if r["error"] is None:
            add(
                f"{r['id']:58s} {_fmt_value(r['published'], r['unit_si']):>18s} "
                f"{_fmt_value(r['predicted'], r['unit_si']):>18s} {r['error_pct']:+6.1f}%{mark}"
            )
        else:
            add(
                f"{r['id']:58s} {_fmt_value(r['published'], r['unit_si']):>18s} {'cannot run':>18s}"
            )
    s = summary
    add(f"\nrows {s['rows']}, runnable {s['runnable']}, not runnable {s['not_runnable']}")
    add("MAE = mean |predicted / published - 1|, percent; near-saturation rows apart\n")
    add(f"{'group':28s} {'rows':>4s} {'MAE':>6s} {'signed':>7s} {'max':>6s}")

    def line(name: str, st: dict[str, Any]) -> None:
        signed = st["mean_signed_pct"]
        add(
            f"{name:28s} {st['rows']:4d} {_pct(st['mae_pct']):>6s} "
            f"{'    -' if signed is None else f'{signed:+6.1f}':>7s} {_pct(st['max_abs_pct']):>6s}"
        )

    line("all rows", s["all"])
    line("latency rows", s["latency"])
    for title, key in (("engine", "by_engine"), ("metric", "by_metric_class"), ("gpu", "by_gpu")):
        for name, st in s[key].items():
            line(f"  {title} {name}", st)
    line("near-saturation rows", s["near_saturation"])
    for name, st in s["near_saturation"]["by_metric_class"].items():
        line(f"  near-saturation {name}", st)
    line("all incl. near-saturation", s["all_with_near_saturation"])
    add(f"\nrows beyond {s['beyond_pct']:.0f}% (near-saturation apart): {len(s['rows_beyond'])}")
    add("worst rows:")
    for w in s["worst"]:
        mark = " (near saturation)" if w["near_saturation"] else ""
        add(f"  {w['id']:58s} {w['error_pct']:+7.1f}%{mark}")
    if s["cannot_run"]:
        add("\nrows that cannot run yet (one line each; grouped by the error):")
        for e in s["cannot_run"]:
            ids = ", ".join(e["ids"][:4]) + (f", ... ({e['rows']} rows)" if e["rows"] > 4 else "")
            add(f"  error: {e['error']}\n    {ids}")
    return "\n".join(lines)


CSV_COLUMNS = (
    "id", "source", "engine", "gpu", "metric", "statistic", "metric_class", "near_saturation",
    "published", "predicted", "unit_si", "error_pct", "error", "stand_in",
)  # fmt: skip


def to_csv(results: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(results)
    return buf.getvalue()


def select(published: Published, patterns: str | None, quick: bool) -> list[Row]:
    """Rows matching any comma-separated glob against id, source, engine, gpu or metric."""
    rows = published.rows
    if quick:
        keep = set(published.quick)
        rows = [r for r in rows if r.id in keep]
    if patterns:
        globs = [p.strip() for p in patterns.split(",") if p.strip()]
        rows = [
            r
            for r in rows
            if any(
                fnmatch.fnmatchcase(field, g)
                for g in globs
                for field in (r.id, r.source, r.engine, r.gpu, r.metric, r.metric_class)
            )
        ]
    return rows


def write_fidelity(path: Path, results: list[dict[str, Any]], published: Any) -> None:
    """The expected-error table (:mod:`costmodels.steps.serving_fidelity`) of ``results``,
    written atomically with the command and the rows it rests on."""
    ran = [r for r in results if r.get("error_pct") is not None]
    table = summarise(ran)
    table |= {
        "written_by": "python benchmarks/validate_serving.py --write-fidelity",
        "date": time.strftime("%Y-%m-%d"),
        "rows_run": len(ran),
        "rows_not_runnable": len(results) - len(ran),
        "near_saturation_rows_left_out": sum(1 for r in ran if r["near_saturation"]),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        "# MAPE of simcli serve against published results of real engines, per engine and\n"
        "# metric class (near-saturation rows left out); serving answers quote it as their\n"
        "# expected error. Regenerate, never edit: see the keys below.\n"
        + yaml.safe_dump(table, sort_keys=False)
    )
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table")
    parser.add_argument("--rows", help="comma-separated globs on id, source, engine, gpu, metric")
    parser.add_argument("--jobs", type=int, default=1, help="processes (the machine has 2 cores)")
    parser.add_argument("--quick", action="store_true", help="the YAML's small `quick` subset")
    parser.add_argument(
        "--stand-ins", action="store_true",
        help="replace options not in simcli yet by the YAML's stand-ins (a baseline, not "
        "the validation)",
    )  # fmt: skip
    parser.add_argument("--data", type=Path, default=PUBLISHED, help="the published-results YAML")
    parser.add_argument(
        "--write-fidelity", type=Path, nargs="?", const=FIDELITY_PATH, default=None,
        help="write the MAPE per engine and metric class that serving answers quote as their "
        f"expected error (default {FIDELITY_PATH.relative_to(ROOT)}; every row, no stand-ins)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.write_fidelity is not None and (args.stand_ins or args.rows or args.quick):
        sys.stderr.write("error: --write-fidelity takes every row, without stand-ins; allowed: "
                         "no --rows, --quick or --stand-ins with it\n")  # fmt: skip
        return 2
    if args.jobs < 1:
        sys.stderr.write(f"error: --jobs {args.jobs} is invalid; allowed: an integer >= 1\n")
        return 2
    try:
        published = load_published(args.data)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        sys.stderr.write(f"error: {args.data}: {one_line(exc)}\n")
        return 2
    rows = select(published, args.rows, args.quick)
    if not rows:
        sys.stderr.write(
            f"error: --rows {args.rows!r} matches no row; allowed: globs on id, source, "
            "engine, gpu or metric (e.g. 'sgl030-*', trtllm, h200-sxm)\n"
        )
        return 2
    start = time.perf_counter()
    results = run_rows(rows, published, jobs=args.jobs, stand_ins=args.stand_ins)
    summary = summarize(results)
    wall_s = time.perf_counter() - start
    if args.write_fidelity is not None:
        write_fidelity(args.write_fidelity, results, published)
    if args.format == "json":
        print(json.dumps({"stand_ins": args.stand_ins, "wall_s": wall_s, "summary": summary,
                          "results": results}, indent=1))  # fmt: skip
    elif args.format == "csv":
        sys.stdout.write(to_csv(results))
    else:
        print(table(results, summary, args.stand_ins))
        print(f"\n{len(rows)} rows in {wall_s:.1f} s with --jobs {args.jobs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
