"""``simcli calibrate run|fit|report|from-trace``: measure a GPU, fit a profile, show its
fidelity; fit composition factors from whole-step traces."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import typer

from simcli import progress
from simcli.errors import fail, user_errors
from simcli.options import SimcliGroup
from simcli.output import (
    Format,
    atomic_write_csv,
    atomic_write_json,
    atomic_write_text,
    emit_records,
    jsonable,
)
from simcli.reports.bundle import check_output_path, output_is_dir

app = typer.Typer(
    cls=SimcliGroup,
    help="Microbenchmarks on a GPU, fitted profiles, fidelity reports.",
    no_args_is_help=True,
)

FormatOpt = typer.Option(Format.table, "--format", help="table | json | csv")
DataOpt = typer.Option(
    ..., "--data", help="Dataset folder written by `calibrate run` (repeatable)."
)
QuietOpt = typer.Option(False, "--quiet", help="No progress bar or progress lines.")


@contextlib.contextmanager
def _stages(label: str, total: int) -> Iterator[Callable[[str], None]]:
    """A bar over a few long stages: ``step(name)`` marks the next one started. A ticker
    thread redraws it, so elapsed time moves while one stage (e.g. fitting) runs."""
    if not progress.enabled():
        yield lambda name: None
        return
    lock = threading.Lock()
    state = {"done": 0, "stage": ""}
    stop = threading.Event()
    with progress.progress_bar(label, total=total, fields=("stage",)) as advance:

        def draw() -> None:
            with lock:
                advance(state["done"], stage=state["stage"])

        def tick() -> None:
            while not stop.wait(0.25):
                draw()

        def step(name: str) -> None:
            with lock:
                state["done"] = min(total, state["done"] + (1 if state["stage"] else 0))
                state["stage"] = name
            draw()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield step
        finally:
            stop.set()
            ticker.join()


@app.command("run")
def run(
    out: Path = typer.Option(
        ...,
        "--output",
        "--out",
        help="Dataset folder to write (resumes if it exists; --out is an alias).",
    ),
    suite: str = typer.Option(
        "all",
        "--suite",
        help="all, or a comma list: gemm, attention, decode, "
        "blocksparse, elementwise, power, collectives",
    ),
    quick: bool = typer.Option(False, "--quick", help="Reduced shape sets."),
    tiny: bool = typer.Option(False, "--tiny", help="Tiny shapes (CPU smoke test)."),
    time_budget_s: float | None = typer.Option(
        None, "--time-budget-s", help="Stop starting new cases after this."
    ),
    device: str = typer.Option("auto", "--device", help="auto | cuda | cpu"),
    ops: Path | None = typer.Option(
        None, "--ops", help="Measure the rows of this ops CSV instead of the built-in suites."
    ),
    quiet: bool = typer.Option(
        False, "--quiet", help="Drop the runner's progress bar and lines (stdout); errors stay."
    ),
) -> None:
    """Run the microbenchmarks here (needs torch: pip install 'simcli[calibrate]')."""
    with user_errors():
        progress.set_quiet(quiet)
        if importlib.util.find_spec("torch") is None:
            raise fail("calibrate run needs torch: pip install 'simcli[calibrate]'")
        from calibrate import run as runner
        from calibrate.bench import SUITES

        names = [x.strip() for x in suite.split(",") if x.strip()]
        unknown = [x for x in names if x != "all" and x not in SUITES]
        if unknown or not names:
            bad = ", ".join(unknown) or repr(suite)
            raise fail(f"unknown --suite {bad}; allowed: all, {', '.join(SUITES)}")
        argv = ["--suite", suite, "--out", str(out), "--device", device]
        if ops is not None:
            try:
                runner.ops_file_cases(ops)  # check the file before anything runs
            except SystemExit as exc:
                raise fail(str(exc)) from None
            argv += ["--ops", str(ops)]
        argv += ["--quick"] if quick else []
        argv += ["--tiny"] if tiny else []
        argv += ["--time-budget-s", str(time_budget_s)] if time_budget_s else []
        if quiet:  # the runner's bar and progress lines go to stdout
            with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                code = runner.main(argv)
        else:
            code = runner.main(argv)
        if code:
            raise fail(f"the benchmark runner stopped with status {code}")


def _check_json_output(path: Path) -> None:
    """A profile or composition file is JSON: refuse a .csv name (it would get JSON)."""
    check_output_path(path, "--output", kind="file")
    if path.suffix.lower() == ".csv":
        raise fail(f"--output {path}: this file is JSON; allowed: a name ending in .json")


HardwareOpt = typer.Option(
    None,
    "--hardware",
    help="GPU spec file (YAML/JSON, the format of hardware_specs/data) for a GPU simcli "
    "does not know; without it an unknown --gpu is derived from the device the data records.",
)


@app.command("fit")
def fit(
    data: list[Path] = DataOpt,
    gpu: str = typer.Option(..., "--gpu", help="GPU id the data was measured on."),
    out: Path = typer.Option(
        ..., "--output", "--out", help="Profile file to write (JSON; --out is an alias)."
    ),
    name: str | None = typer.Option(None, "--name", help="Profile name (default: the GPU id)."),
    scope: str = typer.Option(
        "gpu", "--scope", help="gpu | collectives (NCCL data of a node fabric)"
    ),
    report_dir: Path | None = typer.Option(
        None,
        "--report",
        help="Also write the fidelity report into this folder: fidelity.csv, predictions.csv, "
        "config.json, report.html.",
    ),
    hardware: Path | None = HardwareOpt,
    fmt: Format = FormatOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Fit efficiencies and learned corrections; print held-out fidelity per op class."""
    with user_errors():
        from calibrate.dataset import load_dataset
        from calibrate.fit import fit_profile
        from costmodels.ops.profile import Profile

        progress.set_quiet(quiet)
        if scope not in ("gpu", "collectives"):
            raise fail(f"unknown --scope {scope!r}; allowed: gpu, collectives")
        _check_json_output(out)
        check_output_path(report_dir, "--report", kind="folder")
        with _stages("calibrate fit", len(data) + 1 + (report_dir is not None)) as step:
            datasets = []
            for d in data:
                step(f"loading {d.name}")
                datasets.append(load_dataset(d))
            cat, spec_file, spec_notes = _fit_catalog(gpu, hardware, datasets, out)
            step("fitting")
            result = fit_profile(datasets, gpu, name=name, catalog=cat)
            result.notes[:0] = spec_notes
            if scope == "collectives":
                result.profile["scope"] = "collectives"
                result.profile["link"] = cat.reference_node(gpu).intra_node_link
                result.profile["params"] = {
                    "collectives": result.profile["params"].get("collectives", {})
                }
            profile = Profile.model_validate(result.profile)  # validate before writing
            prov = _provenance(profile, cat)  # the profile loads and predicts, or we stop here
            if report_dir is not None:
                step("report")
                inputs = {
                    "data": [str(d.resolve()) for d in data],
                    "gpu": gpu,
                    "out": str(out.resolve()),
                    "name": name,
                    "scope": scope,
                    "hardware": str(hardware.resolve()) if hardware else None,
                }
                _write_report(report_dir, profile, datasets, "calibrate fit", inputs, cat, prov)
        if spec_file is not None:
            atomic_write_text(spec_file[0], spec_file[1])
            result.notes.append(f"GPU spec written to {spec_file[0]}: pass it as --hardware")
        atomic_write_text(out, json.dumps(jsonable(result.profile), indent=1) + "\n")
        _emit_fit(result, profile, prov, out, fmt, quiet)


