"""``simcli serve plan``: the cheapest serving deployment that meets latency SLOs.

A plain Typer command function (mounted by the CLI as ``serve plan``); the search is
:mod:`simcli.serving.planner`. Prints the ranked deployments: ``table`` for people,
``json`` one object with ``configs_evaluated``, ``simulations_run``, ``search_seconds``,
``notes`` and ``deployments``, ``csv`` one row per deployment.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd
import typer

from simcli.errors import fail, user_errors
from simcli.output import Format, atomic_write_json, atomic_write_text, emit_records
from simcli.progress import progress_bar, set_quiet
from simcli.reports import output_is_dir, write_output_dir
from simcli.reports.bundle import check_output_path, cli_inputs, config_document
from simcli.reports.serve import (
    DEPLOYMENTS_SCHEMA,
    EVALUATED_SCHEMA,
    frame,
    plan_report,
)
from simcli.serving.planner import (
    DEFAULT_GPUS,
    SLO,
    PlanError,
    PlanResult,
    PlanSpace,
    Workload,
    pd_weights,
    plan_deployments,
)
from simcli.serving.schedulers import SCHEDULERS
from workloads.lengths import parse_dist
from workloads.models import load_model

# Columns of the human table (JSON and CSV carry every field).
TABLE_COLUMNS = (
    "rank",
    "gpu",
    "tp",
    "replicas",
    "scheduler",
    "chunk_size",
    "pd_ratio",
    "gpus",
    "usd_per_hour",
    "usd_per_million_output_tokens",
    "slo_attainment",
    "ttft_s_p99",
    "tpot_s_p99",
    "e2e_s_p99",
)


def _list(text: str, option: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise PlanError(f"{option} {text!r} is empty; allowed: a comma list, e.g. a,b")
    return values


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in _list(text, option))
    except ValueError:
        raise PlanError(
            f"{option} {text!r} is not a comma list of integers; allowed: e.g. 1,2,4"
        ) from None
    if any(v < 1 for v in values):
        raise PlanError(f"{option} {text!r} has a value < 1; allowed: positive integers")
    return values


def _ratios(text: str) -> tuple[str | None, ...]:
    """``none,1:1,1:2`` -> (None, "1:1", "1:2"), each P:D checked."""
    out: list[str | None] = []
    for item in _list(text, "--pd-ratios"):
        if item.lower() in ("none", "0", "off"):
            out.append(None)
        else:
            pd_weights(item)
            out.append(item)
    return tuple(out)


def _prices(text: str | None) -> dict[str, float]:
    """``2.5`` (every GPU) or ``h100-sxm=2.5,h200-sxm=3.7`` (the rest from the table)."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for item in _list(text, "--price-per-gpu-hour"):
        gpu, sep, value = item.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not (price > 0 and math.isfinite(price)) or (sep and not gpu.strip()):
            raise PlanError(
                f"--price-per-gpu-hour {text!r} is invalid; allowed: a positive number for "
                "every GPU, or GPU=USD pairs such as h100-sxm=2.5,h200-sxm=3.7"
            )
        out[gpu.strip() if sep else "*"] = price
    return out


def _write(result: PlanResult, path: Path) -> None:
    """``--output``: CSV of the deployments for a .csv name, else the JSON object."""
    records = result.records()
    if path.suffix.lower() == ".csv":
        buf = io.StringIO()
        pd.DataFrame(records).to_csv(buf, index=False, float_format="%.6g")
        atomic_write_text(path, buf.getvalue())
    else:
        obj = {**result.summary(), "deployments": records}
        atomic_write_json(path, obj)


def _write_bundle(
    result: PlanResult,
    folder: Path,
    inputs: dict,
    space: PlanSpace,
    workload: Workload,
    slo: SLO,
) -> None:
    """``--output DIR``: plans.csv, deployments.csv, config.json, report.html."""
    summary = result.summary()
    evaluated = frame(result.evaluated(), EVALUATED_SCHEMA)
    deployments = frame(result.records(), DEPLOYMENTS_SCHEMA)
    html = plan_report(
        summary,
        deployments,
        evaluated,
        title=f"Serving plan: {result.model} at {workload.qps:g} qps",
    )
    resolved = {
        "model_id": result.model,
        "space": space,
        "workload": workload,
        "slo": slo,
        "usd_per_gpu_hour": result.prices,
        "cost_model": result.cost_model_labels,
    }
    write_output_dir(
        folder,
        csvs={"plans.csv": evaluated, "deployments.csv": deployments},
        config=config_document("serve plan", inputs, resolved=resolved),
        report_html=html,
    )


