"""Sparsity patterns: closed-form tile counts against brute-force N x N masks.

Every pattern's ``tiles()`` (closed form) and ``tile_masks()`` (tile level) must equal a
tile classification of an element mask built here from the pattern's definition. For the
random selections (top-k, NSA selected, SALE/AdaSpa sparse) the element mask comes from
the drawn tiles, and the draw itself is checked against the definition (how many blocks,
which are forced).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.sparsity import (
    AdaSpaPattern,
    CausalPattern,
    HybridPattern,
    NSAPattern,
    Pattern,
    S2Pattern,
    SparsityError,
    TileTable,
    TopKPattern,
    WindowPattern,
    parse_pattern,
)

SETTINGS = settings(max_examples=30, deadline=None)


# --------------------------------------------------------------------------- brute force


def brute(allowed: np.ndarray, bq: int, bk: int) -> tuple[np.ndarray, np.ndarray]:
    """(full, partial) bool [H, nq, nk] tiles of an element mask [H, Nq, Nk]."""
    h, nq_el, nk_el = allowed.shape
    nq, nk = -(-nq_el // bq), -(-nk_el // bk)
    pad = np.zeros((h, nq * bq, nk * bk), dtype=bool)
    pad[:, :nq_el, :nk_el] = allowed
    inside = np.zeros((nq * bq, nk * bk), dtype=bool)
    inside[:nq_el, :nk_el] = True
    t = pad.reshape(h, nq, bq, nk, bk)
    any_ = t.any(axis=(2, 4))
    all_ = (t | ~inside.reshape(1, nq, bq, nk, bk)).all(axis=(2, 4))
    return any_ & all_, any_ & ~all_


def q_idx(n: int) -> np.ndarray:
    return np.arange(n)[:, None]


def k_idx(n: int) -> np.ndarray:
    return np.arange(n)[None, :]


def causal_el(n: int) -> np.ndarray:
    return k_idx(n) <= q_idx(n)


def window_el(n: int, w: int, s: int) -> np.ndarray:
    q, k = q_idx(n), k_idx(n)
    return (k <= q) & ((q - k < w) | (k < s))


def s2_el(n: int, heads: int, local: int, stride: int, block: int) -> np.ndarray:
    q, k = q_idx(n)[None], k_idx(n)[None]
    off = (np.arange(heads) % stride)[:, None, None]
    return (k <= q) & ((k // block > q // block - local) | ((k // block) % stride == off))


def nsa_compressed_el(n: int, l: int, d: int) -> np.ndarray:  # noqa: E741
    nc = (n - l) // d + 1 if n >= l else 0
    return np.arange(nc)[None, :] * d + l - 1 <= q_idx(n)


def expand(tiles: np.ndarray, n_q: int, n_k: int, bq: int, bk: int) -> np.ndarray:
    """Tile table [H, nq, nk] -> element table [H, n_q, n_k]."""
    return tiles[:, np.arange(n_q) // bq][:, :, np.arange(n_k) // bk]


def check(
    pattern: Pattern,
    n: int,
    heads: int,
    bq: int,
    bk: int,
    seed: int,
    reference: dict[str, np.ndarray | None],
) -> dict:
    """Closed form == tile masks == brute force for every leaf; ``None`` references are
    random selections: the element mask is the drawn tiles, causally masked."""
    table = pattern.tiles(n, heads, bq, bk, seed)
    leaves = table.leaves()
    masks = pattern.tile_masks(n, heads, bq, bk, seed)
    assert set(leaves) == set(masks) == set(reference)
    for name, ref in reference.items():
        leaf, mask = leaves[name], masks[name]
        if ref is None:
            ref = expand(mask.visited, n, n, bq, bk) & causal_el(n)[None]
        ref = np.broadcast_to(ref, (heads, *ref.shape[-2:]))
        full, partial = brute(ref, bq, bk)
        np.testing.assert_array_equal(mask.full, full, err_msg=name)
        np.testing.assert_array_equal(mask.partial, partial, err_msg=name)
        np.testing.assert_array_equal(leaf.full, full.sum(-1), err_msg=name)
        np.testing.assert_array_equal(leaf.partial, partial.sum(-1), err_msg=name)
        assert leaf.seq_kv == ref.shape[-1]
        assert (leaf.kind, leaf.bits, leaf.share) == (mask.kind, mask.bits, mask.share)
        total = heads * full.shape[1] * full.shape[2]
        want = (full.sum() + partial.sum()) / total if total else 0.0
        assert leaf.density == pytest.approx(want)
    return masks


def selected_blocks(visited: np.ndarray, block_k: int, block: int) -> list[list[set[int]]]:
    """Selection blocks (of ``block`` tokens) holding a visited tile, per head and q tile."""
    m = block // block_k
    return [[{int(j) // m for j in np.flatnonzero(row)} for row in head] for head in visited]


def check_topk_draw(visited: np.ndarray, n: int, bq: int, bk: int, block: int, budget) -> None:
    """Each q tile of selection block QB visits exactly budget(h, QB) selection blocks, its
    own among them, none in the future, and every causal tile of a chosen block."""
    sel = selected_blocks(visited, bk, block)
    m = block // bk
    nk = visited.shape[-1]
    for h, rows in enumerate(sel):
        for i, blocks in enumerate(rows):
            qb = i * bq // block
            assert qb in blocks and max(blocks) == qb
            assert len(blocks) == budget(h, qb)
            q_last = min((i + 1) * bq, n) - 1
            want = np.zeros(nk, dtype=bool)
            for b in blocks:
                want[b * m : (b + 1) * m] = True
            want &= np.arange(nk) * bk <= q_last
            np.testing.assert_array_equal(visited[h, i], want)


# --------------------------------------------------------------------------- strategies


@st.composite
def geometry(draw):
    bq = draw(st.sampled_from([16, 32, 64]))
    bk = draw(st.sampled_from([16, 32, 64]))
    n = draw(st.integers(1, 1024))
    heads = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 1000))
    return n, heads, bq, bk, seed


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(geometry())
def test_dense_and_causal_match_brute_force(geo):
    n, heads, bq, bk, seed = geo
    check(parse_pattern("dense"), n, heads, bq, bk, seed, {"main": np.ones((n, n), bool)})
    check(parse_pattern("causal"), n, heads, bq, bk, seed, {"main": causal_el(n)})


@SETTINGS
@given(geometry(), st.data())
def test_window_with_sinks_matches_brute_force(geo, data):
    n, heads, bq, bk, seed = geo
    w = data.draw(st.integers(1, n))
    s = data.draw(st.integers(0, 200))
    p = WindowPattern(window=w, sinks=s)
    check(p, n, heads, bq, bk, seed, {"main": window_el(n, w, s)})


@SETTINGS
@given(geometry(), st.data())
def test_topk_draw_and_counts(geo, data):
    n, heads, bq, bk, seed = geo
    block = data.draw(st.sampled_from([64, 128]))
    per_head = data.draw(st.booleans())
    if data.draw(st.booleans()):
        k = data.draw(st.integers(1, 12))
        p = TopKPattern(k=k, block=block, per_head=per_head)

        def budget(h, qb):
            return min(k, qb + 1)
    else:
        dens = data.draw(st.floats(0.01, 1.0))
        p = TopKPattern(density=dens, block=block, per_head=per_head)

        def budget(h, qb):
            return min(qb + 1, max(1, math.ceil(dens * (qb + 1) - 1e-9)))

    masks = check(p, n, heads, bq, bk, seed, {"main": None})
    visited = masks["main"].visited
    check_topk_draw(visited, n, bq, bk, block, budget)
    if not per_head:
        assert (visited == visited[:1]).all()


@SETTINGS
@given(geometry(), st.data())
def test_s2_matches_brute_force(geo, data):
    n, heads, bq, bk, seed = geo
    block = bk * data.draw(st.integers(1, 3))
    local = data.draw(st.integers(1, 4))
    stride = data.draw(st.integers(1, 6))
    p = S2Pattern(local=local, stride=stride, block=block)
    check(p, n, heads, bq, bk, seed, {"main": s2_el(n, heads, local, stride, block)})


@SETTINGS
@given(geometry(), st.data())
def test_nsa_branches(geo, data):
    n, heads, bq, bk, seed = geo
    d = data.draw(st.sampled_from([3, 4, 8, 16]))  # 3: rows not aligned to the stride
    l = d * data.draw(st.sampled_from([1, 2, 4]))  # noqa: E741
    lsels = [
        x for x in (16, 32, 48, 64, 96, 128, 192) if x % d == 0 and (x % bk == 0 or bk % x == 0)
    ]
    lsel = data.draw(st.sampled_from(lsels))
    local = data.draw(st.integers(1, 3))
    nsel = data.draw(st.integers(local + 1, 10))
    w = data.draw(st.integers(1, 700))
    p = NSAPattern(l=l, d=d, lsel=lsel, n=nsel, w=w, local=local)
    ref = {
        "compressed": nsa_compressed_el(n, l, d),
        "selected": None,
        "window": window_el(n, w, 0),
    }
    masks = check(p, n, heads, bq, bk, seed, ref)
    table = p.tiles(n, heads, bq, bk, seed)
    parts = table.branches.values()
    np.testing.assert_array_equal(table.full, sum(b.full for b in parts))
    np.testing.assert_array_equal(table.partial, sum(b.partial for b in parts))
    # the draw: forced initial + local blocks, min(causal, max(n, forced)) blocks in all
    blk, n_eff, local_eff = p.selection_blocks(bk)
    if bk > p.lsel:
        r = bk // p.lsel
        assert (blk, n_eff, local_eff) == (bk, -(-nsel // r), -(-local // r))
    for rows in selected_blocks(masks["selected"].visited, bk, blk):
        for i, blocks in enumerate(rows):
            qs, qe = i * bq, min((i + 1) * bq, n) - 1
            hi = qe // blk
            forced = {0} | set(range(max(0, min(qs // blk, hi - local_eff + 1)), hi + 1))
            assert forced <= blocks and max(blocks) == hi
            assert len(blocks) == min(hi + 1, max(n_eff, len(forced)))


@SETTINGS
@given(geometry(), st.data())
def test_sale_and_adaspa(geo, data):
    n, heads, bq, bk, seed = geo
    dens = data.draw(st.floats(0.02, 1.0))
    sale = parse_pattern(f"sale:density={dens!r},est_bits=4,block=64")
    masks = check(sale, n, heads, bq, bk, seed, {"estimate": causal_el(n), "sparse": None})
    check_topk_draw(
        masks["sparse"].visited,
        n,
        bq,
        bk,
        64,
        lambda h, qb: min(qb + 1, max(1, math.ceil(dens * (qb + 1) - 1e-9))),
    )
    est = sale.tiles(n, heads, bq, bk, seed).branches["estimate"]
    assert (est.kind, est.bits) == ("estimate", 4)

    every = data.draw(st.integers(1, 8))
    ada = AdaSpaPattern(search_every=every, density=dens, spread=1.0, block=64)
    ref = {"search_attention": causal_el(n), "search_estimate": causal_el(n), "sparse": None}
    masks = check(ada, n, heads, bq, bk, seed, ref)
    hd = ada.head_densities(heads, seed)
    assert hd.mean() == pytest.approx(dens) and ((hd > 0) & (hd <= 1)).all()
    check_topk_draw(
        masks["sparse"].visited,
        n,
        bq,
        bk,
        64,
        lambda h, qb: min(qb + 1, max(1, math.ceil(hd[h] * (qb + 1) - 1e-9))),
    )
    shares = {k: v.share for k, v in ada.tiles(n, heads, bq, bk, seed).leaves().items()}
    assert shares == pytest.approx(
        {"search_attention": 1 / every, "search_estimate": 1 / every, "sparse": 1 - 1 / every}
    )


@SETTINGS
@given(geometry(), st.sampled_from(["window:16:sinks=4", "nsa:w=64,lsel=64", "topk:k=3"]))
def test_hybrid_branches(geo, inner):
    n, heads, bq, bk, seed = geo
    if inner.startswith("window") and n < 16:
        return
    p = parse_pattern(f"hybrid:dense_fraction=0.25,inner={inner}")
    masks = p.tile_masks(n, heads, bq, bk, seed)
    inner_masks = p.inner.tile_masks(n, heads, bq, bk, seed)
    leaves = p.tiles(n, heads, bq, bk, seed).leaves()
    full, partial = brute(np.broadcast_to(causal_el(n), (heads, n, n)), bq, bk)
    np.testing.assert_array_equal(masks["dense"].full, full)
    np.testing.assert_array_equal(leaves["dense"].partial, partial.sum(-1))
    assert leaves["dense"].share == 0.25
    for name, m in inner_masks.items():
        key = "sparse" if name == "main" else f"sparse.{name}"
        np.testing.assert_array_equal(masks[key].full, m.full)
        np.testing.assert_array_equal(leaves[key].full, m.full.sum(-1))
        assert leaves[key].share == pytest.approx(0.75 * m.share)


def _leaf_vs_brute(p: Pattern, name: str, ref: np.ndarray, n: int, bq: int, bk: int) -> None:
    leaf = p.tiles(n, 1, bq, bk).leaves()[name]
    full, partial = brute(ref[None], bq, bk)
    np.testing.assert_array_equal(leaf.full[0], full[0].sum(-1), err_msg=f"{p.spec} n={n}")
    np.testing.assert_array_equal(leaf.partial[0], partial[0].sum(-1), err_msg=f"{p.spec} n={n}")


@pytest.mark.parametrize(("bq", "bk"), [(16, 16), (16, 32), (32, 16)])
def test_exhaustive_small_edges(bq, bk):
    """Every length up to 100 (ragged last blocks, boundaries that random draws rarely hit)."""
    for l, d in [(3, 3), (6, 3), (8, 4), (32, 16)]:  # noqa: E741
        p = NSAPattern(l=l, d=d, lsel=96 if d == 3 else 64, n=4, w=8, local=1)
        for n in range(1, 101):
            _leaf_vs_brute(p, "compressed", nsa_compressed_el(n, l, d), n, bq, bk)
    for n in (37, 64, 100):
        for w in range(1, n + 1, 3):
            for s in (0, 1, 5, 16, 40):
                _leaf_vs_brute(
                    WindowPattern(window=w, sinks=s), "main", window_el(n, w, s), n, bq, bk
                )


# --------------------------------------------------------------------------- invariants


def counts(p: Pattern, n: int = 4096, heads: int = 4, b: int = 64) -> TileTable:
    return p.tiles(n, heads, b, b, seed=3)


@pytest.mark.parametrize(
    "spec",
    [
        "topk:density=1",
        "topk:density=1:per_head",
        "adaspa:search_every=4,density=1",
        "s2:local=1,stride=1",
        "window:4096",
    ],
)
def test_density_one_equals_causal(spec):
    want, got = counts(CausalPattern()), counts(parse_pattern(spec))
    np.testing.assert_array_equal(got.full, want.full)
    np.testing.assert_array_equal(got.partial, want.partial)
    sparse = counts(parse_pattern("sale:density=1")).branches["sparse"]
    np.testing.assert_array_equal(sparse.visited, want.visited)
    dense = counts(parse_pattern("hybrid:dense_every=1,inner=window:64")).branches["dense"]
    np.testing.assert_array_equal(dense.visited, want.visited)
    assert dense.share == 1.0


def test_dense_and_causal_densities():
    assert counts(parse_pattern("dense")).density == 1.0
    nq = 4096 // 64
    assert counts(CausalPattern()).density == pytest.approx((nq + 1) / (2 * nq))


def _monotone(specs: list[str], *, branch: str | None = None) -> None:
    prev = None
    for spec in specs:
        t = counts(parse_pattern(spec))
        v = (t.branches[branch] if branch else t).visited
        if prev is not None:
            assert (v >= prev).all(), spec
        prev = v


def test_monotone_in_density_window_and_k():
    grid = [0.05, 0.1, 0.2, 0.35, 0.5, 0.8, 1.0]
    _monotone([f"topk:density={x}" for x in grid])
    _monotone([f"sale:density={x}" for x in grid])
    _monotone([f"adaspa:search_every=3,density={x}" for x in grid])
    _monotone([f"topk:k={k}" for k in (1, 2, 4, 8, 16, 64)])
    _monotone([f"window:{w}" for w in (1, 17, 64, 100, 1000, 4096)])
    _monotone([f"window:256:sinks={s}" for s in (0, 1, 64, 300)])
    _monotone([f"s2:local={x},stride=8" for x in (1, 2, 3, 8)])
    _monotone([f"nsa:n={x},w=128" for x in (3, 4, 8, 32)], branch="selected")
    _monotone([f"nsa:w={x}" for x in (16, 128, 512, 5000)], branch="window")


def test_parse_round_trip_and_defaults():
    for spec in [
        "dense",
        "causal",
        "window:4096",
        "window:4096:sinks=4",
        "topk:density=0.1",
        "topk:k=16:per_head",
        "topk:k=4,block=64",
        "s2:local=4,stride=16",
        "nsa",
        "nsa:l=64,d=32,lsel=128,n=8,w=1024",
        "sale:density=0.2,est_bits=8",
        "adaspa:search_every=5,density=0.3,spread=0",
        "hybrid:dense_every=4,inner=nsa",
        "hybrid:dense_fraction=0.25,inner=window:1024:sinks=4",
    ]:
        p = parse_pattern(spec)
        assert p.spec == spec
        assert parse_pattern(p.spec) == p
        assert p.describe()["spec"] == spec
    assert parse_pattern("nsa:l=32,d=16,lsel=64,n=16,w=512") == NSAPattern()
    assert parse_pattern("window:w=8:sinks=2") == WindowPattern(window=8, sinks=2)
    assert parse_pattern(" TopK:k=2 , per_head ") == TopKPattern(k=2, per_head=True)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "allowed: dense, causal"),
        ("sparse", "unknown sparsity pattern 'sparse'; allowed: dense, causal, window"),
        ("topk:density=1.5", "density=1.5"),
        ("topk:density=0", "density=0.0"),
        ("topk:k=4,density=0.1", "exactly one of density=D or k=K"),
        ("topk", "exactly one of density=D or k=K"),
        ("topk:k=2.5", "k='2.5' is not an integer"),
        ("topk:q=3", "unknown parameter 'q' (topk takes density, k, block, per_head)"),
        ("window", "window"),
        ("window:0", "window=0"),
        ("window:8:8", "'8' is not NAME=VALUE"),
        ("window:abc", "window='abc' is not a number"),
        ("s2:local=0,stride=4", "local=0"),
        ("nsa:d=48", "d=48 must divide l=32"),
        ("nsa:n=2", "n=2 must be >= local + 1"),
        ("sale:density=2", "density=2.0"),
        ("adaspa:density=0.3", "search_every"),
        ("hybrid:dense_every=4", "inner=PATTERN is missing"),
        ("hybrid:dense_every=4,inner=bogus", "bad inner pattern"),
        ("hybrid:dense_every=4,inner=hybrid:dense_every=2,inner=causal", "another hybrid"),
        ("hybrid:dense_every=2,dense_fraction=0.5,inner=causal", "exactly one of dense_every"),
        ("topk:k=3,k=4", "k given twice"),
    ],
)
def test_bad_patterns_are_one_line(text, needle):
    with pytest.raises(SparsityError) as exc:
        parse_pattern(text)
    msg = str(exc.value)
    assert "\n" not in msg and needle in msg and "allowed" in msg, msg


@pytest.mark.parametrize(
    ("spec", "args", "needle"),
    [
        ("window:4096", (2048, 4), "window=4096 is longer than seq_len=2048"),
        ("topk:k=4,block=64", (1024, 4, 128, 128), "block=64 is not a multiple of block_q=128"),
        ("s2:local=2,stride=4,block=96", (1024, 4, 64, 64), "s2 block=96"),
        ("nsa:lsel=48", (1024, 4, 64, 64), "lsel=48 and block_k=64 do not divide"),
        ("nsa:lsel=48", (1024, 4, 64, 32), "lsel=48 and block_k=32 do not divide"),
        ("causal", (0, 4), "seq_len=0"),
        ("causal", (1024, 0), "heads=0"),
        ("causal", (1024, 4, 1.5, 64), "block_q=1.5"),
    ],
)
def test_bad_use_is_one_line(spec, args, needle):
    with pytest.raises(SparsityError) as exc:
        parse_pattern(spec).tiles(*args)
    msg = str(exc.value)
    assert "\n" not in msg and needle in msg and "allowed" in msg, msg


def test_selection_blocks_need_dividing_sizes():
    with pytest.raises(SparsityError, match="lsel=48 and block_k=32"):
        NSAPattern(lsel=48).selection_blocks(32)
    assert NSAPattern().selection_blocks(128) == (128, 8, 1)
    assert NSAPattern().selection_blocks(32) == (64, 16, 2)


def test_tile_masks_refuse_huge_tables():
    with pytest.raises(SparsityError, match="use tiles"):
        CausalPattern().tile_masks(1 << 20, 32, 16, 16)


# --------------------------------------------------------------------------- decode


def test_decode_footprints():
    c = 65536
    for spec in ("dense", "causal", "topk:k=8", "sale:density=0.1"):
        assert parse_pattern(spec).kv_cache_tokens(c) == c
    assert parse_pattern("dense").decode_read_tokens(c) == c
    w = parse_pattern("window:4096:sinks=4")
    assert (w.kv_cache_tokens(c), w.decode_read_tokens(c)) == (4100, 4100)
    assert w.kv_cache_tokens(1000) == 1000
    # NSA Table 4: 5632 tokens read per step at 64k; the cache is kept (+ compressed keys)
    nsa = NSAPattern()
    assert abs(nsa.decode_read_tokens(c) - 5632) <= 2
    assert nsa.kv_cache_tokens(c) == c + (c - 32) // 16 + 1
    assert nsa.decode_read_tokens(100) == 100 + nsa.num_compressed(100) + 100
    # top-k reads k blocks, the current (partial) block included
    assert parse_pattern("topk:k=8").decode_read_tokens(c + 10) == 7 * 128 + 10
    assert parse_pattern("topk:k=8").decode_read_tokens(300) == 300
    assert parse_pattern("topk:density=0.25").decode_read_tokens(c) == c // 4
    # S2 keeps the local blocks and its strided ones: ~ c / stride + local blocks
    s2 = parse_pattern("s2:local=4,stride=16")
    kept = s2.kv_cache_tokens(c)
    assert kept == s2.decode_read_tokens(c) == 4 * 128 + 128 * math.ceil((512 - 4) / 16)
    assert s2.kv_cache_tokens(300) == 300
    # hybrid: per-layer average
    h = parse_pattern("hybrid:dense_every=4,inner=window:4096")
    assert h.kv_cache_tokens(c) == c // 4 + 3 * 4096 // 4
    with pytest.raises(SparsityError, match="context_len=0"):
        w.kv_cache_tokens(0)


def test_layer_patterns():
    h = parse_pattern("hybrid:dense_every=4,inner=nsa")
    layers = h.layer_patterns(8)
    assert [type(x).__name__ for x in layers].count("CausalPattern") == 2
    assert layers[3] == CausalPattern() and layers[7] == CausalPattern()
    assert layers[0] == NSAPattern()
    f = HybridPattern(inner=NSAPattern(), dense_fraction=1 / 3)
    assert f.dense_layers(32) == [i for i in range(32) if f.layer_patterns(32)[i].kind == "causal"]
    assert len(f.dense_layers(32)) == 11
    assert HybridPattern(inner=NSAPattern(), dense_fraction=0.25).dense_layers(8) == [3, 7]
    assert parse_pattern("topk:k=2").layer_patterns(3) == [TopKPattern(k=2)] * 3


def test_describe():
    d = parse_pattern("hybrid:dense_every=3,inner=nsa").describe()
    assert d["kind"] == "hybrid" and d["branches"] == ["dense", "sparse"]
    assert d["params"]["inner"]["branches"] == ["compressed", "selected", "window"]
    assert "Yuan" in d["params"]["inner"]["source"] and "LongGen" in d["source"]


def test_branch_summaries_are_json_friendly():
    import json

    t = parse_pattern("nsa").tiles(8192, 4)
    s = json.loads(json.dumps(t.summary()))
    assert set(s["branches"]) == {"compressed", "selected", "window"}
    assert s["branches"]["compressed"]["seq_kv"] == (8192 - 32) // 16 + 1
    with pytest.raises(ValueError):
        t.full[0, 0] = 1  # read-only


# --------------------------------------------------------------------------- speed

SPEED_SPECS = [
    "dense",
    "causal",
    "window:4096:sinks=4",
    "topk:density=0.1",
    "topk:k=16:per_head",
    "s2:local=4,stride=16",
    "nsa",
    "sale:density=0.2",
    "adaspa:search_every=5,density=0.3",
    "hybrid:dense_every=4,inner=nsa",
]


@pytest.mark.parametrize("spec", SPEED_SPECS)
def test_one_million_tokens_is_fast(spec):
    p = parse_pattern(spec)
    t0 = time.perf_counter()
    t = p.tiles(1 << 20, 32)
    assert time.perf_counter() - t0 < 1.0
    assert t.full.shape == (32, 8192) and 0 < t.density <= 1
