"""Result bundles: tidy CSVs, ``config.json`` and one self-contained ``report.html``.

The last layer: it reads simulator and cost-model results and never computes them.
"""

from simcli.reports.bundle import output_is_dir, write_output_dir
from simcli.reports.page import Report

__all__ = ["Report", "output_is_dir", "write_output_dir"]
