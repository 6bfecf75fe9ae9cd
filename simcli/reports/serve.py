"""Report bundles of ``simcli serve`` and ``simcli serve plan`` (``--output DIR``).

``serve``: ``requests.csv`` (streamed while simulating, as the single-file ``--output
x.csv`` always was), ``summary.csv``, ``timeline.csv``, ``replicas.csv``, ``qps_sweep.csv``
(when the sweep ran), ``config.json`` and ``report.html`` with latency CDFs,
throughput/latency against the arrival rate and a timeline of every replica.

``serve plan``: ``plans.csv`` (every deployment the search looked at), ``deployments.csv``
(the ranked ones, as ``--output x.csv`` writes them), ``config.json`` and ``report.html``
with the ranking and a cost-vs-latency Pareto chart.

This module only formats results; the commands run the simulations. Latency CDFs come from
the simulator's bounded log histograms (0.5% relative error), never from per-request
arrays, so a report of 10^8 requests costs the memory of one of 10^3.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from simcli.reports.charts import PALETTE, new_figure, pareto_line
from simcli.reports.page import Report
from simcli.scenario.sparsity_options import SPARSITY_SCHEMA
from simcli.serving.plan_inputs import SLO

# --------------------------------------------------------------------------- CSV schemas

REQUESTS_SCHEMA = {
    "request_id": "request number, in arrival order (trace row, from 0)",
    "replica": "replica that served it (disaggregated: the prefill replica)",
    "arrival_s": "arrival time, simulated seconds from the start",
    "prompt_tokens": "prompt length, tokens",
    "output_tokens": "output length, tokens (multi-branch: the branch that completed it)",
    "ttft_s": "time to first token, seconds",
    "tpot_s": "time per output token after the first, seconds (empty for 1 output token)",
    "e2e_s": "arrival to last token, seconds",
    "preemptions": "times the request was preempted",
}

_Q = {"mean": "mean", "p50": "median", "p90": "90th percentile", "p99": "99th percentile",
      "max": "maximum"}  # fmt: skip
_LAT = {
    "ttft_s": "time to first token, seconds",
    "tpot_s": "time per output token after the first, per request, seconds",
    "tbt_s": "time between consecutive tokens, per token, seconds",
    "e2e_s": "end-to-end latency, seconds",
}

SUMMARY_SCHEMA: dict[str, str] = {
    "model": "model id",
    "gpu": "GPU id",
    "tp": "tensor-parallel GPUs per replica",
    "pp": "pipeline stages per replica",
    "engine": "engine profile (docs/engines.md)",
    "engine_version_family": "the engine versions the profile describes",
    "attn_backend_prefill": "op backend pricing prefill attention (the engine's on the GPU)",
    "attn_backend_decode": "op backend pricing decode attention (the engine's on the GPU)",
    "weight_dtype": "weight precision: bf16 | fp16 | fp8 (W8A8) | int8 | int4 (weight-only) | "
    "mxfp4 (MoE experts only)",
    "kv_cache_dtype": "KV-cache element type as stored (bf16 | fp16 | fp8)",
    **SPARSITY_SCHEMA,
    "replicas": "replicas (disaggregated: prefill + decode)",
    "scheduler": "replica scheduler (vllm | orca | sarathi)",
    "router": "request router",
    "arrivals": "'qps X' (synthetic arrivals) or 'trace' (replayed)",
    "images_per_request": "images each request carries (a vision-language model; 0: text)",
    "image_size": "pixels of each image, WIDTHxHEIGHT (empty without images)",
    "image_tokens_per_request": "prompt tokens the images add to every request",
    "prefill_tp": "disaggregated: tensor-parallel GPUs per prefill replica",
    "decode_tp": "disaggregated: tensor-parallel GPUs per decode replica",
    "draft_model": "speculative decoding: draft model id",
    "spec_hierarchy": "speculative decoding: tiny model drafting for the draft",
    "weight_gib_per_gpu": "model weights on the fullest GPU of a (decode) replica, as stored "
    "(quantised layers with their scales, sparse layers in their compressed format), GiB",
    "op_model_provenance": "how the op models were obtained: calibrated, transferred or "
    "datasheet",
    "op_model_expected_error_pct": "expected op-time error of those models (held-out MAPE, or "
    "the documented figure for transferred and datasheet models), percent",
    "serving_provenance": "how this engine's answers were checked against published results "
    "of the real engine (benchmarks/validate_serving.py): validated, partly-validated, "
    "validated-other-engines or unvalidated",
    **{
        f"serving_expected_error_pct_{c}": f"expected error of the {w} against the real engine "
        "(MAPE on the published set, near-saturation rows apart), percent"
        for c, w in (("ttft", "TTFT"), ("tpot_itl", "TPOT/ITL"), ("e2e", "end-to-end latency"),
                     ("throughput", "throughput"))
    },
    "prefill_op_model_provenance": "disaggregated: the prefill pool's op models (its own GPU "
    "type with --prefill-gpu)",
    "prefill_op_model_expected_error_pct": "disaggregated: expected op-time error of the "
    "prefill pool's op models, percent",
    "requests_completed": "requests simulated to completion",
    "requests_rejected_too_long": "requests refused, not simulated: prompt longer than "
    "max_model_len (vLLM rejects them)",
    "requests_output_capped": "requests whose output (or a branch's) was cut so prompt + "
    "output fits max_model_len",
    "duration_s": "first arrival to last completion, simulated seconds",
    **{
        f"{m}_{q}": f"{desc} ({_Q[q]})"
        for m, desc in _LAT.items()
        for q in ("mean", "p50", "p90", "p99", "max")
    },
    "throughput_tokens_per_s": "output tokens per second over duration_s",
    "total_tokens_per_s": "prompt + output tokens per second",
    "throughput_requests_per_s": "completed requests per second",
    "goodput_requests_per_s": "requests meeting the TTFT and TPOT SLOs per second",
    "slo_attainment": "fraction of requests meeting the SLOs (1 without SLOs)",
    "prompt_tokens": "prompt tokens of all requests",
    "output_tokens": "output tokens of all requests (all branches)",
    "preempted_requests": "requests preempted at least once",
    "iterations": "engine iterations (forward passes) over all replicas",
    "mean_decode_batch": "decoding sequences per iteration, mean",
    "kv_util_mean": "fraction of KV blocks in use, time-weighted mean over engines",
    "kv_util_max": "fraction of KV blocks in use, maximum",
    "kv_capacity_tokens_per_replica": "KV cache tokens per (decode) replica",
    "kv_layout": "--attn-pattern, a model's own local layers or a hybrid's mixers only: what "
    "a sequence's KV keeps and frees (a hybrid's constant state included)",
    "kv_tokens_per_seq_cap": "--attn-pattern only: most KV tokens a sequence holds per "
    "sliding-window layer (window + sinks, block-rounded, one straddled block); empty: no cap",
    "kv_bytes_per_token_factor": "--attn-pattern only: KV bytes per cached token over dense "
    "(NSA's compressed keys: 1 + 1/stride on the NSA layers)",
    "kv_seqs_at_max_len": "with a KV layout only: sequences of max_model_len tokens one "
    "replica's KV holds (a hybrid's state included)",
    "kv_seqs_at_max_len_dense": "with a KV layout only: the same with dense KV (no state)",
    "kv_capacity_gain": "--attn-pattern only: max_model_len sequences that fit, pattern over "
    "dense (> 1: a window frees blocks; < 1: NSA's compressed cache)",
    "max_model_len": "longest prompt + output served, tokens (--max-model-len; default the "
    "model's max_position_embeddings)",
    "preemptions": "preemptions over all engines",
    "prefix_cache_hits": "prompts that reused cached prefix blocks",
    "prefix_cache_hit_tokens": "prompt tokens served from the prefix cache",
    "gpus": "GPUs of the deployment",
    "gpu_hours": "GPUs x duration_s / 3600",
    "cost_usd": "gpu_hours x price_per_gpu_hour, US$",
    "cost_usd_per_million_output_tokens": "US$ per million output tokens",
    "energy_kwh": "energy from the cost model's power model, kWh (empty without one)",
    "energy_j_per_output_token": "energy per output token, joules",
    "disaggregated": "prefill and decode on separate pools",
    "prefill_replicas": "disaggregated: prefill replicas",
    "decode_replicas": "disaggregated: decode replicas",
    "kv_transfer": "disaggregated: KV link (inter | intra)",
    "kv_capacity_tokens_prefill_replica": "disaggregated: KV cache tokens per prefill replica",
    "kv_transfers": "disaggregated: KV transfers",
    "kv_transfer_s_mean": "disaggregated: KV transfer time, mean, seconds",
    "kv_transfer_s_max": "disaggregated: KV transfer time, max, seconds",
    "kv_transfer_exposed_s_mean": "disaggregated: transfer time not hidden by the prefill, s",
    "kv_transfer_wait_s_mean": "disaggregated: wait for decode room or the link, mean, s",
    "kv_handoff_s_p50": "disaggregated: prefill end to KV on the decode side, median, s",
    "kv_handoff_s_p99": "disaggregated: prefill end to KV on the decode side, p99, s",
    "kv_transfer_bytes": "disaggregated: KV bytes moved",
    **{
        f"{pool}_{k}": f"disaggregated: the {pool} pool's {what}"
        for pool in ("prefill", "decode")
        for k, what in (
            ("gpu", "GPU id (--prefill-gpu / --decode-gpu, default --gpu)"),
            ("gpus", "GPUs"),
            ("price_per_gpu_hour", "US$ per GPU-hour"),
            ("gpu_hours", "GPU-hours over the run"),
            ("cost_usd", "cost, US$"),
            ("energy_kwh", "energy (its iterations and idle GPUs by its GPU's power model), kWh"),
        )
    },
    "spec_k": "speculative decoding: draft tokens per step",
    "spec_drafts": "speculative decoding: draft sequences verified together",
    "spec_expected_accepted": "speculative decoding: expected accepted tokens per step",
    "spec_steps": "speculative decoding: sequence-steps verified",
    "spec_accepted_tokens_per_step": "speculative decoding: accepted drafts per step, mean",
    "spec_tokens_per_step": "speculative decoding: tokens emitted per step, mean",
    "spectr_acceptance": "SpecTr (--spec-drafts N > 1): draft selection priced, kseq "
    "(k-sequential selection, two-class token model) | independent-bound (1 - (1 - a)^N)",
    "spec_acceptance_single": "speculative decoding: single-draft acceptance a = 1 - TV(p, q) "
    "per position, mean",
    "spec_acceptance_per_position": "speculative decoding: acceptance used per draft position "
    "(with SpecTr's N drafts), comma-separated",
    "triforce_kv_budget": "TriForce: retrieval KV cache of the target-as-draft, tokens",
    "triforce_tiny_acceptance": "TriForce: acceptance of the tiny model's drafts by the "
    "retrieval draft",
    "triforce_acceptance": "TriForce: acceptance of the retrieval draft's tokens by the "
    "target, mean per position",
    "triforce_retrieval_cache_gib_per_gpu": "TriForce: retrieval caches of all --max-batch-size "
    "seats, GiB per GPU (reserved before the paged KV cache)",
    "triforce_tiny_cache_gib_per_gpu": "TriForce: StreamingLLM caches of the tiny model, all "
    "seats, GiB per GPU",
    "branches": "sampled branches per request (N)",
    "branches_stop": "finished branches completing a request (M)",
    "prune": "branch pruning (none | sart)",
    "branches_finished": "multi-branch: branches finished",
    "branches_pruned": "multi-branch: branches pruned",
    "branches_cancelled": "multi-branch: branches cancelled when their request completed",
    "branch_tokens_cancelled": "multi-branch: tokens of cancelled branches",
    "answer_selection": "multi-branch: answer chosen from the finished branches, majority | "
    "prm-best",
    "answer_accuracy": "multi-branch: fraction of completed requests whose selected answer is "
    "right (branch quality model: --branch-accuracy, --branch-length-correlation, --prm-noise)",
    "finished_branch_accuracy": "multi-branch: fraction of finished branches that are right",
    "price_per_gpu_hour": "US$ per GPU-hour used for cost (pools of two GPU types: their "
    "GPU-weighted mean)",
    "simulation_wall_s": "wall-clock seconds the simulation took",
    "simulated_requests_per_wall_s": "requests simulated per wall-clock second",
}

TIMELINE_SCHEMA = {
    "time_s": "iteration start, simulated seconds",
    "replica": "replica index",
    "role": "mixed | prefill | decode",
    "engine": "engine (pipeline virtual engine) of the replica",
    "step_s": "iteration duration, seconds",
    "batch_seqs": "sequences in the iteration (prefilling + decoding)",
    "prefill_tokens": "prompt tokens computed in the iteration",
    "decode_tokens": "decode tokens (one per decoding sequence) in the iteration",
    "kv_blocks_used": "KV blocks in use on the engine (cached evictable prefixes excluded)",
    "kv_blocks_total": "KV blocks of the engine",
    "queue_seqs": "sequences waiting on the engine (waiting, swapped out, KV arrived)",
}

REPLICAS_SCHEMA = {
    "replica": "replica index",
    "role": "mixed | prefill | decode",
    "preemptions": "preemptions on the replica",
    "peak_kv_blocks": "most KV blocks in use at once on one engine",
    "kv_blocks": "KV blocks of the replica (all engines)",
}

SWEEP_METRICS = (
    "requests_completed",
    "duration_s",
    "throughput_tokens_per_s",
    "throughput_requests_per_s",
    "goodput_requests_per_s",
    "slo_attainment",
    "ttft_s_p50",
    "ttft_s_p99",
    "tpot_s_p50",
    "tpot_s_p99",
    "e2e_s_p50",
    "e2e_s_p99",
    "kv_util_mean",
    "preemptions",
)

SWEEP_SCHEMA = {
    "qps_multiplier": "arrival rate of the point / the run's (--qps, or the trace's mean)",
    "offered_qps": "arrival rate of the point, requests per second",
    **{k: SUMMARY_SCHEMA[k] for k in SWEEP_METRICS},
}

# What serve plan judges the SLOs on (its candidates CSV and the deployments CSV).
SLO_PERCENTILE_COLUMNS = {
    "slo_percentile": "the percentile the SLO limits are targets of: p90 for --attainment 0.9",
    "ttft_s_at_slo_percentile": "TTFT at slo_percentile over all requests (the ceil(attainment"
    " x N)-th smallest), seconds: what --slo-ttft-s is judged on",
    "tpot_s_at_slo_percentile": "TPOT at slo_percentile over all requests (one-token outputs "
    "count as 0), seconds: what --slo-tpot-s is judged on",
    "e2e_s_at_slo_percentile": "end-to-end latency at slo_percentile over all requests, "
    "seconds: what --slo-e2e-s is judged on",
    "slo_margin": "smallest headroom 1 - value / limit over the given limits, values at "
    "slo_percentile (0: on a limit)",
}

EVALUATED_SCHEMA = {
    "rank": "rank among the returned deployments (empty: not returned)",
    "config": "config label: gpu, tp, scheduler, chunk, P:D ratio",
    "gpu": "GPU id",
    "tp": "tensor-parallel GPUs per replica",
    "scheduler": "replica scheduler",
    "chunk_size": "Sarathi token budget per iteration (empty for others)",
    "pd_ratio": "prefill:decode pool ratio (empty: colocated)",
    "engine": SUMMARY_SCHEMA["engine"],
    "weight_dtype": SUMMARY_SCHEMA["weight_dtype"],
    "kv_cache_dtype": "KV-cache dtype as given (auto: the activation dtype)",
    "usd_per_gpu_hour": "US$ per GPU-hour",
    "replicas": "replicas simulated (empty: config not simulated, see status)",
    "prefill_replicas": SUMMARY_SCHEMA["prefill_replicas"],
    "decode_replicas": SUMMARY_SCHEMA["decode_replicas"],
    "gpus": SUMMARY_SCHEMA["gpus"],
    "usd_per_hour": "US$ per hour of the deployment",
    "usd_per_million_output_tokens": "US$ per million output tokens over the simulated run",
    "meets_slo": "at least --attainment of the requests met every SLO",
    "slo_attainment": "fraction of requests meeting the SLOs (upper bound if stopped early)",
    **SLO_PERCENTILE_COLUMNS,
    "stopped_early": "the run stopped once too many requests had missed",
    "status": "ranked | meets_slo | misses_slo | stopped_early | skipped | infeasible | pruned",
    "ttft_s_p50": SUMMARY_SCHEMA["ttft_s_p50"],
    "ttft_s_p99": SUMMARY_SCHEMA["ttft_s_p99"],
    "tpot_s_p50": SUMMARY_SCHEMA["tpot_s_p50"],
    "tpot_s_p99": SUMMARY_SCHEMA["tpot_s_p99"],
    "e2e_s_p50": SUMMARY_SCHEMA["e2e_s_p50"],
    "e2e_s_p99": SUMMARY_SCHEMA["e2e_s_p99"],
    "throughput_tokens_per_s": SUMMARY_SCHEMA["throughput_tokens_per_s"],
    "goodput_requests_per_s": SUMMARY_SCHEMA["goodput_requests_per_s"],
    "preemptions": SUMMARY_SCHEMA["preemptions"],
    "kv_capacity_tokens_per_replica": SUMMARY_SCHEMA["kv_capacity_tokens_per_replica"],
    "note": "why a config was not simulated",
    **{
        f"{pool}_{k}": f"disaggregated: the {pool} pool's {what}"
        for pool in ("prefill", "decode")
        for k, what in (
            ("gpu", "GPU id"),
            ("tp", "tensor-parallel GPUs per replica"),
            ("gpus", "GPUs"),
            ("usd_per_gpu_hour", "US$ per GPU-hour"),
        )
    },
}

DEPLOYMENTS_SCHEMA = {
    "rank": "1 = cheapest ($/hour, then the larger slo_margin, then $/M tokens, then p99 E2E)",
    "gpu": "GPU id",
    "tp": "tensor-parallel GPUs per replica",
    "replicas": "fewest replicas meeting the SLOs",
    "scheduler": "replica scheduler",
    "chunk_size": "Sarathi token budget per iteration (empty for others)",
    "pd_ratio": "prefill:decode pool ratio (empty: colocated)",
    "prefill_replicas": SUMMARY_SCHEMA["prefill_replicas"],
    "decode_replicas": SUMMARY_SCHEMA["decode_replicas"],
    "gpus": SUMMARY_SCHEMA["gpus"],
    "usd_per_gpu_hour": "US$ per GPU-hour",
    "usd_per_hour": "US$ per hour of the deployment",
    "usd_per_million_output_tokens": "US$ per million output tokens over the simulated run",
    "slo_attainment": "fraction of requests meeting the SLOs",
    **SLO_PERCENTILE_COLUMNS,
    "engine": SUMMARY_SCHEMA["engine"],
    "weight_dtype": SUMMARY_SCHEMA["weight_dtype"],
    "kv_cache_dtype": "KV-cache dtype as given (auto: the activation dtype)",
    "ttft_s_p50": SUMMARY_SCHEMA["ttft_s_p50"],
    "ttft_s_p99": SUMMARY_SCHEMA["ttft_s_p99"],
    "tpot_s_p50": SUMMARY_SCHEMA["tpot_s_p50"],
    "tpot_s_p99": SUMMARY_SCHEMA["tpot_s_p99"],
    "e2e_s_p50": SUMMARY_SCHEMA["e2e_s_p50"],
    "e2e_s_p99": SUMMARY_SCHEMA["e2e_s_p99"],
    "throughput_tokens_per_s": SUMMARY_SCHEMA["throughput_tokens_per_s"],
    "preemptions": SUMMARY_SCHEMA["preemptions"],
    "kv_capacity_tokens_per_replica": SUMMARY_SCHEMA["kv_capacity_tokens_per_replica"],
    "attainment_one_fewer": "attainment with one replica fewer (upper bound if stopped early; "
    "per-pool search: the better of one prefill or one decode replica fewer)",
    **{
        f"{pool}_{k}": f"disaggregated: the {pool} pool's {what}"
        for pool in ("prefill", "decode")
        for k, what in (
            ("gpu", "GPU id"),
            ("tp", "tensor-parallel GPUs per replica"),
            ("gpus", "GPUs"),
            ("usd_per_gpu_hour", "US$ per GPU-hour"),
        )
    },
    "attainment_one_fewer_prefill": "per-pool search: attainment with one prefill replica "
    "fewer (empty: the pool has one)",
    "attainment_one_fewer_decode": "per-pool search: attainment with one decode replica fewer",
    "op_model_provenance": SUMMARY_SCHEMA["op_model_provenance"],
    "op_model_expected_error_pct": SUMMARY_SCHEMA["op_model_expected_error_pct"]
    + " (per-pool rows: the pool with the larger error)",
    **{k: SUMMARY_SCHEMA[k] for k in SUMMARY_SCHEMA if k.startswith("serving_")},
}

CSV_SCHEMAS: dict[str, dict[str, str]] = {
    "requests.csv": REQUESTS_SCHEMA,
    "summary.csv": SUMMARY_SCHEMA,
    "timeline.csv": TIMELINE_SCHEMA,
    "replicas.csv": REPLICAS_SCHEMA,
    "qps_sweep.csv": SWEEP_SCHEMA,
    "plans.csv": EVALUATED_SCHEMA,
    "deployments.csv": DEPLOYMENTS_SCHEMA,
}


def frame(rows: Sequence[dict[str, Any]], schema: dict[str, str]) -> pd.DataFrame:
    """Rows as a frame with the schema's columns, in its order; keys the schema does not
    know are appended after them (a test keeps the schema complete)."""
    df = pd.DataFrame(list(rows))
    extra = [c for c in df.columns if c not in schema]
    return df.reindex(columns=[*schema, *extra])


# --------------------------------------------------------------------------- paths


# --------------------------------------------------------------------------- serve


def qps_multipliers(points: int) -> list[float]:
    """``points`` arrival-rate multipliers spaced evenly in log from 0.25x to 2x."""
    if points <= 0:
        return []
    if points == 1:
        return [1.0]
    return [float(x) for x in np.geomspace(0.25, 2.0, points)]


def histogram_cdf(hist: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values, fraction <= value) at the upper edges of a ``LogHistogram``'s filled
    buckets (clamped to its exact min and max), starting at (min, 0)."""
    counts = np.asarray(hist.counts, dtype=np.int64)
    if not hist.n:
        return np.zeros(0), np.zeros(0)
    idx = np.nonzero(counts)[0]
    edges = hist.LO * np.power(hist.GAMMA, idx + 1.0)
    edges = np.clip(edges, hist.min, hist.max)
    frac = np.cumsum(counts[idx]) / hist.n
    return np.concatenate([[hist.min], edges]), np.concatenate([[0.0], frac])


