"""``simcli calibrate report --output DIR`` / ``calibrate fit --report DIR``: fidelity of a
profile as CSVs and one page (measured-vs-predicted scatter and error histogram per op
class, fit vs held-out rows told apart).

The numbers come from :func:`calibrate.report.evaluate`; this module only draws them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodels.ops.features import OP_CLASSES
from simcli.reports.bundle import config_document, write_output_dir
from simcli.reports.charts import PALETTE, identity_line, measured_vs_predicted, new_figure
from simcli.reports.page import Report
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS

_ERR = "absolute percentage error |predicted - measured| / measured, percent"
CSV_SCHEMAS: dict[str, dict[str, str]] = {
    "fidelity.csv": {
        "op_class": "cost-model op class ('all': every row)",
        "description": "what the op class covers",
        "rows_fit": "rows of this class used to fit the profile",
        "rows_held_out": "rows of this class held out from the fit (the errors are on these)",
        "default_mape": f"uncalibrated analytical model: mean {_ERR}",
        "default_p50": f"uncalibrated analytical model: median {_ERR}",
        "default_p90": f"uncalibrated analytical model: 90th percentile {_ERR}",
        "profile_mape": f"the profile: mean {_ERR}",
        "profile_p50": f"the profile: median {_ERR}",
        "profile_p90": f"the profile: 90th percentile {_ERR}",
        "profile_bias": "the profile: median signed error (predicted - measured) / measured, "
        "percent (negative: too fast)",
    },
    "predictions.csv": {
        **{c: "op column of the measurement (see README: The ops CSV)" for c in CSV_COLUMNS},
        **{c: "op column of the measurement (see README: The ops CSV)" for c in EXTRA_COLUMNS},
        "suite": "benchmark suite that measured the row",
        "family": "shape family within the suite",
        "group": "split group (held out or fitted as a whole)",
        "side": "fit | held_out: whether the profile was fitted on this row",
        "op_class": "cost-model op class",
        "measured_ms": "measured time (median of CUDA-event timings), milliseconds",
        "default_ms": "uncalibrated analytical model's prediction, milliseconds",
        "profile_ms": "the profile's prediction, milliseconds",
    },
}
SIDE_COLOURS = {"fit": "#9aa7b8", "held_out": PALETTE[1]}
ERROR_CLIP_PCT = 60.0


def _mape_figure(fidelity: pd.DataFrame):
    fid = fidelity[fidelity["rows_held_out"] > 0]
    fig, ax = new_figure(8.0, max(1.8, 0.36 * len(fid) + 1.0))
    y = np.arange(len(fid))
    ax.barh(y - 0.2, fid["default_mape"], height=0.4, color=PALETTE[7], label="default")
    ax.barh(y + 0.2, fid["profile_mape"], height=0.4, color=PALETTE[0], label="profile")
    ax.set_yticks(y, list(fid["op_class"]))
    ax.invert_yaxis()
    ax.set_xlabel("MAPE on held-out rows, %")
    ax.legend(fontsize=7, loc="lower right")
    return fig


def _class_figure(pred: pd.DataFrame, cls: str):
    sub = pred[pred["op_class"] == cls]
    fig, (ax, hx) = new_figure(9.0, 3.6, ncols=2)
    for side in ("fit", "held_out"):
        part = sub[sub["side"] == side]
        if len(part):
            measured_vs_predicted(
                ax,
                part["measured_ms"],
                part["profile_ms"],
                side.replace("_", "-"),
                SIDE_COLOURS[side],
            )
    positive = sub[["measured_ms", "profile_ms"]].to_numpy(dtype=float)
    positive = positive[positive > 0]
    if len(positive):
        identity_line(ax, float(positive.min()), float(positive.max()))
    ax.set(xscale="log", yscale="log", xlabel="measured ms", ylabel="predicted ms")
    ax.set_title(f"{cls}: measured vs predicted (profile)")
    ax.legend(fontsize=7)
    held = sub[sub["side"] == "held_out"]
    bins = np.linspace(-ERROR_CLIP_PCT, ERROR_CLIP_PCT, 31)
    for col, name, colour, filled in (
        ("default_ms", "default", PALETTE[7], False),
        ("profile_ms", "profile", PALETTE[1], True),
    ):
        err = (held[col] - held["measured_ms"]) / held["measured_ms"] * 100
        if len(err):
            hx.hist(
                np.clip(err, -ERROR_CLIP_PCT, ERROR_CLIP_PCT),
                bins=bins,
                color=colour,
                histtype="stepfilled" if filled else "step",
                alpha=0.75 if filled else 1.0,
                lw=1.2,
                label=name,
            )
    hx.axvline(0, color="black", lw=0.8)
    hx.set(
        xlabel=f"error on held-out rows, % (clipped at ±{ERROR_CLIP_PCT:.0f})",
        ylabel="rows",
        title="error histogram (held-out)",
    )
    if len(held):
        hx.legend(fontsize=7)
    return fig


def render_calibration_report(
    profile: Any,
    fidelity: pd.DataFrame,
    predictions: pd.DataFrame,
    *,
    data: Sequence[Path] = (),
    provenance: Any = None,
) -> str:
    """Summary, MAPE per class, the fidelity table, a scatter and histogram per op class.
    ``provenance`` (costmodels.ops.select.Provenance): how predictions from this profile
    are obtained and the error to expect, shown in the summary."""
    env = profile.measured_on
    rep = Report(
        f"Calibration profile {profile.name} ({profile.gpu})",
        command="calibrate report",
        subtitle="fidelity on held-out shape families",
    )
    overall = fidelity[fidelity["op_class"] == "all"]
    summary: dict[str, Any] = {"profile": profile.name, "gpu": profile.gpu}
    summary |= {k: env[k] for k in ("gpu_name", "sm_count", "driver", "torch", "date") if k in env}
    summary["datasets"] = [str(d) for d in data]
    summary["rows (fit / held-out)"] = (
        f"{int((predictions['side'] == 'fit').sum())} / "
        f"{int((predictions['side'] == 'held_out').sum())}"
    )
    if len(overall):
        row = overall.iloc[0]
        summary["held-out MAPE, default -> profile"] = (
            f"{row['default_mape']:.1f}% -> {row['profile_mape']:.1f}% "
            f"(p90 {row['profile_p90']:.1f}%)"
        )
    if provenance is not None:
        summary["provenance"] = f"{provenance.kind} ({provenance.source})"
        summary["expected error"] = (
            f"{provenance.expected_error * 100:.1f}% MAPE: {provenance.error_basis}"
        )
        summary["power"] = provenance.power
    rep.summary(summary)
    fit_notes = [str(n) for n in env.get("fit_notes") or []]
    if fit_notes:
        rep.note("What the fit fell back on: " + "; ".join(fit_notes) + ".")
    rep.note(
        "Errors are absolute percentage errors on held-out rows: shape families (models, head "
        "configurations, mask patterns, size decades) never used for fitting. default is the "
        "uncalibrated analytical model, profile the calibrated one."
    )
    if (fidelity["rows_held_out"] > 0).any():
        rep.figure(_mape_figure(fidelity), "held-out MAPE per op class, default vs profile")
    rep.table("Fidelity per op class", fidelity, caption="fidelity.csv (errors in %)")
    classes = [
        c for c in fidelity["op_class"] if c != "all" and (predictions["op_class"] == c).any()
    ]
    for cls in classes:
        rep.heading(f"{cls}: {OP_CLASSES.get(cls, cls)}")
        rep.figure(
            _class_figure(predictions, cls),
            "left: every row, grey fitted, red held out (the line is predicted = measured); "
            "right: signed error of the held-out rows, profile (filled) and default (outline)",
        )
    return rep.html()


def write_calibration_bundle(
    folder: Path,
    profile: Any,
    fidelity: pd.DataFrame,
    predictions: pd.DataFrame,
    *,
    command: str,
    inputs: dict[str, Any],
    provenance: Any = None,
) -> list[Path]:
    """fidelity.csv, predictions.csv, config.json and report.html, all or nothing."""
    page = render_calibration_report(
        profile,
        fidelity,
        predictions,
        data=[Path(d) for d in inputs.get("data", [])],
        provenance=provenance,
    )
    extra = {"provenance": provenance.as_dict()} if provenance is not None else {}
    config = config_document(
        command,
        inputs,
        profile_name=profile.name,
        gpu=profile.gpu,
        measured_on=profile.measured_on,
        **extra,
    )
    return write_output_dir(
        folder,
        csvs={"fidelity.csv": fidelity, "predictions.csv": predictions},
        config=config,
        report_html=page,
    )
