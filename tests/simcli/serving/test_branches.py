"""Multi-branch reasoning quality (simcli.serving.branches): the branch quality model, the
answer selection, and the accuracy/latency trade of early stopping and SART pruning."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from simcli.cli import app
from simcli.serving.branches import BranchConfig, branch_quality, select_answer


def _draw(cfg: BranchConfig, requests: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(requests):
        lengths = rng.integers(100, 4000, cfg.branches)
        answers, scores = branch_quality(cfg, lengths, rng.random(cfg.branches), rng)
        out.append((lengths, answers, scores))
    return out


def test_branch_accuracy_is_the_marginal_and_longer_branches_are_less_often_right():
    cfg = BranchConfig(branches=8, accuracy=0.6, length_correlation=-0.4)
    draws = _draw(cfg, 4000)
    correct = np.array([a == 0 for _, a, _ in draws])
    assert correct.mean() == pytest.approx(0.6, abs=0.01)
    shortest = np.mean([a[np.argmin(n)] == 0 for n, a, _ in draws])
    longest = np.mean([a[np.argmax(n)] == 0 for n, a, _ in draws])
    assert shortest > 0.6 > longest  # the direction Hassid et al. 2025 and SART report
    flat = _draw(BranchConfig(branches=8, length_correlation=0.0), 4000)
    assert np.mean([a[np.argmin(n)] == 0 for n, a, _ in flat]) == pytest.approx(0.6, abs=0.03)


def test_prm_noise_sets_how_well_scores_separate_right_from_wrong():
    for noise, lo in ((0.0, 1.0), (1.0, 0.85), (20.0, 0.45)):
        draws = _draw(BranchConfig(branches=8, prm_noise=noise), 2000)
        s = np.concatenate([sc for _, _, sc in draws])
        c = np.concatenate([a == 0 for _, a, _ in draws])
        auc = np.mean(s[c][:, None] > s[~c][None, :2000])  # P(right scores above wrong)
        assert auc >= lo - 1e-9 and (noise < 20 or auc < 0.6)


def test_select_answer_majority_and_prm_best():
    answers, scores = np.array([2, 0, 2, 0, 3]), np.array([0.1, 0.9, 0.2, 0.3, 0.95])
    assert select_answer(answers, scores, "majority") == 0  # tie 2 vs 2: best score 0.9
    assert select_answer(answers, scores, "prm-best") == 3
    assert select_answer(np.array([1, 1, 0]), np.array([0.1, 0.1, 0.9]), "majority") == 1


def test_bad_quality_config():
    with pytest.raises(ValueError, match="rho_q"):
        BranchConfig(branches=4, question_correlation=0.9, length_correlation=-0.5)


# --------------------------------------------------------------------------- through serve

BASE = ("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "4", "--num-requests",
        "300", "--output-len", "lognormal:800:1:4000", "--branches", "8", "--format", "json",
        "--quiet")  # fmt: skip


def _serve(*args: str) -> dict:
    res = CliRunner().invoke(app, [*BASE, *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_early_stopping_trades_accuracy_for_latency():
    """First M of N: M = 1 is the fastest and answers from one branch (the shortest, more
    often right than a random one); a vote over M = 2..4 early finishers beats it, and
    waiting for all 8 is slowest. Default quality model (accuracy 0.6)."""
    runs = {m: _serve("--branches-stop", str(m)) for m in (1, 2, 4, 8)}
    e2e = [runs[m]["e2e_s_p50"] for m in (1, 2, 4, 8)]
    assert e2e == sorted(e2e) and e2e[0] < e2e[-1] / 10
    acc = {m: runs[m]["answer_accuracy"] for m in runs}
    assert acc[1] > 0.6  # the shortest branch beats a random one (length correlation < 0)
    assert acc[2] > acc[1] and acc[4] > acc[1]  # voting helps
    assert acc[8] > 0.6  # self-consistency beats one branch
    assert runs[1]["finished_branch_accuracy"] > runs[8]["finished_branch_accuracy"]


def test_sart_pruning_accuracy_falls_as_it_gets_aggressive_with_a_noisy_prm():
    stop = ("--branches-stop", "2")
    base = _serve(*stop)
    noisy = [
        _serve(*stop, "--prune", "sart", "--prune-threshold", t, "--prm-noise", "3")
        for t in ("0.2", "0.5", "0.8")
    ]
    acc = [r["answer_accuracy"] for r in noisy]
    pruned = [r["branches_pruned"] for r in noisy]
    assert pruned == sorted(pruned) and acc[-1] < acc[0] <= base["answer_accuracy"] + 0.02
    exact = _serve(*stop, "--prune", "sart", "--prm-noise", "0")
    assert exact["answer_accuracy"] > base["answer_accuracy"]  # a perfect PRM prunes wrong ones
    assert exact["answer_selection"] == "majority"


def test_prm_best_selection_and_no_branches_have_no_accuracy():
    """A perfect PRM's pick is right whenever one of the M finished branches is: above the
    vote over the same branches."""
    exact = ("--branches-stop", "4", "--prm-noise", "0")
    best = _serve(*exact, "--answer-selection", "prm-best")
    vote = _serve(*exact)
    assert (
        best["answer_accuracy"] > vote["answer_accuracy"] and best["e2e_s_p50"] == vote["e2e_s_p50"]
    )
    res = CliRunner().invoke(app, [*BASE[:9], "--format", "json", "--quiet"])
    assert json.loads(res.output)["answer_accuracy"] is None


@pytest.mark.parametrize(
    "args, message",
    [
        (("--branches", "1", "--branch-accuracy", "0.5"), "--branch-accuracy needs --branches"),
        (("--branch-accuracy", "1.5"), "--branch-accuracy 1.5 is invalid"),
        (("--prm-noise", "-1"), "--prm-noise -1"),
        (("--answer-selection", "vote"), "--answer-selection"),
        (
            ("--branch-question-correlation", "0.9", "--branch-length-correlation", "-0.5"),
            "squared > 1",
        ),
    ],
)
def test_bad_branch_options_are_one_line_exit_2(args, message):
    res = CliRunner().invoke(app, [*BASE, *args])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in res.output
