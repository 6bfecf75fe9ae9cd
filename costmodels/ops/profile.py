"""Calibration profiles: fitted parameters for one GPU, loaded with ``--profile``.

A profile names the GPU it was measured on and overrides the analytical efficiency
parameters (``params``, same keys as ``data/efficiency.yaml``). It records where
and how it was measured and the fidelity reached on held-out data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ProfileError(ValueError):
    """A profile that cannot be read or does not match the GPU asked for."""


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    gpu: str = Field(description="GPU id the profile was measured on")
    scope: Literal["gpu", "collectives"] = Field(
        default="gpu",
        description="'gpu': compute ops of that GPU; 'collectives': NCCL ops over `link`",
    )
    link: str | None = Field(
        default=None, description="for collectives profiles: the intra-node link id it applies to"
    )
    params: dict[str, Any] = Field(default_factory=dict, description="efficiency overrides")
    learned: dict[str, Any] | None = Field(
        default=None, description="learned per-op-class corrections (costmodels.ops.learned)"
    )
    held_out_groups: list[str] = Field(default_factory=list)
    power: dict[str, float] | None = Field(
        default=None, description="energy model (costmodels.ops.energy.PowerModel) fields"
    )
    datasets: list[dict[str, Any]] = Field(default_factory=list)
    created: str = ""
    measured_on: dict[str, Any] = Field(
        default_factory=dict, description="GPU name, SMs, clocks, driver, CUDA, torch, NCCL, date"
    )
    fidelity: dict[str, Any] = Field(
        default_factory=dict, description="held-out error per op class (MAPE, p50, p90)"
    )

    def check_gpu(self, gpu_id: str) -> None:
        if self.gpu != gpu_id:
            raise ProfileError(
                f"profile {self.name!r} was measured on {self.gpu!r}, not {gpu_id!r}"
            )


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ProfileError(
            f"profile {path} is not valid JSON/YAML: {str(exc).splitlines()[0]}"
        ) from exc
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path} must be a mapping with name, gpu and params")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ProfileError(f"profile {path}: {loc}: {err['msg']}") from exc


def shipped_profiles() -> tuple[Profile, ...]:
    """The calibration profiles shipped in ``costmodels/profiles`` (sorted by file name)."""
    from importlib import resources

    folder = Path(str(resources.files("costmodels") / "profiles"))
    return tuple(load_profile(p) for p in sorted(folder.glob("*.json")))
