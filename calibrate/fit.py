"""From datasets to a profile: fit parameters, fit corrections, score on held-out data.

1. Split rows into fit and held-out sides by shape family (calibrate.dataset).
2. Fit the analytical efficiency parameters on the fit side (calibrate.params_fit).
3. Fit the learned per-class corrections on top, family chosen by grouped CV.
4. Score three predictors on the held-out side, per op class: the shipped defaults,
   the fitted analytical model, and the learned model. The profile keeps the model
   fitted on the fit side only, so its recorded fidelity is exactly what was measured.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from calibrate.dataset import OP_COLUMNS, Dataset, DatasetError, environment, held_out
from calibrate.params_fit import GroupFit, fit_params
from costmodels.ops.analytical import AnalyticalCostModel, frame_columns
from costmodels.ops.common import peak_flops
from costmodels.ops.energy import PowerModel
from costmodels.ops.features import OP_CLASSES, op_class
from costmodels.ops.learned import LearnedCostModel
from costmodels.ops.params import arch_params
from hardware_specs.registry import load_catalog


@dataclass
class FitResult:
    profile: dict[str, Any]
    fidelity: pd.DataFrame  # one row per op class (and "all")
    predictions: pd.DataFrame  # every row: measured, predictions, side, class
    group_fits: list[GroupFit]


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


def fit_profile(
    datasets: list[Dataset], gpu_id: str, *, name: str | None = None, seed: int = 0
) -> FitResult:
    if not datasets:
        raise DatasetError("no datasets given")
    for ds in datasets:
        if ds.gpu_id is not None and ds.gpu_id != gpu_id and not _collectives_only(ds):
            raise DatasetError(f"dataset {ds.path} was measured on {ds.gpu_id}, not {gpu_id}")
    frame = pd.concat([ds.frame for ds in datasets], ignore_index=True)
    test = held_out(frame["group"].to_numpy(), frame["stratum"].to_numpy())
    frame["side"] = np.where(test, "held_out", "fit")
    cols = frame_columns(frame)
    measured = frame["measured_s"].to_numpy()
    classes = op_class(cols["op"], cols["dtype"])

    default = AnalyticalCostModel.for_gpu(gpu_id, catalog=load_catalog())
    system = default.system
    fit_cols = {k: v[~test] for k, v in cols.items()}
    overrides, group_fits = fit_params(system, default.params, fit_cols, measured[~test])
    fitted = AnalyticalCostModel(system, arch_params(system.gpu.architecture, overrides))
    learned = LearnedCostModel(fitted, seed=seed).fit(frame.loc[~test].reset_index(drop=True))

    preds = {
        "default": default.work_columns(cols).time_s,
        "fitted": fitted.work_columns(cols).time_s,
        "learned": learned.work_columns(cols).time_s,
    }
    rows = []
    for cls in [*[c for c in OP_CLASSES if c in set(classes)], "all"]:
        in_cls = np.ones(len(classes), dtype=bool) if cls == "all" else classes == cls
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
    power = fit_power(datasets, fitted, env["clocks"])
    held = sorted(set(frame.loc[test, "group"]))
    profile = {
        "name": name or gpu_id,
        "gpu": gpu_id,
        "params": overrides,
        "learned": learned.to_dict(),
        "measured_on": env,
        "fidelity": {
            r["op_class"]: {
                k: r[k]
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
        profile=profile, fidelity=fidelity, predictions=predictions, group_fits=group_fits
    )


def fit_power(
    datasets: list[Dataset], model: AnalyticalCostModel, clocks: dict[str, float]
) -> PowerModel | None:
    """Energy model from the power suite: utilisation from the fitted model's FLOPs and
    bytes over the measured time; idle and cap from the NVML readings."""
    frames = [ds.power for ds in datasets if ds.power is not None and len(ds.power)]
    if not frames or "power_w_min" not in clocks:
        return None
    rows = pd.concat(frames, ignore_index=True)
    cols = frame_columns(rows)
    work = model.work_columns(cols)
    t = rows["measured_s"].to_numpy()
    util_c = np.clip(work.flops / (t * peak_flops(cols["dtype"], model.gpu)), 0, 1)
    util_m = np.clip(work.bytes / (t * model.gpu.hbm_bytes_per_s), 0, 1)
    cap = clocks.get("power_limit_w_max", model.gpu.tdp_w)
    return PowerModel.fit(
        util_c, util_m, rows["avg_power_w"].to_numpy(), clocks["power_w_min"], cap
    )


def clocks_seen(datasets: list[Dataset]) -> dict[str, float]:
    """Range of SM and memory clocks, power and temperature read before and after suites."""
    seen: dict[str, list[float]] = {}
    for ds in datasets:
        meta = ds.meta if isinstance(ds.meta, dict) else {}
        parts = [meta, *(v for v in (meta.get("shards") or {}).values() if isinstance(v, dict))]
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


def _collectives_only(ds: Dataset) -> bool:
    return bool(len(ds.frame)) and set(ds.frame["suite"]) == {"collectives"}
