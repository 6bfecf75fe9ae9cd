"""Length distributions: DIST parsing, histogram CSVs, corpora, seeded sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.lengths import (
    CORPORA,
    FixedDist,
    HistogramDist,
    LengthError,
    LogNormalDist,
    UniformDist,
    ZipfDist,
    load_histogram_csv,
    parse_dist,
    token_share_above,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert text and "\n" not in text, text
    return text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512", FixedDist(length=512)),
        ("fixed:4096", FixedDist(length=4096)),
        (" uniform:16:64 ", UniformDist(low=16, high=64)),
        ("lognormal:1000:1.5", LogNormalDist(median=1000, sigma=1.5)),
        ("lognormal:1000:1.5:32768", LogNormalDist(median=1000, sigma=1.5, max_len=32768)),
        ("zipf:1.2:128:131072", ZipfDist(theta=1.2, low=128, high=131072)),
        ("ZIPF:1:8:8", ZipfDist(theta=1.0, low=8, high=8)),
    ],
)
def test_parse_each_shape(text, expected):
    dist = parse_dist(text)
    assert dist == expected
    assert parse_dist(dist.spec) == dist  # the canonical string parses back


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_corpora_are_bounded_long_tails(name):
    dist = parse_dist(name)
    assert dist.spec == name and dist.source
    x = dist.sample(50_000, rng(1))
    assert x.min() >= 1 and x.max() <= dist.max_length
    assert np.median(x) < 0.1 * dist.max_length  # mostly short documents
    if name.startswith("longtail"):
        assert dist.max_length >= 131072
        assert token_share_above(x, 8192) > 0.2  # the tail carries a good share of tokens


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty length distribution"),
        ("gamma:1:2", "unknown length distribution 'gamma:1:2'"),
        ("lognormal", "unknown length distribution"),
        ("uniform:5", "uniform takes uniform:A:B"),
        ("lognormal:1:2:3:4", "lognormal takes lognormal:MEDIAN:SIGMA[:MAX]"),
        ("zipf:1::100", "zipf takes zipf:THETA:MIN:MAX"),
        ("fixed:abc", "N='abc' is not an integer"),
        ("fixed:1.5", "is not an integer"),
        ("fixed:0", "greater than 0"),
        ("-4", "unknown length distribution"),
        ("uniform:9:3", "low=9 > high=3"),
        ("lognormal:x:1", "MEDIAN='x' is not a number"),
        ("lognormal:1000:-1", "sigma"),
        ("lognormal:1000:nan", "SIGMA='nan' is not a number"),
        ("zipf:0:1:10", "theta"),
        ("zipf:1:100:10", "MIN=100 > MAX=10"),
        ("csv:/no/such/file.csv", "does not exist"),
    ],
)
def test_bad_strings_are_one_line(text, needle):
    with pytest.raises(LengthError) as exc:
        parse_dist(text)
    line = one_line(exc)
    assert needle in line, line
    if "unknown" in line or "empty" in line:
        assert "longtail-128k" in line  # the corpora are listed as allowed


def test_sampling_is_seeded_and_deterministic():
    for text in [
        "uniform:1:100000",
        "lognormal:800:1.2:65536",
        "zipf:1.1:64:8192",
        "longtail-256k",
    ]:
        dist = parse_dist(text)
        a, b = dist.sample(1000, rng(7)), dist.sample(1000, rng(7))
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.int64
        assert not np.array_equal(a, dist.sample(1000, rng(8)))


def test_sample_needs_an_explicit_generator():
    with pytest.raises(LengthError, match="numpy.random.Generator"):
        parse_dist("fixed:3").sample(4, 42)  # type: ignore[arg-type]
    with pytest.raises(LengthError, match="non-negative integer"):
        parse_dist("fixed:3").sample(-1, rng())
    assert parse_dist("fixed:3").sample(0, rng()).shape == (0,)


@settings(max_examples=40, deadline=None)
@given(lo=st.integers(1, 10_000), span=st.integers(0, 10_000), seed=st.integers(0, 2**31))
def test_uniform_stays_in_range(lo, span, seed):
    x = UniformDist(low=lo, high=lo + span).sample(200, rng(seed))
    assert x.min() >= lo and x.max() <= lo + span


@settings(max_examples=40, deadline=None)
@given(
    theta=st.floats(0.1, 3.0),
    lo=st.integers(1, 1000),
    span=st.integers(0, 100_000),
    seed=st.integers(0, 2**31),
)
def test_zipf_stays_in_range(theta, lo, span, seed):
    x = ZipfDist(theta=theta, low=lo, high=lo + span).sample(300, rng(seed))
    assert x.min() >= lo and x.max() <= lo + span


def test_shapes_have_the_documented_statistics():
    x = parse_dist("zipf:1:16:65535").sample(200_000, rng(2))
    assert math.isclose(np.median(x), math.sqrt(16 * 65536), rel_tol=0.05)  # log-uniform
    steep = parse_dist("zipf:2:16:65535").sample(200_000, rng(2))
    assert np.median(steep) < 40  # p ~ L^-2 on [16, inf): median 32
    y = parse_dist("lognormal:1000:1").sample(200_000, rng(3))
    assert math.isclose(np.median(y), 1000, rel_tol=0.02)
    # truncation, not clipping: no pile-up at MAX
    z = parse_dist("lognormal:1000:2:2000").sample(100_000, rng(4))
    assert z.max() <= 2000 and np.mean(z == 2000) < 0.002


def test_histogram_csv_exact_lengths(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("length,count\n128,3\n4096,1\n")
    dist = load_histogram_csv(path)
    assert isinstance(dist, HistogramDist) and dist.max_length == 4096
    x = dist.sample(40_000, rng())
    assert set(np.unique(x)) == {128, 4096}
    assert math.isclose(np.mean(x == 128), 0.75, abs_tol=0.01)
    assert parse_dist(f"csv:{path}") == dist


def test_histogram_csv_bins(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("length_lo, length_hi, count\n1,1024,10\n1025,131072,0.5\n\n")
    dist = load_histogram_csv(path)
    x = dist.sample(20_000, rng())
    assert x.min() >= 1 and x.max() <= 131072
    assert math.isclose(np.mean(x > 1024), 0.5 / 10.5, abs_tol=0.01)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("", "is empty"),
        ("len,count\n1,2\n", "has columns 'len,count'"),
        ("length,count\n", "has a header but no rows"),
        ("length,count\n12,3,4\n", "line 2: 3 values, expected 2"),
        ("length,count\nabc,3\n", "line 2: length 'abc' is invalid"),
        ("length,count\n0,3\n", "line 2: length '0' is invalid"),
        ("length,count\n10,3\n12,-1\n", "line 3: count '-1' is invalid"),
        ("length,count\n10,x\n", "count 'x' is invalid"),
        ("length,count\n10,0\n", "all counts are zero"),
        ("length_lo,length_hi,count\n100,10,1\n", "length_lo=100 > length_hi=10"),
    ],
)
def test_malformed_histograms_are_one_line(tmp_path, body, needle):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(LengthError) as exc:
        load_histogram_csv(path)
    line = one_line(exc)
    assert needle in line and str(path) in line, line


def test_histogram_missing_or_directory(tmp_path):
    with pytest.raises(LengthError, match="does not exist"):
        load_histogram_csv(tmp_path / "nope.csv")
    with pytest.raises(LengthError, match="is a directory"):
        load_histogram_csv(tmp_path)
