"""The optional decoding features of ``simcli serve`` resolved from its options: speculative
decoding (draft model, SpecTr drafts, TriForce's retrieval draft and tiny model) and
multi-branch reasoning (early stopping, SART pruning, the branch quality model). Kept apart
from :mod:`simcli.scenario.serving_options` so that the options stay a list of fields."""

from __future__ import annotations

from typing import Any

from simcli.serving.branches import BranchConfig
from simcli.serving.spec import SpecConfig

# the options are a simcli.scenario.serving_options.ServeOptions, which imports this module:
# annotated as Any so that the import graph stays acyclic
ServeOptions = Any


def spec_config(o: ServeOptions) -> SpecConfig | None:
    """The speculative-decoding config of ``--draft-model``, ``--triforce-*`` and ``--spec-*``."""
    k, acceptance, per_position = o.spec_k, o.spec_acceptance, None
    triforce = o.triforce_kv_budget is not None
    if triforce and o.draft_model is not None:
        raise ValueError(
            "--triforce-kv-budget with --draft-model: TriForce's draft is the target over "
            "its retrieval cache; allowed: one of the two (--spec-hierarchy: the tiny model)"
        )
    if not triforce:
        for flag, value in (
            ("--triforce-chunk-size", o.triforce_chunk_size),
            ("--triforce-tiny-cache", o.triforce_tiny_cache),
        ):
            if value is not None:
                raise ValueError(f"{flag} needs --triforce-kv-budget")
    if o.draft_model is None and not triforce:
        for flag, value in (
            ("--spec-k", o.spec_k),
            ("--spec-acceptance", o.spec_acceptance),
            ("--spec-acceptance-per-position", o.spec_acceptance_per_position),
            ("--spec-drafts", o.spec_drafts),
            ("--spectr-acceptance", o.spectr_acceptance),
            ("--spec-hierarchy", o.spec_hierarchy),
            ("--spec-tiny-k", o.spec_tiny_k),
            ("--spec-tiny-acceptance", o.spec_tiny_acceptance),
        ):
            if value is not None:
                raise ValueError(f"{flag} needs --draft-model (the model that drafts the tokens)")
        return None
    if o.spectr_acceptance is not None and (o.spec_drafts or 1) < 2:
        raise ValueError("--spectr-acceptance needs --spec-drafts N (N > 1)")
    if triforce and o.spec_hierarchy is None and o.triforce_tiny_cache is not None:
        raise ValueError("--triforce-tiny-cache needs --spec-hierarchy (the tiny model)")
    if o.spec_hierarchy is None:
        for flag, value in (
            ("--spec-tiny-k", o.spec_tiny_k),
            ("--spec-tiny-acceptance", o.spec_tiny_acceptance),
        ):
            if value is not None:
                raise ValueError(f"{flag} needs --spec-hierarchy (the tiny model)")
    if acceptance is not None and o.spec_acceptance_per_position is not None:
        raise ValueError("give --spec-acceptance or --spec-acceptance-per-position, not both")
    if o.spec_acceptance_per_position is not None:
        per_position = unit_floats("--spec-acceptance-per-position", o.spec_acceptance_per_position)
        if k is not None and len(per_position) != k:
            raise ValueError(
                f"--spec-acceptance-per-position has {len(per_position)} values for --spec-k "
                f"{k}; allowed: one value per draft position"
            )
        k = len(per_position)
    # TriForce's defaults: gamma = 6 tokens of the retrieval draft per target
    # verification and one tiny token per retrieval verification (Middle_Spec of the
    # authors' code, test/on_chip.py --gamma 6), a retrieval draft accepted above 0.9
    # (the paper's robustness result, Sun et al. COLM 2024)
    default_acc, default_k, default_tiny_k = (0.9, 6, 1) if triforce else (0.7, 4, 2)
    rates = per_position or (default_acc if acceptance is None else acceptance,)
    hier = o.spec_hierarchy is not None
    return SpecConfig(
        k=k or default_k,
        acceptance=rates,
        drafts=o.spec_drafts or 1,
        spectr=o.spectr_acceptance or "kseq",
        tiny_k=(o.spec_tiny_k or default_tiny_k) if hier else 0,
        tiny_acceptance=0.6 if o.spec_tiny_acceptance is None else o.spec_tiny_acceptance,
        retrieval_budget=o.triforce_kv_budget,
        retrieval_chunk=o.triforce_chunk_size or 8,
        tiny_cache=(o.triforce_tiny_cache or 256) if triforce and hier else None,
    )


def branch_config(o: ServeOptions) -> BranchConfig | None:
    """The multi-branch config of ``--branches`` and ``--prune*`` (output lengths of the
    extra branches are the workload's, added by the resolver)."""
    n, stop, prune = o.branches, o.branches_stop, o.prune
    if stop is not None and stop > n:
        raise ValueError(
            f"--branches-stop {stop} > --branches {n}; allowed: 1 <= --branches-stop <= --branches"
        )
    tuning = (
        ("--prune-interval", o.prune_interval),
        ("--prune-threshold", o.prune_threshold),
        ("--prune-max", o.prune_max),
    )
    quality = (
        ("--branch-accuracy", o.branch_accuracy),
        ("--branch-length-correlation", o.branch_length_correlation),
        ("--branch-question-correlation", o.branch_question_correlation),
        ("--prm-noise", o.prm_noise),
        ("--branch-wrong-answers", o.branch_wrong_answers),
        ("--answer-selection", o.answer_selection),
    )
    if n == 1:
        for flag, value in (("--prune", prune), *tuning, *quality):
            if value is not None:
                raise ValueError(f"{flag} needs --branches N (N > 1)")
        return None
    rq = 0.5 if o.branch_question_correlation is None else o.branch_question_correlation
    rl = -0.3 if o.branch_length_correlation is None else o.branch_length_correlation
    if rq + rl * rl > 1.0:
        raise ValueError(
            f"--branch-question-correlation {rq} + --branch-length-correlation {rl} "
            "squared > 1; allowed: their sum (the second squared) <= 1"
        )
    if (prune or "none") == "none":
        for flag, value in tuning:
            if value is not None:
                raise ValueError(f"{flag} needs --prune sart")
    return BranchConfig(
        branches=n,
        stop_after=stop,
        prune=prune or "none",
        prune_interval=o.prune_interval or 64,
        prune_threshold=0.2 if o.prune_threshold is None else o.prune_threshold,
        prune_max=o.prune_max,
        accuracy=0.6 if o.branch_accuracy is None else o.branch_accuracy,
        length_correlation=rl,
        question_correlation=rq,
        prm_noise=1.0 if o.prm_noise is None else o.prm_noise,
        wrong_answers=o.branch_wrong_answers or 4,
        answer=o.answer_selection or "majority",
    )


def unit_floats(flag: str, text: str) -> tuple[float, ...]:
    """``0.9,0.8`` -> (0.9, 0.8), each in [0, 1]."""
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not (0.0 <= v <= 1.0) for v in values):
        raise ValueError(f"{flag} {text!r} is invalid; allowed: comma-separated numbers in [0, 1]")
    return values


__all__ = ["branch_config", "spec_config", "unit_floats"]
