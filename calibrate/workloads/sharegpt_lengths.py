"""Derive the ``sharegpt`` dataset of :data:`workloads.lengths.DATASETS`: the request
lengths of vLLM's and SGLang's serving benchmarks on ShareGPT.

Both benchmarks sample ShareGPT_V3_unfiltered_cleaned_split's first turns with the
conversation's own reply as the output length, and drop pairs with a prompt or output
under 4 tokens, a prompt over 1024 or a prompt + output over 2048 (vLLM
benchmarks/datasets.py ``is_valid_sequence``; sglang bench_serving ``sample_sharegpt_requests``).
That data set cannot be fetched here, so its shape is approximated: the ``sharegpt4-8k``
table (ShareGPT4 conversations, Sarathi-Serve's processed file), put through the same
filter, each side scaled so that its mean is the published one, 224 input and 189 output
tokens (sglang issue #2097: 1,200 ShareGPT prompts of sglang.bench_serving, 269,081 input
and 226,923 output tokens), then filtered again. The output printed is the table
``workloads/lengths.py`` ships (``python -m calibrate.workloads.sharegpt_lengths``).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import spearmanr

from workloads.lengths import DATASETS

MEAN_INPUT, MEAN_OUTPUT = 269_081 / 1200, 226_923 / 1200  # sglang issue #2097
PROBS = (0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 1.0)


def keep(p: np.ndarray, o: np.ndarray) -> np.ndarray:
    """The benchmarks' length filter."""
    return (p >= 4) & (o >= 4) & (p <= 1024) & (p + o <= 2048)


def derive(n: int = 2_000_000, seed: int = 0) -> tuple[tuple, tuple, float]:
    rng = np.random.default_rng(seed)
    p, o = DATASETS["sharegpt4-8k"].sample(n, rng)
    k = keep(p, o)
    p, o = p[k].astype(float), o[k].astype(float)
    for _ in range(20):  # scale to the published means, refilter, until both hold
        p2 = np.maximum(np.rint(p * MEAN_INPUT / p.mean()), 1)
        o2 = np.maximum(np.rint(o * MEAN_OUTPUT / o.mean()), 1)
        k = keep(p2, o2)
        p, o = p2[k], o2[k]
        if abs(p.mean() / MEAN_INPUT - 1) < 1e-3 and abs(o.mean() / MEAN_OUTPUT - 1) < 1e-3:
            break
    qi = tuple(int(v) for v in np.quantile(p, PROBS))
    qo = tuple(int(v) for v in np.quantile(o, PROBS))
    r_s = float(spearmanr(p, o).statistic)
    return qi, qo, round(r_s, 4)


if __name__ == "__main__":
    qi, qo, r = derive()
    print("input quantiles ", qi)
    print("output quantiles", qo)
    print("spearman", r)
