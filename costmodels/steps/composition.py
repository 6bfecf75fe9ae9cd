"""Composition factors: what a whole step of real software spends on each group of kernels,
relative to the op models' sum, fitted from profiler traces of whole steps.

The op models are fitted on isolated, warmed-up microbenchmarks. Inside a real step the
same kernels run back to back, after other kernels have evicted L2, at clocks set by the
step's own power draw, and with an engine's exact kernel choice (PyTorch's eager
elementwise kernels are not the fused traffic the decomposition prices; Inductor fuses
RoPE into neighbours; torchao's casts are separate passes). A factor per (engine, kernel
group) carries that difference, measured as sum of kernel time per group in real steps
over the decomposition's predicted sum for the same steps (``simcli calibrate
from-trace``, :mod:`calibrate.trace.fit`). Groups are coarse on purpose: a fused
compiled kernel cannot be split by op, but it is always memory-bound.

Applied by :func:`costmodels.steps.training.step_costs` to each op it prices; an engine a
composition file does not name keeps factor 1 (Megatron-LM: no traces of it here).
Collectives are never scaled (their own profile calibrates them). Serving engines are keyed
by launch context, ``<engine>/stream`` (eager launches) and ``<engine>/graph`` (CUDA-graph
replay), and applied by :class:`costmodels.steps.serving.StepModel` (vLLM: none yet).

**Host time.** An engine that dispatches every op from Python (eager PyTorch, and compiled
blocks whose Inductor wrappers launch each kernel) cannot feed the GPU faster than its
host: ``host_s_per_op`` is the host seconds per op instance of the decomposition (forward,
backward, recomputed forward, optimizer), fitted on small steps whose time the host sets.
Steps issued back to back form a single-server queue with deterministic arrivals whose
steady state is the slower of host and GPU (the max-plus form, Baccelli et al. 1992,
ch. 1), so :mod:`simcli.training.simulator` takes ``max(GPU-bound iteration, ops x
host_s_per_op)`` per rank. It is a property of the host CPU and the PyTorch version more
than of the GPU: measured leases of one GPU kind differ by up to 2x on the same step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from workloads.ops import ATTENTION_KINDS, COLLECTIVE_KINDS

GROUPS: tuple[str, ...] = ("gemm", "attention", "memory_bound", "optimizer")
#: host seconds per decomposed op instance (see the module docstring)
HOST_KEY = "host_s_per_op"
HOST_MAX_S = 1e-3  # a millisecond per op would be a broken fit, not a slow host
_ATTN = {k.value for k in ATTENTION_KINDS}
_COLL = {k.value for k in COLLECTIVE_KINDS}
#: shipped compositions, one JSON per GPU id (written by ``simcli calibrate from-trace``)
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "profiles" / "composition"


def group_of(kind: str) -> str | None:
    """The kernel group of an op kind; None for collectives (never scaled)."""
    if kind in _COLL:
        return None
    if kind == "gemm":
        return "gemm"
    if kind in _ATTN:
        return "attention"
    if kind == "adamw":
        return "optimizer"
    return "memory_bound"


class CompositionError(ValueError):
    """A composition file that cannot be used; one line."""


@dataclass(frozen=True)
class Composition:
    """Factors by engine (the training framework name: ``pytorch``, ``pytorch-compile``,
    ...) and group; ``meta`` says where they came from (traces, held-out errors)."""

    gpu: str
    factors: dict[str, dict[str, float]]
    meta: dict[str, Any] = field(default_factory=dict)

    def factor(self, engine: str, kind: str) -> float:
        """The group's factor times the engine's ``idle`` factor (the launch gaps between
        back-to-back kernels of a GPU-bound step)."""
        group = group_of(kind)
        if group is None:
            return 1.0
        return float(self.factors.get(engine, {}).get(group, 1.0)) * self.idle(engine)

    def idle(self, engine: str) -> float:
        """The engine's ``idle`` factor alone (1 when not fitted)."""
        return float(self.factors.get(engine, {}).get("idle", 1.0))

    def host_s_per_op(self, engine: str) -> float:
        """Host dispatch seconds per op instance of ``engine``; 0 when not fitted."""
        return float(self.factors.get(engine, {}).get(HOST_KEY, 0.0))

    def factors_for(self, engine: str, kinds: list[str]) -> np.ndarray:
        """One factor per op kind, for a vector of predicted times."""
        return np.array([self.factor(engine, k) for k in kinds], dtype=float)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "factors": self.factors, "meta": self.meta}


def composition_from_dict(data: dict[str, Any], where: str) -> Composition:
    try:
        gpu, factors = str(data["gpu"]), data["factors"]
    except (KeyError, TypeError):
        raise CompositionError(f"{where}: not a composition (needs gpu and factors)") from None
    out: dict[str, dict[str, float]] = {}
    for engine, groups in dict(factors).items():
        bad = sorted(set(groups) - set(GROUPS) - {"idle", HOST_KEY})
        if bad:
            raise CompositionError(
                f"{where}: unknown group {bad[0]!r} for {engine}; allowed: "
                f"{', '.join(GROUPS)}, idle, {HOST_KEY}"
            )
        for group, value in groups.items():
            if group == HOST_KEY:
                if not (isinstance(value, int | float) and 0.0 <= float(value) <= HOST_MAX_S):
                    raise CompositionError(
                        f"{where}: {engine}/{HOST_KEY} = {value!r}; allowed: seconds in "
                        f"[0, {HOST_MAX_S:g}]"
                    )
                continue
            if not (isinstance(value, int | float) and 0.05 < float(value) < 20.0):
                raise CompositionError(
                    f"{where}: factor {engine}/{group} = {value!r}; allowed: a number in (0.05, 20)"
                )
        out[str(engine)] = {g: float(v) for g, v in groups.items()}
    return Composition(gpu, out, dict(data.get("meta", {})))


def load_composition(path: str | Path) -> Composition:
    """A composition JSON (``simcli calibrate from-trace --out``); one-line errors."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CompositionError(f"composition file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise CompositionError(f"composition file {path}: not JSON ({exc.msg})") from None
    return composition_from_dict(data, str(path))


@lru_cache(maxsize=16)
def shipped_composition(gpu_id: str) -> Composition | None:
    """The composition shipped for ``gpu_id`` (fitted on our traces of that GPU), if any."""
    path = SHIPPED_DIR / f"{gpu_id}.json"
    return load_composition(path) if path.is_file() else None
