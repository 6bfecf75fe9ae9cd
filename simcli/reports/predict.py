"""``simcli predict --output DIR``: predictions, time by op kind, a roofline, one page.

The command prices the ops (time, FLOPs and bytes per row from the cost model); this
module only arranges those results into CSVs and charts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodels.ops.features import OP_CLASSES, op_class
from simcli.reports.bundle import config_document, write_output_dir
from simcli.reports.charts import PALETTE, new_figure
from simcli.reports.page import Report
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, SPARSITY_COLUMN

_INPUT_DOC = (
    "input column, copied unchanged from --input (see README: The ops CSV); one-op "
    "subcommands write their op's non-empty columns"
)

CSV_SCHEMAS: dict[str, dict[str, str]] = {
    "predictions.csv": {
        "phase": "predict layer only: fwd | bwd",
        "name": "predict layer only: the op's name in the layer (qkv_proj, attn, ...)",
        "count": "predict layer only: calls per layer (predicted_ms covers all of them)",
        **{c: _INPUT_DOC for c in (*CSV_COLUMNS, *EXTRA_COLUMNS)},
        SPARSITY_COLUMN: "optional input column (gemm rows): the weight's sparsity, priced by "
        "the sparse-GEMM models: empty/dense, 2:4 (cuSPARSELt kernel, CUDA-graph replay), "
        "unstructured:S (S = zero fraction, Flash-LLM), cats:F (F = active MLP neurons per "
        "token, CATS); written only when the input has it",
        "predicted_ms": "predicted time of the row's op, milliseconds",
    },
    "by_op.csv": {
        "op_class": "cost-model op class (gemm_half, attn, decode, elementwise, collective, ...)",
        "op": "op kind as in the input's op column",
        "rows": "number of input rows of this op kind",
        "total_predicted_ms": "sum of predicted_ms over those rows, milliseconds",
        "share_pct": "total_predicted_ms / total of all rows, percent",
        "total_flops": "algorithmic floating-point operations of those rows, FLOPs",
        "total_bytes": "bytes moved (HBM, or the nccl-tests size for collectives), bytes",
        "achieved_tflop_per_s": "total_flops / total time, TFLOP/s (0 for ops without FLOPs)",
        "achieved_gb_per_s": "total_bytes / total time, decimal GB/s",
    },
}
PREDICTIONS_NOTE = (
    "predictions.csv holds the input's own columns, in its order (a subset of the contract "
    "columns is allowed), followed by predicted_ms"
)
TOP_N = 20


def _classes(frame: pd.DataFrame) -> np.ndarray:
    op = frame["op"].to_numpy(dtype=str)
    dtype = frame["dtype"].fillna("").to_numpy(dtype=str) if "dtype" in frame else op
    backend = frame["backend"].fillna("").to_numpy(dtype=str) if "backend" in frame else None
    return op_class(op, dtype, backend)


def by_op_frame(
    frame: pd.DataFrame, time_s: np.ndarray, flops: np.ndarray, nbytes: np.ndarray
) -> pd.DataFrame:
    """Per op kind: rows, total time, share of the total, work and achieved rates."""
    df = pd.DataFrame(
        {
            "op_class": _classes(frame),
            "op": frame["op"].to_numpy(dtype=str),
            "time_s": np.asarray(time_s, dtype=float),
            "flops": np.asarray(flops, dtype=float),
            "bytes": np.asarray(nbytes, dtype=float),
        }
    )
    g = df.groupby(["op_class", "op"], sort=False).agg(
        rows=("op", "size"),
        time_s=("time_s", "sum"),
        flops=("flops", "sum"),
        bytes=("bytes", "sum"),
    )
    g = g.reset_index()
    total_s = float(df["time_s"].sum())
    safe = g["time_s"].where(g["time_s"] > 0)
    out = pd.DataFrame(
        {
            "op_class": g["op_class"],
            "op": g["op"],
            "rows": g["rows"].astype(int),
            "total_predicted_ms": g["time_s"] * 1e3,
            "share_pct": g["time_s"] / total_s * 100 if total_s > 0 else 0.0,
            "total_flops": g["flops"],
            "total_bytes": g["bytes"],
            "achieved_tflop_per_s": (g["flops"] / safe / 1e12).fillna(0.0),
            "achieved_gb_per_s": (g["bytes"] / safe / 1e9).fillna(0.0),
        }
    )
    out = out.sort_values("total_predicted_ms", ascending=False, kind="stable")
    return out.reset_index(drop=True)[list(CSV_SCHEMAS["by_op.csv"])]


def _class_colours(classes) -> dict[str, str]:
    order = [c for c in OP_CLASSES if c in set(classes)]
    order += sorted(set(classes) - set(order))
    return {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(order)}


def _time_by_class_figure(by_op: pd.DataFrame, colours: dict[str, str]):
    per = by_op.groupby("op_class", sort=False)["total_predicted_ms"].sum().sort_values()
    fig, ax = new_figure(8.0, max(1.6, 0.32 * len(per) + 0.9))
    ax.barh(per.index, per.to_numpy(), color=[colours[c] for c in per.index])
    total = float(per.sum())
    for i, v in enumerate(per.to_numpy()):
        ax.text(v, i, f" {v:.3g} ms ({v / total:.0%})" if total > 0 else "", va="center")
    ax.set_xlabel("predicted time, ms")
    ax.set_xlim(0, max(per.max(), 1e-12) * 1.3)
    return fig


def _top_ops_figure(labels: list[str], ms: np.ndarray, classes: np.ndarray, colours):
    order = np.argsort(-ms, kind="stable")[:TOP_N][::-1]
    fig, ax = new_figure(8.0, max(1.6, 0.26 * len(order) + 0.9))
    ax.barh([labels[i] for i in order], ms[order], color=[colours[classes[i]] for i in order])
    ax.set_xlabel("predicted time, ms")
    ax.tick_params(axis="y", labelsize=7)
    return fig


def _roofline_figure(gpu, frame, classes, time_s, flops, nbytes, colours):
    """(figure, caption): achieved TFLOP/s against FLOP/byte under the GPU's peaks, and GB/s
    of ops without FLOPs. None when no row moves HBM bytes (e.g. collectives only)."""
    t = np.asarray(time_s, dtype=float)
    ok = (t > 0) & np.isfinite(t)
    compute = ok & (flops > 0) & (nbytes > 0) & (classes != "collective")
    memory = ok & ~compute & (nbytes > 0) & (classes != "collective")
    if not compute.any() and not memory.any():
        return None
    ncols = int(compute.any()) + int(memory.any())
    fig, axes = new_figure(4.5 * ncols + 1.0, 3.8, ncols=ncols)
    axes = axes if isinstance(axes, list) else [axes]
    hbm = gpu.hbm_bytes_per_s
    dtypes = frame["dtype"].fillna("").to_numpy(dtype=str) if "dtype" in frame else None
    i = 0
    if compute.any():
        ax = axes[i]
        i += 1
        intensity = flops[compute] / nbytes[compute]
        achieved = flops[compute] / t[compute] / 1e12
        for cls in dict.fromkeys(classes[compute]):
            sel = classes[compute] == cls
            ax.scatter(intensity[sel], achieved[sel], s=14, color=colours[cls], label=cls)
        lo = max(float(intensity.min()) / 3, 1e-2)
        hi = float(intensity.max()) * 3
        x = np.geomspace(lo, max(hi, lo * 10), 200)
        present = sorted({d for d in (dtypes[compute] if dtypes is not None else []) if d})
        peaks = {d: gpu.peak_flops_per_s(d) for d in present if gpu.supports(d)} or {
            "bf16": gpu.peak_flops_per_s("bf16")
        }
        for j, (d, peak) in enumerate(sorted(peaks.items(), key=lambda kv: kv[1])):
            ax.plot(
                x, np.minimum(peak, hbm * x) / 1e12, color="#444", lw=0.9, ls=("-", "--")[j % 2]
            )
            label = f"{d} peak {peak / 1e12:.0f}"
            ax.text(x[-1], peak / 1e12, label, ha="right", va="bottom", fontsize=7)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="arithmetic intensity, FLOP/byte",
            ylabel="achieved TFLOP/s",
            title=f"roofline ({gpu.id}, HBM {hbm / 1e9:.0f} GB/s)",
        )
        ax.legend(fontsize=7, loc="lower right")
    if memory.any():
        ax = axes[i]
        moved = nbytes[memory]
        rate = moved / t[memory] / 1e9
        for cls in dict.fromkeys(classes[memory]):
            sel = classes[memory] == cls
            ax.scatter(moved[sel], rate[sel], s=14, color=colours[cls], label=cls)
        ax.axhline(hbm / 1e9, color="#444", lw=0.9)
        label = f"HBM peak {hbm / 1e9:.0f} GB/s"
        ax.text(float(moved.min()), hbm / 1e9, label, va="bottom", fontsize=7)
        ax.set(
            xscale="log",
            xlabel="bytes moved",
            ylabel="achieved GB/s",
            title="ops without FLOPs (copies)",
            ylim=(0, hbm / 1e9 * 1.15),
        )
        ax.legend(fontsize=7, loc="lower right")
    caption = []
    if compute.any():
        caption.append(
            "every op with FLOPs at its arithmetic intensity (FLOPs / HBM bytes of the cost "
            "model) and achieved rate (FLOPs / predicted time), under the GPU's dense peaks for "
            "the dtypes present and its HBM bandwidth"
        )
    if memory.any():
        caption.append("ops without FLOPs (copies): achieved GB/s against the HBM peak")
    if ncols == 2:
        caption = [f"left: {caption[0]}", f"right: {caption[1]}"]
    text = "; ".join(caption) + ". Collectives are left out (their bytes cross links, not HBM)."
    return fig, text[0].upper() + text[1:]


def render_predict_report(
    *,
    gpu,
    model_label: str,
    source: str,
    out: pd.DataFrame,
    frame: pd.DataFrame,
    time_s: np.ndarray,
    flops: np.ndarray,
    nbytes: np.ndarray,
    by_op: pd.DataFrame,
) -> str:
    """The page: summary, time by op class, roofline, top ops, the tables."""
    classes = _classes(frame)
    colours = _class_colours(classes)
    total_ms = float(np.sum(time_s) * 1e3)
    title = Path(source).name if source.endswith(".csv") else source
    rep = Report(f"{title} on {gpu.id}", command="predict", subtitle=model_label)
    rep.summary(
        {
            "input": source,
            "gpu": gpu.id,
            "profile (cost model)": model_label,
            "rows": len(out),
            "total predicted ms": total_ms,
            "op kinds": len(by_op),
        }
    )
    rep.heading("Where the time goes")
    rep.figure(_time_by_class_figure(by_op, colours), "predicted time by op class (all rows)")
    roof = _roofline_figure(
        gpu, frame, classes, np.asarray(time_s), np.asarray(flops), np.asarray(nbytes), colours
    )
    if roof is not None:
        rep.figure(*roof)
    labels = [f"{i + 1}: {op}" for i, op in enumerate(frame["op"].to_numpy(dtype=str))]
    rep.figure(
        _top_ops_figure(labels, np.asarray(time_s) * 1e3, classes, colours),
        f"the {min(TOP_N, len(labels))} slowest rows (row number in the input: op)",
    )
    rep.table("Time by op kind", by_op, caption="by_op.csv")
    rep.table("Predictions", out, caption=PREDICTIONS_NOTE)
    return rep.html()


def write_predict_bundle(
    folder: Path,
    *,
    gpu,
    model_label: str,
    inputs: dict[str, Any],
    out: pd.DataFrame,
    frame: pd.DataFrame,
    time_s: np.ndarray,
    flops: np.ndarray,
    nbytes: np.ndarray,
) -> list[Path]:
    """predictions.csv, by_op.csv, config.json and report.html, all or nothing."""
    by_op = by_op_frame(frame, time_s, flops, nbytes)
    page = render_predict_report(
        gpu=gpu,
        model_label=model_label,
        source=str(inputs.get("input") or inputs.get("op", "")),
        out=out,
        frame=frame,
        time_s=time_s,
        flops=flops,
        nbytes=nbytes,
        by_op=by_op,
    )
    config = config_document("predict", inputs, cost_model=model_label)
    return write_output_dir(
        folder, csvs={"predictions.csv": out, "by_op.csv": by_op}, config=config, report_html=page
    )
