"""GPU rental prices (``data/gpu_prices.yaml``) and the host link's copy rate: the
hardware facts that a deployment's cost and its KV swapping are priced from, read in one
place for training plans, serving runs and the serving planner."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from hardware_specs.registry import SpecError


class GpuPrice(BaseModel):
    """US$ per GPU-hour of one GPU and where the number comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str
    usd_per_gpu_hour: float = Field(gt=0)
    source: str = Field(min_length=1)


@lru_cache(maxsize=1)
def gpu_prices() -> dict[str, GpuPrice]:
    """GPU id -> price, from the shipped table (indicative on-demand rates, sourced)."""
    text = resources.files("hardware_specs").joinpath("data/gpu_prices.yaml").read_text()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when installed: ~8x faster
    rows = [GpuPrice.model_validate(r) for r in yaml.load(text, Loader=loader)["prices"]]
    return {r.gpu: r for r in rows}


def gpu_price(gpu_id: str, overrides: dict[str, float] | None = None) -> GpuPrice:
    """The price used for ``gpu_id``: an override (by GPU id, or ``*`` for any GPU) or
    the table's; a GPU in neither is one clear error naming the known ones."""
    overrides = overrides or {}
    for key in (gpu_id, "*"):
        if key in overrides:
            usd = overrides[key]
            if not usd > 0:
                raise SpecError(f"--price-per-gpu-hour must be positive, got {usd}")
            return GpuPrice(gpu=gpu_id, usd_per_gpu_hour=usd, source="--price-per-gpu-hour")
    table = gpu_prices()
    if gpu_id not in table:
        raise SpecError(
            f"no price for GPU {gpu_id!r}; known: {', '.join(sorted(table))}; "
            "allowed: pass --price-per-gpu-hour"
        )
    return table[gpu_id]


# Host<->GPU copy rate per GPU, one direction, per PCIe generation of an x16 link: ~80% of
# the raw rate (PCIe 4.0 x16 = 31.5 GB/s raw after 128b/130b; pinned-memory copies reach
# ~25 GB/s; 5.0 and 6.0 double each step). Prices KV swapping to host memory.
HOST_COPY_BYTES_PER_S = {3: 12.5e9, 4: 25e9, 5: 50e9, 6: 100e9}


def host_copy_bytes_per_s(pcie_gen: int) -> float:
    """Pinned host<->GPU copy rate of one GPU's x16 PCIe link of generation ``pcie_gen``."""
    return HOST_COPY_BYTES_PER_S[pcie_gen]
