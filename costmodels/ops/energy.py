"""Joules per op: board power from how hard an op drives the tensor cores and HBM.

P = min(cap, idle + compute_w x tensor utilisation + memory_w x HBM utilisation), where
utilisation is achieved FLOP/s over the dtype's dense peak and achieved bytes/s over
HBM bandwidth; energy = P x time. Compute-bound kernels on an H100 sit at the power cap
(measured: a sustained bf16 GEMM draws 696 W of 700), a device copy well below it (496 W).
Fitted from the calibration runner's NVML power samples (``power`` suite).

A power model belongs to one board: a 350 W H100 PCIe cannot draw what a 700 W H100 SXM
does, so a model is never carried to another GPU. A GPU without its own measured model
gets :func:`datasheet_power_model`, an estimate scaled to and bounded by its own TDP.

:class:`EnergyModel` is the op-level estimator: a cost model's time, FLOPs and bytes and
a fitted :class:`PowerModel` give ``predict(op)`` / ``predict_many(frame)`` in joules,
with scikit-learn's contract (``fit(frame) -> self``, fitted state in ``power_``,
predicting before fitting raises).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from costmodels.ops.common import NotFittedError, Work, peak_flops
from hardware_specs.schema import GpuSpec
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, Op, normalise_frame

if TYPE_CHECKING:
    import pandas as pd


def utilisation(work: Work, dtype: np.ndarray, gpu: GpuSpec) -> tuple[np.ndarray, np.ndarray]:
    """(tensor-core, HBM) utilisation of ops that took ``work.time_s``: achieved FLOP/s over
    the dtype's dense peak and achieved bytes/s over HBM bandwidth, each within [0, 1]."""
    t = np.maximum(work.time_s, 1e-12)
    util_c = np.clip(work.flops / (t * peak_flops(dtype, gpu)), 0.0, 1.0)
    util_m = np.clip(work.bytes / (t * gpu.hbm_bytes_per_s), 0.0, 1.0)
    return util_c, util_m


class PowerModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    idle_w: float = Field(ge=0, description="board power with the GPU idle")
    compute_w: float = Field(ge=0, description="watts added at 100% tensor-core utilisation")
    memory_w: float = Field(ge=0, description="watts added at 100% HBM bandwidth utilisation")
    cap_w: float = Field(gt=0, description="power limit the board enforces")

    def power_w(self, work: Work, dtype: np.ndarray, gpu: GpuSpec) -> np.ndarray:
        util_c, util_m = utilisation(work, dtype, gpu)
        return np.minimum(
            self.cap_w, self.idle_w + self.compute_w * util_c + self.memory_w * util_m
        )

    def energy_j(self, work: Work, dtype: np.ndarray, gpu: GpuSpec) -> np.ndarray:
        return self.power_w(work, dtype, gpu) * work.time_s

    @classmethod
    def fit(
        cls,
        util_compute: np.ndarray,
        util_memory: np.ndarray,
        power_w: np.ndarray,
        idle_w: float,
        cap_w: float,
    ) -> PowerModel:
        """Least squares on samples below the cap; samples at the cap only bound from below.

        A sample within 2% of the cap says the demand was at least the cap, so it enters
        as a one-sided constraint (the model may exceed the cap there, never fall short).
        """
        from scipy.optimize import lsq_linear

        util_compute, util_memory, power_w = map(np.asarray, (util_compute, util_memory, power_w))
        at_cap = power_w >= 0.98 * cap_w
        a = np.column_stack([util_compute, util_memory])
        y = power_w - idle_w
        # Active set that only grows: a capped sample the fit falls short of joins the
        # least-squares rows and stays (so the solution cannot oscillate).
        rows = ~at_cap
        coef = np.zeros(2)
        for _ in range(len(y) + 1):
            if rows.any():
                coef = lsq_linear(a[rows], y[rows], bounds=(0.0, np.inf)).x
            short = at_cap & ~rows & (a @ coef < y * (1 - 1e-9))
            if not short.any():
                break
            rows = rows | short
        return cls(idle_w=idle_w, compute_w=float(coef[0]), memory_w=float(coef[1]), cap_w=cap_w)


# Datasheet-only power model, as fractions of the board's own TDP, from the NVML power
# suites of the H100 SXM and H200 SXM (calibrate/data/*/power.csv, both 700 W boards):
# - idle: 69 and 76 W (0.10-0.11 TDP) -> 0.10;
# - compute: FlashAttention-2 forward at 32-35% of dense tensor peak already drew 97-101%
#   of the limit on both, GEMMs at 61-68% sat at it -> 2.7 TDP per unit of tensor
#   utilisation (a kernel at a third of peak reaches the cap);
# - memory: a 2 GiB copy at 89% of HBM peak drew 0.71 and 0.79 TDP -> 0.68 (the lower).
# Every estimate is then capped at this GPU's own TDP.
DATASHEET_IDLE_FRACTION = 0.10
DATASHEET_COMPUTE_FRACTION = 2.7
DATASHEET_MEMORY_FRACTION = 0.68


