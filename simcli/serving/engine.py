"""One (virtual) engine of a serving replica: its queues, its KV cache, its decode batch and
the iteration loop that a scheduler drives.

A replica (:mod:`simcli.serving.replica`) of ``tp x pp`` GPUs runs ``pp`` engines (vLLM's
"virtual engines"): with pipeline parallelism each engine owns ``1/pp`` of the KV cache and
its own queues, and up to ``pp`` batches (one per engine) are in flight. An engine knows its
replica only through :class:`EngineHost` (step model, scheduler, metrics, pipeline clock and
the disaggregation hooks), and its scheduler and metrics only through :class:`Scheduling`
and :class:`IterationMetrics`, so this module imports neither the replica nor the
schedulers nor the metrics: they import it. A multi-branch request's state
(``Request.branch``, a :class:`simcli.serving.branches.BranchState`) carries the branch
policy (fork, prune, finish) that the engine calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from simcli.serving import policy
from simcli.serving.batch import Batch, CappedDecodeBatch, DecodeBatch, StepModelLike
from simcli.serving.kv import BlockManager
from simcli.serving.requests import (
    ARRIVED,
    CANCELLED,
    FINISHED,
    PREFILLING,
    SENDING,
    SWAPPED,
    WAITING,
    Request,
    Sequence,
)

_EMPTY = np.zeros(0, dtype=np.int64)


class Scheduling(Protocol):
    """What an engine asks of its scheduler (:class:`simcli.serving.schedulers.Scheduler`):
    the next batch, and the policy code (:mod:`simcli.serving.policy`) whose queue order
    and preemption victim the engine's mechanism follows."""

    kind_code: int

    def schedule(self, engine: Engine) -> Batch | None: ...


class IterationMetrics(Protocol):
    """What an engine reports (:class:`simcli.serving.metrics.Metrics`)."""

    def iteration(self, engine: Engine, batch: Batch, dt_s: float) -> None: ...

    def tbt(self, gap_s: float, weight: int) -> None: ...

    def request_done(self, req: Request) -> None: ...


