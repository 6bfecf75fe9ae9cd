"""Replica schedulers: which sequences run in an engine's next iteration.

A scheduler owns its policy -- the order of the waiting queue, the admission test and the
preemption victim -- as the pure functions of :mod:`simcli.serving.policy`, which the
compiled loop (:mod:`simcli.serving.fastsched`) calls too; the engine
(:mod:`simcli.serving.engine`) supplies the mechanism (paged KV blocks, the lockstep
decode batch, recompute/swap). :func:`make_scheduler` is a registry: one class per name.

vLLM V0-style (the same KV cache and preemption: the newest decoding sequence is evicted,
by recompute or swap, when the running sequences' next tokens do not fit; every running
decode in every iteration that decodes):

- ``vllm`` (vLLM V0 default, Kwon et al. SOSP 2023): prefill-first. An iteration with
  waiting requests that fit runs only their (whole) prefills; decodes run in iterations
  with no admissible prefill. Low TTFT at low load; decodes stall behind long prompts.
- ``orca`` (Yu et al. OSDI 2022): iteration-level scheduling, mixed batches: each iteration
  runs all decodes plus whole prefills of newly admitted requests (no chunking), so a long
  prompt makes that iteration long for every decode in it. (Orca itself reserves each
  request's maximum length up front; here it shares the paged KV cache of the others, so
  the comparison isolates the batching policy.)
- ``sarathi`` (Sarathi-Serve, Agrawal et al. OSDI 2024): stall-free batching under a token
  budget (``chunk_size``): decodes first, then the chunks of partly-done prefills, then new
  prefills, each chunk cut to what is left of the budget. Bounded iteration time, hence low
  TBT/TPOT tails, at the cost of slower prefills.

Real engines' schedulers (``docs/schedulers.md`` has the sources and their versions):

- ``vllm-v1`` / ``priority``: vLLM V1 (:class:`VllmV1Scheduler`), FCFS or priority queue.
- ``sglang``: SGLang (:class:`SglangScheduler`).
- ``trtllm``: TensorRT-LLM's ``GUARANTEED_NO_EVICT`` in-flight batching
  (:class:`TrtllmScheduler`).

Knobs follow vLLM: ``max_batch_size`` (max_num_seqs, running sequences per engine),
``max_tokens`` (max_num_batched_tokens per iteration; default max(model context, 2048) as in
vLLM V0; a prefill longer than it still runs, alone, rather than never), ``watermark``
(fraction of KV blocks kept free when admitting new prompts, V0 only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcli.serving import policy
from simcli.serving.batch import Batch
from simcli.serving.engine import Engine
from simcli.serving.requests import PREFILLING

SCHEDULERS = policy.KINDS
PREEMPTION = ("recompute", "swap")
SchedulerKind = policy.SchedulerKind
# the schedulers of real engines (not V0-style): recompute only, no branches/spec/disagg
ENGINE_SCHEDULERS = ("vllm-v1", "sglang", "trtllm", "priority", "trtllm-max-util")
# the classic scheduler closest to each: chunked prefill under a token budget (sarathi) or
# whole prefills first (vllm), for the features only the classic ones model
_CLASSIC = {"vllm-v1": "sarathi", "sglang": "sarathi", "priority": "sarathi"}


def classic_scheduler(kind: str | None) -> str | None:
    """``kind`` itself, or for an engine's scheduler the closest classic one (what a
    disaggregated, speculative, multi-branch or swapping run takes instead)."""
    if kind not in ENGINE_SCHEDULERS:
        return kind
    return _CLASSIC.get(kind, "vllm")


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: SchedulerKind = "vllm"
    max_batch_size: int = Field(default=256, gt=0, description="running sequences per engine")
    max_tokens: int = Field(
        default=8192, gt=0, description="tokens per iteration (vllm, orca, vllm-v1, trtllm)"
    )
    chunk_size: int = Field(default=512, gt=0, description="sarathi token budget per iteration")
    preemption: Literal["recompute", "swap"] = "recompute"
    watermark: float = Field(default=0.01, ge=0, lt=1, description="KV fraction kept free")
    long_prefill_token_threshold: int = Field(
        default=0, ge=0, description="vllm-v1: most prefill tokens of one request per step (0: off)"
    )
    chunked_prefill_size: int = Field(
        default=8192, gt=0, description="sglang: prefill chunk tokens per iteration"
    )
    max_prefill_tokens: int = Field(
        default=16384, gt=0, description="sglang: prompt tokens of one prefill batch"
    )
    init_new_token_ratio: float = Field(
        default=policy.SGLANG_INIT_RATIO, gt=0, le=1, description="sglang: starting ratio"
    )
    scheduler_steps: int = Field(
        default=1, ge=1, le=64, description="vllm (V0): decode steps per scheduler call "
        "(--num-scheduler-steps; rounds, see VllmScheduler)"
    )  # fmt: skip

    @model_validator(mode="after")
    def _multi_step_is_vllm_v0(self) -> SchedulerConfig:
        if self.scheduler_steps > 1 and self.kind != "vllm":
            raise ValueError(
                f"scheduler_steps {self.scheduler_steps} with scheduler {self.kind}: multi-step "
                "rounds are vLLM V0's (no chunked prefill); allowed: scheduler vllm, or 1"
            )
        return self


_REGISTRY: dict[str, type[Scheduler]] = {}


def register(name: str) -> Callable[[type[Scheduler]], type[Scheduler]]:
    """Class decorator: the scheduler ``make_scheduler`` builds for ``name``."""

    def add(cls: type[Scheduler]) -> type[Scheduler]:
        assert name in policy.KINDS, name
        _REGISTRY[name] = cls
        return cls

    return add


class Scheduler:
    """Policy over an :class:`~simcli.serving.engine.Engine`; subclasses pick prefills."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.max_seqs = config.max_batch_size
        self.mode = config.preemption
        self.kind_code = policy.kind_code(config.kind)

    def schedule(self, engine: Engine) -> Batch | None:
        raise NotImplementedError

    # shared steps -------------------------------------------------------------------------
    def _decodes(self, engine: Engine, batch: Batch) -> bool:
        """Reserve KV for every decode (preempting the policy's victims if short), resume
        swapped ones, and put them all in ``batch``; whether anything was preempted."""
        if engine.incoming:
            engine.join_arrived(self.max_seqs)
        preempted = engine.reserve_decode_blocks(self.mode) if engine.decode.n else False
        if (engine.swapped and not preempted) or engine.incoming:
            # no swap-in right after a preemption (vLLM); transferred-in KV always joins
            engine.resume(batch, self.max_seqs, swapped=not preempted)
        n = engine.decode.n
        if n:
            batch.n_decode = n
            joins = engine.joins
            if joins:
                seen: dict[int, object] = {}
                for s in joins:
                    if s.slot >= 0:
                        seen[id(s)] = s
                batch.joined = list(seen.values())  # type: ignore[arg-type]
                engine.joins = []
        return preempted

    def _fits(self, engine: Engine, seq: object, cost: int) -> bool:
        """The policy's admission test (:func:`policy.admit_fits`) of a waiting sequence
        taking ``cost`` blocks now."""
        kv = engine.kv
        final = engine.final_blocks(seq) if self.kind_code == policy.TRTLLM else 0  # type: ignore[arg-type]
        return policy.admit_fits(
            self.kind_code, kv.available_blocks, cost, engine.watermark_blocks,
            bool(engine.decode.n or engine.prefilling), engine.reserved_blocks, final,
            kv.num_blocks,
        )  # fmt: skip

    def _admit(self, engine: Engine, batch: Batch, token_room: int, chunked: bool) -> int:
        """Admit waiting sequences in queue order while seats, tokens and KV allow;
        returns the token room left. A per-chunk allocator (vLLM V1) takes the blocks of
        the chunk it schedules, not the whole prompt's."""
        waiting = engine.waiting
        max_seqs = self.max_seqs
        kind = self.kind_code
        per_chunk = policy.allocates_per_chunk(kind)
        threshold = self.config.long_prefill_token_threshold
        while waiting and engine.num_running < max_seqs:
            seq = waiting[0]
            if seq.seats > 1 and engine.num_running and engine.num_running + seq.seats > max_seqs:
                break  # a multi-branch root needs a seat per branch (unless alone)
            if chunked and token_room <= 0:
                break
            if per_chunk:
                _, cached, _ = engine.admission_cost(seq)
                n = policy.chunk_tokens(kind, seq.prefill_target - cached, token_room, threshold)
                upto = cached + n
                cost, cached, plan = engine.admission_cost(seq, upto)
            else:
                upto = None
                cost, cached, plan = engine.admission_cost(seq)
                todo = seq.prefill_target - cached
                if chunked:
                    n = policy.chunk_tokens(kind, todo, token_room, 0)
                else:
                    n = todo
                    if n > token_room and batch.prefills:
                        break  # too long for what is left; a lone over-long prefill still runs
            if not self._fits(engine, seq, cost):
                break
            engine.admit(seq, cached, plan, upto)
            batch.add_prefill(seq, n)
            token_room -= n
        return token_room


