"""Which cost model answers for a GPU: its profile, a transferred one, or the defaults.

- ``--profile PATH`` wins (it must name the same GPU).
- Otherwise the shipped profile for the GPU id (``profiles/<gpu>.json``).
- Otherwise a shipped profile of another GPU of the same architecture: its fitted
  efficiencies are fractions of peak, so they transfer to a sibling (H100 PCIe from
  H100 SXM); its learned corrections come along.
- Otherwise the architecture's own defaults, with the software-stack latencies
  (launch, wave and CTA latencies) of the closest calibrated architecture.
Collectives come from a ``scope: collectives`` profile for the node's fabric link when
one is shipped (e.g. NVLink4 NVSwitch), whichever GPU it was measured with.
Every model's ``label`` says which of these happened.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from costmodels.ops.analytical import AnalyticalCostModel
from costmodels.ops.energy import PowerModel
from costmodels.ops.learned import LearnedCostModel
from costmodels.ops.params import arch_params, deep_merge
from costmodels.ops.profile import Profile, load_profile
from hardware_specs.registry import Catalog, System, load_catalog

# Parameters that describe the software stack rather than the chip: they transfer
# across architectures; efficiencies (fractions of a chip's peak) do not.
_LATENCY_KEYS = {"launch_s", "bwd_launch_s", "wave_latency_s", "cta_latency_s", "decode_launch_s",
                 "k_overhead", "ramp_bytes"}  # fmt: skip
_ARCH_ORDER = ["ampere", "ada", "hopper", "blackwell", "cdna3"]


@lru_cache(maxsize=1)
def shipped_profiles() -> tuple[Profile, ...]:
    folder = Path(str(resources.files("costmodels") / "profiles"))
    return tuple(load_profile(p) for p in sorted(folder.glob("*.json")))


def _latencies_only(tree: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            sub = _latencies_only(value)
            if sub:
                out[key] = sub
        elif key in _LATENCY_KEYS:
            out[key] = value
    return out


def model_from_profile(
    profile: Profile, system: System, label: str = ""
) -> AnalyticalCostModel | LearnedCostModel:
    """Exactly what one profile says, on ``system`` (no shipped profiles mixed in)."""
    params = arch_params(system.gpu.architecture, profile.params)
    base = AnalyticalCostModel(system, params, label=label or f"profile {profile.name}")
    if profile.power:
        base.power = PowerModel.model_validate(profile.power)
    if not profile.learned:
        return base
    return LearnedCostModel.from_dict(base, profile.learned)


def get_cost_model(
    gpu_id: str,
    *,
    profile: str | Path | Profile | None = None,
    num_gpus: int | None = None,
    hardware_file: str | Path | None = None,
    catalog: Catalog | None = None,
    use_shipped: bool = True,
) -> AnalyticalCostModel | LearnedCostModel:
    """The best model available for ``gpu_id`` (see the module docstring)."""
    cat = catalog if catalog is not None else load_catalog(hardware_file)
    system = cat.system(gpu_id, num_gpus)
    arch = system.gpu.architecture
    shipped = shipped_profiles() if use_shipped else ()
    gpu_profiles = [p for p in shipped if p.scope == "gpu"]

    chosen: Profile | None
    how: str
    if profile is not None:
        chosen = profile if isinstance(profile, Profile) else load_profile(profile)
        if chosen.scope == "collectives":
            if chosen.link != system.intra_link.id:
                raise ValueError(
                    f"collectives profile {chosen.name!r} is for {chosen.link}, "
                    f"not {system.intra_link.id}"
                )
            return model_from_profile(chosen, system)
        chosen.check_gpu(gpu_id)
        how = f"profile {chosen.name}"
    else:
        own = [p for p in gpu_profiles if p.gpu == gpu_id]
        same_arch = [
            p for p in gpu_profiles if p.gpu in cat.gpus and cat.gpus[p.gpu].architecture == arch
        ]
        if own:
            chosen, how = own[0], f"calibrated profile {own[0].name}"
        elif same_arch:
            chosen = same_arch[0]
            how = f"efficiencies transferred from the {chosen.gpu} profile (same architecture)"
        else:
            chosen, how = None, f"uncalibrated {arch} defaults"

    overrides: dict[str, Any] = dict(chosen.params) if chosen is not None else {}
    if chosen is None and gpu_profiles:
        # closest calibrated architecture by generation: borrow its stack latencies
        def distance(p: Profile) -> int:
            other = cat.gpus[p.gpu].architecture if p.gpu in cat.gpus else arch
            return abs(_ARCH_ORDER.index(other) - _ARCH_ORDER.index(arch))

        donor = min(gpu_profiles, key=distance)
        overrides = _latencies_only(donor.params)
        how += f" with software latencies from the {donor.gpu} profile"

    residuals = dict(chosen.learned["residuals"]) if chosen is not None and chosen.learned else {}
    coll = [p for p in shipped if p.scope == "collectives" and p.link == system.intra_link.id]
    if coll:
        overrides = deep_merge(overrides, {"collectives": coll[0].params.get("collectives", {})})
        if coll[0].learned:
            residuals.update(
                {k: v for k, v in coll[0].learned["residuals"].items() if k == "collective"}
            )
        how += f"; collectives from the {coll[0].name} profile"

    base = AnalyticalCostModel(system, arch_params(arch, overrides), label=how)
    if chosen is not None and chosen.power:
        base.power = PowerModel.model_validate(chosen.power)
    if not residuals:
        return base
    features = (chosen.learned if chosen is not None and chosen.learned else coll[0].learned)[
        "features"
    ]
    return LearnedCostModel.from_dict(base, {"features": features, "residuals": residuals})
