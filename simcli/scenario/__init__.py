"""The one composition root: a command's inputs resolved once into frozen objects
(hardware and its cost model, model, plan or deployment, engine, prices, memory budget)
that the simulators and searches consume. Commands parse, build a scenario, run, emit."""

from simcli.scenario.hardware import Hardware, resolve_hardware
from simcli.scenario.serving import (
    ServeOptions,
    ServePlanOptions,
    StepOptions,
    resolve_serve,
    resolve_serve_plan,
    resolve_step,
    run_serve,
    run_serve_plan,
    run_step,
)

__all__ = [
    "Hardware",
    "ServeOptions",
    "ServePlanOptions",
    "StepOptions",
    "resolve_hardware",
    "resolve_serve",
    "resolve_serve_plan",
    "resolve_step",
    "run_serve",
    "run_serve_plan",
    "run_step",
]
