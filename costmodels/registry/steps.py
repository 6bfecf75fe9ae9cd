"""Registered step models: the serving step latency, a training micro-batch's time and
training memory, each through a thin adapter over :mod:`costmodels.steps`' public API
(see :mod:`costmodels.registry`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from costmodels.registry.base import GPU, MODEL, Registered, choice, log_int, register
from costmodels.registry.ops import LEARNED_ENVELOPE, shipped_model


@dataclass(frozen=True)
class ServingStep:
    """One engine iteration: prefill chunks (new tokens over past ones) and decodes."""

    prefill_new: tuple[int, ...] = ()
    prefill_past: tuple[int, ...] = ()
    decode_ctx: tuple[int, ...] = ()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.array(self.prefill_new, dtype=np.int64),
            np.array(self.prefill_past, dtype=np.int64),
            np.array(self.decode_ctx, dtype=np.int64),
        )


class ServingStepLatency:
    """``StepModel`` (:mod:`costmodels.steps.serving`) as a cost model of one iteration:
    ``predict`` is ``step_s`` (interpolated on grids built once), ``exact`` is
    ``exact_step_s`` (priced op by op, the reference the interpolation is checked with)."""

    def __init__(self, step_model: Any):
        self.step_model = step_model

    def predict(self, x: ServingStep) -> float:
        return float(self.step_model.step_s(*x.arrays()))

    def predict_many(self, xs: Sequence[ServingStep]) -> np.ndarray:
        return np.array([self.predict(x) for x in xs])

    def exact(self, x: ServingStep) -> float:
        return float(self.step_model.exact_step_s(*x.arrays()))


def _serving():
    from costmodels.steps.serving import StepModel

    return ServingStepLatency(StepModel(MODEL, GPU))


def _sample_serving(rng: np.random.Generator) -> ServingStep:
    kind = int(rng.integers(4))
    pn: list[int] = []
    dc: list[int] = []
    if kind == 0:  # prefill chunks over cached prefixes
        pn = [log_int(rng, 1, 16384) for _ in range(int(rng.integers(1, 4)))]
    elif kind == 1:  # decode only
        dc = [int(v) for v in rng.integers(0, 16000, log_int(rng, 1, 512))]
    elif kind == 2:  # chunked prefill mixed with decodes
        pn = [log_int(rng, 1, 2048) for _ in range(int(rng.integers(1, 3)))]
        dc = [int(v) for v in rng.integers(0, 8192, 200)]
    else:  # many short prefills (the vectorised path) and a few decodes
        pn = [log_int(rng, 1, 64) for _ in range(int(rng.integers(9, 40)))]
        dc = [int(v) for v in rng.integers(0, 8192, 20)]
    pp = [int(v) for v in rng.integers(0, 8192, len(pn))]
    return ServingStep(tuple(pn), tuple(pp), tuple(dc))


def _grow_serving(x: ServingStep, rng: np.random.Generator) -> ServingStep:
    """More new tokens for one prefill, a longer cached prefix, a longer context for every
    decode, or another decode at the longest context."""
    options = ["decode_more"]
    if x.prefill_new:
        options += ["prefill_new", "prefill_past"]
    if x.decode_ctx:
        options.append("decode_longer")
    what = choice(rng, options)
    pn, pp, dc = list(x.prefill_new), list(x.prefill_past), list(x.decode_ctx)
    if what == "prefill_new":
        i = int(rng.integers(len(pn)))
        pn[i] += log_int(rng, 1, 1024)
    elif what == "prefill_past":
        i = int(rng.integers(len(pp)))
        pp[i] += log_int(rng, 1, 4096)
    elif what == "decode_longer":
        step = log_int(rng, 1, 2048)
        dc = [c + step for c in dc]
    else:
        dc.append(max(dc, default=log_int(rng, 1, 8192)))
    return ServingStep(tuple(pn), tuple(pp), tuple(dc))


register(
    Registered(
        name="steps/serving",
        unit="s",
        summary="vLLM-style engine iteration, Llama-3-8B on an H100 (StepModel.step_s)",
        build=_serving,
        sample=_sample_serving,
        grow=_grow_serving,
        reference=lambda model, x: model.exact(x),
        # step_s interpolates grids of exact prices (tests/costmodels/steps/test_serving.py:
        # test_interpolation_matches_exact_pricing holds it within 2%)
        vector_rtol=0.02,
        tolerance_note="step_s vs exact_step_s: grid interpolation within 2%",
    )
)


class TrainingMicroBatch:
    """``step_costs`` (:mod:`costmodels.steps.training`) as a cost model: seconds of one
    micro-batch on one rank holding every layer (forward, backward and recompute of each
    layer, the first stage's embedding and the last stage's head and loss)."""

    def __init__(self, model: Any, cost_model: Any, framework: str = "megatron"):
        self.model, self.cost_model, self.framework = model, cost_model, framework

    def _total_s(self, c: Any) -> float:
        layer = c.layer_fwd.total_s + c.layer_bwd.total_s + c.layer_recompute.total_s
        stages = c.first_fwd.total_s + c.first_bwd.total_s + c.last_fwd.total_s
        return float(self.model.num_layers * layer + stages + c.last_bwd.total_s)

    def predict(self, plan: Any) -> float:
        from costmodels.steps.training import step_costs

        c = step_costs(
            self.model, plan, self.cost_model, self.cost_model.system, framework=self.framework
        )
        return self._total_s(c)

    def predict_many(self, plans: Sequence[Any]) -> np.ndarray:
        """Megatron plans through the batched :func:`step_costs_many` (every distinct op
        priced once); other frameworks one plan at a time."""
        if self.framework != "megatron":
            return np.array([self.predict(p) for p in plans])
        from costmodels.steps.training_many import step_costs_many

        costs = step_costs_many(self.model, list(plans), self.cost_model, self.cost_model.system)
        return np.array([self._total_s(c) for c in costs])


class TrainingMemory:
    """``estimate_memory`` / ``memory_bytes_many`` (:mod:`costmodels.steps.memory`) as a
    cost model: peak bytes per GPU of a plan; ``predict_many`` prices all plans at once."""

    def __init__(self, model: Any, gpu: Any, framework: str = "megatron"):
        self.model, self.gpu, self.framework = model, gpu, framework

    def predict(self, plan: Any) -> float:
        from costmodels.steps.memory import estimate_memory

        return float(estimate_memory(self.model, plan, self.gpu, self.framework).total_bytes)

    def predict_many(self, plans: Sequence[Any]) -> np.ndarray:
        from costmodels.steps.memory import memory_bytes_of_plans

        return memory_bytes_of_plans(self.model, self.gpu, list(plans), self.framework)


@lru_cache(maxsize=1)
def _llama():
    from workloads.models import load_model

    return load_model(MODEL)


def _training():
    return TrainingMicroBatch(_llama(), shipped_model())


def _training_memory():
    return TrainingMemory(_llama(), shipped_model().gpu)


_RECOMPUTE_MORE = {"none": "selective", "selective": "full", "full": "full"}
_RECOMPUTE_LESS = {"full": "selective", "selective": "none", "none": "none"}


def _plan(**fields: Any) -> Any:
    from workloads.plan import TrainPlan

    return TrainPlan(**fields)


def _sample_train_plan(rng: np.random.Generator) -> Any:
    """One rank's view of a Llama-3-8B plan: tp 1-8, one pipeline stage, data parallel 1."""
    tp = choice(rng, (1, 2, 4, 8))
    mb = choice(rng, (1, 2, 4))
    return _plan(
        num_gpus=tp,
        tp=tp,
        micro_batch=mb,
        global_batch=mb * choice(rng, (1, 4)),
        seq_len=128 * log_int(rng, 2, 64),  # divisible by tp (sequence parallelism)
        recompute=choice(rng, ("none", "selective", "full")),
        precision=choice(rng, ("bf16-mixed", "fp8")),
    )


