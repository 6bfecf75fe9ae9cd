"""The step model against the measured CUDA-graph decode steps with FlashInfer attention.

    python -m calibrate.engine_step_check        # prints one line per GPU and a table

calibrate/bench/engine_step.py timed a Llama-3-8B-shaped decode step whose attention is
FlashInfer's paged decode (tensor cores, CUDA graph) and whose other ops are the eager
PyTorch ones of calibrate/steps/serve_step.py. ``simcli step --engine pytorch-eager
--attn-backend flashinfer`` describes that step (the eager engine's ops, FlashInfer's
attention), so its error on those steps is the step model's error with the engines'
attention kernel. Nothing here was fitted on these steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"h100-sxm": "engine-kernels-h100-sxm", "h200-sxm": "engine-kernels-h200-sxm"}


def predicted_ms(gpu: str, batch: int, context: int) -> float:
    from simcli.scenario.serving import resolve_step, run_step
    from simcli.scenario.serving_options import StepOptions

    # llama3.1-8b: Llama-3-8B's shapes with a context past 8192 (the 8k rows attend 8193 keys)
    cfg = StepOptions(model="llama3.1-8b", gpu=gpu, phase="decode", batch=batch,
                      context_len=context, engine="pytorch-eager",
                      attn_backend="flashinfer")  # fmt: skip
    return float(run_step(resolve_step(cfg))["step_ms"])


def compare(gpu: str) -> pd.DataFrame:
    rows = pd.read_csv(ROOT / "calibrate" / "data" / FOLDERS[gpu] / "step" / "engine_step.csv")
    rows = rows[rows["status"] == "ok"].reset_index(drop=True)
    pairs = zip(rows["batch"], rows["context_len"], strict=True)
    rows["predicted_ms"] = [predicted_ms(gpu, int(b), int(n)) for b, n in pairs]
    rows["error_pct"] = (rows["predicted_ms"] / rows["step_ms"] - 1.0) * 100.0
    return rows[["batch", "context_len", "step_ms", "predicted_ms", "error_pct"]]


def main() -> int:
    for gpu in FOLDERS:
        t = compare(gpu)
        err = t["error_pct"].abs()
        print(f"{gpu}: {len(t)} steps, MAPE {err.mean():.1f}%, max {err.max():.1f}%, "
              f"median signed {np.median(t['error_pct']):+.1f}%")  # fmt: skip
        print(t.round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
