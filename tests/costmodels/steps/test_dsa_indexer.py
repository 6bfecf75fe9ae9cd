"""DeepSeek-V3.2's lightning indexer: its projections per token, its scoring of every
cached key in prefill and decode, and its fp8 key cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from costmodels.steps.dsa_indexer import indexer_cost
from simcli.scenario.hardware import resolve_hardware
from simcli.scenario.step import build_step_model
from workloads.decompose import layer_forward_ops
from workloads.decompose.mla import indexer_cache_bytes
from workloads.models import load_model

CFG = Path(__file__).resolve().parents[3] / "examples" / "models" / "deepseek-v3.2.config.json"


@pytest.fixture(scope="module")
def v32():
    return load_model(CFG)


@pytest.fixture(scope="module")
def no_indexer(v32):
    return v32.model_copy(update={"index_n_heads": None, "index_head_dim": None,
                                  "index_topk": None, "id": "v32-no-indexer"})  # fmt: skip


def test_projections_per_token(v32, no_indexer):
    names = {o.name for o in layer_forward_ops(v32, 1, 4096, tp=8)}
    assert {"indexer_wq_b", "indexer_wk", "indexer_weights_proj"} <= names
    assert not any("indexer" in o.name for o in layer_forward_ops(no_indexer, 1, 4096, tp=8))
    assert indexer_cache_bytes(v32) == 128 + 4 and indexer_cache_bytes(no_indexer) == 0


def test_pairs_of_a_causal_chunk():
    hw = resolve_hardware("h200-sxm", 8)
    ix = indexer_cost(load_model(CFG), hw.cost_model)
    assert ix.pair_s > 0 and ix.key_read_s > 0
    # 4 new tokens over 10 cached: 4 * 10 + (1 + 2 + 3 + 4) pairs
    assert ix.prefill_s(np.array([4]), np.array([10])) == pytest.approx(50 * ix.pair_s)
    assert ix.decode_s(3, 300) == pytest.approx(303 * ix.key_read_s)


def test_long_context_decode_and_prefill_pay_the_indexer(v32):
    hw = resolve_hardware("h200-sxm", 16)
    step = build_step_model(v32, hw, tp=8, pp=2)
    none = np.zeros(0, np.int64)
    short = step.breakdown(none, none, np.full(32, 4000))["attn"]
    long = step.breakdown(none, none, np.full(32, 128000))["attn"]
    # every layer reads each sequence's 124k more indexer keys (132 B each, replicated)
    assert long - short >= 0.9 * v32.num_layers * step._indexer.key_read_s * 32 * 124000
    pre = step.breakdown(np.array([65536]), np.array([0]), none)["attn"]
    scoring = v32.num_layers * step._indexer.prefill_s(np.array([65536]), np.array([0]))
    assert scoring > 0.5 * pre  # at 64k tokens the scoring outweighs the sparse attention


def test_kv_cache_holds_the_indexer_keys(v32, no_indexer):
    hw = resolve_hardware("h200-sxm", 16)
    with_ix = build_step_model(v32, hw, tp=8, pp=2)
    without = build_step_model(no_indexer, hw, tp=8, pp=2, attn_pattern=v32.native_attn_pattern)
    ratio = with_ix.kv_bytes_per_token / without.kv_bytes_per_token
    assert ratio == pytest.approx(1 + 132 / (576 * 2))
    assert "indexer" in with_ix.kv_layout.note
