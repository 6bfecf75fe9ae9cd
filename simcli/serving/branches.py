"""Multi-branch reasoning: N sampled branches per request sharing the prompt's KV, early
stopping when M finish, and SART-style two-phase pruning.

**Branches** (self-consistency, Wang et al. ICLR 2023; parallel sampling in vLLM): a
request's prompt is prefilled once; at the end of that prefill it forks into ``N`` branches
that each got their first token from the same logits. The prompt's full KV blocks are
shared by all branches (ref-counted, a :class:`ForkGroup`, beside any shared-prefix cache
entry); its last, partly filled block is copied for each branch (copy-on-write, as vLLM
does when a branch first appends to a shared partial block), so a root is admitted with
``N - 1`` extra blocks for those copies and ``N`` batch seats. Each branch then decodes as
its own sequence: its KV grows privately, it can be preempted (recompute re-prefills it
alone, without sharing; swap moves all its blocks) and it finishes on its own.

**Lengths.** Branch 0 keeps the request's output length; branches 1..N-1 draw theirs from
the output-length distribution (or, replaying a trace, from the trace's output lengths) --
from a generator seeded by ``(seed, request id)``, so a request's branches are the same
whatever the policy or the load.

**Quality** (:func:`branch_quality`). Each branch reaches a correct answer or one of
``wrong_answers`` wrong ones, through a Gaussian latent (a probit model):

    z_i = sqrt(rho_q) d + rho_L g_i + sqrt(1 - rho_q - rho_L^2) e_i,   correct iff
    z_i > Phi^-1(1 - accuracy),

with ``d ~ N(0, 1)`` the question's ease shared by its branches (``rho_q``,
``question_correlation``: self-consistency's gain saturates because branches of a hard
question fail together), ``g_i`` the normal score of the branch's length rank among the
request's branches, scaled to unit variance (``rho_L``, ``length_correlation`` < 0: longer
branches of the same question are less often correct, as Hassid et al. 2025 and SART
report), and ``e_i ~ N(0, 1)``. So a branch is correct with probability ``accuracy`` (exactly
when its lengths differ) and the correlations are those of the latent. A process reward
model scores each branch ``q_i = Phi(2 c_i - 1 + prm_noise * Phi^-1(u_i))`` (``c_i`` in
{0, 1}, ``u_i ~ U(0, 1)``): ``prm_noise`` 0 separates right from wrong perfectly, large
values make the scores a coin toss. The PRM's own compute is not modelled.

**Answer.** When a request completes, its answer is selected from its finished branches:
``majority`` (self-consistency's vote, as SART and short-m@k select; a tie goes to the
answer whose best branch scores higher) or ``prm-best`` (the best-scored branch).
``answer_accuracy`` is the fraction of requests answered right, next to their latency:
early stopping keeps the first M to finish (the short ones, more often right) and pruning
drops low-scored branches (more often wrong, but with a noisy PRM also right ones).

**Early stopping** (SART, Wang et al. 2025, "Thinking Short and Right Over Thinking Long",
redundant sampling with early stopping): the request completes when ``M`` branches have
finished; the rest are cancelled and their KV freed at once. ``M = N`` without pruning is
plain self-consistency (wait for every branch).

**Two-phase pruning** (``prune = "sart"``, SART's dynamic branch pruning): every
``prune_interval`` decode iterations a process reward model scores the live branches (here:
each branch's score ``q``, above). Phase 1 (exploration,
until the first branch finishes) prunes branches scoring below a low threshold
``prune_threshold`` (alpha), at most ``prune_max`` (beta) over the request's life. Phase 2
starts when the first branch finishes: the threshold becomes that branch's score (alpha'),
the cap is lifted, and live branches are pruned at once and at every later check. Pruning
never leaves fewer live branches than are still needed to reach ``M``.

**Accounting.** TTFT is the first token of the first branch (the prefill's end); e2e is
when the M-th branch finishes; TPOT is over the M-th finished branch's tokens. Output
tokens counted in throughput are those of the finished branches; the tokens of pruned and
cancelled branches are reported separately.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcli.serving.requests import (
    CANCELLED,
    DECODING,
    FINISHED,
    PREFILLING,
    SWAPPED,
    WAITING,
    Request,
    Sequence,
)
from workloads.lengths import LengthDist

if TYPE_CHECKING:
    from simcli.serving.engine import Engine


class BranchConfig(BaseModel):
    """Multi-branch reasoning for every request."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    branches: int = Field(default=1, ge=1, le=1024, description="N: branches per request")
    stop_after: int | None = Field(
        default=None, ge=1, description="M: finished branches that complete a request (N)"
    )
    prune: Literal["none", "sart"] = "none"
    prune_interval: int = Field(default=64, ge=1, description="decode iterations between checks")
    prune_threshold: float = Field(default=0.2, ge=0, le=1, description="phase-1 alpha")
    prune_max: int | None = Field(
        default=None, ge=0, description="phase-1 beta: most branches pruned (default N - M)"
    )
    output_len: LengthDist | None = Field(
        default=None, description="branch output lengths (default: the trace's, or the request's)"
    )
    accuracy: float = Field(
        default=0.6, ge=0, le=1, description="probability that one branch answers right"
    )
    length_correlation: float = Field(
        default=-0.3, ge=-1, le=1, description="latent correlation of correctness with length"
    )
    question_correlation: float = Field(
        default=0.5, ge=0, lt=1, description="latent correlation of a question's branches"
    )
    prm_noise: float = Field(default=1.0, ge=0, le=100, description="PRM score noise")
    wrong_answers: int = Field(
        default=4, ge=1, le=1_000_000, description="distinct wrong answers a branch may reach"
    )
    answer: Literal["majority", "prm-best"] = "majority"

    @model_validator(mode="after")
    def _check(self) -> BranchConfig:
        if self.stop_after is not None and self.stop_after > self.branches:
            raise ValueError(
                f"stop after {self.stop_after} branches > {self.branches} branches; "
                "allowed: 1 <= M <= N"
            )
        if self.question_correlation + self.length_correlation**2 > 1.0:
            raise ValueError(
                f"question correlation {self.question_correlation} + length correlation "
                f"{self.length_correlation}^2 > 1; allowed: rho_q + rho_L^2 <= 1"
            )
        return self

    @property
    def m(self) -> int:
        return self.branches if self.stop_after is None else self.stop_after

    @property
    def beta(self) -> int:
        return self.branches - self.m if self.prune_max is None else self.prune_max


