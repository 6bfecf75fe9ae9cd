"""A training micro-batch on one rank as ops: every layer op forward and backward, the
first stage's embedding, the last stage's final norm, LM head and loss, the optimizer, and
the engine variants (plain eager PyTorch's extra traffic, Megatron's pre-FlashAttention
core attention, FP8 operand casts).

Pure shape arithmetic: no costs. Every function returns ``list[LayerOp]``: a stable
``name`` (for time breakdowns), an ``op`` and a ``count`` of identical instances, so a
phase's time is ``sum(count * predict(op))``. The layer comes from
:func:`workloads.decompose.layer.layer_templates`, the same templates serving prices.

Backward (Megatron-LM's autograd): each GEMM becomes a dgrad and a wgrad GEMM (together
twice its FLOPs), attention an ``attn_bwd``, elementwise ops the same kind scaled by
:data:`BACKWARD_TRAFFIC_RATIO`, the TP collectives their conjugates; under sequence
parallelism the sequence-sharded input of a column-parallel GEMM is all-gathered again for
its weight gradient (``LinearWithGradAccumulationAndAsyncCommunication``). The vocabulary
is padded to ``ceil(vocab / tp)`` columns per rank; MoE experts are tensor-parallel like
the dense MLP, their GEMMs grouped (:mod:`workloads.decompose.moe`; expert parallelism is
priced by the step model's all-to-alls).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import yaml

from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose.engines import get_engine
from workloads.decompose.layer import (
    expand_forward,
    layer_templates,
    norm_kind,
    region_collective,
)
from workloads.decompose.mla import attention_dims
from workloads.decompose.moe import moe_share, touched_experts
from workloads.decompose.shard import TPShard, params_per_tp_rank, positive_int, tp_shard
from workloads.decompose.templates import (
    LayerOp,
    OpTemplate,
    elementwise,
    gemm,
    region,
    sharded_elementwise,
)
from workloads.decompose.templates import copy_traffic as _traffic
from workloads.models import ModelConfig, ModelError
from workloads.ops import BACKENDS, ELEMENTWISE_KINDS, Op, OpKind

if TYPE_CHECKING:  # plans import the shard rules of this package
    from workloads.plan import TrainPlan

# Backward of an elementwise op: the op kinds have no backward variants, so the backward
# is the same kind over ``ceil(m * ratio)`` rows, where ``ratio`` is the backward's HBM
# traffic over the forward's (a bandwidth-bound approximation):
#   norms / GELU / softmax: forward reads x, writes y (2 tensors); backward reads x and dy,
#     writes dx (3) -> 3/2.
#   SwiGLU: forward reads gate, up, writes out (3); backward reads gate, up, dout, writes
#     dgate, dup (5) -> 5/3.
#   RoPE (rotate by -theta), residual add (gradient accumulation), cross-entropy (reads the
#     saved softmax, writes dlogits), embedding (scatter-add of the gradient rows), copy:
#     the same traffic as forward -> 1.
BACKWARD_TRAFFIC_RATIO: dict[OpKind, tuple[int, int]] = {
    OpKind.rmsnorm: (3, 2),
    OpKind.layernorm: (3, 2),
    OpKind.gelu: (3, 2),
    OpKind.softmax: (3, 2),
    OpKind.swiglu: (5, 3),
    OpKind.rope: (1, 1),
    OpKind.residual_add: (1, 1),
    OpKind.cross_entropy: (1, 1),
    OpKind.embedding: (1, 1),
    OpKind.copy: (1, 1),
}

Phase = Literal["forward", "backward"]
Stage = Literal["all", "first", "last"]
Framework = Literal["megatron", "megatron-unfused", "pytorch", "pytorch-compile"]
FRAMEWORKS: tuple[str, ...] = ("megatron", "megatron-unfused", "pytorch", "pytorch-compile")
ATTENTION = {"attn_fwd", "attn_bwd", "attn_fwdbwd"}


@dataclass(frozen=True)
class _Ctx:
    model: ModelConfig
    batch: int
    seq_len: int
    shard: TPShard
    sequence_parallel: bool
    dtype: Dtype

    @property
    def tp(self) -> int:
        return self.shard.tp

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    @property
    def sp(self) -> bool:
        return self.sequence_parallel and self.tp > 1

    @property
    def act_dtype(self) -> Dtype:
        """The dtype of everything but the layers' GEMMs. FP8 training (Transformer Engine,
        torchao float8) runs only the Linear GEMMs in fp8: activations, norms, attention,
        the loss, the LM head and TP collectives stay bf16."""
        return Dtype.bf16 if self.dtype == Dtype.fp8 else self.dtype

    @property
    def bytes_per_token(self) -> int:
        """One token's hidden vector: what a TP collective moves per token."""
        return self.model.hidden_size * DTYPE_BYTES[self.act_dtype]

    def collective(self, kind: OpKind, nbytes: int) -> Op:
        return Op(op=kind, dtype=self.act_dtype, bytes=nbytes, ranks=self.tp)

    def act(self, ops: list[LayerOp]) -> list[LayerOp]:
        """``ops`` with every non-GEMM op in :attr:`act_dtype`."""
        if self.act_dtype == self.dtype:
            return ops
        return [
            o
            if o.op.op == OpKind.gemm or o.op.dtype != self.dtype
            else LayerOp(o.name, o.op.model_copy(update={"dtype": self.act_dtype}), o.count)
            for o in ops
        ]