def _cdf_figure(hists: dict[str, Any], slos: dict[str, float | None]):
    titles = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "end-to-end latency"}
    fig, axes = new_figure(10.0, 3.2, ncols=3)
    for ax, (key, color) in zip(axes, zip(titles, PALETTE, strict=False), strict=True):
        x, y = histogram_cdf(hists[key])
        ax.set_title(titles[key])
        ax.set_xlabel("seconds")
        if len(x) == 0:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
            continue
        ax.step(x, y, where="post", color=color, lw=1.5, label=f"n={hists[key].n}")
        if x[0] > 0 and x[-1] / x[0] > 20:
            ax.set_xscale("log")
        else:
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("fraction of requests")
        slo = slos.get(key)
        if slo is not None:
            ax.axvline(slo, color="#d1495b", ls="--", lw=1.0, label=f"SLO {slo:g} s")
        for q in (0.5, 0.99):
            ax.axhline(q, color="#9aa3ad", lw=0.5, ls=":")
        ax.legend(fontsize=7, loc="lower right", frameon=False)
    return fig


def _sweep_figures(sweep: pd.DataFrame, run: dict[str, Any], has_slo: bool):
    x = sweep["offered_qps"].to_numpy(float)
    here = run.get("offered_qps")
    fig1, ax = new_figure(8.0, 3.2)
    ax.plot(x, sweep["throughput_tokens_per_s"], "o-", color=PALETTE[0], label="output tokens/s")
    if here is not None:
        ax.plot([here], [run["throughput_tokens_per_s"]], "*", ms=12, color=PALETTE[2],
                label="this run")  # fmt: skip
    ax.set_xlabel("offered load, requests/s")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(x, sweep["throughput_requests_per_s"], "s--", color=PALETTE[3], ms=4,
             label="completed requests/s")  # fmt: skip
    if has_slo:
        ax2.plot(x, sweep["goodput_requests_per_s"], "^--", color=PALETTE[1], ms=4,
                 label="goodput requests/s")  # fmt: skip
    ax2.set_ylabel("requests/s")
    ax2.spines["top"].set_visible(False)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=7, loc="upper left", frameon=False)

    fig2, axes = new_figure(10.0, 3.2, ncols=3)
    for ax, key, title in zip(
        axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "end-to-end"), strict=True
    ):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            y = sweep[f"{key}_{q}"].to_numpy(float)
            ax.plot(x, y, style, ms=4, label=q, color=PALETTE[0] if q == "p50" else PALETTE[1])
        if here is not None and run.get(f"{key}_p99") is not None:
            ax.plot([here], [run[f"{key}_p99"]], "*", ms=10, color=PALETTE[2], label="this run p99")
        vals = sweep[[f"{key}_p50", f"{key}_p99"]].to_numpy(float)
        vals = vals[np.isfinite(vals) & (vals > 0)]
        if len(vals) and vals.max() / vals.min() > 20:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("offered load, requests/s")
        ax.set_ylabel("seconds")
        ax.legend(fontsize=7, frameon=False)
    return fig1, fig2


