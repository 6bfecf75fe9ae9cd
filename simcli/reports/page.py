"""One self-contained HTML page: inline CSS, inline SVG charts, no network requests.

Charts are drawn by matplotlib (``charts.py``) and embedded as SVG text, so the page
opens offline, prints, and can be mailed as one file. The only script is a few lines
that sort a table when its header is clicked.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from typing import Any

import pandas as pd

from simcli import __version__

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1100px; padding: 0 1rem; color: #1f2430; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #e3e6ea; }
p.meta { color: #5b6472; font-size: 0.85rem; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.82rem; margin: 0.5rem 0; }
th, td { padding: 0.22rem 0.55rem; border-bottom: 1px solid #e3e6ea; text-align: right;
         white-space: nowrap; }
th { background: #f4f6f8; cursor: pointer; user-select: none; }
td.text, th.text { text-align: left; }
table.summary th { text-align: left; cursor: default; background: none; font-weight: 600; }
table.summary td { text-align: left; }
.scroll { overflow-x: auto; max-width: 100%; }
figure { margin: 1rem 0; }
figcaption { color: #5b6472; font-size: 0.85rem; }
svg { max-width: 100%; height: auto; }
p.note { font-size: 0.85rem; color: #5b6472; }
"""

# Click a header to sort by that column (numbers numerically); no other script runs.
_SORT_JS = """
document.querySelectorAll("table.data").forEach(function (t) {
  t.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var asc = th.dataset.dir !== "asc"; th.dataset.dir = asc ? "asc" : "desc";
      rows.sort(function (a, b) {
        var x = a.cells[col].textContent, y = b.cells[col].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def fmt_value(value: Any) -> str:
    """Cells: 4 significant digits for floats, blanks for missing values."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        if value == 0:
            return "0"
        return f"{value:.4g}" if 1e-4 <= abs(value) < 1e7 else f"{value:.3e}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt_value(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(fmt_value(v) for v in value)
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Report:
    """Build a page section by section, then :meth:`html` renders it.

    >>> rep = Report("Llama-3 8B on 8 x h100-sxm", command="train")
    >>> rep.summary({"iteration_s": 1.2})  # key/value table
    >>> rep.table("Stages", frame)          # sortable table
    >>> rep.figure(fig, "Pipeline timeline")  # a matplotlib Figure, as inline SVG
    """

    def __init__(self, title: str, *, command: str, subtitle: str = "") -> None:
        self.title, self.command, self.subtitle = title, command, subtitle
        self._parts: list[str] = []

    # -- sections ------------------------------------------------------------------
    def heading(self, text: str) -> Report:
        self._parts.append(f"<h2>{html.escape(text)}</h2>")
        return self

    def note(self, text: str) -> Report:
        self._parts.append(f'<p class="note">{html.escape(text)}</p>')
        return self

    def summary(self, values: dict[str, Any], title: str = "Summary") -> Report:
        """Key/value pairs; nested dicts and lists are flattened into one cell."""
        rows = "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(fmt_value(v))}</td></tr>"
            for k, v in values.items()
        )
        self.heading(title)
        self._parts.append(f'<table class="summary"><tbody>{rows}</tbody></table>')
        return self

    def table(
        self, title: str, frame: pd.DataFrame, *, max_rows: int = 200, caption: str = ""
    ) -> Report:
        """A sortable table of the first ``max_rows`` rows (the CSV has them all)."""
        self.heading(title)
        shown = frame.head(max_rows)
        numeric = [
            pd.api.types.is_numeric_dtype(shown[c]) and not pd.api.types.is_bool_dtype(shown[c])
            for c in shown.columns
        ]
        head = "".join(
            f'<th class="{"" if num else "text"}">{html.escape(str(c))}</th>'
            for c, num in zip(shown.columns, numeric, strict=True)
        )
        body = "".join(
            "<tr>"
            + "".join(
                f'<td class="{"" if _is_number(v) else "text"}">{html.escape(fmt_value(v))}</td>'
                for v in row
            )
            + "</tr>"
            for row in shown.itertuples(index=False, name=None)
        )
        more = (
            f'<p class="note">first {max_rows} of {len(frame)} rows; the CSV has them all</p>'
            if len(frame) > max_rows
            else ""
        )
        cap = f'<p class="note">{html.escape(caption)}</p>' if caption else ""
        self._parts.append(
            f'{cap}<div class="scroll"><table class="data"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>{more}"
        )
        return self

    def figure(self, fig: Any, caption: str = "") -> Report:
        """Embed a matplotlib Figure as inline SVG (and close it)."""
        from simcli.reports.charts import to_svg

        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self._parts.append(f"<figure>{to_svg(fig)}{cap}</figure>")
        return self

    def raw_svg(self, svg: str, caption: str = "") -> Report:
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self._parts.append(f"<figure>{svg}{cap}</figure>")
        return self

    # -- rendering -----------------------------------------------------------------
    def html(self) -> str:
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        sub = f"{html.escape(self.subtitle)} · " if self.subtitle else ""
        return (
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>simcli {html.escape(self.command)}: {html.escape(self.title)}</title>"
            f"<style>{_CSS}</style></head><body>"
            f"<h1>{html.escape(self.title)}</h1>"
            f'<p class="meta">{sub}simcli {__version__} · <code>simcli '
            f"{html.escape(self.command)}</code> · {stamp} · inputs in config.json, "
            "every row in the CSV files beside this page</p>"
            + "\n".join(self._parts)
            + f"<script>{_SORT_JS}</script></body></html>\n"
        )
