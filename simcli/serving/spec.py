"""Speculative decoding: draft-then-verify iterations, their cost, and the decode batch that
advances each sequence by a sampled number of tokens.

**One iteration** of an engine that decodes speculatively (Leviathan et al. 2023, Chen et
al. 2023, as vLLM runs it with a separate draft model on the same GPUs): the draft model
proposes ``k`` tokens for every decoding sequence (``k`` draft decode steps of the whole
batch), then the target model scores all of them at once (one verification step,
``StepModel.verify_step_s(ctx, k)``: ``k + 1`` query tokens per sequence over its cache).
A sequence then gains ``A + 1`` tokens, ``A`` accepted drafts plus the target's own next
token (the correction, or the bonus token when all ``k`` are accepted), cut to the tokens
it still wants: a request never gets more tokens than it asked for, and its last step may
accept fewer.

**Acceptance.** Position ``i`` of a draft is accepted with probability ``a_i`` given that
positions ``1..i-1`` were (``--spec-acceptance A``: ``a_i = A``; or one value per
position), so ``P(A >= j) = a_1 ... a_j`` and ``E[A] = sum_j prod_{i <= j} a_i`` (the
expected accepted length of Leviathan et al., eq. 1, with a per-position rate). Each
sequence's ``A`` is drawn every iteration by inverting that distribution with one uniform
number from a generator seeded by the run's seed, the replica and the engine.

**SpecTr multiple drafts** (Sun et al., NeurIPS 2023, ``drafts = N``): the draft model
samples ``N`` draft sequences per request (a draft batch ``N`` times larger), all verified
together in one step over ``N (k + 1)`` tokens per sequence (a token tree: one sequence of
``N (k + 1)`` query tokens over the cache, its tree mask not modelled). Which draft token a
position keeps is SpecTr's draft selection, priced per position by
:func:`spectr_acceptance` (``spectr = "kseq"``, the default) or by the independent-draft
bound ``1 - (1 - a_i)^N`` (``spectr = "independent-bound"``); see :func:`kseq_acceptance`
for the model and the proof that the first lies between ``a_i`` and the second.

**TriForce** (Sun et al., COLM 2024, ``retrieval_budget`` set): the middle level of the
hierarchy is the *target itself* with a retrieval KV cache of ``retrieval_budget`` tokens
(chunks of ``retrieval_chunk`` tokens chosen by the attention of the current query to each
chunk's mean key), drafting ``k`` tokens for the target's full-cache verification; the
bottom level is a tiny model with a StreamingLLM cache of ``tiny_cache`` tokens (attention
sinks + recent window) drafting ``tiny_k`` tokens per verification of the retrieval level.
Pricing (:class:`RetrievalDraft`, :class:`StreamingDraft`): the retrieval level's decode and
verification steps are the target's step models at ``min(ctx, budget)`` cached tokens (it
reads only the budget's KV; its weights are the target's, so its prefill is the target's
own), plus once per target verification the chunk selection, priced as the extra attention
of one decode step over ``ctx / retrieval_chunk`` mean keys; the tiny model decodes at
``min(ctx, tiny_cache)``. Memory: every running sequence (``max_num_seqs`` seats) holds a
retrieval cache of ``budget`` tokens of the target's KV and a tiny cache of ``tiny_cache``
tokens of the tiny model's KV, reserved beside the tiny model's weights before the paged
cache is sized. Acceptance is two-level: ``tiny_acceptance`` (tiny -> retrieval draft) sets
how many tiny rounds the ``k`` middle tokens take, ``acceptance`` (retrieval draft ->
target) how many the target keeps.

**TriForce-style hierarchy** (Sun et al., COLM 2024, ``tiny_k > 0``): a tiny model drafts
for the draft model, which drafts for the target. The draft's ``k`` tokens are produced by
speculative iterations of its own: each is ``tiny_k`` tiny decode steps plus one draft
verification of ``tiny_k + 1`` tokens, yielding ``1 + E[A_tiny]`` tokens on average, so
``ceil(k / (1 + E[A_tiny]))`` such rounds replace the ``k`` draft decode steps (expected
value, not sampled: the draft's tokens are distributed as the draft's own, speculation is
lossless, so the target's acceptance is unchanged). The tiny model's KV cache is counted
like the draft's (TriForce keeps it to a StreamingLLM window; counting it in full is
conservative).

**Cost of an iteration.** Decode-only iterations (vLLM's scheduler): ``k x`` the draft's
decode step of the batch (at the mean context of the drafting, ``ctx + k // 2``; with
``N`` drafts over ``N`` times the sequences) plus the target's ``verify_step_s``. Mixed
iterations (Orca, Sarathi-Serve) fold the verification into the prefill pass: each
decoding sequence is a ``k + 1``-token chunk over its cache in the target's ``step_s``
(one logits row per sequence, not ``k + 1``). Prefill chunks also run through the draft
model (it needs the prompt's KV too). The benefit therefore shrinks at large batch: the
verification of ``k + 1`` tokens costs about one decode step only while decode is
memory-bound.

**KV.** Every decoding sequence reserves ``1 + N k`` lookahead slots in the target's
cache for the step (the verified tokens are written before acceptance is known; vLLM's
``num_lookahead_slots``), and each token of context also holds the draft's (and the tiny
model's) KV: the cache is sized for target + draft bytes per token, after the draft's
weights (:func:`spec_kv_capacity_tokens`; the draft's activation workspace and CUDA-graph
pool are not added).

**Metrics.** ``spec_accepted_tokens_per_step`` is the mean accepted drafts per sequence
per verification (before the cut to the tokens a request still wants, so it estimates
``E[A]``); ``spec_tokens_per_step`` the mean tokens delivered. Time between tokens spreads
an iteration's gap evenly over the tokens it delivered to each sequence. The energy meter
prices a speculative iteration as the target's decode step over its whole time (the
draft's FLOPs are not added).
"""

