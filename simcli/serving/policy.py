"""The schedulers' decisions as small pure functions over scalars: one implementation that
both serving loops call.

The event loop's scheduler classes (:mod:`simcli.serving.schedulers`) call these as plain
Python; the compiled loop (:mod:`simcli.serving.fastsched`, run by
:mod:`simcli.serving.fastkernel`) compiles the very same functions with numba
(``jit(policy.fn)``), so a policy is written once and the two loops
cannot drift apart (``tests/simcli/serving/test_fastpath.py`` and
``test_schedulers.py`` hold them equal request for request). Nothing here imports numba
or touches a queue: a function takes the numbers a decision needs and returns the
decision.

Policies (``KINDS``; sources and versions in ``docs/schedulers.md``):

- ``vllm`` (vLLM V0), ``orca``, ``sarathi``: the victim of a preemption is the newest
  arrival; a waiting request is admitted while its whole prompt's blocks leave the
  watermark free; a preempted request goes back to the front of the queue.
- ``vllm-v1``: vLLM V1 (``vllm/v1/core/sched/scheduler.py`` at 00024d31): the victim is
  the last request of the running list (``self.running.pop()``), i.e. the most recently
  admitted; blocks are allocated for the tokens scheduled (per chunk), no watermark
  (``allocate_slots`` fails only past the free blocks).
- ``priority``: vLLM V1 with ``--scheduling-policy priority``: the waiting queue is a heap
  on ``(priority, arrival_time)`` (``request_queue.PriorityRequestQueue``), a preempted
  request goes back by that key, the victim is ``max(running, key=(priority,
  arrival_time))``.
- ``sglang``: SGLang's retraction (``ScheduleBatch.retract_decode``): decodes sorted by
  ``(len(output_ids), -len(origin_input_ids))`` descending and popped from the end, so the
  victim has the fewest output tokens, then the longest prompt; retracted requests go to
  the back of the waiting queue (``_extend_requests_to_queue``). Admission reserves the
  running requests' future tokens by ``new_token_ratio`` (``PrefillAdder``).
- ``trtllm``: TensorRT-LLM's ``GUARANTEED_NO_EVICT`` capacity scheduler: a request starts
  only when its whole sequence (prompt + output) fits the blocks not already promised to
  the running requests; it never preempts.
- ``trtllm-max-util``: TensorRT-LLM's ``MAX_UTILIZATION``: a request starts when its
  context's blocks fit now; when a started request's next step does not fit, the last
  started request is paused (its KV freed, recomputed later).
"""

from __future__ import annotations

from typing import Literal

KINDS = ("vllm", "orca", "sarathi", "vllm-v1", "sglang", "trtllm", "priority", "trtllm-max-util")
SchedulerKind = Literal[
    "vllm", "orca", "sarathi", "vllm-v1", "sglang", "trtllm", "priority", "trtllm-max-util"
]
VLLM, ORCA, SARATHI, VLLM_V1, SGLANG, TRTLLM, PRIORITY, TRTLLM_MU = range(8)

# SGLang's defaults (python/sglang/srt/environ.py; earlier global_config.py):
# SGLANG_INIT_NEW_TOKEN_RATIO 0.7, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14,
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS 600, SGLANG_RETRACT_DECODE_STEPS 20,
# SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION 4096 (schedule_conservativeness 1.0)
SGLANG_INIT_RATIO = 0.7
SGLANG_MIN_RATIO_FACTOR = 0.14
SGLANG_DECAY_STEPS = 600
SGLANG_RETRACT_STEPS = 20
SGLANG_CLIP_NEW_TOKENS = 4096


def kind_code(name: str) -> int:
    """The integer a policy is known by in both loops."""
    return KINDS.index(name)


# --- the preemption victim ------------------------------------------------------------
def victim_key(kind: int, priority: int, arrival_s: float, admitted: int, generated: int,
               prompt: int) -> tuple[float, float]:  # fmt: skip
    """The running sequence with the largest key (compared as a pair, the first of equals
    in scan order) is preempted first."""
    if kind in (VLLM_V1, TRTLLM_MU):
        return float(admitted), 0.0  # running.pop() / the last started request
    if kind == PRIORITY:
        return float(priority), arrival_s  # max(running, key=(priority, arrival_time))
    if kind == SGLANG:
        return float(-generated), float(prompt)  # fewest output tokens, longest prompt
    return arrival_s, 0.0  # vLLM V0: the latest arrival


def key_greater(a1: float, a2: float, b1: float, b2: float) -> bool:
    """``(a1, a2) > (b1, b2)``."""
    return a1 > b1 or (a1 == b1 and a2 > b2)


