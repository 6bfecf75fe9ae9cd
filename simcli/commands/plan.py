"""``simcli plan``: search parallel training plans and rank them by time or cost."""

import io
import sys
from pathlib import Path

import typer

from simcli.errors import user_errors
from simcli.options import SimcliGroup, config_options
from simcli.output import (
    Format,
    atomic_write_json,
    atomic_write_text,
    emit_object,
    emit_records,
)
from simcli.progress import progress_bar, set_quiet
from simcli.progress import quiet as progress_quiet
from simcli.reports.bundle import (
    check_output_path,
    cli_inputs,
    config_document,
    output_is_dir,
    write_output_dir,
)
from simcli.scenario.training import (
    PlanConfig,
    plan_object,
    resolve_plan,
    run_plan,
)
from simcli.training.search import SearchResult

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


def _write(result: SearchResult, path: Path, inputs: dict, obj: dict) -> None:
    """``--output``: CSV of the plans for a .csv name, the JSON object ``obj``
    (:func:`~simcli.scenario.training.plan_object`) for .json, else a folder with
    plans.csv, pareto.csv, evaluated.csv, config.json and report.html."""
    records = obj["plans"]
    if output_is_dir(path):
        from simcli.reports import plan as plan_report

        csvs, page = plan_report.build(
            result.summary(), records, result.evaluated, [p.breakdown_s for p in result.plans],
            obj["pareto"],
        )  # fmt: skip
        resolved = {"summary": result.summary(), "best_plan": result.plans[0].plan}
        config = config_document("plan", inputs, resolved=resolved)
        write_output_dir(path, csvs=csvs, config=config, report_html=page)
        return
    if path.suffix.lower() == ".csv":
        import pandas as pd

        buf = io.StringIO()
        pd.DataFrame(records).to_csv(buf, index=False, float_format="%.6g")
        atomic_write_text(path, buf.getvalue())
    else:
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
        obj = plan_object(result, config)
        if output is not None:
            _write(result, output, inputs, obj)
        records = obj["plans"]
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
        elif fmt == Format.json:
            emit_object(obj, fmt)
        else:
            emit_records(records, fmt)
        note = obj["mfu_note"]
        if note and not quiet and not progress_quiet():
            sys.stderr.write(f"note: the best plan's {note}\n")
