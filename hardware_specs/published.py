"""Published MFU ceilings per GPU type (``data/published_mfu.yaml``): what real training
runs have reached, so a prediction beyond them can say so. Reference data only."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml

AT_SCALE_GPUS = 64


@lru_cache(maxsize=1)
def _table() -> dict[str, dict]:
    text = resources.files("hardware_specs").joinpath("data/published_mfu.yaml").read_text()
    return {r["gpu"]: r for r in yaml.safe_load(text)["published_mfu"]}


def mfu_note(gpu_id: str, mfu: float, num_gpus: int) -> str | None:
    """A sentence when ``mfu`` exceeds the highest MFU published for ``gpu_id`` (at 64+
    GPUs, the at-scale figure), naming it and its source; None otherwise or when no
    figure is known for the GPU."""
    row = _table().get(gpu_id)
    if row is None:
        return None
    key = "at_scale" if num_gpus >= AT_SCALE_GPUS else "any"
    best = float(row[key])
    if mfu <= best:
        return None
    where = f"{AT_SCALE_GPUS}+ GPU jobs" if key == "at_scale" else "any job size"
    return (
        f"MFU {mfu:.2f} exceeds the highest published for {gpu_id} ({where}: {best:.2f}, "
        f"{row[key + '_source']}); treat it as an upper bound: the model assumes kernels, "
        "overlap and a schedule at least as good as the best published runs"
    )