def _make_ctx(
    model: ModelConfig,
    batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    dtype: Dtype | str,
    attn_backend: str = "",
    attn_kind: OpKind = OpKind.attn_fwd,
    seq_name: str = "seq_len",
) -> _Ctx:
    positive_int(batch, "batch")
    positive_int(seq_len, seq_name)
    shard = tp_shard(model, tp)
    try:
        dt = Dtype(dtype)
    except ValueError:
        allowed = ", ".join(d.value for d in Dtype)
        raise ModelError(f"unknown dtype {dtype!r}; allowed: {allowed}") from None
    check_backend(attn_backend, attn_kind)
    if sequence_parallel and tp > 1 and seq_len % tp:
        raise ModelError(
            f"sequence parallelism needs seq_len divisible by tp; got seq_len={seq_len}, tp={tp}"
        )
    return _Ctx(model, batch, seq_len, shard, sequence_parallel, dt)


def check_backend(attn_backend: str, attn_kind: OpKind) -> None:
    """A one-line ModelError for an attention backend the op kind does not have."""
    if attn_backend and attn_backend not in BACKENDS[attn_kind]:
        raise ModelError(
            f"unknown attention backend {attn_backend!r} for {attn_kind.value}; "
            f"allowed: {', '.join(BACKENDS[attn_kind])}"
        )


def _forward(ctx: _Ctx, steps: list[OpTemplate], attn: Op | None = None) -> list[LayerOp]:
    out: list[LayerOp] = []
    for t in expand_forward(steps, ctx.tp, ctx.sp, ctx.bytes_per_token, ctx.act_dtype.value):
        if t.is_attention:
            assert attn is not None
            out.append(LayerOp(t.name, attn, t.share))
        else:
            out.append(t.layer_op(ctx.tokens, ctx.dtype.value))
    return ctx.act(out)


