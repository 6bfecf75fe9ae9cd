"""transformers' eager attention with sinks, timed alone on an H200, against its pricing
(calibrate/fit_eager_sinks.py: factors fitted on 8-32 heads)."""

from __future__ import annotations

import json
from pathlib import Path

from costmodels.ops.select import get_cost_model
from workloads.decompose.training import sinks_attention_ops, sinks_traffic_factors
from workloads.ops import Dtype, ops_frame

ROOT = Path(__file__).resolve().parents[2]


def test_held_out_heads_within_15pct():
    """64 heads (gpt-oss-20b per GPU): +1.7, +2.4, +6.5 and +12.7% at 1k-8k tokens."""
    rows = json.loads((ROOT / "calibrate/data/eager-sinks-h200-sxm/eager_sinks.json").read_text())
    cm = get_cost_model("h200-sxm")
    held = [r for r in rows["rows"] if r["heads"] == 64]
    assert len(held) == 4
    for r in held:
        f, b = sinks_attention_ops(
            r["heads"], r["seq_len"], 64, Dtype.bf16, sinks_traffic_factors()
        )
        ops = f + b
        t = cm.predict_many(ops_frame([o.op for o in ops]))
        ms = 1e3 * sum(x * o.count for o, x in zip(ops, t, strict=True))
        assert abs(ms / r["fwdbwd_ms"] - 1) < 0.15, (r, ms)
