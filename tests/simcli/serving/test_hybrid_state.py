"""A hybrid's recurrent state in the serving simulator: each sequence takes its mixers'
state from the KV pool once, whatever its length, and only attention layers keep KV per
token; the block accounting (``Engine.check``) holds at every event."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from costmodels.steps.kv_layout import KvLayout
from costmodels.steps.serving import StepModel
from simcli.serving.requests import Request
from simcli.serving.simulator import ServeConfig, Simulator
from tests.simcli.serving.test_kv_window import WindowStep  # 1 ms + 1 us a token, 40k KV
from workloads.models import load_hf_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "models"


def _run(layout, prompt=1000):
    rng = np.random.default_rng(5)
    t = np.cumsum(rng.exponential(0.005, 150))
    reqs = [Request(i, float(t[i]), prompt + int(rng.integers(0, 200)), 300) for i in range(150)]
    cfg = ServeConfig(max_model_len=8192, prefix_caching=False)
    return Simulator(WindowStep(layout), cfg, check=True).run(reqs).summary


def test_state_takes_units_once_per_sequence():
    lay = KvLayout(state_tokens=2000.0, note="state")
    assert lay.special and not lay.capped
    bs = 16
    assert lay.state_units(bs) == 125
    # the state does not grow with the context: only the attention blocks do
    assert lay.held_units(64_000, bs) - lay.held_units(32_000, bs) == 32_000 // bs
    assert lay.held_units(16, bs) == 1 + 125


def test_state_seats_fewer_sequences_and_keeps_the_accounting():
    plain = _run(None)
    state = _run(KvLayout(state_tokens=2000.0, note="state"))
    assert state["requests_completed"] == plain["requests_completed"] == 150
    assert state["mean_decode_batch"] < plain["mean_decode_batch"]
    assert state["kv_layout"] == "state"
    assert "kv_layout" not in plain


def test_hybrid_step_model_state_and_attention_only_kv():
    m = load_hf_config(EXAMPLES / "nemotron-h-8b.config.json")
    sm = StepModel(m, "h100-sxm")
    # 4 attention layers x 8 KV heads x 128 x (K, V) x 2 bytes per token
    assert sm.kv_bytes_per_token == 4 * 8 * 128 * 2 * 2
    lay = sm.kv_layout
    assert lay is not None
    assert lay.state_tokens == pytest.approx(m.state_bytes_per_seq(2) / sm.kv_bytes_per_token)
    # a replica of the same weights whose every layer kept KV would seat far fewer
    # sequences of 32k tokens than the hybrid does, its state included
    bs, ctx = 16, 32_768
    cap = sm.kv_capacity_tokens(bs, 0.9)
    seats = lay.capacity_units(cap, bs) // lay.held_units(ctx, bs)
    all_attention = cap * sm.kv_bytes_per_token / (52 * 8 * 128 * 2 * 2) // ctx
    assert seats > 5 * all_attention
    dense = StepModel(load_hf_config(EXAMPLES / "llama-3.2-1b.config.json"), "h100-sxm")
    assert dense.kv_layout is None  # models without mixers: unchanged


def test_hybrid_decode_prices_the_state_per_sequence():
    m = load_hf_config(EXAMPLES / "nemotron-h-8b.config.json")
    sm = StepModel(m, "h100-sxm")
    small = sm.step_s(np.zeros(0, int), np.zeros(0, int), np.full(8, 4096))
    big = sm.step_s(np.zeros(0, int), np.zeros(0, int), np.full(64, 4096))
    assert "mixer" in sm.breakdown(np.zeros(0, int), np.zeros(0, int), np.full(8, 4096))
    assert big > small