def _timeline_figures(timeline: pd.DataFrame, max_lines: int = 8):
    """Batch size, KV use and queue over time, one line per replica (engines summed)."""
    figs = []
    if timeline.empty:
        return figs, 0
    reps = sorted(timeline["replica"].unique())
    shown = reps[:max_lines]
    panels = (
        ("batch_seqs", "sequences in the batch"),
        ("kv_used_pct", "KV blocks in use, %"),
        ("queue_seqs", "queued sequences"),
    )
    tl = timeline.assign(
        kv_used_pct=100.0 * timeline["kv_blocks_used"] / timeline["kv_blocks_total"]
    )
    for col, label in panels:
        fig, ax = new_figure(10.0, 2.4)
        for i, r in enumerate(shown):
            part = tl[tl["replica"] == r].sort_values("time_s")
            role = part["role"].iloc[0]
            ax.step(part["time_s"], part[col], where="post", lw=1.0,
                    color=PALETTE[i % len(PALETTE)], label=f"replica {r} ({role})")  # fmt: skip
        ax.set_xlabel("simulated time, s")
        ax.set_ylabel(label)
        if col == "kv_used_pct":
            ax.set_ylim(0, 102)
        else:
            ax.set_ylim(0, max(1.0, float(tl[col].max())) * 1.05)
        ax.legend(fontsize=7, ncols=min(len(shown), 4), loc="upper left", frameon=False)
        figs.append((fig, label))
    return figs, len(reps) - len(shown)


