"""``simcli sparsity``: what an attention sparsity pattern buys, per layer and end to end."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import typer

from simcli.errors import user_errors
from simcli.output import Format, atomic_write_json, atomic_write_text, emit_records
from simcli.progress import progress_bar, set_quiet
from simcli.reports.bundle import check_output_path, output_is_dir
from simcli.scenario import resolve_hardware
from simcli.sparsity.whatif import COLUMNS, SparsityPricer, WhatIfError, sweep
from workloads.models import load_model
from workloads.sparsity import ALLOWED

app = typer.Typer(help="Attention sparsity what-ifs (patterns: see `sparsity compare --help`).")

DEFAULT_PATTERNS = "dense,window:4096,nsa,s2:local=8,stride=8"
# the columns a person reads in the table; csv and json carry all of COLUMNS
TABLE_COLUMNS = {
    "seq_len": "seq",
    "gqa_group": "G",
    "pattern": "pattern",
    "attn_kernel": "kernel",
    "attn_fwd_ms": "fwd ms",
    "attn_bwd_ms": "bwd ms",
    "attn_fwd_speedup": "fwd x",
    "attn_bwd_speedup": "bwd x",
    "decode_attn_ms": "decode attn ms",
    "decode_attn_speedup": "decode attn x",
    "kv_cache_bytes": "KV GiB",
    "prefill_speedup": "prefill x",
    "decode_step_speedup": "decode step x",
    "train_speedup": "train iter x",
}
GIB = 1024**3


def _ints(text: str | None, flag: str) -> list[int] | None:
    if text is None or not text.strip():
        return None
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise WhatIfError(
            f"{flag} {text!r} is not a comma list of integers; allowed: e.g. 8192,32768"
        ) from None
    if not out or min(out) < 1:
        raise WhatIfError(f"{flag} {text!r}: allowed: integers >= 1")
    return out


def _table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        t = {label: r[key] for key, label in TABLE_COLUMNS.items()}
        t["KV GiB"] = r["kv_cache_bytes"] / GIB
        out.append(t)
    return out


def _footnotes(rows: list[dict[str, Any]]) -> list[str]:
    """Why each NSA/FSA kernel was chosen, and the rows' notes, each text once."""
    seen: set[str] = set()
    out = []
    for r in rows:
        texts = [r["note"]]
        if r["attn_kernel"].split("+")[-1] in ("nsa", "fsa"):
            texts.insert(0, r["kernel_reason"])
        for text in texts:
            if text and text not in seen:
                seen.add(text)
                out.append(f"{r['pattern']} @ seq {r['seq_len']}, G={r['gqa_group']}: {text}")
    return out


