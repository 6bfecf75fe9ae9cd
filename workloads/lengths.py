"""Sequence-length distributions: the DIST strings of the CLI, histogram CSVs, corpora.

One syntax serves training (``simcli varlen --lengths``) and serving (``--prompt-len``,
``--output-len``); :func:`parse_dist` turns a string into a frozen pydantic
:data:`LengthDist` whose ``sample(n, rng)`` draws ``n`` integer lengths (tokens, >= 1)
from an explicit ``numpy.random.Generator`` -- randomness only from a seed.

DIST strings:

- ``N`` or ``fixed:N`` -- every length ``N``.
- ``uniform:A:B`` -- integers uniform on ``[A, B]``.
- ``lognormal:MEDIAN:SIGMA[:MAX]`` -- ``exp(Normal(ln MEDIAN, SIGMA))`` rounded, truncated
  (not clipped: no spike at the bound) to ``[1, MAX]``; unbounded without ``MAX``.
- ``zipf:THETA:MIN:MAX`` -- a bounded power law, ``p(L) ~ L**-THETA`` on ``[MIN, MAX]``
  (``THETA = 1`` is log-uniform), drawn by inverting the continuous CDF on
  ``[MIN, MAX + 1)`` and flooring.
- ``csv:PATH`` -- a histogram file, see :func:`load_histogram_csv`.
- a corpus name from :data:`CORPORA` (``longtail-128k``, ``longtail-256k``, ``chat-8k``).
- ``dataset:NAME[:input|:output]`` -- the prompt (input, the default) or output lengths of a
  serving benchmark's dataset from :data:`DATASETS` (see below and ``docs/workloads.md``).

The datasets (:class:`DatasetLengths`) are what serving benchmarks draw requests from. Each
keeps its input and output marginals as quantile tables (:class:`QuantileDist`: the
published or measured percentiles, log-linear between them) and their dependence as a
Gaussian copula of the rank correlation, so ``DatasetLengths.sample`` draws correlated
(prompt, output) pairs; ``docs/workloads.md`` lists every number with its source.

The corpora are **synthetic shapes, not measured data**. They mimic the qualitative picture
of the length-distribution figures in ByteScale (Ge et al. 2025, "ByteScale: Efficient
Scaling of LLM Training with a 2048K Context Length on More Than 12,000 GPUs"), FlexSP
(Wang et al., ASPLOS 2025, "Data-Centric and Heterogeneity-Adaptive Sequence Parallelism")
and Hydraulis (Li et al. 2024/2025): the great majority of documents are short (a few
hundred to a few thousand tokens) while a thin tail reaching 128k-256k tokens carries a
large share of the tokens. The mixture weights below were chosen to give that picture, not
fitted to the papers' data; use a histogram CSV of your own corpus for real numbers.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class LengthError(ValueError):
    """A bad distribution string or histogram file; the message is one line."""


SYNTAX = (
    "N, fixed:N, uniform:A:B, lognormal:MEDIAN:SIGMA[:MAX], zipf:THETA:MIN:MAX, csv:PATH, "
    "dataset:NAME[:input|:output]"
)


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def max_length(self) -> int | None:
        """The largest length this distribution can draw (None: unbounded)."""
        raise NotImplementedError

    @property
    def spec(self) -> str:
        """The DIST string that parses back to this distribution."""
        raise NotImplementedError

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` lengths (int64, each >= 1) drawn with ``rng``."""
        if not isinstance(n, int | np.integer) or isinstance(n, bool) or n < 0:
            raise LengthError(f"sample size must be a non-negative integer, got {n!r}")
        if not isinstance(rng, np.random.Generator):
            raise LengthError(
                f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), "
                f"got {type(rng).__name__}"
            )
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        out = np.asarray(self._draw(int(n), rng), dtype=np.int64)
        return np.maximum(out, 1)


class FixedDist(_Dist):
    """Every length the same."""

    kind: Literal["fixed"] = "fixed"
    length: int = Field(gt=0)

    @property
    def max_length(self) -> int:
        return self.length

    @property
    def spec(self) -> str:
        return f"fixed:{self.length}"

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.length, dtype=np.int64)


