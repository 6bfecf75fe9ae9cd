"""Refit the profiles simcli ships, from the datasets committed under calibrate/data.

    python -m calibrate.ship     # writes costmodels/profiles/*.json, calibrate/fidelity/*.csv
    python -m calibrate.ship --engine-only   # fits only the engine kernels (flashinfer)
                                             # into the shipped profiles, nothing else

Each profile is fitted on the fit side of its dataset only; its recorded fidelity is
the held-out error, which ``calibrate/fidelity/<profile>.csv`` also keeps. The serving
engines' kernels (``ENGINE``) are fitted on top (calibrate.engine_fit), their own groups
and op classes only; ``--engine-only`` does just that on the shipped JSON, so that no
other fitted value moves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from calibrate.dataset import load_dataset
from calibrate.engine_fit import engine_rows, fit_engine
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
#: profile -> the serving engines' kernels measured on its GPU (backend flashinfer)
ENGINE = {"h100-sxm": "engine-kernels-h100-sxm", "h200-sxm": "engine-kernels-h200-sxm"}


def merge_engine(name: str, profile: dict, fidelity: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    """``profile`` and its fidelity table with the engine kernels of ``ENGINE[name]``
    fitted in (the engine classes' rows replace any earlier ones)."""
    ds = engine_rows(load_dataset(DATA / ENGINE[name], expect_gpu=profile["gpu"]))
    merged, rows = fit_engine(profile, [ds])
    rel = str(Path(ds.path).resolve().relative_to(ROOT))
    for d in merged["datasets"]:
        if d["path"] == str(ds.path):
            d["path"] = rel
    fidelity = fidelity[~fidelity["op_class"].isin(rows["op_class"])]
    at = list(fidelity["op_class"]).index("all") if "all" in set(fidelity["op_class"]) else None
    if at is None:
        return merged, pd.concat([fidelity, rows], ignore_index=True)
    parts = [fidelity.iloc[:at], rows, fidelity.iloc[at:]]
    return merged, pd.concat(parts, ignore_index=True)[fidelity.columns]


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
    fidelity = result.fidelity
    if name in ENGINE:
        profile, fidelity = merge_engine(name, profile, fidelity)
    checked = Profile.model_validate(profile)
    (PROFILES / f"{name}.json").write_text(json.dumps(profile, indent=1) + "\n")
    fidelity.to_csv(FIDELITY / f"{name}.csv", index=False, float_format="%.2f")
    return checked


def engine_only(name: str) -> Profile:
    """Fit the engine kernels into the shipped profile ``name``; nothing else changes."""
    path = PROFILES / f"{name}.json"
    profile, fidelity = merge_engine(
        name, json.loads(path.read_text()), pd.read_csv(FIDELITY / f"{name}.csv")
    )
    checked = Profile.model_validate(profile)
    path.write_text(json.dumps(profile, indent=1) + "\n")
    fidelity.to_csv(FIDELITY / f"{name}.csv", index=False, float_format="%.2f")
    return checked


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--engine-only"]):
        print(f"unknown arguments {' '.join(argv)}; allowed: --engine-only", file=sys.stderr)
        return 2
    PROFILES.mkdir(parents=True, exist_ok=True)
    FIDELITY.mkdir(parents=True, exist_ok=True)
    for name, folder, gpu, scope in SHIPPED:
        if argv and name not in ENGINE:
            continue
        prof = engine_only(name) if argv else build(name, folder, gpu, scope)
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