class ForkGroup:
    """Full prompt blocks shared by the branches of one request."""

    __slots__ = ("blocks", "refs")

    def __init__(self, blocks: int, refs: int) -> None:
        self.blocks = blocks
        self.refs = refs


class BranchStats:
    def __init__(self) -> None:
        self.finished = 0
        self.pruned = 0
        self.cancelled = 0  # cut when M finished
        self.finished_tokens = 0
        self.cancelled_tokens = 0  # generated by pruned and cancelled branches
        self.finished_correct = 0  # finished branches whose answer is right
        self.answered = 0  # requests completed
        self.answered_correct = 0  # ... whose selected answer is right


def branch_quality(
    config: BranchConfig, lengths: np.ndarray, u: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(answers, PRM scores) of one request's branches (the module docstring's model):
    answer 0 is the right one, 1..wrong_answers wrong ones. ``u`` are the uniforms of the
    scores' noise, ``rng`` draws the rest."""
    from scipy.special import ndtr, ndtri  # here: `serve --help` loads this module

    n = len(lengths)
    rq, rl = config.question_correlation, config.length_correlation
    # normal scores of the length ranks (ties share their mean rank), unit variance
    order = np.argsort(lengths, kind="stable")
    ranks = np.empty(n)
    ranks[order] = np.arange(n)
    for value in np.unique(lengths):
        tie = lengths == value
        ranks[tie] = ranks[tie].mean()
    grid = ndtri((np.arange(n) + 0.5) / n)
    g = ndtri((ranks + 0.5) / n) / (grid.std() or 1.0)
    d = rng.standard_normal()
    e = rng.standard_normal(n)
    z = np.sqrt(rq) * d + rl * g + np.sqrt(max(1.0 - rq - rl * rl, 0.0)) * e
    acc = config.accuracy
    correct = z > ndtri(1.0 - acc) if 0.0 < acc < 1.0 else np.full(n, acc >= 1.0)
    wrong = 1 + rng.integers(0, config.wrong_answers, n)
    answers = np.where(correct, 0, wrong)
    noise = ndtri(np.clip(u, 1e-12, 1.0 - 1e-12))
    scores = ndtr(np.where(correct, 1.0, -1.0) + config.prm_noise * noise)
    return answers, scores