# the report's decoding section: speculative acceptance, branch answers, and the latency
# they trade against
DECODING_METRICS = (
    "e2e_s_p50",
    "spec_k",
    "spec_drafts",
    "spectr_acceptance",
    "spec_acceptance_single",
    "spec_acceptance_per_position",
    "spec_tokens_per_step",
    "triforce_kv_budget",
    "triforce_tiny_acceptance",
    "triforce_acceptance",
    "triforce_retrieval_cache_gib_per_gpu",
    "triforce_tiny_cache_gib_per_gpu",
    "branches_stop",
    "prune",
    "branches_pruned",
    "answer_selection",
    "answer_accuracy",
    "finished_branch_accuracy",
)

KEY_METRICS = (
    "requests_completed",
    "requests_rejected_too_long",
    "requests_output_capped",
    "duration_s",
    "ttft_s_p50",
    "ttft_s_p99",
    "tpot_s_p50",
    "tpot_s_p99",
    "e2e_s_p50",
    "e2e_s_p99",
    "throughput_tokens_per_s",
    "throughput_requests_per_s",
    "goodput_requests_per_s",
    "slo_attainment",
    "kv_util_mean",
    "kv_util_max",
    "preemptions",
    "gpus",
    "gpu_hours",
    "cost_usd",
    "cost_usd_per_million_output_tokens",
    "energy_kwh",
)


