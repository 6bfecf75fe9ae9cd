"""One serving replica: its KV cache, its queues, and the iteration loop that a scheduler
drives.

A replica is ``tp x pp`` GPUs holding one copy of the model. It runs ``pp`` *engines* (vLLM's
"virtual engines"): with pipeline parallelism each engine owns ``1/pp`` of the KV cache and
its own queues, and up to ``pp`` batches (one per engine) are in flight, entering the
pipeline one slowest-stage time apart (``StepModel.stage_s``; ``step_s / pp`` for a step
model without it). The simplification: a batch's iteration time is the StepModel's
``step_s`` (the whole pipeline's forward pass), and micro-batches only wait for the
previous one to clear the slowest stage -- unequal micro-batches do not stall each other
further down the pipeline. With ``pp = 1`` there is one engine and
iterations run back to back.

Decoding sequences advance in lockstep: every decode iteration adds one token to each
sequence in the decode batch (all schedulers here put every running decode in every
iteration that decodes). :class:`DecodeBatch` exploits that: a sequence's context is
``ctx0[slot] + dit`` where ``dit`` counts the batch's decode iterations, so an iteration
costs O(1) bookkeeping plus one numpy add, whatever the batch size; the sequences needing
a new KV block are those whose context is a multiple of the block size, counted per
residue class; finishes are bucketed by the decode iteration they happen at. A sequence's
per-token history is never stored.

Extension points: ``Replica.role`` is ``"mixed"`` (prefill and decode), ``"prefill"`` (a
finished prefill is handed to ``Replica.handoff`` instead of decoding here) or
``"decode"`` (sequences arrive with their KV through :meth:`Engine.admit_decoding`, or
through the transfer methods that :mod:`simcli.serving.disagg` drives); a request may own
several sequences (branches, :mod:`simcli.serving.branches`) that are scheduled
independently; a speculative engine swaps the lockstep batch for
:class:`simcli.serving.spec.SpecDecodeBatch` and prices iterations with ``Replica.spec``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from simcli.serving.branches import branch_finished, fork, fork_extra_blocks, prune
from simcli.serving.kv import BlockManager
from simcli.serving.requests import (
    ARRIVED,
    CANCELLED,
    DECODING,
    FINISHED,
    PREFILLING,
    SENDING,
    SWAPPED,
    WAITING,
    Request,
    Sequence,
)

if TYPE_CHECKING:
    from simcli.serving.metrics import Metrics
    from simcli.serving.schedulers import Scheduler


class StepModelLike(Protocol):
    """What the simulator uses of ``costmodels.steps.serving.StepModel``."""

    kv_bytes_per_token: float

    def step_s(
        self, prefill_new: np.ndarray, prefill_past: np.ndarray, decode_ctx: np.ndarray
    ) -> float: ...

    def kv_capacity_tokens(self, block_size: int, gpu_memory_utilization: float) -> int: ...


_EMPTY = np.zeros(0, dtype=np.int64)


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


class BatchDone:
    """Event: an engine's iteration finished."""

    __slots__ = ("time_s", "engine")

    def __init__(self, time_s: float, engine: Engine) -> None:
        self.time_s = time_s
        self.engine = engine

    def handle(self, sim: object) -> list:
        return self.engine.finish_batch(self.time_s)


