"""The ``simcli`` command line: a thin layer over specs, workloads and cost models."""

from __future__ import annotations

import typer

from simcli import __version__
from simcli.commands import calibrate as calibrate_cmd
from simcli.commands import models as models_cmd
from simcli.commands import plan as plan_cmd
from simcli.commands import predict as predict_cmd
from simcli.commands import serve as serve_cmd
from simcli.commands import sparsity as sparsity_cmd
from simcli.commands import specs as specs_cmd
from simcli.commands import step as step_cmd
from simcli.commands import sweep as sweep_cmd
from simcli.commands import trace as trace_cmd
from simcli.commands import train as train_cmd
from simcli.commands import varlen as varlen_cmd
from simcli.errors import set_debug
from simcli.progress import set_quiet

app = typer.Typer(
    name="simcli",
    help="Predict LLM training, serving and kernel times on GPUs you have not rented yet.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(specs_cmd.app, name="specs")
app.add_typer(models_cmd.app, name="models")
app.add_typer(predict_cmd.app, name="predict")
app.add_typer(calibrate_cmd.app, name="calibrate")
app.add_typer(train_cmd.app, name="train")
app.add_typer(plan_cmd.app, name="plan")
app.add_typer(varlen_cmd.app, name="varlen")
app.add_typer(step_cmd.app, name="step")
app.add_typer(serve_cmd.app, name="serve")
app.add_typer(sparsity_cmd.app, name="sparsity")
app.add_typer(sweep_cmd.app, name="sweep")
app.add_typer(trace_cmd.app, name="trace")


def _version(flag: bool) -> None:
    if flag:
        typer.echo(f"simcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    quiet: bool = typer.Option(
        False, "--quiet", help="No progress bars (they are drawn on stderr, on terminals only)."
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    set_debug(debug)
    set_quiet(quiet)


def main() -> None:
    app()
