"""hardware_specs.published: a predicted MFU beyond every published run says so."""

from __future__ import annotations

import json

from typer.testing import CliRunner

import simcli.cli
from hardware_specs.published import mfu_note


def test_note_only_beyond_the_published_ceiling():
    assert mfu_note("a100-sxm-80gb", 0.50, 1024) is None
    note = mfu_note("a100-sxm-80gb", 0.70, 1024)
    assert note and "0.56" in note and "Korthikanti" in note
    assert mfu_note("a100-sxm-80gb", 0.70, 8) is None  # small jobs: FlashAttention-2's 0.72
    assert mfu_note("h100-sxm", 0.50, 8) and mfu_note("h100-sxm", 0.45, 8) is None
    assert mfu_note("mi300x", 0.99, 8) is None  # no published figure: nothing to say


def test_plan_says_why_its_best_mfu_is_above_published_runs(monkeypatch):
    """Issue 18 item 2: GPT-3 175B on 1,024 A100s is predicted at MFU ~0.72, beyond the
    ~0.5-0.56 real runs reached; the JSON and stderr say so."""
    from simcli import progress

    monkeypatch.setitem(progress._state, "quiet", False)  # (another test may have set it)
    res = CliRunner().invoke(
        simcli.cli.app,
        ["plan", "--model", "gpt3-175b", "--gpu", "a100-sxm-80gb", "--gpus", "1024",
         "--seq-len", "2048", "--global-batch", "1536", "--top", "1", "--format", "json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["plans"][0]["mfu"] > 0.56 and "exceeds the highest published" in out["mfu_note"]
    assert "note: the best plan's MFU" in res.stderr
