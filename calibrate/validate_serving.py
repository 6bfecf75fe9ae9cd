"""Validation of the serving step model against the steps measured on an H100
(``calibrate/data/steps-h100``): the rows ``benchmarks/validate_serving_step.py`` prints
and the tests hold, and the derivation of the eager engine's host constant
(:data:`costmodels.steps.serving.EAGER_HOST_DISPATCH_S`) from the eager decode rows.
Run-time prediction never reads these files.
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodels.steps.serving import EAGER_HOST_DISPATCH_S, StepModel

STEPS_DIR = Path(__file__).resolve().parent / "data" / "steps-h100"
SERVE_STEP_CSV = STEPS_DIR / "serve_step.csv"
#: later traced suites (calibrate/steps/suite.sh): GPU id -> folder; model id -> subfolder
TRACED_DIRS = {
    "h100-sxm": STEPS_DIR.parent / "steps2-h100-sxm",
    "h200-sxm": STEPS_DIR.parent / "steps2-h200-sxm",
}
TRACED_MODELS = {"llama3-8b": "serve-llama3-8b", "qwen2.5-7b": "serve-qwen2.5-7b-like"}
EAGER_DECODE_CSV = STEPS_DIR / "eager-decode" / "serve_step_eager.csv"

# Notes on the H100 validation (benchmarks/validate_serving_step.py prints the table):
#
# - Prefill 1x512 is the one row outside 10% (-13.7%). The model has it host-bound (26.3 ms
#   of dispatch for ~20 ms of GPU work); it was measured in another session than the
#   eager-decode rows the host constant comes from, and its 31.0 ms implies ~24 us per call,
#   slower than any eager-decode row (16.7-21.8 us; those drift by 30% within one session).
#   On a later H100 lease (2026-11, same software, a faster host) eager decode 1x1024 and
#   prefill 1x512 timed alternately in one process spent the same host time (15.0 ms each)
#   and took 15.4 and 19.2 ms; the constant solved from that session's decode steps
#   (11.9 us) predicts the prefill at 20.1 ms (+4.5%) and 2x512 at 34.8 ms (32.8, +6.2%).
# - The per-kernel floors were probed on lent Hopper GPUs with the scripts in
#   calibrate/steps/probes/ (outputs in calibrate/data/steps-h100/probes/): a CUDA graph of
#   2,000 in-place adds replayed (graph_floor.py: graph floor), and the serve_step.py
#   forward run eagerly, replayed from a graph, and profiled with torch.profiler
#   (graph_floor.py, prefill_kernels.py: stream floor, kernel counts per layer, the HBM
#   fractions of the eager pointwise kernels); host_session.py times eager decode and
#   prefill alternately in one process.


def step_args(r: Any) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(length, step-model arguments) of one serve_step.csv row: a prefill of ``batch``
    prompts of ``prompt_len`` or a decode of ``batch`` sequences over ``context_len``."""
    none = np.zeros(0, np.int64)
    b = int(r.batch)
    if r.phase == "prefill":
        n = int(r.prompt_len)
        return n, (np.full(b, n), np.zeros(b, np.int64), none)
    n = int(r.context_len)
    return n, (none, none, np.full(b, n))


@lru_cache(maxsize=4)
def cached_step_model(model_id: str, gpu_id: str, engine: str, tp: int = 1) -> StepModel:
    return StepModel(model_id, gpu_id, engine=engine, tp=tp)


def eager_decode_stream_s(sm: StepModel, batch: int, context_len: int, host_s: float) -> float:
    """A decode step of the eager engine run eagerly, not from a graph (the eager-decode
    rows): the launch-queue recurrence over its torch calls."""
    none = np.zeros(0, np.int64)
    return sm.eager_stream_s(none, none, np.full(batch, context_len), host_s)


