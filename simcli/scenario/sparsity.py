"""Sparsity what-ifs: the inputs of ``simcli sparsity compare`` as a pydantic config,
resolved once (model, sequence lengths, GQA groups, the pricer and its hardware) and run
through :mod:`simcli.sparsity.whatif`.

:class:`SparsityConfig` *is* the command's options (:func:`simcli.options.config_options`),
so the CLI, the JSON schema and a sweep's parameters come from the same fields.
:func:`run_sparsity` returns a :class:`SparsityRun` whose ``to_dict()`` is the JSON object
the command prints with ``--format json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simcli.scenario.hardware import resolve_hardware
from simcli.sparsity.gemm import check_sparsity_options, gemm_break_even_rows
from simcli.sparsity.whatif import COLUMNS, SparsityPricer, WhatIfError, split_patterns, sweep
from workloads.models import ModelConfig, load_model
from workloads.sparsity import ALLOWED, parse_pattern

DEFAULT_PATTERNS = "dense,window:4096,nsa,s2:local=8,stride=8"


class SparsityConfig(BaseModel):
    """``simcli sparsity compare``: what each attention pattern buys over dense."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: str = Field(description="Built-in model id or config.json.")
    gpu: str = Field(description="GPU id (see `simcli specs list`).")
    seq_len: int | None = Field(None, description="Tokens per sequence.")
    seq_lens: str | None = Field(
        None, description="Sweep: comma list of sequence lengths, e.g. 8192,32768,131072."
    )
    patterns: str = Field(
        DEFAULT_PATTERNS,
        description=f"Comma (or ;) list of patterns; dense is the baseline. Syntax: {ALLOWED}.",
    )
    tp: int = Field(1, description="Tensor-parallel degree (serving and training).")
    batch: int = Field(1, description="Sequences per prefill and decode step.")
    context_len: int | None = Field(
        None, description="KV cache tokens at the decode step (default: seq len)."
    )
    gqa_groups: str | None = Field(
        None,
        description="Sweep: query heads per KV head, e.g. 1,4,8 (num_kv_heads = num_heads / G).",
    )
    train_gpus: int | None = Field(
        None, description="GPUs of the training plan (default: --tp, one TP group)."
    )
    global_batch: int | None = Field(
        None, description="Sequences per training iteration (default: one per DP rank)."
    )
    micro_batch: int = Field(1, description="Training micro-batch.")
    recompute: str = Field("none", description="none | selective | full")
    kernels_only: bool = Field(False, description="Skip prefill, decode-step and training columns.")
    weight_sparsity: str | None = Field(
        None,
        description="Linear-layer weight sparsity: 2:4 | unstructured:S (S = zero fraction). "
        "Adds gemm_break_even rows: per layer, the tokens per step where the sparse GEMM "
        "starts or stops beating dense.",
    )
    activation_sparsity: str | None = Field(
        None,
        description="MLP activation sparsity: cats:F (F = active neurons per token). Adds "
        "gemm_break_even rows for the MLP layers.",
    )


def comma_ints(text: str | None, flag: str) -> list[int] | None:
    """A comma list of integers >= 1 (``8192,32768``); None or blank text is None."""
    if text is None or not text.strip():
        return None
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise WhatIfError(
            f"{flag} {text!r} is not a comma list of integers; allowed: e.g. 8192,32768"
        ) from None
    if not out or min(out) < 1:
        raise WhatIfError(f"{flag} {text!r}: allowed: integers >= 1")
    return out


@dataclass(frozen=True)
class SparsityScenario:
    """``simcli sparsity compare`` resolved: the model, the lengths and GQA groups to
    price, and the pricer (its dense cost models resolved per GPU count)."""

    config: SparsityConfig
    model: ModelConfig
    seq_lens: tuple[int, ...]
    gqa_groups: tuple[int, ...] | None
    pricer: SparsityPricer

    def inputs(self) -> dict[str, Any]:
        """The options as resolved (the report bundle's config.json)."""
        c = self.config
        return {
            "model": c.model,
            "gpu": c.gpu,
            "seq_lens": list(self.seq_lens),
            "patterns": c.patterns,
            "tp": c.tp,
            "batch": c.batch,
            "context_len": c.context_len,
            "gqa_groups": None if self.gqa_groups is None else list(self.gqa_groups),
            "train_gpus": c.train_gpus,
            "global_batch": c.global_batch,
            "micro_batch": c.micro_batch,
            "recompute": c.recompute,
            "kernels_only": c.kernels_only,
            "weight_sparsity": c.weight_sparsity,
            "activation_sparsity": c.activation_sparsity,
        }


