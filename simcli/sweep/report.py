"""Reading a store back: the flat points table (export, points.csv) and the sweep report."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from simcli.reports import Report
from simcli.reports.bundle import config_document, write_output_dir
from simcli.reports.charts import PALETTE, new_figure, pareto_line

FIXED_COLUMNS = {
    "point_id": "hash of (command, canonical JSON of the parameters): the point's identity",
    "seq": "position of the point in the spec's expansion",
    "command": "the simcli command the point ran (e.g. train, predict gemm)",
    "ok": "true when the command succeeded",
    "error": "the command's one-line error for a failed point, else empty",
    "simcli_version": "simcli version that computed the point",
    "profile_id": "calibration profile / cost-model label the point used",
    "wall_s": "seconds the point took in its worker",
    "finished_utc": "when the point finished (ISO 8601, UTC)",
}
CSV_SCHEMAS = {
    "points.csv": {
        **FIXED_COLUMNS,
        "in.<option>": "a parameter of the point, named as the command's long option "
        "(e.g. in.global-batch); units as the option takes them",
        "out.<field>": "a scalar field of the command's --format json object; nested objects "
        "flattened with dots (out.breakdown_s.compute), lists left out (outputs_json has "
        "them); units are in the field names (_s seconds, _gib GiB, _ms milliseconds)",
    }
}
PLAN_BEST = "best"  # `plan`: the first-ranked plan's fields become out.best.<field>


def flatten(obj: dict[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name))
        elif isinstance(value, list | tuple):
            continue
        else:
            out[name] = value
    return out


def points_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per point: the fixed columns, ``in.*`` parameters, ``out.*`` scalar outputs."""
    records = []
    for row in rows.itertuples(index=False):
        rec: dict[str, Any] = {c: getattr(row, c) for c in FIXED_COLUMNS}
        rec["ok"] = bool(rec["ok"])
        rec["error"] = rec["error"] or ""
        params = json.loads(row.params_json)
        rec.update(
            {
                f"in.{k}": (",".join(map(str, v)) if isinstance(v, list) else v)
                for k, v in params.items()
            }
        )
        if isinstance(row.outputs_json, str) and row.outputs_json:
            outputs = json.loads(row.outputs_json)
            plans = outputs.get("plans")
            if isinstance(plans, list) and plans and isinstance(plans[0], dict):
                outputs = {**outputs, PLAN_BEST: plans[0]}
            rec.update(flatten(outputs, "out"))
        records.append(rec)
    frame = pd.DataFrame.from_records(records)
    if frame.empty:
        return pd.DataFrame(columns=list(FIXED_COLUMNS))
    ins = [c for c in frame.columns if c.startswith("in.")]
    outs = [c for c in frame.columns if c.startswith("out.")]
    return frame[list(FIXED_COLUMNS) + ins + outs]


