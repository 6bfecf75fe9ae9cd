"""``simcli serve``: discrete-event simulation of an LLM serving deployment.

Replicas of ``tp x pp`` GPUs, a router, a replica scheduler (vLLM, Orca or Sarathi-Serve
style) over a paged KV cache, fed by Poisson/gamma arrivals or a replayed trace; reports
latency percentiles, throughput, goodput under SLOs, KV use, preemptions, GPU-hours and
cost. Iteration times come from ``costmodels.steps.serving.StepModel``.

Optional, each off by default: prefill/decode disaggregation (``--disaggregate``, see
:mod:`simcli.serving.disagg`), speculative decoding (``--draft-model``, see
:mod:`simcli.serving.spec`) and multi-branch reasoning (``--branches``, see
:mod:`simcli.serving.branches`).
"""

from __future__ import annotations

import csv
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO

import pandas as pd
import typer

from hardware_specs.prices import gpu_prices, host_copy_bytes_per_s
from hardware_specs.registry import load_catalog
from simcli.commands.serve_plan import serve_plan
from simcli.errors import fail, user_errors
from simcli.output import Format, emit_object
from simcli.progress import progress_bar, set_quiet
from simcli.reports import output_is_dir
from simcli.reports.bundle import (
    StagedBundle,
    check_output_path,
    cli_inputs,
    config_document,
)
from simcli.reports.serve import (
    REPLICAS_SCHEMA,
    REQUESTS_SCHEMA,
    SWEEP_METRICS,
    SWEEP_SCHEMA,
    TIMELINE_SCHEMA,
    frame,
    qps_multipliers,
    serve_csvs,
    serve_report,
)
from simcli.serving.branches import BranchConfig
from simcli.serving.disagg import DisaggConfig
from simcli.serving.metrics import EnergyMeter
from simcli.serving.requests import (
    Request,
    SyntheticSpec,
    synthetic_requests,
    trace_lengths,
    trace_requests,
)
from simcli.serving.router import ROUTERS
from simcli.serving.schedulers import PREEMPTION, SCHEDULERS, SchedulerConfig
from simcli.serving.simulator import ServeConfig, Simulator
from simcli.serving.spec import SpecConfig
from simcli.serving.timeline import StepRecorder
from workloads.lengths import parse_dist
from workloads.models import load_model

app = typer.Typer(help="Simulate serving a model: latency, throughput, goodput, cost.")

REQUEST_COLUMNS = tuple(REQUESTS_SCHEMA)

# --output DIR: at most this many rows of timeline.csv (iteration samples, all replicas)
TIMELINE_ROWS = 4000
# --trace-output: requests drawn as async spans (the first ones to complete)
TRACE_REQUESTS = 1000