@register("vllm")
class VllmScheduler(Scheduler):
    """Prefill-first, whole prefills, decodes when no prefill is admissible.

    With ``scheduler_steps`` N > 1 (vLLM 0.6's ``--num-scheduler-steps``, PR #7000 and
    RFC #6854): a decode batch runs as a round of N steps scheduled once; nothing is
    admitted until the round ends, so a new request waits for the running round (RFC
    #6854: "new prefill requests will only start at every N steps"). A prefill step stays
    a single step (``_get_num_lookahead_slots(is_prefill=True)`` is 0). The engine
    (:meth:`Engine.finish_batch`) delivers a round's tokens together at its end.
    """

    def schedule(self, engine: Engine) -> Batch | None:
        batch = Batch()
        if engine.round_left:  # inside a multi-step round: its decodes only
            engine.round_left -= 1
            self._decodes(engine, batch)
            if batch.n_decode:
                return batch
            engine.round_left = 0  # everything preempted: the round is over
        if engine.waiting and not engine.swapped:
            self._admit(engine, batch, self.config.max_tokens, chunked=False)
            if batch.prefills:
                return batch
        if not engine.decode.n and not engine.swapped and not engine.incoming:
            return None
        self._decodes(engine, batch)
        if batch.n_decode:
            engine.round_left = self.config.scheduler_steps - 1
            return batch
        if engine.waiting and not engine.swapped:  # everything was preempted: prefill again
            self._admit(engine, batch, self.config.max_tokens, chunked=False)
        return batch if batch.prefills else None


