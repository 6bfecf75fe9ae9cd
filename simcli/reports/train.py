"""``simcli train --output DIR``: the iteration in numbers, its breakdown and its timeline."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from simcli.reports.charts import PALETTE, hbar_stack, new_figure, timeline
from simcli.reports.page import Report
from simcli.scenario.sparsity_options import SPARSITY_SCHEMA
from simcli.training.to_train import TO_TRAIN_COLUMNS

CSV_SCHEMAS: dict[str, dict[str, str]] = {
    "summary.csv": {
        "model": "model id",
        "gpu": "GPU id",
        "num_gpus": "GPUs in the job",
        "iteration_s": "simulated time of one iteration (one global batch), seconds",
        "tokens_per_s": "tokens trained per second, whole job",
        "tokens_per_s_per_gpu": "tokens per second per GPU",
        "mfu": "model FLOPs utilisation (6·N·T + attention, over the dense bf16 peak)",
        "model_tflops_per_gpu": "model TFLOP/s per GPU",
        "peak_memory_gib": "peak memory of the fullest GPU, GiB",
        "memory_capacity_gib": "usable memory per GPU, GiB",
        "memory_headroom_gib": "usable memory left at the peak, GiB",
        "memory_margin_gib": "memory the plan must leave free (--memory-margin), GiB",
        "fits": "peak memory plus the margin within capacity",
        "num_microbatches": "micro-batches per iteration per pipeline",
        **SPARSITY_SCHEMA,
        **TO_TRAIN_COLUMNS,
    },
    "breakdown.csv": {
        "component": "where the critical path spends its time (compute_s, pp_bubble_s, "
        "host_bound_s, activation_offload_s, ...)",
        "time_s": "seconds of the iteration",
        "share": "fraction of the iteration",
    },
    "stages.csv": {
        "stage": "pipeline rank",
        "layers": "transformer layers on the rank",
        "busy_s": "seconds the rank computes",
        "compute_end_s": "when its last backward ends, seconds from the start",
        "bubble_s": "idle seconds inside the pipeline schedule",
        "dp_comm_exposed_s": "data-parallel communication not hidden behind compute, seconds",
        "host_bound_s": "seconds the rank waits for its host to dispatch ops (engines with a "
        "fitted host time per op: eager and compiled PyTorch)",
        "end_s": "when the rank finishes the iteration (optimizer included), seconds",
    },
    "memory.csv": {
        "component": "weights, grads, optimizer, activations, logits, comm_buffer, overhead",
        "memory_gib": "GiB on the fullest GPU",
    },
    "timeline.csv": {
        "rank": "pipeline rank",
        "stream": "compute | pp-comm | dp-comm | optimizer",
        "name": "task: F/B mbN chunkK, recv/send mbN, collective bucket, optimizer",
        "start_s": "start, seconds from the iteration start",
        "end_s": "end, seconds from the iteration start",
        "duration_s": "end_s - start_s",
    },
}

SUMMARY_KEYS = tuple(CSV_SCHEMAS["summary.csv"])


def _kind(stream: str, name: str) -> str:
    if stream == "compute":
        return {"F": "forward", "B": "backward"}.get(name[:1], "compute")
    return stream


def timeline_frame(spans: list[Any]) -> pd.DataFrame:
    rows = [
        (s.rank, s.stream, s.name, float(s.start_s), float(s.end_s), float(s.end_s - s.start_s))
        for s in spans
    ]
    return pd.DataFrame(rows, columns=list(CSV_SCHEMAS["timeline.csv"]))


def _merged_spans(frame: pd.DataFrame, eps_s: float) -> list[tuple[str, float, float, str]]:
    """Adjacent spans of one track and kind merged (gaps below ``eps_s``): the same
    picture with far fewer SVG shapes for long schedules."""
    out: list[tuple[str, float, float, str]] = []
    frame = frame.assign(kind=[_kind(s, n) for s, n in zip(frame.stream, frame.name, strict=True)])
    tracks = [
        f"rank {r} {'compute' if s == 'compute' else 'comm'}"
        for r, s in zip(frame["rank"], frame.stream, strict=True)
    ]
    frame = frame.assign(track=tracks)
    for (track, kind), part in frame.sort_values("start_s").groupby(["track", "kind"], sort=False):
        start = end = None
        for s, e in zip(part.start_s, part.end_s, strict=True):
            if start is not None and s - end <= eps_s:
                end = max(end, e)
                continue
            if start is not None:
                out.append((track, start, end - start, kind))
            start, end = s, e
        if start is not None:
            out.append((track, start, end - start, kind))
    names = sorted({t for t, *_ in out}, key=lambda t: (int(t.split()[1]), t.endswith("comm")))
    order = {t: i for i, t in enumerate(names)}
    out.sort(key=lambda x: order[x[0]])
    return out


def build(out: dict[str, Any], spans: list[Any]) -> tuple[dict[str, pd.DataFrame], str]:
    """The CSVs and the page of one ``simcli train`` result (``out`` = its JSON object)."""
    summary = pd.DataFrame([{k: out.get(k) for k in SUMMARY_KEYS}])
    it = out["iteration_s"]
    breakdown = pd.DataFrame(
        [(k, v, v / it if it else np.nan) for k, v in out["breakdown_s"].items()],
        columns=list(CSV_SCHEMAS["breakdown.csv"]),
    )
    stages = pd.DataFrame(out["stages"]).reindex(columns=list(CSV_SCHEMAS["stages.csv"]))
    memory = pd.DataFrame(
        [(k, v) for k, v in out["memory_gib"].items() if k not in ("total", "capacity")],
        columns=list(CSV_SCHEMAS["memory.csv"]),
    )
    tl = timeline_frame(spans)
    csvs = {
        "summary.csv": summary,
        "breakdown.csv": breakdown,
        "stages.csv": stages,
        "memory.csv": memory,
        "timeline.csv": tl,
    }

    plan = out["plan"]
    rep = Report(
        f"{out['model']} on {out['num_gpus']} x {out['gpu']}",
        command="train",
        subtitle=f"tp {plan['tp']} · pp {plan['pp']} · dp {plan['dp']} · cp {plan['cp']} · "
        f"{plan['pp_schedule']} · recompute {plan['recompute']} · {out.get('cost_model', '')}",
    )
    rep.summary({k: out.get(k) for k in SUMMARY_KEYS})

    rep.heading("Where the iteration goes")
    fig, ax = new_figure(8, 2.2)
    parts = breakdown[breakdown.time_s > 0]
    hbar_stack(ax, ["iteration"], {r.component: [r.time_s] for r in parts.itertuples()})
    ax.set_xlabel("seconds")
    ax.legend(fontsize=7, ncols=min(len(parts), 5), loc="upper center",
              bbox_to_anchor=(0.5, -0.45), frameon=False)  # fmt: skip
    rep.figure(fig, "Critical-path time by component (breakdown.csv)")

    rep.heading("Pipeline timeline")
    if len(tl):
        eps = 1e-3 * float(tl.end_s.max())
        merged = _merged_spans(tl, eps)
        tracks = len({t for t, *_ in merged})
        fig, ax = new_figure(10, 0.9 + 0.32 * tracks)
        colors = {"forward": PALETTE[0], "backward": PALETTE[1], "pp-comm": PALETTE[2],
                  "dp-comm": PALETTE[3], "optimizer": PALETTE[4]}  # fmt: skip
        timeline(ax, merged, colors=colors)
        ax.set_xlabel("seconds from the iteration start")
        rep.figure(
            fig,
            "Every pipeline rank's compute and communication streams (timeline.csv; "
            "open the --trace file in ui.perfetto.dev for every task)",
        )
    else:
        rep.note("no spans recorded")

    rep.heading("Per pipeline stage")
    fig, (a1, a2) = new_figure(10, 0.9 + 0.35 * max(len(stages), 2), ncols=2)
    labels = [f"stage {int(s)}" for s in stages.stage]
    hbar_stack(a1, labels, {"busy": stages.busy_s, "bubble": stages.bubble_s,
                            "dp comm exposed": stages.dp_comm_exposed_s})  # fmt: skip
    a1.set_xlabel("seconds")
    a1.legend(fontsize=7, ncols=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    hbar_stack(a2, ["fullest GPU"], {r.component: [r.memory_gib] for r in memory.itertuples()})
    a2.axvline(out["memory_capacity_gib"], color="black", lw=1, ls="--")
    a2.set_xlabel("GiB (dashed: capacity)")
    a2.legend(fontsize=7, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    rep.figure(fig, "Stage time (stages.csv) and memory of the fullest GPU (memory.csv)")
    rep.table("Stages", stages)
    rep.table("Plan", pd.DataFrame([{k: v for k, v in plan.items()}]))
    return csvs, rep.html()