from __future__ import annotations

import math
from collections.abc import Sequence as SeqType
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcli.serving.requests import DECODING, Sequence

_EMPTY = np.zeros(0, dtype=np.int64)

SpectrAcceptance = Literal["kseq", "independent-bound"]


def kseq_beta(p: np.ndarray, q: np.ndarray, rho: float) -> float:
    """``beta_{p,q}(rho) = sum_x min(q(x), p(x) / rho)``: the probability that one draft
    ``X ~ q`` passes K-SEQ's test ``U < p(X) / (rho q(X))`` (SpecTr, Algorithm K-SEQ)."""
    return float(np.minimum(q, p / rho).sum())


def kseq_acceptance_dists(p: np.ndarray, q: np.ndarray, n: int) -> tuple[float, float]:
    """(acceptance, rho*) of SpecTr's k-sequential selection of one of ``n`` i.i.d. drafts
    of ``q`` for the target ``p`` (both summing to 1).

    K-SEQ tests the drafts in turn, keeping the first that passes (probability ``beta(rho)``
    each), else samples the residual of ``p``. With ``n`` drafts it accepts with

        (K1)  alpha(rho) = 1 - (1 - beta(rho))^n,

    and it outputs exactly ``p`` when ``alpha(rho) <= rho beta(rho)`` (the mass it emits by
    acceptance, ``min(q, p/rho) alpha / beta``, stays below ``p``). SpecTr takes the ``rho``
    that makes that tight,

        (K2)  1 - (1 - beta(rho*))^n = rho* beta(rho*),   rho* in [1, n],

    whose acceptance is at least ``(1 - (1 - 1/n)^n) >= 1 - 1/e`` times that of the optimal
    transport coupling of ``p`` with the ``n`` drafts (SpecTr's approximation guarantee).
    ``rho beta(rho) = sum min(rho q, p)`` grows with ``rho`` and (K1) falls, so (K2) has one
    root, found by bisection: at ``rho = 1`` the left side ``1 - (1 - a)^n`` is ``>= a``,
    the right; at ``rho = n`` Bernoulli's inequality gives the reverse."""
    if n <= 1:
        return float(np.minimum(p, q).sum()), 1.0
    lo, hi = 1.0, float(n)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        b = kseq_beta(p, q, mid)
        if 1.0 - (1.0 - b) ** n > mid * b:
            lo = mid
        else:
            hi = mid
    rho = 0.5 * (lo + hi)
    return 1.0 - (1.0 - kseq_beta(p, q, rho)) ** n, rho