def serve_report(
    out: dict[str, Any],
    *,
    title: str,
    hists: dict[str, Any],
    slos: dict[str, float | None],
    timeline: pd.DataFrame,
    replicas: pd.DataFrame,
    sweep: pd.DataFrame | None,
    sweep_note: str,
    cost_model: str,
) -> str:
    """``report.html`` of one ``simcli serve`` run."""
    rep = Report(title, command="serve", subtitle=f"arrivals: {out.get('arrivals')}")
    setup = {
        k: out.get(k)
        for k in ("model", "gpu", "tp", "pp", "engine", "weight_dtype", "kv_cache_dtype",
                  "weight_gib_per_gpu", "max_model_len", "replicas", "scheduler", "router",
                  "arrivals", "price_per_gpu_hour")
    }  # fmt: skip
    if out.get("disaggregated"):
        setup |= {k: out.get(k) for k in ("prefill_replicas", "decode_replicas", "prefill_tp",
                                          "decode_tp", "prefill_gpu", "decode_gpu",
                                          "kv_transfer")}  # fmt: skip
    setup["cost model"] = cost_model
    slo_text = ", ".join(f"{k} <= {v:g} s" for k, v in slos.items() if v is not None)
    setup["SLOs"] = slo_text or "none given"
    rep.summary({k: out.get(k) for k in KEY_METRICS}, title="Summary")
    rep.summary(setup, title="Deployment")
    quality = {k: out.get(k) for k in DECODING_METRICS if out.get(k) is not None}
    if len(quality) > 1:  # speculative decoding or branches: what they cost and deliver
        rep.summary(quality, title="Decoding: acceptance, answer accuracy and latency")
    rep.heading("Latency distributions")
    rep.figure(
        _cdf_figure(hists, slos),
        "Empirical CDFs over all completed requests (from the simulator's log histograms: "
        "values within 0.5%). Dotted lines: median and p99.",
    )
    rep.heading("Load: throughput and latency against the arrival rate")
    if sweep is not None and not sweep.empty:
        f1, f2 = _sweep_figures(sweep, out, any(v is not None for v in slos.values()))
        rep.note(sweep_note)
        rep.figure(f1, "Throughput against offered load (star: this run).")
        rep.figure(f2, "Latency percentiles against offered load (star: this run's p99).")
        rep.table("QPS sweep", sweep)
    else:
        rep.note(sweep_note)
    rep.heading("Timeline")
    figs, hidden = _timeline_figures(timeline)
    if figs:
        rep.note(
            f"Sampled iterations ({len(timeline)} rows of timeline.csv, evenly spread over "
            "each replica's iterations); pipeline engines of a replica share its line."
            + (f" {hidden} more replicas are in timeline.csv." if hidden else "")
        )
        for fig, label in figs:
            rep.figure(fig, f"{label} over time, per replica")
    else:
        rep.note("no iterations were recorded")
    rep.table("Replicas", replicas)
    rep.summary({k: v for k, v in out.items() if not isinstance(v, list | dict)},
                title="All metrics")  # fmt: skip
    return rep.html()


