"""``simcli plan --output DIR``: the ranking, every plan tried, and the time/memory front."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from simcli.reports.charts import PALETTE, hbar_stack, new_figure, pareto_line
from simcli.reports.page import Report
from simcli.training.to_train import TO_TRAIN_COLUMNS

PLAN_COLUMNS: dict[str, str] = {
    "rank": "position in the ranking (1 = best by the objective)",
    "num_gpus": "GPUs of the plan",
    "tp": "tensor-parallel degree",
    "pp": "pipeline-parallel degree",
    "dp": "data-parallel degree",
    "cp": "context-parallel degree",
    "cp_kind": "ring | ulysses | tokenring | allgather | hierarchical (empty when cp = 1)",
    "tp_comm": "TP collectives exposed (plain) or overlapped with the GEMMs (overlap)",
    "ep": "expert-parallel degree",
    "vpp": "virtual pipeline stages per rank (interleaved 1F1B when > 1)",
    "pp_schedule": "1f1b | interleaved | gpipe",
    "zero": "ZeRO stage",
    "micro_batch": "sequences per micro-batch",
    "num_microbatches": "micro-batches per iteration per pipeline",
    "recompute": "none | selective | full",
    "sequence_parallel": "Megatron sequence parallelism on",
    "precision": "training precision",
    "layer_split": "layers per model chunk when uneven (balanced plans; lighter first/last "
    "chunks where pp*vpp does not divide the layers; 0: embedding or LM head alone)",
    "optimizer_offload": "share of the optimizer state on the host CPU (ZeRO-Offload)",
    "rank_order": "rank layout, fastest-varying first (tp-cp-dp-pp Megatron, tp-cp-pp-dp "
    "Llama 3)",
    "balanced": "uneven stages chosen by the Galvatron-BMW-style balancing",
    "iteration_s": "simulated iteration time, seconds",
    "estimate_s": "closed-form time that selected the plan, seconds",
    "tokens_per_s": "tokens per second, whole job",
    "mfu": "model FLOPs utilisation",
    "peak_memory_gib": "peak memory of the fullest GPU, GiB",
    "memory_capacity_gib": "usable memory per GPU, GiB",
    "memory_headroom_gib": "usable memory left at the peak, GiB (at least --memory-margin)",
    "gpu_hours_per_iteration": "GPU-hours per iteration",
    "cost_usd_per_iteration": "US$ per iteration at the GPU price",
    **{k: f"{v} (with --train-tokens)" for k, v in TO_TRAIN_COLUMNS.items()},
}

_SHARED = ("num_gpus", "tp", "pp", "dp", "cp", "cp_kind", "tp_comm", "ep", "vpp", "zero",
           "micro_batch", "num_microbatches", "recompute", "sequence_parallel")  # fmt: skip
EVALUATED_COLUMNS: dict[str, str] = {
    **{c: PLAN_COLUMNS[c] for c in _SHARED},
    "peak_memory_gib": "estimated peak memory of the fullest GPU, GiB",
    "fits": "peak memory plus --memory-margin within capacity",
    "estimate_s": "closed-form iteration time (equal to the simulator for even 1F1B "
    "stages), seconds; empty when the plan does not fit",
    "cost_usd_per_iteration_estimate": "US$ per iteration from estimate_s",
}

PARETO_COLUMNS: dict[str, str] = {
    **{c: PLAN_COLUMNS[c] for c in _SHARED if c != "num_microbatches"},
    "layer_split": PLAN_COLUMNS["layer_split"],
    "optimizer_offload": PLAN_COLUMNS["optimizer_offload"],
    "rank_order": PLAN_COLUMNS["rank_order"],
    "estimate_s": "closed-form iteration time (not simulated), seconds",
    "peak_memory_gib": "estimated peak memory of the fullest GPU, GiB",
    "cost_usd_per_iteration": "US$ per iteration from estimate_s at the GPU price",
}

CSV_SCHEMAS: dict[str, dict[str, str]] = {
    "plans.csv": PLAN_COLUMNS,
    "pareto.csv": PARETO_COLUMNS,
    "evaluated.csv": EVALUATED_COLUMNS,
}


def _label(r: dict[str, Any]) -> str:
    extra = f" cp{r['cp']}-{r['cp_kind']}" if r["cp"] > 1 else ""
    extra += f" v{r['vpp']}" if r["vpp"] > 1 else ""
    return (
        f"#{r['rank']} tp{r['tp']} pp{r['pp']} dp{r['dp']}{extra} mb{r['micro_batch']} "
        f"z{r['zero']} {r['recompute'][:3]}"
    )


def build(
    summary: dict[str, Any],
    records: list[dict[str, Any]],
    evaluated: dict[str, np.ndarray] | None,
    breakdowns: list[dict[str, float]],
    pareto: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, pd.DataFrame], str]:
    """CSVs and page of one search (``records``: the ranked plans' rows; ``pareto``: the
    plans no other beats in time, memory and cost together)."""
    plans = pd.DataFrame(records).reindex(columns=list(PLAN_COLUMNS))
    plans["layer_split"] = [
        "" if not v else ",".join(str(x) for x in v) for v in plans["layer_split"]
    ]
    ev = pd.DataFrame(evaluated or {}).reindex(columns=list(EVALUATED_COLUMNS))
    front = pd.DataFrame(pareto or []).reindex(columns=list(PARETO_COLUMNS))
    front["layer_split"] = [
        "" if not isinstance(v, list) else ",".join(str(x) for x in v)
        for v in front["layer_split"]
    ]
    csvs = {"plans.csv": plans, "pareto.csv": front, "evaluated.csv": ev}

    rep = Report(
        f"Plans for {summary['model']} on {summary['num_gpus']} x {summary['gpu']}",
        command="plan",
        subtitle=f"seq_len {summary['seq_len']} · global batch {summary['global_batch']} · "
        f"objective {summary['objective']}",
    )
    best = records[0]
    rep.summary(
        {
            "best plan": _label(best),
            "best iteration_s": best["iteration_s"],
            "best mfu": best["mfu"],
            "best peak_memory_gib": best["peak_memory_gib"],
            "best memory_headroom_gib": best["memory_headroom_gib"],
            "best cost_usd_per_iteration": best["cost_usd_per_iteration"],
            **{k: v for k, v in summary.items() if k != "phase_seconds"},
        }
    )

    cols = ["rank", "tp", "pp", "dp", "cp", "cp_kind", "vpp", "zero", "micro_batch", "recompute",
            "sequence_parallel", "layer_split", "optimizer_offload", "rank_order", "iteration_s",
            "mfu",
            "peak_memory_gib", "memory_headroom_gib", "cost_usd_per_iteration"]  # fmt: skip
    rep.table("Ranking", plans[cols])

    rep.heading("Time and memory of every plan tried")
    fits = ev[ev.fits.astype(bool)] if len(ev) else ev
    if len(fits):
        x = fits.peak_memory_gib.to_numpy(float)
        y = fits.estimate_s.to_numpy(float)
        fig, ax = new_figure(9, 4.2)
        ax.scatter(x, y, s=6, alpha=0.35, color="#9aa7b8", label=f"fits ({len(fits)})")
        pareto_line(ax, x, y, marker="o", ms=4, color=PALETTE[1])
        ax.scatter(plans.peak_memory_gib, plans.iteration_s, marker="*", s=90,
                   color=PALETTE[0], zorder=5, label="ranked plans (simulated)")  # fmt: skip
        for r in records[:3]:
            ax.annotate(f"#{r['rank']}", (r["peak_memory_gib"], r["iteration_s"]),
                        textcoords="offset points", xytext=(5, 4), fontsize=8)  # fmt: skip
        cap = float(plans.memory_capacity_gib.iloc[0])
        ax.axvline(cap, color="black", lw=0.8, ls="--")
        ax.set(xlabel="peak memory per GPU, GiB (dashed: capacity)", ylabel="iteration s")
        if y.max() / max(y.min(), 1e-12) > 20:
            ax.set_yscale("log")
        ax.legend(fontsize=8)
        rep.figure(
            fig,
            f"{summary['configs_evaluated']} plans enumerated, {summary['configs_fit']} fit; "
            "grey: closed-form time of each fitting plan; red: plans no other plan beats in "
            "both time and memory; stars: the ranked plans as simulated (evaluated.csv)",
        )
    else:
        rep.note("no plan fits in memory")

    rep.heading("Iteration breakdown of the ranked plans")
    labels = [_label(r) for r in records]
    keys = [k for k in (breakdowns[0] if breakdowns else {}) if any(b.get(k) for b in breakdowns)]
    fig, ax = new_figure(9, 0.9 + 0.38 * len(labels))
    hbar_stack(ax, labels, {k: [b.get(k, 0.0) for b in breakdowns] for k in keys})
    ax.set_xlabel("seconds per iteration")
    ax.legend(fontsize=7, ncols=min(len(keys), 5), loc="upper center",
              bbox_to_anchor=(0.5, -0.9 / (0.9 + 0.38 * len(labels))), frameon=False)  # fmt: skip
    rep.figure(fig, "Where each ranked plan's iteration goes (simulated)")
    return csvs, rep.html()