class UniformDist(_Dist):
    """Integers uniform on ``[low, high]``."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(gt=0)
    high: int = Field(gt=0)

    @model_validator(mode="after")
    def _order(self) -> UniformDist:
        if self.low > self.high:
            raise ValueError(f"low={self.low} > high={self.high}; allowed: low <= high")
        return self

    @property
    def max_length(self) -> int:
        return self.high

    @property
    def spec(self) -> str:
        return f"uniform:{self.low}:{self.high}"

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n)


class LogNormalDist(_Dist):
    """``exp(Normal(ln median, sigma))``, rounded, truncated to ``[1, max_len]``."""

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    max_len: int | None = Field(default=None, gt=0, description="upper bound (truncation)")

    @property
    def max_length(self) -> int | None:
        return self.max_len

    @property
    def spec(self) -> str:
        tail = f":{self.max_len}" if self.max_len is not None else ""
        return f"lognormal:{_num(self.median)}:{_num(self.sigma)}{tail}"

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        mu = math.log(self.median)
        if self.sigma == 0:
            x = np.full(n, self.median)
        else:
            from scipy.special import ndtr, ndtri  # scipy loads where used (CLI start-up)

            # Inverse-CDF sampling restricted to the rounding cell of [1, max_len]:
            # lengths in [0.5, max_len + 0.5) round into range, so nothing piles up at a bound.
            lo = float(ndtr((math.log(0.5) - mu) / self.sigma))
            hi = 1.0
            if self.max_len is not None:
                hi = float(ndtr((math.log(self.max_len + 0.5) - mu) / self.sigma))
            u = lo + (hi - lo) * rng.random(n)
            u = np.clip(u, np.nextafter(0.0, 1.0), np.nextafter(1.0, 0.0))
            x = np.exp(mu + self.sigma * ndtri(u))
        out = np.rint(x)
        if self.max_len is not None:
            out = np.minimum(out, self.max_len)
        return np.maximum(out, 1)


class ZipfDist(_Dist):
    """Bounded power law ``p(L) ~ L**-theta`` on ``[low, high]`` (log-uniform at 1)."""

    kind: Literal["zipf"] = "zipf"
    theta: float = Field(gt=0)
    low: int = Field(gt=0)
    high: int = Field(gt=0)

    @model_validator(mode="after")
    def _order(self) -> ZipfDist:
        if self.low > self.high:
            raise ValueError(f"MIN={self.low} > MAX={self.high}; allowed: MIN <= MAX")
        return self

    @property
    def max_length(self) -> int:
        return self.high

    @property
    def spec(self) -> str:
        return f"zipf:{_num(self.theta)}:{self.low}:{self.high}"

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        a, b = float(self.low), float(self.high + 1)
        u = rng.random(n)
        if abs(self.theta - 1.0) < 1e-12:
            x = a * (b / a) ** u
        else:
            e = 1.0 - self.theta
            x = (a**e + u * (b**e - a**e)) ** (1.0 / e)
        return np.clip(np.floor(x), self.low, self.high)


class HistogramDist(_Dist):
    """Bins ``[lows[i], highs[i]]`` drawn with probability ``weights[i] / sum``, then a
    length uniform inside the bin (``length,count`` files have ``low == high``)."""

    kind: Literal["histogram"] = "histogram"
    lows: tuple[int, ...]
    highs: tuple[int, ...]
    weights: tuple[float, ...]
    source: str = Field(default="", description="file the histogram was read from")

    @model_validator(mode="after")
    def _check(self) -> HistogramDist:
        n = len(self.weights)
        if n == 0 or len(self.lows) != n or len(self.highs) != n:
            raise ValueError("a histogram needs equally many lows, highs and weights (>= 1)")
        for lo, hi, w in zip(self.lows, self.highs, self.weights, strict=True):
            if lo < 1 or hi < lo:
                raise ValueError(f"bin [{lo}, {hi}] is invalid; allowed: 1 <= lo <= hi")
            if not math.isfinite(w) or w < 0:
                raise ValueError(f"count {w} is invalid; allowed: finite and >= 0")
        if sum(self.weights) <= 0:
            raise ValueError("all counts are zero; allowed: at least one positive count")
        return self

    @property
    def max_length(self) -> int:
        return max(h for h, w in zip(self.highs, self.weights, strict=True) if w > 0)

    @property
    def spec(self) -> str:
        return f"csv:{self.source}" if self.source else "histogram"

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        w = np.asarray(self.weights, dtype=float)
        idx = rng.choice(len(w), size=n, p=w / w.sum())
        lo = np.asarray(self.lows, dtype=np.int64)[idx]
        hi = np.asarray(self.highs, dtype=np.int64)[idx]
        return rng.integers(lo, hi + 1)


class QuantileDist(_Dist):
    """A length distribution given by its quantiles: ``values[i]`` at cumulative probability
    ``probs[i]`` (``probs`` from 0 to 1: the minimum and maximum), drawn by inverting the
    CDF, linear in log length between the knots, then rounded."""

    kind: Literal["quantiles"] = "quantiles"
    name: str = Field(min_length=1, description="the DIST string that names it")
    probs: tuple[float, ...]
    values: tuple[float, ...]

    @model_validator(mode="after")
    def _check(self) -> QuantileDist:
        p, v = self.probs, self.values
        if len(p) < 2 or len(p) != len(v) or p[0] != 0.0 or p[-1] != 1.0:
            raise ValueError("quantiles need >= 2 knots, probabilities from 0 to 1")
        if any(b <= a for a, b in zip(p, p[1:], strict=False)):
            raise ValueError("quantile probabilities must increase")
        if v[0] < 1 or any(b < a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError("quantile values must be >= 1 and non-decreasing")
        return self

    @property
    def max_length(self) -> int:
        return int(math.floor(self.values[-1]))

    @property
    def spec(self) -> str:
        return self.name

    def from_uniform(self, u: np.ndarray) -> np.ndarray:
        """Lengths at cumulative probabilities ``u`` (the copula's draws)."""
        x = np.exp(np.interp(u, self.probs, np.log(np.asarray(self.values, dtype=float))))
        return np.clip(np.rint(x), 1, self.max_length)

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.from_uniform(rng.random(n))


Component = Annotated[
    FixedDist | UniformDist | LogNormalDist | ZipfDist | HistogramDist,
    Field(discriminator="kind"),
]


class MixtureDist(_Dist):
    """A weighted mixture of the simple distributions (the built-in corpora)."""

    kind: Literal["mixture"] = "mixture"
    name: str = Field(min_length=1)
    weights: tuple[float, ...]
    components: tuple[Component, ...]
    source: str = Field(min_length=1, description="where the shape comes from")

    @model_validator(mode="after")
    def _check(self) -> MixtureDist:
        if not self.components or len(self.weights) != len(self.components):
            raise ValueError("a mixture needs one weight per component (>= 1)")
        if any(w < 0 or not math.isfinite(w) for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError("mixture weights must be finite, >= 0, and not all zero")
        return self

    @property
    def max_length(self) -> int | None:
        bounds = [c.max_length for c in self.components]
        return None if any(b is None for b in bounds) else max(bounds)  # type: ignore[type-var]

    @property
    def spec(self) -> str:
        return self.name

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        w = np.asarray(self.weights, dtype=float)
        which = rng.choice(len(w), size=n, p=w / w.sum())
        out = np.empty(n, dtype=np.int64)
        for i, comp in enumerate(self.components):
            mask = which == i
            count = int(mask.sum())
            if count:
                out[mask] = comp.sample(count, rng)
        return out


LengthDist = Annotated[
    FixedDist | UniformDist | LogNormalDist | ZipfDist | HistogramDist | MixtureDist | QuantileDist,
    Field(discriminator="kind"),
]

_PROBS = (0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 1.0)


class DatasetLengths(BaseModel):
    """A serving benchmark dataset's request lengths: input and output marginals and the
    Gaussian-copula correlation ``rho`` between them (``rho = 2 sin(pi r_s / 6)`` of the
    Spearman rank correlation ``r_s``, the normal copula's identity; Kruskal 1958)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    input: FixedDist | QuantileDist
    output: FixedDist | QuantileDist
    rho: float = Field(0.0, ge=-1, le=1)
    source: str = Field(min_length=1)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) pairs, correlated through the copula."""
        if isinstance(self.input, FixedDist) or isinstance(self.output, FixedDist):
            return self.input.sample(n, rng), self.output.sample(n, rng)
        from scipy.special import ndtr  # scipy loads where used (CLI start-up)

        z = rng.standard_normal((2, n))
        z2 = self.rho * z[0] + math.sqrt(1.0 - self.rho**2) * z[1]
        p = self.input.from_uniform(ndtr(z[0])).astype(np.int64)
        o = self.output.from_uniform(ndtr(z2)).astype(np.int64)
        return np.maximum(p, 1), np.maximum(o, 1)


def _quantiles(name: str, side: str, values: tuple[int, ...]) -> QuantileDist:
    return QuantileDist(name=f"dataset:{name}:{side}", probs=_PROBS, values=values)


def _copula_rho(r_s: float) -> float:
    """The normal copula's correlation of a Spearman rank correlation ``r_s``."""
    return round(2.0 * math.sin(math.pi * r_s / 6.0), 4)


def _measured(
    name: str, rows: int, ins: tuple, outs: tuple, r_s: float, src: str
) -> DatasetLengths:
    return DatasetLengths(
        name=name,
        input=_quantiles(name, "input", ins),
        output=_quantiles(name, "output", outs),
        rho=_copula_rho(r_s),
        source=f"{src}: {rows} rows; percentiles p0,1,5,10,25,50,75,90,95,99,100 and the "
        f"Spearman correlation {r_s} computed by us (docs/workloads.md)",
    )


_VIDUR = (
    "microsoft/vidur data/processed_traces/{} at commit 7d47513363ec447a741ac5e47241580b47724fbf"
)

_SARATHI = (
    "microsoft/sarathi-serve data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer"
    ".csv at commit 72339db5b120614033b317880ad3a05a5e4c9415"
)

# Percentiles p0, p1, p5, p10, p25, p50, p75, p90, p95, p99, p100 of the input (prompt) and
# output tokens, and their Spearman rank correlation, computed by us from the public files
# named in each source (the data is not copied here; docs/workloads.md has the command).
DATASETS: dict[str, DatasetLengths] = {
    # Splitwise (Patel et al., ISCA 2024) Azure LLM inference trace, coding service, as
    # Vidur's processed file; the paper's medians: 1500 prompt / 13 output tokens
    "splitwise-code": _measured(
        "splitwise-code",
        8819,
        (3, 17, 75, 147, 578, 1469, 2744, 5188, 7303, 7436, 7437),
        (6, 6, 6, 7, 9, 13, 24, 55, 90, 251, 1899),
        -0.0215,
        _VIDUR.format("splitwise_code.csv"),
    ),
    # Splitwise conversation service; the paper's medians: 1020 prompt / 129 output tokens
    "splitwise-conv": _measured(
        "splitwise-conv",
        19366,
        (2, 29, 181, 207, 396, 1020, 1189, 2734, 4083, 4142, 14050),
        (7, 16, 41, 54, 85, 129, 395, 424, 451, 601, 1000),
        0.0728,
        _VIDUR.format("splitwise_conv.csv"),
    ),
    # arXiv summarization (Cohan et al. 2018) tokenised with Llama-2's tokenizer and kept to
    # 4k tokens in all, as Vidur's (Agrawal et al., MLSys 2024) "Arxiv-Summarization-4K"
    "arxiv-summarization-4k": _measured(
        "arxiv-summarization-4k",
        28257,
        (1, 73, 749, 1242, 1986, 2730, 3370, 3702, 3813, 3933, 4054),
        (5, 36, 60, 78, 115, 167, 242, 372, 736, 3271, 4056),
        -0.1138,
        _VIDUR.format("arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"),
    ),
    # ShareGPT4 conversations (openchat's cleaned GPT-4 ShareGPT set: whole multi-turn
    # histories as prompts) tokenised with Llama-2's tokenizer and kept to 8k tokens, as
    # Sarathi-Serve (Agrawal et al., OSDI 2024) benchmarks it ("openchat_sharegpt4"; its
    # paper's medians 1730 / 415 and P90 5696 / 834 are this file's). Not vLLM's ShareGPT
    # benchmark, which takes first turns only (docs/workloads.md).
    "sharegpt4-8k": _measured(
        "sharegpt4-8k",
        30731,
        (1, 12, 29, 74, 580, 1730, 3734, 5696, 6563, 7434, 8141),
        (2, 6, 44, 84, 228, 415, 628, 834, 920, 998, 1024),
        0.0506,
        _SARATHI,
    ),
    # vLLM's and SGLang's serving benchmarks on ShareGPT (first turns of
    # ShareGPT_V3_unfiltered_cleaned_split, kept when 4 <= prompt <= 1024, output >= 4 and
    # prompt + output <= 2048). Not fetchable here: sharegpt4-8k's shape under that filter,
    # scaled to the published means 224 / 189 (sglang issue #2097's 1,200-prompt totals);
    # derived by `python -m calibrate.workloads.sharegpt_lengths` (an approximation of
    # the shape, exact in the means)
    "sharegpt": DatasetLengths(
        name="sharegpt",
        input=_quantiles("sharegpt", "input", (4, 7, 10, 15, 44, 157, 402, 514, 557, 595, 604)),
        output=_quantiles("sharegpt", "output", (4, 5, 22, 39, 99, 178, 273, 364, 404, 441, 454)),
        rho=_copula_rho(0.0231),
        source="vLLM benchmarks/datasets.py and sglang bench_serving's ShareGPT filter; "
        "means from sglang issue #2097 (269,081 / 226,923 tokens over 1,200 prompts); shape "
        "of sharegpt4-8k under the filter (calibrate/workloads/sharegpt_lengths.py)",
    ),
    # vLLM's benchmark generators at their defaults (vllm/benchmarks/datasets.py):
    # RandomDataset input 1024, output 128, range ratio 0 (every request the same) ...
    "random": DatasetLengths(
        name="random",
        input=FixedDist(length=1024),
        output=FixedDist(length=128),
        source="vLLM benchmarks/datasets.py RandomDataset defaults (DEFAULT_INPUT_LEN 1024, "
        "DEFAULT_OUTPUT_LEN 128, DEFAULT_RANGE_RATIO 0.0)",
    ),
    # ... and SonnetDataset: prompts of ~550 tokens of sonnet lines, 150 output tokens
    "sonnet": DatasetLengths(
        name="sonnet",
        input=FixedDist(length=550),
        output=FixedDist(length=150),
        source="vLLM benchmarks/datasets.py SonnetDataset defaults (DEFAULT_INPUT_LEN 550, "
        "DEFAULT_OUTPUT_LEN 150; the prompt is whole lines, so its length is approximate)",
    ),
}

_SHAPE_NOTE = (
    "synthetic shape (not measured data) mimicking the long-tail length figures of "
    "ByteScale (Ge et al. 2025), FlexSP (Wang et al. 2025) and Hydraulis (Li et al. 2025)"
)

CORPORA: dict[str, MixtureDist] = {
    # Web-text-like pre-training mix: median ~700 tokens, 84% of documents under 2k; a thin
    # tail (0.25% of documents above 32k, up to 128k) holding ~10% of the tokens, and the
    # documents above 8k ~30% of them.
    "longtail-128k": MixtureDist(
        name="longtail-128k",
        weights=(0.90, 0.097, 0.003),
        components=(
            LogNormalDist(median=600, sigma=0.9, max_len=32768),
            LogNormalDist(median=4096, sigma=0.8, max_len=131072),
            ZipfDist(theta=1.0, low=16384, high=131072),
        ),
        source=_SHAPE_NOTE,
    ),
    # Long-context mix (books, code repositories, long web pages up-sampled): median ~1k
    # tokens, 72% of documents under 2k; 1.5% of documents above 32k (up to 256k) hold ~40%
    # of the tokens, and the documents above 8k ~60% of them.
    "longtail-256k": MixtureDist(
        name="longtail-256k",
        weights=(0.85, 0.14, 0.01),
        components=(
            LogNormalDist(median=800, sigma=1.0, max_len=65536),
            LogNormalDist(median=6000, sigma=0.9, max_len=262144),
            ZipfDist(theta=0.8, low=32768, high=262144),
        ),
        source=_SHAPE_NOTE,
    ),
    # Chat / SFT-like mix: short conversations with a tail to 8k.
    "chat-8k": MixtureDist(
        name="chat-8k",
        weights=(0.8, 0.2),
        components=(
            LogNormalDist(median=350, sigma=0.8, max_len=8192),
            LogNormalDist(median=1800, sigma=0.6, max_len=8192),
        ),
        source="synthetic shape of short instruction/chat data (not measured)",
    ),
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _allowed() -> str:
    return f"{SYNTAX}, or a corpus ({', '.join(CORPORA)}); datasets: {', '.join(DATASETS)}"


def dataset(name: str) -> DatasetLengths:
    """A built-in dataset by name; an unknown one is one :class:`LengthError` line."""
    key = name.strip().lower()
    if key not in DATASETS:
        raise LengthError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}")
    return DATASETS[key]


def joint_dataset(prompt_len: str, output_len: str) -> DatasetLengths | None:
    """The dataset to draw (prompt, output) pairs from, correlated: when the prompt DIST is
    ``dataset:X[:input]`` and the output DIST ``dataset:X[:output]`` of the same X; else
    None (the two drawn independently)."""
    a, b = dataset_of(prompt_len), dataset_of(output_len)
    if a is None or a != b:
        return None
    pa = prompt_len.strip().lower().split(":")
    pb = output_len.strip().lower().split(":")
    if pa[2:] not in ([], ["input"]) or pb[2:] not in ([], ["output"]):
        return None
    return DATASETS[a]


def dataset_of(text: str) -> str | None:
    """The dataset a DIST string names (``dataset:NAME[:side]``, checked), or None."""
    raw = text.strip()
    if not raw.lower().startswith("dataset:"):
        return None
    name = raw[len("dataset:") :].partition(":")[0].strip().lower()
    dataset(name)
    return name


def _build(cls: type[_Dist], text: str, **fields: object) -> _Dist:
    try:
        return cls(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        what = f"{where}: {msg}" if where else msg
        raise LengthError(f"bad length distribution {text!r}: {what}; allowed: {SYNTAX}") from None


def _int_arg(text: str, name: str, raw: str) -> int:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not value.is_integer():
        raise LengthError(
            f"bad length distribution {text!r}: {name}={raw!r} is not an integer; allowed: {SYNTAX}"
        )
    return int(value)


def _float_arg(text: str, name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise LengthError(
            f"bad length distribution {text!r}: {name}={raw!r} is not a number; allowed: {SYNTAX}"
        )
    return value


_ARGS: dict[str, tuple[tuple[str, ...], int]] = {
    # kind: (argument names, how many are optional at the end)
    "fixed": (("N",), 0),
    "uniform": (("A", "B"), 0),
    "lognormal": (("MEDIAN", "SIGMA", "MAX"), 1),
    "zipf": (("THETA", "MIN", "MAX"), 0),
}


def parse_dist(text: str, side: Literal["input", "output"] = "input") -> LengthDist:
    """Parse a DIST string (see the module docstring); any problem is one :class:`LengthError`.
    ``side``: which lengths a ``dataset:NAME`` without ``:input``/``:output`` means (the
    serving options pass "output" for ``--output-len``)."""
    if not isinstance(text, str) or not text.strip():
        raise LengthError(f"empty length distribution; allowed: {_allowed()}")
    raw = text.strip()
    if raw in CORPORA:
        return CORPORA[raw]
    if raw.lower().startswith("dataset:"):
        name, _, which = raw[len("dataset:") :].partition(":")
        which = (which or side).strip().lower()
        if which not in ("input", "output"):
            raise LengthError(
                f"bad length distribution {raw!r}: side {which!r}; allowed: "
                "dataset:NAME, dataset:NAME:input, dataset:NAME:output"
            )
        d = dataset(name)
        return d.input if which == "input" else d.output  # type: ignore[return-value]
    if raw.lstrip("+").isdigit():
        return _build(FixedDist, raw, length=_int_arg(raw, "N", raw))  # type: ignore[return-value]
    kind, sep, rest = raw.partition(":")
    kind = kind.strip().lower()
    if kind == "csv" and sep:
        return load_histogram_csv(rest.strip())
    if kind not in _ARGS or not sep:
        raise LengthError(f"unknown length distribution {raw!r}; allowed: {_allowed()}")
    names, optional = _ARGS[kind]
    args = [a.strip() for a in rest.split(":")]
    if not len(names) - optional <= len(args) <= len(names) or any(a == "" for a in args):
        want = ":".join(names[: len(names) - optional])
        if optional:
            want += "[:" + ":".join(names[len(names) - optional :]) + "]"
        raise LengthError(
            f"bad length distribution {raw!r}: {kind} takes {kind}:{want}; allowed: {SYNTAX}"
        )
    if kind == "fixed":
        return _build(FixedDist, raw, length=_int_arg(raw, "N", args[0]))  # type: ignore[return-value]
    if kind == "uniform":
        a, b = (_int_arg(raw, n, v) for n, v in zip(names, args, strict=False))
        return _build(UniformDist, raw, low=a, high=b)  # type: ignore[return-value]
    if kind == "lognormal":
        median = _float_arg(raw, "MEDIAN", args[0])
        sigma = _float_arg(raw, "SIGMA", args[1])
        cap = _int_arg(raw, "MAX", args[2]) if len(args) == 3 else None
        return _build(LogNormalDist, raw, median=median, sigma=sigma, max_len=cap)  # type: ignore[return-value]
    theta = _float_arg(raw, "THETA", args[0])
    lo, hi = _int_arg(raw, "MIN", args[1]), _int_arg(raw, "MAX", args[2])
    return _build(ZipfDist, raw, theta=theta, low=lo, high=hi)  # type: ignore[return-value]


HIST_COLUMNS = ("length,count", "length_lo,length_hi,count")


def load_histogram_csv(path: str | Path) -> HistogramDist:
    """Read a length histogram: columns ``length,count`` (exact lengths) or
    ``length_lo,length_hi,count`` (inclusive bins, lengths uniform inside). Counts may be
    fractions (weights). Malformed files raise one :class:`LengthError` line naming the row."""
    p = Path(path)
    where = f"histogram CSV {p}"
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise LengthError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise LengthError(f"{where} is a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LengthError(f"{where} cannot be read: {str(exc).splitlines()[0]}") from None
    rows = [r for r in csv.reader(text.splitlines()) if any(c.strip() for c in r)]
    if not rows:
        raise LengthError(f"{where} is empty; allowed columns: {' or '.join(HIST_COLUMNS)}")
    header = tuple(c.strip().lower() for c in rows[0])
    if header == ("length", "count"):
        exact = True
    elif header == ("length_lo", "length_hi", "count"):
        exact = False
    else:
        raise LengthError(
            f"{where} has columns {','.join(header)!r}; allowed: {' or '.join(HIST_COLUMNS)}"
        )
    if len(rows) == 1:
        raise LengthError(f"{where} has a header but no rows")
    lows: list[int] = []
    highs: list[int] = []
    weights: list[float] = []
    for i, row in enumerate(rows[1:], start=2):
        cells = [c.strip() for c in row]
        if len(cells) != len(header):
            raise LengthError(
                f"{where} line {i}: {len(cells)} values, expected {len(header)} "
                f"({','.join(header)})"
            )
        lo = _hist_int(where, i, header[0], cells[0])
        hi = lo if exact else _hist_int(where, i, header[1], cells[1])
        try:
            w = float(cells[-1])
        except ValueError:
            w = math.nan
        if not math.isfinite(w) or w < 0:
            raise LengthError(
                f"{where} line {i}: count {cells[-1]!r} is invalid; allowed: a number >= 0"
            )
        if hi < lo:
            raise LengthError(
                f"{where} line {i}: length_lo={lo} > length_hi={hi}; allowed: lo <= hi"
            )
        lows.append(lo)
        highs.append(hi)
        weights.append(w)
    if sum(weights) <= 0:
        raise LengthError(f"{where}: all counts are zero; allowed: at least one positive count")
    return HistogramDist(
        lows=tuple(lows), highs=tuple(highs), weights=tuple(weights), source=str(p)
    )


def _hist_int(where: str, line: int, column: str, cell: str) -> int:
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not value.is_integer() or value < 1:
        raise LengthError(
            f"{where} line {line}: {column} {cell!r} is invalid; allowed: an integer >= 1"
        )
    return int(value)


def token_share_above(lengths: np.ndarray, threshold: int) -> float:
    """Fraction of the tokens in documents longer than ``threshold`` (for reports)."""
    total = float(np.sum(lengths))
    return float(np.sum(lengths[lengths > threshold])) / total if total > 0 else 0.0


__all__ = [
    "CORPORA",
    "DATASETS",
    "DatasetLengths",
    "QuantileDist",
    "dataset",
    "dataset_of",
    "joint_dataset",
    "FixedDist",
    "HistogramDist",
    "LengthDist",
    "LengthError",
    "LogNormalDist",
    "MixtureDist",
    "UniformDist",
    "ZipfDist",
    "load_histogram_csv",
    "parse_dist",
    "token_share_above",
]
