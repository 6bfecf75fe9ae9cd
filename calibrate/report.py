"""Fidelity of a profile on measurements: per-op-class errors and per-row predictions.

The held-out side is the one the profile recorded (its ``held_out_groups``), so the
figures are on data never used for fitting; rows of groups the profile never saw
(e.g. a new dataset) count as held-out too. The page and the CSV bundle are drawn by the
CLI (``simcli.reports.calibration``): this layer computes, the top layer renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibrate.dataset import OP_COLUMNS, Dataset
from calibrate.engine_fit import engine_rows, is_engine_dataset
from calibrate.fit import error_stats, priceable, with_reference_node
from costmodels.ops.analytical import AnalyticalCostModel, frame_columns
from costmodels.ops.features import ENGINE_CLASSES, OP_CLASSES, op_class
from costmodels.ops.profile import Profile
from costmodels.ops.select import get_cost_model
from hardware_specs.registry import Catalog, load_catalog

FIDELITY_COLUMNS = [
    "op_class",
    "description",
    "rows_fit",
    "rows_held_out",
    "default_mape",
    "default_p50",
    "default_p90",
    "profile_mape",
    "profile_p50",
    "profile_p90",
    "profile_bias",
]


def evaluate(
    profile: Profile, datasets: list[Dataset], *, catalog: Catalog | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fidelity per op class, per-row predictions) of ``profile`` against the datasets.
    ``catalog``: where the profile's GPU is described, when it is not a built-in. Rows the
    GPU cannot price (a dtype without a rate) are left out, as the fit left them out."""
    # an engine-kernel dataset is read as the profile's fit read it (calibrate.engine_fit)
    datasets = [engine_rows(ds) if is_engine_dataset(ds) else ds for ds in datasets]
    frame = pd.concat([ds.frame for ds in datasets], ignore_index=True)
    cat, _ = with_reference_node(catalog if catalog is not None else load_catalog(), profile.gpu)
    model = get_cost_model(profile.gpu, profile=profile, catalog=cat, use_shipped=False)
    default = AnalyticalCostModel(cat.system(profile.gpu))
    keep, _ = priceable(default, frame_columns(frame))
    # a dataset the profile was fitted on: same folder name and row count
    seen = {(Path(d["path"]).name, d.get("rows")) for d in profile.datasets}
    in_fit_data = np.concatenate(
        [np.full(len(ds.frame), (ds.path.name, len(ds.frame)) in seen) for ds in datasets]
    )[keep]
    frame = frame.loc[keep].reset_index(drop=True)
    held = frame["group"].isin(set(profile.held_out_groups)).to_numpy() | ~in_fit_data
    cols = frame_columns(frame)
    measured = frame["measured_s"].to_numpy()
    pred_profile = model.work_columns(cols).time_s
    pred_default = default.work_columns(cols).time_s
    classes = op_class(cols["op"], cols["dtype"], cols["backend"])

    rows = []
    for cls in [*[c for c in OP_CLASSES if c in set(classes)], "all"]:
        in_cls = ~np.isin(classes, ENGINE_CLASSES) if cls == "all" else classes == cls
        sel = in_cls & held
        row: dict[str, Any] = {
            "op_class": cls,
            "description": OP_CLASSES.get(cls, "every op"),
            "rows_fit": int((in_cls & ~held).sum()),
            "rows_held_out": int(sel.sum()),
        }
        for label, pred in (("default", pred_default), ("profile", pred_profile)):
            for key, value in error_stats(measured[sel], pred[sel]).items():
                row[f"{label}_{key}"] = value
        rows.append(row)
    fidelity = pd.DataFrame(rows)[FIDELITY_COLUMNS]

    predictions = frame[[*OP_COLUMNS, "suite", "family", "group"]].copy()
    predictions["side"] = np.where(held, "held_out", "fit")
    predictions["op_class"] = classes
    predictions["measured_ms"] = measured * 1e3
    predictions["default_ms"] = pred_default * 1e3
    predictions["profile_ms"] = pred_profile * 1e3
    return fidelity, predictions
