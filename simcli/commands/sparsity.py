"""``simcli sparsity``: what an attention sparsity pattern buys, per layer and end to end."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import typer

from simcli.errors import user_errors
from simcli.options import SimcliGroup, config_options
from simcli.output import Format, atomic_write_json, atomic_write_text, emit_records
from simcli.progress import progress_bar, set_quiet
from simcli.reports.bundle import check_output_path, output_is_dir
from simcli.scenario.sparsity import (
    SparsityConfig,
    resolve_sparsity,
    run_sparsity,
)
from simcli.sparsity.gemm import GEMM_COLUMNS
from simcli.sparsity.whatif import COLUMNS

app = typer.Typer(
    cls=SimcliGroup, help="Attention sparsity what-ifs (patterns: see `sparsity compare --help`)."
)

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
@config_options(SparsityConfig)
def compare(
    config: SparsityConfig,
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
        scenario = resolve_sparsity(config)
        check_output_path(output)
        bundle = output is not None and output_is_dir(output)
        curve_lens = _curve_lengths(list(scenario.seq_lens)) if bundle else []
        total = len(scenario.seq_lens) + len(curve_lens)
        with progress_bar("sparsity compare", total=total) as advance:
            run = run_sparsity(scenario, curve_lens=curve_lens, progress=advance)
        if output is not None:
            inputs = {**scenario.inputs(), "curve_seq_lens": curve_lens}
            _write_outputs(output, run.rows, run.curve_rows, inputs, run.meta)
        title = f"{scenario.model.id} on {config.gpu}, tp={config.tp}, batch={config.batch}"
        _emit(run.rows, run.meta, fmt, title=title)


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
    if meta.get("gemm_break_even"):  # beside the bundle's files, written atomically
        buf = io.StringIO()
        _gemm_frame(meta["gemm_break_even"]).to_csv(buf, index=False, float_format="%.6g")
        atomic_write_text(output / "gemm_break_even.csv", buf.getvalue())


def _emit(rows: list[dict[str, Any]], meta: dict[str, Any], fmt: Format, title: str) -> None:
    """The rows on stdout: a table with the kernel footnotes, CSV, or the JSON object.
    With --weight-sparsity/--activation-sparsity, a second table (or, after one blank
    line, a second CSV) of the linear layers' break-even token counts."""
    gemm = meta.get("gemm_break_even")
    if fmt == Format.table:
        emit_records(_table_rows(rows), fmt, title=title)
        for line in _footnotes(rows):
            sys.stdout.write(line + "\n")
        if gemm:
            emit_records(gemm, fmt, title="linear layers: sparse vs dense GEMM break-even")
    elif fmt == Format.csv:
        pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(
            sys.stdout, index=False, float_format="%.6g"
        )
        if gemm:
            sys.stdout.write("\n")
            _gemm_frame(gemm).to_csv(sys.stdout, index=False, float_format="%.6g")
    else:
        emit_records(rows, fmt, json_wrapper=meta)


def _gemm_frame(gemm: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(gemm, columns=list(GEMM_COLUMNS))
    frame["break_even_tokens"] = frame["break_even_tokens"].astype("Int64")
    return frame


def _curve_lengths(seqs: list[int]) -> list[int]:
    from simcli.reports.sparsity import curve_lengths

    return curve_lengths(seqs)
