"""``simcli step``: latency of one serving-engine iteration (prefill, decode or mixed).

Parses (:class:`~simcli.scenario.step_options.StepOptions`), resolves the hardware and step
model (:func:`~simcli.scenario.step.resolve_step`), prices the iteration
(:func:`~simcli.scenario.step.run_step`) and emits it.
"""

import typer

from simcli.errors import user_errors
from simcli.options import SimcliGroup, config_options
from simcli.output import Format, emit_object
from simcli.scenario.step_options import StepOptions

app = typer.Typer(
    cls=SimcliGroup,
    help="Latency of one prefill, decode or mixed (chunked-prefill) engine iteration.",
)


@app.callback(invoke_without_command=True)
@config_options(StepOptions)
def step(
    config: StepOptions,
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Step time, tokens/s and a per-op breakdown of one engine iteration on one replica."""
    # the step model (and pandas) load to run, not for `simcli step --help`
    from simcli.scenario.step import resolve_step, run_step

    with user_errors():
        scenario = resolve_step(config)
        out = run_step(scenario)
        emit_object(out, fmt, title=scenario.title)
        if not out["kv_fits"]:
            typer.echo(
                f"warning: the batch's sequences need {out['kv_tokens_needed']} KV tokens; "
                f"the cache holds {out['kv_capacity_tokens']} (the engine would queue or "
                "preempt some of them)",
                err=True,
            )
