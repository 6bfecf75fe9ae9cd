"""SpecTr's k-sequential acceptance and TriForce's retrieval/StreamingLLM drafts
(simcli.serving.spec), and their serve options."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from simcli.cli import app
from simcli.serving.spec import (
    RetrievalDraft,
    SpecConfig,
    SpecCost,
    StreamingDraft,
    kseq_acceptance,
    kseq_acceptance_dists,
    spec_kv_capacity_tokens,
    two_class,
)

E = np.zeros(0, dtype=np.int64)
TARGET = "examples/models/yarn-llama-2-7b-128k.config.json"
TINY = "examples/models/jackfram-llama-68m.config.json"


# --------------------------------------------------------------------------- SpecTr K-SEQ


def test_kseq_lies_between_one_draft_and_the_independent_bound_and_grows():
    grid = np.linspace(0.02, 0.98, 25)
    for n in range(1, 9):
        acc = np.array([kseq_acceptance(a, n) for a in grid])
        assert np.all(acc >= grid - 1e-12)
        assert np.all(acc <= 1 - (1 - grid) ** n + 1e-12)
        assert np.all(np.diff(acc) > 0)  # monotone in the single-draft acceptance
        if n > 1:
            prev = np.array([kseq_acceptance(a, n - 1) for a in grid])
            assert np.all(acc > prev)  # and in the drafts
            assert np.all(acc < 1 - (1 - grid) ** n)  # strictly below the bound (model M)
    assert kseq_acceptance(0.7, 2) == pytest.approx(0.84, abs=1e-3)  # the docstring's figure


def test_kseq_bounds_hold_for_any_distributions():
    rng = np.random.default_rng(1)
    for _ in range(200):
        v = int(rng.integers(2, 12))
        p, q = rng.dirichlet(np.full(v, 0.5)), rng.dirichlet(np.full(v, 0.5))
        a = float(np.minimum(p, q).sum())
        for n in (2, 3, 5):
            alpha, rho = kseq_acceptance_dists(p, q, n)
            assert a - 1e-9 <= alpha <= 1 - (1 - a) ** n + 1e-9
            assert 1.0 <= rho <= n


def _run_kseq(p, q, n, rho, trials, rng):
    """SpecTr's K-SEQ on explicit distributions: (acceptance rate, output histogram)."""
    beta = np.minimum(q, p / rho).sum()
    alpha = 1 - (1 - beta) ** n
    residual = np.maximum(p - np.minimum(q, p / rho) * alpha / beta, 0.0)
    residual /= residual.sum()
    drafts = rng.choice(len(q), size=(trials, n), p=q)
    ratio = np.minimum(1.0, p[drafts] / (rho * q[drafts]))
    passed = rng.random((trials, n)) < ratio
    first = passed.argmax(axis=1)
    accepted = passed.any(axis=1)
    out = np.where(accepted, drafts[np.arange(trials), first], 0)
    out[~accepted] = rng.choice(len(p), size=int((~accepted).sum()), p=residual)
    return accepted.mean(), np.bincount(out, minlength=len(p)) / trials


def test_kseq_closed_form_matches_the_algorithm_and_is_lossless():
    """Monte Carlo of Algorithm K-SEQ at rho*: its acceptance is (K1) and its output follows
    the target exactly, on the model-M pair and on a random pair."""
    rng = np.random.default_rng(7)
    pairs = [two_class(0.6), (rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6)))]
    for p, q in pairs:
        for n in (2, 4):
            alpha, rho = kseq_acceptance_dists(p, q, n)
            rate, hist = _run_kseq(p, q, n, rho, 200_000, rng)
            assert rate == pytest.approx(alpha, abs=0.005)
            assert hist == pytest.approx(p, abs=0.005)


def test_spec_config_uses_kseq_for_several_drafts_and_keeps_the_bound_selectable():
    one = SpecConfig(k=3, acceptance=(0.7,))
    assert list(one.per_position) == pytest.approx([0.7] * 3)  # one draft: unchanged
    kseq = SpecConfig(k=3, acceptance=(0.7,), drafts=2)
    bound = SpecConfig(k=3, acceptance=(0.7,), drafts=2, spectr="independent-bound")
    assert list(kseq.per_position) == pytest.approx([kseq_acceptance(0.7, 2)] * 3)
    assert list(bound.per_position) == pytest.approx([0.91] * 3)
    assert one.expected_accepted < kseq.expected_accepted < bound.expected_accepted


# --------------------------------------------------------------------------- TriForce


class LongStep:
    """Decode seconds = weights read + KV read (a memory-bound long-context decode)."""

    kv_bytes_per_token = 524288.0
    weight_bytes = 13.5e9
    gpus = 1

    def __init__(self, weights_s=0.004, per_token_s=1.6e-7):
        self.weights_s, self.per_token_s = weights_s, per_token_s

    def step_s(self, new, past, ctx) -> float:
        t = self.weights_s + self.per_token_s * float(np.sum(ctx))
        if len(new):
            t += 1e-5 * float(np.sum(new))
        return t

    def verify_step_s(self, ctx, k: int) -> float:
        return self.step_s(E, E, ctx) + 2e-5 * k * len(ctx)

    def kv_capacity_tokens(self, block_size, util) -> int:
        return 150_000


class TinyStep(LongStep):
    kv_bytes_per_token = 3072.0
    weight_bytes = 0.14e9

    def __init__(self):
        super().__init__(weights_s=1e-4, per_token_s=1e-9)