@register("orca")
class OrcaScheduler(Scheduler):
    """Iteration-level mixed batches: all decodes plus whole new prefills."""

    def schedule(self, engine: Engine) -> Batch | None:
        batch = Batch()
        self._decodes(engine, batch)
        if engine.waiting and not engine.swapped:
            self._admit(engine, batch, self.config.max_tokens - batch.n_decode, chunked=False)
        return batch if batch.prefills or batch.n_decode else None


@register("trtllm")
class TrtllmScheduler(OrcaScheduler):
    """TensorRT-LLM's in-flight batching under ``GUARANTEED_NO_EVICT`` (the default
    ``CapacitySchedulerPolicy``; ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``
    at 02a10fed): requests in progress keep the blocks their whole sequence needs; a
    pending request starts only if its whole sequence (prompt + output) fits what is left
    (``enoughAvailableBlocks``, else the loop breaks: FCFS), so nothing is ever evicted.
    The micro-batch scheduler runs every generation request and whole contexts (chunked
    context is off by default) within ``max_num_tokens`` (``max_tokens``), as Orca's
    mixed batches. The output length stands for ``max_tokens`` of the request, as a
    benchmark client sets it."""


@register("trtllm-max-util")
class TrtllmMaxUtilScheduler(OrcaScheduler):
    """TensorRT-LLM's ``MAX_UTILIZATION`` capacity policy (``MaxUtilizationScheduler`` in
    ``capacityScheduler.cpp`` at 02a10fed): requests are taken in order while the blocks
    of their next step fit (``prepareNewNumberOfBlocksIfWeEndUpScheduling``: a context's
    whole prompt, a generation step's new block); when one does not fit, the last started
    request is paused (``schedulingRemoveSequence``: its KV freed, its context recomputed
    later) and the request retried. Batching as :class:`TrtllmScheduler`."""


