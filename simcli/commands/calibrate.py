"""``simcli calibrate run|fit|report``: measure a GPU, fit a profile, show its fidelity."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import typer

from simcli.errors import fail, user_errors
from simcli.output import Format, atomic_write_csv, atomic_write_text, emit_records

app = typer.Typer(
    help="Microbenchmarks on a GPU, fitted profiles, fidelity reports.", no_args_is_help=True
)

FormatOpt = typer.Option(Format.table, "--format", help="table | json | csv")
DataOpt = typer.Option(
    ..., "--data", help="Dataset folder written by `calibrate run` (repeatable)."
)


@app.command("run")
def run(
    out: Path = typer.Option(..., "--out", help="Dataset folder to write (resumes if it exists)."),
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
) -> None:
    """Run the microbenchmarks here (needs torch: pip install 'simcli[calibrate]')."""
    with user_errors():
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
        code = runner.main(argv)
        if code:
            raise fail(f"the benchmark runner stopped with status {code}")


@app.command("fit")
def fit(
    data: list[Path] = DataOpt,
    gpu: str = typer.Option(..., "--gpu", help="GPU id the data was measured on."),
    out: Path = typer.Option(..., "--out", help="Profile file to write (JSON)."),
    name: str | None = typer.Option(None, "--name", help="Profile name (default: the GPU id)."),
    scope: str = typer.Option(
        "gpu", "--scope", help="gpu | collectives (NCCL data of a node fabric)"
    ),
    report_dir: Path | None = typer.Option(
        None, "--report", help="Also write the fidelity report here."
    ),
    fmt: Format = FormatOpt,
) -> None:
    """Fit efficiencies and learned corrections; print held-out fidelity per op class."""
    with user_errors():
        from calibrate.dataset import load_dataset
        from calibrate.fit import fit_profile
        from costmodels.profile import Profile
        from hardware_specs.registry import load_catalog

        if scope not in ("gpu", "collectives"):
            raise fail(f"unknown --scope {scope!r}; allowed: gpu, collectives")
        cat = load_catalog()
        cat.gpu(gpu)
        datasets = [load_dataset(d, expect_gpu=gpu) for d in data]
        result = fit_profile(datasets, gpu, name=name)
        if scope == "collectives":
            result.profile["scope"] = "collectives"
            result.profile["link"] = cat.reference_node(gpu).intra_node_link
            result.profile["params"] = {
                "collectives": result.profile["params"].get("collectives", {})
            }
        profile = Profile.model_validate(result.profile)  # validate before writing anything
        if report_dir is not None:
            _write_report(report_dir, profile, datasets)
        atomic_write_text(out, json.dumps(result.profile, indent=1) + "\n")
        headline = ["default_mape", "fitted_mape", "learned_mape", "learned_p50", "learned_p90"]
        rows = _compact(result.fidelity, fmt, headline)
        title = f"held-out fidelity of {profile.name} (written to {out})"
        wrapper = {"profile": str(out), "gpu": gpu}
        emit_records(rows, fmt, title=title, json_wrapper=wrapper, json_key="fidelity")


@app.command("report")
def report(
    profile: Path = typer.Option(..., "--profile", help="Profile JSON to evaluate."),
    data: list[Path] = DataOpt,
    output: Path | None = typer.Option(
        None, "--output", help="Folder for fidelity.csv, predictions.csv and report.html."
    ),
    fmt: Format = FormatOpt,
) -> None:
    """MAPE, p50 and p90 error per op class on held-out data; CSV and HTML with plots."""
    with user_errors():
        from calibrate.dataset import load_dataset
        from calibrate.report import evaluate
        from costmodels.profile import load_profile

        prof = load_profile(profile)
        datasets = [load_dataset(d, expect_gpu=prof.gpu) for d in data]
        fidelity, _ = evaluate(prof, datasets)
        if output is not None:
            _write_report(output, prof, datasets)
        wrapper = {"profile": str(profile), "gpu": prof.gpu}
        rows = _compact(
            fidelity, fmt, ["default_mape", "profile_mape", "profile_p50", "profile_p90"]
        )
        emit_records(
            rows, fmt, title=f"fidelity of {prof.name}", json_wrapper=wrapper, json_key="fidelity"
        )


def _compact(fidelity, fmt: Format, errors: list[str]) -> list[dict]:
    """Tables show the headline columns; json and csv keep every column."""
    if fmt != Format.table:
        return fidelity.to_dict(orient="records")
    return (
        fidelity[["op_class", "rows_fit", "rows_held_out", *errors]]
        .round(1)
        .to_dict(orient="records")
    )


def _write_report(folder: Path, profile, datasets) -> None:
    from calibrate.report import evaluate, render_html

    fidelity, predictions = evaluate(profile, datasets)
    folder.mkdir(parents=True, exist_ok=True)
    page = render_html(profile, fidelity, predictions)
    atomic_write_csv(fidelity, folder / "fidelity.csv")
    atomic_write_csv(predictions, folder / "predictions.csv")
    atomic_write_text(folder / "report.html", page)