def serve_csvs(
    out: dict[str, Any],
    *,
    timeline: pd.DataFrame,
    replicas: pd.DataFrame,
    sweep: pd.DataFrame | None,
) -> dict[str, pd.DataFrame]:
    """The bundle's CSVs other than requests.csv (which is streamed)."""
    flat = {k: v for k, v in out.items() if not isinstance(v, list | dict)}
    csvs = {
        "summary.csv": frame([flat], SUMMARY_SCHEMA),
        "timeline.csv": timeline,
        "replicas.csv": replicas,
    }
    if sweep is not None:
        csvs["qps_sweep.csv"] = sweep
    return csvs


# --------------------------------------------------------------------------- serve plan


def _latency_key(slo: dict[str, Any], percentile: str) -> tuple[str, str, str]:
    """(column, axis label, SLO key) of the latency the cost chart plots: the first given
    limit among E2E, TTFT, TPOT, at the SLO's percentile, the statistic it is judged on."""
    for key, label in (("e2e_s", "end-to-end"), ("ttft_s", "TTFT"), ("tpot_s", "TPOT")):
        if slo.get(key) is not None:
            column = f"{key}_at_slo_percentile"
            return column, f"{percentile} {label}, s (the SLO's percentile)", key
    return "e2e_s_at_slo_percentile", f"{percentile} end-to-end, s", "e2e_s"