@register("sarathi")
class SarathiScheduler(Scheduler):
    """Stall-free batching: decodes, then ongoing prefill chunks, then new prefills, all
    within a token budget of ``chunk_size``."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        # every running decode takes one token of the budget: cap the seats by the budget
        self.max_seqs = min(config.max_batch_size, config.chunk_size)

    def schedule(self, engine: Engine) -> Batch | None:
        batch = Batch()
        self._decodes(engine, batch)
        room = self.config.chunk_size - batch.n_decode
        for seq in engine.prefilling:
            if room <= 0:
                break
            n = min(seq.prefill_target - seq.prefilled, room)
            batch.add_prefill(seq, n)
            room -= n
        if room > 0 and engine.waiting and not engine.swapped:
            self._admit(engine, batch, room, chunked=True)
        return batch if batch.prefills or batch.n_decode else None


@register("vllm-v1")
class VllmV1Scheduler(Scheduler):
    """vLLM V1's scheduler (``vllm/v1/core/sched/scheduler.py`` at 00024d31,
    ``Scheduler.schedule``): chunked prefill always on; the running requests first, in
    order (every decode, then the partly prefilled ones' next chunks, each capped by
    ``long_prefill_token_threshold`` when set), then waiting ones in queue order, all under
    ``max_num_batched_tokens`` (``max_tokens``) and ``max_num_seqs``. KV blocks are
    allocated for the tokens scheduled; when they run out the victim is the last running
    request (``self.running.pop()``: the latest admitted, a partial prefill included) or,
    under the priority policy, ``max(running, key=(priority, arrival_time))``; it is
    freed and requeued for recompute, and no waiting request is admitted in that step.

    Approximations: the running list is taken as decodes before partial prefills (true
    without ``long_prefill_token_threshold``: a request is cut only by the budget's end,
    so the one partial prefill is the last admitted); a chunk that does not fit preempts
    the policy's victim among itself and the partial prefills after it (not yet scheduled
    in the step)."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        # every running decode takes one token of the budget (vLLM requires
        # max_num_batched_tokens >= max_num_seqs)
        self.max_seqs = min(config.max_batch_size, config.max_tokens)

    def schedule(self, engine: Engine) -> Batch | None:
        batch = Batch()
        kind = self.kind_code
        preempted = self._decodes(engine, batch)
        room = self.config.max_tokens - batch.n_decode
        threshold = self.config.long_prefill_token_threshold
        kv = engine.kv
        for seq in list(engine.prefilling):
            if room <= 0:
                break
            if seq.state != PREFILLING:  # preempted below
                continue
            n = policy.chunk_tokens(kind, seq.prefill_target - seq.prefilled, room, threshold)
            need = engine.grow_prefill(seq, seq.prefilled + n)
            while need > kv.available_blocks:
                victim = self._partial_victim(engine, seq)
                engine.preempt_prefill(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.state != PREFILLING:
                continue
            kv.allocate(need)
            seq.private_blocks += need
            batch.add_prefill(seq, n)
            room -= n
        if room > 0 and engine.waiting and not preempted:
            self._admit(engine, batch, room, chunked=True)
        return batch if batch.prefills or batch.n_decode else None

    def _partial_victim(self, engine: Engine, seq: object) -> object:
        """The policy's victim among ``seq`` and the partial prefills after it (those
        not yet scheduled in this step)."""
        kind = self.kind_code
        best = None
        b1 = b2 = 0.0
        pf = engine.prefilling
        for s in pf[pf.index(seq) :]:
            r = s.request
            k1, k2 = policy.victim_key(kind, r.priority, r.arrival_s, s.admitted, s.generated,
                                       s.prompt_tokens)  # fmt: skip
            if best is None or policy.key_greater(k1, k2, b1, b2):
                best, b1, b2 = s, k1, k2
        return best


@register("priority")
class PriorityScheduler(VllmV1Scheduler):
    """vLLM V1 with ``--scheduling-policy priority``: the waiting queue ordered by
    ``(priority, arrival_time)`` (``request_queue.PriorityRequestQueue``; a lower value
    is served first), preempted requests requeued by that key, and the victim the running
    request with the largest ``(priority, arrival_time)``. A waiting request never
    preempts a running one (only a running request short of blocks does)."""


@register("sglang")
class SglangScheduler(Scheduler):
    """SGLang's scheduler (``python/sglang/srt/managers/scheduler.py``,
    ``schedule_policy.py``; see ``docs/schedulers.md`` for the versions read):

    - a prefill batch is preferred: ``get_next_batch_to_run`` runs ``get_new_batch_prefill``
      and decodes only when it returns nothing (mixed chunks are off by default), so
      decodes wait while prompts are admitted;
    - a prefill batch takes the in-progress chunked request first, then waiting requests
      FCFS (``--schedule-policy`` is ``fcfs`` by default; ``lpm`` falls back to FCFS
      without the radix cache), within ``chunked_prefill_size`` tokens (one request is
      cut to what is left and continues next time) and ``max_prefill_tokens`` of prompt;
    - ``PrefillAdder`` admits a request only if its prompt plus ``min(max_new_tokens,
      4096)`` fits the free KV less each running request's ``min(remaining output, 4096)
      * new_token_ratio``; the ratio starts at 0.7, falls by (0.7 - 0.098) / 600 per
      decode step that had room, down to 0.098;
    - a decode step without room for every request's next token retracts requests, the
      fewest output tokens (then the longest prompt) first, until the rest have room for
      20 tokens each, and resets the ratio to ``(decoded + 20 n) / sum(max_new_tokens)``
      (at most 1); retracted requests go to the back of the queue and recompute.

    The output length stands for ``max_new_tokens`` (benchmark clients set it so); KV is
    counted in blocks (SGLang pages one token)."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.ratio: dict[int, float] = {}
        self.init_ratio = config.init_new_token_ratio
        self.min_ratio = min(self.init_ratio * policy.SGLANG_MIN_RATIO_FACTOR, 1.0)
        self.decay = (self.init_ratio - self.min_ratio) / policy.SGLANG_DECAY_STEPS

    def schedule(self, engine: Engine) -> Batch | None:
        batch = self._prefill(engine)
        if batch is not None:
            return batch
        dec = engine.decode
        if not dec.n:
            return None
        key = id(engine)
        ratio = self.ratio.get(key, self.init_ratio)
        kv = engine.kv
        bs = engine.block_size
        retracted = dec.needing_blocks() > kv.available_blocks  # check_decode_mem failed
        while retracted:  # at least one, until the rest have room for 20 tokens each
            engine.preempt(engine.victim(False), "recompute")
            if not dec.n:
                break
            if (
                policy.sglang_retract_done(kv.available_blocks * bs, dec.n)
                and dec.needing_blocks() <= kv.available_blocks
            ):
                break
        if retracted:
            decoded = sum(s.generated + dec.dit - s.join_dit for s in dec.seqs)
            max_new = sum(s.output_tokens for s in dec.seqs)
            ratio = policy.sglang_ratio_after_retract(decoded, max_new, dec.n)
        else:
            ratio = policy.sglang_decayed(ratio, self.min_ratio, self.decay)
        self.ratio[key] = ratio
        if not dec.n:  # everything retracted: prefill again
            return self._prefill(engine)
        batch = Batch()
        self._decodes(engine, batch)
        return batch

    def _prefill(self, engine: Engine) -> Batch | None:
        """``get_new_batch_prefill``: the chunked request's next chunk, then new requests,
        under the token budgets and the ratio-reserved KV; None when nothing is admitted."""
        if not engine.prefilling and not engine.waiting:
            return None
        if not engine.prefilling and engine.num_running >= self.max_seqs:
            return None
        cfg = self.config
        kv = engine.kv
        bs = engine.block_size
        dec = engine.decode
        ratio = self.ratio.get(id(engine), self.init_ratio)
        rem_total = float(kv.available_blocks * bs)
        for s in dec.seqs:
            gen = s.generated + dec.dit - s.join_dit
            rem_total -= policy.sglang_reserve(s.output_tokens - gen, ratio)
        rem_chunk = cfg.chunked_prefill_size
        rem_input = cfg.max_prefill_tokens
        batch = Batch()
        for seq in engine.prefilling:
            todo = seq.prefill_target - seq.prefilled
            n = min(todo, rem_chunk, int(rem_total))
            if n <= 0:
                continue
            need = engine.grow_prefill(seq, seq.prefilled + n)
            if need > kv.available_blocks:
                continue
            kv.allocate(need)
            seq.private_blocks += need
            batch.add_prefill(seq, n)
            rem_total -= n
            if n == todo:
                rem_total -= min(seq.output_tokens - seq.generated, policy.SGLANG_CLIP_NEW_TOKENS)
            rem_chunk -= n
            rem_input -= n
        waiting = engine.waiting
        while waiting and engine.num_running < self.max_seqs:
            if rem_total <= 0 or rem_input <= 0 or rem_chunk <= 0:
                break
            seq = waiting[0]
            _, cached, _ = engine.admission_cost(seq)
            extend = seq.prefill_target - cached
            max_new = seq.output_tokens - seq.generated
            if not policy.sglang_admit(rem_total, extend, max_new):
                break
            if extend > rem_input and batch.prefills:
                break
            n = extend if extend <= rem_chunk else rem_chunk
            cost, cached, plan = engine.admission_cost(seq, cached + n)
            if not self._fits(engine, seq, cost):
                break
            engine.admit(seq, cached, plan, cached + n)
            batch.add_prefill(seq, n)
            rem_total -= n
            if n == extend:
                rem_total -= min(max_new, policy.SGLANG_CLIP_NEW_TOKENS)
            rem_chunk -= n
            rem_input -= n
        return batch if batch.prefills else None


def make_scheduler(config: SchedulerConfig) -> Scheduler:
    """The registered scheduler of ``config.kind``."""
    return _REGISTRY[config.kind](config)


__all__ = [
    "ENGINE_SCHEDULERS",
    "classic_scheduler",
    "PREEMPTION",
    "SCHEDULERS",
    "OrcaScheduler",
    "PriorityScheduler",
    "SarathiScheduler",
    "Scheduler",
    "SchedulerConfig",
    "SglangScheduler",
    "TrtllmMaxUtilScheduler",
    "TrtllmScheduler",
    "VllmScheduler",
    "VllmV1Scheduler",
    "make_scheduler",
    "register",
]
