"""``simcli serve``: discrete-event simulation of an LLM serving deployment.

Replicas of ``tp x pp`` GPUs, a router, a replica scheduler (vLLM, Orca or Sarathi-Serve
style) over a paged KV cache, fed by Poisson/gamma arrivals or a replayed trace; reports
latency percentiles, throughput, goodput under SLOs, KV use, preemptions, GPU-hours and
cost. Optional, each off by default: prefill/decode disaggregation (``--disaggregate``),
speculative decoding (``--draft-model``) and multi-branch reasoning (``--branches``).

The command parses (:class:`~simcli.scenario.serving.ServeOptions`: every option but the
output ones), resolves the scenario (:func:`~simcli.scenario.serving.resolve_serve`), runs
it (:func:`~simcli.scenario.serving.run_serve`) and emits: the result object, and with
``--output`` per-request rows or a report bundle, with ``--trace-output`` a Chrome trace.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import typer

from simcli.commands.serve_plan import serve_plan
from simcli.errors import fail, user_errors
from simcli.options import SimcliGroup, config_options
from simcli.output import Format, cannot_write, emit_object, jsonable
from simcli.progress import progress_bar, set_quiet
from simcli.reports import output_is_dir
from simcli.reports.bundle import StagedBundle, check_output_path, cli_inputs, config_document
from simcli.scenario.serving_engine_options import engine_inputs
from simcli.scenario.serving_options import ServeOptions

# The simulator, pandas and the report renderer load when a run needs them, not for
# `simcli serve --help` (issue 18: start-up; benchmarks/cli_startup.py)
if TYPE_CHECKING:
    import pandas as pd

    from simcli.scenario.serving import ServeRun, ServeScenario
    from simcli.serving.requests import Request
    from simcli.serving.timeline import StepRecorder

app = typer.Typer(
    cls=SimcliGroup, help="Simulate serving a model: latency, throughput, goodput, cost."
)

# --output DIR: at most this many rows of timeline.csv (iteration samples, all replicas)
TIMELINE_ROWS = 4000
# --trace-output: requests drawn as async spans (the first ones to complete)
TRACE_REQUESTS = 1000


def _check_positive(flag: str, value: int, *, zero_ok: bool = False) -> None:
    ok = value >= 0 if zero_ok else value > 0
    if not ok:
        bound = ">= 0" if zero_ok else "> 0"
        raise fail(f"{flag} {value} is invalid; allowed: a number {bound}")


class _RequestRows:
    """``--output NAME.csv|NAME.json``: one row per request, streamed while the run goes
    into a temp file beside the target (memory stays flat), renamed into place by
    :meth:`finish`: an interrupted or failed run leaves no partial file. A .json name gets
    JSON: the object ``--format json`` prints, with the rows under ``requests``."""

    def __init__(self, path: Path) -> None:
        from simcli.reports.serve import REQUESTS_SCHEMA

        self.columns = tuple(REQUESTS_SCHEMA)
        self.path = path
        self.json = path.suffix.lower() == ".json"
        folder = path.parent if str(path.parent) else Path(".")
        self.tmp = Path(_temp_file(folder, prefix=f".{path.name}.", suffix=".rows.tmp", what=path))
        self.fh: IO[str] = open(self.tmp, "w", newline="")  # noqa: SIM115 (closed in finish)
        self.rows = 0
        if not self.json:
            self.csv = csv.writer(self.fh)
            self.csv.writerow(self.columns)

    def __call__(self, req: Request) -> None:
        row = _request_row(req)
        if self.json:
            obj = dict(zip(self.columns, row, strict=True))
            self.fh.write(("," if self.rows else "") + "\n    " + json.dumps(obj))
        else:
            self.csv.writerow(["" if v is None else f"{v:.9g}" if isinstance(v, float) else v
                               for v in row])  # fmt: skip
        self.rows += 1

    def finish(self, result: dict[str, Any]) -> None:
        """Write the file: for JSON, ``result`` with the streamed rows under ``requests``."""
        self.fh.close()
        if not self.json:
            _publish(self.tmp, self.path)
            return
        head = json.dumps(jsonable(result), indent=2)[:-2]  # the object without its "\n}"
        folder = self.path.parent if str(self.path.parent) else Path(".")
        final = Path(_temp_file(folder, prefix=f".{self.path.name}.", suffix=".tmp",
                                what=self.path))  # fmt: skip
        try:
            with open(final, "w") as out, open(self.tmp) as rows:
                out.write(head + ',\n  "requests": [')
                shutil.copyfileobj(rows, out)
                out.write("\n  ]\n}\n")
            _publish(final, self.path)
        finally:
            final.unlink(missing_ok=True)
            self.tmp.unlink(missing_ok=True)

    def discard(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


def _temp_file(folder: Path, *, prefix: str, suffix: str, what: Path) -> str:
    """A temp file in ``folder``; a failure names the output, not the temp file."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    except OSError as exc:
        raise cannot_write(what, exc) from None
    os.close(fd)
    return tmp


