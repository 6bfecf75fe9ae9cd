"""``simcli plan``: search parallel training plans and rank them by time or cost."""

import io
import math
import sys
from pathlib import Path

import pandas as pd
import typer

from hardware_specs.published import mfu_note
from simcli.errors import user_errors
from simcli.options import SimcliGroup, config_options
from simcli.output import Format, atomic_write_json, atomic_write_text, emit_records
from simcli.progress import progress_bar, set_quiet
from simcli.reports.bundle import (
    check_output_path,
    cli_inputs,
    config_document,
    output_is_dir,
    write_output_dir,
)
from simcli.scenario.training import PlanConfig, resolve_plan, run_plan
from simcli.training.search import SearchResult
from simcli.training.to_train import to_train_fields

app = typer.Typer(
    cls=SimcliGroup, help="Search parallel training plans (tp, pp, cp, dp, ZeRO, recompute, ...)."
)

# Columns of the human table (JSON and CSV carry every field).
TABLE_COLUMNS = (
    "rank",
    "num_gpus",
    "tp",
    "pp",
    "dp",
    "cp",
    "cp_kind",
    "tp_comm",
    "vpp",
    "zero",
    "micro_batch",
    "recompute",
    "sequence_parallel",
    "layer_split",
    "iteration_s",
    "tokens_per_s",
    "mfu",
    "peak_memory_gib",
    "cost_usd_per_iteration",
)


def _records(result: SearchResult, train_tokens: float | None = None) -> list[dict]:
    """The ranked plans; with ``train_tokens``, each one's days, GPU-hours and US$ to train."""
    out = []
    price = result.price_usd_per_gpu_hour
    for i, p in enumerate(result.plans):
        row = {"rank": i + 1, **p.record()}
        if train_tokens is not None:
            row |= to_train_fields(
                iteration_s=p.iteration_s,
                tokens_per_iteration=result.global_batch * result.seq_len,
                num_gpus=p.plan.num_gpus,
                usd_per_gpu_hour=None if math.isnan(price) else price,
                train_tokens=train_tokens,
            )
        out.append(row)
    return out


def _mfu_note(result: SearchResult, config: PlanConfig) -> str | None:
    """Why the best plan's MFU is above every published run on this GPU (None if not)."""
    best = result.plans[0]
    if config.precision == "fp8":
        return None  # fp8 MFU is against the fp8 peak; published ceilings are bf16
    return mfu_note(config.gpu, best.mfu, best.plan.num_gpus)


def _pareto(result: SearchResult) -> list[dict]:
    """The time / memory / cost front (closed-form times) as JSON records."""
    return [p.record() for p in result.pareto]


def _write(
    result: SearchResult,
    path: Path,
    inputs: dict,
    train_tokens: float | None = None,
    note: str | None = None,
) -> None:
    """``--output``: CSV of the plans for a .csv name, the JSON object for .json, else a
    folder with plans.csv, evaluated.csv, config.json and report.html."""
    records = _records(result, train_tokens)
    if output_is_dir(path):
        from simcli.reports import plan as plan_report

        csvs, page = plan_report.build(
            result.summary(), records, result.evaluated, [p.breakdown_s for p in result.plans],
            [p.record() for p in result.pareto],
        )  # fmt: skip
        resolved = {"summary": result.summary(), "best_plan": result.plans[0].plan}
        config = config_document("plan", inputs, resolved=resolved)
        write_output_dir(path, csvs=csvs, config=config, report_html=page)
        return
    if path.suffix.lower() == ".csv":
        buf = io.StringIO()
        pd.DataFrame(records).to_csv(buf, index=False, float_format="%.6g")
        atomic_write_text(path, buf.getvalue())
    else:
        obj = {**result.summary(), "plans": records, "pareto": _pareto(result)}
        obj["mfu_note"] = note
        atomic_write_json(path, obj)


@app.callback(invoke_without_command=True)
@config_options(PlanConfig)
def plan(
    config: PlanConfig,
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Also write the result: CSV of plans (.csv), JSON (.json), or a folder with "
        "plans.csv, pareto.csv (the time/memory/cost front), evaluated.csv (every plan "
        "tried), config.json and report.html.",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Ranked plans with the simulator's iteration time, MFU, memory and cost."""
    set_quiet(quiet)
    with user_errors():
        inputs = cli_inputs()
        check_output_path(output, "--output")
        scenario = resolve_plan(config)
        with progress_bar("plan search") as advance:
            collect = output is not None and output_is_dir(output)
            result = run_plan(scenario, collect=collect, progress=advance)
        if output is not None:
            _write(result, output, inputs, config.train_tokens, _mfu_note(result, config))
        records = _records(result, config.train_tokens)
        summary = result.summary()
        if fmt == Format.table:
            title = (
                f"{scenario.model.id} on {config.gpus} x {config.gpu}: "
                f"{summary['configs_evaluated']} plans evaluated "
                f"({summary['configs_fit']} fit) in {summary['search_seconds']:.2f} s, "
                f"best {records[0]['iteration_s']:.3f} s/iteration"
            )
            columns = TABLE_COLUMNS + (
                ("days_to_train", "cost_usd_to_train") if config.train_tokens else ()
            )
            rows = [{c: r.get(c) for c in columns} for r in records]
            emit_records(rows, fmt, title=title)
        else:
            if fmt == Format.json:
                summary["pareto"] = _pareto(result)
                summary["mfu_note"] = _mfu_note(result, config)
            emit_records(records, fmt, json_wrapper=summary, json_key="plans")
        note = _mfu_note(result, config)
        if note and not quiet:
            sys.stderr.write(f"note: the best plan's {note}\n")
