"""Every results command as a library call: command name -> (config model, run function).

A :class:`ScenarioCommand` is what ``simcli <name> ... --format json`` computes, without the
command line: its options as a pydantic config (the same model the command's options come
from) and a function from a config to the JSON object the command prints. Sweeps run their
points through it (:mod:`simcli.sweep.target`); anything else that wants "the result of
this command for these inputs" can too.

The run functions resolve the scenario and run it with the same library calls as the
commands, and return the object before JSON encoding; :meth:`ScenarioCommand.run` applies
what the command's JSON output applies (non-finite floats become null).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from simcli.output import jsonable
from simcli.scenario.predict import (
    AttentionConfig,
    BlocksparseConfig,
    CollectiveConfig,
    DecodeConfig,
    ElementwiseConfig,
    GemmConfig,
    LayerConfig,
    PredictBatchConfig,
    resolve_layer,
    resolve_op,
    resolve_predict_batch,
    run_layer,
    run_op,
    run_predict_batch,
)
from simcli.scenario.serving import resolve_serve, resolve_serve_plan, run_serve, run_serve_plan
from simcli.scenario.serving_options import ServeOptions, ServePlanOptions
from simcli.scenario.sparsity import SparsityConfig, resolve_sparsity, run_sparsity
from simcli.scenario.step import resolve_step, run_step
from simcli.scenario.step_options import StepOptions
from simcli.scenario.training import (
    PlanConfig,
    TrainConfig,
    plan_object,
    resolve_plan,
    resolve_train,
    run_plan,
    run_train,
)


class UnknownCommand(ValueError):
    """A command name with no registered scenario; one line listing the known ones."""


@dataclass(frozen=True)
class ScenarioCommand:
    """One results command: ``name`` as typed after ``simcli`` (``predict gemm``), the
    pydantic ``config`` its options are, and ``compute(config)``: the JSON object of
    ``simcli <name> ... --format json`` (before encoding)."""

    name: str
    config: type[BaseModel]
    compute: Callable[[Any], dict[str, Any]]
    aliases: tuple[str, ...] = ()

    @property
    def path(self) -> tuple[str, ...]:
        """The words after ``simcli``."""
        return tuple(self.name.split())

    def run(self, config: BaseModel) -> dict[str, Any]:
        """The command's JSON object for ``config`` (NaN and inf as None, as printed)."""
        if not isinstance(config, self.config):
            raise TypeError(f"{self.name} takes a {self.config.__name__}")
        return jsonable(self.compute(config))


def _train(config: TrainConfig) -> dict[str, Any]:
    return run_train(resolve_train(config)).to_dict()


def _plan(config: PlanConfig) -> dict[str, Any]:
    return plan_object(run_plan(resolve_plan(config)), config)


def _serve(config: ServeOptions) -> dict[str, Any]:
    run = run_serve(resolve_serve(config))
    return {**run.output, "per_replica": run.result.per_replica}


def _serve_plan(config: ServePlanOptions) -> dict[str, Any]:
    result = run_serve_plan(resolve_serve_plan(config))
    return {**result.summary(), "deployments": result.records()}


def _step(config: StepOptions) -> dict[str, Any]:
    return run_step(resolve_step(config))


def _sparsity(config: SparsityConfig) -> dict[str, Any]:
    return run_sparsity(resolve_sparsity(config)).to_dict()


def _predict_batch(config: PredictBatchConfig) -> dict[str, Any]:
    return run_predict_batch(resolve_predict_batch(config)).to_dict()


def _predict_op(config: Any) -> dict[str, Any]:
    return run_op(resolve_op(config)).to_dict()


def _predict_layer(config: LayerConfig) -> dict[str, Any]:
    return run_layer(resolve_layer(config)).to_dict()


COMMANDS: dict[str, ScenarioCommand] = {
    c.name: c
    for c in (
        ScenarioCommand("train", TrainConfig, _train),
        ScenarioCommand("plan", PlanConfig, _plan),
        ScenarioCommand("serve", ServeOptions, _serve),
        ScenarioCommand("serve plan", ServePlanOptions, _serve_plan),
        ScenarioCommand("step", StepOptions, _step),
        ScenarioCommand("sparsity compare", SparsityConfig, _sparsity, aliases=("sparsity",)),
        ScenarioCommand("predict", PredictBatchConfig, _predict_batch),
        ScenarioCommand("predict gemm", GemmConfig, _predict_op),
        ScenarioCommand("predict attention", AttentionConfig, _predict_op),
        ScenarioCommand("predict decode", DecodeConfig, _predict_op),
        ScenarioCommand("predict blocksparse", BlocksparseConfig, _predict_op),
        ScenarioCommand("predict collective", CollectiveConfig, _predict_op),
        ScenarioCommand("predict elementwise", ElementwiseConfig, _predict_op),
        ScenarioCommand("predict layer", LayerConfig, _predict_layer),
    )
}
ALIASES: dict[str, str] = {a: c.name for c in COMMANDS.values() for a in c.aliases}


def command_names(*, aliases: bool = True) -> list[str]:
    """Every registered name (and alias), sorted."""
    return sorted([*COMMANDS, *(ALIASES if aliases else ())])


def scenario_command(name: str) -> ScenarioCommand:
    """The command ``name`` (words separated by any spaces; an alias resolves to its
    command); :class:`UnknownCommand` naming the closest name and the allowed ones."""
    key = " ".join(str(name).split())
    key = ALIASES.get(key, key)
    if key in COMMANDS:
        return COMMANDS[key]
    names = command_names()
    close = difflib.get_close_matches(key, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UnknownCommand(f"unknown command {name!r}; {hint}allowed: {', '.join(names)}")


__all__ = [
    "ALIASES",
    "COMMANDS",
    "ScenarioCommand",
    "UnknownCommand",
    "command_names",
    "scenario_command",
]
