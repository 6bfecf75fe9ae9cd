"""What one engine iteration runs: the lockstep decode batch, one iteration's batch, and
the step-model contract that prices it.

Decoding sequences advance in lockstep: every decode iteration adds one token to each
sequence in the decode batch (all schedulers here put every running decode in every
iteration that decodes). :class:`DecodeBatch` exploits that: a sequence's context is
``ctx0[slot] + dit`` where ``dit`` counts the batch's decode iterations, so an iteration
costs O(1) bookkeeping plus one numpy add, whatever the batch size; the sequences needing
a new KV block are those whose context is a multiple of the block size, counted per
residue class; finishes are bucketed by the decode iteration they happen at. A sequence's
per-token history is never stored. A speculative engine swaps it for
:class:`simcli.serving.spec.SpecDecodeBatch` (same methods).

These types sit below the engine (:mod:`simcli.serving.engine`), the schedulers, the
metrics and the timeline, which all read them; they import nothing else of the simulator.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from simcli.serving.requests import DECODING, Sequence


class StepModelLike(Protocol):
    """What the simulator uses of ``costmodels.steps.serving.StepModel``."""

    kv_bytes_per_token: float

    def step_s(
        self, prefill_new: np.ndarray, prefill_past: np.ndarray, decode_ctx: np.ndarray
    ) -> float: ...

    def kv_capacity_tokens(self, block_size: int, gpu_memory_utilization: float) -> int: ...


class DecodeBatch:
    """The sequences decoding on one engine, advanced in lockstep (see module docstring).

    The engine uses only ``add``, ``remove``, ``needing_blocks``, ``blocks_needed``,
    ``join_need``, ``reserved``, ``contexts``, ``context_sum``, ``advance``, ``newest`` and
    ``held_blocks``: :class:`simcli.serving.spec.SpecDecodeBatch`, whose sequences gain a
    varying number of tokens per step (speculative decoding), keeps an explicit context
    array behind the same methods.
    """

    variable = False  # every sequence gains exactly one token per iteration
    lookahead = 1  # KV slots a sequence's next iteration writes

    def __init__(self, block_size: int, capacity: int = 64) -> None:
        self.block_size = block_size
        self.ctx0 = np.zeros(capacity, dtype=np.int64)
        self.seqs: list[Sequence] = []
        self.n = 0
        self.dit = 0  # decode iterations run so far
        self.res = [0] * block_size  # sequences per residue class of ctx0 (mod block size)
        self.finish: dict[int, list[Sequence]] = {}
        self.sum_ctx0 = 0

    def add(self, seq: Sequence, reserved: bool = False) -> None:
        """Join with ``seq.ctx_tokens`` cached and ``seq.generated`` tokens produced
        (``reserved``: the block for its next token is already allocated; here that is
        implied by its context, see :meth:`held_blocks`)."""
        n = self.n
        if n == len(self.ctx0):
            self.ctx0 = np.concatenate([self.ctx0, np.zeros(n, dtype=np.int64)])
        c0 = seq.ctx_tokens - self.dit
        self.ctx0[n] = c0
        self.sum_ctx0 += c0
        self.seqs.append(seq)
        self.n = n + 1
        seq.slot = n
        seq.join_dit = self.dit
        key = c0 % self.block_size
        seq.res_key = key
        self.res[key] += 1
        fd = self.dit + seq.output_tokens - seq.generated
        seq.finish_dit = fd
        bucket = self.finish.get(fd)
        if bucket is None:
            self.finish[fd] = [seq]
        else:
            bucket.append(seq)
        seq.state = DECODING

    def remove(self, seq: Sequence) -> int:
        """Leave the batch; ``seq.ctx_tokens``/``generated`` are brought up to date.
        Returns the blocks the sequence holds."""
        d = self.dit - seq.join_dit
        seq.ctx_tokens += d
        seq.generated += d
        slot = seq.slot
        last = self.n - 1
        self.sum_ctx0 -= int(self.ctx0[slot])
        if slot != last:
            moved = self.seqs[last]
            self.seqs[slot] = moved
            self.ctx0[slot] = self.ctx0[last]
            moved.slot = slot
        self.seqs.pop()
        self.n = last
        self.res[seq.res_key] -= 1
        seq.slot = -1
        return -(-seq.ctx_tokens // self.block_size)

    def needing_blocks(self) -> int:
        """Sequences whose next token starts a new KV block."""
        return self.res[-self.dit % self.block_size]

    def needs_block(self, seq: Sequence) -> bool:
        return seq.res_key == -self.dit % self.block_size

    def blocks_needed(self, seq: Sequence) -> int:
        """Blocks ``seq``'s next token needs (0 or 1)."""
        return 1 if seq.res_key == -self.dit % self.block_size else 0

    def join_need(self, seq: Sequence) -> int:
        """Blocks a sequence joining with ``seq.ctx_tokens`` cached needs for its next
        token, beyond its context's."""
        return 1 if seq.ctx_tokens % self.block_size == 0 else 0

    def reserved(self) -> None:
        """The engine allocated :meth:`needing_blocks` (implied by the contexts here)."""

    def held_blocks(self, in_flight: bool) -> int:
        """Blocks the sequences hold (shared ones counted per sequence), with the blocks
        reserved for an iteration in flight."""
        ctx = self.contexts()
        held = int((-(-ctx // self.block_size)).sum()) if self.n else 0
        return held + (self.needing_blocks() if in_flight else 0)

    def contexts(self) -> np.ndarray:
        return self.ctx0[: self.n] + self.dit

    def context_sum(self) -> int:
        return self.sum_ctx0 + self.n * self.dit

    def advance(self) -> list[Sequence]:
        """One decode iteration done: the sequences that produced their last token."""
        self.dit += 1
        done = self.finish.pop(self.dit, None)
        if not done:
            return []
        dit = self.dit
        out = []
        for s in done:  # skip stale entries (left, or left and rejoined: listed twice)
            if s.slot >= 0 and s.finish_dit == dit:
                s.finish_dit = -1
                out.append(s)
        return out

    def newest(self) -> Sequence:
        """The lowest-priority sequence (latest arrival): the preemption victim."""
        best = self.seqs[0]
        for s in self.seqs:
            if s.order > best.order:
                best = s
        return best


class CappedDecodeBatch(DecodeBatch):
    """A :class:`DecodeBatch` whose sequences hold ``full * ceil(c / bs) + capped *
    min(ceil(c / bs), cap_blocks)`` block units at context ``c`` (a sliding-window
    pattern's :class:`costmodels.steps.sparse.KvLayout`): past ``cap_blocks`` a capped
    layer frees its oldest block as it takes a new one.

    Still O(1) per iteration: per residue class it also counts the *open* sequences (context
    below ``cap_blocks * bs``, still growing their capped layers); a sequence closes at a
    decode iteration known when it joins, bucketed like the finishes, so each sequence is
    touched once when it closes and never per iteration.
    """

    def __init__(self, block_size: int, layout: Any) -> None:
        super().__init__(block_size)
        self.layout = layout  # a KvLayout (capped): what a sequence holds at a context
        self.full = layout.full_units
        self.capped = layout.capped_units
        self.cap_blocks = layout.cap_blocks(block_size)
        self.cap_tokens = self.cap_blocks * block_size
        self.state = layout.state_units(block_size)  # a hybrid's recurrent state
        self.res_open = [0] * block_size
        self.close: dict[int, list[Sequence]] = {}
        self.close_dit: dict[int, int] = {}  # id(seq) -> decode iteration it closes at

    def blocks_for(self, tokens: int) -> int:
        return self.layout.held_units(tokens, self.block_size)

    def add(self, seq: Sequence, reserved: bool = False) -> None:
        super().add(seq, reserved)
        c = seq.ctx_tokens
        if c < self.cap_tokens:
            self.res_open[seq.res_key] += 1
            cd = self.dit + self.cap_tokens - c
            self.close_dit[id(seq)] = cd
            bucket = self.close.get(cd)
            if bucket is None:
                self.close[cd] = [seq]
            else:
                bucket.append(seq)

    def remove(self, seq: Sequence) -> int:
        if self.close_dit.pop(id(seq), None) is not None:
            self.res_open[seq.res_key] -= 1
        super().remove(seq)
        return self.blocks_for(seq.ctx_tokens)

    def needing_blocks(self) -> int:
        r = -self.dit % self.block_size
        return self.full * self.res[r] + self.capped * self.res_open[r]

    def blocks_needed(self, seq: Sequence) -> int:
        if seq.res_key != -self.dit % self.block_size:
            return 0
        return self.full + (self.capped if id(seq) in self.close_dit else 0)

    def join_need(self, seq: Sequence) -> int:
        c = seq.ctx_tokens
        if c % self.block_size:
            return 0
        return self.full + (self.capped if c < self.cap_tokens else 0)

    def held_blocks(self, in_flight: bool) -> int:
        if not self.n:
            return self.needing_blocks() if in_flight else 0
        b = -(-self.contexts() // self.block_size)
        held = int((self.full * b + self.capped * np.minimum(b, self.cap_blocks)).sum())
        held += self.state * self.n
        return held + (self.needing_blocks() if in_flight else 0)

    def advance(self) -> list[Sequence]:
        done = super().advance()
        closing = self.close.pop(self.dit, None)
        if closing:
            dit, close_dit = self.dit, self.close_dit
            for s in closing:  # skip stale entries (left, or left and rejoined)
                if close_dit.get(id(s)) == dit:
                    del close_dit[id(s)]
                    self.res_open[s.res_key] -= 1
        return done


class Batch:
    """One iteration's work on one engine."""

    __slots__ = ("prefills", "prefill_new", "prefill_past", "n_decode", "joined", "extra_s")

    def __init__(self) -> None:
        self.prefills: list[Sequence] = []
        self.prefill_new: list[int] = []
        self.prefill_past: list[int] = []
        self.n_decode = 0
        self.joined: list[Sequence] = []
        self.extra_s = 0.0  # swap traffic before the forward pass

    def add_prefill(self, seq: Sequence, new_tokens: int) -> None:
        self.prefills.append(seq)
        self.prefill_new.append(new_tokens)
        self.prefill_past.append(seq.prefilled)

    @property
    def num_tokens(self) -> int:
        return sum(self.prefill_new) + self.n_decode


__all__ = ["Batch", "CappedDecodeBatch", "DecodeBatch", "StepModelLike"]
