"""Built-in serving-benchmark datasets (workloads.lengths.DATASETS): their draws reproduce
the quantiles and rank correlation they were built from, the DIST syntax reaches them, and
the old DIST syntax is untouched."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from workloads.lengths import (
    _PROBS,
    DATASETS,
    LengthError,
    QuantileDist,
    joint_dataset,
    parse_dist,
)

MEASURED = [n for n, d in DATASETS.items() if isinstance(d.input, QuantileDist)]


@pytest.mark.parametrize("name", MEASURED)
def test_draws_reproduce_the_quantiles(name):
    d = DATASETS[name]
    p, o = d.sample(200_000, np.random.default_rng(1))
    for dist, x in ((d.input, p), (d.output, o)):
        for q, v in zip(_PROBS[1:-1], dist.values[1:-1], strict=True):
            # the knot is the q-quantile: about q of the draws lie below it, 1 - q above
            # (the CDF is compared, not the sample quantile, which is noisy where the
            # density is thin; +-0.5 for the rounding to whole tokens)
            assert np.mean(x < v - 0.5) <= q + 0.004, (name, q, v)
            assert np.mean(x <= v + 0.5) >= q - 0.004, (name, q, v)
        assert x.min() >= dist.values[0] - 0.5 and x.max() <= dist.values[-1]


@pytest.mark.parametrize("name", MEASURED)
def test_the_rank_correlation_is_kept(name):
    d = DATASETS[name]
    p, o = d.sample(200_000, np.random.default_rng(2))
    r_s = 6 / math.pi * math.asin(d.rho / 2)  # the Spearman r the copula was built from
    assert spearmanr(p, o).statistic == pytest.approx(r_s, abs=0.02)


def test_splitwise_medians_match_the_paper():
    # Splitwise (Patel et al. ISCA 2024): medians of 1500 / 13 (coding) and 1020 / 129
    # (conversation) prompt / output tokens; the knots come from Vidur's copy of the traces
    code, conv = DATASETS["splitwise-code"], DATASETS["splitwise-conv"]
    assert code.input.values[5] == pytest.approx(1500, rel=0.03)
    assert code.output.values[5] == 13
    assert (conv.input.values[5], conv.output.values[5]) == (1020, 129)


def test_sharegpt4_matches_sarathi_serves_table():
    # Sarathi-Serve (OSDI 2024), openchat_sharegpt4: median / P90 prompt 1730 / 5696,
    # output 415 / 834 tokens
    d = DATASETS["sharegpt4-8k"]
    assert (d.input.values[5], d.input.values[7]) == (1730, 5696)
    assert (d.output.values[5], d.output.values[7]) == (415, 834)


def test_dist_syntax():
    d = DATASETS["arxiv-summarization-4k"]
    assert parse_dist("dataset:arxiv-summarization-4k") == d.input
    assert parse_dist("dataset:arxiv-summarization-4k", "output") == d.output
    assert parse_dist("dataset:ARXIV-summarization-4k:output") == d.output
    assert (
        parse_dist("dataset:random:input").sample(3, np.random.default_rng(0)).tolist()
        == [1024] * 3
    )
    assert parse_dist(d.output.spec) == d.output  # the spec parses back
    with pytest.raises(LengthError, match="unknown dataset 'nope'; allowed: splitwise-code"):
        parse_dist("dataset:nope")
    with pytest.raises(LengthError, match="side 'middle'"):
        parse_dist("dataset:random:middle")


def test_joint_only_for_both_sides_of_one_dataset():
    assert (
        joint_dataset("dataset:splitwise-conv", "dataset:splitwise-conv:output")
        is DATASETS["splitwise-conv"]
    )
    assert joint_dataset("dataset:splitwise-conv:input", "dataset:splitwise-code:output") is None
    assert joint_dataset("dataset:splitwise-conv:output", "dataset:splitwise-conv:input") is None
    assert joint_dataset("lognormal:512:1", "dataset:splitwise-conv:output") is None


@pytest.mark.parametrize(
    "text", ["512", "fixed:64", "uniform:1:9", "lognormal:512:1:4096", "zipf:1:16:64", "chat-8k"]
)
def test_old_syntax_unchanged(text):
    assert parse_dist(text).spec in (text, f"fixed:{text}")


def test_sharegpt_matches_the_published_means_and_filter():
    """The benchmarks' ShareGPT: means within 5% of the published 224 / 189 tokens, every
    pair inside vLLM's filter, and the shipped table is what the derivation prints."""
    import numpy as np

    from calibrate.workloads.sharegpt_lengths import derive
    from workloads.lengths import DATASETS

    d = DATASETS["sharegpt"]
    p, o = d.sample(100_000, np.random.default_rng(1))
    assert abs(p.mean() / 224.2 - 1) < 0.05 and abs(o.mean() / 189.1 - 1) < 0.05
    assert (p >= 4).all() and (p <= 1024).all() and (o >= 4).all() and (p + o <= 2048).all()
    qi, qo, _ = derive(n=400_000)
    assert max(abs(a - b) / b for a, b in zip(qi[4:10], d.input.values[4:10], strict=True)) < 0.1
    assert max(abs(a - b) / b for a, b in zip(qo[4:10], d.output.values[4:10], strict=True)) < 0.1
