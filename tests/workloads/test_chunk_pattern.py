"""Chunked local attention (Llama 4): closed-form tiles against a brute-force element
mask, its decode KV, its syntax and its KV layout in serving."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodels.steps.sparse import kv_layout
from tests.workloads.test_sparsity import causal_el, check, k_idx, q_idx
from workloads.sparsity import ChunkPattern, SparsityError, parse_pattern


def chunk_el(n: int, c: int) -> np.ndarray:
    q, k = q_idx(n), k_idx(n)
    return (k <= q) & (k // c == q // c)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_chunk_matches_brute_force(data):
    bq = data.draw(st.sampled_from([16, 32, 64]))
    bk = data.draw(st.sampled_from([16, 32, 64]))
    c = max(bq, bk) * data.draw(st.integers(1, 6))
    n = data.draw(st.integers(1, 1024))
    heads = data.draw(st.integers(1, 3))
    check(ChunkPattern(chunk=c), n, heads, bq, bk, 0, {"main": chunk_el(n, c)})


def test_chunk_costs_and_kv():
    p = parse_pattern("chunk:8192")
    assert p == ChunkPattern(chunk=8192) and p.spec == "chunk:8192"
    # four chunks of 8192: a quarter of the causal tiles (plus the diagonal)
    dens = p.tiles(32768, 1).density
    assert 0.125 < dens < 0.13
    assert p.tiles(8192, 1).density == parse_pattern("causal").tiles(8192, 1).density
    assert [p.kv_cache_tokens(c) for c in (1, 8192, 8193, 20000)] == [1, 8192, 1, 3616]
    assert p.decode_read_tokens(16384) == 8192
    # a chunk that no whole tiles fill is refused in one line
    with pytest.raises(SparsityError, match="not a multiple of the tile sizes"):
        ChunkPattern(chunk=100).tiles(1000, 1)
    assert causal_el(3).sum() == 6


def test_chunked_layers_cap_their_kv():
    lay = kv_layout(parse_pattern("hybrid:dense_every=4,inner=chunk:8192"), 48)
    assert (lay.full_units, lay.capped_units, lay.window_tokens) == (1, 3, 8192)
    assert "chunked-attention layers" in lay.note