def _grow_train_plan(plan: Any, rng: np.random.Generator) -> Any:
    """Longer sequences, bigger micro-batches or more recomputation."""
    what = choice(rng, ("seq", "micro_batch", "recompute"))
    update: dict[str, Any]
    if what == "seq":
        update = {"seq_len": plan.seq_len + 128 * log_int(rng, 1, 32)}
    elif what == "micro_batch":
        mb = plan.micro_batch * 2
        update = {"micro_batch": mb, "global_batch": mb * plan.num_microbatches}
    else:
        update = {"recompute": _RECOMPUTE_MORE[plan.recompute]}
    return _plan(**{**plan.model_dump(), **update})


def _sample_memory_plan(rng: np.random.Generator) -> Any:
    """Llama-3-8B plans over 1-64 GPUs: every parallel degree, schedule and ZeRO stage."""
    tp, pp, cp = choice(rng, (1, 2, 4, 8)), choice(rng, (1, 2, 4)), choice(rng, (1, 2))
    dp = choice(rng, (1, 2, 4))
    schedule = choice(rng, ("1f1b", "gpipe", "interleaved")) if pp > 1 else "1f1b"
    vpp = 2 if schedule == "interleaved" else 1
    mb = choice(rng, (1, 2))
    return _plan(
        num_gpus=tp * pp * cp * dp,
        tp=tp,
        pp=pp,
        cp=cp,
        vpp=vpp,
        zero=choice(rng, (0, 1, 2, 3)),
        micro_batch=mb,
        global_batch=mb * dp * pp * choice(rng, (1, 2, 4)),
        seq_len=128 * log_int(rng, 2, 64),  # divisible by tp and cp
        pp_schedule=schedule,
        recompute=choice(rng, ("none", "selective", "full")),
        precision=choice(rng, ("bf16-mixed", "fp16-mixed", "bf16", "fp8")),
    )


def _grow_memory_plan(plan: Any, rng: np.random.Generator) -> Any:
    """Longer sequences, bigger micro-batches, more micro-batches or less recomputation."""
    what = choice(rng, ("seq", "micro_batch", "microbatches", "recompute"))
    update: dict[str, Any]
    if what == "seq":
        update = {"seq_len": plan.seq_len + 128 * log_int(rng, 1, 16)}
    elif what == "micro_batch":
        mb = plan.micro_batch * 2
        update = {"micro_batch": mb, "global_batch": plan.global_batch * 2}
    elif what == "microbatches":
        update = {"global_batch": plan.global_batch * 2}
    else:
        update = {"recompute": _RECOMPUTE_LESS[plan.recompute]}
    return _plan(**{**plan.model_dump(), **update})


register(
    Registered(
        name="steps/training",
        unit="s",
        summary="one Llama-3-8B micro-batch on one H100 rank (step_costs, shipped profile)",
        build=_training,
        sample=_sample_train_plan,
        grow=_grow_train_plan,
        # priced by the shipped learned model: its envelope
        monotone_rtol=LEARNED_ENVELOPE,
        tolerance_note="the learned op model's envelope",
    )
)

register(
    Registered(
        name="steps/training_memory",
        unit="bytes",
        summary="peak bytes per GPU of a Llama-3-8B plan (estimate_memory, memory_bytes_many)",
        build=_training_memory,
        sample=_sample_memory_plan,
        grow=_grow_memory_plan,
    )
)