class Engine:
    """Queues, KV cache and decode batch of one (virtual) engine; mechanism only, the
    :class:`~simcli.serving.schedulers.Scheduler` decides what runs."""

    def __init__(
        self,
        replica: Replica,
        index: int,
        num_blocks: int,
        block_size: int,
        prefix_caching: bool,
        watermark: float,
        decode_batch: object = None,
    ) -> None:
        self.replica = replica
        self.index = index
        self.block_size = block_size
        self.kv = BlockManager(num_blocks, block_size, prefix_caching)
        self.watermark_blocks = int(watermark * num_blocks)
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.incoming: deque[Sequence] = deque()  # decode-only pools: KV already transferred
        self.decode: DecodeBatch = decode_batch or DecodeBatch(block_size)  # type: ignore[assignment]
        self.joins: list[Sequence] = []  # joined the decode batch since its last iteration
        self.batch: Batch | None = None
        self.batch_start_s = 0.0
        self.outstanding = 0  # requests routed here and not finished
        self.queued_blocks = 0  # KV demand of the waiting queue (routing hint)
        self.last_decode_end_s = 0.0
        self.preemptions = 0
        self.swap_bytes = 0.0
        self.busy_s = 0.0
        # disaggregation: prefilled sequences whose KV is still here (queued or in flight)
        self.sending: dict[int, Sequence] = {}
        # disaggregation: blocks allocated here for transfers in flight or arrived
        self.incoming_blocks = 0
        self.in_transit = 0  # transfers in flight to this engine
        # multi-branch: requests whose branches a PRM checks, by decode iteration
        self.prune_at: dict[int, list[Request]] = {}

    # --- admission -----------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return self.decode.n + len(self.prefilling)

    def enqueue(self, seq: Sequence, front: bool = False) -> None:
        seq.state = WAITING
        if front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)
        self.queued_blocks += -(-seq.prefill_target // self.block_size)

    def admission_cost(self, seq: Sequence) -> tuple[int, int, object]:
        """``(blocks taken from available, prefix tokens reused, plan)`` for admitting the
        waiting sequence ``seq``; ``plan`` is the prefix entry to reuse, a key to create, or
        None. A multi-branch root also takes a copy of its partial last block per extra
        branch."""
        bs = self.block_size
        target = seq.prefill_target
        total = -(-target // bs)
        req = seq.request
        if req.branch is not None:
            total += fork_extra_blocks(req, bs)
        kv = self.kv
        if req.prefix_key is None or not kv.prefix_caching:
            return total, 0, None
        pb = min(req.prefix_tokens, target - 1) // bs
        if pb <= 0:
            return total, 0, None
        key = (req.prefix_key, pb)
        entry = kv.lookup(key)
        if entry is None:
            return total, 0, key
        if entry.ready:
            return total - pb + kv.acquire_cost(entry), pb * bs, entry
        return total, 0, None

    def can_admit(self, cost: int) -> bool:
        running = self.decode.n or self.prefilling
        watermark = self.watermark_blocks if running else 0
        return self.kv.available_blocks - cost >= watermark

    def admit(self, seq: Sequence, cached_tokens: int, plan: object) -> None:
        """Take the waiting queue's head: allocate its prompt's blocks, reuse/create the
        prefix entry; it becomes PREFILLING (``seq.prefilled`` = reused tokens)."""
        popped = self.waiting.popleft()
        assert popped is seq
        bs = self.block_size
        total = -(-seq.prefill_target // bs)
        self.queued_blocks -= total
        req = seq.request
        if req.branch is not None:
            total += fork_extra_blocks(req, bs)
        kv = self.kv
        if plan is None:
            seq.shared_blocks = 0
        elif isinstance(plan, tuple):
            pb = plan[1]
            seq.prefix_entry = kv.create(plan, pb)
            seq.owns_prefix = True
            seq.shared_blocks = pb
        else:
            kv.acquire(plan)  # type: ignore[arg-type]
            seq.prefix_entry = plan
            seq.shared_blocks = plan.blocks  # type: ignore[attr-defined]
        seq.private_blocks = total - seq.shared_blocks
        kv.allocate(seq.private_blocks)
        seq.prefilled = cached_tokens
        seq.state = PREFILLING
        self.prefilling.append(seq)

    # --- decode-phase KV -----------------------------------------------------------------
    def _leave_decode(self, seq: Sequence) -> None:
        """Remove from the decode batch and settle its block count."""
        if self.decode.dit > seq.join_dit:
            seq.last_token_s = self.last_decode_end_s
        seq.private_blocks = self.decode.remove(seq) - seq.shared_blocks

    def _drop_prefix(self, seq: Sequence) -> None:
        if seq.prefix_entry is not None:
            self.kv.release_entry(seq.prefix_entry)
            seq.prefix_entry = None
            seq.owns_prefix = False
        group = seq.fork
        if group is not None:
            group.refs -= 1
            if not group.refs:
                self.kv.release(group.blocks)
            seq.fork = None
        seq.shared_blocks = 0

    def release_seq(self, seq: Sequence) -> None:
        """Free everything ``seq`` holds on the GPU (private blocks, shared references)."""
        self.kv.release(seq.private_blocks)
        self._drop_prefix(seq)
        seq.private_blocks = 0

    def preempt(self, seq: Sequence, mode: str) -> None:
        """Evict a decoding sequence: ``recompute`` drops its KV and requeues it at the
        front (its next prefill recomputes prompt + generated tokens); ``swap`` copies its
        blocks to host memory (swap-out time charged to this iteration)."""
        self._leave_decode(seq)
        kv = self.kv
        blocks = -(-seq.ctx_tokens // self.block_size)  # its KV (not speculative lookahead)
        kv.release(seq.private_blocks)
        self._drop_prefix(seq)
        seq.private_blocks = 0
        seq.request.preemptions += 1
        self.preemptions += 1
        if mode == "swap":
            seq.state = SWAPPED
            seq.private_blocks = blocks  # now in host memory
            self.swapped.appendleft(seq)
            self.swap_bytes += blocks * self.block_size * self.replica.kv_bytes_per_token
        else:
            # ctx = prompt + generated - 1 (the last token is not yet in the cache)
            seq.prefill_target = seq.ctx_tokens + 1
            seq.prefilled = 0
            seq.ctx_tokens = 0
            self.enqueue(seq, front=True)

    def reserve_decode_blocks(self, mode: str) -> bool:
        """Blocks for every decoding sequence's next token(s), preempting the newest
        sequences while they do not fit (vLLM). True if anything was preempted."""
        dec = self.decode
        kv = self.kv
        need = dec.needing_blocks()
        preempted = False
        while need > kv.available_blocks and dec.n:
            victim = dec.newest()
            need -= dec.blocks_needed(victim)
            self.preempt(victim, mode)
            preempted = True
        kv.allocate(need)
        dec.reserved()
        return preempted

    def resume(self, batch: Batch, max_seqs: int, swapped: bool = True) -> None:
        """Bring swapped-out (if ``swapped``) then transferred-in sequences back into the
        decode batch, oldest first, while their blocks fit; swap-in traffic is charged to
        ``batch``. Runs after the batch's blocks were reserved: joiners take their own."""
        dec = self.decode
        kv = self.kv
        queue = self.swapped
        while swapped and queue and self.num_running < max_seqs:
            seq = queue[0]
            cost = seq.private_blocks + dec.join_need(seq)
            if not self.can_admit(cost):
                break
            queue.popleft()
            kv.allocate(cost)
            self.swap_bytes += (
                seq.private_blocks * self.block_size * self.replica.kv_bytes_per_token
            )
            seq.shared_blocks = 0
            dec.add(seq, reserved=True)
            self.joins.append(seq)
        queue = self.incoming
        while queue and self.num_running < max_seqs:
            seq = queue[0]
            if seq.state == ARRIVED:  # its blocks, next token's included, were reserved
                queue.popleft()
                self.incoming_blocks -= seq.private_blocks
            else:  # admit_decoding: blocks allocated now
                cost = seq.private_blocks + dec.join_need(seq)
                if not self.can_admit(cost):
                    return
                queue.popleft()
                kv.allocate(cost)
            seq.shared_blocks = 0
            dec.add(seq, reserved=True)
            self.joins.append(seq)

    def join_arrived(self, max_seqs: int) -> None:
        """Transferred-in sequences join the decode batch before its blocks are reserved,
        so they take part in (and can be victims of) preemption: the blocks reserved for
        their next token are handed back for that reservation to take."""
        incoming = self.incoming
        dec = self.decode
        bs = self.block_size
        while incoming and incoming[0].state == ARRIVED and self.num_running < max_seqs:
            seq = incoming.popleft()
            self.incoming_blocks -= seq.private_blocks
            kv_blocks = -(-seq.ctx_tokens // bs)
            self.kv.release(seq.private_blocks - kv_blocks)
            seq.private_blocks = kv_blocks
            dec.add(seq)
            self.joins.append(seq)

    def admit_decoding(self, seq: Sequence, now_s: float) -> list:
        """Decode-only pools: take a sequence whose prompt KV (``seq.ctx_tokens``) was
        computed elsewhere and transferred here (its blocks are allocated when it joins the
        decode batch)."""
        seq.private_blocks = -(-seq.ctx_tokens // self.block_size)
        seq.state = SWAPPED
        self.incoming.append(seq)
        self.outstanding += 1
        self.replica.outstanding += 1
        return self.try_start(now_s)

    # --- disaggregation ------------------------------------------------------------------
    def transfer_blocks(self, seq: Sequence) -> int:
        """Blocks a decode engine reserves for a transfer of ``seq``'s KV: its prompt and
        the slot(s) of its next decode step, so that it can always join the batch."""
        return -(-(seq.ctx_tokens + self.decode.lookahead) // self.block_size)

    def can_take_transfer(self, blocks: int, max_seqs: int) -> bool:
        if self.num_running + len(self.incoming) + self.in_transit >= max_seqs:
            return False
        return self.can_admit(blocks)

    def start_transfer_in(self, blocks: int) -> None:
        """Reserve the blocks a transfer will write into."""
        self.kv.allocate(blocks)
        self.incoming_blocks += blocks
        self.in_transit += 1

    def transfer_arrived(self, seq: Sequence, blocks: int, now_s: float) -> list:
        """The transfer into ``blocks`` reserved blocks completed (the sender has freed its
        copy)."""
        self.in_transit -= 1
        seq.state = ARRIVED
        seq.private_blocks = blocks
        seq.shared_blocks = 0
        self.incoming.append(seq)
        self.outstanding += 1
        self.replica.outstanding += 1
        return self.try_start(now_s)

    def transfer_sent(self, seq: Sequence, now_s: float) -> list:
        """A prefill engine's KV of ``seq`` reached the decode side: free it here."""
        del self.sending[id(seq)]
        self.release_seq(seq)
        return self.try_start(now_s)

    # --- multi-branch --------------------------------------------------------------------
    def schedule_prune(self, req: Request) -> None:
        at = self.decode.dit + req.branch.config.prune_interval  # type: ignore[union-attr]
        bucket = self.prune_at.get(at)
        if bucket is None:
            self.prune_at[at] = [req]
        else:
            bucket.append(req)

    # --- the iteration loop --------------------------------------------------------------
    def try_start(self, now_s: float) -> list:
        """Schedule and launch the next iteration if idle and there is work."""
        if self.batch is not None:
            return []
        rep = self.replica
        batch = rep.scheduler.schedule(self)
        if batch is None:
            return []
        if self.swap_bytes:
            batch.extra_s += self.swap_bytes / rep.swap_bytes_per_s
            self.swap_bytes = 0.0
        if batch.prefills:
            new = np.array(batch.prefill_new, dtype=np.int64)
            past = np.array(batch.prefill_past, dtype=np.int64)
        else:
            new = past = _EMPTY
        ctx = self.decode.contexts() if batch.n_decode else _EMPTY
        if rep.spec is None:
            dt = rep.step_model.step_s(new, past, ctx) + batch.extra_s
        else:
            dt = rep.spec.iteration_s(new, past, ctx) + batch.extra_s
        start = now_s if now_s > rep.stage0_free_s else rep.stage0_free_s
        if rep.pp > 1:
            # the next micro-batch enters when this one leaves the slowest stage
            stage = rep.stage_fn(new, past, ctx) if rep.stage_fn else dt / rep.pp
            rep.stage0_free_s = start + stage + batch.extra_s
        else:
            rep.stage0_free_s = start + dt
        self.batch = batch
        self.batch_start_s = start
        self.busy_s += dt
        rep.metrics.iteration(self, batch, dt, new, ctx)
        return [BatchDone(start + dt, self)]

    def finish_batch(self, now_s: float) -> list:
        batch = self.batch
        assert batch is not None
        self.batch = None
        rep = self.replica
        metrics = rep.metrics
        events: list = []
        if batch.n_decode:
            dec = self.decode
            done = dec.advance()
            joined = batch.joined
            if dec.variable:
                dec.record_tbt(metrics, now_s - self.last_decode_end_s, joined, now_s)  # type: ignore[attr-defined]
            else:
                old = batch.n_decode - len(joined)
                if old:
                    metrics.tbt(now_s - self.last_decode_end_s, old)
                for s in joined:
                    metrics.tbt(now_s - s.last_token_s, 1)
            self.last_decode_end_s = now_s
            for s in done:
                if s.slot < 0:  # cancelled by a sibling branch that finished first
                    continue
                self._leave_decode(s)
                self._finish(s, now_s)
            if self.prune_at:
                for req in self.prune_at.pop(dec.dit, ()):
                    if prune(self, req):
                        self.schedule_prune(req)
        if batch.prefills:
            bs = self.block_size
            for seq, n_new in zip(batch.prefills, batch.prefill_new, strict=True):
                if seq.state != PREFILLING:  # a branch cancelled above
                    continue
                seq.prefilled += n_new
                if seq.owns_prefix and seq.prefilled >= seq.shared_blocks * bs:
                    self.kv.touch(seq.prefix_entry)  # type: ignore[arg-type]
                    seq.owns_prefix = False
                if seq.prefilled < seq.prefill_target:
                    continue
                self.prefilling.remove(seq)
                seq.ctx_tokens = seq.prefill_target
                seq.generated += 1
                req = seq.request
                if rep.role == "prefill" and seq.generated < seq.output_tokens:
                    events.extend(self._hand_off(seq, now_s))
                    continue
                if req.first_token_s is None:
                    req.first_token_s = now_s
                else:
                    metrics.tbt(now_s - seq.last_token_s, 1)
                seq.last_token_s = now_s
                if req.branch is not None and not req.branch.forked:
                    fork(self, seq, now_s)
                elif seq.generated >= seq.output_tokens:
                    self._finish(seq, now_s)
                else:
                    self.decode.add(seq)
                    self.joins.append(seq)
        events.extend(self.try_start(now_s))
        if rep.on_free is not None:
            events.extend(rep.on_free(now_s))
        return events

    def _hand_off(self, seq: Sequence, now_s: float) -> list:
        """A prefill-only replica finished ``seq``'s prompt: pass it to the decode pool.
        With ``Replica.hold_kv`` its KV stays here until the transfer completes
        (:meth:`transfer_sent`); otherwise it is freed now."""
        rep = self.replica
        self.outstanding -= 1
        rep.outstanding -= 1
        if rep.hold_kv:
            seq.state = SENDING
            self.sending[id(seq)] = seq
            return rep.handoff(seq, now_s, self, now_s - self.batch_start_s)  # type: ignore[misc]
        # the extension-point contract: the first token counts at the prefill's end
        if seq.request.first_token_s is None:
            seq.request.first_token_s = now_s
        seq.last_token_s = now_s
        self.release_seq(seq)
        return rep.handoff(seq, now_s)  # type: ignore[misc]

    def _finish(self, seq: Sequence, now_s: float) -> None:
        self.release_seq(seq)
        seq.state = FINISHED
        req = seq.request
        done = req.sequence_finished(now_s)
        if done:
            self.outstanding -= 1
            self.replica.outstanding -= 1
        if req.branch is not None:
            branch_finished(self, seq, done)
        if done:
            self.replica.metrics.request_done(req)

    def check(self) -> None:
        """Invariants (tests): KV within capacity and equal to what sequences hold."""
        kv = self.kv
        kv.check()
        dec = self.decode
        in_flight = self.batch is not None and self.batch.n_decode > 0
        # blocks reserved for the in-flight decode step are counted by held_blocks
        held = dec.held_blocks(bool(in_flight)) - sum(s.shared_blocks for s in dec.seqs)
        holders = self._holders()
        held += sum(s.private_blocks for s in self.prefilling)
        held += sum(s.private_blocks for s in self.sending.values())
        held += self.incoming_blocks
        entries = {id(s.prefix_entry): s.prefix_entry for s in holders if s.prefix_entry}
        held += sum(e.blocks for e in entries.values())  # type: ignore[union-attr]
        groups = {id(s.fork): s.fork for s in holders if s.fork is not None}
        held += sum(g.blocks for g in groups.values())  # type: ignore[attr-defined]
        assert dec.context_sum() == int(dec.contexts().sum())
        assert held == kv.active_blocks, (held, kv.active_blocks)
        for s in holders:
            assert s.state not in (FINISHED, CANCELLED), s.state

    def _holders(self) -> list[Sequence]:
        return [*self.decode.seqs, *self.prefilling, *self.sending.values()]


class Replica:
    """``tp x pp`` GPUs serving one model copy: ``pp`` engines sharing the KV cache.

    ``role``: ``mixed``, ``prefill`` (finished prefills go to ``handoff``) or ``decode``.
    ``hold_kv``: a prefill replica keeps a handed-off sequence's KV until the decode side
    calls :meth:`Engine.transfer_sent` (``handoff(seq, now_s, engine, prefill_s)``);
    without it the KV is freed first (``handoff(seq, now_s)``). ``on_free(now_s)`` runs
    after each iteration (a decode pool pulls waiting transfers). ``spec``: a
    :class:`~simcli.serving.spec.SpecCost` pricing speculative iterations, with
    ``decode_batch(engine_index)`` building each engine's decode batch.
    """

    def __init__(
        self,
        index: int,
        step_model: StepModelLike,
        scheduler: Scheduler,
        metrics: Metrics,
        *,
        kv_capacity_tokens: int,
        block_size: int = 16,
        pp: int = 1,
        prefix_caching: bool = True,
        watermark: float = 0.01,
        swap_bytes_per_s: float = 25e9,
        role: str = "mixed",
        handoff: Callable[..., list] | None = None,
        hold_kv: bool = False,
        spec: object = None,
        decode_batch: Callable[[int], object] | None = None,
        kv_bytes_per_token: float | None = None,
        gpus: int = 1,
    ) -> None:
        self.index = index
        self.step_model = step_model
        self.scheduler = scheduler
        self.metrics = metrics
        self.pp = pp
        self.role = role
        self.handoff = handoff
        self.hold_kv = hold_kv
        self.on_free: Callable[[float], list] | None = None
        self.spec = spec
        self.branch_stats = None
        self.energy = None  # the EnergyMeter its iterations are priced by, if any
        self.gpus = gpus
        self.block_size = block_size
        self.kv_bytes_per_token = float(
            step_model.kv_bytes_per_token if kv_bytes_per_token is None else kv_bytes_per_token
        )
        self.swap_bytes_per_s = swap_bytes_per_s
        self.stage0_free_s = 0.0
        # StepModel.stage_s (the slowest pipeline stage), if the step model has it
        self.stage_fn = getattr(step_model, "stage_s", None) if pp > 1 else None
        self.outstanding = 0
        self.kv_capacity_tokens = kv_capacity_tokens
        blocks = kv_capacity_tokens // block_size // pp
        self.engines = [
            Engine(
                self,
                i,
                blocks,
                block_size,
                prefix_caching,
                watermark,
                decode_batch(i) if decode_batch is not None else None,
            )
            for i in range(pp)
        ]
        self.blocks_per_engine = blocks

    @property
    def available_blocks(self) -> int:
        return sum(e.kv.available_blocks - e.queued_blocks for e in self.engines)

    def has_prefix(self, req: Request) -> bool:
        if req.prefix_key is None:
            return False
        pb = min(req.prefix_tokens, req.prompt_tokens - 1) // self.block_size
        key = (req.prefix_key, pb)
        return any(e.kv.has_ready(key) for e in self.engines)

    def add_request(self, req: Request, now_s: float) -> list:
        """Take a routed request: queue its sequences on the least-loaded engine (a
        multi-branch request: its root, which forks after its prefill)."""
        req.replica = self.index
        self.outstanding += 1
        engines = self.engines
        eng = engines[0]
        if len(engines) > 1:
            for e in engines:
                if e.outstanding < eng.outstanding:
                    eng = e
        eng.outstanding += 1
        if req.branch is not None:
            root = req.seqs[0]
            root.seats = req.branch.config.branches
            eng.enqueue(root)
        else:
            for seq in req.seqs:
                eng.enqueue(seq)
        return eng.try_start(now_s)

    def check(self) -> None:
        for e in self.engines:
            e.check()


__all__ = ["Batch", "BatchDone", "DecodeBatch", "Engine", "Replica", "StepModelLike"]
