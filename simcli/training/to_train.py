"""Time and cost to train: a plan's iteration, scaled to a token budget.

``iterations = ceil(train_tokens / tokens per iteration)``; days, GPU-hours and US$ follow
from the simulated iteration time, the job's GPU count and the GPU's price. What a
planner compares plans by when the budget is fixed (tokens), not the iteration.
"""

from __future__ import annotations

import math
from typing import Any

SECONDS_PER_DAY = 86400.0


def to_train_fields(
    *,
    iteration_s: float,
    tokens_per_iteration: int,
    num_gpus: int,
    usd_per_gpu_hour: float | None,
    train_tokens: float,
) -> dict[str, Any]:
    """The output keys of ``--train-tokens``: iterations, days, GPU-hours and US$ (None
    when the GPU has no known price)."""
    iterations = math.ceil(train_tokens / tokens_per_iteration)
    seconds = iterations * iteration_s
    gpu_hours = seconds * num_gpus / 3600.0
    cost = None if usd_per_gpu_hour is None else gpu_hours * usd_per_gpu_hour
    return {
        "train_tokens": train_tokens,
        "train_iterations": iterations,
        "days_to_train": seconds / SECONDS_PER_DAY,
        "gpu_hours_to_train": gpu_hours,
        "cost_usd_to_train": cost,
    }


#: what each key means (docs and CSV schemas)
TO_TRAIN_COLUMNS: dict[str, str] = {
    "train_tokens": "--train-tokens: the token budget",
    "train_iterations": "iterations to consume it (ceil of tokens / tokens per iteration)",
    "days_to_train": "days of wall clock at the simulated iteration time",
    "gpu_hours_to_train": "GPU-hours to train",
    "cost_usd_to_train": "US$ to train at the GPU price (empty: no price known)",
}