def select_answer(answers: np.ndarray, scores: np.ndarray, how: str) -> int:
    """The answer of a request from its finished branches: the majority (a tie goes to the
    answer whose best branch scores higher) or the best-scored branch's (``prm-best``)."""
    if how == "prm-best":
        return int(answers[int(np.argmax(scores))])
    values, counts = np.unique(answers, return_counts=True)
    top = values[counts == counts.max()]
    best = [scores[answers == v].max() for v in top]
    return int(top[int(np.argmax(best))])


class BranchState:
    """One request's branches: lengths, scores, phase."""

    __slots__ = (
        "lengths",
        "scores",
        "answers",
        "index",
        "forked",
        "pruned",
        "alpha2",
        "last_len",
        "config",
        "correct",
    )

    def __init__(
        self,
        config: BranchConfig,
        lengths: np.ndarray,
        scores: np.ndarray,
        answers: np.ndarray | None = None,
    ) -> None:
        self.config = config
        self.lengths = lengths
        self.scores = scores
        self.answers = np.zeros(len(lengths), np.int64) if answers is None else answers
        self.index: dict[int, int] = {}  # id(sequence) -> branch number, set at the fork
        self.correct: bool | None = None  # the selected answer, once the request completes
        self.forked = False
        self.pruned = 0
        self.alpha2: float | None = None  # phase 2 once set
        self.last_len = 0  # output tokens of the last branch that finished

    @classmethod
    def draw(
        cls,
        config: BranchConfig,
        req: Request,
        seed: int,
        empirical: np.ndarray | None = None,
    ) -> BranchState:
        n = config.branches
        rng = np.random.default_rng((seed, req.id, 0x5A27))
        u = rng.random(n)  # first, so the lengths below are those of earlier versions
        if config.output_len is not None:
            extra = config.output_len.sample(n - 1, rng)
        elif empirical is not None and len(empirical):
            extra = empirical[rng.integers(0, len(empirical), n - 1)]
        else:
            extra = np.full(n - 1, req.output_tokens, dtype=np.int64)
        lengths = np.concatenate([[req.output_tokens], extra]).astype(np.int64)
        answers, scores = branch_quality(config, lengths, u, rng)
        return cls(config, lengths, scores, answers)

    # The engine calls the branch policy through the request's state (it imports nothing
    # of this module, which would be a cycle: the functions below drive the engine).
    def extra_blocks(self, req: Request, block_size: int) -> int:
        """See :func:`fork_extra_blocks`."""
        return fork_extra_blocks(req, block_size)

    def fork(self, engine: Engine, root: Sequence, now_s: float) -> None:
        """See :func:`fork`."""
        fork(engine, root, now_s)

    def finished(self, engine: Engine, seq: Sequence, request_done: bool) -> None:
        """See :func:`branch_finished`."""
        branch_finished(engine, seq, request_done)

    def prune(self, engine: Engine, req: Request) -> bool:
        """See :func:`prune`."""
        return prune(engine, req)


def fork_extra_blocks(req: Request, block_size: int) -> int:
    """Blocks a branch root takes beyond its prompt: one copy of the partial last block
    per extra branch."""
    st = req.branch
    if st is None or st.forked:
        return 0
    return (st.config.branches - 1) * (1 if req.prompt_tokens % block_size else 0)