def resolve_sparsity(config: SparsityConfig) -> SparsityScenario:
    """Exactly one of ``seq_len`` / ``seq_lens``, the GQA groups, the model and the pricer;
    bad input is one :class:`ValueError` line."""
    c = config
    if (c.seq_len is None) == (c.seq_lens is None):
        raise WhatIfError("give exactly one of --seq-len N or --seq-lens N1,N2,...")
    seqs = [c.seq_len] if c.seq_len is not None else comma_ints(c.seq_lens, "--seq-lens")
    if not seqs:
        raise WhatIfError(
            f"--seq-lens {c.seq_lens!r} is not a comma list of integers; allowed: e.g. 8192,32768"
        )
    groups = comma_ints(c.gqa_groups, "--gqa-groups")
    check_sparsity_options(c.weight_sparsity, c.activation_sparsity)
    model = load_model(c.model)
    gpu = c.gpu
    pricer = SparsityPricer(gpu, cost_models=lambda n: resolve_hardware(gpu, n).cost_model)
    return SparsityScenario(
        config=c,
        model=model,
        seq_lens=tuple(dict.fromkeys(seqs)),
        gqa_groups=None if groups is None else tuple(groups),
        pricer=pricer,
    )


@dataclass(frozen=True)
class SparsityRun:
    """The rows of every (sequence length, GQA group, pattern), the kernel-only rows of
    any extra ``curve_lens`` (the report's speedup curves) and the JSON object's header."""

    scenario: SparsityScenario
    rows: list[dict[str, Any]]
    curve_rows: list[dict[str, Any]]
    meta: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``simcli sparsity compare``: the header and its ``rows``."""
        return {**self.meta, "rows": [dict(r) for r in self.rows]}


def run_sparsity(
    scenario: SparsityScenario,
    *,
    curve_lens: tuple[int, ...] | list[int] = (),
    progress: Callable[[int], None] | None = None,
) -> SparsityRun:
    """Price every sequence length (timed: ``seconds``), then the kernel-only rows of
    ``curve_lens``; ``progress(done)`` after each length, of
    ``len(seq_lens) + len(curve_lens)``."""
    s, c = scenario, scenario.config
    common = {
        "gqa_groups": None if s.gqa_groups is None else list(s.gqa_groups),
        "tp": c.tp,
        "batch": c.batch,
        "pricer": s.pricer,
    }
    end_to_end = {
        "context_len": c.context_len,
        "train_gpus": c.train_gpus,
        "global_batch": c.global_batch,
        "micro_batch": c.micro_batch,
        "recompute": c.recompute,
        "end_to_end": not c.kernels_only,
    }
    # AdaSpa's per-head densities need scipy, which workloads.sparsity imports where used:
    # loaded before the clock, so that ``seconds`` times the pricing only
    import scipy.special  # noqa: F401

    # a model with local layers of its own (gpt-oss, Gemma, Llama 4) is compared with them
    patterns: list[str] = split_patterns(c.patterns)
    native = s.model.native_attn_pattern
    if native is not None and native not in {parse_pattern(p).spec for p in patterns}:
        patterns.append(native)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for i, seq in enumerate(s.seq_lens):  # one length at a time, so a progress bar moves
        rows += sweep(s.model, c.gpu, [seq], patterns, **end_to_end, **common)
        if progress is not None:
            progress(i + 1)
    seconds = time.perf_counter() - t0
    curve_rows: list[dict[str, Any]] = []
    for j, seq in enumerate(curve_lens):  # kernels only: the curves of the report
        curve_rows += sweep(s.model, c.gpu, [seq], patterns, end_to_end=False, **common)
        if progress is not None:
            progress(len(s.seq_lens) + j + 1)
    meta = {
        "model": s.model.id,
        "gpu": c.gpu,
        "cost_model": getattr(s.pricer.cost_model(c.tp), "label", ""),
        "seconds": seconds,
        "columns": COLUMNS,
    }
    weight, activation = check_sparsity_options(c.weight_sparsity, c.activation_sparsity)
    if weight or activation:  # only then: the object is unchanged without the options
        meta["gemm_break_even"] = gemm_break_even_rows(s.model, c.gpu, c.tp, weight, activation)
    return SparsityRun(scenario=s, rows=rows, curve_rows=curve_rows, meta=meta)


__all__ = [
    "DEFAULT_PATTERNS",
    "SparsityConfig",
    "SparsityRun",
    "SparsityScenario",
    "comma_ints",
    "resolve_sparsity",
    "run_sparsity",
]