def _write(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """``--output`` with a .csv name: the rows as CSV; .json: the JSON object."""
    if path.suffix.lower() == ".csv":
        buf = io.StringIO()
        pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(buf, index=False, float_format="%.6g")
        atomic_write_text(path, buf.getvalue())
    else:
        atomic_write_json(path, {**meta, "rows": rows})


@app.callback()
def _group() -> None:
    """Attention sparsity what-ifs."""


@app.command("compare")
def compare(
    model: str = typer.Option(..., "--model", help="Built-in model id or config.json."),
    gpu: str = typer.Option(..., "--gpu", help="GPU id (see `simcli specs list`)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Tokens per sequence."),
    seq_lens: str | None = typer.Option(
        None, "--seq-lens", help="Sweep: comma list of sequence lengths, e.g. 8192,32768,131072."
    ),
    patterns: str = typer.Option(
        DEFAULT_PATTERNS,
        "--patterns",
        help=f"Comma (or ;) list of patterns; dense is the baseline. Syntax: {ALLOWED}.",
    ),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree (serving and training)."),
    batch: int = typer.Option(1, "--batch", help="Sequences per prefill and decode step."),
    context_len: int | None = typer.Option(
        None, "--context-len", help="KV cache tokens at the decode step (default: seq len)."
    ),
    gqa_groups: str | None = typer.Option(
        None,
        "--gqa-groups",
        help="Sweep: query heads per KV head, e.g. 1,4,8 (num_kv_heads = num_heads / G).",
    ),
    train_gpus: int | None = typer.Option(
        None, "--train-gpus", help="GPUs of the training plan (default: --tp, one TP group)."
    ),
    global_batch: int | None = typer.Option(
        None, "--global-batch", help="Sequences per training iteration (default: one per DP rank)."
    ),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Training micro-batch."),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full"),
    kernels_only: bool = typer.Option(
        False, "--kernels-only", help="Skip prefill, decode-step and training columns."
    ),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Also write the rows: CSV (.csv name) or JSON (.json). Any other name is a "
        "folder: comparison.csv, speedup_curves.csv (every pattern again at powers of two "
        "from 4k to the longest length), config.json and report.html.",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar on stderr."),
) -> None:
    """Per-layer attention forward/backward, decode attention, KV bytes and speedups over
    dense, and their effect on a prefill, a decode step and a training iteration; one row
    per (sequence length, GQA group, pattern)."""
    with user_errors():
        set_quiet(quiet)
        if (seq_len is None) == (seq_lens is None):
            raise WhatIfError("give exactly one of --seq-len N or --seq-lens N1,N2,...")
        seqs = [seq_len] if seq_len is not None else _ints(seq_lens, "--seq-lens")
        seqs = list(dict.fromkeys(seqs))
        groups = _ints(gqa_groups, "--gqa-groups")
        check_output_path(output)
        bundle = output is not None and output_is_dir(output)
        cfg = load_model(model)
        pricer = SparsityPricer(gpu, cost_models=lambda n: resolve_hardware(gpu, n).cost_model)
        common = {"gqa_groups": groups, "tp": tp, "batch": batch, "pricer": pricer}
        end_to_end = {
            "context_len": context_len,
            "train_gpus": train_gpus,
            "global_batch": global_batch,
            "micro_batch": micro_batch,
            "recompute": recompute,
            "end_to_end": not kernels_only,
        }
        curve_lens = _curve_lengths(seqs) if bundle else []
        rows, curve_rows, seconds = _price(cfg, gpu, seqs, curve_lens, patterns, common, end_to_end)
        meta = {
            "model": cfg.id,
            "gpu": gpu,
            "cost_model": getattr(pricer.cost_model(tp), "label", ""),
            "seconds": seconds,
            "columns": COLUMNS,
        }
        if output is not None:
            inputs = {
                "model": model,
                "gpu": gpu,
                "seq_lens": seqs,
                "patterns": patterns,
                "tp": tp,
                "batch": batch,
                "context_len": context_len,
                "gqa_groups": groups,
                "train_gpus": train_gpus,
                "global_batch": global_batch,
                "micro_batch": micro_batch,
                "recompute": recompute,
                "kernels_only": kernels_only,
                "curve_seq_lens": curve_lens,
            }
            _write_outputs(output, rows, curve_rows, inputs, meta)
        _emit(rows, meta, fmt, title=f"{cfg.id} on {gpu}, tp={tp}, batch={batch}")


def _write_outputs(
    output: Path,
    rows: list[dict[str, Any]],
    curve_rows: list[dict[str, Any]],
    inputs: dict[str, Any],
    meta: dict[str, Any],
) -> None:
    """``--output``: the report bundle for a folder name, else the rows (.csv / .json)."""
    if not output_is_dir(output):
        _write(rows, meta, output)
        return
    from simcli.reports.sparsity import write_sparsity_bundle

    write_sparsity_bundle(
        output, rows, curve_rows, inputs=inputs, meta=meta, footnotes=_footnotes(rows)
    )


def _price(
    cfg: Any,
    gpu: str,
    seqs: list[int],
    curve_lens: list[int],
    patterns: str,
    common: dict[str, Any],
    end_to_end: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """The rows of every sequence length (timed), then the kernel-only rows of the
    report's speedup curves, under one progress bar."""
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    curve_rows: list[dict[str, Any]] = []
    with progress_bar("sparsity compare", total=len(seqs) + len(curve_lens)) as advance:
        for i, s in enumerate(seqs):  # one length at a time, so the bar moves
            rows += sweep(cfg, gpu, [s], patterns, **end_to_end, **common)
            advance(i + 1)
        seconds = time.perf_counter() - t0
        for j, s in enumerate(curve_lens):  # kernels only: the curves of the report
            curve_rows += sweep(cfg, gpu, [s], patterns, end_to_end=False, **common)
            advance(len(seqs) + j + 1)
    return rows, curve_rows, seconds


def _emit(rows: list[dict[str, Any]], meta: dict[str, Any], fmt: Format, title: str) -> None:
    """The rows on stdout: a table with the kernel footnotes, CSV, or the JSON object."""
    if fmt == Format.table:
        emit_records(_table_rows(rows), fmt, title=title)
        for line in _footnotes(rows):
            sys.stdout.write(line + "\n")
    elif fmt == Format.csv:
        pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(
            sys.stdout, index=False, float_format="%.6g"
        )
    else:
        emit_records(rows, fmt, json_wrapper=meta)


def _curve_lengths(seqs: list[int]) -> list[int]:
    from simcli.reports.sparsity import curve_lengths

    return curve_lengths(seqs)
