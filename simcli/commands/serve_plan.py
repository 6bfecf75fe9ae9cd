"""``simcli serve plan``: the cheapest serving deployment that meets latency SLOs.

A plain Typer command function (mounted by the CLI as ``serve plan``): it parses
(:class:`~simcli.scenario.serving.ServePlanOptions`), resolves the scenario, runs the
search (:mod:`simcli.serving.planner`, every candidate built as ``simcli serve`` builds a
deployment) and prints the ranked deployments: ``table`` for people, ``json`` one object
with ``configs_evaluated``, ``simulations_run``, ``search_seconds``, ``notes`` and
``deployments``, ``csv`` one row per deployment.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from simcli.errors import user_errors
from simcli.options import config_options
from simcli.output import Format, atomic_write_json, atomic_write_text, emit_records
from simcli.progress import progress_bar, set_quiet
from simcli.reports import output_is_dir, write_output_dir
from simcli.reports.bundle import check_output_path, cli_inputs, config_document
from simcli.scenario.serving_options import ServePlanOptions

# The search, pandas and the report renderer load when a run needs them, not for
# `simcli serve plan --help` (issue 18: start-up)
if TYPE_CHECKING:
    from simcli.scenario.serving import ServePlanScenario
    from simcli.serving.plan_result import PlanResult

# Columns of the human table (JSON and CSV carry every field), then per given limit the
# latency at the SLO's percentile (headed e.g. ttft_s_p90) and, when that is not p99, at p99.
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
    "slo_margin",
)


# A per-pool search (--prefill-gpu-types/--decode-gpu-types) adds each pool's GPU and count
# after ``gpu`` (then the prefill pool's GPU).
POOL_TABLE_COLUMNS = ("decode_gpu", "prefill_replicas", "decode_replicas")


def _table_rows(records: list[dict], slo: dict, percentile: str) -> list[dict]:
    """The table: TABLE_COLUMNS, then each given limit's metric at the SLO's percentile
    (what it is judged on) and at p99."""
    metrics = [k for k in ("ttft_s", "tpot_s", "e2e_s") if slo.get(k) is not None]
    columns = list(TABLE_COLUMNS)
    if any(r.get("decode_gpu") not in (None, r.get("gpu")) for r in records):
        at = columns.index("gpu") + 1
        columns[at:at] = POOL_TABLE_COLUMNS
    rows = []
    for r in records:
        row = {c: r.get(c) for c in columns}
        row |= {f"{k}_{percentile}": r.get(f"{k}_at_slo_percentile") for k in metrics}
        if percentile != "p99":
            row |= {f"{k}_p99": r.get(f"{k}_p99") for k in metrics}
        rows.append(row)
    return rows


def _write(result: PlanResult, path: Path) -> None:
    """``--output``: CSV of the deployments for a .csv name, else the JSON object."""
    import pandas as pd

    records = result.records()
    if path.suffix.lower() == ".csv":
        buf = io.StringIO()
        pd.DataFrame(records).to_csv(buf, index=False, float_format="%.6g")
        atomic_write_text(path, buf.getvalue())
    else:
        obj = {**result.summary(), "deployments": records}
        atomic_write_json(path, obj)


def _write_bundle(
    result: PlanResult, folder: Path, inputs: dict, scenario: ServePlanScenario
) -> None:
    """``--output DIR``: plans.csv, deployments.csv, config.json, report.html."""
    from simcli.reports.serve import DEPLOYMENTS_SCHEMA, EVALUATED_SCHEMA, frame, plan_report

    summary = result.summary()
    evaluated = frame(result.evaluated(), EVALUATED_SCHEMA)
    deployments = frame(result.records(), DEPLOYMENTS_SCHEMA)
    html = plan_report(
        summary,
        deployments,
        evaluated,
        title=f"Serving plan: {result.model} at {scenario.workload.qps:g} qps",
    )
    resolved = {
        "model_id": result.model,
        "space": scenario.space,
        "workload": scenario.workload,
        "slo": scenario.slo,
        "usd_per_gpu_hour": result.prices,
        "cost_model": result.cost_model_labels,
    }
    write_output_dir(
        folder,
        csvs={"plans.csv": evaluated, "deployments.csv": deployments},
        config=config_document("serve plan", inputs, resolved=resolved),
        report_html=html,
    )


def _emit(result: PlanResult, fmt: Format, scenario: ServePlanScenario) -> None:
    records = result.records()
    summary = result.summary()
    if fmt != Format.table:
        emit_records(records, fmt, json_wrapper=summary, json_key="deployments")
        return
    best = records[0]
    title = (
        f"{scenario.model.id} at {scenario.workload.qps:g} qps: "
        f"{summary['configs_evaluated']} configs, "
        f"{summary['simulations_run']} simulations in {summary['search_seconds']:.2f} s; "
        f"cheapest {_where(best)} "
        f"({best['scheduler']}) ${best['usd_per_hour']:.2f}/h; SLO: {scenario.slo.text()}"
    )
    rows = _table_rows(records, summary["slo"], summary["slo_percentile"])
    emit_records(rows, fmt, title=title)
    for note in summary["notes"]:
        typer.echo(f"note: {note}", err=True)


def _where(row: dict) -> str:
    """``3 x 1 h100-sxm``, or per pool ``1 x 1 h100-sxm + 2 x 1 a100-sxm-80gb``."""
    if row.get("decode_gpu") in (None, row["gpu"]):
        return f"{row['replicas']} x {row['tp']} {row['gpu']}"
    pre, dec = row["prefill_replicas"], row["decode_replicas"]
    return f"{pre} x {row['tp']} {row['gpu']} + {dec} x {row['tp']} {row['decode_gpu']}"


@config_options(ServePlanOptions)
def serve_plan(
    config: ServePlanOptions,
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
    from simcli.scenario.serving import resolve_serve_plan, run_serve_plan

    set_quiet(quiet)
    with user_errors():
        if output is not None:
            kind = "folder" if output_is_dir(output) else "file"
            check_output_path(output, "--output", kind=kind)
        scenario = resolve_serve_plan(config)
        with progress_bar("serve plan: configs", total=None) as advance:
            result = run_serve_plan(scenario, progress=advance)
        if output is not None and output_is_dir(output):
            _write_bundle(result, output, cli_inputs(), scenario)
        elif output is not None:
            _write(result, output)
        _emit(result, fmt, scenario)