# --- the waiting queue ------------------------------------------------------------------
def queue_key(kind: int, priority: int, arrival_s: float) -> tuple[float, float]:
    """A waiting request's place in an ordered queue (``priority`` only; the others are
    first come, first served)."""
    return float(priority), arrival_s


def ordered_queue(kind: int) -> bool:
    """Whether the waiting queue is kept sorted by :func:`queue_key` (a heap in vLLM)."""
    return kind == PRIORITY


def requeue_front(kind: int) -> bool:
    """Where a preempted request waits again: the front (vLLM's ``prepend_request``) or
    the back (SGLang extends its waiting queue). Ordered queues insert by key."""
    return kind != SGLANG


# --- admission --------------------------------------------------------------------------
def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def admit_fits(kind: int, free_blocks: int, cost_blocks: int, watermark_blocks: int,
               running: bool, reserved_blocks: int, final_blocks: int,
               num_blocks: int) -> bool:  # fmt: skip
    """Whether a waiting request's KV may be allocated now. ``cost_blocks``: what it takes
    now (its prompt, or its first chunk for the per-chunk allocators); ``final_blocks``:
    its whole sequence's (TensorRT-LLM); ``reserved_blocks``: what the running requests'
    whole sequences take."""
    if kind == TRTLLM:
        # GUARANTEED_NO_EVICT: what every running request may still need is kept back
        return reserved_blocks + final_blocks <= num_blocks and cost_blocks <= free_blocks
    if kind in (VLLM_V1, PRIORITY, SGLANG, TRTLLM_MU):
        return cost_blocks <= free_blocks  # allocate_slots: the free blocks, no watermark
    return free_blocks - cost_blocks >= (watermark_blocks if running else 0)


def chunk_tokens(kind: int, todo: int, room: int, threshold: int) -> int:
    """Prefill tokens a request gets this iteration: its rest, capped by vLLM V1's
    ``long_prefill_token_threshold`` (0: off) and by the room left in the budget."""
    n = todo
    if kind in (VLLM_V1, PRIORITY) and 0 < threshold < n:
        n = threshold
    return n if n < room else room


def allocates_per_chunk(kind: int) -> bool:
    """Whether KV blocks are allocated as prefill chunks are scheduled (vLLM V1's
    ``allocate_slots`` for ``num_computed_tokens + num_new_tokens``, SGLang's
    ``alloc_for_extend``) rather than for the whole prompt at admission."""
    return kind in (VLLM_V1, PRIORITY, SGLANG)


# --- SGLang's reservation of future decode tokens ----------------------------------------
def sglang_reserve(remaining_out: int, ratio: float) -> float:
    """Tokens a running request is expected to still take (``PrefillAdder``'s
    ``min(max_new_tokens - len(output_ids), CLIP) * new_token_ratio``)."""
    left = remaining_out if remaining_out < SGLANG_CLIP_NEW_TOKENS else SGLANG_CLIP_NEW_TOKENS
    return left * ratio


def sglang_admit(rem_total_tokens: float, extend_tokens: int, max_new_tokens: int) -> bool:
    """``add_one_req``: the prompt's rest plus its (clipped) output must fit what is left
    after the running requests' reservations."""
    clip = max_new_tokens if max_new_tokens < SGLANG_CLIP_NEW_TOKENS else SGLANG_CLIP_NEW_TOKENS
    return extend_tokens + clip < rem_total_tokens


def sglang_decayed(ratio: float, min_ratio: float, decay: float) -> float:
    """After a decode step that had room: ``max(ratio - decay, min_ratio)``."""
    r = ratio - decay
    return r if r > min_ratio else min_ratio


def sglang_retract_done(free_tokens: int, remaining: int) -> bool:
    """Retraction stops when the requests left have room for ``retract_decode_steps``
    tokens each (and never retracts the last one)."""
    return remaining <= 1 or free_tokens >= remaining * SGLANG_RETRACT_STEPS


def sglang_ratio_after_retract(decoded: int, max_new: int, remaining: int) -> float:
    """``retract_decode``'s new estimate: ``(decoded + steps * n) / sum(max_new_tokens)``,
    at most 1."""
    if max_new <= 0:
        return 1.0
    r = (decoded + SGLANG_RETRACT_STEPS * remaining) / max_new
    return r if r < 1.0 else 1.0


__all__ = [
    "KINDS",
    "SchedulerKind",
    "admit_fits",
    "allocates_per_chunk",
    "blocks_for",
    "chunk_tokens",
    "key_greater",
    "kind_code",
    "ordered_queue",
    "queue_key",
    "requeue_front",
    "sglang_admit",
    "sglang_decayed",
    "sglang_ratio_after_retract",
    "sglang_reserve",
    "sglang_retract_done",
    "victim_key",
]