class EngineHost(Protocol):
    """What an engine uses of its replica (:class:`simcli.serving.replica.Replica`)."""

    index: int
    step_model: StepModelLike
    # the step model's step_s_summary when iterations are priced by it alone (no
    # speculative pricing, no per-stage pricing), else None
    step_summary: Callable[[list[int], list[int], int, int], float] | None
    scheduler: Scheduling
    metrics: IterationMetrics
    pp: int
    role: str
    spec: Any  # a SpecCost pricing speculative iterations, or None
    stage_fn: Callable[..., float] | None
    stage0_free_s: float
    swap_bytes_per_s: float
    kv_bytes_per_token: float
    outstanding: int
    hold_kv: bool
    handoff: Callable[..., list] | None
    on_free: Callable[[float], list] | None
    branch_stats: Any  # BranchStats of a multi-branch run, or None


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
        replica: EngineHost,
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
        # a sliding-window KV layout: blocks are layer-group units, old ones freed
        dec = self.decode
        self.capped = isinstance(dec, CappedDecodeBatch)
        self.unit_share = 1.0 / (dec.full + dec.capped) if self.capped else 1.0  # type: ignore[attr-defined]
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
        # the scheduler's policy (simcli.serving.policy): queue order, victim, admission
        self.kind = getattr(replica.scheduler, "kind_code", policy.VLLM)
        self.admissions = 0  # sequences admitted so far (vLLM V1's running-list order)
        self.reserved_blocks = 0  # TensorRT-LLM: whole-sequence blocks of the running ones
        # vLLM V0 multi-step: decode steps left in the running round, and what its end
        # delivers (finished sequences decode on to the round's end, as in vLLM)
        self.steps = getattr(getattr(replica.scheduler, "config", None), "scheduler_steps", 1)
        self.round_left = 0
        self.round_done: list[Sequence] = []
        self.round_joined: list[Sequence] = []

    # --- admission -----------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        """Blocks (units of a capped layout) a sequence of ``tokens`` cached tokens holds."""
        if self.capped:
            return self.decode.blocks_for(tokens)  # type: ignore[attr-defined]
        return -(-tokens // self.block_size)

    @property
    def num_running(self) -> int:
        return self.decode.n + len(self.prefilling)

    def enqueue(self, seq: Sequence, front: bool = False) -> None:
        """Queue ``seq`` (``front``: a preempted one): by the policy's key in an ordered
        queue (vLLM's priority heap), else at the back or the front."""
        seq.state = WAITING
        waiting = self.waiting
        if policy.ordered_queue(self.kind) and waiting:
            p, t = seq.request.priority, seq.request.arrival_s
            k1, k2 = policy.queue_key(self.kind, p, t)
            last = waiting[-1].request
            l1, l2 = policy.queue_key(self.kind, last.priority, last.arrival_s)
            if policy.key_greater(l1, l2, k1, k2):  # not the back: before the first greater
                i = 0
                for w in waiting:
                    w1, w2 = policy.queue_key(self.kind, w.request.priority, w.request.arrival_s)
                    if policy.key_greater(w1, w2, k1, k2):
                        break
                    i += 1
                waiting.insert(i, seq)
            else:
                waiting.append(seq)
        elif front:
            waiting.appendleft(seq)
        else:
            waiting.append(seq)
        self.queued_blocks += self.blocks_for(seq.prefill_target)

    def admission_cost(self, seq: Sequence, upto: int | None = None) -> tuple[int, int, object]:
        """``(blocks taken from available, prefix tokens reused, plan)`` for admitting the
        waiting sequence ``seq`` (``upto``: with KV for its first ``upto`` tokens only, the
        per-chunk allocators); ``plan`` is the prefix entry to reuse, a key to create, or
        None. A multi-branch root also takes a copy of its partial last block per extra
        branch."""
        bs = self.block_size
        target = seq.prefill_target
        total = self.blocks_for(target if upto is None else upto)
        req = seq.request
        if req.branch is not None:
            total += req.branch.extra_blocks(req, bs)
        kv = self.kv
        # a capped (sliding-window) layout frees prefix blocks: no prefix reuse
        if req.prefix_key is None or not kv.prefix_caching or self.capped:
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

    def admit(
        self, seq: Sequence, cached_tokens: int, plan: object, upto: int | None = None
    ) -> None:
        """Take the waiting queue's head: allocate its prompt's blocks (``upto``: those of
        its first ``upto`` tokens, the rest as its chunks are scheduled), reuse/create the
        prefix entry; it becomes PREFILLING (``seq.prefilled`` = reused tokens)."""
        popped = self.waiting.popleft()
        assert popped is seq
        bs = self.block_size
        self.queued_blocks -= self.blocks_for(seq.prefill_target)
        total = self.blocks_for(seq.prefill_target if upto is None else upto)
        self.admissions += 1
        seq.admitted = self.admissions
        if self.kind == policy.TRTLLM:  # the whole sequence's blocks stay promised to it
            self.reserved_blocks += self.final_blocks(seq)
        req = seq.request
        if req.branch is not None:
            total += req.branch.extra_blocks(req, bs)
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

    def final_blocks(self, seq: Sequence) -> int:
        """Blocks ``seq`` holds at its last decode step (prompt + output - 1 tokens in the
        cache): what TensorRT-LLM's ``GUARANTEED_NO_EVICT`` reserves for it."""
        return self.blocks_for(seq.prompt_tokens + seq.output_tokens - 1)

    def grow_prefill(self, seq: Sequence, upto: int) -> int:
        """Blocks a prefilling sequence still needs for KV of its first ``upto`` tokens
        (per-chunk allocation)."""
        need = self.blocks_for(upto) - seq.shared_blocks - seq.private_blocks
        return need if need > 0 else 0

    def preempt_prefill(self, seq: Sequence) -> None:
        """Evict a partly prefilled sequence (vLLM V1 preempts any running request): its
        blocks are freed and it waits again, its prefill to be redone."""
        self.prefilling.remove(seq)
        self.release_seq(seq)
        seq.request.preemptions += 1
        self.preemptions += 1
        seq.prefilled = 0
        self.enqueue(seq, front=policy.requeue_front(self.kind))

    def victim(self, with_prefilling: bool) -> Sequence:
        """The running sequence the policy preempts first (:func:`policy.victim_key`):
        over the decode batch (slot order), then the partly prefilled ones."""
        kind = self.kind
        dec = self.decode
        best = None
        b1 = b2 = 0.0
        lockstep = not dec.variable
        cands = [*dec.seqs, *self.prefilling] if with_prefilling else dec.seqs
        for s in cands:
            gen = s.generated
            if lockstep and s.slot >= 0:
                gen += dec.dit - s.join_dit
            req = s.request
            k1, k2 = policy.victim_key(
                kind, req.priority, req.arrival_s, s.admitted, gen, s.prompt_tokens
            )
            if best is None or policy.key_greater(k1, k2, b1, b2):
                best, b1, b2 = s, k1, k2
        assert best is not None
        return best

    # --- decode-phase KV -----------------------------------------------------------------
    def leave_decode(self, seq: Sequence) -> None:
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
        self.leave_decode(seq)
        kv = self.kv
        blocks = self.blocks_for(seq.ctx_tokens)  # its KV (not speculative lookahead)
        kv.release(seq.private_blocks)
        self._drop_prefix(seq)
        seq.private_blocks = 0
        seq.request.preemptions += 1
        self.preemptions += 1
        if mode == "swap":
            seq.state = SWAPPED
            seq.private_blocks = blocks  # now in host memory
            self.swapped.appendleft(seq)
            self.swap_bytes += (
                blocks * self.block_size * self.replica.kv_bytes_per_token * self.unit_share
            )
        else:
            # ctx = prompt + generated - 1 (the last token is not yet in the cache)
            seq.prefill_target = seq.ctx_tokens + 1
            seq.prefilled = 0
            seq.ctx_tokens = 0
            self.enqueue(seq, front=policy.requeue_front(self.kind))

    def reserve_decode_blocks(self, mode: str) -> bool:
        """Blocks for every decoding sequence's next token(s), preempting the policy's
        victims (:meth:`victim`) while they do not fit; a per-chunk policy (vLLM V1) takes
        partly prefilled sequences too. True if anything was preempted."""
        dec = self.decode
        kv = self.kv
        need = dec.needing_blocks()
        preempted = False
        partial = policy.allocates_per_chunk(self.kind)
        while need > kv.available_blocks and dec.n:
            victim = self.victim(partial)
            if victim.state == PREFILLING:
                self.preempt_prefill(victim)
            else:
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
                seq.private_blocks
                * self.block_size
                * self.replica.kv_bytes_per_token
                * self.unit_share
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
        while incoming and incoming[0].state == ARRIVED and self.num_running < max_seqs:
            seq = incoming.popleft()
            self.incoming_blocks -= seq.private_blocks
            kv_blocks = self.blocks_for(seq.ctx_tokens)
            self.kv.release(seq.private_blocks - kv_blocks)
            seq.private_blocks = kv_blocks
            dec.add(seq)
            self.joins.append(seq)

    def admit_decoding(self, seq: Sequence, now_s: float) -> list:
        """Decode-only pools: take a sequence whose prompt KV (``seq.ctx_tokens``) was
        computed elsewhere and transferred here (its blocks are allocated when it joins the
        decode batch)."""
        seq.private_blocks = self.blocks_for(seq.ctx_tokens)
        seq.state = SWAPPED
        self.incoming.append(seq)
        self.outstanding += 1
        self.replica.outstanding += 1
        return self.try_start(now_s)

    # --- disaggregation ------------------------------------------------------------------
    def transfer_blocks(self, seq: Sequence) -> int:
        """Blocks a decode engine reserves for a transfer of ``seq``'s KV: its prompt and
        the slot(s) of its next decode step, so that it can always join the batch."""
        return self.blocks_for(seq.ctx_tokens + self.decode.lookahead)

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
        summary = rep.step_summary
        if summary is not None:  # priced from the batch's lists and the decodes' sum
            n_dec = batch.n_decode
            ctx_sum = self.decode.context_sum() if n_dec else 0
            dt = summary(batch.prefill_new, batch.prefill_past, n_dec, ctx_sum) + batch.extra_s
            stage = dt / rep.pp
        else:
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
            stage = rep.stage_fn(new, past, ctx) if rep.stage_fn else dt / rep.pp
        start = now_s if now_s > rep.stage0_free_s else rep.stage0_free_s
        if rep.pp > 1:
            # the next micro-batch enters when this one leaves the slowest stage
            rep.stage0_free_s = start + stage + batch.extra_s
        else:
            rep.stage0_free_s = start + dt
        self.batch = batch
        self.batch_start_s = start
        self.busy_s += dt
        rep.metrics.iteration(self, batch, dt)
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
            if self.steps > 1:  # a multi-step round streams its tokens as one chunk at its end
                self.round_done.extend(done)
                self.round_joined.extend(joined)
                if self.round_left:  # mid-round: nothing reaches the client yet
                    done = joined = []
                else:
                    done, self.round_done = self.round_done, []
                    joined = [s for s in self.round_joined if s.slot >= 0]
                    self.round_joined = []
            if not self.round_left:  # tokens delivered now
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
                self.leave_decode(s)
                self.finish_sequence(s, now_s)
            if self.prune_at:
                for req in self.prune_at.pop(dec.dit, ()):
                    if req.branch.prune(self, req):
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
                    req.branch.fork(self, seq, now_s)
                elif seq.generated >= seq.output_tokens:
                    self.finish_sequence(seq, now_s)
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

    def finish_sequence(self, seq: Sequence, now_s: float) -> None:
        """``seq`` produced its last token: free its KV; the request completes when its
        last sequence does (a multi-branch request: see ``BranchState.finished``)."""
        self.release_seq(seq)
        if self.kind == policy.TRTLLM:
            self.reserved_blocks -= self.final_blocks(seq)
        seq.state = FINISHED
        req = seq.request
        done = req.sequence_finished(now_s)
        if done:
            self.outstanding -= 1
            self.replica.outstanding -= 1
        if req.branch is not None:
            req.branch.finished(self, seq, done)
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


__all__ = ["BatchDone", "Engine", "EngineHost", "IterationMetrics", "Scheduling"]
