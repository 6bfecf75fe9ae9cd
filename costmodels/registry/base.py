"""The registry's entry type and the registry itself (see :mod:`costmodels.registry`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

GPU = "h100-sxm"
MODEL = "llama3-8b"
FACTORS = (1.001, 1.1, 1.5, 2.0, 3.0)


@dataclass(frozen=True)
class Registered:
    """One registered cost model; see the module docstring."""

    name: str
    unit: str  # "s", "J" or "bytes"
    build: Callable[[], Any]
    sample: Callable[[np.random.Generator], Any]
    grow: Callable[[Any, np.random.Generator], Any]
    summary: str = ""
    as_input: Callable[[Any], Any] | None = None
    many: Callable[[Sequence[Any]], Any] = list
    reference: Callable[[Any, Any], float] | None = None
    vector_rtol: float = 1e-12
    monotone_rtol: float = 0.0
    tolerance_note: str = ""
    unfitted: Callable[[], Any] | None = None
    fit_frame: Callable[[np.random.Generator], Any] | None = None

    @property
    def fittable(self) -> bool:
        return self.unfitted is not None

    def model_input(self, x: Any) -> Any:
        """What ``predict`` takes, from a sampled input (the input itself by default)."""
        return self.as_input(x) if self.as_input is not None else x

    def predict(self, model: Any, x: Any) -> float:
        return float(model.predict(self.model_input(x)))

    def predict_many(self, model: Any, xs: Sequence[Any]) -> np.ndarray:
        return np.asarray(model.predict_many(self.many([self.model_input(x) for x in xs])))

    def reference_value(self, model: Any, x: Any) -> float:
        """The scalar path ``predict_many`` is compared with (``predict`` by default)."""
        if self.reference is not None:
            return float(self.reference(model, self.model_input(x)))
        return self.predict(model, x)

    def ladder(self, rng: np.random.Generator, steps: int) -> list[Any]:
        """A sampled input followed by ``steps`` growths of it (each at least as much work)."""
        out = [self.sample(rng)]
        for _ in range(steps):
            out.append(self.grow(out[-1], rng))
        return out


REGISTRY: dict[str, Registered] = {}


def register(entry: Registered) -> Registered:
    if entry.name in REGISTRY:
        raise ValueError(f"cost model {entry.name!r} is already registered")
    REGISTRY[entry.name] = entry
    return entry


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> Registered:
    if name not in REGISTRY:
        raise KeyError(f"unknown cost model {name!r}; allowed: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def log_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    """Log-uniform integer in [lo, hi]."""
    return int(min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))))


def choice(rng: np.random.Generator, values: Sequence[Any]) -> Any:
    return values[int(rng.integers(len(values)))]