def two_class(a: float) -> tuple[np.ndarray, np.ndarray]:
    """The balanced two-class pair ``(p, q)`` with ``1 - TV(p, q) = a`` (see
    :func:`kseq_acceptance`): class H, which the target prefers, and class L, which the
    draft prefers, ``p = (1 - a/2, a/2)``, ``q = (a/2, 1 - a/2)``."""
    return np.array([1.0 - a / 2.0, a / 2.0]), np.array([a / 2.0, 1.0 - a / 2.0])


def kseq_acceptance(a: float, n: int) -> float:
    """Per-position acceptance of SpecTr's K-SEQ with ``n`` drafts, from the single-draft
    acceptance ``a = 1 - TV(p, q)`` (Leviathan et al.'s ``alpha``), under a stated model.

    **Model (assumption).** The simulator has no token distributions, and K-SEQ's
    acceptance depends on more of ``(p, q)`` than ``a``. We assume the *balanced two-class*
    model: the vocabulary splits into the tokens the target prefers (H, ``p > q``) and those
    the draft prefers (L), the likelihood ratio ``p/q`` is constant on each class, and the
    draft misplaces on L exactly the mass it lacks on H, with classes of equal combined
    mass ``p(H) + q(H) = 1``:

        (M)  p(H) = 1 - a/2,  q(H) = a/2,  p(L) = a/2,  q(L) = 1 - a/2,

    so ``sum min(p, q) = q(H) + p(L) = a``. Then ``beta(rho) = min(a/2, (1 - a/2)/rho) +
    a/(2 rho)`` and (K1)-(K2) of :func:`kseq_acceptance_dists` give the acceptance
    (splitting a class into many tokens of the same ratio leaves ``beta`` unchanged).

    **Bounds (any p, q, not only M).** ``alpha = rho* beta(rho*) >= 1 * beta(1) = a``
    since ``rho beta(rho)`` grows with ``rho``; ``alpha = 1 - (1 - beta(rho*))^n <= 1 -
    (1 - a)^n`` since ``beta`` falls with ``rho`` and ``beta(1) = a``. So K-SEQ lies between
    one draft and the independent-draft bound, reaching the bound only when the draft's
    surplus lies where the target puts no mass (``q = a p + (1 - a) r``, ``r`` off ``p``'s
    support) and ``a`` when the target's surplus is out of the draft's reach. M sits
    between those extremes: at ``a = 0.7``, ``n = 2`` it gives 0.840 against 0.7 and
    0.91."""
    if n <= 1 or a <= 0.0 or a >= 1.0:
        return float(a)
    p, q = two_class(a)
    return kseq_acceptance_dists(p, q, n)[0]


def spectr_acceptance(a: np.ndarray, n: int, mode: str = "kseq") -> np.ndarray:
    """Per-position acceptance with ``n`` drafts: K-SEQ under model M
    (:func:`kseq_acceptance`) or the independent-draft bound ``1 - (1 - a)^n``."""
    a = np.asarray(a, dtype=float)
    if n <= 1:
        return a
    if mode == "independent-bound":
        return 1.0 - (1.0 - a) ** n
    return np.array([kseq_acceptance(float(x), n) for x in a])