def _numeric(frame: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(frame[col], errors="coerce") if col in frame else pd.Series(dtype=float)


def _first(frame: pd.DataFrame, *cols: str) -> str | None:
    for c in cols:
        if c in frame and _numeric(frame, c).notna().any():
            return c
    return None


def _pareto_chart(ok: pd.DataFrame, x: str, y: str, group: str | None, xlabel: str, ylabel: str):
    fig, ax = new_figure(7.5, 4.0)
    xs, ys = _numeric(ok, x).to_numpy(float), _numeric(ok, y).to_numpy(float)
    finite = np.isfinite(xs) & np.isfinite(ys)
    groups = ok[group].astype(str).to_numpy() if group and group in ok else np.array([""] * len(ok))
    for i, g in enumerate(sorted(set(groups[finite]))):
        sel = finite & (groups == g)
        ax.scatter(
            xs[sel], ys[sel], s=14, alpha=0.6, color=PALETTE[i % len(PALETTE)], label=g or None
        )
    if finite.any():
        pareto_line(ax, xs, ys, label="Pareto front", color="black", lw=1.0, marker="o", ms=5,
                    mfc="none")  # fmt: skip
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.legend(fontsize=7, frameon=False)
    return fig


def _status_chart(frame: pd.DataFrame, missing: int):
    fig, ax = new_figure(7.5, 1.5)
    ok = int(frame["ok"].sum()) if len(frame) else 0
    parts = [
        ("ok", ok, PALETTE[3]),
        ("failed", len(frame) - ok, PALETTE[1]),
        ("not run", missing, PALETTE[7]),
    ]
    left = 0
    for _, val, col in parts:
        ax.barh([0], [val], left=left, color=col)
        left += val
    ax.set(yticks=[], xlabel="points")
    ax.set_title("   ".join(f"{lab}: {val}" for lab, val, _ in parts), fontsize=9)
    return fig


def build_report(frame: pd.DataFrame, meta: dict[str, Any], store_path: str) -> Report:
    """The sweep's page: status, a Pareto chart fitting the command, best points, failures."""
    command = str(meta.get("command") or (frame["command"].iloc[0] if len(frame) else ""))
    total = int(meta.get("points_total") or len(frame))
    ids = meta.get("point_ids")
    in_spec = frame[frame["point_id"].isin(ids)] if ids else frame
    missing = max(0, total - len(in_spec))
    rep = Report(f"sweep of simcli {command}", command="sweep", subtitle=store_path)
    rep.summary(
        {
            "command": command,
            "points in spec": total,
            "ok": int(in_spec["ok"].sum()) if len(in_spec) else 0,
            "failed": int((~in_spec["ok"]).sum()) if len(in_spec) else 0,
            "not run": missing,
            "point wall time, sum (s)": float(in_spec["wall_s"].sum()) if len(in_spec) else 0.0,
            "profiles": sorted({p for p in in_spec.get("profile_id", []) if p}),
            "simcli versions": sorted(set(in_spec.get("simcli_version", []))),
            "store": store_path,
        }
    )
    rep.figure(_status_chart(in_spec, missing), "Points done, failed and not yet run")
    ok = in_spec[in_spec["ok"]] if len(in_spec) else in_spec
    top = command.split()[0] if command else ""
    chart = False
    if len(ok) and top in ("train", "plan"):
        pre = "out.best." if top == "plan" else "out."
        t, tps, n = pre + "iteration_s", pre + "tokens_per_s", pre + "num_gpus"
        if top == "plan" and n not in ok:
            n = "out.num_gpus"
        if all(c in ok for c in (t, tps, n)):
            ok = ok.copy()
            ok["gpu_hours_per_mtok"] = _numeric(ok, n) / _numeric(ok, tps) * 1e6 / 3600
            rep.figure(
                _pareto_chart(
                    ok,
                    "gpu_hours_per_mtok",
                    t,
                    "in.gpu",
                    "GPU-hours per million tokens (cost)",
                    "iteration s (time)",
                ),
                "Time vs cost of every point that ran; the line joins the Pareto front",
            )
            chart = True
            if "in.gpu" in ok:
                best = ok.loc[_numeric(ok, t).groupby(ok["in.gpu"]).idxmin().dropna()]
                cols = [c for c in best.columns if c.startswith("in.")] + [
                    c
                    for c in (t, tps, pre + "mfu", pre + "peak_memory_gib", "gpu_hours_per_mtok")
                    if c in best
                ]
                rep.table("Best point per GPU type (lowest iteration time)", best[cols])
    elif len(ok) and top == "serve":
        x = _first(ok, "out.throughput_tokens_per_s", "out.throughput_requests_per_s")
        y = _first(ok, "out.ttft_s_p99", "out.e2e_s_p99", "out.tpot_s_p99")
        if x and y:
            fig = _pareto_chart(
                ok.assign(**{"neg": -_numeric(ok, x)}),
                "neg",
                y,
                "in.scheduler",
                f"-{x[4:]} (higher throughput to the left)",
                y[4:],
            )
            rep.figure(fig, "Latency vs throughput; the line joins the Pareto front")
            chart = True
    if len(ok) and not chart:
        nums = [
            c
            for c in ok.columns
            if c.startswith("out.")
            and _numeric(ok, c).notna().all()
            and _numeric(ok, c).nunique() > 1
        ]
        if len(nums) >= 2:
            rep.figure(
                _pareto_chart(ok, nums[0], nums[1], "in.gpu", nums[0][4:], nums[1][4:]),
                f"{nums[1][4:]} vs {nums[0][4:]} of every point that ran",
            )
    failed = in_spec[~in_spec["ok"]] if len(in_spec) else in_spec
    if len(failed):
        cols = [c for c in failed.columns if c.startswith("in.")] + ["error"]
        rep.table("Failed points", failed[cols], max_rows=50)
    if len(in_spec):
        # what varies first, then the outcome, then the bookkeeping columns
        varying = [c for c in in_spec.columns
                   if c.startswith("in.") and in_spec[c].astype(str).nunique() > 1]  # fmt: skip
        outs = [c for c in in_spec.columns if c.startswith("out.")]
        rest = [c for c in in_spec.columns if c not in varying and c not in outs]
        lead = [c for c in ("ok", "error") if c in rest]
        rest = [c for c in rest if c not in lead]
        rep.table("Points", in_spec[varying + lead + outs + rest], max_rows=100,
                  caption="swept inputs first; points.csv has every row")  # fmt: skip
    return rep


def write_report(folder, frame: pd.DataFrame, meta: dict[str, Any], store_path: str) -> list:
    rep = build_report(frame, meta, store_path)
    inputs = {"spec": meta.get("spec"), "spec_path": meta.get("spec_path"), "store": store_path}
    return write_output_dir(
        folder,
        csvs={"points.csv": frame},
        config=config_document("sweep", inputs),
        report_html=rep.html(),
    )
