"""Chart helpers over matplotlib's object API (no pyplot state), rendered to SVG text.

Each helper returns a ``matplotlib.figure.Figure``; :meth:`Report.figure` embeds it.
Text is converted to paths, so the SVG needs no fonts on the reader's machine.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # matplotlib loads only when a report is drawn: the CLI starts faster
    from matplotlib.figure import Figure

PALETTE = (
    "#3b6fb6", "#d1495b", "#edae49", "#66a182", "#8d6cab",
    "#00798c", "#f08a4b", "#6b7a8f", "#a23b72", "#2e4057",
)  # fmt: skip

_RC = {"svg.fonttype": "path", "svg.hashsalt": "simcli", "font.size": 9}


def new_figure(width_in: float = 8.0, height_in: float = 3.6, ncols: int = 1) -> tuple:
    """(figure, axes) with simcli's look; ``axes`` is a list when ``ncols`` > 1."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width_in, height_in))
        axes = fig.subplots(1, ncols)
    for ax in np.atleast_1d(axes):
        ax.grid(True, color="#e3e6ea", lw=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    return fig, (list(axes) if ncols > 1 else axes)


def to_svg(fig: Figure) -> str:
    """The figure as an ``<svg>`` element (no XML prolog), deterministic ids, no date."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    # matplotlib's RDF metadata names creativecommons/purl URLs: drop it, links stay local
    start, end = svg.find("<metadata>"), svg.find("</metadata>")
    if start != -1 and end != -1:
        svg = svg[:start] + svg[end + len("</metadata>") :]
    return svg


def cdf(ax, values: Sequence[float], label: str, color: str | None = None) -> None:
    """Empirical CDF of ``values`` (NaNs dropped)."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return
    y = np.arange(1, len(v) + 1) / len(v)
    ax.step(v, y, where="post", label=f"{label} (n={len(v)})", color=color, lw=1.4)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("fraction of requests")


def hbar_stack(ax, labels: Sequence[str], parts: dict[str, Sequence[float]]) -> None:
    """Horizontal stacked bars: one bar per label, one colour per part."""
    left = np.zeros(len(labels))
    for i, (name, vals) in enumerate(parts.items()):
        vals = np.asarray(vals, dtype=float)
        ax.barh(labels, vals, left=left, label=name, color=PALETTE[i % len(PALETTE)])
        left += vals
    ax.invert_yaxis()


def timeline(
    ax,
    spans: Sequence[tuple[str, float, float, str]],
    *,
    colors: dict[str, str] | None = None,
) -> None:
    """Gantt chart: spans are (track, start, duration, kind); one row per track."""
    tracks: list[str] = []
    for track, *_ in spans:
        if track not in tracks:
            tracks.append(track)
    kinds: list[str] = []
    for *_, kind in spans:
        if kind not in kinds:
            kinds.append(kind)
    colors = colors or {}
    cmap = {k: colors.get(k, PALETTE[i % len(PALETTE)]) for i, k in enumerate(kinds)}
    for kind in kinds:
        for t_i, track in enumerate(tracks):
            bars = [(s, d) for tr, s, d, k in spans if tr == track and k == kind]
            if bars:
                ax.broken_barh(bars, (t_i - 0.4, 0.8), facecolors=cmap[kind], lw=0)
    ax.set_yticks(range(len(tracks)), tracks)
    ax.set_ylim(len(tracks) - 0.5, -0.5)
    from matplotlib.patches import Patch

    ax.legend(
        handles=[Patch(color=cmap[k], label=k) for k in kinds],
        fontsize=7,
        ncols=min(len(kinds), 6),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        frameon=False,
    )


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Points not dominated in (lower x, lower y)."""
    order = np.lexsort((y, x))
    keep = np.zeros(len(x), dtype=bool)
    best = np.inf
    for i in order:
        if y[i] < best:
            keep[i] = True
            best = y[i]
    return keep


def pareto_line(ax, x, y, *, label: str = "Pareto front ({n})", **style) -> np.ndarray:
    """Draw the Pareto front (lower x, lower y) of the finite points as a line through them,
    left to right; ``{n}`` in ``label`` becomes its size. Returns the front's mask."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    finite = np.isfinite(x) & np.isfinite(y)
    front = np.zeros(len(x), dtype=bool)
    front[finite] = pareto_mask(x[finite], y[finite])
    order = np.argsort(x[front])
    ax.plot(x[front][order], y[front][order], label=label.format(n=int(front.sum())), **style)
    return front


def measured_vs_predicted(ax, measured, predicted, label: str, color: str) -> None:
    """Log-log scatter with the y = x line."""
    m = np.asarray(measured, dtype=float)
    p = np.asarray(predicted, dtype=float)
    ax.scatter(m, p, s=9, alpha=0.7, color=color, label=f"{label} ({len(m)})")
    ax.set(xscale="log", yscale="log", xlabel="measured ms", ylabel="predicted ms")


def identity_line(ax, lo: float, hi: float) -> None:
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
