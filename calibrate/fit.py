"""From datasets to a profile: fit parameters, fit corrections, score on held-out data.

1. Split rows into fit and held-out sides by shape family (calibrate.dataset).
2. Fit the analytical efficiency parameters on the fit side (calibrate.params_fit).
3. Fit the learned per-class corrections on top, family chosen by grouped CV.
4. Score three predictors on the held-out side, per op class: the shipped defaults,
   the fitted analytical model, and the learned model. The profile keeps the model
   fitted on the fit side only, so its recorded fidelity is exactly what was measured.

Any data the runner writes must fit, so nothing unexpected is fatal: rows the GPU's
spec cannot price (a dtype it has no rate for, a backend without parameters) are left
out, categories the tables do not have fall back to a pooled value, and every such
fallback is one line in ``FitResult.notes`` (and the profile's ``measured_on.fit_notes``).
Data recorded on another device than the GPU named is a warning (``FitResult.warnings``),
not an error: a user may mean it (a sibling's data for a new spec). Such a profile is
marked ``device_matches_gpu: false`` and gets no power model: power never crosses boards.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from calibrate.dataset import (
    OP_COLUMNS,
    Dataset,
    DatasetError,
    device_mismatch,
    environment,
    held_out,
    meta_parts,
    recorded_device,
)
from calibrate.params_fit import GroupFit, fit_params, unseen_head_dims
from costmodels.ops.analytical import AnalyticalCostModel, Columns, frame_columns
from costmodels.ops.common import peak_flops
from costmodels.ops.energy import PowerModel
from costmodels.ops.features import ENGINE_CLASSES, OP_CLASSES, op_class
from costmodels.ops.learned import LearnedCostModel
from costmodels.ops.params import arch_params
from hardware_specs.registry import Catalog, load_catalog
from hardware_specs.schema import HardwareFile, NodeSpec

HELD_OUT_SPLIT = (
    "a quarter of the shape families of each suite (GEMM: per dtype class; models, head "
    "configurations, mask patterns, size decades) held out whole, never fitted"
)


@dataclass
class FitResult:
    profile: dict[str, Any]
    fidelity: pd.DataFrame  # one row per op class (and "all")
    predictions: pd.DataFrame  # every row: measured, predictions, side, class
    group_fits: list[GroupFit]
    notes: list[str] = field(default_factory=list)  # fallbacks taken, one line each
    warnings: list[str] = field(default_factory=list)  # data from another device than the GPU

    def held_out_line(self) -> str:
        """What the fit reached on held-out shapes, per op class, in one line."""
        parts, unknown = [], []
        for r in self.fidelity.itertuples():
            if r.rows_held_out and math.isfinite(r.learned_mape):
                parts.append(f"{r.op_class} {r.learned_mape:.1f}% (n={r.rows_held_out})")
            elif r.op_class != "all":
                unknown.append(r.op_class)
        line = "held-out MAPE: " + (", ".join(parts) or "none (no held-out rows)")
        if unknown:
            line += f"; not measurable (no held-out family): {', '.join(unknown)}"
        return line


def error_stats(measured: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """MAPE, median and 90th-percentile absolute percentage error, and median signed error."""
    if len(measured) == 0:
        return {
            "mape": float("nan"),
            "p50": float("nan"),
            "p90": float("nan"),
            "bias": float("nan"),
        }
    rel = (predicted - measured) / measured
    a = np.abs(rel) * 100.0
    return {
        "mape": float(a.mean()),
        "p50": float(np.median(a)),
        "p90": float(np.quantile(a, 0.9)),
        "bias": float(np.median(rel) * 100.0),
    }


def with_reference_node(catalog: Catalog, gpu_id: str) -> tuple[Catalog, NodeSpec | None]:
    """``catalog`` able to build a system for ``gpu_id``: unchanged when a node lists the
    GPU, else with a one-GPU node on PCIe (a user spec file or a derived spec often has
    no node; single-GPU calibration needs none). Returns (catalog, the node added)."""
    gpu = catalog.gpu(gpu_id)
    if any(n.gpu == gpu_id for n in catalog.nodes.values()):
        return catalog, None
    link = f"pcie-gen{gpu.pcie_gen}-x16"
    why = "ASSUMED: one GPU on its own (no reference node describes it); collectives not fitted"
    node = NodeSpec(
        id=f"{gpu_id}-single",
        name=f"one {gpu.name}",
        gpu=gpu_id,
        gpus_per_node=1,
        intra_node_link=link,
        intra_node_gb_per_s=catalog.link(link).bandwidth_gb_per_s,
        switched=False,
        nic="eth-100g",
        nics_per_gpu=1,
        host_link=link,
        sources={"gpus_per_node": why, "intra_node_gb_per_s": f"{why}; the {link} link",
                 "nics_per_gpu": why},
    )  # fmt: skip
    return catalog.merged(HardwareFile(nodes=[node]), "single-GPU node"), node


def fit_profile(
    datasets: list[Dataset],
    gpu_id: str,
    *,
    name: str | None = None,
    seed: int = 0,
    catalog: Catalog | None = None,
) -> FitResult:
    """Fit a profile for ``gpu_id`` (a built-in id, or one ``catalog`` adds)."""
    if not datasets:
        raise DatasetError("no datasets given")
    cat, _ = with_reference_node(catalog if catalog is not None else load_catalog(), gpu_id)
    gpu = cat.gpu(gpu_id)
    warnings = [m for ds in datasets if (m := _mismatch(ds, gpu))]
    notes: list[str] = []
    frame = pd.concat([ds.frame for ds in datasets], ignore_index=True)
    default = AnalyticalCostModel(cat.system(gpu_id))
    keep, dropped = priceable(default, frame_columns(frame))
    notes += dropped
    if not keep.any():
        raise DatasetError(f"no measured row can be priced on {gpu_id}: {'; '.join(dropped)}")
    frame = frame.loc[keep].reset_index(drop=True)
    test = held_out(frame["group"].to_numpy(), frame["stratum"].to_numpy())
    frame["side"] = np.where(test, "held_out", "fit")
    cols = frame_columns(frame)
    measured = frame["measured_s"].to_numpy()
    classes = op_class(cols["op"], cols["dtype"], cols["backend"])

    system = default.system
    fit_cols = {k: v[~test] for k, v in cols.items()}
    overrides, group_fits = fit_params(system, default.params, fit_cols, measured[~test])
    notes += [n for g in group_fits for n in g.notes] + unseen_head_dims(cols)
    fitted = AnalyticalCostModel(system, arch_params(system.gpu.architecture, overrides))
    learned = LearnedCostModel(fitted, seed=seed).fit(frame.loc[~test].reset_index(drop=True))

    preds = {
        "default": default.work_columns(cols).time_s,
        "fitted": fitted.work_columns(cols).time_s,
        "learned": learned.work_columns(cols).time_s,
    }
    rows = []
    for cls in [*[c for c in OP_CLASSES if c in set(classes)], "all"]:
        in_cls = ~np.isin(classes, ENGINE_CLASSES) if cls == "all" else classes == cls
        row: dict[str, Any] = {
            "op_class": cls,
            "description": OP_CLASSES.get(cls, "every op"),
            "rows_fit": int((in_cls & ~test).sum()),
            "rows_held_out": int((in_cls & test).sum()),
        }
        for label, pred in preds.items():
            stats = error_stats(measured[in_cls & test], pred[in_cls & test])
            for key, value in stats.items():
                row[f"{label}_{key}"] = value
        rows.append(row)
    fidelity = pd.DataFrame(rows)

    keep = [*OP_COLUMNS, "suite", "family", "group", "side"]
    predictions = frame[keep].copy()
    predictions["op_class"] = classes
    predictions["measured_ms"] = measured * 1e3
    for label, pred in preds.items():
        predictions[f"{label}_ms"] = pred * 1e3

    env: dict[str, Any] = {}
    for ds in datasets:
        flat = {k: v for k, v in environment(ds.meta).items() if not isinstance(v, dict | list)}
        env.update(flat)
    env["clocks"] = clocks_seen(datasets)
    power, power_note = None, "power model not fitted: the data was measured on another device"
    if not warnings:
        power, power_note = fit_power(datasets, fitted, env["clocks"])
    if power_note:
        notes.append(power_note)
    notes += [
        f"{r['op_class']}: no held-out rows (one shape family), its error is not measured"
        for r in rows
        if r["op_class"] != "all" and not r["rows_held_out"]
    ]
    env["device_matches_gpu"] = not warnings
    env["fit_notes"] = [*warnings, *notes]
    env["held_out_split"] = HELD_OUT_SPLIT
    held = sorted(set(frame.loc[test, "group"]))
    profile = {
        "name": name or gpu_id,
        "gpu": gpu_id,
        "params": overrides,
        "learned": learned.to_dict(),
        "measured_on": env,
        "fidelity": {
            r["op_class"]: {
                k: _finite(r[k])
                for k in (
                    "rows_fit",
                    "rows_held_out",
                    "learned_mape",
                    "learned_p50",
                    "learned_p90",
                    "default_mape",
                    "fitted_mape",
                )
            }
            for r in rows
        },
        "held_out_groups": held,
        "power": power.model_dump() if power is not None else None,
        "datasets": [
            {"path": str(ds.path), "rows": len(ds.frame), "skipped": ds.skipped} for ds in datasets
        ],
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    return FitResult(
        profile=profile,
        fidelity=fidelity,
        predictions=predictions,
        group_fits=group_fits,
        notes=notes,
        warnings=warnings,
    )


def _finite(value: Any) -> Any:
    """NaN (no held-out rows) as None, so the profile is strict JSON."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def priceable(model: AnalyticalCostModel, cols: Columns) -> tuple[np.ndarray, list[str]]:
    """(rows ``model`` can price, one note per kind of row it cannot). Tried once per
    (op, dtype, backend): e.g. fp8 rows on a GPU without an fp8 rate, or a backend the
    efficiency tables do not know, are left out of the fit rather than stopping it."""
    keys = pd.DataFrame({c: cols[c] for c in ("op", "dtype", "backend")})
    keep = np.ones(len(keys), dtype=bool)
    notes = []
    for (op, dtype, backend), idx in keys.groupby(["op", "dtype", "backend"]).indices.items():
        one = {k: v[idx[:1]] for k, v in cols.items()}
        try:
            time_s = model.work_columns(one).time_s
            if not np.all(np.isfinite(time_s) & (time_s > 0)):
                raise ValueError("the model gives no finite positive time")
        except (ValueError, KeyError) as exc:
            keep[idx] = False
            what = " ".join(x for x in (op, dtype, backend) if x)
            notes.append(f"left out {len(idx)} {what} row(s): {str(exc).splitlines()[0]}")
    return keep, notes


