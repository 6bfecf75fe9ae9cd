"""The step model against the measured CUDA-graph decode steps with FlashInfer attention.

    python -m calibrate.engine_step_check        # prints one line per GPU and a table

calibrate/bench/engine_step.py timed a Llama-3-8B-shaped decode step whose attention is
FlashInfer's paged decode (tensor cores, CUDA graph) and whose other ops are the eager
PyTorch ones of calibrate/steps/serve_step.py. ``simcli step --engine pytorch-eager
--attn-backend flashinfer`` (its step model, costmodels.steps.serving.StepModel) describes
that step (the eager engine's ops, FlashInfer's
attention), so its error on those steps is the step model's error with the engines'
attention kernel. Nothing here was fitted on these steps.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from costmodels.steps.serving import StepModel

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"h100-sxm": "engine-kernels-h100-sxm", "h200-sxm": "engine-kernels-h200-sxm"}


@lru_cache(maxsize=4)
def step_model(gpu: str) -> StepModel:
    """The eager engine's step model with FlashInfer attention: what ``simcli step
    --engine pytorch-eager --attn-backend flashinfer --model llama3-8b`` prices."""
    return StepModel("llama3-8b", gpu, engine="pytorch-eager", attn_backend="flashinfer")


def predicted_ms(gpu: str, batch: int, context: int) -> float:
    none = np.zeros(0, np.int64)
    return step_model(gpu).step_ms(none, none, np.full(batch, context, dtype=np.int64))


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
