"""Refit the profiles simcli ships, from the datasets committed under calibrate/data.

    python -m calibrate.ship     # writes costmodels/profiles/*.json, calibrate/fidelity/*.csv

Each profile is fitted on the fit side of its dataset only; its recorded fidelity is
the held-out error, which ``calibrate/fidelity/<profile>.csv`` also keeps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from calibrate.dataset import load_dataset
from calibrate.fit import fit_profile
from costmodels.ops.profile import Profile
from hardware_specs.registry import load_catalog

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibrate" / "data"
PROFILES = ROOT / "costmodels" / "profiles"
FIDELITY = ROOT / "calibrate" / "fidelity"

# (profile file, dataset folder, GPU id, scope)
SHIPPED = [
    ("h100-sxm", "h100-sxm", "h100-sxm", "gpu"),
    ("h200-sxm", "h200-sxm", "h200-sxm", "gpu"),
    ("collectives-nvlink4-nvswitch", "collectives-h200-nvswitch", "h200-sxm", "collectives"),
]


def build(name: str, folder: str, gpu: str, scope: str) -> Profile:
    dataset = load_dataset(DATA / folder, expect_gpu=gpu)
    result = fit_profile([dataset], gpu, name=name)
    profile = dict(result.profile)
    profile["datasets"] = [
        {**d, "path": str(Path(d["path"]).resolve().relative_to(ROOT))} for d in profile["datasets"]
    ]
    if scope == "collectives":
        profile["scope"] = "collectives"
        profile["link"] = load_catalog().reference_node(gpu).intra_node_link
        profile["params"] = {"collectives": profile["params"].get("collectives", {})}
    checked = Profile.model_validate(profile)
    (PROFILES / f"{name}.json").write_text(json.dumps(profile, indent=1) + "\n")
    result.fidelity.to_csv(FIDELITY / f"{name}.csv", index=False, float_format="%.2f")
    return checked


def main() -> int:
    PROFILES.mkdir(parents=True, exist_ok=True)
    FIDELITY.mkdir(parents=True, exist_ok=True)
    for name, folder, gpu, scope in SHIPPED:
        prof = build(name, folder, gpu, scope)
        figures = ", ".join(
            f"{cls} {f['learned_mape']:.1f}%"
            for cls, f in prof.fidelity.items()
            if cls != "all" and f.get("learned_mape") is not None  # None: nothing held out
        )
        print(f"{name}: held-out MAPE {figures}")
        for note in prof.measured_on.get("fit_notes", []):
            print(f"  note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
