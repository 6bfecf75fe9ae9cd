"""Joules per op: board power from how hard an op drives the tensor cores and HBM.

P = min(cap, idle + compute_w x tensor utilisation + memory_w x HBM utilisation), where
utilisation is achieved FLOP/s over the dtype's dense peak and achieved bytes/s over
HBM bandwidth; energy = P x time. Compute-bound kernels on an H100 sit at the power cap
(measured: a sustained bf16 GEMM draws 696 W of 700), a device copy well below it (496 W).
Fitted from the calibration runner's NVML power samples (``power`` suite).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from costmodels.ops.common import Work, peak_flops
from hardware_specs.schema import GpuSpec


class PowerModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    idle_w: float = Field(ge=0, description="board power with the GPU idle")
    compute_w: float = Field(ge=0, description="watts added at 100% tensor-core utilisation")
    memory_w: float = Field(ge=0, description="watts added at 100% HBM bandwidth utilisation")
    cap_w: float = Field(gt=0, description="power limit the board enforces")

    def power_w(self, work: Work, dtype: np.ndarray, gpu: GpuSpec) -> np.ndarray:
        t = np.maximum(work.time_s, 1e-12)
        util_c = np.clip(work.flops / (t * peak_flops(dtype, gpu)), 0.0, 1.0)
        util_m = np.clip(work.bytes / (t * gpu.hbm_bytes_per_s), 0.0, 1.0)
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