def _pareto_figure(evaluated: pd.DataFrame, slo: dict[str, Any], percentile: str):
    key, label, slo_key = _latency_key(slo, percentile)
    fig, ax = new_figure(8.0, 4.0)
    done = evaluated[evaluated[key].notna() & evaluated["usd_per_hour"].notna()]
    meets = done[done["meets_slo"] == True]  # noqa: E712 (object column with NaN)
    misses = done[done["meets_slo"] != True]  # noqa: E712
    if len(misses):
        ax.scatter(misses["usd_per_hour"], misses[key], s=18, marker="x", color="#9aa3ad",
                   label="misses the SLO")  # fmt: skip
    if len(meets):
        ax.scatter(meets["usd_per_hour"], meets[key], s=22, color=PALETTE[0],
                   label="meets the SLO")  # fmt: skip
        pareto_line(ax, meets["usd_per_hour"], meets[key], label="Pareto front (meets the SLO)",
                    marker="o", color=PALETTE[1], ms=7, mfc="none", lw=1.2)  # fmt: skip
        ranked = meets[meets["rank"].notna()]
        spots: dict[tuple[float, float], list[str]] = {}
        for r, xv, yv in zip(ranked["rank"], ranked["usd_per_hour"], ranked[key], strict=True):
            spots.setdefault((round(xv, 6), round(yv, 4)), []).append(f"#{int(r)}")
        for (xv, yv), labels in spots.items():  # one label per point: ranks that coincide
            ax.annotate(",".join(labels), (xv, yv), textcoords="offset points", xytext=(5, 4),
                        fontsize=8)  # fmt: skip
    limit = slo.get(slo_key)
    if limit is not None:
        ax.axhline(limit, color="#d1495b", ls="--", lw=0.8, label=f"SLO {limit:g} s ({percentile})")
    ax.set_xlabel("US$ per hour")
    ax.set_ylabel(label)
    vals = done[key].to_numpy(float)
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if len(vals) and vals.max() / vals.min() > 20:
        ax.set_yscale("log")
    ax.legend(fontsize=7, frameon=False)
    return fig