class SpecConfig(BaseModel):
    """Speculative decoding of every replica (the draft's StepModel is passed to the
    simulator)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(default=4, ge=1, le=64, description="draft tokens per iteration")
    acceptance: tuple[float, ...] = Field(
        default=(0.7,),
        description="per-position acceptance rates; one value applies to every position",
    )
    drafts: int = Field(default=1, ge=1, le=64, description="SpecTr: drafts verified together")
    spectr: SpectrAcceptance = Field(
        default="kseq", description="SpecTr draft selection: kseq | independent-bound"
    )
    tiny_k: int = Field(default=0, ge=0, le=64, description="TriForce: tiny-model draft length")
    tiny_acceptance: float = Field(default=0.6, ge=0, le=1)
    retrieval_budget: int | None = Field(
        default=None, ge=1, description="TriForce: retrieval KV cache of the middle draft, tokens"
    )
    retrieval_chunk: int = Field(default=8, ge=1, description="TriForce: KV chunk, tokens")
    tiny_cache: int | None = Field(
        default=None, ge=1, description="TriForce: StreamingLLM cache of the tiny model, tokens"
    )

    @model_validator(mode="after")
    def _check(self) -> SpecConfig:
        acc = self.acceptance
        if len(acc) not in (1, self.k):
            raise ValueError(
                f"{len(acc)} acceptance rates for k={self.k}; allowed: one, or one per position"
            )
        if any(not (0.0 <= a <= 1.0) or math.isnan(a) for a in acc):
            raise ValueError(f"acceptance rates {acc} must each be in [0, 1]")
        return self

    @property
    def single_draft(self) -> np.ndarray:
        """Single-draft acceptance per position, ``a_i = 1 - TV(p_i, q_i)``."""
        return np.array(self.acceptance * self.k if len(self.acceptance) == 1 else self.acceptance)

    @property
    def per_position(self) -> np.ndarray:
        """Acceptance per position with SpecTr's ``drafts`` (see :func:`spectr_acceptance`)."""
        return spectr_acceptance(self.single_draft, self.drafts, self.spectr)

    @property
    def survival(self) -> np.ndarray:
        """``P(A >= j)`` for j = 1..k: the prefix products."""
        return np.cumprod(self.per_position)

    @property
    def expected_accepted(self) -> float:
        """``E[A]``: the sum of the prefix products."""
        return float(self.survival.sum())

    @property
    def lookahead(self) -> int:
        """KV slots a sequence's verification writes: its last token and the drafts."""
        return 1 + self.drafts * self.k

    @property
    def verify_k(self) -> int:
        """Query tokens per sequence in the verification, minus one (``verify_step_s``)."""
        return self.drafts * (self.k + 1) - 1

    @property
    def tiny_rounds(self) -> int:
        """TriForce: draft-verification rounds to produce the draft's k tokens."""
        if not self.tiny_k:
            return 0
        e_tiny = float(np.cumprod(np.full(self.tiny_k, self.tiny_acceptance)).sum())
        return math.ceil(self.k / (1.0 + e_tiny))


def _per_gpu_kv_bytes(step: Any) -> float:
    """KV bytes per token on one GPU (test doubles: replica-wide bytes over ``gpus``)."""
    if hasattr(step, "kv_bytes_per_token_per_gpu"):
        return float(step.kv_bytes_per_token_per_gpu())
    return float(step.kv_bytes_per_token) / float(getattr(step, "gpus", 1) or 1)


class _CappedDraft:
    """A step model read through a KV cache capped at ``cap`` tokens per sequence, holding
    ``cap`` tokens for each of ``seats`` sequences outside the paged cache. Exposes the
    draft interface :class:`SpecCost` and :func:`spec_kv_capacity_tokens` use: its fixed
    memory is reported as ``weight_bytes*`` (memory taken before the paged cache is sized)
    and its per-token KV as zero (it does not grow with the context)."""

    def __init__(self, inner: Any, cap: int, seats: int, own_weights: bool) -> None:
        self.inner, self.cap, self.seats = inner, int(cap), int(seats)
        self.model = getattr(inner, "model", None)
        self._own_weights = own_weights
        self.kv_bytes_per_token = 0.0

    def cache_bytes_per_gpu(self) -> float:
        """The capped caches of every seat, bytes per GPU."""
        return self.seats * self.cap * _per_gpu_kv_bytes(self.inner)

    def weight_bytes_per_gpu(self) -> float:
        w = float(self.inner.weight_bytes_per_gpu()) if self._own_weights else 0.0
        return w + self.cache_bytes_per_gpu()

    def kv_bytes_per_token_per_gpu(self) -> float:
        return 0.0

    @property
    def weight_bytes(self) -> float:
        """Replica-wide fixed bytes (the test doubles' path)."""
        gpus = float(getattr(self.inner, "gpus", 1) or 1)
        w = float(getattr(self.inner, "weight_bytes", 0.0)) if self._own_weights else 0.0
        return w + self.cache_bytes_per_gpu() * gpus

    def _ctx(self, ctx: np.ndarray) -> np.ndarray:
        return np.minimum(ctx, self.cap)

    def verify_step_s(self, ctx: np.ndarray, k: int) -> float:
        return self.inner.verify_step_s(self._ctx(ctx), k)