def serve_plan(
    model: str = typer.Option(..., "--model", help="Built-in model id or config.json."),
    gpu_types: str = typer.Option(
        ",".join(DEFAULT_GPUS),
        "--gpus-types",
        "--gpu-types",
        help="GPU ids to consider, comma-separated (see `simcli specs list`).",
    ),
    tp: str = typer.Option("1,2,4", "--tp", help="Tensor-parallel degrees to consider."),
    schedulers: str = typer.Option(
        "vllm,sarathi", "--schedulers", help="Schedulers to consider: vllm, orca, sarathi."
    ),
    chunk_sizes: str = typer.Option(
        "512,2048", "--chunk-sizes", help="Sarathi token budgets per iteration to consider."
    ),
    pd_ratios: str = typer.Option(
        "none,1:1,1:2",
        "--pd-ratios",
        help="Prefill:decode pool splits to consider (`simcli serve --disaggregate "
        "--pd-ratio`); none = prefill and decode on every replica.",
    ),
    qps: float = typer.Option(..., "--qps", help="Target arrival rate (requests/s)."),
    prompt_len: str = typer.Option(
        "lognormal:512:1:4096", "--prompt-len", help="Prompt length DIST (e.g. fixed:512)."
    ),
    output_len: str = typer.Option(
        "lognormal:128:1:2048", "--output-len", help="Output length DIST."
    ),
    num_requests: int = typer.Option(
        1000, "--num-requests", help="Requests simulated per probe (same ones every probe)."
    ),
    burstiness: float = typer.Option(
        1.0, "--burstiness", help="CV of inter-arrival gaps: 1 Poisson, >1 bursty (gamma)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of arrivals and lengths."),
    slo_ttft_s: float | None = typer.Option(None, "--slo-ttft-s", help="TTFT limit, seconds."),
    slo_tpot_s: float | None = typer.Option(None, "--slo-tpot-s", help="TPOT limit, seconds."),
    slo_e2e_s: float | None = typer.Option(
        None, "--slo-e2e-s", help="End-to-end latency limit, seconds."
    ),
    attainment: float = typer.Option(
        0.9,
        "--attainment",
        help="Fraction of requests that must meet every given limit (0.99: p99 targets).",
    ),
    max_replicas: int = typer.Option(64, "--max-replicas", help="Most replicas to consider."),
    max_batch_size: int = typer.Option(
        256, "--max-batch-size", help="Running sequences per replica (max_num_seqs)."
    ),
    top: int = typer.Option(5, "--top", help="How many deployments to return."),
    price: str | None = typer.Option(
        None,
        "--price-per-gpu-hour",
        help="US$ per GPU-hour: one number for all GPUs, or GPU=USD pairs "
        "(default: the price table).",
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Also write the result: CSV of deployments (.csv), JSON (.json), or any other "
        "name a folder with plans.csv (every deployment evaluated), deployments.csv, "
        "config.json and report.html.",
    ),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Cheapest deployments (GPU, TP, replicas, scheduler, chunk, P:D) meeting SLOs at --qps."""
    set_quiet(quiet)
    with user_errors():
        if output is not None:
            if output_is_dir(output):
                check_output_path(output, "--output", kind="folder")
            else:
                check_output_path(output, "--output", kind="file")
        if slo_ttft_s is None and slo_tpot_s is None and slo_e2e_s is None:
            raise fail(
                "no SLO given; allowed: at least one of --slo-ttft-s, --slo-tpot-s, --slo-e2e-s"
            )
        for flag, value in (
            ("--qps", qps),
            ("--slo-ttft-s", slo_ttft_s),
            ("--slo-tpot-s", slo_tpot_s),
            ("--slo-e2e-s", slo_e2e_s),
            ("--burstiness", burstiness),
            ("--num-requests", num_requests),
            ("--max-replicas", max_replicas),
            ("--max-batch-size", max_batch_size),
            ("--top", top),
        ):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise fail(f"{flag} {value} is invalid; allowed: a number > 0")
        if not 0 < attainment <= 1:
            raise fail(f"--attainment {attainment} is invalid; allowed: 0 < value <= 1")
        scheds = _list(schedulers, "--schedulers")
        for s in scheds:
            if s not in SCHEDULERS:
                raise fail(
                    f"unknown scheduler {s!r} in --schedulers; allowed: {', '.join(SCHEDULERS)}"
                )
        parse_dist(prompt_len)  # one-line LengthError before anything is built
        parse_dist(output_len)
        cfg = load_model(model)
        space = PlanSpace(
            gpus=_list(gpu_types, "--gpus-types"),
            tp=_ints(tp, "--tp"),
            schedulers=scheds,  # type: ignore[arg-type]
            chunk_sizes=_ints(chunk_sizes, "--chunk-sizes"),
            pd_ratios=_ratios(pd_ratios),
            max_replicas=max_replicas,
            max_batch_size=max_batch_size,
            prices=_prices(price),
        )
        workload = Workload(
            qps=qps,
            prompt_len=prompt_len,
            output_len=output_len,
            num_requests=num_requests,
            burstiness=burstiness,
            seed=seed,
        )
        slo = SLO(ttft_s=slo_ttft_s, tpot_s=slo_tpot_s, e2e_s=slo_e2e_s, attainment=attainment)
        with progress_bar("serve plan: configs", total=None) as advance:
            result = plan_deployments(cfg, workload, slo, space, top=top, progress=advance)
        if output is not None and output_is_dir(output):
            _write_bundle(result, output, cli_inputs(), space, workload, slo)
        elif output is not None:
            _write(result, output)
        records = result.records()
        summary = result.summary()
        if fmt == Format.table:
            best = records[0]
            title = (
                f"{cfg.id} at {qps:g} qps: {summary['configs_evaluated']} configs, "
                f"{summary['simulations_run']} simulations in {summary['search_seconds']:.2f} s; "
                f"cheapest {best['replicas']} x {best['tp']} {best['gpu']} "
                f"({best['scheduler']}) ${best['usd_per_hour']:.2f}/h"
            )
            emit_records([{c: r.get(c) for c in TABLE_COLUMNS} for r in records], fmt, title=title)
            for note in summary["notes"]:
                typer.echo(f"note: {note}", err=True)
        else:
            emit_records(records, fmt, json_wrapper=summary, json_key="deployments")