def _attainment_figure(evaluated: pd.DataFrame, target: float):
    fig, ax = new_figure(8.0, 3.2)
    sim = evaluated[evaluated["slo_attainment"].notna()]
    for i, (gpu, part) in enumerate(sim.groupby("gpu", sort=True)):
        early = part["stopped_early"] == True  # noqa: E712
        color = PALETTE[i % len(PALETTE)]
        ax.scatter(part.loc[~early, "usd_per_hour"], part.loc[~early, "slo_attainment"],
                   s=18, color=color, label=f"{gpu}")  # fmt: skip
        if early.any():
            ax.scatter(part.loc[early, "usd_per_hour"], part.loc[early, "slo_attainment"],
                       s=18, color=color, marker="v", alpha=0.6,
                       label=f"{gpu} (stopped early: upper bound)")  # fmt: skip
    ax.axhline(target, color="#d1495b", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xlabel("US$ per hour")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, frameon=False, loc="lower right")
    return fig


def plan_report(summary: dict[str, Any], deployments: pd.DataFrame, evaluated: pd.DataFrame,
                *, title: str) -> str:  # fmt: skip
    """``report.html`` of one ``simcli serve plan`` search."""
    slo = summary.get("slo") or {}
    rep = Report(title, command="serve plan", subtitle="cheapest deployments meeting the SLOs")
    best = deployments.iloc[0].to_dict() if len(deployments) else {}
    percentile = str(summary.get("slo_percentile") or "p90")
    head = {k: v for k, v in summary.items() if k not in ("notes", "slo")}
    head["slo"] = SLO(**slo).text() if slo else ""
    if best:
        head["cheapest"] = (
            f"{best['replicas']} x {best['tp']} {best['gpu']} ({best['scheduler']}) "
            f"${best['usd_per_hour']:.2f}/h"
        )
    rep.summary(head)
    rep.table("Ranking", deployments)
    rep.heading("Cost against latency")
    rep.figure(
        _pareto_figure(evaluated, slo, percentile),
        f"Every deployment simulated to the end (runs stopped early have no latency), its "
        f"latency at the SLO's percentile ({percentile}: the share of requests --attainment "
        "asks for), the statistic the SLO is judged on, so deployments meeting the SLO sit "
        "on or below the SLO line. The front: deployments meeting the SLO that no other "
        "meeting it beats on both cost and latency; #n: rank.",
    )
    rep.figure(
        _attainment_figure(evaluated, float(slo.get("attainment") or 0.0)),
        "SLO attainment of every simulated deployment against its cost.",
    )
    rep.table("Every deployment evaluated", evaluated, max_rows=300)
    notes = summary.get("notes") or []
    if notes:
        rep.heading("Notes")
        for n in notes:
            rep.note(n)
    return rep.html()


__all__ = [
    "CSV_SCHEMAS",
    "frame",
    "histogram_cdf",
    "plan_report",
    "qps_multipliers",
    "serve_csvs",
    "serve_report",
]