def datasheet_power_model(gpu: GpuSpec) -> PowerModel:
    """Board power estimated from the spec alone (no NVML samples of this GPU): the shape
    of the measured Hopper boards as fractions of TDP, scaled to ``gpu.tdp_w`` and capped
    at it. Never exceeds the GPU's own TDP, unlike a model borrowed from a sibling."""
    tdp_w = float(gpu.tdp_w)
    return PowerModel(
        idle_w=DATASHEET_IDLE_FRACTION * tdp_w,
        compute_w=DATASHEET_COMPUTE_FRACTION * tdp_w,
        memory_w=DATASHEET_MEMORY_FRACTION * tdp_w,
        cap_w=tdp_w,
    )


def datasheet_power_note(gpu: GpuSpec) -> str:
    """The label a datasheet-only power model carries wherever it is shown."""
    return (
        f"datasheet estimate (not measured on {gpu.id}): "
        f"P = min({gpu.tdp_w:g} W TDP, {DATASHEET_IDLE_FRACTION:g} + "
        f"{DATASHEET_COMPUTE_FRACTION:g} x tensor util + {DATASHEET_MEMORY_FRACTION:g} x HBM "
        "util, in TDPs)"
    )


class EnergyModel:
    """Joules per op: ``cost_model``'s time, FLOPs and bytes priced by a :class:`PowerModel`.

    ``fit(frame)`` takes the ``power`` suite's rows (an ops frame with ``measured_s`` and
    ``avg_power_w``), works out each row's utilisation from the cost model's FLOPs and
    bytes over the measured time and fits ``power_`` (:meth:`PowerModel.fit`, with the
    board's ``idle_w`` and ``cap_w``); :meth:`from_power` wraps a fitted one (a profile's).
    ``predict(op)`` / ``predict_many(frame)`` return joules: power at the predicted
    utilisation times the predicted time (what ``simcli predict`` reports as
    ``energy_j``).
    """

    def __init__(self, cost_model: Any, *, idle_w: float | None = None, cap_w: float | None = None):
        self.cost_model = cost_model
        self.idle_w = idle_w
        self.cap_w = cap_w

    @classmethod
    def from_power(cls, cost_model: Any, power: PowerModel) -> EnergyModel:
        """A fitted model from a fitted :class:`PowerModel` (e.g. a profile's ``power``)."""
        model = cls(cost_model, idle_w=power.idle_w, cap_w=power.cap_w)
        model.power_ = power
        return model

    @property
    def gpu(self) -> GpuSpec:
        return self.cost_model.gpu

    def fit(self, frame: pd.DataFrame) -> EnergyModel:
        missing = [c for c in ("measured_s", "avg_power_w") if c not in frame.columns]
        if missing:
            raise ValueError(f"fit needs column(s) {', '.join(missing)}")
        if self.idle_w is None or self.cap_w is None:
            raise ValueError(
                "fit needs the board's idle_w and cap_w (EnergyModel(..., idle_w=, cap_w=))"
            )
        measured = frame["measured_s"].to_numpy(dtype=float)
        power = frame["avg_power_w"].to_numpy(dtype=float)
        if not (np.all(np.isfinite(measured) & (measured > 0)) and np.all(np.isfinite(power))):
            raise ValueError("measured_s must be finite and positive, avg_power_w finite")
        ops = normalise_frame(frame[[c for c in frame.columns if c in _OP_COLUMNS]])
        work = self.cost_model.work_many(ops, validated=True)
        dtype = ops["dtype"].to_numpy(dtype=str)
        util_c, util_m = utilisation(Work(measured, work.flops, work.bytes), dtype, self.gpu)
        self.power_ = PowerModel.fit(util_c, util_m, power, self.idle_w, self.cap_w)
        return self

    def _check_fitted(self) -> PowerModel:
        if not hasattr(self, "power_"):
            raise NotFittedError("EnergyModel is not fitted: call fit() or use from_power()")
        return self.power_

    def predict_many(self, frame: pd.DataFrame, *, validated: bool = False) -> np.ndarray:
        """Joules per row of an ops frame (validated first unless ``validated``)."""
        power = self._check_fitted()
        if not validated:
            frame = normalise_frame(frame)
        work = self.cost_model.work_many(frame, validated=True)
        return power.energy_j(work, frame["dtype"].to_numpy(dtype=str), self.gpu)

    def predict(self, op: Op) -> float:
        """Joules of one op."""
        power = self._check_fitted()
        work = self.cost_model.work(op)
        return float(power.energy_j(work, np.array([op.dtype.value]), self.gpu)[0])


_OP_COLUMNS = {*CSV_COLUMNS, *EXTRA_COLUMNS}
