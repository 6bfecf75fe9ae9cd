"""transformers' SDPA on local layers: masked, not windowed (costmodels/steps/hf_attention)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.bench.masked_sdpa import ratio_table
from costmodels.steps.hf_attention import _table, hf_attention_scale, masked_ratio
from workloads.models import load_hf_config

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "models"


def test_the_shipped_table_is_the_measurement():
    csv = ROOT / "calibrate" / "data" / "masked-sdpa-h200-sxm" / "masked_sdpa.csv"
    fresh = ratio_table(csv)
    assert {d: {s: tuple(v) for s, v in by.items()} for d, by in fresh.items()} == _table()


def test_ratios_interpolate_and_clamp():
    t = _table()
    assert masked_ratio(128, 4096) == pytest.approx(t[128][4096])
    mid = masked_ratio(96, 3000)  # between 2048 and 4096, in log length
    lo, hi = t[96][2048], t[96][4096]
    assert min(lo[0], hi[0]) <= mid[0] <= max(lo[0], hi[0])
    assert masked_ratio(32, 100) == pytest.approx(t[64][1024])  # clamped to the range
    assert all(f > 1.5 for f, _ in (masked_ratio(d, 8192) for d in (64, 96, 128, 256)))


def test_only_local_layers_past_their_span_are_masked():
    phi3 = load_hf_config(EXAMPLES / "phi-3-mini-4k.config.json")  # window 2047, every layer
    assert hf_attention_scale(phi3, 2047) == (1.0, 1.0)
    assert hf_attention_scale(phi3, 4096) == pytest.approx(masked_ratio(96, 4096))
    gemma3 = load_hf_config(EXAMPLES / "gemma-3-27b.config.json")  # 5 of 6 layers local
    f, _ = hf_attention_scale(gemma3, 8192)
    share = gemma3.sliding_layers / gemma3.num_layers
    assert f == pytest.approx(1 + share * (masked_ratio(128, 8192)[0] - 1))
    llama = load_hf_config(EXAMPLES / "llama-3.2-1b.config.json")
    assert hf_attention_scale(llama, 8192) == (1.0, 1.0)
