"""``simcli serve``: discrete-event simulation of an LLM serving deployment.

Replicas of ``tp x pp`` GPUs, a router, a replica scheduler (vLLM, Orca or Sarathi-Serve
style) over a paged KV cache, fed by Poisson/gamma arrivals or a replayed trace; reports
latency percentiles, throughput, goodput under SLOs, KV use, preemptions, GPU-hours and
cost. Iteration times come from ``simcli.serving.step.StepModel``.
"""

from __future__ import annotations

import csv
import math
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import IO

import typer
import yaml

from hardware_specs.registry import load_catalog
from simcli.errors import fail, user_errors
from simcli.output import Format, emit_object
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
from workloads.lengths import parse_dist
from workloads.models import load_model

app = typer.Typer(help="Simulate serving a model: latency, throughput, goodput, cost.")

# Host<->GPU copy rate per GPU for KV swapping, per PCIe generation: x16 link, one direction,
# ~80% of the raw rate (PCIe 4.0 x16 = 31.5 GB/s raw after 128b/130b; pinned-memory copies
# reach ~25 GB/s; 5.0 and 6.0 double each step).
SWAP_BYTES_PER_S = {3: 12.5e9, 4: 25e9, 5: 50e9, 6: 100e9}

REQUEST_COLUMNS = (
    "request_id",
    "replica",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "preemptions",
)


@lru_cache(maxsize=1)
def _price_table() -> dict[str, float]:
    """GPU id -> US$ per GPU-hour (``simcli/training/data/gpu_prices.yaml``, with sources)."""
    text = resources.files("simcli.training").joinpath("data/gpu_prices.yaml").read_text()
    return {r["gpu"]: float(r["usd_per_gpu_hour"]) for r in yaml.safe_load(text)["prices"]}


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
        out = req.output_tokens
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


def _step_model(model_cfg, gpu: str, *, tp: int, pp: int, engine: str, **kw):
    from simcli.serving.step import StepModel

    return StepModel(model_cfg, gpu, tp=tp, pp=pp, engine=engine, **kw)


@app.callback(invoke_without_command=True)
def serve(
    model: str = typer.Option(..., "--model", help="Built-in model id or config.json."),
    gpu: str = typer.Option(..., "--gpu", help="GPU id (see `simcli specs list`)."),
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
    profile: Path | None = typer.Option(None, "--profile", help="Calibration profile."),
    output: Path | None = typer.Option(
        None, "--output", help="Write one CSV row per request here (atomically)."
    ),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Latency percentiles, throughput, goodput, KV use and cost of a serving setup."""
    with user_errors():
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
        cfg = load_model(model)
        spec = load_catalog().gpu(gpu)
        if trace is not None and qps is None:
            requests = trace_requests(trace, num_requests)
            next(trace_requests(trace, 1))  # header and first row: fail before simulating
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
        price = _price_table().get(gpu) if price_per_gpu_hour is None else price_per_gpu_hour
        sched = SchedulerConfig(
            kind=scheduler,  # type: ignore[arg-type]
            max_batch_size=max_batch_size,
            max_tokens=max_tokens or max(cfg.max_seq_len, 2048),
            chunk_size=chunk_size,
            preemption=preemption,  # type: ignore[arg-type]
        )
        config = ServeConfig(
            replicas=replicas,
            gpus_per_replica=tp * pp,
            pp=pp,
            scheduler=sched,
            router=router,  # type: ignore[arg-type]
            block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization,
            prefix_caching=prefix_caching,
            swap_bytes_per_s=SWAP_BYTES_PER_S.get(spec.pcie_gen, 25e9),
            slo_ttft_s=slo_ttft_s,
            slo_tpot_s=slo_tpot_s,
            price_per_gpu_hour=price,
        )
        step = _step_model(
            cfg,
            gpu,
            tp=tp,
            pp=pp,
            engine=engine,
            profile=profile,
            max_num_batched_tokens=chunk_size if scheduler == "sarathi" else sched.max_tokens,
            max_num_seqs=max_batch_size,
        )
        t0 = time.perf_counter()
        with _request_writer(output) as writer:
            sim = Simulator(
                step,
                config,
                sink=_row_sink(writer) if writer else None,
                energy=EnergyMeter.for_step_model(step),
            )
            result = sim.run(requests)
        wall = time.perf_counter() - t0
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
            "arrivals": "trace" if trace is not None and qps is None else f"qps {qps:g}",
            **summary,
            "price_per_gpu_hour": price,
            "simulation_wall_s": wall,
            "simulated_requests_per_wall_s": summary["requests_completed"] / wall
            if wall > 0
            else None,
        }
        if fmt == Format.json:
            out["per_replica"] = result.per_replica
        emit_object(out, fmt, title=f"serving {cfg.id} on {replicas} x {tp * pp} {gpu}")
