"""``simcli train``: time, throughput, MFU and memory of one training iteration.

Options are :class:`~simcli.scenario.training.TrainConfig`'s fields (plus where the
results go); the command parses, resolves the scenario, runs it and emits the result."""

import sys
from pathlib import Path

import typer

from simcli import progress
from simcli.errors import user_errors
from simcli.options import SimcliGroup, config_options
from simcli.output import Format, atomic_write_csv, atomic_write_json, emit_object
from simcli.progress import set_quiet
from simcli.reports.bundle import (
    check_output_path,
    cli_inputs,
    config_document,
    output_is_dir,
    write_output_dir,
)
from simcli.scenario.training import TrainConfig, TrainRun, resolve_train, run_train

app = typer.Typer(cls=SimcliGroup, help="Simulate one training iteration of a parallel plan.")


@app.callback(invoke_without_command=True)
@config_options(TrainConfig)
def train(
    config: TrainConfig,
    trace: Path | None = typer.Option(
        None,
        "--trace",
        "--trace-output",
        help="Write the simulated timeline as Chrome/Perfetto trace JSON (ui.perfetto.dev).",
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Folder for summary/breakdown/stages/memory/timeline CSVs, config.json and "
        "report.html; a .json or .csv name writes just the result object or row.",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress output."),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Iteration time, tokens/s, MFU, peak memory and a time breakdown for one plan."""
    set_quiet(quiet)
    with user_errors():
        inputs = cli_inputs()
        check_output_path(output, "--output")
        check_output_path(trace, "--trace", kind="file")
        scenario = resolve_train(config)
        run = run_train(scenario, keep_spans=trace is not None or output is not None)
        if output is not None:
            _write_output(output, run, inputs)
        if trace is not None:
            run.result.write_trace(trace)
        title = f"{scenario.model.id} on {config.gpus} x {config.gpu}"
        emit_object(run.flat() if fmt == Format.csv else run.to_dict(), fmt, title=title)
        note = run.mfu_note()
        if note and not quiet and not progress.quiet():
            sys.stderr.write(f"note: {note}\n")


def _write_output(path: Path, run: TrainRun, inputs: dict) -> None:
    """``--output``: a folder bundle, or the JSON object (.json) / flat row (.csv)."""
    out = run.to_dict()
    if not output_is_dir(path):
        if path.suffix.lower() == ".json":
            atomic_write_json(path, out)
        else:
            import pandas as pd

            scalars = {k: v for k, v in run.flat().items() if not isinstance(v, dict | list)}
            atomic_write_csv(pd.DataFrame([scalars]), path)
        return
    from simcli.reports import train as train_report

    csvs, page = train_report.build(out, run.result.spans)
    system = run.scenario.hardware.system
    resolved = {
        "plan": out["plan"],
        "cost_model": out["cost_model"],
        "gpu": system.gpu.model_dump(mode="json"),
        "node": system.node.id,
        "num_nodes": system.num_nodes,
    }
    config = config_document("train", inputs, resolved=resolved)
    write_output_dir(path, csvs=csvs, config=config, report_html=page)