def fit_power(
    datasets: list[Dataset], model: AnalyticalCostModel, clocks: dict[str, float]
) -> tuple[PowerModel | None, str]:
    """Energy model from the power suite: utilisation from the fitted model's FLOPs and
    bytes over the measured time; idle and cap from the NVML readings. Returns (model,
    note); the note says why there is none (then the GPU's datasheet estimate applies).

    Duty-cycled rows (``pattern`` duty=...) are left out: a kernel busy half the time
    draws the average of its own power and idle, not the power of a kernel at half the
    utilisation (the cap makes P concave), and ops are priced at their own utilisation,
    with idle time priced at ``idle_w`` by whoever simulates it."""
    frames = [
        ds.power[~ds.power["pattern"].astype(str).str.startswith("duty=")]
        if "pattern" in ds.power.columns
        else ds.power
        for ds in datasets
        if ds.power is not None and len(ds.power)
    ]
    frames = [f.reset_index(drop=True) for f in frames if len(f)]
    fallback = f"energy uses the datasheet estimate bounded by the {model.gpu.tdp_w:g} W TDP"
    if not frames:
        return None, f"no power samples (power suite not run, or no NVML): {fallback}"
    if "power_w_min" not in clocks:
        return None, f"no idle power reading (NVML clocks) to anchor the power fit: {fallback}"
    rows = pd.concat(frames, ignore_index=True)
    cols = frame_columns(rows)
    keep, _ = priceable(model, cols)
    if keep.sum() < 2:
        return None, f"fewer than 2 usable power samples: {fallback}"
    cols = {k: v[keep] for k, v in cols.items()}
    work = model.work_columns(cols)
    t = rows["measured_s"].to_numpy()[keep]
    util_c = np.clip(work.flops / (t * peak_flops(cols["dtype"], model.gpu)), 0, 1)
    util_m = np.clip(work.bytes / (t * model.gpu.hbm_bytes_per_s), 0, 1)
    cap = clocks.get("power_limit_w_max", model.gpu.tdp_w)
    power_w = rows["avg_power_w"].to_numpy()[keep]
    fitted = PowerModel.fit(util_c, util_m, power_w, clocks["power_w_min"], cap)
    return fitted, ""


def clocks_seen(datasets: list[Dataset]) -> dict[str, float]:
    """Range of SM and memory clocks, power and temperature read before and after suites."""
    seen: dict[str, list[float]] = {}
    for ds in datasets:
        meta = ds.meta if isinstance(ds.meta, dict) else {}
        parts = meta_parts(meta)
        runs = [r for part in parts for r in (part.get("runs") or []) if isinstance(r, dict)]
        for run in runs:
            for when in ("clocks_before", "clocks_after"):
                for key, value in (run.get(when) or {}).items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        seen.setdefault(key, []).append(float(value))
    out: dict[str, float] = {}
    for key, values in seen.items():
        out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)
    return out


def _mismatch(ds: Dataset, gpu: Any) -> str | None:
    """The device warning for ``ds``; NCCL data of another GPU of the same fabric is
    meant to be shared (the NVSwitch profile), so only CPU collectives are flagged."""
    line = device_mismatch(ds, gpu)
    if line and _collectives_only(ds) and recorded_device(ds.meta)["type"] != "cpu":
        return None
    return line


def _collectives_only(ds: Dataset) -> bool:
    return bool(len(ds.frame)) and set(ds.frame["suite"]) == {"collectives"}
