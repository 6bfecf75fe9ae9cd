"""``simcli trace import --output DIR``: a measured step against its prediction, per op
class, with where the GPU sat idle and the kernels no rule matched."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from calibrate.trace.classify import short_name
from simcli.reports.charts import PALETTE, hbar_stack, new_figure
from simcli.reports.page import Report

_PER_STEP = "milliseconds per step (mean over the trace's steps)"
_ERR = "signed relative error (predicted - measured) / measured; empty when nothing measured"
# Column meanings of the bundle's CSVs. Not named CSV_SCHEMAS: docs/outputs.md (generated
# from every report's CSV_SCHEMAS, a test keeps them equal) does not list this command yet.
TRACE_CSV_COLUMNS: dict[str, dict[str, str]] = {
    "classes.csv": {
        "op_class": "op class (gemm, attn_fwd, attn_bwd, norm, elementwise, rope, softmax_ce, "
        "embedding, optimizer, memcpy, collective, fp8_cast, other)",
        "label": "what the op class covers",
        "predicted_ms": f"simcli's decomposition priced by the cost model, {_PER_STEP}",
        "measured_ms": f"sum of the class's kernel durations, {_PER_STEP}",
        "error": _ERR,
        "kernels_per_step": "measured GPU events of the class per step",
    },
    "gaps.csv": {
        "kind": "host_bound | exposed_comm | pipeline_wait | other | total (see README: "
        "Trace import)",
        "ms_per_step": f"time of the step's GPU window spent so, {_PER_STEP}",
        "share": "fraction of the measured step",
    },
    "steps.csv": {
        "step": "step index (order of the step annotations)",
        "name": "step annotation (ProfilerStep#N or the step marker)",
        "start_ms": "GPU window start, ms from the trace's first event",
        "end_ms": "GPU window end, ms from the trace's first event",
        "wall_ms": "end_ms - start_ms: the measured step",
        "busy_ms": "any GPU activity",
        "compute_ms": "non-NCCL GPU activity (kernels, copies, memsets) on any stream",
        "comm_ms": "NCCL kernel time",
        "comm_overlapped_ms": "NCCL time while compute ran",
        "host_bound_ms": "idle: the next work was launched after the GPU went idle",
        "exposed_comm_ms": "only NCCL collectives ran",
        "pipeline_wait_ms": "only NCCL send/recv ran",
        "other_ms": "idle although the next work had been launched",
        "events": "GPU events of the step",
        "host_bound_gaps": "idle gaps that were host-bound",
    },
    "phases.csv": {
        "phase": "forward | backward | optimizer",
        "marker": "its record_function name in the trace",
        "predicted_ms": f"predicted time of the phase's ops, {_PER_STEP}",
        "measured_kernel_ms": f"kernels launched inside the phase's annotation, {_PER_STEP}",
        "measured_span_ms": f"first start to last end of those kernels, {_PER_STEP}",
        "error": "signed relative error of predicted against measured kernel time",
    },
    "unmatched.csv": {
        "name": "kernel name no classification rule matched",
        "count": "events in the measured steps",
        "count_per_step": "events per step",
        "measured_ms": _PER_STEP,
    },
    "kernels.csv": {
        "name": "kernel (or memcpy/memset) name",
        "cat": "trace category: kernel | gpu_memcpy | gpu_memset",
        "op_class": "op class its name was classified as",
        "detail": "collective kind, fp8, attention family or elementwise functor",
        "count": "events in the measured steps",
        "count_per_step": "events per step",
        "measured_ms": _PER_STEP,
    },
}


def _frame(records: list[dict[str, Any]], name: str) -> pd.DataFrame:
    cols = list(TRACE_CSV_COLUMNS[name])
    frame = pd.DataFrame(records)
    return frame.reindex(columns=[c for c in cols if c in frame.columns or not len(frame)])


def build(out: dict[str, Any], kernels: pd.DataFrame) -> tuple[dict[str, pd.DataFrame], str]:
    """The CSVs and the page of one ``simcli trace import`` result (``out``: its JSON
    object; ``kernels``: every measured kernel, ms per step)."""
    step_ms = out["step_measured_ms"]
    classes = _frame(out["classes"], "classes.csv")
    gaps = pd.DataFrame(
        [(k.removesuffix("_ms"), v, v / step_ms if step_ms else np.nan)
         for k, v in out["gaps"].items()],
        columns=list(TRACE_CSV_COLUMNS["gaps.csv"]),
    )  # fmt: skip
    steps = _frame(out["steps"], "steps.csv")
    csvs = {
        "classes.csv": classes,
        "gaps.csv": gaps,
        "steps.csv": steps,
        "unmatched.csv": _frame(out["unmatched"], "unmatched.csv"),
        "kernels.csv": kernels.reindex(columns=list(TRACE_CSV_COLUMNS["kernels.csv"])),
    }
    if out["phases"]:
        csvs["phases.csv"] = _frame(out["phases"], "phases.csv")

    rep = Report(
        f"{out['model']} {out['kind']} step on {out['gpu']}",
        command="trace import",
        subtitle=f"{out['engine']} · {out['steps_in_trace']} step(s) in {out['trace']} · "
        f"{out.get('cost_model', '')}",
    )
    rep.summary({k: v for k, v in out.items() if not isinstance(v, dict | list)})
    for line in out.get("warnings", []):
        rep.note(f"warning: {line}")

    rep.heading("Predicted vs measured per op class")
    shown = classes[(classes.predicted_ms > 0) | (classes.measured_ms > 0)]
    if len(shown):
        fig, ax = new_figure(8.0, 0.9 + 0.34 * len(shown))
        y = np.arange(len(shown))
        ax.barh(y - 0.2, shown.predicted_ms, height=0.4, color=PALETTE[0], label="predicted")
        ax.barh(y + 0.2, shown.measured_ms, height=0.4, color=PALETTE[1], label="measured")
        ax.set_yticks(y, shown.op_class)
        ax.invert_yaxis()
        ax.set_xlabel("ms per step")
        ax.legend(fontsize=7, frameon=False)
        rep.figure(fig, "Kernel time per op class (classes.csv)")
    rep.table("Op classes", classes, caption=_ERR)

    rep.heading("Where the step's GPU window goes")
    fig, ax = new_figure(8.0, 0.9 + 0.32 * max(len(steps), 1))
    parts = ["compute_ms", "exposed_comm_ms", "pipeline_wait_ms", "host_bound_ms", "other_ms"]
    labels = [f"step {s}" for s in steps["step"]] if len(steps) else []
    hbar_stack(ax, labels, {p.removesuffix("_ms"): steps[p] for p in parts if p in steps})
    ax.set_xlabel("ms")
    ax.legend(fontsize=7, ncols=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    rep.figure(fig, "Compute, exposed communication, pipeline wait and idle gaps (steps.csv)")
    rep.table("Gaps (mean per step)", gaps)
    rep.table("Steps", steps)
    if out["phases"]:
        rep.table("Phases", csvs["phases.csv"])
    rep.table(
        "Unmatched kernels",
        _short(csvs["unmatched.csv"]),
        caption="kernel names no rule of calibrate/trace/classify.py matched (class other); "
        "unmatched.csv has the full names",
    )
    rep.table(
        "Kernels by time",
        _short(kernels.head(50)),
        caption="the 50 longest, names shortened; kernels.csv has all, in full",
    )
    return csvs, rep.html()


def _short(frame: pd.DataFrame) -> pd.DataFrame:
    """Kernel names without argument lists and common namespaces, for the page."""
    if "name" not in frame.columns:
        return frame
    return frame.assign(name=[short_name(str(n)) for n in frame["name"]])
