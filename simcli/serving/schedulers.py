"""Replica schedulers: which sequences run in an engine's next iteration.

All three use the same paged KV cache and the same preemption mechanism (the newest
decoding sequence is evicted, by recompute or swap, when the running sequences' next
tokens do not fit; vLLM v0's policy), and put every running decode in every iteration that
decodes. They differ in how prefills share iterations with decodes:

- ``vllm`` (vLLM v0 default, Kwon et al. SOSP 2023): prefill-first. An iteration with
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

Knobs follow vLLM: ``max_batch_size`` (max_num_seqs, running sequences per engine),
``max_tokens`` (max_num_batched_tokens per iteration; default max(model context, 2048) as in
vLLM; a prefill longer than it still runs, alone, rather than never), ``watermark`` (fraction
of KV blocks kept free when admitting new prompts).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simcli.serving.batch import Batch
from simcli.serving.engine import Engine

SCHEDULERS = ("vllm", "orca", "sarathi")
PREEMPTION = ("recompute", "swap")


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["vllm", "orca", "sarathi"] = "vllm"
    max_batch_size: int = Field(default=256, gt=0, description="running sequences per engine")
    max_tokens: int = Field(default=8192, gt=0, description="tokens per iteration (not sarathi)")
    chunk_size: int = Field(default=512, gt=0, description="sarathi token budget per iteration")
    preemption: Literal["recompute", "swap"] = "recompute"
    watermark: float = Field(default=0.01, ge=0, lt=1, description="KV fraction kept free")


class Scheduler:
    """Policy over an :class:`~simcli.serving.engine.Engine`; subclasses pick prefills."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.max_seqs = config.max_batch_size
        self.mode = config.preemption

    def schedule(self, engine: Engine) -> Batch | None:
        raise NotImplementedError

    # shared steps -------------------------------------------------------------------------
    def _decodes(self, engine: Engine, batch: Batch) -> None:
        """Reserve KV for every decode (preempting if short), resume swapped ones, and
        put them all in ``batch``."""
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

    def _admit(self, engine: Engine, batch: Batch, token_room: int, chunked: bool) -> int:
        """Admit waiting sequences FCFS while seats, tokens and KV allow; returns the
        token room left."""
        waiting = engine.waiting
        max_seqs = self.max_seqs
        while waiting and engine.num_running < max_seqs:
            seq = waiting[0]
            cost, cached, plan = engine.admission_cost(seq)
            todo = seq.prefill_target - cached
            if seq.seats > 1 and engine.num_running and engine.num_running + seq.seats > max_seqs:
                break  # a multi-branch root needs a seat per branch (unless alone)
            if chunked:
                if token_room <= 0:
                    break
                n = min(todo, token_room)
            else:
                n = todo
                if n > token_room and batch.prefills:
                    break  # too long for what is left; a lone over-long prefill still runs
            if not engine.can_admit(cost):
                break
            engine.admit(seq, cached, plan)
            batch.add_prefill(seq, n)
            token_room -= n
        return token_room


class VllmScheduler(Scheduler):
    """Prefill-first, whole prefills, decodes when no prefill is admissible."""

    def schedule(self, engine: Engine) -> Batch | None:
        batch = Batch()
        if engine.waiting and not engine.swapped:
            self._admit(engine, batch, self.config.max_tokens, chunked=False)
            if batch.prefills:
                return batch
        if not engine.decode.n and not engine.swapped and not engine.incoming:
            return None
        self._decodes(engine, batch)
        if batch.n_decode:
            return batch
        if engine.waiting and not engine.swapped:  # everything was preempted: prefill again
            self._admit(engine, batch, self.config.max_tokens, chunked=False)
        return batch if batch.prefills else None


class OrcaScheduler(Scheduler):
    """Iteration-level mixed batches: all decodes plus whole new prefills."""

    def schedule(self, engine: Engine) -> Batch | None:
        batch = Batch()
        self._decodes(engine, batch)
        if engine.waiting and not engine.swapped:
            self._admit(engine, batch, self.config.max_tokens - batch.n_decode, chunked=False)
        return batch if batch.prefills or batch.n_decode else None


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


def make_scheduler(config: SchedulerConfig) -> Scheduler:
    return {"vllm": VllmScheduler, "orca": OrcaScheduler, "sarathi": SarathiScheduler}[config.kind](
        config
    )


__all__ = [
    "PREEMPTION",
    "SCHEDULERS",
    "OrcaScheduler",
    "SarathiScheduler",
    "Scheduler",
    "SchedulerConfig",
    "VllmScheduler",
    "make_scheduler",
]
