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
from simcli.scenario.training import (
    PlanConfig,
    PlanScenario,
    TrainConfig,
    TrainRun,
    TrainScenario,
    resolve_plan,
    resolve_train,
    run_plan,
    run_train,
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
    "PlanConfig",
    "PlanScenario",
    "TrainConfig",
    "TrainRun",
    "TrainScenario",
    "resolve_hardware",
    "resolve_plan",
    "resolve_train",
    "run_plan",
    "run_train",
]