class RetrievalDraft(_CappedDraft):
    """TriForce's middle level: the target's weights over a retrieval cache of ``budget``
    tokens (Sun et al., COLM 2024: retrieval-based drafting)."""

    def __init__(self, target: Any, budget: int, chunk: int, seats: int) -> None:
        super().__init__(target, budget, seats, own_weights=False)
        self.chunk = int(chunk)

    def step_s(self, new: np.ndarray, past: np.ndarray, ctx: np.ndarray) -> float:
        # a prefill is the target's own (same weights, same full cache): nothing extra
        if not len(ctx):
            return 0.0
        return self.inner.step_s(_EMPTY, _EMPTY, self._ctx(ctx))

    def rebuild_s(self, ctx: np.ndarray) -> float:
        """Chunk selection after a target verification: each sequence's query against the
        mean key of each of its ``ctx / chunk`` chunks, priced as the extra attention of a
        decode step over that many cached tokens (keys and values: an upper bound)."""
        if not len(ctx):
            return 0.0
        chunks = np.maximum(-(-ctx // self.chunk), 1)
        ones = np.ones_like(ctx)
        extra = self.inner.step_s(_EMPTY, _EMPTY, chunks) - self.inner.step_s(_EMPTY, _EMPTY, ones)
        return max(float(extra), 0.0)


class StreamingDraft(_CappedDraft):
    """TriForce's tiny model with a StreamingLLM cache (attention sinks + recent window) of
    ``window`` tokens (Xiao et al., ICLR 2024): its decode reads at most that many."""

    def __init__(self, tiny: Any, window: int, seats: int) -> None:
        super().__init__(tiny, window, seats, own_weights=True)

    def step_s(self, new: np.ndarray, past: np.ndarray, ctx: np.ndarray) -> float:
        # the prompt goes through the tiny model whole (TriForce's draft prefill); its
        # cache then keeps the sinks and the window
        return self.inner.step_s(new, past, self._ctx(ctx) if len(ctx) else ctx)


class SpecCost:
    """Seconds of one speculative iteration (see the module docstring)."""

    def __init__(self, config: SpecConfig, target: Any, draft: Any, tiny: Any = None) -> None:
        if config.tiny_k and tiny is None:
            raise ValueError("a speculative hierarchy (tiny_k > 0) needs the tiny model's steps")
        self.config = config
        self.target, self.draft, self.tiny = target, draft, tiny
        self.k = config.k
        self.n_drafts = config.drafts
        self.verify_k = config.verify_k
        self.rounds = config.tiny_rounds

    def draft_s(self, ctx: np.ndarray) -> float:
        """The draft's k tokens for every sequence of the batch."""
        k, nd = self.k, self.n_drafts
        mid = ctx + k // 2
        if nd > 1:
            mid = np.repeat(mid, nd)
        if self.rounds:
            tk = self.config.tiny_k
            tiny = self.tiny.step_s(_EMPTY, _EMPTY, mid)
            return self.rounds * (tk * tiny + self.draft.verify_step_s(mid, tk))
        return k * self.draft.step_s(_EMPTY, _EMPTY, mid)

    def iteration_s(self, new: np.ndarray, past: np.ndarray, ctx: np.ndarray) -> float:
        t = 0.0
        if len(new):
            t += self.draft.step_s(new, past, _EMPTY)
            if self.rounds:
                t += self.tiny.step_s(new, past, _EMPTY)
        if not len(ctx):
            return t + self.target.step_s(new, past, _EMPTY)
        t += self.draft_s(ctx)
        if self.config.retrieval_budget is not None:
            t += self.draft.rebuild_s(ctx)
        if len(new):
            q = np.full(len(ctx), self.verify_k + 1, dtype=np.int64)
            return t + self.target.step_s(
                np.concatenate([new, q]), np.concatenate([past, ctx]), _EMPTY
            )
        return t + self.target.verify_step_s(ctx, self.verify_k)


class SpecStats:
    """Counts over every verification of a run."""

    def __init__(self) -> None:
        self.seq_steps = 0  # sequence-iterations verified
        self.accepted = 0  # drafts accepted (before the cut to the tokens wanted)
        self.emitted = 0  # tokens delivered


class SpecDecodeBatch:
    """The decode batch of a speculative engine: explicit per-sequence context, generated
    and reserved-block arrays (sequences advance by different amounts, so the lockstep
    :class:`~simcli.serving.batch.DecodeBatch` does not apply); same methods."""

    variable = True

    def __init__(
        self,
        block_size: int,
        config: SpecConfig,
        rng: np.random.Generator,
        stats: SpecStats,
        capacity: int = 64,
    ) -> None:
        self.block_size = block_size
        self.lookahead = config.lookahead
        self.survival = config.survival
        self.rng = rng
        self.stats = stats
        self.ctx = np.zeros(capacity, dtype=np.int64)
        self.gen = np.zeros(capacity, dtype=np.int64)
        self.out = np.zeros(capacity, dtype=np.int64)
        self.blk = np.zeros(capacity, dtype=np.int64)  # blocks held, lookahead included
        self.last = np.zeros(capacity, dtype=np.int64)  # tokens of the last iteration
        self.seqs: list[Sequence] = []
        self.n = 0
        self.dit = 0  # iterations run so far

    def _grow(self) -> None:
        for name in ("ctx", "gen", "out", "blk", "last"):
            a = getattr(self, name)
            setattr(self, name, np.concatenate([a, np.zeros(len(a), dtype=np.int64)]))

    def add(self, seq: Sequence, reserved: bool = False) -> None:
        """Join holding ``ceil(ctx / block)`` blocks, or the lookahead too if ``reserved``
        (the engine allocated :meth:`join_need` more)."""
        n = self.n
        if n == len(self.ctx):
            self._grow()
        c = seq.ctx_tokens
        bs = self.block_size
        self.ctx[n] = c
        self.gen[n] = seq.generated
        self.out[n] = seq.output_tokens
        self.blk[n] = -(-(c + self.lookahead) // bs) if reserved else -(-c // bs)
        self.last[n] = 0
        self.seqs.append(seq)
        self.n = n + 1
        seq.slot = n
        seq.join_dit = self.dit
        seq.state = DECODING

    def remove(self, seq: Sequence) -> int:
        """Leave; ``seq.ctx_tokens``/``generated`` brought up to date. Returns the blocks
        the sequence holds (lookahead included)."""
        slot = seq.slot
        seq.ctx_tokens = int(self.ctx[slot])
        seq.generated = int(self.gen[slot])
        held = int(self.blk[slot])
        last = self.n - 1
        if slot != last:
            moved = self.seqs[last]
            self.seqs[slot] = moved
            for a in (self.ctx, self.gen, self.out, self.blk, self.last):
                a[slot] = a[last]
            moved.slot = slot
        self.seqs.pop()
        self.n = last
        seq.slot = -1
        return held

    def _need(self) -> np.ndarray:
        n = self.n
        bs = self.block_size
        want = -(-(self.ctx[:n] + self.lookahead) // bs)
        return np.maximum(want - self.blk[:n], 0)

    def needing_blocks(self) -> int:
        """New blocks the next verification needs (lookahead slots of every sequence)."""
        return int(self._need().sum()) if self.n else 0

    def blocks_needed(self, seq: Sequence) -> int:
        s = seq.slot
        want = -(-(int(self.ctx[s]) + self.lookahead) // self.block_size)
        return max(want - int(self.blk[s]), 0)

    def join_need(self, seq: Sequence) -> int:
        bs = self.block_size
        c = seq.ctx_tokens
        return -(-(c + self.lookahead) // bs) - -(-c // bs)

    def reserved(self) -> None:
        """The engine allocated :meth:`needing_blocks`: record them."""
        n = self.n
        if n:
            self.blk[:n] += self._need()

    def held_blocks(self, in_flight: bool) -> int:
        return int(self.blk[: self.n].sum())

    def contexts(self) -> np.ndarray:
        return self.ctx[: self.n].copy()

    def context_sum(self) -> int:
        return int(self.ctx[: self.n].sum())

    def advance(self) -> list[Sequence]:
        """One verification done: every sequence gains ``min(A + 1, wanted)`` tokens."""
        self.dit += 1
        n = self.n
        if not n:
            return []
        u = self.rng.random(n)
        accepted = (u[:, None] < self.survival[None, :]).sum(axis=1)
        left = self.out[:n] - self.gen[:n]
        tokens = np.minimum(accepted + 1, left)
        self.ctx[:n] += tokens
        self.gen[:n] += tokens
        self.last[:n] = tokens
        st = self.stats
        st.seq_steps += n
        st.accepted += int(accepted.sum())
        st.emitted += int(tokens.sum())
        done = np.flatnonzero(self.gen[:n] >= self.out[:n])
        seqs = self.seqs
        return [seqs[i] for i in done.tolist()]

    def record_tbt(
        self, metrics: Any, gap_s: float, joined: SeqType[Sequence], now_s: float
    ) -> None:
        """Time between tokens of the last iteration: its gap spread evenly over the tokens
        it delivered to each sequence (``gap / t`` for each of ``t`` tokens)."""
        n = self.n
        counts = np.bincount(self.last[:n], minlength=2).astype(np.int64)
        for s in joined:
            t = int(self.last[s.slot])
            counts[t] -= 1
            if t:
                metrics.tbt((now_s - s.last_token_s) / t, t)
        for t in np.flatnonzero(counts).tolist():
            if t:
                metrics.tbt(gap_s / t, int(counts[t]) * t)

    def newest(self) -> Sequence:
        best = self.seqs[0]
        for s in self.seqs:
            if s.order > best.order:
                best = s
        return best


def spec_kv_capacity_tokens(
    target: Any, drafts: SeqType[Any], block_size: int, gpu_memory_utilization: float
) -> int:
    """Tokens of KV one replica holds when the draft models (draft, tiny) share its GPUs:
    the target's KV memory less the drafts' weights, over target + draft KV bytes per
    token. Raises ValueError when nothing is left."""
    if hasattr(target, "memory_bytes_per_gpu") and all(
        hasattr(d, "weight_bytes_per_gpu") for d in drafts
    ):
        mem = target.memory_bytes_per_gpu(gpu_memory_utilization)
        room = mem["kv_cache"] - sum(d.weight_bytes_per_gpu() for d in drafts)
        per_tok = target.kv_bytes_per_token_per_gpu() + sum(
            d.kv_bytes_per_token_per_gpu() for d in drafts
        )
        weights = sum(d.weight_bytes_per_gpu() for d in drafts)
    else:  # test doubles: replica-wide bytes
        cap = target.kv_capacity_tokens(block_size, gpu_memory_utilization)
        weights = sum(float(getattr(d, "weight_bytes", 0.0)) for d in drafts)
        room = cap * target.kv_bytes_per_token - weights
        per_tok = target.kv_bytes_per_token + sum(d.kv_bytes_per_token for d in drafts)
    tokens = int(room // per_tok) // block_size * block_size if room > 0 else 0
    if tokens < block_size:
        names = ", ".join(str(getattr(getattr(d, "model", None), "id", "draft")) for d in drafts)
        if any(isinstance(d, _CappedDraft) for d in drafts):  # TriForce's fixed caches
            raise ValueError(
                f"TriForce's draft caches ({weights / 2**30:.1f} GiB per GPU with the tiny "
                "model's weights: one retrieval cache and one tiny cache per --max-batch-size "
                "seat) leave no room for a KV block; allowed: a smaller --triforce-kv-budget "
                "or --max-batch-size, more --tp, a bigger GPU"
            )
        raise ValueError(
            f"draft model {names} does not fit beside the target: its weights "
            f"({weights / 2**30:.1f} GiB per GPU) leave no room for a KV block; allowed: a "
            "smaller draft, more --tp, a bigger GPU or a higher --gpu-memory-utilization"
        )
    return tokens


__all__ = [
    "RetrievalDraft",
    "SpecConfig",
    "SpecCost",
    "SpecDecodeBatch",
    "SpecStats",
    "StreamingDraft",
    "kseq_acceptance",
    "kseq_acceptance_dists",
    "spec_kv_capacity_tokens",
    "spectr_acceptance",
    "two_class",
]
