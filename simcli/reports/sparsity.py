"""``simcli sparsity compare --output DIR``: the comparison rows, speedup-vs-length curves,
time breakdowns, one page.

The command prices the patterns (``simcli.sparsity.whatif``), including the extra lengths
of the curves; this module only arranges the rows into CSVs and charts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simcli.reports.bundle import config_document, write_output_dir
from simcli.reports.charts import PALETTE, hbar_stack, new_figure
from simcli.reports.page import Report
from simcli.sparsity.gemm import GEMM_COLUMNS
from simcli.sparsity.whatif import COLUMNS

GIB = 1024**3
CURVE_START_TOKENS = 4096

_UNITS = {
    "attn_fwd_ms": ", milliseconds",
    "attn_bwd_ms": ", milliseconds",
    "decode_attn_ms": ", milliseconds",
    "prefill_ms": ", milliseconds",
    "decode_step_ms": ", milliseconds",
    "train_iteration_s": ", seconds",
    "kv_cache_bytes": ", bytes",
    "kv_cache_bytes_per_gpu": ", bytes",
}
CURVE_COLUMNS = (
    "seq_len",
    "gqa_group",
    "pattern",
    "attn_kernel",
    "tile_density",
    "attn_fwd_ms",
    "attn_bwd_ms",
    "decode_attn_ms",
    "attn_fwd_speedup",
    "attn_bwd_speedup",
    "decode_attn_speedup",
    "kv_cache_ratio",
)
_COMPARISON_DOC = {k: v + _UNITS.get(k, "") for k, v in COLUMNS.items()}
CSV_SCHEMAS: dict[str, dict[str, str]] = {
    "comparison.csv": _COMPARISON_DOC,
    # only with --weight-sparsity / --activation-sparsity; also the JSON's gemm_break_even
    # list and, after a blank line, the second CSV on stdout
    "gemm_break_even.csv": GEMM_COLUMNS,
    "speedup_curves.csv": {
        **{c: _COMPARISON_DOC[c] for c in CURVE_COLUMNS},
        "seq_len": "tokens per sequence of this curve point (decode at a KV cache of seq_len)",
    },
}
# the comparison columns a person reads on the page (the CSV has all of them)
PAGE_COLUMNS = (
    "seq_len",
    "gqa_group",
    "pattern",
    "attn_kernel",
    "tile_density",
    "attn_fwd_ms",
    "attn_bwd_ms",
    "attn_fwd_speedup",
    "attn_bwd_speedup",
    "decode_attn_ms",
    "decode_attn_speedup",
    "kv_cache_ratio",
    "prefill_speedup",
    "decode_step_speedup",
    "train_speedup",
)
_PANELS = (
    ("attn_fwd_speedup", "attention forward"),
    ("attn_bwd_speedup", "attention backward"),
    ("decode_attn_speedup", "decode attention"),
)


def curve_lengths(seq_lens: Sequence[int], start: int = CURVE_START_TOKENS) -> list[int]:
    """Powers of two from ``start`` up to the longest requested length, plus the requested
    lengths themselves, ascending."""
    top = max(seq_lens)
    out = set(seq_lens)
    n = start
    while n <= top:
        out.add(n)
        n *= 2
    return sorted(out)


def _tokens(n: float) -> str:
    n = int(n)
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)


def _colours(patterns: Sequence[str]) -> dict[str, str]:
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(dict.fromkeys(patterns))}


def _curve_figure(curves: pd.DataFrame, group: int, colours: dict[str, str]):
    sub = curves[curves["gqa_group"] == group]
    fig, axes = new_figure(10.0, 3.6, ncols=3)
    lengths = sorted(sub["seq_len"].unique())
    for ax, (col, title) in zip(axes, _PANELS, strict=True):
        ax.axhline(1.0, color="#444", lw=0.9, ls="--", label="dense (1x)")
        for pattern, part in sub.groupby("pattern", sort=False):
            if pattern == "dense":
                continue
            part = part.sort_values("seq_len")
            ax.plot(
                part["seq_len"],
                part[col],
                marker="o",
                ms=3.5,
                lw=1.4,
                color=colours[pattern],
                label=pattern,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [_tokens(n) for n in lengths], fontsize=7)
        ax.minorticks_off()
        ax.set(title=title, xlabel="sequence length, tokens", ylabel="speedup over dense, x")
    axes[0].legend(fontsize=7)
    return fig


def _breakdown_figure(rows: pd.DataFrame):
    labels = [f"{r.pattern} @ {_tokens(r.seq_len)}, G={r.gqa_group}" for r in rows.itertuples()]
    fig, (ax, kx) = new_figure(10.0, max(1.8, 0.3 * len(rows) + 1.1), ncols=2)
    hbar_stack(
        ax,
        labels,
        {
            "attention forward": rows["attn_fwd_ms"].to_numpy(dtype=float),
            "attention backward": rows["attn_bwd_ms"].to_numpy(dtype=float),
            "decode attention": rows["decode_attn_ms"].to_numpy(dtype=float),
        },
    )
    ax.set_xlabel("ms per layer on one TP rank")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    kx.barh(labels, rows["kv_cache_bytes"].to_numpy(dtype=float) / GIB, color=PALETTE[3])
    kx.invert_yaxis()
    kx.set_yticklabels([])
    kx.set_xlabel("KV cache of the model at context_len, GiB")
    return fig


def _end_to_end_figure(rows: pd.DataFrame, colours: dict[str, str]):
    metrics = [
        ("prefill_speedup", "prefill"),
        ("decode_step_speedup", "decode step"),
        ("train_speedup", "training iteration"),
    ]
    labels = [f"{r.pattern} @ {_tokens(r.seq_len)}, G={r.gqa_group}" for r in rows.itertuples()]
    fig, ax = new_figure(10.0, max(1.8, 0.38 * len(rows) + 1.1))
    y = np.arange(len(rows))
    height = 0.8 / len(metrics)
    for i, (col, name) in enumerate(metrics):
        ax.barh(
            y + (i - 1) * height,
            rows[col].to_numpy(dtype=float),
            height=height,
            color=PALETTE[i],
            label=name,
        )
    ax.axvline(1.0, color="#444", lw=0.9, ls="--")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over dense, x")
    ax.legend(fontsize=7, loc="lower right")
    return fig


def render_sparsity_report(
    rows: pd.DataFrame,
    curves: pd.DataFrame,
    *,
    inputs: dict[str, Any],
    meta: dict[str, Any],
    footnotes: Sequence[str] = (),
) -> str:
    """Summary, speedup-vs-length curves per GQA group, breakdowns, end-to-end, tables."""
    colours = _colours(list(rows["pattern"]))
    model, gpu = meta["model"], meta["gpu"]
    rep = Report(f"{model} on {gpu}: attention sparsity", command="sparsity compare")
    rep.summary(
        {
            "model": model,
            "gpu": gpu,
            "cost model": meta.get("cost_model", ""),
            "patterns": list(dict.fromkeys(rows["pattern"])),
            "sequence lengths": sorted(set(rows["seq_len"])),
            "GQA groups": sorted(set(rows["gqa_group"])),
            "tp": inputs.get("tp"),
            "batch": inputs.get("batch"),
            "context_len": inputs.get("context_len") or "= seq_len",
            "end to end": not inputs.get("kernels_only", False),
            "rows": len(rows),
            "seconds": meta.get("seconds"),
        }
    )
    lengths = sorted(set(curves["seq_len"]))
    rep.heading("Speedup over dense against sequence length")
    rep.note(
        "Each pattern is priced again at every length shown (powers of two from "
        f"{_tokens(CURVE_START_TOKENS)} up to the longest requested length, plus the requested "
        f"lengths: {', '.join(_tokens(n) for n in lengths)}), per layer on one TP rank, with "
        "the same model, GPU, tp and batch; decode attention reads a KV cache of the curve "
        "point's own length. speedup = dense time / pattern time at the same length and "
        "GQA group; above the dashed line the pattern is faster. Points: "
        "speedup_curves.csv."
    )
    for group in sorted(set(curves["gqa_group"])):
        rep.figure(
            _curve_figure(curves, group, colours),
            f"GQA group G={group} (query heads per KV head)",
        )
    top = int(rows["seq_len"].max())
    at_top = rows[rows["seq_len"] == top]
    rep.heading(f"Time breakdown at {_tokens(top)} tokens")
    rep.figure(
        _breakdown_figure(at_top),
        "left: attention forward, backward and one decode step's attention, ms per layer on "
        "one TP rank, stacked; right: the whole model's KV cache for batch sequences",
    )
    e2e = at_top.dropna(subset=["prefill_speedup", "decode_step_speedup", "train_speedup"])
    e2e = e2e[e2e["pattern"] != "dense"]
    if len(e2e):
        rep.heading(f"End to end at {_tokens(top)} tokens")
        rep.figure(
            _end_to_end_figure(e2e, colours),
            "a prefill, a decode step (vLLM-style engine) and a training iteration with the "
            "pattern's attention, against dense (dashed line: 1x)",
        )
    shown = [c for c in PAGE_COLUMNS if c in rows.columns]
    rep.table("Comparison", rows[shown], caption="comparison.csv has every column")
    for line in footnotes:
        rep.note(line)
    rep.table("Speedup curves", curves[list(CURVE_COLUMNS)], caption="speedup_curves.csv")
    return rep.html()


def write_sparsity_bundle(
    folder: Path,
    rows: list[dict[str, Any]],
    curve_rows: list[dict[str, Any]],
    *,
    inputs: dict[str, Any],
    meta: dict[str, Any],
    footnotes: Sequence[str] = (),
) -> list[Path]:
    """comparison.csv, speedup_curves.csv, config.json and report.html, all or nothing."""
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    curves = pd.DataFrame(curve_rows, columns=list(COLUMNS))[list(CURVE_COLUMNS)]
    page = render_sparsity_report(frame, curves, inputs=inputs, meta=meta, footnotes=footnotes)
    extra = {k: v for k, v in meta.items() if k not in ("columns",)}
    config = config_document("sparsity compare", inputs, **extra)
    return write_output_dir(
        folder,
        csvs={"comparison.csv": frame, "speedup_curves.csv": curves},
        config=config,
        report_html=page,
    )
