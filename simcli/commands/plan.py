"""``simcli plan``: search parallel training plans and rank them by time or cost."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import typer

from hardware_specs.registry import load_catalog
from simcli.errors import user_errors
from simcli.output import Format, atomic_write_json, atomic_write_text, emit_records
from simcli.progress import progress_bar, set_quiet
from simcli.reports.bundle import (
    check_output_path,
    cli_inputs,
    config_document,
    output_is_dir,
    write_output_dir,
)
from simcli.training.search import SearchResult, SearchSpace, search_plans
from workloads.models import load_model
from workloads.plan import PlanError

app = typer.Typer(help="Search parallel training plans (tp, pp, cp, dp, ZeRO, recompute, ...).")

# Columns of the human table (JSON and CSV carry every field).
TABLE_COLUMNS = (
    "rank",
    "num_gpus",
    "tp",
    "pp",
    "dp",
    "cp",
    "cp_kind",
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


def _ints(text: str | None, option: str) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise PlanError(
            f"{option} {text!r} is not a comma list of integers; allowed: e.g. 2,4,8"
        ) from None
    if any(v < 1 for v in values):
        raise PlanError(f"{option} {text!r} has a value < 1; allowed: positive integers")
    return values


def _records(result: SearchResult) -> list[dict]:
    return [{"rank": i + 1, **p.record()} for i, p in enumerate(result.plans)]


def _write(result: SearchResult, path: Path, inputs: dict) -> None:
    """``--output``: CSV of the plans for a .csv name, the JSON object for .json, else a
    folder with plans.csv, evaluated.csv, config.json and report.html."""
    records = _records(result)
    if output_is_dir(path):
        from simcli.reports import plan as plan_report

        csvs, page = plan_report.build(
            result.summary(), records, result.evaluated, [p.breakdown_s for p in result.plans]
        )
        resolved = {"summary": result.summary(), "best_plan": result.plans[0].plan}
        config = config_document("plan", inputs, resolved=resolved)
        write_output_dir(path, csvs=csvs, config=config, report_html=page)
        return
    if path.suffix.lower() == ".csv":
        buf = io.StringIO()
        pd.DataFrame(records).to_csv(buf, index=False, float_format="%.6g")
        atomic_write_text(path, buf.getvalue())
    else:
        obj = {**result.summary(), "plans": records}
        atomic_write_json(path, obj)


@app.callback(invoke_without_command=True)
def plan(
    model: str = typer.Option(..., "--model", help="Built-in model id or a config.json path."),
    gpu: str = typer.Option(..., "--gpu", help="GPU id (see `simcli specs list`)."),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job (reference nodes)."),
    seq_len: int = typer.Option(..., "--seq-len", help="tokens per sequence"),
    global_batch: int = typer.Option(..., "--global-batch", help="sequences per iteration"),
    top: int = typer.Option(5, "--top", help="how many plans to return"),
    objective: str = typer.Option(
        "time",
        "--objective",
        help="time: iteration time on --gpus GPUs; cost: US$ per iteration "
        "(GPU-hours x price), also trying --gpus/2, /4, ...",
    ),
    balance: bool = typer.Option(
        False,
        "--balance/--no-balance",
        help="also try uneven pipeline stages balancing time and memory (Galvatron-BMW)",
    ),
    max_tp: int | None = typer.Option(
        None, "--max-tp", help="largest tensor-parallel degree (default: GPUs per node)"
    ),
    tp: str | None = typer.Option(None, "--tp", help="only these TP degrees, e.g. 4,8"),
    pp: str | None = typer.Option(None, "--pp", help="only these pipeline degrees, e.g. 4,8"),
    max_pp: int | None = typer.Option(None, "--max-pp"),
    max_cp: int | None = typer.Option(None, "--max-cp"),
    min_cp_tokens: int = typer.Option(
        512, "--min-cp-tokens", help="prune context parallelism below this many tokens per rank"
    ),
    max_micro_batch: int | None = typer.Option(None, "--max-micro-batch"),
    precision: str = typer.Option(
        "bf16-mixed", "--precision", help="bf16-mixed | fp16-mixed | bf16 | fp8"
    ),
    price: float | None = typer.Option(
        None, "--price-per-gpu-hour", help="US$ per GPU-hour (default: the built-in table)"
    ),
    profile: Path | None = typer.Option(None, "--profile", help="Calibration profile."),
    hardware: Path | None = typer.Option(None, "--hardware", help="Extra hardware spec file."),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Also write the result: CSV of plans (.csv), JSON (.json), or a folder with "
        "plans.csv, evaluated.csv (every plan tried), config.json and report.html.",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Ranked plans with the simulator's iteration time, MFU, memory and cost."""
    set_quiet(quiet)
    with user_errors():
        inputs = cli_inputs()
        check_output_path(output, "--output")
        cfg = load_model(model)
        if objective not in ("time", "cost"):
            raise PlanError(f"unknown --objective {objective!r}; allowed: time, cost")
        space = SearchSpace(
            max_tp=max_tp,
            tp=_ints(tp, "--tp"),
            pp=_ints(pp, "--pp"),
            max_pp=max_pp,
            max_cp=max_cp,
            min_tokens_per_cp_rank=min_cp_tokens,
            max_micro_batch=max_micro_batch,
            precision=precision,
        )
        catalog = load_catalog(hardware)
        with progress_bar("plan search") as advance:
            result = search_plans(
                cfg,
                gpu,
                gpus,
                seq_len=seq_len,
                global_batch=global_batch,
                top=top,
                objective=objective,  # type: ignore[arg-type]
                balance=balance,
                space=space,
                price_usd_per_gpu_hour=price,
                catalog=catalog,
                profile=profile,
                collect=output is not None and output_is_dir(output),
                progress=advance,
            )
        if output is not None:
            _write(result, output, inputs)
        records = _records(result)
        summary = result.summary()
        if fmt == Format.table:
            title = (
                f"{cfg.id} on {gpus} x {gpu}: {summary['configs_evaluated']} plans evaluated "
                f"({summary['configs_fit']} fit) in {summary['search_seconds']:.2f} s, "
                f"best {records[0]['iteration_s']:.3f} s/iteration"
            )
            rows = [{c: r.get(c) for c in TABLE_COLUMNS} for r in records]
            emit_records(rows, fmt, title=title)
        else:
            emit_records(records, fmt, json_wrapper=summary, json_key="plans")
