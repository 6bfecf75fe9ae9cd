"""Predicted against measured: simcli's one decomposition of the traced workload, priced by
the cost model, class by class next to the trace's kernels.

**Predicted.** A training step is the ops of :func:`workloads.decompose.op_groups` priced as
:func:`costmodels.steps.training.step_costs` prices them (one micro-batch on one rank:
layer forward, backward, recomputation, the first and last stage's extras), times the
micro-batches and the layers on the traced pipeline rank, plus the optimizer
(:func:`~workloads.decompose.optimizer_ops`) and the data-parallel gradient collectives.
A serving step is :class:`costmodels.steps.serving.StepModel`'s breakdown of the same
iteration (its per-kernel launch floors and, for eager prefill, the host stall
included), so its classes add up to the step model's step time. Each decomposition op
goes to the class its kernels would be classified as (:func:`op_class`): by op kind, and
for memory-bound ``copy`` ops by name (the eager serving engine's templates are kernel by
kernel, so its RMSNorm's ``pow``/``mean``/``rsqrt`` are norm and its casts and multiplies
elementwise, as in a trace; an eager training step's norm and RoPE ops are split the same
way, :func:`_split_eager`).

**Measured.** The sum of kernel durations per class in each step, averaged over the steps
(:mod:`calibrate.trace.timeline`). Errors are signed: (predicted - measured) / measured.
Everything here is seconds; callers convert at their output.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from calibrate.trace.classify import CLASS_LABELS, OP_CLASSES
from calibrate.trace.timeline import GAP_KINDS, Timeline, phase_totals_s
from costmodels.steps.composition import Composition
from costmodels.steps.serving import StepModel
from costmodels.steps.training import collective_s, group_nodes, host_launches, step_costs
from hardware_specs.registry import System
from workloads.decompose import op_groups, optimizer_ops, serving_templates, tp_shard
from workloads.decompose.training import Framework
from workloads.models import ModelConfig
from workloads.ops import ATTENTION_KINDS, COLLECTIVE_KINDS, OpKind, ops_frame
from workloads.plan import TrainPlan

_ATTN_BWD = {OpKind.attn_bwd.value, OpKind.attn_blocksparse_bwd.value}
_ATTN = {k.value for k in ATTENTION_KINDS}
_COLL = {k.value for k in COLLECTIVE_KINDS}
_BY_KIND = {
    "gemm": "gemm",
    "rmsnorm": "norm",
    "layernorm": "norm",
    "rope": "rope",
    "softmax": "softmax_ce",
    "cross_entropy": "softmax_ce",
    "embedding": "embedding",
    "adamw": "optimizer",
    "swiglu": "elementwise",
    "gelu": "elementwise",
    "residual_add": "elementwise",
}
# memory-bound `copy` ops by name, first match wins (names of workloads.decompose)
_COPY_NAMES: tuple[tuple[str, str], ...] = (
    (r"^fp8_(weight_)?cast", "fp8_cast"),
    (r"_(pow|mean|rsqrt)$", "norm"),  # eager RMSNorm kernels (serving)
    (r"^rope_[qk]_cat$", "memcpy"),  # eager RoPE's torch.cat
    (r"^rope_[qk]_", "elementwise"),  # eager RoPE's mul/neg/add/cast kernels
    (r"^eager_(rmsnorm|final_norm)", "norm"),
    (r"^eager_rope", "rope"),
    (r"^eager_cross_entropy", "softmax_ce"),
    (r"^eager_embedding", "embedding"),
    (r"^(embedding|pos_embedding)$", "embedding"),
    (r"^argmax$", "softmax_ce"),
    (r"^rope$", "rope"),  # vLLM's rotary_embedding
    (r"^kv_cache_write$", "memcpy"),  # reshape_and_cache_flash
    (r"^moe_(un)?permute$", "memcpy"),
)


def op_class(name: str, kind: str) -> str:
    """The class (:data:`~calibrate.trace.classify.OP_CLASSES`) of the kernels a
    decomposition op runs as: by its op kind, memory-bound copies by their name."""
    if kind in _ATTN:
        return "attn_bwd" if kind in _ATTN_BWD else "attn_fwd"
    if kind in _COLL:
        return "collective"
    if kind in _BY_KIND:
        return _BY_KIND[kind]
    if kind == "copy":
        for pattern, cls in _COPY_NAMES:
            if re.search(pattern, name):
                return cls
        return "elementwise"
    return "other"


# --------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class TrainWorkload:
    """A training step of ``plan`` on pipeline rank ``pp_rank`` (one GPU's trace)."""

    model: ModelConfig
    plan: TrainPlan
    framework: Framework = "megatron"
    attn_backend: str = ""
    pp_rank: int = 0


@dataclass(frozen=True)
class ServingWorkload:
    """One prefill (``length`` = prompt tokens) or decode step (``length`` = tokens
    already cached per sequence) of ``batch`` sequences on one replica."""

    model: ModelConfig
    phase: Literal["prefill", "decode"]
    batch: int
    length: int
    tp: int = 1
    engine: str = "vllm"
    attn_backend: str | None = None
    dtype: str = "bf16"
    cuda_graphs: bool | None = None  # eager decode: None/True replays a graph

    def step_batch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prefill_new, prefill_past, decode_ctx) as the step model takes them."""
        none = np.zeros(0, np.int64)
        if self.phase == "prefill":
            return np.full(self.batch, self.length), np.zeros(self.batch, np.int64), none
        return none, none, np.full(self.batch, self.length)


@dataclass(frozen=True)
class Prediction:
    """Seconds per step by class and phase; ``ops``: every priced op (name, kind,
    op_class, phase, seconds per step); ``step_s``: the step model's time (serving) or
    the kernel sum (training; the caller may replace it with a simulated iteration)."""

    by_class_s: dict[str, float]
    by_phase_s: dict[str, float]
    step_s: float
    ops: pd.DataFrame
    host_stall_s: float | None = None
    host_ops: int = 0  # training: op instances the rank's host dispatches per iteration

    @classmethod
    def from_rows(
        cls, rows: list[tuple[str, str, str, str, float]], step_s: float | None = None,
        host_stall_s: float | None = None,
    ) -> Prediction:  # fmt: skip
        ops = pd.DataFrame(rows, columns=["phase", "name", "kind", "op_class", "seconds"])
        by_class = {c: float(ops.loc[ops.op_class == c, "seconds"].sum()) for c in OP_CLASSES}
        phases = ops.groupby("phase", sort=False)["seconds"].sum()
        by_phase = {str(p): float(s) for p, s in phases.items()}
        total = float(ops["seconds"].sum())
        return cls(by_class, by_phase, total if step_s is None else step_s, ops, host_stall_s)


def predict_train(
    w: TrainWorkload, cost_model: Any, system: System, composition: Composition | None = None
) -> Prediction:
    """Seconds per class of one training iteration on ``w.pp_rank`` (module docstring);
    with ``composition``, as ``simcli train`` prices it (fitting uses none)."""
    model, plan = w.model, w.plan
    c = step_costs(model, plan, cost_model, system, w.attn_backend, w.framework, composition)
    groups = op_groups(model, plan, w.attn_backend, w.framework)
    kinds = [{o.name: o.op.op.value for o in g} for g in groups]
    m = plan.num_microbatches
    chunks = [ch for ch in range(plan.num_chunks) if plan.stage_of_chunk(ch) == w.pp_rank]
    per_chunk = plan.layers_per_chunk(model.num_layers)
    layers = sum(per_chunk[ch] for ch in chunks)
    first, last = 0 in chunks, plan.num_chunks - 1 in chunks
    rows: list[tuple[str, str, str, str, float]] = []

    def add(phase: str, by_op: dict[str, float], group: int, mult: float) -> None:
        for name, sec in by_op.items():
            kind = kinds[group].get(name, "")
            rows.append((phase, name, kind, op_class(name, kind), sec * mult))

    add("forward", c.layer_fwd.by_op_s, 0, m * layers)
    add("backward", c.layer_bwd.by_op_s, 1, m * layers)
    for name, sec in c.layer_recompute.by_op_s.items():  # forward work redone in backward
        kind = kinds[0].get(name, "")
        rows.append(("backward", f"recompute_{name}", kind, op_class(name, kind), sec * m * layers))
    if first:
        add("forward", c.first_fwd.by_op_s, 2, m)
        add("backward", c.first_bwd.by_op_s, 3, m)
    if last:
        add("forward", c.last_fwd.by_op_s, 4, m)
        add("backward", c.last_bwd.by_op_s, 5, m)
    for phase, ph in (("forward", c.layer_fwd), ("backward", c.layer_bwd)):
        for what, sec in (("cp_comm", ph.cp_comm_s), ("ep_comm", ph.ep_comm_s)):
            if sec:
                rows.append((phase, what, "", "collective", sec * m * layers))
    if plan.pp > 1:  # activations out / gradients back, per micro-batch
        peers = int(w.pp_rank > 0) + int(w.pp_rank < plan.pp - 1)
        for phase in ("forward", "backward"):
            rows.append((phase, "pp_send_recv", "send_recv", "collective", m * peers * c.p2p_s))
    params = layers * c.layer_params + (c.embedding_params if first else 0)
    params += c.lm_head_params if last else 0
    opt = _optimizer_rows(model, plan, cost_model, system, params, c.layer_params, m * layers)
    if composition is not None:
        f = composition.factor(w.framework, "adamw")
        opt = [(p, n, k, cls, sec * f) if k == "adamw" else (p, n, k, cls, sec)
               for p, n, k, cls, sec in opt]  # fmt: skip
    rows += opt
    if w.framework == "pytorch":
        rows = _split_eager(rows, model)
    n_opt = len(optimizer_ops(model, max(1, params), plan.master_dtype))
    pred = Prediction.from_rows(rows)
    return replace(pred, host_ops=host_launches(c, layers, m, first, last, n_opt))


def _split_eager(
    rows: list[tuple[str, str, str, str, float]], model: ModelConfig
) -> list[tuple[str, str, str, str, float]]:
    """Eager PyTorch has no norm or RoPE kernel: it runs RMSNorm as ``pow``, ``mean``,
    ``rsqrt`` (norm-class kernels) and casts and multiplies (elementwise), RoPE as
    multiplies, ``neg``, ``add`` and a ``cat`` (elementwise and copy). The eager serving
    templates of the same model list those kernels with their traffic
    (:func:`workloads.decompose.serving_templates`); a training step's norm and RoPE ops
    are split over the kernels' classes in those proportions, so that they compare with
    the kernels a trace shows."""
    tpls = serving_templates(model, tp_shard(model, 1), "pytorch-eager", "bf16")
    shares: dict[str, dict[str, float]] = {}
    for cls, label in (("norm", "rmsnorm"), ("rope", "rope")):
        parts = [(op_class(t.name, t.op), (t.traffic_bytes or 1.0) * t.count)
                 for part in tpls.values() for t in part if t.label == label and t.op]  # fmt: skip
        total = sum(wt for _, wt in parts)
        for target, wt in parts:
            shares.setdefault(cls, {})
            shares[cls][target] = shares[cls].get(target, 0.0) + wt / total
    out = []
    for phase, name, kind, cls, sec in rows:
        for target, share in shares.get(cls, {cls: 1.0}).items():
            out.append((phase, name, kind, target, sec * share))
    return out


def _optimizer_rows(
    model: ModelConfig, plan: TrainPlan, cm: Any, system: System, params: int,
    layer_params: int, layer_passes: int,
) -> list[tuple[str, str, str, str, float]]:  # fmt: skip
    """AdamW over this rank's share and the data-parallel collectives (gradient all-reduce
    or reduce-scatter in buckets, ZeRO's parameter all-gathers), as the simulator prices
    them, but all of them (a kernel runs whether or not compute hides it)."""
    dp = plan.data_parallel
    shard = dp if plan.zero >= 1 else 1
    n_opt = max(1, math.ceil(params / shard))
    ops = [o.op for o in optimizer_ops(model, n_opt, plan.master_dtype)]
    rows = [("optimizer", "optimizer_adamw", "adamw", "optimizer",
             float(cm.predict_many(ops_frame(ops)).sum()))]  # fmt: skip
    if dp == 1:
        return rows
    nodes = group_nodes(dp, plan.tp * plan.cp, system.node.gpus_per_node)
    grad_elt = 2 if plan.precision == "bf16" else 4
    grad_dt = "fp32" if grad_elt == 4 else "bf16"
    param_elt = 1 if plan.precision == "fp8" else 2
    if plan.zero == 3:  # every layer's parameters gathered twice, its gradients scattered
        gather = collective_s(cm, "all_gather", layer_params * 2, dp, nodes, "bf16")
        rs = collective_s(cm, "reduce_scatter", layer_params * grad_elt, dp, nodes, grad_dt)
        return rows + [
            ("forward", "zero3_all_gather", "all_gather", "collective", layer_passes * gather),
            ("backward", "zero3_all_gather_bwd", "all_gather", "collective", layer_passes * gather),
            ("backward", "zero3_reduce_scatter", "reduce_scatter", "collective", layer_passes * rs),
        ]
    kind = "all_reduce" if plan.zero == 0 else "reduce_scatter"
    nbytes = params * grad_elt
    buckets = max(1, math.ceil(nbytes / plan.grad_bucket_bytes))
    t = buckets * collective_s(cm, kind, nbytes / buckets, dp, nodes, grad_dt)
    rows.append(("backward", f"dp_grad_{kind}", kind, "collective", t))
    if plan.zero in (1, 2):
        t = collective_s(cm, "all_gather", params * param_elt, dp, nodes, "bf16")
        rows.append(("optimizer", "dp_param_all_gather", "all_gather", "collective", t))
    return rows


def predict_serving(
    w: ServingWorkload, cost_model: Any, gpu_id: str,
    composition: Composition | None | str = "shipped",
) -> Prediction:  # fmt: skip
    """Seconds per class of one serving step: the step model's breakdown, each op group
    split over the classes of its templates in proportion to their traffic (module
    docstring). ``composition``: as ``simcli serve`` prices it (the GPU's shipped file),
    or None (fitting)."""
    sm = StepModel(
        w.model, gpu_id, tp=w.tp, engine=w.engine, attn_backend=w.attn_backend, dtype=w.dtype,
        cost_model=cost_model, composition=composition,
    )  # fmt: skip
    args = w.step_batch()
    breakdown = sm.breakdown(*args)
    host = breakdown.pop("host_stall", None)
    engine_host = breakdown.pop("host", None)  # the engine profile's host work: no kernel
    if engine_host is not None:
        host = (host or 0.0) + engine_host
    step = sm.step_s(*args)
    eager_decode = w.engine == "pytorch-eager" and w.phase == "decode" and w.cuda_graphs is False
    if eager_decode:
        step = sm.eager_stream_s(*args)
        host = max(0.0, step - sum(breakdown.values()))
    tpls = serving_templates(w.model, tp_shard(w.model, w.tp), sm.profile.decompose, w.dtype)
    by_label: dict[str, list[tuple[str, str, float]]] = {}
    for t in (x for part in tpls.values() for x in part):
        if not t.op or (t.decode_only and w.phase != "decode"):
            continue
        weight = (t.traffic_bytes if t.traffic_bytes is not None else 1.0) * t.count
        by_label.setdefault(t.label, []).append((t.name, t.op, weight))
    rows: list[tuple[str, str, str, str, float]] = []
    attn_kind = "attn_fwd" if w.phase == "prefill" else "attn_decode"
    for label, sec in breakdown.items():
        parts = by_label.get(label) or [(label, attn_kind if label == "attn" else "", 1.0)]
        total = sum(p[2] for p in parts) or 1.0
        for name, kind, weight in parts:
            rows.append(("forward", name, kind, op_class(name, kind), sec * weight / total))
    return Prediction.from_rows(rows, step_s=step, host_stall_s=host)


# --------------------------------------------------------------------------- comparison


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured > 0 else math.nan


@dataclass(frozen=True)
class TraceComparison:
    """A trace's measured step next to its prediction (module docstring), seconds."""

    timeline: Timeline
    prediction: Prediction
    step_predicted_s: float
    classes: pd.DataFrame  # op_class, label, predicted_s, measured_s, error, kernels_per_step
    unmatched: pd.DataFrame  # name, count, count_per_step, measured_s (per step)
    kernels: pd.DataFrame  # every measured kernel name: op_class, detail, count, measured_s
    phases: pd.DataFrame  # phase, marker, predicted_s, measured_kernel_s, measured_span_s, error
    steps: pd.DataFrame  # StepTimeline.row() per step
    warnings: list[str] = field(default_factory=list)

    @property
    def step_measured_s(self) -> float:
        return self.timeline.wall_s

    @property
    def step_error(self) -> float:
        return _error(self.step_predicted_s, self.step_measured_s)

    def gaps_s(self) -> dict[str, float]:
        gaps = self.timeline.mean_gaps_s()
        return {**gaps, "total": float(sum(gaps[k] for k in GAP_KINDS))}


def compare(
    timeline: Timeline,
    prediction: Prediction,
    *,
    step_predicted_s: float | None = None,
    phase_markers: dict[str, str] | None = None,
) -> TraceComparison:
    """Join a measured timeline and a prediction (``step_predicted_s`` defaults to the
    prediction's own step time)."""
    ev = timeline.measured
    n = len(timeline.steps)
    per_class = ev.groupby("op_class")["dur_s"].sum() / n
    counts = ev.groupby("op_class").size() / n
    rows = []
    for cls in OP_CLASSES:
        pred, meas = prediction.by_class_s.get(cls, 0.0), float(per_class.get(cls, 0.0))
        rows.append((cls, CLASS_LABELS[cls], pred, meas, _error(pred, meas),
                     float(counts.get(cls, 0.0))))  # fmt: skip
    classes = pd.DataFrame(
        rows,
        columns=["op_class", "label", "predicted_s", "measured_s", "error", "kernels_per_step"],
    )
    kernels = (
        ev.groupby(["name", "cat", "op_class", "detail"], sort=False)["dur_s"]
        .agg(["size", "sum"])
        .reset_index()
        .rename(columns={"size": "count", "sum": "measured_s"})
    )
    kernels["count_per_step"] = kernels["count"] / n
    kernels["measured_s"] = kernels["measured_s"] / n
    kernels = kernels.sort_values("measured_s", ascending=False, kind="stable")
    kernels = kernels.reset_index(drop=True)
    unmatched = kernels[kernels["op_class"] == "other"]
    unmatched = unmatched[["name", "count", "count_per_step", "measured_s"]].reset_index(drop=True)
    phase_rows = []
    for phase, marker in (phase_markers or {}).items():
        pred = prediction.by_phase_s.get(phase, math.nan)
        if phase in timeline.phases:
            kern, span = phase_totals_s(timeline, phase)
        else:
            kern = span = math.nan
        phase_rows.append((phase, marker, pred, kern, span, _error(pred, kern)))
    phases = pd.DataFrame(
        phase_rows,
        columns=["phase", "marker", "predicted_s", "measured_kernel_s", "measured_span_s", "error"],
    )
    step_s = prediction.step_s if step_predicted_s is None else step_predicted_s
    return TraceComparison(
        timeline=timeline,
        prediction=prediction,
        step_predicted_s=float(step_s),
        classes=classes,
        unmatched=unmatched,
        kernels=kernels,
        phases=phases,
        steps=pd.DataFrame([s.row() for s in timeline.steps]),
        warnings=list(timeline.warnings),
    )