def test_retrieval_draft_reads_only_the_budget_and_triforce_beats_self_speculation():
    target, tiny = LongStep(), TinyStep()
    ctx = np.array([100_000, 60_000])
    retr = RetrievalDraft(target, budget=4096, chunk=8, seats=4)
    assert retr.step_s(E, E, ctx) == pytest.approx(target.step_s(E, E, np.array([4096, 4096])))
    assert retr.step_s(np.array([100]), np.array([0]), E) == 0.0  # prefill: the target's own
    assert retr.rebuild_s(ctx) == pytest.approx(target.per_token_s * (12_500 + 7_500 - 2))
    stream = StreamingDraft(tiny, window=256, seats=4)
    assert stream.step_s(E, E, ctx) == pytest.approx(tiny.step_s(E, E, np.array([256, 256])))
    tri = SpecConfig(k=6, acceptance=(0.9,), tiny_k=1, retrieval_budget=4096, tiny_cache=256)
    self_spec = SpecConfig(k=6, acceptance=(0.9,), tiny_k=1)  # the target drafting, full KV
    t_tri = SpecCost(tri, target, retr, stream).iteration_s(E, E, ctx)
    t_self = SpecCost(self_spec, target, target, tiny).iteration_s(E, E, ctx)
    plain = 6 * target.step_s(E, E, ctx)  # ~E[tokens] plain decode steps
    assert t_tri < t_self and t_tri < plain
    # a short context: the budget holds it all and retrieval buys nothing
    short = np.array([2000])
    assert retr.step_s(E, E, short) == target.step_s(E, E, short)


def test_triforce_caches_are_reserved_per_seat_before_the_paged_cache():
    target, tiny = LongStep(), TinyStep()
    plain = spec_kv_capacity_tokens(target, [], 16, 0.9)
    retr = RetrievalDraft(target, budget=4096, chunk=8, seats=4)
    stream = StreamingDraft(tiny, window=256, seats=4)
    assert retr.cache_bytes_per_gpu() == 4 * 4096 * target.kv_bytes_per_token
    with_caches = spec_kv_capacity_tokens(target, [retr, stream], 16, 0.9)
    reserved = 4 * 4096 * target.kv_bytes_per_token + tiny.weight_bytes + 4 * 256 * 3072
    assert plain - with_caches == pytest.approx(reserved / target.kv_bytes_per_token, abs=32)
    with pytest.raises(ValueError, match="TriForce's draft caches"):
        spec_kv_capacity_tokens(target, [RetrievalDraft(target, 4096, 8, seats=64)], 16, 0.9)


# --------------------------------------------------------------------------- CLI

BASE = ("serve", "--gpu", "h100-sxm", "--qps", "0.2", "--num-requests", "12", "--output-len",
        "fixed:128", "--max-batch-size", "4", "--format", "json", "--quiet")  # fmt: skip


def _serve(*args: str):
    return CliRunner().invoke(app, [*BASE, *args])


def test_cli_triforce_reports_both_levels_and_the_cache_memory():
    res = _serve("--model", TARGET, "--prompt-len", "fixed:60000", "--triforce-kv-budget",
                 "4096", "--spec-hierarchy", TINY)  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["triforce_kv_budget"] == 4096 and out["spec_k"] == 6
    assert out["triforce_acceptance"] == pytest.approx(0.9)
    assert out["triforce_tiny_acceptance"] == pytest.approx(0.6)
    # 4 seats x 4096 tokens x 512 KiB of Llama2-7B KV per token = 8 GiB
    assert out["triforce_retrieval_cache_gib_per_gpu"] == pytest.approx(8.0)
    assert out["triforce_tiny_cache_gib_per_gpu"] == pytest.approx(
        4 * 256 * 2 * 2 * 768 * 2 / 2**30
    )
    assert out["spec_acceptance_per_position"] == "0.9,0.9,0.9,0.9,0.9,0.9"
    assert out["draft_model"] == out["model"]  # the target drafts for itself


def test_cli_spectr_acceptance_modes():
    common = ("--model", "llama2-7b", "--prompt-len", "fixed:512", "--draft-model", TINY,
              "--spec-drafts", "3", "--spec-acceptance", "0.6")  # fmt: skip
    kseq = json.loads(_serve(*common).output)
    bound = json.loads(_serve(*common, "--spectr-acceptance", "independent-bound").output)
    assert kseq["spectr_acceptance"] == "kseq" and kseq["spec_acceptance_single"] == 0.6
    k = float(kseq["spec_acceptance_per_position"].split(",")[0])
    b = float(bound["spec_acceptance_per_position"].split(",")[0])
    assert 0.6 < k < b == pytest.approx(1 - 0.4**3, abs=1e-3)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--triforce-chunk-size", "8"), "--triforce-chunk-size needs --triforce-kv-budget"),
        (("--triforce-kv-budget", "4096", "--draft-model", TINY), "--triforce-kv-budget with"),
        (("--triforce-kv-budget", "0"), "--triforce-kv-budget 0 is invalid"),
        (("--draft-model", TINY, "--spectr-acceptance", "kseq"), "needs --spec-drafts N"),
        (
            ("--draft-model", TINY, "--spec-drafts", "2", "--spectr-acceptance", "best"),
            "--spectr-acceptance",
        ),
        (("--spectr-acceptance", "kseq"), "--spectr-acceptance needs --draft-model"),
        (
            ("--triforce-kv-budget", "4096", "--triforce-tiny-cache", "256"),
            "needs --spec-hierarchy",
        ),
    ],
)
def test_cli_bad_spec_options_are_one_line_exit_2(args, message):
    res = _serve("--model", "llama2-7b", *args)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in res.output
