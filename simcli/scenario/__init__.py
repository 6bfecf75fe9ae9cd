"""The one composition root: a command's inputs resolved once into frozen objects
(hardware and its cost model, model, plan or deployment, engine, prices, memory budget)
that the simulators and searches consume. Commands parse, build a scenario, run, emit.

Names load on first use (PEP 562 ``__getattr__``): ``simcli.scenario.predict`` does not
import the serving or training scenarios, nor they each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simcli.lazy import lazy_attributes

# public name -> the submodule that defines it
_WHERE = {
    "Hardware": "simcli.scenario.hardware",
    "resolve_hardware": "simcli.scenario.hardware",
    "AttentionConfig": "simcli.scenario.predict",
    "BlocksparseConfig": "simcli.scenario.predict",
    "CollectiveConfig": "simcli.scenario.predict",
    "DecodeConfig": "simcli.scenario.predict",
    "ElementwiseConfig": "simcli.scenario.predict",
    "GemmConfig": "simcli.scenario.predict",
    "LayerConfig": "simcli.scenario.predict",
    "PredictBatchConfig": "simcli.scenario.predict",
    "resolve_layer": "simcli.scenario.predict",
    "resolve_op": "simcli.scenario.predict",
    "resolve_predict_batch": "simcli.scenario.predict",
    "run_layer": "simcli.scenario.predict",
    "run_op": "simcli.scenario.predict",
    "run_predict_batch": "simcli.scenario.predict",
    "COMMANDS": "simcli.scenario.registry",
    "ScenarioCommand": "simcli.scenario.registry",
    "scenario_command": "simcli.scenario.registry",
    "ServeOptions": "simcli.scenario.serving",
    "ServePlanOptions": "simcli.scenario.serving",
    "StepOptions": "simcli.scenario.step_options",
    "resolve_serve": "simcli.scenario.serving",
    "resolve_serve_plan": "simcli.scenario.serving",
    "resolve_step": "simcli.scenario.step",
    "run_serve": "simcli.scenario.serving",
    "run_serve_plan": "simcli.scenario.serving",
    "run_step": "simcli.scenario.step",
    "SparsityConfig": "simcli.scenario.sparsity",
    "resolve_sparsity": "simcli.scenario.sparsity",
    "run_sparsity": "simcli.scenario.sparsity",
    "PlanConfig": "simcli.scenario.training",
    "PlanScenario": "simcli.scenario.training",
    "TrainConfig": "simcli.scenario.training",
    "TrainRun": "simcli.scenario.training",
    "TrainScenario": "simcli.scenario.training",
    "resolve_plan": "simcli.scenario.training",
    "resolve_train": "simcli.scenario.training",
    "run_plan": "simcli.scenario.training",
    "run_train": "simcli.scenario.training",
}

if TYPE_CHECKING:
    from simcli.scenario.hardware import Hardware, resolve_hardware
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
    from simcli.scenario.registry import COMMANDS, ScenarioCommand, scenario_command
    from simcli.scenario.serving import (
        ServeOptions,
        ServePlanOptions,
        resolve_serve,
        resolve_serve_plan,
        run_serve,
        run_serve_plan,
    )
    from simcli.scenario.sparsity import SparsityConfig, resolve_sparsity, run_sparsity
    from simcli.scenario.step import resolve_step, run_step
    from simcli.scenario.step_options import StepOptions
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


__getattr__ = lazy_attributes(__name__, _WHERE, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "AttentionConfig",
    "BlocksparseConfig",
    "COMMANDS",
    "CollectiveConfig",
    "DecodeConfig",
    "ElementwiseConfig",
    "GemmConfig",
    "LayerConfig",
    "PredictBatchConfig",
    "ScenarioCommand",
    "SparsityConfig",
    "resolve_layer",
    "resolve_op",
    "resolve_predict_batch",
    "resolve_sparsity",
    "run_layer",
    "run_op",
    "run_predict_batch",
    "run_sparsity",
    "scenario_command",
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
