"""Fit the serving engines' attention kernels (backend ``flashinfer``) into a profile.

The engine kernels are measured apart (calibrate/bench/engine_kernels.py, datasets
calibrate/data/engine-kernels-*) and fitted apart: on top of a profile already fitted
(its parameters are the starting tree), only the engine parameter groups
(``calibrate.params_fit.ENGINE_GROUPS``) and the engine op classes
(``costmodels.ops.features`` ``attn_flashinfer``, ``decode_flashinfer``) are fitted, and
the result is merged into the profile. Every other value of the profile stays as it was,
byte for byte, whatever the numeric libraries of the machine that merges.

The held-out split is the one of every suite (calibrate.dataset.held_out): a quarter of
the head configurations of each engine suite, held out whole, never fitted. Group names
carry the backend (``flashinfer:h32kv8d128``) so that they never collide with the
profile's own held-out families of the same head configuration.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from calibrate.dataset import Dataset, DatasetError, held_out
from calibrate.fit import error_stats, priceable, with_reference_node
from calibrate.params_fit import ENGINE_BACKENDS, ENGINE_GROUPS, fit_params
from costmodels.ops.analytical import AnalyticalCostModel, frame_columns
from costmodels.ops.features import OP_CLASSES, op_class
from costmodels.ops.learned import LearnedCostModel
from costmodels.ops.params import arch_params, deep_merge
from hardware_specs.registry import load_catalog

#: the fidelity fields a profile keeps per op class (calibrate.fit)
FIDELITY_KEYS = ("rows_fit", "rows_held_out", "learned_mape", "learned_p50", "learned_p90",
                 "default_mape", "fitted_mape")  # fmt: skip


#: pattern tokens of rows measured but not fitted: the CUDA-core decode kernel (the
#: engines ask for the tensor-core path), the ragged prefill kernel (vLLM's FlashInfer
#: backend runs the paged one, also without a cached prefix) and fp8 KV (one head
#: configuration only, so never on both sides of the split)
NOT_FITTED = ("cc", "ragged")
NOT_FITTED_DTYPES = ("fp8",)


def engine_rows(ds: Dataset) -> Dataset:
    """``ds`` with only the rows ``flashinfer`` stands for (bf16 KV, tensor-core decode
    from CUDA graphs, paged prefill; see :data:`NOT_FITTED`), its groups prefixed with the
    backend."""
    frame = ds.frame
    tokens = frame["pattern"].astype(str).str.split(":")
    drop = np.array([any(x in NOT_FITTED for x in t) for t in tokens], dtype=bool)
    drop |= frame["dtype"].isin(NOT_FITTED_DTYPES).to_numpy(dtype=bool)
    frame = frame.loc[~drop].reset_index(drop=True)
    prefix = frame["backend"].astype(str) + ":"
    group = frame["group"].astype(str)
    done = np.array([g.startswith(p) for g, p in zip(group, prefix, strict=True)], dtype=bool)
    frame["group"] = np.where(done, group, prefix + group)  # idempotent
    return replace(ds, frame=frame)


def is_engine_dataset(ds: Dataset) -> bool:
    """Whether every row of ``ds`` is an engine backend's (an engine-kernels folder)."""
    return bool(len(ds.frame)) and set(ds.frame["backend"].astype(str)) <= set(ENGINE_BACKENDS)


def engine_classes(cols: dict[str, np.ndarray]) -> np.ndarray:
    return op_class(cols["op"], cols["dtype"], cols["backend"])


def fit_engine(
    profile: dict[str, Any], datasets: list[Dataset], *, seed: int = 0
) -> tuple[dict[str, Any], pd.DataFrame]:
    """(the profile with the engine backends fitted in, one fidelity row per engine class).

    Only rows of :data:`calibrate.params_fit.ENGINE_BACKENDS` are used."""
    gpu_id = profile["gpu"]
    cat, _ = with_reference_node(load_catalog(), gpu_id)
    system = cat.system(gpu_id)
    arch = system.gpu.architecture
    base = arch_params(arch, profile.get("params") or {})
    frame = pd.concat([ds.frame for ds in datasets], ignore_index=True)
    frame = frame[frame["backend"].isin(ENGINE_BACKENDS)].reset_index(drop=True)
    if not len(frame):
        raise DatasetError(f"no rows of backend {', '.join(ENGINE_BACKENDS)} in the datasets")
    default = AnalyticalCostModel(system, base)
    keep, notes = priceable(default, frame_columns(frame))
    frame = frame.loc[keep].reset_index(drop=True)
    test = held_out(frame["group"].to_numpy(), frame["stratum"].to_numpy())
    frame["side"] = np.where(test, "held_out", "fit")
    cols = frame_columns(frame)
    measured = frame["measured_s"].to_numpy()
    fit_cols = {k: v[~test] for k, v in cols.items()}
    overrides, fits = fit_params(system, base, fit_cols, measured[~test], ENGINE_GROUPS)
    notes += [n for g in fits for n in g.notes]
    params = deep_merge(profile.get("params") or {}, overrides)
    fitted = AnalyticalCostModel(system, arch_params(arch, params))
    learned = LearnedCostModel(fitted, seed=seed).fit(frame.loc[~test].reset_index(drop=True))
    preds = {
        "default": default.work_columns(cols).time_s,
        "fitted": fitted.work_columns(cols).time_s,
        "learned": learned.work_columns(cols).time_s,
    }
    classes = engine_classes(cols)
    rows = []
    for cls in [c for c in OP_CLASSES if c in set(classes)]:
        in_cls = classes == cls
        row: dict[str, Any] = {
            "op_class": cls,
            "description": OP_CLASSES[cls],
            "rows_fit": int((in_cls & ~test).sum()),
            "rows_held_out": int((in_cls & test).sum()),
        }
        for label, pred in preds.items():
            for key, value in error_stats(measured[in_cls & test], pred[in_cls & test]).items():
                row[f"{label}_{key}"] = value
        rows.append(row)
    fidelity = pd.DataFrame(rows)

    out = copy.deepcopy(profile)
    out["params"] = params
    mine = learned.to_dict()
    out["learned"]["residuals"].update(mine["residuals"])
    out["learned"]["selection"].update(mine["selection"])
    for r in rows:
        out["fidelity"][r["op_class"]] = {
            k: (None if isinstance(r[k], float) and not np.isfinite(r[k]) else r[k])
            for k in FIDELITY_KEYS
        }
    held = sorted(set(frame.loc[test, "group"]))
    out["held_out_groups"] = sorted({*out["held_out_groups"], *held})
    paths = {str(ds.path) for ds in datasets}
    out["datasets"] = [d for d in out["datasets"] if d["path"] not in paths]
    out["datasets"] += [
        {"path": str(ds.path), "rows": int(len(ds.frame)), "skipped": ds.skipped,
         "backend": ",".join(ENGINE_BACKENDS)}
        for ds in datasets
    ]  # fmt: skip
    out.setdefault("measured_on", {})["engine_fit_notes"] = notes
    return out, fidelity