def derive_host_dispatch_s(
    csv_path: Path = EAGER_DECODE_CSV, model_id: str = "llama3-8b", gpu_id: str = "h100-sxm"
) -> tuple[float, list[dict[str, float]]]:
    """The eager engine's host seconds per torch call: for each measured eager decode step,
    the constant whose launch-queue time equals the measurement (bisection; the time is
    increasing in it); their median. Returns (median, per-row values)."""
    sm = cached_step_model(model_id, gpu_id, "pytorch-eager")
    rows = pd.read_csv(csv_path)
    rows = rows[rows["status"] == "ok"]
    out = []
    for r in rows.itertuples():
        target = float(r.step_ms) / 1e3
        lo, hi = 0.0, 1e-3
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if eager_decode_stream_s(sm, int(r.batch), int(r.context_len), mid) > target:
                hi = mid
            else:
                lo = mid
        out.append(
            {
                "batch": int(r.batch),
                "context_len": int(r.context_len),
                "measured_ms": float(r.step_ms),
                "host_s_per_call": lo,
            }
        )
    return statistics.median(o["host_s_per_call"] for o in out), out


def h100_validation_rows(model_id: str = "llama3-8b") -> list[dict[str, Any]]:
    """Every ok row of calibrate/data/steps-h100/serve_step.csv (eager prefill, graph
    decode) and the eager decode rows, with both engines' predictions."""
    eager = cached_step_model(model_id, "h100-sxm", "pytorch-eager")
    vllm = cached_step_model(model_id, "h100-sxm", "vllm")
    out: list[dict[str, Any]] = []
    steps = pd.read_csv(SERVE_STEP_CSV)
    for r in steps[steps["status"] == "ok"].itertuples():
        b = int(r.batch)
        n, args = step_args(r)
        pred = eager.step_s(*args)
        out.append(
            {
                "phase": r.phase,
                "batch": b,
                "length": n,
                "timing": r.timing,
                "measured_ms": float(r.step_ms),
                "predicted_ms": 1e3 * pred,
                "vllm_ms": 1e3 * vllm.step_s(*args),
                "error_pct": 100.0 * (1e3 * pred / float(r.step_ms) - 1.0),
                "used_for": "validation",
            }
        )
    ed = pd.read_csv(EAGER_DECODE_CSV)
    for r in ed[ed["status"] == "ok"].itertuples():
        b, n = int(r.batch), int(r.context_len)
        pred = eager_decode_stream_s(eager, b, n, EAGER_HOST_DISPATCH_S)
        out.append(
            {
                "phase": "decode-eager",
                "batch": b,
                "length": n,
                "timing": r.timing,
                "measured_ms": float(r.step_ms),
                "predicted_ms": 1e3 * pred,
                "vllm_ms": math.nan,
                "error_pct": 100.0 * (1e3 * pred / float(r.step_ms) - 1.0),
                "used_for": "host constant",
            }
        )
    return out


def traced_validation_rows() -> list[dict[str, Any]]:
    """Every ok prefill / graph-decode row of the traced suites on H100 and H200 (Llama-3-8B
    and the Qwen2.5-7B shape, which no constant was derived from), engine pytorch-eager."""
    out: list[dict[str, Any]] = []
    for gpu, folder in TRACED_DIRS.items():
        for model_id, sub in TRACED_MODELS.items():
            sm = cached_step_model(model_id, gpu, "pytorch-eager")
            df = pd.read_csv(folder / sub / "serve_step.csv")
            for r in df[df["status"] == "ok"].itertuples():
                b = int(r.batch)
                n, args = step_args(r)
                pred_ms = 1e3 * sm.step_s(*args)
                out.append(
                    {
                        "gpu": gpu,
                        "model": model_id,
                        "phase": str(r.phase),
                        "batch": b,
                        "length": n,
                        "measured_ms": float(r.step_ms),
                        "predicted_ms": pred_ms,
                        "error_pct": 100.0 * (pred_ms / float(r.step_ms) - 1.0),
                    }
                )
    return out