def _fit_catalog(gpu: str, hardware: Path | None, datasets, out: Path):
    """(catalog with ``gpu`` and a node for it, (spec file path, YAML) to write beside the
    profile when the spec was derived or completed here, notes). An unknown ``gpu`` is
    derived from the device the data records, unless that device is a built-in GPU."""
    import yaml

    from calibrate.dataset import DatasetError, derive_gpu_spec, gpu_id_from_name, recorded_device
    from calibrate.fit import with_reference_node
    from hardware_specs.registry import load_catalog
    from hardware_specs.schema import HardwareFile

    cat = load_catalog(hardware)
    notes: list[str] = []
    derived = gpu not in cat.gpus
    if derived:
        for ds in datasets:
            dev = recorded_device(ds.meta)
            known = gpu_id_from_name(str(dev.get("name", "")))
            if known in cat.gpus and _same_device(dev, cat.gpus[known]):
                raise fail(
                    f"unknown GPU {gpu!r}; the data was measured on {dev['name']!r}, built in "
                    f"as {known}: use --gpu {known}"
                )
        try:
            spec, notes = derive_gpu_spec(gpu, datasets)
        except DatasetError as exc:
            raise fail(
                f"unknown GPU {gpu!r} and {exc}; pass --hardware FILE with its spec "
                f"(format: hardware_specs/data/gpus.yaml) or use one of: {', '.join(cat.gpus)}"
            ) from None
        cat = cat.merged(HardwareFile(gpus=[spec]), "derived spec")
    cat, node = with_reference_node(cat, gpu)
    if not derived and node is None:
        return cat, None, notes
    doc = HardwareFile(gpus=[cat.gpu(gpu)], nodes=[node] if node else [])
    text = "# written by simcli calibrate fit: the GPU this profile was fitted for\n"
    text += yaml.safe_dump(doc.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
    return cat, (out.with_name(f"{out.stem}.hardware.yaml"), text), notes


def _same_device(dev: dict, spec) -> bool:
    """Whether a recorded device is the built-in ``spec`` (SMs and memory within 3%), not
    a variant that shares its name (an H100 NVL is not an H100 SXM)."""
    sms, mem = dev.get("sm_count"), dev.get("memory_bytes")
    if isinstance(sms, int) and sms != spec.sm_count:
        return False
    return not isinstance(mem, int | float) or abs(mem / spec.memory_bytes - 1) < 0.03


def _provenance(profile, catalog):
    """How predictions from ``profile`` are obtained on its GPU (loading it as the CLI's
    ``--profile`` does), and the error to expect."""
    from costmodels.ops.select import get_cost_model

    model = get_cost_model(profile.gpu, profile=profile, catalog=catalog, use_shipped=False)
    return model.provenance


def _emit_fit(result, profile, prov, out: Path, fmt: Format, quiet: bool) -> None:
    """Table (then the held-out line and provenance) or one JSON object; warnings and
    notes on stderr, one line each."""
    for line in result.warnings:
        sys.stderr.write(f"warning: {line}\n")
    for line in [] if quiet else result.notes:
        sys.stderr.write(f"note: {line}\n")
    headline = ["default_mape", "fitted_mape", "learned_mape", "learned_p50", "learned_p90"]
    rows = _compact(result.fidelity, fmt, headline)
    title = f"held-out fidelity of {profile.name} (written to {out})"
    wrapper = {
        "profile": str(out),
        "gpu": profile.gpu,
        "held_out_split": profile.measured_on.get("held_out_split"),
        "provenance": prov.as_dict(),
        "warnings": result.warnings,
        "notes": result.notes,
    }
    emit_records(rows, fmt, title=title, json_wrapper=wrapper, json_key="fidelity")
    if fmt == Format.table:
        typer.echo(result.held_out_line())
        typer.echo(f"provenance: {prov}")
    elif fmt == Format.csv:
        sys.stderr.write(f"{result.held_out_line()}\nprovenance: {prov}\n")


@app.command("from-trace")
def from_trace(
    traces: list[Path] = typer.Option(
        ..., "--trace", help="Profiler trace of a training step (repeatable, one per --config)."
    ),
    configs: list[Path] = typer.Option(
        ..., "--config", help="Trace config (YAML/JSON) of the --trace in the same position."
    ),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU id; default: each config's gpu."),
    out: Path = typer.Option(
        ..., "--output", "--out", help="Composition file to write (JSON; --out is an alias)."
    ),
    held_out: list[str] = typer.Option(
        [],
        "--held-out-model",
        help="Model id kept out of the fit and reported (a split by model; repeatable).",
    ),
    fmt: Format = FormatOpt,
) -> None:
    """Fit composition factors (per engine and kernel group: GEMM, attention,
    memory-bound, optimizer, and the idle share of GPU-bound steps) from whole-step
    traces; `simcli train --composition FILE` applies them."""
    with user_errors():
        from calibrate.trace.fit import fit_suite
        from simcli.scenario.trace import traced_step

        if len(traces) != len(configs):
            raise fail(
                f"{len(traces)} --trace but {len(configs)} --config; allowed: one --config "
                "per --trace, in the same order"
            )
        _check_json_output(out)
        steps = [traced_step(t, c, gpu=gpu) for t, c in zip(traces, configs, strict=True)]
        gpus = {gpu} if gpu else {_config_gpu(c) for c in configs}
        if len(gpus) != 1:
            raise fail(f"traces of several GPUs ({', '.join(sorted(gpus))}); allowed: one GPU")
        fit_models = tuple(sorted({s.model for s in steps} - set(held_out)))
        if not fit_models:
            raise fail("every trace's model is held out; allowed: at least one model to fit on")
        comp = fit_suite(
            gpus.pop(), steps, fit_models, tuple(held_out), source=", ".join(map(str, traces))
        )
        # write_composition's content, through simcli's atomic write (errors name --output)
        atomic_write_text(out, json.dumps(comp.to_dict(), indent=1, sort_keys=True) + "\n")
        rows = [
            {"engine": fw, "group": g, "factor": v}
            for fw, groups in comp.factors.items()
            for g, v in groups.items()
        ]
        if fmt == Format.json:
            typer.echo(json.dumps(jsonable(comp.to_dict())))
            return
        emit_records(rows, fmt, title=f"composition factors -> {out}")
        for fw, e in comp.meta["held_out_error"].items():
            typer.echo(
                f"held out {fw}: kernel-sum MAPE {100 * e['kernel_sum_mape_before']:.1f}% -> "
                f"{100 * e['kernel_sum_mape_after']:.1f}% over {e['steps']} steps",
                err=True,
            )


def _config_gpu(path: Path) -> str:
    from simcli.scenario.trace import load_trace_config

    gpu = load_trace_config(path).gpu
    if gpu is None:
        raise fail(f"config {path}: no gpu; allowed: gpu in the config or --gpu")
    return gpu


@app.command("report")
def report(
    profile: Path = typer.Option(..., "--profile", help="Profile JSON to evaluate."),
    data: list[Path] = DataOpt,
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Folder for fidelity.csv, predictions.csv, config.json and report.html (a name "
        "ending in .csv or .json writes only the fidelity table there).",
    ),
    hardware: Path | None = typer.Option(
        None, "--hardware", help="GPU spec file, for a profile of a GPU simcli does not know."
    ),
    fmt: Format = FormatOpt,
    quiet: bool = QuietOpt,
) -> None:
    """MAPE, p50 and p90 error per op class on held-out data; CSV and HTML with plots."""
    with user_errors():
        from calibrate.dataset import load_dataset
        from calibrate.fit import with_reference_node
        from calibrate.report import evaluate
        from costmodels.ops.profile import load_profile
        from hardware_specs.registry import load_catalog

        progress.set_quiet(quiet)
        check_output_path(output)
        prof = load_profile(profile)
        cat = load_catalog(hardware)
        if prof.gpu not in cat.gpus:
            beside = profile.with_name(f"{profile.stem}.hardware.yaml")
            hint = f" ({beside} was written beside it)" if beside.exists() else ""
            raise fail(
                f"unknown GPU {prof.gpu!r} of profile {prof.name!r}; pass --hardware FILE "
                f"with its spec{hint}; known: {', '.join(cat.gpus)}"
            )
        cat, _ = with_reference_node(cat, prof.gpu)
        prov = _provenance(prof, cat)
        bundle = output is not None and output_is_dir(output)
        with _stages("calibrate report", len(data) + 1 + bundle) as step:
            datasets = []
            for d in data:
                step(f"loading {d.name}")
                datasets.append(load_dataset(d, expect_gpu=prof.gpu))
            step("evaluating")
            fidelity, predictions = evaluate(prof, datasets, catalog=cat)
            wrapper = {"profile": str(profile), "gpu": prof.gpu, "provenance": prov.as_dict()}
            if bundle:
                step("report")
                inputs = {
                    "profile": str(profile.resolve()),
                    "data": [str(d.resolve()) for d in data],
                }
                _write_bundle(output, prof, fidelity, predictions, "calibrate report", inputs, prov)
            elif output is not None and output.suffix.lower() == ".csv":
                atomic_write_csv(fidelity, output)
            elif output is not None:
                doc = {**wrapper, "fidelity": fidelity.to_dict(orient="records")}
                atomic_write_json(output, doc)
        rows = _compact(
            fidelity, fmt, ["default_mape", "profile_mape", "profile_p50", "profile_p90"]
        )
        emit_records(
            rows, fmt, title=f"fidelity of {prof.name}", json_wrapper=wrapper, json_key="fidelity"
        )
        if fmt == Format.table:
            typer.echo(f"provenance: {prov}")
        elif fmt == Format.csv:
            sys.stderr.write(f"provenance: {prov}\n")


def _compact(fidelity, fmt: Format, errors: list[str]) -> list[dict]:
    """Tables show the headline columns; json and csv keep every column."""
    if fmt != Format.table:
        return fidelity.to_dict(orient="records")
    return (
        fidelity[["op_class", "rows_fit", "rows_held_out", *errors]]
        .round(1)
        .to_dict(orient="records")
    )


def _write_report(
    folder: Path, profile, datasets, command: str, inputs: dict, catalog, provenance
) -> None:
    from calibrate.report import evaluate

    fidelity, predictions = evaluate(profile, datasets, catalog=catalog)
    _write_bundle(folder, profile, fidelity, predictions, command, inputs, provenance)


def _write_bundle(
    folder: Path, profile, fidelity, predictions, command: str, inputs, provenance
) -> None:
    from simcli.reports.calibration import write_calibration_bundle

    write_calibration_bundle(
        folder,
        profile,
        fidelity,
        predictions,
        command=command,
        inputs=inputs,
        provenance=provenance,
    )
