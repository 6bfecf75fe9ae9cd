"""Result bundles: tidy CSVs, ``config.json`` and one self-contained ``report.html``.

The last layer: it reads simulator and cost-model results and never computes them.
Names load on first use (PEP 562 ``__getattr__``): a command that only asks
:func:`output_is_dir` does not import the page renderer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simcli.lazy import lazy_attributes

_WHERE = {
    "output_is_dir": "simcli.reports.bundle",
    "write_output_dir": "simcli.reports.bundle",
    "Report": "simcli.reports.page",
}

if TYPE_CHECKING:
    from simcli.reports.bundle import output_is_dir, write_output_dir
    from simcli.reports.page import Report


__getattr__ = lazy_attributes(__name__, _WHERE, globals())


__all__ = ["Report", "output_is_dir", "write_output_dir"]
