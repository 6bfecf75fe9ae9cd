"""The runner's power suite: many utilisation points on a GPU, skipped cleanly without
NVML (``--tiny`` on a CPU)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("torch")

from calibrate.bench import common as C  # noqa: E402
from calibrate.bench import power  # noqa: E402
from calibrate.run import main  # noqa: E402


def _cases(mode: str) -> list[dict]:
    ctx = C.Context(mode=mode, device="cuda", timer="events", seed=0)
    return [c.row for c in power.cases(ctx)]


@pytest.mark.parametrize(("mode", "least"), [("full", 20), ("quick", 9), ("tiny", 4)])
def test_power_points_span_ops_and_utilisation(mode, least):
    rows = _cases(mode)
    assert len(rows) >= least  # the old suite had five rows, too few to fit three terms
    keys = [C.row_key({**r, "suite": "power"}) for r in rows]
    assert len(set(keys)) == len(keys)  # duty-cycled rows resume as rows of their own
    assert {"gemm", "copy"} <= {r["op"] for r in rows}
    assert any(r["op"].startswith("attn_") for r in rows)
    assert any(str(r.get("pattern", "")).startswith("duty=") for r in rows)
    for r in rows:
        assert 0.05 <= power._duty_of(r) <= 1.0


def test_power_suite_skips_without_nvml_on_cpu(tmp_path: Path):
    rc = main(["--suite", "power", "--tiny", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    with (tmp_path / "power.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(_cases("tiny"))
    assert all(r["status"] == "unsupported" and "NVML" in r["error"] for r in rows)