def _check_choice(flag: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise fail(f"unknown {flag} {value!r}; allowed: {', '.join(allowed)}")
    return value


def _check_positive(flag: str, value: float | int | None, *, zero_ok: bool = False) -> None:
    if value is None:
        return
    ok = value >= 0 if zero_ok else value > 0
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        bound = ">= 0" if zero_ok else "> 0"
        raise fail(f"{flag} {value} is invalid; allowed: a number {bound}")


@contextmanager
def _request_writer(path: Path | None) -> Iterator[csv.Writer | None]:
    """Per-request rows streamed to a temp file beside ``path``, renamed on success: an
    interrupted or failed run leaves no partial file."""
    if path is None:
        yield None
        return
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OSError(f"output folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    fh: IO[str] = os.fdopen(fd, "w", newline="")
    try:
        writer = csv.writer(fh)
        writer.writerow(REQUEST_COLUMNS)
        yield writer
        fh.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        fh.close()
        Path(tmp).unlink(missing_ok=True)
        raise


def _row_sink(writer: csv.Writer):
    def sink(req: Request) -> None:
        # a multi-branch request: the branch that completed it
        out = req.output_tokens if req.branch is None else req.branch.last_len
        first = req.first_token_s
        fin = req.finish_s
        tpot = (fin - first) / (out - 1) if out > 1 else ""  # type: ignore[operator]
        writer.writerow(
            (
                req.id,
                req.replica,
                f"{req.arrival_s:.9g}",
                req.prompt_tokens,
                out,
                f"{first - req.arrival_s:.9g}",  # type: ignore[operator]
                tpot if tpot == "" else f"{tpot:.9g}",
                f"{fin - req.arrival_s:.9g}",  # type: ignore[operator]
                req.preemptions,
            )
        )

    return sink


def _floats(flag: str, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not (0.0 <= v <= 1.0) for v in values):
        raise fail(f"{flag} {text!r} is invalid; allowed: comma-separated numbers in [0, 1]")
    return values


def _pools(
    replicas: int, prefill: int | None, decode: int | None, ratio: str | None
) -> tuple[int, int]:
    """Pool sizes from --prefill-replicas/--decode-replicas or --pd-ratio P:D of --replicas."""
    if prefill is not None or decode is not None:
        if prefill is None or decode is None or ratio is not None:
            raise fail(
                "give both --prefill-replicas and --decode-replicas, or --pd-ratio P:D with "
                "--replicas (not both ways)"
            )
        if replicas not in (1, prefill + decode):
            raise fail(
                f"--replicas {replicas} != --prefill-replicas {prefill} + --decode-replicas "
                f"{decode}; allowed: leave --replicas out, or their sum"
            )
        return prefill, decode
    if ratio is None:
        raise fail("--disaggregate needs --prefill-replicas P --decode-replicas D, or --pd-ratio")
    try:
        p_w, d_w = (float(x) for x in ratio.split(":"))
    except ValueError:
        p_w = d_w = math.nan
    if not (p_w > 0 and d_w > 0 and math.isfinite(p_w + d_w)):
        raise fail(f"--pd-ratio {ratio!r} is invalid; allowed: P:D, two positive numbers")
    if replicas < 2:
        raise fail(f"--pd-ratio splits --replicas {replicas}; allowed: --replicas >= 2")
    p = min(max(round(replicas * p_w / (p_w + d_w)), 1), replicas - 1)
    return p, replicas - p


def _step_model(
    model_cfg, gpu: str, *, tp: int, pp: int, engine: str, attn_pattern: str | None = None, **kw
):
    from costmodels.steps.serving import StepModel

    if attn_pattern is not None:
        from simcli.sparsity.serving import PatternStepModel

        return PatternStepModel(
            model_cfg, gpu, tp=tp, pp=pp, engine=engine, pattern=attn_pattern, **kw
        )
    return StepModel(model_cfg, gpu, tp=tp, pp=pp, engine=engine, **kw)


@app.callback(invoke_without_command=True)
def serve(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", help="Built-in model id or config.json."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU id (see `simcli specs list`)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel GPUs per replica."),
    pp: int = typer.Option(
        1, "--pp", help="Pipeline stages per replica (pp batches in flight, KV split pp ways)."
    ),
    replicas: int = typer.Option(1, "--replicas", help="Model replicas behind the router."),
    scheduler: str = typer.Option("vllm", "--scheduler", help="vllm | orca | sarathi"),
    router: str = typer.Option(
        "least_outstanding", "--router", help="round_robin | least_outstanding | kv_aware"
    ),
    qps: float | None = typer.Option(
        None, "--qps", help="Mean arrival rate (requests/s); with --trace: resample its lengths."
    ),
    burstiness: float = typer.Option(
        1.0, "--burstiness", help="CV of inter-arrival gaps: 1 Poisson, >1 bursty (gamma)."
    ),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        help="CSV arrival_s,prompt_tokens,output_tokens[,prefix_id,prefix_tokens] to replay.",
    ),
    num_requests: int | None = typer.Option(
        None, "--num-requests", help="Requests to simulate (default 1000; a trace: all rows)."
    ),
    prompt_len: str = typer.Option(
        "lognormal:512:1:4096", "--prompt-len", help="Prompt length DIST (e.g. fixed:512)."
    ),
    output_len: str = typer.Option(
        "lognormal:128:1:2048", "--output-len", help="Output length DIST."
    ),
    shared_prefix_len: int = typer.Option(
        0, "--shared-prefix-len", help="Shared prefix tokens prepended to every prompt."
    ),
    prefix_groups: int = typer.Option(1, "--prefix-groups", help="Distinct shared prefixes."),
    prefix_caching: bool = typer.Option(
        True, "--prefix-caching/--no-prefix-caching", help="Reuse cached prefix KV blocks."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of arrivals and lengths."),
    preemption: str = typer.Option("recompute", "--preemption", help="recompute | swap"),
    chunk_size: int = typer.Option(512, "--chunk-size", help="Sarathi token budget/iteration."),
    max_batch_size: int = typer.Option(
        256, "--max-batch-size", help="Running sequences per replica (max_num_seqs)."
    ),
    max_tokens: int | None = typer.Option(
        None,
        "--max-tokens",
        help="Tokens per iteration, vllm/orca (default max(model context, 2048)).",
    ),
    block_size: int = typer.Option(16, "--block-size", help="Tokens per KV block."),
    gpu_memory_utilization: float = typer.Option(
        0.9, "--gpu-memory-utilization", help="Fraction of GPU memory for weights + KV."
    ),
    slo_ttft_s: float | None = typer.Option(None, "--slo-ttft-s", help="TTFT SLO (goodput)."),
    slo_tpot_s: float | None = typer.Option(None, "--slo-tpot-s", help="TPOT SLO (goodput)."),
    price_per_gpu_hour: float | None = typer.Option(
        None, "--price-per-gpu-hour", help="US$ per GPU-hour (default: the price table)."
    ),
    engine: str = typer.Option(
        "vllm", "--engine", help="Step-time engine: vllm (CUDA graphs) | pytorch-eager."
    ),
    attn_pattern: str | None = typer.Option(
        None,
        "--attn-pattern",
        help="Sparse attention pattern of the served model (e.g. window:4096, nsa; see "
        "`simcli sparsity compare`).",
    ),
    profile: Path | None = typer.Option(None, "--profile", help="Calibration profile."),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="A .csv/.json name: one CSV row per request. Any other name: a folder with "
        "requests.csv, summary.csv, timeline.csv, replicas.csv, qps_sweep.csv, config.json "
        "and report.html. Written atomically.",
    ),
    trace_output: Path | None = typer.Option(
        None,
        "--trace-output",
        help="Write a Chrome/Perfetto trace (JSON) of the simulated iterations here: one "
        "process per replica, counters of KV blocks and queued sequences, request spans.",
    ),
    trace_max_steps: int = typer.Option(
        100_000, "--trace-max-steps", help="Iterations drawn in --trace-output (the first N)."
    ),
    report_qps_points: int = typer.Option(
        6,
        "--report-qps-points",
        help="--output DIR: re-simulate at N arrival rates from 0.25x to 2x for the "
        "throughput/latency-vs-QPS charts (0: no sweep).",
    ),
    report_requests: int = typer.Option(
        500,
        "--report-requests",
        help="--output DIR: requests per QPS-sweep point (at most --num-requests).",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
    disaggregate: bool = typer.Option(
        False, "--disaggregate/--no-disaggregate", help="Separate prefill and decode pools."
    ),
    prefill_replicas: int | None = typer.Option(
        None, "--prefill-replicas", help="Disaggregation: prefill replicas."
    ),
    decode_replicas: int | None = typer.Option(
        None, "--decode-replicas", help="Disaggregation: decode replicas."
    ),
    pd_ratio: str | None = typer.Option(
        None, "--pd-ratio", help="Disaggregation: split --replicas P:D (e.g. 1:2)."
    ),
    prefill_tp: int | None = typer.Option(None, "--prefill-tp", help="Prefill TP (--tp)."),
    decode_tp: int | None = typer.Option(None, "--decode-tp", help="Decode TP (--tp)."),
    kv_transfer: str | None = typer.Option(
        None, "--kv-transfer", help="KV link: inter (NIC, default) | intra (NVLink, one node)."
    ),
    kv_transfer_overlap: bool = typer.Option(
        False,
        "--kv-transfer-overlap/--no-kv-transfer-overlap",
        help="Send KV layer by layer during the prefill.",
    ),
    decode_router: str | None = typer.Option(
        None,
        "--decode-router",
        help="Decode pool routing: kv_aware (default) | least_outstanding | round_robin.",
    ),
    draft_model: str | None = typer.Option(
        None, "--draft-model", help="Speculative decoding: draft model id or config.json."
    ),
    spec_k: int | None = typer.Option(None, "--spec-k", help="Draft tokens per step (4)."),
    spec_acceptance: float | None = typer.Option(
        None, "--spec-acceptance", help="Per-token acceptance rate of the drafts (0.7)."
    ),
    spec_acceptance_per_position: str | None = typer.Option(
        None, "--spec-acceptance-per-position", help="Acceptance per position: a1,a2,...,ak."
    ),
    spec_drafts: int | None = typer.Option(
        None, "--spec-drafts", help="SpecTr: draft sequences verified together (1)."
    ),
    spec_hierarchy: str | None = typer.Option(
        None, "--spec-hierarchy", help="TriForce: a tiny model id drafting for the draft."
    ),
    spec_tiny_k: int | None = typer.Option(
        None, "--spec-tiny-k", help="Tiny-model draft length (2)."
    ),
    spec_tiny_acceptance: float | None = typer.Option(
        None, "--spec-tiny-acceptance", help="Tiny-model acceptance rate (0.6)."
    ),
    branches: int = typer.Option(1, "--branches", help="Sampled branches per request (N)."),
    branches_stop: int | None = typer.Option(
        None, "--branches-stop", help="Finished branches that complete a request (M; N)."
    ),
    prune: str | None = typer.Option(None, "--prune", help="Branch pruning: none | sart."),
    prune_interval: int | None = typer.Option(
        None, "--prune-interval", help="Decode steps between pruning checks (64)."
    ),
    prune_threshold: float | None = typer.Option(
        None, "--prune-threshold", help="SART phase-1 score threshold alpha (0.2)."
    ),
    prune_max: int | None = typer.Option(
        None, "--prune-max", help="SART phase-1 most pruned branches beta (N - M)."
    ),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Latency percentiles, throughput, goodput, KV use and cost of a serving setup.
    `simcli serve plan ...` searches for the cheapest deployment meeting SLOs."""
    if ctx.invoked_subcommand is not None:
        return
    set_quiet(quiet)
    with user_errors():
        bundle_dir = output if output is not None and output_is_dir(output) else None
        if bundle_dir is not None:
            check_output_path(bundle_dir, "--output", kind="folder")
        elif output is not None:
            check_output_path(output, "--output", kind="file")
        if trace_output is not None:
            check_output_path(trace_output, "--trace-output", kind="file")
            if output is not None and trace_output.resolve() == output.resolve():
                raise fail(f"--trace-output {trace_output} is also --output; allowed: two paths")
        _check_positive("--trace-max-steps", trace_max_steps)
        _check_positive("--report-requests", report_requests)
        _check_positive("--report-qps-points", report_qps_points, zero_ok=True)
        for flag, value in (("--model", model), ("--gpu", gpu)):
            if value is None:
                raise ValueError(f"{flag} is required (or run `simcli serve plan`)")
        _check_choice("--scheduler", scheduler, SCHEDULERS)
        _check_choice("--router", router, ROUTERS)
        _check_choice("--preemption", preemption, PREEMPTION)
        for flag, value in (
            ("--tp", tp),
            ("--pp", pp),
            ("--replicas", replicas),
            ("--num-requests", num_requests),
            ("--chunk-size", chunk_size),
            ("--max-batch-size", max_batch_size),
            ("--max-tokens", max_tokens),
            ("--block-size", block_size),
            ("--prefix-groups", prefix_groups),
            ("--qps", qps),
            ("--burstiness", burstiness),
            ("--slo-ttft-s", slo_ttft_s),
            ("--slo-tpot-s", slo_tpot_s),
            ("--price-per-gpu-hour", price_per_gpu_hour),
        ):
            _check_positive(flag, value)
        _check_positive("--shared-prefix-len", shared_prefix_len, zero_ok=True)
        if not 0 < gpu_memory_utilization <= 1:
            raise fail(
                f"--gpu-memory-utilization {gpu_memory_utilization} is invalid; "
                "allowed: 0 < value <= 1"
            )
        if qps is None and trace is None:
            raise fail("give --qps X (synthetic arrivals) or --trace FILE (replay), or both")
        for flag, value in (
            ("--prefill-replicas", prefill_replicas),
            ("--decode-replicas", decode_replicas),
            ("--prefill-tp", prefill_tp),
            ("--decode-tp", decode_tp),
            ("--spec-k", spec_k),
            ("--spec-drafts", spec_drafts),
            ("--spec-tiny-k", spec_tiny_k),
            ("--branches", branches),
            ("--branches-stop", branches_stop),
            ("--prune-interval", prune_interval),
        ):
            _check_positive(flag, value)
        _check_positive("--prune-max", prune_max, zero_ok=True)
        _check_choice("--kv-transfer", kv_transfer or "inter", ("inter", "intra"))
        _check_choice("--decode-router", decode_router or "kv_aware", ROUTERS)
        _check_choice("--prune", prune or "none", ("none", "sart"))
        spec_cfg = _spec_config(
            draft_model,
            spec_k,
            spec_acceptance,
            spec_acceptance_per_position,
            spec_drafts,
            spec_hierarchy,
            spec_tiny_k,
            spec_tiny_acceptance,
        )
        branch_cfg = _branch_config(
            branches, branches_stop, prune, prune_interval, prune_threshold, prune_max
        )
        if not disaggregate:
            for flag, value in (
                ("--prefill-replicas", prefill_replicas),
                ("--decode-replicas", decode_replicas),
                ("--pd-ratio", pd_ratio),
                ("--prefill-tp", prefill_tp),
                ("--decode-tp", decode_tp),
                ("--kv-transfer", kv_transfer),
                ("--decode-router", decode_router),
            ):
                if value is not None:
                    raise fail(f"{flag} needs --disaggregate")
            if kv_transfer_overlap:
                raise fail("--kv-transfer-overlap needs --disaggregate")
        else:
            if spec_cfg is not None:
                raise fail(
                    "--draft-model with --disaggregate is not modelled; allowed: one of the two"
                )
            if branch_cfg is not None:
                raise fail(
                    "--branches with --disaggregate is not modelled; allowed: one of the two"
                )
            prefill_replicas, decode_replicas = _pools(
                replicas, prefill_replicas, decode_replicas, pd_ratio
            )
            replicas = prefill_replicas + decode_replicas
        if spec_cfg is not None and pp > 1:
            raise fail(f"--draft-model with --pp {pp}; allowed: --pp 1 (as in vLLM)")
        cfg = load_model(model)
        catalog = load_catalog()
        spec = catalog.gpu(gpu)
        ptp, dtp = prefill_tp or tp, decode_tp or tp
        if disaggregate and (kv_transfer or "inter") == "intra":
            per_node = catalog.system(gpu, 1).node.gpus_per_node
            if (ptp + dtp) * pp > per_node:
                raise fail(
                    f"--kv-transfer intra needs a prefill and a decode replica in one node: "
                    f"{ptp * pp} + {dtp * pp} GPUs > {per_node} per {gpu} node; allowed: "
                    "--kv-transfer inter, or smaller replicas"
                )
        drafts = []
        if spec_cfg is not None:
            for flag, ident in (
                ("--draft-model", draft_model),
                ("--spec-hierarchy", spec_hierarchy),
            ):
                if ident is None:
                    continue
                dcfg = load_model(ident)
                if dcfg.vocab_size != cfg.vocab_size:
                    raise fail(
                        f"{flag} {ident} has a vocabulary of {dcfg.vocab_size} tokens, the "
                        f"target {cfg.id} {cfg.vocab_size}; allowed: a draft with the target's "
                        "vocabulary"
                    )
                drafts.append(dcfg)
        syn = empirical = None
        replay = trace is not None and qps is None
        if replay:
            requests = trace_requests(trace, num_requests)  # type: ignore[arg-type]
            next(trace_requests(trace, 1))  # type: ignore[arg-type]  # fail before simulating
        else:
            empirical = trace_lengths(trace) if trace is not None else None
            syn = SyntheticSpec(
                qps=qps,  # type: ignore[arg-type]
                num_requests=num_requests or 1000,
                burstiness=burstiness,
                prompt_len=parse_dist(prompt_len) if empirical is None else None,
                output_len=parse_dist(output_len) if empirical is None else None,
                shared_prefix_len=shared_prefix_len,
                prefix_groups=prefix_groups,
                seed=seed,
            )
            requests = synthetic_requests(syn, empirical)
        branch_lengths = None
        if branch_cfg is not None:
            if trace is not None:  # branches resample the trace's output lengths
                branch_lengths = trace_lengths(trace)[1]
            else:
                branch_cfg = branch_cfg.model_copy(update={"output_len": parse_dist(output_len)})
        price = price_per_gpu_hour
        if price is None and gpu in gpu_prices():
            price = gpu_prices()[gpu].usd_per_gpu_hour
        sched = SchedulerConfig(
            kind=scheduler,  # type: ignore[arg-type]
            max_batch_size=max_batch_size,
            max_tokens=max_tokens or max(cfg.max_seq_len, 2048),
            chunk_size=chunk_size,
            preemption=preemption,  # type: ignore[arg-type]
        )
        disagg_cfg = (
            DisaggConfig(
                prefill_replicas=prefill_replicas,  # type: ignore[arg-type]
                decode_replicas=decode_replicas,  # type: ignore[arg-type]
                prefill_gpus_per_replica=ptp * pp,
                decode_gpus_per_replica=dtp * pp,
                kv_transfer=kv_transfer or "inter",  # type: ignore[arg-type]
                kv_transfer_overlap=kv_transfer_overlap,
                decode_router=decode_router or "kv_aware",  # type: ignore[arg-type]
            )
            if disaggregate
            else None
        )
        config = ServeConfig(
            replicas=replicas,
            gpus_per_replica=tp * pp,
            pp=pp,
            seed=seed,
            disaggregation=disagg_cfg,
            speculative=spec_cfg,
            branching=branch_cfg,
            scheduler=sched,
            router=router,  # type: ignore[arg-type]
            block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization,
            prefix_caching=prefix_caching,
            swap_bytes_per_s=host_copy_bytes_per_s(spec.pcie_gen),
            slo_ttft_s=slo_ttft_s,
            slo_tpot_s=slo_tpot_s,
            price_per_gpu_hour=price,
        )
        step_kw = dict(
            pp=pp,
            engine=engine,
            profile=profile,
            max_num_batched_tokens=chunk_size if scheduler == "sarathi" else sched.max_tokens,
            max_num_seqs=max_batch_size,
        )
        pre_step = dec_step = None
        if disaggregate:
            pat = {"attn_pattern": attn_pattern}
            pre_step = _step_model(cfg, gpu, tp=ptp, **pat, **step_kw)
            dec_step = pre_step if dtp == ptp else _step_model(cfg, gpu, tp=dtp, **pat, **step_kw)
            step = dec_step
        else:
            step = _step_model(cfg, gpu, tp=tp, attn_pattern=attn_pattern, **step_kw)
        draft_steps = [_step_model(d, gpu, tp=tp, **step_kw) for d in drafts]
        sim_kw = dict(
            prefill_step_model=pre_step,
            decode_step_model=dec_step,
            draft_step_model=draft_steps[0] if draft_steps else None,
            tiny_step_model=draft_steps[1] if len(draft_steps) > 1 else None,
            branch_output_lengths=branch_lengths,
        )
        expected = num_requests if replay else (num_requests or 1000)
        recorder = None
        if bundle_dir is not None or trace_output is not None:
            traced = trace_output is not None
            recorder = StepRecorder(
                max_samples=TIMELINE_ROWS,
                max_trace_steps=trace_max_steps if traced else 0,
                max_trace_requests=TRACE_REQUESTS if traced else 0,
            )
        staging = StagedBundle(bundle_dir) if bundle_dir is not None else nullcontext(None)
        with staging as staged:
            rows_path = staged.path("requests.csv") if staged is not None else output
            t0 = time.perf_counter()
            with (
                _request_writer(rows_path) as writer,
                progress_bar("simulating requests", total=expected) as advance,
            ):
                sim = Simulator(
                    step,
                    config,
                    sink=_row_sink(writer) if writer else None,
                    energy=EnergyMeter.for_step_model(step),
                    progress=advance,
                    progress_total=expected,
                    recorder=recorder,
                    **sim_kw,
                )
                result = sim.run(requests)
            wall = time.perf_counter() - t0
            out = _result_object(
                result, wall, cfg=cfg, gpu=gpu, tp=tp, pp=pp, engine=engine, replicas=replicas,
                scheduler=scheduler, router=router, replay=replay, qps=qps, ptp=ptp, dtp=dtp,
                disaggregate=disaggregate, drafts=drafts, price=price,
            )  # fmt: skip
            where = (
                f"{prefill_replicas} x {ptp * pp} + {decode_replicas} x {dtp * pp} {gpu} "
                "(prefill + decode)"
                if disaggregate
                else f"{replicas} x {tp * pp} {gpu}"
            )
            title = f"serving {cfg.id} on {where}"
            if staged is not None:
                assert recorder is not None
                n_sweep = min(report_requests, expected or report_requests)
                if replay:
                    requests_at, base_qps, why = _replay_at(trace, n_sweep)  # type: ignore[arg-type]
                else:
                    requests_at, base_qps, why = _synthetic_at(syn, empirical, n_sweep)  # type: ignore[arg-type]
                sweep, sweep_note = _qps_sweep(
                    report_qps_points,
                    n_sweep,
                    base_qps,
                    why,
                    requests_at,
                    lambda reqs: Simulator(step, config, **sim_kw).run(reqs).summary,  # type: ignore[arg-type]
                    replay=replay,
                )
                if base_qps is not None:
                    out_for_report = {**out, "offered_qps": base_qps}
                else:
                    out_for_report = dict(out)
                timeline = frame(recorder.samples(), TIMELINE_SCHEMA)
                reps = frame(result.per_replica, REPLICAS_SCHEMA)
                html = serve_report(
                    out_for_report,
                    title=title,
                    hists={"ttft_s": sim.metrics.ttft, "tpot_s": sim.metrics.tpot,
                           "e2e_s": sim.metrics.e2e},
                    slos={"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s},
                    timeline=timeline,
                    replicas=reps,
                    sweep=sweep,
                    sweep_note=sweep_note,
                    cost_model=str(getattr(step, "label", type(step).__name__)),
                )  # fmt: skip
                resolved = {
                    "model_id": cfg.id,
                    "gpu": gpu,
                    "cost_model": str(getattr(step, "label", type(step).__name__)),
                    "profile": profile,
                    "seed": seed,
                    "num_requests": expected,
                    "arrivals": out["arrivals"],
                    "max_tokens": sched.max_tokens,
                    "price_per_gpu_hour": price,
                    "prefill_tp": ptp if disaggregate else None,
                    "decode_tp": dtp if disaggregate else None,
                    "draft_models": [d.id for d in drafts],
                    "serve_config": config,
                    "report": {
                        "qps_multipliers": qps_multipliers(report_qps_points)
                        if sweep is not None
                        else [],
                        "base_qps": base_qps,
                        "requests_per_point": n_sweep,
                        "timeline_rows_max": TIMELINE_ROWS,
                    },
                }
                inputs = cli_inputs()
                staged.commit(
                    csvs=serve_csvs(out, timeline=timeline, replicas=reps, sweep=sweep),
                    config=config_document("serve", inputs, resolved=resolved),
                    report_html=html,
                )
        if trace_output is not None:
            assert recorder is not None
            recorder.write_trace(trace_output, command="serve", model=cfg.id, gpu=gpu, title=title)
        if fmt == Format.json:
            out["per_replica"] = result.per_replica
        emit_object(out, fmt, title=title)


def _result_object(
    result,
    wall: float,
    *,
    cfg,
    gpu: str,
    tp: int,
    pp: int,
    engine: str,
    replicas: int,
    scheduler: str,
    router: str,
    replay: bool,
    qps: float | None,
    ptp: int,
    dtp: int,
    disaggregate: bool,
    drafts: list,
    price: float | None,
) -> dict:
    """The printed result: the deployment, then the simulator's summary."""
    summary = result.summary
    out: dict = {
        "model": cfg.id,
        "gpu": gpu,
        "tp": tp,
        "pp": pp,
        "engine": engine,
        "replicas": replicas,
        "scheduler": scheduler,
        "router": router,
        "arrivals": "trace" if replay else f"qps {qps:g}",
        "prefill_tp": ptp if disaggregate else None,
        "decode_tp": dtp if disaggregate else None,
        "draft_model": drafts[0].id if drafts else None,
        "spec_hierarchy": drafts[1].id if len(drafts) > 1 else None,
        **summary,
        "price_per_gpu_hour": price,
        "simulation_wall_s": wall,
        "simulated_requests_per_wall_s": summary["requests_completed"] / wall if wall > 0 else None,
    }
    return out


def _synthetic_at(
    syn: SyntheticSpec, empirical, n: int
) -> tuple[Callable[[float], Iterable[Request]], float, str]:
    """QPS sweep of synthetic arrivals: the same spec (seed, lengths) at ``m x --qps``."""

    def at(m: float) -> Iterable[Request]:
        spec = syn.model_copy(update={"qps": syn.qps * m, "num_requests": n})
        return synthetic_requests(spec, empirical)

    return at, syn.qps, ""


def _replay_at(
    trace: Path, n: int
) -> tuple[Callable[[float], Iterable[Request]], float | None, str]:
    """QPS sweep of a replayed trace: its first ``n`` rows with arrival times divided by
    ``m`` (so ``m`` x its mean rate), lengths unchanged."""
    arrivals = [r.arrival_s for r in trace_requests(trace, n)]
    span = arrivals[-1] - arrivals[0] if arrivals else 0.0
    if len(arrivals) < 2 or not span > 0:
        return (lambda m: iter(())), None, "the trace's arrivals span no time"

    def at(m: float) -> Iterable[Request]:
        for r in trace_requests(trace, n):
            yield Request(
                r.id, r.arrival_s / m, r.prompt_tokens, r.output_tokens, r.prefix_key,
                r.prefix_tokens,
            )  # fmt: skip

    return at, (len(arrivals) - 1) / span, ""


def _qps_sweep(
    points: int,
    n: int,
    base_qps: float | None,
    why_not: str,
    requests_at: Callable[[float], Iterable[Request]],
    run: Callable[[Iterable[Request]], dict],
    *,
    replay: bool,
) -> tuple[pd.DataFrame | None, str]:
    """Throughput and latency at ``points`` arrival rates (0.25x to 2x the run's): the
    same deployment re-simulated with ``n`` requests per point. (frame or None, how it
    was made, for the report)."""
    if points <= 0:
        return None, "QPS sweep off (--report-qps-points 0)."
    if base_qps is None:
        return None, f"No QPS sweep: {why_not}."
    mults = qps_multipliers(points)
    rows = []
    with progress_bar("QPS sweep", total=len(mults)) as advance:
        for i, m in enumerate(mults):
            summary = run(requests_at(m))
            rows.append(
                {"qps_multiplier": m, "offered_qps": base_qps * m,
                 **{k: summary.get(k) for k in SWEEP_METRICS}}
            )  # fmt: skip
            advance(i + 1, len(mults))
    how = (
        f"The trace's first {n} rows replayed with arrival times divided by each multiplier "
        f"(its mean rate: {base_qps:.4g} requests/s)"
        if replay
        else f"{n} synthetic requests per point, same seed and length distributions"
    )
    note = (
        f"Curve made by re-simulating this deployment at {len(mults)} arrival rates, "
        f"{', '.join(f'{m:.3g}' for m in mults)} x {base_qps:.4g} requests/s. {how}. "
        "Overloaded points (throughput below the offered load) run until the last request "
        "completes, so their latencies grow with the number of requests."
    )
    return frame(rows, SWEEP_SCHEMA), note


def _spec_config(
    draft_model: str | None,
    k: int | None,
    acceptance: float | None,
    per_position: str | None,
    drafts: int | None,
    hierarchy: str | None,
    tiny_k: int | None,
    tiny_acceptance: float | None,
) -> SpecConfig | None:
    if draft_model is None:
        for flag, value in (
            ("--spec-k", k),
            ("--spec-acceptance", acceptance),
            ("--spec-acceptance-per-position", per_position),
            ("--spec-drafts", drafts),
            ("--spec-hierarchy", hierarchy),
            ("--spec-tiny-k", tiny_k),
            ("--spec-tiny-acceptance", tiny_acceptance),
        ):
            if value is not None:
                raise fail(f"{flag} needs --draft-model (the model that drafts the tokens)")
        return None
    if hierarchy is None:
        for flag, value in (("--spec-tiny-k", tiny_k), ("--spec-tiny-acceptance", tiny_acceptance)):
            if value is not None:
                raise fail(f"{flag} needs --spec-hierarchy (the tiny model)")
    if acceptance is not None and per_position is not None:
        raise fail("give --spec-acceptance or --spec-acceptance-per-position, not both")
    for flag, value in (
        ("--spec-acceptance", acceptance),
        ("--spec-tiny-acceptance", tiny_acceptance),
    ):
        if value is not None and not 0.0 <= value <= 1.0:
            raise fail(f"{flag} {value} is invalid; allowed: a number in [0, 1]")
    if per_position is not None:
        rates = _floats("--spec-acceptance-per-position", per_position)
        if k is not None and len(rates) != k:
            raise fail(
                f"--spec-acceptance-per-position has {len(rates)} values for --spec-k {k}; "
                "allowed: one value per draft position"
            )
        k = len(rates)
    else:
        rates = (0.7 if acceptance is None else acceptance,)
    return SpecConfig(
        k=k or 4,
        acceptance=rates,
        drafts=drafts or 1,
        tiny_k=(tiny_k or 2) if hierarchy is not None else 0,
        tiny_acceptance=0.6 if tiny_acceptance is None else tiny_acceptance,
    )


def _branch_config(
    branches: int,
    stop: int | None,
    prune: str | None,
    interval: int | None,
    threshold: float | None,
    beta: int | None,
) -> BranchConfig | None:
    if stop is not None and stop > branches:
        raise fail(
            f"--branches-stop {stop} > --branches {branches}; allowed: 1 <= --branches-stop "
            "<= --branches"
        )
    if branches == 1:
        for flag, value in (
            ("--prune", prune),
            ("--prune-interval", interval),
            ("--prune-threshold", threshold),
            ("--prune-max", beta),
        ):
            if value is not None:
                raise fail(f"{flag} needs --branches N (N > 1)")
        return None
    if (prune or "none") == "none":
        for flag, value in (
            ("--prune-interval", interval),
            ("--prune-threshold", threshold),
            ("--prune-max", beta),
        ):
            if value is not None:
                raise fail(f"{flag} needs --prune sart")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise fail(f"--prune-threshold {threshold} is invalid; allowed: a number in [0, 1]")
    return BranchConfig(
        branches=branches,
        stop_after=stop,
        prune=prune or "none",  # type: ignore[arg-type]
        prune_interval=interval or 64,
        prune_threshold=0.2 if threshold is None else threshold,
        prune_max=beta,
    )


app.command("plan", help="Cheapest deployment meeting SLOs at a target QPS.")(serve_plan)