def _publish(tmp: Path, path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
    os.replace(tmp, path)


@contextmanager
def _request_rows(path: Path | None) -> Iterator[_RequestRows | None]:
    """The rows writer of ``path`` (None: no rows); removed unless finished."""
    if path is None:
        yield None
        return
    rows = _RequestRows(path)
    try:
        yield rows
    except BaseException:
        rows.discard()
        raise


def _request_row(req: Request) -> tuple:
    """The request's requests.csv row, in REQUESTS_SCHEMA's column order (tpot None for
    one output token)."""
    # a multi-branch request: the branch that completed it
    out = req.output_tokens if req.branch is None else req.branch.last_len
    first, fin = req.first_token_s, req.finish_s
    tpot = (fin - first) / (out - 1) if out > 1 else None  # type: ignore[operator]
    return (
        req.id,
        req.replica,
        float(req.arrival_s),
        req.prompt_tokens,
        out,
        first - req.arrival_s,  # type: ignore[operator]
        tpot,
        fin - req.arrival_s,  # type: ignore[operator]
        req.preemptions,
    )


def _check_outputs(output: Path | None, trace_output: Path | None) -> Path | None:
    """Fail before any work when an output cannot be written; the bundle folder or None."""
    bundle_dir = output if output is not None and output_is_dir(output) else None
    if bundle_dir is not None:
        check_output_path(bundle_dir, "--output", kind="folder")
    elif output is not None:
        check_output_path(output, "--output", kind="file")
    if trace_output is not None:
        check_output_path(trace_output, "--trace-output", kind="file")
        if output is not None and trace_output.resolve() == output.resolve():
            raise fail(f"--trace-output {trace_output} is also --output; allowed: two paths")
    return bundle_dir


@app.callback(invoke_without_command=True)
@config_options(ServeOptions)
def serve(
    config: ServeOptions,
    ctx: typer.Context,
    output: Path | None = typer.Option(
        None,
        "--output",
        help="A .csv name: one CSV row per request; .json: the --format json object with "
        "the requests under 'requests'. Any other name: a folder with "
        "requests.csv, summary.csv, timeline.csv, replicas.csv, qps_sweep.csv, config.json "
        "and report.html. Written atomically.",
    ),
    trace_output: Path | None = typer.Option(
        None,
        "--trace-output",
        help="Write a Chrome/Perfetto trace (JSON) of the simulated iterations here: one "
        "process per replica, counters of KV blocks and queued sequences, request spans.",
    ),
    trace_max_steps: int = typer.Option(
        100_000, "--trace-max-steps", help="Iterations drawn in --trace-output (the first N)."
    ),
    report_qps_points: int = typer.Option(
        6,
        "--report-qps-points",
        help="--output DIR: re-simulate at N arrival rates from 0.25x to 2x for the "
        "throughput/latency-vs-QPS charts (0: no sweep).",
    ),
    report_requests: int = typer.Option(
        500,
        "--report-requests",
        help="--output DIR: requests per QPS-sweep point (at most --num-requests).",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Latency percentiles, throughput, goodput, KV use and cost of a serving setup.
    `simcli serve plan ...` searches for the cheapest deployment meeting SLOs."""
    if ctx.invoked_subcommand is not None:
        return
    from simcli.scenario.serving import resolve_serve, run_serve
    from simcli.serving.timeline import StepRecorder

    set_quiet(quiet)
    with user_errors():
        if config.qps_sweep is not None:
            _qps_sweep_runs(config, output, trace_output, fmt)
            return
        bundle_dir = _check_outputs(output, trace_output)
        _check_positive("--trace-max-steps", trace_max_steps)
        _check_positive("--report-requests", report_requests)
        _check_positive("--report-qps-points", report_qps_points, zero_ok=True)
        scenario = resolve_serve(config)
        recorder = None
        if bundle_dir is not None or trace_output is not None:
            traced = trace_output is not None
            recorder = StepRecorder(
                max_samples=TIMELINE_ROWS,
                max_trace_steps=trace_max_steps if traced else 0,
                max_trace_requests=TRACE_REQUESTS if traced else 0,
            )
        staging = StagedBundle(bundle_dir) if bundle_dir is not None else nullcontext(None)
        with staging as staged:
            rows_path = staged.path("requests.csv") if staged is not None else output
            with (
                _request_rows(rows_path) as rows,
                progress_bar("simulating requests", total=scenario.arrivals.expected) as advance,
            ):
                run = run_serve(scenario, sink=rows, progress=advance, recorder=recorder)
                if rows is not None:
                    rows.finish(_json_result(run))
            if staged is not None:
                assert recorder is not None
                _commit_bundle(staged, scenario, run, recorder, report_qps_points, report_requests)
        if trace_output is not None:
            assert recorder is not None
            recorder.write_trace(
                trace_output,
                command="serve",
                model=scenario.model.id,
                gpu=config.gpu,
                title=scenario.title,
            )
        out = _json_result(run) if fmt == Format.json else dict(run.output)
        emit_object(out, fmt, title=scenario.title)


# --qps-sweep in the table format: the columns a rate sweep is read by (JSON/CSV: all keys)
SWEEP_TABLE_KEYS = (
    "qps", "requests_completed", "duration_s", "ttft_s_p50", "ttft_s_p99", "tpot_s_p50",
    "tpot_s_p99", "e2e_s_p50", "e2e_s_p99", "throughput_requests_per_s",
    "throughput_tokens_per_s", "total_tokens_per_s", "goodput_requests_per_s",
)  # fmt: skip


def _qps_sweep_runs(
    config: ServeOptions, output: Path | None, trace_output: Path | None, fmt: Format
) -> None:
    """``--qps-sweep R1,R2,...``: the deployment resolved once, then one full run per rate
    (same seed, lengths and --max-concurrency); one row per rate, the keys of a single
    run's object after ``qps``. ``--output NAME.csv|.json`` gets the rows."""
    import dataclasses

    from simcli.output import atomic_write_csv, atomic_write_text, emit_records
    from simcli.scenario.serving import resolve_arrivals, resolve_serve, run_serve

    if trace_output is not None or (output is not None and output_is_dir(output)):
        raise fail(
            "--qps-sweep writes its rows to --output NAME.csv or NAME.json; allowed: no "
            "report folder or --trace-output with a sweep"
        )
    if output is not None:
        check_output_path(output, "--output", kind="file")
    rates = config.sweep_rates()
    first = config.model_copy(update={"qps": rates[0], "qps_sweep": None})
    scenario = resolve_serve(first)
    rows = []
    with progress_bar("QPS sweep", total=len(rates)) as advance:
        for i, rate in enumerate(rates):
            opts = config.model_copy(update={"qps": rate, "qps_sweep": None})
            sc = dataclasses.replace(scenario, options=opts, arrivals=resolve_arrivals(opts))
            label = rate if rate != float("inf") else "inf"  # JSON has no infinity
            rows.append({"qps": label, **run_serve(sc).output})
            advance(i + 1, len(rates))
    wrapper = {
        "model": scenario.model.id,
        "gpu": config.gpu,
        "qps_sweep": [r["qps"] for r in rows],
    }
    if output is not None:
        import pandas as pd

        if output.suffix.lower() == ".json":
            atomic_write_text(output, json.dumps(jsonable({**wrapper, "runs": rows}), indent=2))
        else:
            atomic_write_csv(pd.DataFrame(rows), output)
    if fmt == Format.table:
        rows = [{k: r.get(k) for k in SWEEP_TABLE_KEYS} for r in rows]
    title = f"{scenario.title}: QPS sweep"
    emit_records(rows, fmt, title=title, json_wrapper=wrapper, json_key="runs")


def _json_result(run: ServeRun) -> dict[str, Any]:
    """The object ``--format json`` prints (and a .json ``--output`` holds, with the
    requests): the result and its per-replica rows."""
    return {**run.output, "per_replica": run.result.per_replica}


def _commit_bundle(
    staged: StagedBundle,
    scenario: ServeScenario,
    run: ServeRun,
    recorder: StepRecorder,
    points: int,
    requests_per_point: int,
) -> None:
    """``--output DIR``: the summary, timeline, replicas and QPS-sweep CSVs, config.json
    and report.html (requests.csv was streamed during the run)."""
    from simcli.reports.serve import (
        REPLICAS_SCHEMA,
        TIMELINE_SCHEMA,
        frame,
        qps_multipliers,
        serve_csvs,
        serve_report,
    )

    out = run.output
    expected = scenario.arrivals.expected
    n_sweep = min(requests_per_point, expected or requests_per_point)
    requests_at, base_qps, why = scenario.arrivals.at_rates(n_sweep)
    sweep, sweep_note = _qps_sweep(
        points,
        n_sweep,
        base_qps,
        why,
        requests_at,
        lambda reqs: scenario.simulate(reqs).summary,
        replay=scenario.arrivals.replay,
    )
    report_out = {**out, "offered_qps": base_qps} if base_qps is not None else dict(out)
    timeline = frame(recorder.samples(), TIMELINE_SCHEMA)
    reps = frame(run.result.per_replica, REPLICAS_SCHEMA)
    dep = scenario.deployment
    cost_model = str(getattr(dep.step, "label", type(dep.step).__name__))
    m = run.metrics
    o = scenario.options
    html = serve_report(
        report_out,
        title=scenario.title,
        hists={"ttft_s": m.ttft, "tpot_s": m.tpot, "e2e_s": m.e2e},
        slos={"ttft_s": o.slo_ttft_s, "tpot_s": o.slo_tpot_s},
        timeline=timeline,
        replicas=reps,
        sweep=sweep,
        sweep_note=sweep_note,
        cost_model=cost_model,
    )
    resolved = {
        "model_id": scenario.model.id,
        "gpu": o.gpu,
        "cost_model": cost_model,
        "profile": o.profile,
        "seed": o.seed,
        "num_requests": expected,
        "arrivals": out["arrivals"],
        "max_tokens": dep.config.scheduler.max_tokens,
        "price_per_gpu_hour": dep.hardware.usd_per_gpu_hour,
        "prefill_tp": o.prefill_tp_or_tp if o.disaggregate else None,
        "decode_tp": o.decode_tp_or_tp if o.disaggregate else None,
        "draft_models": [d.id for d in scenario.drafts],
        "serve_config": dep.config,
        "report": {
            "qps_multipliers": qps_multipliers(points) if sweep is not None else [],
            "base_qps": base_qps,
            "requests_per_point": n_sweep,
            "timeline_rows_max": TIMELINE_ROWS,
        },
    }
    staged.commit(
        csvs=serve_csvs(out, timeline=timeline, replicas=reps, sweep=sweep),
        # the engine's defaults resolved where the flags were not given
        config=config_document("serve", {**cli_inputs(), **engine_inputs(o)}, resolved=resolved),
        report_html=html,
    )


def _qps_sweep(
    points: int,
    n: int,
    base_qps: float | None,
    why_not: str,
    requests_at: Callable[[float], Iterable[Request]],
    run: Callable[[Iterable[Request]], dict],
    *,
    replay: bool,
) -> tuple[pd.DataFrame | None, str]:
    """Throughput and latency at ``points`` arrival rates (0.25x to 2x the run's): the
    same deployment re-simulated with ``n`` requests per point. (frame or None, how it
    was made, for the report)."""
    from simcli.reports.serve import SWEEP_METRICS, SWEEP_SCHEMA, frame, qps_multipliers

    if points <= 0:
        return None, "QPS sweep off (--report-qps-points 0)."
    if base_qps is None:
        return None, f"No QPS sweep: {why_not}."
    mults = qps_multipliers(points)
    rows = []
    with progress_bar("QPS sweep", total=len(mults)) as advance:
        for i, m in enumerate(mults):
            summary = run(requests_at(m))
            rows.append(
                {"qps_multiplier": m, "offered_qps": base_qps * m,
                 **{k: summary.get(k) for k in SWEEP_METRICS}}
            )  # fmt: skip
            advance(i + 1, len(mults))
    how = (
        f"The trace's first {n} rows replayed with arrival times divided by each multiplier "
        f"(its mean rate: {base_qps:.4g} requests/s)"
        if replay
        else f"{n} synthetic requests per point, same seed and length distributions"
    )
    note = (
        f"Curve made by re-simulating this deployment at {len(mults)} arrival rates, "
        f"{', '.join(f'{m:.3g}' for m in mults)} x {base_qps:.4g} requests/s. {how}. "
        "Overloaded points (throughput below the offered load) run until the last request "
        "completes, so their latencies grow with the number of requests."
    )
    return frame(rows, SWEEP_SCHEMA), note


app.command("plan", help="Cheapest deployment meeting SLOs at a target QPS.")(serve_plan)