def fork(engine: Engine, root: Sequence, now_s: float) -> None:
    """The root's prefill is done (first token sampled for every branch): split it into N
    decoding branches sharing its prompt blocks."""
    req = root.request
    st: BranchState = req.branch  # type: ignore[assignment]
    st.forked = True
    cfg = st.config
    n = cfg.branches
    bs = engine.block_size
    p = root.ctx_tokens
    c = 1 if p % bs else 0
    pb = root.shared_blocks  # shared-prefix cache entry blocks
    full = p // bs - pb  # the root's private full blocks, shared from now on
    group = ForkGroup(full, n) if full > 0 else None
    # the root held its prompt's blocks plus n - 1 copies of the partial one: it keeps one
    # copy, each other branch takes one, the full blocks go to the group
    root.private_blocks = c
    root.shared_blocks = shared = pb + full
    root.fork = group
    root.output_tokens = int(st.lengths[0])
    root.score = float(st.scores[0])
    st.index[id(root)] = 0
    entry = root.prefix_entry
    branches = [root]
    for i in range(1, n):
        s = Sequence(req, p, int(st.lengths[i]))
        s.generated = 1
        s.ctx_tokens = p
        s.prefill_target = p
        s.prefilled = p
        s.shared_blocks = shared
        s.private_blocks = c
        s.fork = group
        s.score = float(st.scores[i])
        st.index[id(s)] = i
        s.last_token_s = now_s
        s.order = root.order
        if entry is not None:
            entry.refs += 1
            s.prefix_entry = entry
        s.state = DECODING  # not in a batch yet (slot -1): placed below
        req.seqs.append(s)
        branches.append(s)
    dec = engine.decode
    done = []
    for s in branches:
        if s.generated >= s.output_tokens:
            done.append(s)
        else:
            dec.add(s)
            engine.joins.append(s)
    for s in done:  # one-token branches finish at the fork
        if s.state == CANCELLED:  # cut when an earlier one completed the request
            continue
        if req.finish_s is None:
            engine.finish_sequence(s, now_s)
        else:
            cancel(engine, s, pruned=False)
    if cfg.prune == "sart" and req.finish_s is None:
        engine.schedule_prune(req)


def cancel(engine: Engine, seq: Sequence, pruned: bool) -> None:
    """Drop a live branch wherever it is; its KV is freed."""
    state = seq.state
    if state == DECODING and seq.slot >= 0:
        engine.leave_decode(seq)
    elif state == WAITING:
        engine.waiting.remove(seq)
        engine.queued_blocks -= -(-seq.prefill_target // engine.block_size)
        seq.private_blocks = 0
    elif state == PREFILLING:
        engine.prefilling.remove(seq)
    elif state == SWAPPED:
        engine.swapped.remove(seq)
        seq.private_blocks = 0  # host memory
    engine.release_seq(seq)
    seq.state = CANCELLED
    stats = engine.replica.branch_stats
    if stats is not None:
        if pruned:
            stats.pruned += 1
        else:
            stats.cancelled += 1
        stats.cancelled_tokens += seq.generated


def _live(req: Request) -> list[Sequence]:
    return [s for s in req.seqs if s.state != FINISHED and s.state != CANCELLED]


def branch_finished(engine: Engine, seq: Sequence, request_done: bool) -> None:
    """A branch finished: stats; if that completed the request, cancel the others; if it
    was the first, SART's phase 2 starts (threshold = its score) and prunes at once."""
    req = seq.request
    st: BranchState = req.branch  # type: ignore[assignment]
    st.last_len = seq.output_tokens
    stats = engine.replica.branch_stats
    i = st.index.get(id(seq), 0)
    if stats is not None:
        stats.finished += 1
        stats.finished_tokens += seq.generated
        stats.finished_correct += int(st.answers[i] == 0)
    if request_done:
        for s in _live(req):
            cancel(engine, s, pruned=False)
        done = [st.index.get(id(s), 0) for s in req.seqs if s.state == FINISHED]
        if i not in done:
            done.append(i)
        pick = np.array(done)
        st.correct = select_answer(st.answers[pick], st.scores[pick], st.config.answer) == 0
        if stats is not None:
            stats.answered += 1
            stats.answered_correct += int(st.correct)
        return
    if st.config.prune == "sart" and st.alpha2 is None:
        st.alpha2 = seq.score
        prune(engine, req)


def prune(engine: Engine, req: Request) -> bool:
    """One PRM check of a request's live branches; True while it still has branches to
    watch."""
    if req.finish_s is not None:
        return False
    st: BranchState = req.branch  # type: ignore[assignment]
    cfg = st.config
    live = _live(req)
    spare = len(live) - req.seqs_left  # branches that may go
    if st.alpha2 is None:
        threshold = cfg.prune_threshold
        spare = min(spare, cfg.beta - st.pruned)
    else:
        threshold = st.alpha2
    if spare > 0:
        low = sorted((s for s in live if s.score < threshold), key=lambda s: s.score)
        for s in low[:spare]:
            cancel(engine, s, pruned=True)
            st.pruned += 1
    return len(live) > req.seqs_left


__all__ = [
    "BranchConfig",
    "BranchState",
    "BranchStats",
    "ForkGroup",
    "branch_finished",
    "branch_quality",
    "cancel",
    "fork",
    "fork_extra_blocks",
    "prune",
    "select_answer",
]
