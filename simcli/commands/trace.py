"""``simcli trace import``: a profiler trace of a real step against simcli's prediction.

Parses the command line, resolves the trace config (:func:`~simcli.scenario.trace.
resolve_trace`), reads, measures and prices (:func:`~simcli.scenario.trace.run_trace`) and
emits; ``--output DIR`` writes the CSVs, ``result.json``, ``config.json`` and
``report.html`` all at once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import typer

from simcli.errors import user_errors
from simcli.options import SimcliGroup
from simcli.output import (
    Format,
    atomic_write_csv,
    atomic_write_json,
    emit_object,
    emit_records,
    jsonable,
)
from simcli.reports.bundle import (
    check_output_path,
    cli_inputs,
    config_document,
    output_is_dir,
    write_output_dir,
)
from simcli.scenario.trace import TraceRun, resolve_trace, run_trace

app = typer.Typer(
    cls=SimcliGroup,
    help="Profiler traces of real steps against simcli's prediction.",
    no_args_is_help=True,
)


@app.command("import")
def import_trace(
    trace: Path = typer.Argument(
        ..., help="torch.profiler trace (Kineto/Chrome JSON, export_chrome_trace), .json or .gz."
    ),
    config: Path = typer.Option(
        ...,
        "--config",
        help="YAML/JSON file stating the traced workload: kind (train|prefill|decode), model, "
        "gpu, engine, precision, shapes, step_marker, phase_markers.",
    ),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU id; overrides the config's gpu."),
    profile: Path | None = typer.Option(None, "--profile", help="Calibration profile (JSON)."),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Folder for the CSVs (classes, gaps, steps, phases, unmatched, kernels), "
        "result.json, config.json and report.html; a .json or .csv name writes just the "
        "result object or the per-class rows.",
    ),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Predicted vs measured ms per op class, unmatched kernels, idle gaps, step error.

    Gaps: host-bound, exposed communication, pipeline wait, other (see README: Trace
    import)."""
    with user_errors():
        inputs = cli_inputs()
        check_output_path(output, "--output")
        scenario = resolve_trace(trace, config, gpu=gpu, profile=profile)
        run = run_trace(scenario)
        if output is not None:
            _write_output(output, run, inputs)
        _emit(run, fmt)


def _emit(run: TraceRun, fmt: Format) -> None:
    if fmt == Format.json:
        emit_object(run.to_dict(), fmt)
        return
    if fmt == Format.csv:
        emit_records(run.class_records(), fmt)
        return
    emit_object({**run.summary(), **run.gaps_ms()}, fmt, title=run.scenario.title)
    emit_records(run.class_records(), fmt, title="per op class, ms per step")
    if run.result.phases.size:
        emit_records(run.phase_records(), fmt, title="per phase, ms per step")
    if len(run.result.unmatched):
        emit_records(run.unmatched_records()[:20], fmt, title="unmatched kernels (top 20)")
    for line in run.result.warnings:
        sys.stderr.write(f"warning: {line}\n")


def _write_output(path: Path, run: TraceRun, inputs: dict) -> None:
    """``--output``: a folder bundle, or the JSON object (.json) / per-class rows (.csv)."""
    out = run.to_dict()
    if not output_is_dir(path):
        if path.suffix.lower() == ".json":
            atomic_write_json(path, out)
        else:
            atomic_write_csv(pd.DataFrame(run.class_records()), path)
        return
    from simcli.reports import trace as trace_report

    csvs, page = trace_report.build(out, pd.DataFrame(run.kernel_records()))
    s = run.scenario
    resolved = {
        "workload": s.config.model_dump(mode="json"),
        "model": s.model.id,
        "gpu": s.hardware.gpu.model_dump(mode="json"),
        "cost_model": s.hardware.label,
    }
    config = config_document("trace import", inputs, resolved=resolved)
    result = json.dumps(jsonable(out), indent=2) + "\n"
    write_output_dir(
        path, csvs=csvs, config=config, report_html=page, extra_files={"result.json": result}
    )