def _backward_op(op: Op) -> Op:
    """The forward op's backward counterpart for elementwise/copy kinds (see the ratios)."""
    num, den = BACKWARD_TRAFFIC_RATIO[op.op]
    if op.op == OpKind.copy:
        assert op.bytes is not None
        return op.model_copy(update={"bytes": -(-op.bytes * num // den)})
    assert op.m is not None
    return op.model_copy(update={"m": -(-op.m * num // den)})


def _backward(ctx: _Ctx, steps: list[OpTemplate], attn: Op | None = None) -> list[LayerOp]:
    out: list[LayerOp] = []
    nbytes = ctx.tokens * ctx.bytes_per_token
    for step in reversed(steps):
        if step.region:
            for t in _region(ctx, step, backward=True):
                out.append(t.layer_op(ctx.tokens, ctx.dtype.value))
            continue
        if step.is_attention:
            assert attn is not None
            bwd = attn.model_copy(update={"op": OpKind.attn_bwd})
            out.append(LayerOp("attn_bwd", bwd, step.share))
            continue
        lo = step.layer_op(ctx.tokens, ctx.dtype.value)
        op = lo.op
        if op.op == OpKind.gemm:
            m, k, n = op.m, op.k, op.n
            assert m is not None and k is not None and n is not None
            # dgrad: dX[m,k] = dY[m,n] . W^T[n,k]; wgrad: dW[k,n] = X^T[k,m] . dY[m,n]
            # the backward GEMMs run in the forward GEMM's dtype (a bf16 LM head under fp8);
            # a grouped (MoE) GEMM's are grouped too: the same experts, one launch each
            dt, b = op.dtype, op.batch
            out.append(LayerOp(f"{lo.name}_dgrad", _gemm(ctx, m, n, k, dt, b), lo.count))
            if step.regather and ctx.sp:
                gather = ctx.collective(OpKind.all_gather, nbytes)
                out.append(LayerOp(f"tp_allgather_{lo.name}_input", gather))
            out.append(LayerOp(f"{lo.name}_wgrad", _gemm(ctx, k, m, n, dt, b), lo.count))
        elif op.op in ELEMENTWISE_KINDS:
            out.append(LayerOp(f"{lo.name}_bwd", _backward_op(op), lo.count))
        else:  # pragma: no cover - every forward step kind is handled above
            raise AssertionError(f"no backward for {op.op}")
    return ctx.act(out)


def _gemm(
    ctx: _Ctx, m: int, k: int, n: int, dtype: Dtype | None = None, batch: int | None = None
) -> Op:
    return Op(op=OpKind.gemm, dtype=dtype or ctx.dtype, m=m, k=k, n=n, batch=batch)


def _region(ctx: _Ctx, step: OpTemplate, backward: bool) -> list[OpTemplate]:
    return region_collective(
        step, ctx.tp, ctx.sp, backward, ctx.bytes_per_token, ctx.act_dtype.value
    )


def _attn_fwd(ctx: _Ctx, causal: bool, attn_backend: str) -> Op:
    return Op(
        op=OpKind.attn_fwd,
        dtype=ctx.act_dtype,
        batch=ctx.batch,
        seq_q=ctx.seq_len,
        seq_kv=ctx.seq_len,
        causal=causal,
        backend=attn_backend or None,
        **attention_dims(ctx.model, ctx.shard, "train"),
    )


def _layer(ctx: _Ctx) -> list[OpTemplate]:
    return layer_templates(ctx.model, ctx.shard, ctx.dtype.value, "fused", ctx.sequence_parallel)


# --- public API ----------------------------------------------------------------------------


def layer_forward_ops(
    model: ModelConfig,
    batch: int,
    seq_len: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    dtype: Dtype | str = "bf16",
    attn_backend: str = "",
    causal: bool = True,
) -> list[LayerOp]:
    """Forward ops of one transformer layer on one TP rank, for ``batch`` sequences of
    ``seq_len`` tokens (GEMM rows ``m = batch * seq_len``)."""
    ctx = _make_ctx(model, batch, seq_len, tp, sequence_parallel, dtype, attn_backend)
    return _forward(ctx, _layer(ctx), _attn_fwd(ctx, causal, attn_backend))


def layer_backward_ops(
    model: ModelConfig,
    batch: int,
    seq_len: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    dtype: Dtype | str = "bf16",
    attn_backend: str = "",
    causal: bool = True,
) -> list[LayerOp]:
    """Backward ops of one layer, in execution order (the forward reversed; see the module
    docstring). Recomputation is the step model's business: prepend
    ``layer_forward_ops`` where it applies."""
    ctx = _make_ctx(model, batch, seq_len, tp, sequence_parallel, dtype, attn_backend)
    return _backward(ctx, _layer(ctx), _attn_fwd(ctx, causal, attn_backend))


def _stage_steps(ctx: _Ctx, stage: Stage) -> tuple[list[OpTemplate], list[OpTemplate]]:
    """Non-layer forward steps: (before the layers, after the layers)."""
    m, sh, dt = ctx.model, ctx.shard, ctx.dtype.value
    h = m.hidden_size
    first: list[OpTemplate] = []
    last: list[OpTemplate] = []
    if stage in ("all", "first"):
        # Megatron's VocabParallelEmbedding: each rank gathers the rows of its vocab shard
        # (zeros elsewhere), then the exit collective sums the partial embeddings.
        first.append(elementwise("embedding", OpKind.embedding.value, h, dt))
        if m.position == "learned":
            first.append(elementwise("pos_embedding", OpKind.embedding.value, h, dt))
        first.append(region("embedding", "exit"))
    if stage in ("all", "last"):
        norm = f"final_{m.norm}"
        if ctx.sp:
            last.append(sharded_elementwise(norm, norm_kind(m), h, dt, ctx.tp))
        else:
            last.append(elementwise(norm, norm_kind(m), h, dt))
        # FP8 recipes keep the output layer in bf16: Megatron-LM's output_layer is a plain
        # ColumnParallelLinear (not a Transformer Engine module) and torchao/torchtitan
        # filter it out of float8 conversion; its logits feed a softmax over the vocabulary.
        head_dt = Dtype.bf16.value if dt == Dtype.fp8.value else dt
        last += [region("lm_head", "enter"), gemm("lm_head", h, sh.vocab, head_dt, regather=True)]
    return first, last


def model_step_ops(
    model: ModelConfig,
    batch: int,
    seq_len: int,
    tp: int = 1,
    phase: Phase = "forward",
    sequence_parallel: bool = False,
    dtype: Dtype | str = "bf16",
    stage: Stage = "all",
) -> list[LayerOp]:
    """The non-layer ops of a training step: embedding (first pipeline stage), final norm,
    LM head GEMM over ``ceil(vocab / tp)`` columns and vocab-parallel cross-entropy (last
    stage). ``stage`` picks 'first', 'last' or 'all' (no pipeline).

    The cross-entropy's three all-reduces of one fp32 per token (max logit, target logit,
    sum of exponentials; Megatron's ``_VocabParallelCrossEntropy``) appear as one
    ``tp_allreduce_cross_entropy`` op with ``count=3``.
    """
    if phase not in ("forward", "backward"):
        raise ModelError(f"unknown phase {phase!r}; allowed: forward, backward")
    if stage not in ("all", "first", "last"):
        raise ModelError(f"unknown stage {stage!r}; allowed: all, first, last")
    ctx = _make_ctx(model, batch, seq_len, tp, sequence_parallel, dtype)
    first, last = _stage_steps(ctx, stage)
    if last:
        ce = OpKind.cross_entropy.value
        last.append(elementwise("cross_entropy", ce, ctx.shard.vocab, ctx.dtype.value))
    if phase == "forward":
        out = _forward(ctx, first) + _forward(ctx, last)
        if last and ctx.tp > 1:
            ce = Op(op=OpKind.all_reduce, dtype=Dtype.fp32, bytes=ctx.tokens * 4, ranks=ctx.tp)
            out.append(LayerOp("tp_allreduce_cross_entropy", ce, count=3))
        return out
    return _backward(ctx, last) + _backward(ctx, first)


def optimizer_ops(
    model: ModelConfig, num_params_per_rank: int, dtype: Dtype | str = "fp32"
) -> list[LayerOp]:
    """One AdamW step over the parameters this rank updates (``dtype``: the master
    weights' dtype, fp32 under mixed precision)."""
    positive_int(num_params_per_rank, "num_params_per_rank")
    return [
        LayerOp("optimizer_adamw", Op(op=OpKind.adamw, dtype=Dtype(dtype), n=num_params_per_rank))
    ]


def op_groups(
    model: ModelConfig, plan: TrainPlan, attn_backend: str = "", framework: Framework = "megatron"
) -> list[list[LayerOp]]:
    """The ops of one micro-batch on one rank, unpriced, in six groups: layer forward,
    layer backward, first-stage forward / backward, last-stage forward / backward.
    Attention ops are those of the full sequence under context parallelism (the caller
    scales them by 1/cp). ``framework`` picks the engine: ``megatron`` (the fused layer
    as it is), ``megatron-unfused`` (:func:`_unfused_attention`) or ``pytorch`` (eager
    PyTorch under autocast: :func:`eager_extra_ops` on top)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; allowed: {', '.join(FRAMEWORKS)}")
    engine = get_engine(framework, "train")
    tp, cp, mb = plan.tp, plan.cp, plan.micro_batch
    seq_local = plan.seq_len // cp
    dtype = plan.compute_dtype
    args = dict(tp=tp, sequence_parallel=plan.sp, dtype=dtype, attn_backend=attn_backend)
    fwd = layer_forward_ops(model, mb, seq_local, **args)
    bwd = layer_backward_ops(model, mb, seq_local, **args)
    # Causal attention of the local queries against the whole sequence, balanced over cp
    # ranks: 1/cp of the full causal attention (priced at full length, then scaled).
    if cp > 1:
        full_f = {o.name: o for o in layer_forward_ops(model, mb, plan.seq_len, **args)}
        full_b = {o.name: o for o in layer_backward_ops(model, mb, plan.seq_len, **args)}
        fwd = [full_f[o.name] if o.op.op.value in ATTENTION else o for o in fwd]
        bwd = [full_b[o.name] if o.op.op.value in ATTENTION else o for o in bwd]
    stage_args = dict(tp=tp, sequence_parallel=plan.sp, dtype=dtype)
    first_f = model_step_ops(model, mb, seq_local, phase="forward", stage="first", **stage_args)
    first_b = model_step_ops(model, mb, seq_local, phase="backward", stage="first", **stage_args)
    last_f = model_step_ops(model, mb, seq_local, phase="forward", stage="last", **stage_args)
    last_b = model_step_ops(model, mb, seq_local, phase="backward", stage="last", **stage_args)
    fp8 = plan.compute_dtype == "fp8"
    if engine.eager_training_traffic:
        extra = eager_extra_ops(model, plan)
        if engine.compiled_layers:  # Inductor fuses the layer; its weight casts remain
            keep = ("eager_wgrad_cast",) if fp8 else ("eager_weight_cast", "eager_wgrad_cast")
            extra["layer_fwd"] = [o for o in extra["layer_fwd"] if o.name in keep]
            extra["layer_bwd"] = [o for o in extra["layer_bwd"] if o.name in keep]
        elif fp8:  # the float8 casts below replace autocast's bf16 weight casts
            extra["layer_fwd"] = [o for o in extra["layer_fwd"] if o.name != "eager_weight_cast"]
        fwd, bwd = fwd + extra["layer_fwd"], bwd + extra["layer_bwd"]
        if model.is_moe and not engine.compiled_layers and plan.experts_loop:
            fwd, bwd = hf_experts_loop(model, plan, fwd, bwd)
        if model.attention_sinks and not engine.compiled_layers:
            fwd, bwd = hf_sinks_attention(model, plan, fwd, bwd)
        first_f, first_b = first_f + extra["first_fwd"], first_b + extra["first_bwd"]
        last_f, last_b = last_f + extra["last_fwd"], last_b + extra["last_bwd"]
    elif engine.unfused_attention:
        if cp > 1:
            raise ValueError("framework megatron-unfused does not model context parallelism")
        fwd, bwd = _unfused_attention(model, plan, fwd, bwd)
    if fp8:
        scaling = engine.fp8_scaling
        fwd = fwd + _fp8_casts(model, plan, "fwd", scaling)
        bwd = bwd + _fp8_casts(model, plan, "bwd", scaling)
    return [fwd, bwd, first_f, first_b, last_f, last_b]


# The fused layer's grouped expert GEMMs, which transformers' experts loop replaces.
GROUPED_EXPERT_GEMMS = ("expert_up", "expert_down")


def hf_experts_loop(
    model: ModelConfig, plan: TrainPlan, fwd: list[LayerOp], bwd: list[LayerOp]
) -> tuple[list[LayerOp], list[LayerOp]]:
    """An MoE layer's expert GEMMs as transformers runs them in an eager training step
    under ``torch.autocast`` with fp32 parameters: its ``grouped_mm`` experts sort the
    routed rows by expert (one permute, as the fused layer's), but ``grouped_mm`` takes no
    fp32 weights, so its fallback multiplies expert by expert: two fp32 GEMMs forward and
    four backward per expert that received rows (the H200 traces of gpt-oss and
    Kimi-Linear, calibrate/data/hf-steps*: thousands of fp32 FFMA GEMMs a step, the sort,
    the activation and the combine one kernel each). Mean rows per hit expert
    ``T k / E_touched``; the GEMMs run in the MoE layers' share of the mean layer."""
    t = plan.micro_batch * plan.seq_len // plan.cp
    hit = int(touched_experts(model)(np.array([t]))[0])  # the grouped kernel's count
    rows = max(1, math.ceil(t * model.experts_per_token / hit))
    n = hit * moe_share(model)
    h, f = model.hidden_size, model.expert_ffn_hidden_size // plan.tp
    up = (2 if model.gated_mlp else 1) * f

    def gemm(name: str, m: int, k: int, nn: int) -> LayerOp:
        return LayerOp(name, Op(op=OpKind.gemm, dtype=Dtype.fp32, m=m, k=k, n=nn), n)

    loop_f = [gemm("hf_expert_up", rows, h, up), gemm("hf_expert_down", rows, f, h)]
    loop_b = [
        gemm("hf_expert_down_dgrad", rows, h, f), gemm("hf_expert_down_wgrad", f, rows, h),
        gemm("hf_expert_up_dgrad", rows, up, h), gemm("hf_expert_up_wgrad", h, rows, up),
    ]  # fmt: skip
    grouped = {f"{g}{d}" for g in GROUPED_EXPERT_GEMMS for d in ("", "_dgrad", "_wgrad")}
    return (
        [o for o in fwd if o.name not in grouped] + loop_f,
        [o for o in bwd if o.name not in grouped] + loop_b,
    )


# Backward traffic of the eager pointwise ops relative to their forward: each autograd
# node reads the incoming gradient and its saved inputs and writes the input gradient(s).
EAGER_BACKWARD_RATIO = 2.0


def eager_extra_ops(model: ModelConfig, plan: TrainPlan) -> dict[str, list[LayerOp]]:
    """Extra HBM traffic of a plain eager PyTorch Llama under ``torch.autocast(bf16)``
    with fp32 parameters (calibrate/steps/train_step.py), beyond the fused kernels the
    layer ops price. Derived from the tensors each eager kernel reads and writes:

    - the residual stream stays fp32 (fp32 embedding, RMSNorm computes in fp32), X = 4Th;
    - RMSNorm as pow, mean, two muls (7X instead of a fused X), for each of the layer's
      norms (Gemma 2/3: four), and per-head q/k norms where the model has them;
    - autocast casts every Linear's input to bf16 (q, k, v, gate, up: 1.5X each) and
      every weight fp32 -> bf16 once per forward (6 bytes per parameter), and the bf16
      weight gradients back to fp32 (6 bytes per parameter) in backward;
    - RoPE as mul, neg, cat, mul, add, cast with fp32 cos/sin (18 bytes per bf16 element
      instead of 2 fused); the attention output transpose is a copy; SiLU and the gate
      multiply are two kernels (5 instead of 3 tensors); fp32 + bf16 residual adds;
    - cross-entropy upcasts the bf16 logits to fp32, log-softmax, NLL and their
      backward (18 logits-sized bf16 traffic units instead of 6 fused);
    - the fp32 embedding's backward zero-fills and scatters a vocab x hidden gradient;
    - with several micro-batches per step (pipelines, gradient accumulation) autograd's
      AccumulateGrad adds every later micro-batch's fp32 weight gradient into ``.grad``
      (reads both, writes one: 12 bytes per parameter), ``(m - 1) / m`` of it per
      micro-batch on average (Megatron fuses the accumulation into the wgrad GEMM).
    """
    tp = plan.tp
    t = plan.micro_batch * plan.seq_len // plan.cp
    h = model.hidden_size
    x = 4.0 * t * h
    q = 2.0 * t * model.num_heads * model.head_dim / tp
    k = 2.0 * t * max(1, model.num_kv_heads // tp) * model.head_dim
    f = 2.0 * t * model.ffn_hidden_size / tp
    casts = 3 + (2 if model.gated_mlp else 1)
    norms = model.norms_per_layer
    layer_params = params_per_tp_rank(model, tp)["layer"]
    shard = plan.data_parallel * plan.cp if plan.zero == 3 else 1
    fwd = [
        # every RMSNorm of the layer (Gemma 2/3: four), and q/k norms (bf16 q and k read
        # as fp32: cast, pow, mean, mul, cast back, weight: 18 bytes per bf16 byte)
        _traffic("eager_rmsnorm", norms * 6.0 * x, 4 * norms),
        *([_traffic("eager_qk_norm", 9.0 * (q + k), 12)] if model.qk_norm else []),
        _traffic("eager_input_casts", casts * 1.5 * x, casts),
        _traffic("eager_rope", 16.0 * (q + k), 10),
        _traffic("eager_attn_out_copy", 2.0 * q),
        _traffic("eager_residual_fp32", 2.0 * x, 2),
        _traffic("eager_silu_mul", 2.0 * f, 1),
        # FSDP with bf16 MixedPrecision casts only its shard before the all-gather
        _traffic("eager_weight_cast", 6.0 * layer_params / shard, 7),
    ]
    bwd = [
        _traffic(o.name + "_bwd", 2 * o.op.bytes * o.count * EAGER_BACKWARD_RATIO, o.count)
        for o in fwd
        if o.name != "eager_weight_cast"
    ]
    bwd.append(_traffic("eager_wgrad_cast", 6.0 * layer_params, 7))
    m = plan.num_microbatches
    accumulate = 12.0 * (m - 1) / m  # bytes per parameter per micro-batch, on average
    if m > 1:
        bwd.append(_traffic("eager_grad_accumulate", accumulate * layer_params / shard, 7))
    vocab = -(-model.vocab_size // tp)
    logits = 2.0 * t * vocab
    head = params_per_tp_rank(model, tp)["lm_head"]
    first_bwd = [_traffic("eager_embedding_grad", 2.0 * 4.0 * vocab * h, 2)]
    last_acc = []
    if m > 1:
        embedding = accumulate * vocab * h / shard
        first_bwd.append(_traffic("eager_embedding_grad_accumulate", embedding))
        last_acc.append(_traffic("eager_lm_head_grad_accumulate", accumulate * head / shard))
    # Gemma 2's final soft-capping, eagerly: logits / cap, tanh, * cap (each reads and
    # writes the bf16 logits); backward: the two scalings' grads and tanh's (reads its
    # output and the grad): 7 logits-sized passes
    cap = model.final_logit_softcap is not None
    softcap_f = [_traffic("eager_logit_softcap", 6.0 * logits, 3)] if cap else []
    softcap_b = [_traffic("eager_logit_softcap_bwd", 7.0 * logits, 3)] if cap else []
    return {
        "layer_fwd": fwd,
        "layer_bwd": bwd,
        "first_fwd": [],
        "first_bwd": first_bwd,
        "last_fwd": [
            _traffic("eager_final_norm", 6.0 * x + 1.5 * x, 6),
            _traffic("eager_lm_head_weight_cast", 6.0 * head / shard),
            _traffic("eager_cross_entropy", 7.0 * logits - 3.0 * logits, 2),
            *softcap_f,
        ],
        "last_bwd": [
            _traffic("eager_final_norm_bwd", (6.0 * x + 1.5 * x) * EAGER_BACKWARD_RATIO, 6),
            _traffic("eager_lm_head_wgrad_cast", 6.0 * head),
            _traffic("eager_cross_entropy_bwd", 11.0 * logits - 3.0 * logits, 3),
            *softcap_b,
            *last_acc,
        ],
    }


# Attention dropout probability of the Megatron-LM GPT runs (Korthikanti et al. 2022 sec. 4).
ATTENTION_DROPOUT = 0.1


def _unfused_attention(
    model: ModelConfig, plan: TrainPlan, fwd: list[LayerOp], bwd: list[LayerOp]
) -> tuple[list[LayerOp], list[LayerOp]]:
    """Megatron-LM's core attention before FlashAttention (Korthikanti et al. 2022, fig. 4
    and eq. 1's 5as^2b term): batched Q K^T over the whole s x s square (no causal
    skipping), the fused scale-mask-softmax, dropout with a byte mask, and the batched
    scores x V; the backward runs two GEMMs per forward GEMM, the softmax backward and
    the dropout backward. The s x s tensors are the cost the flash kernel removes."""
    b, s = plan.micro_batch, plan.seq_len
    heads = model.num_heads // plan.tp
    d = model.head_dim
    dt = Dtype(plan.activation_dtype)
    bh = b * heads
    elems = bh * s * s

    def gemm(name: str, m: int, n: int, k: int) -> LayerOp:
        return LayerOp(name, Op(op=OpKind.gemm, dtype=dt, m=m, n=n, k=k, batch=bh))

    softmax = Op(op=OpKind.softmax, dtype=dt, m=bh * s, n=s)
    softmax_bwd = Op(op=OpKind.softmax, dtype=dt, m=bh * s * 3 // 2, n=s)
    # dropout forward: read scores, write output and a 1-byte mask (5 bytes per element
    # in fp16); backward: read the gradient and the mask, write the gradient (5 bytes).
    drop = _traffic("attn_dropout", 5.0 * elems) if ATTENTION_DROPOUT else None
    drop_b = _traffic("attn_dropout_bwd", 5.0 * elems) if ATTENTION_DROPOUT else None
    core_f = [gemm("attn_scores", s, s, d), LayerOp("attn_softmax", softmax)]
    core_f += [drop] if drop else []
    core_f += [gemm("attn_context", s, d, s)]
    core_b = [gemm("attn_context_dgrad", s, s, d), gemm("attn_context_vgrad", s, d, s)]
    core_b += [drop_b] if drop_b else []
    core_b += [LayerOp("attn_softmax_bwd", softmax_bwd)]
    core_b += [gemm("attn_scores_qgrad", s, d, s), gemm("attn_scores_kgrad", s, d, s)]
    out_f = [x for o in fwd for x in (core_f if o.op.op.value in ATTENTION else [o])]
    out_b = [x for o in bwd for x in (core_b if o.op.op.value in ATTENTION else [o])]
    return out_f, out_b


def scores_kind(model: ModelConfig, framework: str) -> int:
    """s x s attention scores a framework keeps for the backward: 1 Megatron's unfused
    core attention, 2 transformers' eager one with sinks (gpt-oss: no SDPA path, its
    softmax output), 0 none (flash attention)."""
    sinks = framework == "pytorch" and model.attention_sinks
    return 1 if framework == "megatron-unfused" else 2 if sinks else 0


def hf_sinks_attention(
    model: ModelConfig, plan: TrainPlan, fwd: list[LayerOp], bwd: list[LayerOp]
) -> tuple[list[LayerOp], list[LayerOp]]:
    """gpt-oss's attention as transformers runs it (:func:`sinks_attention_ops`) in place
    of the fused attention ops: with sinks there is no SDPA path, so every layer (sliding
    ones too: the window is only a mask) materialises its scores."""
    heads = plan.micro_batch * model.num_heads // plan.tp
    core_f, core_b = sinks_attention_ops(
        heads, plan.seq_len // plan.cp, model.head_dim, Dtype(plan.activation_dtype),
        sinks_traffic_factors(),
    )  # fmt: skip
    out_f = [x for o in fwd for x in (core_f if o.op.op.value in ATTENTION else [o])]
    out_b = [x for o in bwd for x in (core_b if o.op.op.value in ATTENTION else [o])]
    return out_f, out_b


@lru_cache(maxsize=1)
def sinks_traffic_factors() -> tuple[float, float]:
    """Measured time of the eager kernels of :func:`sinks_attention_ops` over their
    nominal traffic priced as copies, forward and backward (broadcast adds, the ``cat``
    with an odd row width and strided slices run well below copy bandwidth), fitted on
    transformers' function alone (``python -m calibrate.fit_eager_sinks --write``)."""
    path = Path(str(resources.files("workloads") / "data" / "hf_sinks_attention.yaml"))
    f = yaml.safe_load(path.read_text())["traffic_factor"]
    return float(f["fwd"]), float(f["bwd"])


def sinks_attention_ops(
    bh: int, s: int, d: int, dt: Dtype, factors: tuple[float, float] = (1.0, 1.0)
) -> tuple[list[LayerOp], list[LayerOp]]:
    """transformers' ``eager_attention_forward`` with sinks over ``bh`` heads of ``s``
    tokens, E = bh s^2 score elements (bf16 under autocast): the batched Q K^T,
    ``* scaling``, ``+ mask``, ``cat`` with the sink logit, the row max, the subtraction
    (4, 4, 4, 2, 4 bytes per element read + written), softmax, and the batched P V on
    ``probs[..., :-1]``, a slice whose rows are s + 1 apart (priced as a GEMM of depth
    s + 1: CUTLASS's align-1 kernels in the traces). Backward: the slice's zero-filled
    gradient and its copy (6 E), softmax backward, the max's reduction and the scale's
    multiply (6 E), two GEMMs per forward GEMM. ``factors`` scale the forward and
    backward traffic (:func:`sinks_traffic_factors`)."""
    elems = bh * s * s

    def gemm(name: str, m: int, n: int, k: int) -> LayerOp:
        return LayerOp(name, Op(op=OpKind.gemm, dtype=dt, m=m, n=n, k=k, batch=bh))

    ff, fb = factors
    softmax = Op(op=OpKind.softmax, dtype=dt, m=bh * s, n=s + 1)
    softmax_bwd = Op(op=OpKind.softmax, dtype=dt, m=bh * s * 3 // 2, n=s + 1)
    core_f = [
        gemm("hf_attn_scores", s, s, d),
        _traffic("hf_attn_scale_mask_cat_max_sub", ff * 18.0 * elems, 5),
        LayerOp("hf_attn_softmax", softmax),
        gemm("hf_attn_context", s, d, s + 1),
    ]
    core_b = [
        gemm("hf_attn_context_dgrad", s, s, d), gemm("hf_attn_context_vgrad", s, d, s + 1),
        _traffic("hf_attn_slice_bwd", fb * 6.0 * elems, 2),
        LayerOp("hf_attn_softmax_bwd", softmax_bwd),
        _traffic("hf_attn_max_scale_bwd", fb * 6.0 * elems, 2),
        gemm("hf_attn_scores_qgrad", s, d, s), gemm("hf_attn_scores_kgrad", s, d, s),
    ]  # fmt: skip
    return core_f, core_b


def _fp8_casts(
    model: ModelConfig, plan: TrainPlan, phase: str, scaling: str = "delayed"
) -> list[LayerOp]:
    """FP8 GEMMs need their operands quantised (Micikevicius et al. 2022, "FP8 formats for
    deep learning"). Forward: the inputs of the QKV, output, up and down projections;
    backward: the gradients of their outputs; and the weights.

    ``delayed`` (Transformer Engine): the scale comes from an amax history, so one fused
    cast-transpose reads bf16 and writes fp8 and its transpose (4 bytes per element).
    Weights: fp32 masters read (4 B) and written as fp8 and its transpose (1 + 1 B), 6
    bytes per parameter per iteration, cast on the first micro-batch and reused, so each
    micro-batch carries 1/num_microbatches of it.

    ``dynamic`` (torchao float8, tensorwise): every cast first reduces the tensor's amax
    (a read), then casts (read + write), and the transposed operands of the backward GEMMs
    are cast separately: inputs 5 B per element forward (amax 2, cast 2 + 1) and 3 B
    again in the backward (the transposed copy for the weight gradient); output
    gradients 8 B (amax 2, cast 3, transposed cast 3); weights 14 B per parameter on
    every micro-batch (amax 4, cast 4 + 1, transposed cast 4 + 1), nothing cached.
    At 1-2B parameters and a few thousand tokens per micro-batch the weights cost as much
    as the activations."""
    tp = plan.tp
    t = plan.micro_batch * plan.seq_len // plan.cp
    h = model.hidden_size
    q = model.num_heads * model.head_dim / tp
    kv = max(1, model.num_kv_heads // tp) * model.head_dim
    f = model.ffn_hidden_size / tp * (2 if model.gated_mlp else 1)
    fwd_widths = [h, q, h, model.ffn_hidden_size / tp]
    grad_widths = [q + 2 * kv, h, f, h]
    weights = params_per_tp_rank(model, tp)["layer"]
    if scaling == "dynamic":
        if phase == "fwd":
            return [
                _traffic("fp8_cast_fwd", 5.0 * t * sum(fwd_widths), 2 * len(fwd_widths)),
                _traffic("fp8_weight_cast", 14.0 * weights, 3 * len(fwd_widths)),
            ]
        acts = 8.0 * t * sum(grad_widths) + 3.0 * t * sum(fwd_widths)
        return [_traffic("fp8_cast_bwd", acts, 3 * len(grad_widths) + len(fwd_widths))]
    widths = fwd_widths if phase == "fwd" else grad_widths
    casts = [_traffic(f"fp8_cast_{phase}", 4.0 * t * sum(widths), len(widths))]
    if phase == "fwd":
        casts.append(_traffic("fp8_weight_cast", 6.0 * weights / plan.num_microbatches))
    return casts
