"""Sparse-attention KV in the serving simulator: a sliding window caps what a sequence
holds (more sequences fit), NSA's compressed keys shrink the capacity, S2 frees nothing;
block accounting invariants (``Engine.check``) hold at every event."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.steps.sparse import KvLayout, kv_layout
from simcli.serving.batch import CappedDecodeBatch
from simcli.serving.requests import Request, Sequence
from simcli.serving.simulator import ServeConfig, SimulationError, Simulator
from workloads.sparsity import parse_pattern


class WindowStep:
    """1 ms + 1 us per token; a small KV cache (40k tokens) and an optional layout."""

    kv_bytes_per_token = 131072.0

    def __init__(self, layout: KvLayout | None) -> None:
        if layout is not None:
            self.kv_layout = layout

    def step_s(self, prefill_new, prefill_past, decode_ctx) -> float:
        return 1e-3 + 1e-6 * (float(np.sum(prefill_new)) + len(decode_ctx))

    def kv_capacity_tokens(self, block_size: int, gpu_memory_utilization: float) -> int:
        return 40_000


def _requests(n=120, prompt=3000, output=600, seed=3):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.01, n))
    return [
        Request(i, float(t[i]), int(prompt + rng.integers(0, 500)), int(output)) for i in range(n)
    ]


def _run(layout, **kw):
    cfg = ServeConfig(max_model_len=8192, prefix_caching=False, **kw)
    sim = Simulator(WindowStep(layout), cfg, check=True)
    return sim.run(_requests()).summary


@pytest.mark.parametrize(
    "pattern", ["window:512", "window:500:sinks=4", "hybrid:dense_every=4,inner=window:512"]
)
def test_window_fits_more_sequences_and_keeps_the_accounting(pattern):
    layout = kv_layout(parse_pattern(pattern), 32)
    dense = _run(None)
    capped = _run(layout)
    assert capped["requests_completed"] == dense["requests_completed"] == 120
    assert capped["mean_decode_batch"] > 1.5 * dense["mean_decode_batch"]
    assert capped["preemptions"] < dense["preemptions"]
    assert capped["kv_tokens_per_seq_cap"] == layout.cap_tokens(16)
    assert capped["kv_capacity_gain"] > 1.0
    assert "kv_capacity_gain" not in dense  # dense output unchanged


def test_window_cap_blocks_and_units():
    w = kv_layout(parse_pattern("window:500:sinks=4"), 32)
    assert (w.full_units, w.capped_units) == (0, 1)
    assert w.cap_blocks(16) == 1 + 32 + 1  # sink block, 500/16 -> 32 blocks, 1 straddled
    h = kv_layout(parse_pattern("hybrid:dense_every=4,inner=window:512"), 32)
    assert (h.full_units, h.capped_units) == (1, 3)  # 8 dense, 24 window layers


def test_nsa_grows_the_kv_and_s2_frees_nothing():
    nsa = kv_layout(parse_pattern("nsa"), 32)
    assert nsa.bytes_factor == pytest.approx(1 + 1 / 16) and not nsa.capped
    s2 = kv_layout(parse_pattern("s2:local=8,stride=8"), 32)
    assert s2.bytes_factor == 1.0 and not s2.capped and "nothing freed" in s2.note
    hyb = kv_layout(parse_pattern("hybrid:dense_every=2,inner=nsa"), 32)
    assert hyb.bytes_factor == pytest.approx(1 + 0.5 / 16)


def test_nsa_capacity_is_smaller_in_the_step_model():
    from costmodels.steps.serving import StepModel
    from costmodels.steps.sparse import PatternStepModel
    from workloads.models import get_model

    model = get_model("llama3-8b")
    dense = StepModel(model, "h100-sxm").kv_capacity_tokens(16, 0.9)
    nsa = PatternStepModel(model, "h100-sxm", pattern="nsa", max_len=8192)
    assert nsa.kv_capacity_tokens(16, 0.9) < dense
    assert nsa.kv_capacity_tokens(16, 0.9) == pytest.approx(dense / (1 + 1 / 16), rel=1e-3)


def test_capped_batch_counts_blocks_without_per_sequence_loops():
    """needing_blocks() equals a brute-force count at every iteration."""
    bs, cap = 4, 3
    layout = KvLayout(full_units=1, capped_units=2, window_tokens=8)  # 2 + 1 blocks
    assert layout.cap_blocks(bs) == cap
    dec = CappedDecodeBatch(bs, layout)
    seqs = []
    for i, ctx in enumerate([1, 4, 7, 8, 12, 13, 30]):
        s = Sequence.__new__(Sequence)
        s.ctx_tokens, s.generated, s.output_tokens, s.order = ctx, 1, 100, i
        dec.add(s)
        seqs.append(s)
    for it in range(40):
        ctx = dec.contexts()
        starts = ctx % bs == 0
        brute = int(starts.sum()) + 2 * int((starts & (ctx < cap * bs)).sum())
        assert dec.needing_blocks() == brute, it
        if it == 10:
            dec.remove(seqs[2])
        dec.advance()


def test_window_with_branches_is_refused():
    from simcli.serving.branches import BranchConfig

    layout = kv_layout(parse_pattern("window:512"), 32)
    cfg = ServeConfig(branching=BranchConfig(branches=2))
    with pytest.raises(SimulationError, match="sliding-window KV layout"):
        Simulator(WindowStep(layout), cfg)
