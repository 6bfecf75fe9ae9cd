"""The one composition root: a command's inputs resolved once into frozen objects
(hardware and its cost model, model, plan or deployment, engine, prices, memory budget)
that the simulators and searches consume. Commands parse, build a scenario, run, emit."""

from simcli.scenario.hardware import Hardware, resolve_hardware

__all__ = ["Hardware", "resolve_hardware"]
