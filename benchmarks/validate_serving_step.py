"""Validation of `simcli step` against real H100 serving steps (not its own formulas).

Run: python benchmarks/validate_serving_step.py

The measurements (calibrate/data/steps-h100, calibrate/steps/serve_step.py) are a plain
PyTorch Llama-3-8B-shaped model on one H100: eager prefill (batch 1-16 x 512-8192 tokens)
and decode steps replayed from CUDA graphs (batch 1-256 x context 1024-8192), predicted
with engine pytorch-eager (the measured engine); the vllm column is the vLLM V1 engine
profile (fused kernels, CUDA graphs, host work; docs/engines.md) on the same steps, for
comparison. The eager (not graph) decode rows are the ones
the host dispatch constant was derived from; they are listed, not validated.
"""

from __future__ import annotations

import time

import numpy as np

from calibrate.validate_serving import (
    derive_host_dispatch_s,
    h100_validation_rows,
    traced_validation_rows,
)
from costmodels.steps.serving import EAGER_HOST_DISPATCH_S, StepModel


def _table(rows: list[dict]) -> None:
    head = ("phase", "batch", "length", "measured_ms", "predicted_ms", "error", "vllm_ms", "use")
    print(
        f"{head[0]:13s} {head[1]:>5s} {head[2]:>6s} {head[3]:>11s} {head[4]:>12s} "
        f"{head[5]:>7s} {head[6]:>8s}  {head[7]}"
    )
    for r in rows:
        vllm = "" if np.isnan(r["vllm_ms"]) else f"{r['vllm_ms']:8.2f}"
        print(
            f"{r['phase']:13s} {r['batch']:5d} {r['length']:6d} {r['measured_ms']:11.2f} "
            f"{r['predicted_ms']:12.2f} {r['error_pct']:6.1f}% {vllm:>8s}  {r['used_for']}"
        )


def main() -> None:
    rows = h100_validation_rows()
    print("Single H100, Llama-3-8B-shaped plain PyTorch model (calibrate/data/steps-h100)")
    print("predicted: engine pytorch-eager; vllm_ms: engine vllm on the same step\n")
    _table(rows)
    print()
    for phase in ("prefill", "decode"):
        sel = [r for r in rows if r["phase"] == phase]
        errs = np.array([abs(r["error_pct"]) for r in sel])
        worst = sorted(sel, key=lambda r: -abs(r["error_pct"]))[:3]
        worst_text = ", ".join(f"{r['batch']}x{r['length']} {r['error_pct']:+.1f}%" for r in worst)
        print(
            f"{phase:8s} rows {len(sel):2d}  MAPE {errs.mean():4.1f}%  max {errs.max():4.1f}%  "
            f"within 10%: {int((errs <= 10).sum())}/{len(sel)}  worst: {worst_text}"
        )

    median, per_row = derive_host_dispatch_s()
    values = ", ".join(f"{1e6 * r['host_s_per_call']:.1f}" for r in per_row)
    print(
        f"\nhost dispatch per torch call (eager engine), solved from each eager decode row: "
        f"{values} us; median {1e6 * median:.2f} us (constant {1e6 * EAGER_HOST_DISPATCH_S:.2f})"
    )

    print("\nLater H100 / H200 leases with traces (calibrate/data/steps2-*), engine pytorch-eager")
    traced = traced_validation_rows()
    for r in traced:
        print(
            f"{r['gpu']:9s} {r['model']:11s} {r['phase']:8s} {r['batch']:3d} x {r['length']:5d} "
            f"{r['measured_ms']:8.2f} {r['predicted_ms']:8.2f} {r['error_pct']:+6.1f}%"
        )
    for gpu in ("h100-sxm", "h200-sxm"):
        for phase in ("prefill", "decode"):
            errs = np.array(
                [abs(r["error_pct"]) for r in traced if r["gpu"] == gpu and r["phase"] == phase]
            )
            print(f"{gpu} {phase:8s} MAPE {errs.mean():4.1f}%  max {errs.max():4.1f}%")

    sm = StepModel("llama3-8b", "h100-sxm")
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(5000):
        n_dec = int(rng.integers(0, 256))
        n_pre = int(rng.integers(0, 3)) if n_dec else int(rng.integers(1, 3))
        steps.append(
            (
                rng.integers(1, 2048, n_pre),
                rng.integers(0, 4096, n_pre),
                rng.integers(1, 8192, n_dec),
            )
        )
    t0 = time.perf_counter()
    for s in steps:
        sm.step_s(*s)
    dt = time.perf_counter() - t0
    print(
        f"\nStepModel.step_s (vllm, mixed batches of up to 2 chunks + 255 decodes): "
        f"{len(steps) / dt:,.0f} calls/s ({1e6 * dt / len(steps):.1f} us per call)"
    )


if __name__ == "__main__":
    main()
