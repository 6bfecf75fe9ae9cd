"""One serving replica: ``tp x pp`` GPUs holding one copy of the model, running ``pp``
engines (:mod:`simcli.serving.engine`) that share its KV cache.

A replica runs ``pp`` *engines* (vLLM's "virtual engines"): with pipeline parallelism each
engine owns ``1/pp`` of the KV cache and its own queues, and up to ``pp`` batches (one per
engine) are in flight, entering the pipeline one slowest-stage time apart
(``StepModel.stage_s``; ``step_s / pp`` for a step model without it). The simplification: a
batch's iteration time is the StepModel's ``step_s`` (the whole pipeline's forward pass),
and micro-batches only wait for the previous one to clear the slowest stage -- unequal
micro-batches do not stall each other further down the pipeline. With ``pp = 1`` there is
one engine and iterations run back to back.

Extension points: ``Replica.role`` is ``"mixed"`` (prefill and decode), ``"prefill"`` (a
finished prefill is handed to ``Replica.handoff`` instead of decoding here) or
``"decode"`` (sequences arrive with their KV through :meth:`Engine.admit_decoding`, or
through the transfer methods that :mod:`simcli.serving.disagg` drives); a request may own
several sequences (branches, :mod:`simcli.serving.branches`) that are scheduled
independently; a speculative engine swaps the lockstep batch for
:class:`simcli.serving.spec.SpecDecodeBatch` and prices iterations with ``Replica.spec``.
"""

from __future__ import annotations

from collections.abc import Callable

from simcli.serving.batch import StepModelLike
from simcli.serving.engine import Engine, IterationMetrics, Scheduling
from simcli.serving.requests import Request


class Replica:
    """``tp x pp`` GPUs serving one model copy: ``pp`` engines sharing the KV cache.

    ``role``: ``mixed``, ``prefill`` (finished prefills go to ``handoff``) or ``decode``.
    ``hold_kv``: a prefill replica keeps a handed-off sequence's KV until the decode side
    calls :meth:`Engine.transfer_sent` (``handoff(seq, now_s, engine, prefill_s)``);
    without it the KV is freed first (``handoff(seq, now_s)``). ``on_free(now_s)`` runs
    after each iteration (a decode pool pulls waiting transfers). ``block_units``: layer
    groups per KV block of a capped (sliding-window) layout, whose decode batches are
    :class:`~simcli.serving.batch.CappedDecodeBatch`. ``spec``: a
    :class:`~simcli.serving.spec.SpecCost` pricing speculative iterations, with
    ``decode_batch(engine_index)`` building each engine's decode batch.
    """

    def __init__(
        self,
        index: int,
        step_model: StepModelLike,
        scheduler: Scheduling,
        metrics: IterationMetrics,
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
        block_units: int = 1,
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
        self.step_summary = (
            getattr(step_model, "step_s_summary", None)
            if spec is None and self.stage_fn is None
            else None
        )
        self.outstanding = 0
        self.kv_capacity_tokens = kv_capacity_tokens
        # a capped KV layout counts a block as ``block_units`` layer-group units
        blocks = kv_capacity_tokens // block_size // pp * block_units
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


__all__ = ["Replica"]
