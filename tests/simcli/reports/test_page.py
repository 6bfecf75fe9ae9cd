import json

import pandas as pd
import pytest

from simcli.reports import Report, output_is_dir, write_output_dir
from simcli.reports.bundle import config_document
from simcli.reports.charts import cdf, new_figure, pareto_mask
from tests.simcli.reports.browser import check_report


def _report() -> Report:
    rep = Report("demo <&>", command="demo")
    rep.summary({"iteration_s": 1.23456789, "fits": True, "plan": {"tp": 2}})
    rep.table("Rows", pd.DataFrame({"name": ["a", "b"], "time_s": [2.0, 1.0]}))
    fig, ax = new_figure()
    cdf(ax, [0.1, 0.2, 0.3], "ttft")
    rep.figure(fig, "a CDF")
    return rep


def test_page_is_self_contained_and_escaped():
    page = _report().html()
    assert "demo &lt;&amp;&gt;" in page
    assert "<svg" in page and "<?xml" not in page
    import re

    urls = set(re.findall(r"https?://[^\"' <]*", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    for ref in ("src=", "@import", "<link"):
        assert ref not in page, ref
    assert not re.search(r"url\((?!#)", page), "a url() that is not a local #fragment"


def test_bundle_writes_all_files(tmp_path):
    out = tmp_path / "run1"
    written = write_output_dir(
        out,
        csvs={"rows.csv": pd.DataFrame({"x_s": [1.0]})},
        config=config_document("demo", {"gpu": "h100-sxm"}),
        report_html=_report().html(),
    )
    assert sorted(p.name for p in written) == ["config.json", "report.html", "rows.csv"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["command"] == "demo" and cfg["inputs"] == {"gpu": "h100-sxm"}
    assert cfg["simcli_version"]
    # rewriting into an existing folder replaces the files and leaves no staging folder
    write_output_dir(out, csvs={}, config=cfg, report_html="<html></html>")
    assert (out / "report.html").read_text() == "<html></html>"
    assert [p.name for p in tmp_path.iterdir()] == ["run1"]


def test_bundle_refuses_missing_parent_and_file(tmp_path):
    with pytest.raises(OSError, match="does not exist"):
        write_output_dir(tmp_path / "no" / "dir", csvs={}, config={}, report_html="")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OSError, match="is an existing file"):
        write_output_dir(f, csvs={}, config={}, report_html="")


def test_output_is_dir_rule(tmp_path):
    assert output_is_dir(tmp_path / "out")
    assert not output_is_dir(tmp_path / "pred.csv")
    assert not output_is_dir(tmp_path / "plans.JSON")


def test_pareto_mask():
    import numpy as np

    x = np.array([1.0, 2.0, 3.0, 2.5])
    y = np.array([3.0, 1.0, 0.5, 2.0])
    assert pareto_mask(x, y).tolist() == [True, True, True, False]


def test_page_renders_in_browser(tmp_path):
    page = tmp_path / "r" / "report.html"
    page.parent.mkdir()
    page.write_text(_report().html())
    rendered = check_report(page, tmp_path)
    assert "iteration_s" in rendered.text


def test_cli_starts_without_matplotlib():
    """Charts load only when a report is drawn, so every CLI call (and sweep point) starts
    without paying for matplotlib."""
    import subprocess
    import sys

    code = "import sys, simcli.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
