"""``simcli varlen``: variable-length documents, static versus dynamic parallel layouts.

    simcli varlen --model llama3-8b --gpu h100-sxm --gpus 64 --tp 8 \\
        --lengths longtail-256k --tokens-per-step 1048576 --steps 50 --seed 0

Samples ``--steps`` global batches of documents from ``--lengths`` (a DIST string, see
:mod:`workloads.lengths`) or ``--lengths-csv`` (a histogram), and reports per strategy the
mean step time, tokens/s, imbalance (busiest GPU over the mean), padding and idle
fractions and the speedup over the static plan; see :mod:`simcli.training.varlen`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from simcli.errors import fail, user_errors
from simcli.options import SimcliGroup
from simcli.output import Format, emit_object, emit_records
from simcli.scenario import resolve_hardware
from simcli.training.varlen import STRATEGIES, make_varlen_config, simulate_varlen
from workloads.lengths import load_histogram_csv, parse_dist
from workloads.models import load_model

app = typer.Typer(
    cls=SimcliGroup,
    help=(
        "Variable-length data: simulate steps of packed documents and compare a static plan "
        "with Hydraulis-, ByteScale- and FlexSP-style dynamic layouts."
    ),
    invoke_without_command=True,
)

TABLE_COLUMNS = (
    "mean_step_s",
    "tokens_per_s",
    "speedup_vs_static",
    "imbalance",
    "padding_fraction",
    "idle_fraction",
    "mfu",
    "peak_memory_fill",
    "fallback_steps",
    "common_layout",
)


def parse_strategies(text: str) -> tuple[str, ...]:
    names = tuple(s.strip().lower() for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in STRATEGIES]
    if bad or not names:
        raise fail(
            f"unknown --strategies {text!r}; allowed: a comma list of {', '.join(STRATEGIES)}"
        )
    return tuple(dict.fromkeys(names))


@app.callback()
def varlen(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", help="Built-in model id or a config.json path."),
    gpu: str = typer.Option(..., "--gpu", help="GPU id (see `simcli specs list`)."),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree of every replica."),
    cp: int | None = typer.Option(
        None, "--cp", help="Static plan's CP degree (default: the smallest that fits memory)."
    ),
    seq_len: int | None = typer.Option(
        None,
        "--seq-len",
        help="Static context length; longer documents are cut into pieces of this length "
        "(default: the distribution's maximum).",
    ),
    lengths: str | None = typer.Option(
        None,
        "--lengths",
        help="Length DIST: N | fixed:N | uniform:A:B | lognormal:MEDIAN:SIGMA[:MAX] | "
        "zipf:THETA:MIN:MAX | csv:PATH | longtail-128k | longtail-256k | chat-8k.",
    ),
    lengths_csv: Path | None = typer.Option(
        None, "--lengths-csv", help="Histogram CSV: length,count or length_lo,length_hi,count."
    ),
    tokens_per_step: int = typer.Option(
        ..., "--tokens-per-step", help="Tokens of documents per global batch."
    ),
    steps: int = typer.Option(50, "--steps", help="Steps simulated."),
    seed: int = typer.Option(0, "--seed", help="Seed of the document sampler."),
    strategies: str = typer.Option(
        ",".join(STRATEGIES), "--strategies", help="Comma list of " + ", ".join(STRATEGIES)
    ),
    recompute: str = typer.Option("none", "--recompute", help="none | full"),
    memory_fraction: float = typer.Option(
        0.9, "--memory-fraction", help="Share of GPU memory usable."
    ),
    profile: Path | None = typer.Option(
        None, "--profile", help="Calibration profile overriding the defaults."
    ),
    hardware: Path | None = typer.Option(
        None, "--hardware", help="Extra hardware spec file (YAML/JSON)."
    ),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Simulate steps of variable-length documents under each strategy."""
    if ctx.invoked_subcommand is not None:
        return
    with user_errors():
        if (lengths is None) == (lengths_csv is None):
            raise fail("give exactly one of --lengths DIST or --lengths-csv FILE")
        dist = parse_dist(lengths) if lengths is not None else load_histogram_csv(lengths_csv)
        names = parse_strategies(strategies)
        if recompute not in ("none", "full"):
            raise fail(f"unknown --recompute {recompute!r}; allowed: none, full")
        cfg = make_varlen_config(
            lengths=dist,
            num_gpus=gpus,
            tp=tp,
            cp=cp,
            seq_len=seq_len,
            tokens_per_step=tokens_per_step,
            steps=steps,
            seed=seed,
            strategies=names,
            recompute=recompute,
            memory_fraction=memory_fraction,
        )
        arch = load_model(model)
        cost = resolve_hardware(gpu, gpus, profile=profile, hardware_file=hardware).cost_model
        result = simulate_varlen(arch, cost, cfg).to_dict()
        result["cost_model"] = cost.label
        if fmt == Format.json:
            emit_object(result, fmt)
            return
        rows = [
            {"strategy": name, **{k: summary[k] for k in TABLE_COLUMNS}}
            for name, summary in result["strategies"].items()
        ]
        plan = result["static_plan"]
        title = (
            f"{result['model']} on {gpus}x {gpu}, tp={tp}; lengths {result['lengths']} "
            f"(mean {result['mean_doc_len']:.0f}, max {result['max_doc_len']}); "
            f"{result['docs_per_step']:.0f} docs/step; static dp={plan['dp']} cp={plan['cp']} "
            f"seq_len={plan['seq_len']}; {result['tokens_limit_per_rank']} tokens/rank fit"
        )
        emit_records(rows, fmt, title=title)


__all__ = ["app", "parse_strategies"]
