"""Fidelity of a profile on measurements: tables, CSVs and a self-contained HTML page.

The held-out side is the one the profile recorded (its ``held_out_groups``), so the
figures are on data never used for fitting; rows of groups the profile never saw
(e.g. a new dataset) count as held-out too.
"""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibrate.dataset import OP_COLUMNS, Dataset
from calibrate.fit import error_stats
from costmodels.analytical import AnalyticalCostModel, frame_columns
from costmodels.features import OP_CLASSES, op_class
from costmodels.profile import Profile
from costmodels.select import get_cost_model
from hardware_specs.registry import load_catalog

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


def evaluate(profile: Profile, datasets: list[Dataset]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fidelity per op class, per-row predictions) of ``profile`` against the datasets."""
    frame = pd.concat([ds.frame for ds in datasets], ignore_index=True)
    fitted_groups = set(profile.held_out_groups)
    # a dataset the profile was fitted on: same folder name and row count
    seen = {(Path(d["path"]).name, d.get("rows")) for d in profile.datasets}
    in_fit_data = np.concatenate(
        [np.full(len(ds.frame), (ds.path.name, len(ds.frame)) in seen) for ds in datasets]
    )
    held = frame["group"].isin(fitted_groups).to_numpy() | ~in_fit_data
    cols = frame_columns(frame)
    cat = load_catalog()
    model = get_cost_model(profile.gpu, profile=profile, catalog=cat, use_shipped=False)
    default = AnalyticalCostModel.for_gpu(profile.gpu, catalog=cat)
    measured = frame["measured_s"].to_numpy()
    pred_profile = model.work_columns(cols).time_s
    pred_default = default.work_columns(cols).time_s
    classes = op_class(cols["op"], cols["dtype"])

    rows = []
    for cls in [*[c for c in OP_CLASSES if c in set(classes)], "all"]:
        in_cls = np.ones(len(classes), dtype=bool) if cls == "all" else classes == cls
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


def _scatter_svg(pred: pd.DataFrame, cls: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = pred[pred["op_class"] == cls]
    fig, (ax, hx) = plt.subplots(1, 2, figsize=(9, 3.6))
    for side, colour in (("fit", "#9aa7b8"), ("held_out", "#d1495b")):
        part = sub[sub["side"] == side]
        ax.scatter(
            part["measured_ms"],
            part["profile_ms"],
            s=9,
            alpha=0.7,
            color=colour,
            label=f"{side.replace('_', '-')} ({len(part)})",
        )
    lo = max(min(sub["measured_ms"].min(), sub["profile_ms"].min()), 1e-4)
    hi = max(sub["measured_ms"].max(), sub["profile_ms"].max())
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="measured ms",
        ylabel="predicted ms",
        title=f"{cls}: measured vs predicted",
    )
    ax.legend(fontsize=8)
    held = sub[sub["side"] == "held_out"]
    err = (held["profile_ms"] - held["measured_ms"]) / held["measured_ms"] * 100
    hx.hist(np.clip(err, -60, 60), bins=30, color="#d1495b")
    hx.set(
        xlabel="error on held-out rows, % (clipped at ±60)", ylabel="rows", title="error histogram"
    )
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def render_html(profile: Profile, fidelity: pd.DataFrame, predictions: pd.DataFrame) -> str:
    """One self-contained page: summary table, a scatter and histogram per op class."""
    table = fidelity.to_html(index=False, float_format=lambda v: f"{v:.1f}", na_rep="", border=0)
    env = profile.measured_on
    facts = ", ".join(
        f"{k}: {html.escape(str(env[k]))}"
        for k in ("gpu_name", "sm_count", "driver", "torch", "torch_cuda", "nccl", "date")
        if k in env
    )
    classes = [
        c for c in fidelity["op_class"] if c != "all" and (predictions["op_class"] == c).any()
    ]
    plots = "".join(
        f"<section><h2>{html.escape(c)}: {html.escape(OP_CLASSES.get(c, c))}</h2>"
        f"{_scatter_svg(predictions, c)}</section>"
        for c in classes
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>simcli calibration: {html.escape(profile.name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85rem; }}
th, td {{ padding: 0.25rem 0.6rem; border-bottom: 1px solid #ddd; text-align: right; }}
th:nth-child(-n+2), td:nth-child(-n+2) {{ text-align: left; }}
section {{ margin-top: 1.5rem; }} svg {{ max-width: 100%; height: auto; }}
</style></head><body>
<h1>Calibration profile {html.escape(profile.name)} ({html.escape(profile.gpu)})</h1>
<p>{facts}</p>
<p>Errors are absolute percentage errors on held-out rows: shape families (models, head
configurations, mask patterns, size decades) never used for fitting. <em>default</em> is the
uncalibrated analytical model, <em>profile</em> the calibrated one.</p>
{table}
{plots}
</body></html>
"""
