"""Expand a model into the :class:`~workloads.ops.Op` s one tensor-parallel rank runs.

Pure shape arithmetic: no costs. Every function returns ``list[LayerOp]``; a
:class:`LayerOp` pairs a stable ``name`` (for time breakdowns) with an ``op`` and a
``count`` of identical instances, so a phase's time is ``sum(count * predict(op))``.

Tensor parallelism follows Megatron-LM (Shoeybi et al. 2019, sec. 3; sequence parallelism
from Korthikanti et al. 2022): Q/K/V and the MLP up (fused gate+up for SwiGLU) projections are
column-parallel, the attention output and MLP down projections row-parallel, heads are
split across ranks. Each block is wrapped in Megatron's conjugate operators: *enter*
(``f``: identity forward, all-reduce of the input gradient backward) and *exit* (``g``:
all-reduce forward, identity backward). With sequence parallelism they become
all-gather / reduce-scatter pairs (enter: all-gather forward, reduce-scatter backward;
exit: reduce-scatter forward, all-gather backward), norms and residual adds run on
``tokens / tp`` tokens, and, as in Megatron-LM's ``LinearWithGradAccumulationAnd
AsyncCommunication``, the sequence-sharded input of a column-parallel GEMM is all-gathered
again in the backward pass for its weight gradient.

Collective ``bytes`` is the size of the full (unsharded) tensor, ``tokens * hidden *
dtype_bytes``, for all-reduce, all-gather (output size) and reduce-scatter (input size),
the nccl-tests convention; ``ranks = tp``. Collectives are omitted when ``tp == 1``.

Simplifications (documented so the simulators can judge them): biases are fused into
their GEMMs; dropout is not modelled (Llama-style pre-training runs without it; Megatron's
GPT runs used 0.1, whose fused bias-dropout-add kernels are thus missing); the
vocabulary is padded to ``ceil(vocab / tp)`` columns per rank (as Megatron pads it) rather
than rejected; MoE routing is perfectly balanced and expert-parallel degree is 1 (experts
are tensor-parallel like the dense MLP, the router is replicated); sliding-window
attention is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.models import ModelConfig, ModelError
from workloads.ops import BACKENDS, ELEMENTWISE_KINDS, Op, OpKind

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


@dataclass(frozen=True)
class LayerOp:
    """A named op and how many identical instances of it run (e.g. one per expert)."""

    name: str
    op: Op
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ModelError(f"LayerOp {self.name!r}: count must be >= 1, got {self.count}")


@dataclass(frozen=True)
class TPShard:
    """What one tensor-parallel rank holds of each split dimension."""

    tp: int
    heads: int
    kv_heads: int  # 1 when tp > num_kv_heads (each KV head then lives on kv_replicas ranks)
    kv_replicas: int  # ranks holding a copy of each KV head: tp / num_kv_heads, at least 1
    ffn: int
    expert_ffn: int
    vocab: int  # ceil(vocab / tp): the vocabulary is padded to a multiple of tp


def _tp_problem(model: ModelConfig, tp: int) -> str | None:
    """Why ``tp`` cannot split ``model``, or None if it can."""
    if model.num_heads % tp:
        return f"tp={tp} does not divide num_heads={model.num_heads}"
    kv = model.num_kv_heads
    if kv % tp and tp % kv:
        return (
            f"tp={tp} neither divides num_kv_heads={kv} nor is a multiple of it "
            "(KV heads are split, or replicated when tp > num_kv_heads)"
        )
    if model.ffn_hidden_size % tp:
        return f"tp={tp} does not divide ffn_hidden_size={model.ffn_hidden_size}"
    if model.expert_ffn_hidden_size % tp:
        return f"tp={tp} does not divide moe_ffn_hidden_size={model.expert_ffn_hidden_size}"
    return None


def valid_tp_degrees(model: ModelConfig) -> list[int]:
    """Every tensor-parallel degree that can split ``model`` (divisors of num_heads)."""
    return [t for t in range(1, model.num_heads + 1) if _tp_problem(model, t) is None]


def tp_shard(model: ModelConfig, tp: int) -> TPShard:
    """Per-rank sizes for ``tp``; a bad ``tp`` raises naming the dimension and the valid tps."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ModelError(f"tp must be a positive integer, got {tp!r}")
    problem = _tp_problem(model, tp)
    if problem:
        valid = ", ".join(str(t) for t in valid_tp_degrees(model))
        raise ModelError(f"{problem} of {model.id}; valid tp: {valid}")
    return TPShard(
        tp=tp,
        heads=model.num_heads // tp,
        kv_heads=max(1, model.num_kv_heads // tp),
        kv_replicas=max(1, tp // model.num_kv_heads),
        ffn=model.ffn_hidden_size // tp,
        expert_ffn=model.expert_ffn_hidden_size // tp,
        vocab=-(-model.vocab_size // tp),
    )


def params_per_tp_rank(model: ModelConfig, tp: int) -> dict[str, int]:
    """Parameters one tensor-parallel rank holds: ``layer`` (one layer), ``embedding``,
    ``final_norm`` and ``lm_head`` (0 when tied).

    Column-parallel weights and biases are split, row-parallel weights split and their
    biases replicated, norms and the MoE router replicated, replicated KV heads counted on
    every rank that holds them, the vocabulary padded to ``tp * ceil(vocab / tp)``.
    """
    sh = tp_shard(model, tp)
    h, d = model.hidden_size, model.head_dim
    qkv_out = (sh.heads + 2 * sh.kv_heads) * d
    attn = h * qkv_out + sh.heads * d * h
    attn += qkv_out if model.qkv_bias else 0
    attn += h if model.out_proj_bias else 0
    gated = model.activation == "swiglu"
    f = sh.expert_ffn
    expert = (3 if gated else 2) * h * f
    if model.mlp_bias:
        expert += (2 * f if gated else f) + h
    mlp = model.num_experts * expert + model.router_params
    pos = model.max_seq_len * h if model.position == "learned" else 0
    return {
        "layer": attn + mlp + 2 * model.norm_params,
        "embedding": sh.vocab * h + pos,
        "final_norm": model.norm_params,
        "lm_head": 0 if model.tie_embeddings else sh.vocab * h,
    }


# --- the step machinery ------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    """One forward step: a compute op, or the enter/exit of a tensor-parallel region."""

    name: str
    op: Op | None = None
    count: int = 1
    region: Literal["enter", "exit"] | None = None
    regather: bool = False  # column-parallel GEMM whose input is sequence-sharded under SP


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
    def norm_tokens(self) -> int:
        """Tokens each rank normalises: all of them, or its sequence shard under SP."""
        return self.tokens // self.tp if self.sp else self.tokens

    @property
    def act_bytes(self) -> int:
        """The full ``tokens x hidden`` activation a TP collective moves."""
        return self.tokens * self.model.hidden_size * DTYPE_BYTES[self.dtype]

    def gemm(self, m: int, k: int, n: int) -> Op:
        return Op(op=OpKind.gemm, dtype=self.dtype, m=m, k=k, n=n)

    def ew(self, kind: OpKind, m: int, n: int) -> Op:
        return Op(op=kind, dtype=self.dtype, m=m, n=n)

    def collective(self, kind: OpKind, nbytes: int) -> Op:
        return Op(op=kind, dtype=self.dtype, bytes=nbytes, ranks=self.tp)


def _positive_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelError(f"{what} must be a positive integer, got {value!r}")
    return value


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
    _positive_int(batch, "batch")
    _positive_int(seq_len, seq_name)
    shard = tp_shard(model, tp)
    try:
        dt = Dtype(dtype)
    except ValueError:
        allowed = ", ".join(d.value for d in Dtype)
        raise ModelError(f"unknown dtype {dtype!r}; allowed: {allowed}") from None
    if attn_backend and attn_backend not in BACKENDS[attn_kind]:
        raise ModelError(
            f"unknown attention backend {attn_backend!r} for {attn_kind.value}; "
            f"allowed: {', '.join(BACKENDS[attn_kind])}"
        )
    if sequence_parallel and tp > 1 and seq_len % tp:
        raise ModelError(
            f"sequence parallelism needs seq_len divisible by tp; got seq_len={seq_len}, tp={tp}"
        )
    return _Ctx(model, batch, seq_len, shard, sequence_parallel, dt)


def _norm_kind(model: ModelConfig) -> OpKind:
    return OpKind.rmsnorm if model.norm == "rmsnorm" else OpKind.layernorm


def _moe_split(tokens: int, model: ModelConfig) -> tuple[int, int]:
    """(active experts, tokens per active expert) under perfectly balanced routing.

    ``tokens * top_k`` assignments spread evenly over ``min(num_experts, tokens * top_k)``
    experts; the per-expert row count is rounded up so every expert GEMM has integer rows.
    """
    assignments = tokens * model.experts_per_token
    active = min(model.num_experts, assignments)
    return active, -(-assignments // active)


def _layer_steps(ctx: _Ctx, tokens: int, attn: Op) -> list[_Step]:
    """Forward steps of one transformer layer over ``tokens`` tokens on one rank."""
    m, sh = ctx.model, ctx.shard
    h, d = m.hidden_size, m.head_dim
    nt = tokens // ctx.tp if ctx.sp else tokens
    norm = _norm_kind(m)
    steps = [
        _Step(f"{m.norm}_1", ctx.ew(norm, nt, h)),
        _Step("attn", region="enter"),
        _Step("qkv_proj", ctx.gemm(tokens, h, (sh.heads + 2 * sh.kv_heads) * d), regather=True),
    ]
    if m.position == "rope":
        steps.append(_Step("rope", ctx.ew(OpKind.rope, tokens, (sh.heads + sh.kv_heads) * d)))
    steps += [
        _Step("attn", attn),
        _Step("o_proj", ctx.gemm(tokens, sh.heads * d, h)),
        _Step("attn", region="exit"),
        _Step("residual_1", ctx.ew(OpKind.residual_add, nt, h)),
        _Step(f"{m.norm}_2", ctx.ew(norm, nt, h)),
        _Step("mlp", region="enter"),
    ]
    gated = m.activation == "swiglu"
    act_kind = OpKind.swiglu if gated else OpKind.gelu
    up_width = 2 if gated else 1  # gate and up fused into one column-parallel GEMM
    if not m.is_moe:
        steps += [
            _Step("mlp_up", ctx.gemm(tokens, h, up_width * sh.ffn), regather=True),
            _Step(m.activation, ctx.ew(act_kind, tokens, sh.ffn)),
            _Step("mlp_down", ctx.gemm(tokens, sh.ffn, h)),
        ]
    else:
        active, rows = _moe_split(tokens, m)
        routed_bytes = tokens * m.experts_per_token * h * DTYPE_BYTES[ctx.dtype]
        f = sh.expert_ffn
        steps += [
            _Step("router", ctx.gemm(tokens, h, m.num_experts), regather=True),
            _Step("router_softmax", ctx.ew(OpKind.softmax, tokens, m.num_experts)),
            _Step("moe_permute", Op(op=OpKind.copy, dtype=ctx.dtype, bytes=routed_bytes)),
            _Step("expert_up", ctx.gemm(rows, h, up_width * f), count=active),
            _Step(f"expert_{m.activation}", ctx.ew(act_kind, rows, f), count=active),
            _Step("expert_down", ctx.gemm(rows, f, h), count=active),
            _Step("moe_unpermute", Op(op=OpKind.copy, dtype=ctx.dtype, bytes=routed_bytes)),
        ]
    steps += [
        _Step("mlp", region="exit"),
        _Step("residual_2", ctx.ew(OpKind.residual_add, nt, h)),
    ]
    return steps


def _region_collective(ctx: _Ctx, step: _Step, backward: bool, nbytes: int) -> list[LayerOp]:
    """The collective of a region boundary (Megatron's f/g operators), or nothing."""
    if ctx.tp == 1:
        return []
    suffix = "_bwd" if backward else ""
    enter = step.region == "enter"
    if ctx.sp:
        # enter: all-gather fwd / reduce-scatter bwd; exit: reduce-scatter fwd / all-gather bwd
        gather = enter != backward
        kind = OpKind.all_gather if gather else OpKind.reduce_scatter
        label = "allgather" if gather else "reducescatter"
    else:
        # enter: nothing fwd / all-reduce bwd; exit: all-reduce fwd / nothing bwd
        if enter != backward:
            return []
        kind, label = OpKind.all_reduce, "allreduce"
    return [LayerOp(f"tp_{label}_{step.name}{suffix}", ctx.collective(kind, nbytes))]


def _forward(ctx: _Ctx, steps: list[_Step], nbytes: int) -> list[LayerOp]:
    out: list[LayerOp] = []
    for step in steps:
        if step.region:
            out += _region_collective(ctx, step, backward=False, nbytes=nbytes)
        else:
            assert step.op is not None
            out.append(LayerOp(step.name, step.op, step.count))
    return out


def _backward_op(op: Op) -> Op:
    """The forward op's backward counterpart for elementwise/copy kinds (see the ratios)."""
    num, den = BACKWARD_TRAFFIC_RATIO[op.op]
    if op.op == OpKind.copy:
        assert op.bytes is not None
        return op.model_copy(update={"bytes": -(-op.bytes * num // den)})
    assert op.m is not None
    return op.model_copy(update={"m": -(-op.m * num // den)})


def _backward(ctx: _Ctx, steps: list[_Step], nbytes: int) -> list[LayerOp]:
    out: list[LayerOp] = []
    for step in reversed(steps):
        if step.region:
            out += _region_collective(ctx, step, backward=True, nbytes=nbytes)
            continue
        op = step.op
        assert op is not None
        if op.op == OpKind.gemm:
            m, k, n = op.m, op.k, op.n
            assert m is not None and k is not None and n is not None
            # dgrad: dX[m,k] = dY[m,n] . W^T[n,k]; wgrad: dW[k,n] = X^T[k,m] . dY[m,n]
            out.append(LayerOp(f"{step.name}_dgrad", ctx.gemm(m, n, k), step.count))
            if step.regather and ctx.sp:
                gather = ctx.collective(OpKind.all_gather, nbytes)
                out.append(LayerOp(f"tp_allgather_{step.name}_input", gather))
            out.append(LayerOp(f"{step.name}_wgrad", ctx.gemm(k, m, n), step.count))
        elif op.op == OpKind.attn_fwd:
            out.append(LayerOp("attn_bwd", op.model_copy(update={"op": OpKind.attn_bwd})))
        elif op.op in ELEMENTWISE_KINDS:
            out.append(LayerOp(f"{step.name}_bwd", _backward_op(op), step.count))
        else:  # pragma: no cover - every forward step kind is handled above
            raise AssertionError(f"no backward for {op.op}")
    return out


def _attn_fwd(ctx: _Ctx, causal: bool, attn_backend: str) -> Op:
    m, sh = ctx.model, ctx.shard
    return Op(
        op=OpKind.attn_fwd,
        dtype=ctx.dtype,
        batch=ctx.batch,
        seq_q=ctx.seq_len,
        seq_kv=ctx.seq_len,
        heads_q=sh.heads,
        heads_kv=sh.kv_heads,
        head_dim=m.head_dim,
        causal=causal,
        backend=attn_backend or None,
    )


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
    steps = _layer_steps(ctx, ctx.tokens, _attn_fwd(ctx, causal, attn_backend))
    return _forward(ctx, steps, ctx.act_bytes)


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
    """Backward ops of one layer, in execution order (the forward reversed).

    Each GEMM becomes a dgrad and a wgrad GEMM (together twice its FLOPs), attention an
    ``attn_bwd``, elementwise ops the same kind scaled by :data:`BACKWARD_TRAFFIC_RATIO`,
    and the TP collectives their conjugates (see the module docstring). Recomputation is
    the simulator's business: prepend ``layer_forward_ops`` where it applies.
    """
    ctx = _make_ctx(model, batch, seq_len, tp, sequence_parallel, dtype, attn_backend)
    steps = _layer_steps(ctx, ctx.tokens, _attn_fwd(ctx, causal, attn_backend))
    return _backward(ctx, steps, ctx.act_bytes)


def _stage_steps(
    ctx: _Ctx, stage: Stage, lm_rows: int | None = None
) -> tuple[list[_Step], list[_Step]]:
    """Non-layer forward steps: (before the layers, after the layers)."""
    m, sh = ctx.model, ctx.shard
    h, t = m.hidden_size, ctx.tokens
    first: list[_Step] = []
    last: list[_Step] = []
    if stage in ("all", "first"):
        # Megatron's VocabParallelEmbedding: each rank gathers the rows of its vocab shard
        # (zeros elsewhere), then the exit collective sums the partial embeddings.
        first.append(_Step("embedding", ctx.ew(OpKind.embedding, t, h)))
        if m.position == "learned":
            first.append(_Step("pos_embedding", ctx.ew(OpKind.embedding, t, h)))
        first.append(_Step("embedding", region="exit"))
    if stage in ("all", "last"):
        rows = t if lm_rows is None else lm_rows
        last += [
            _Step(f"final_{m.norm}", ctx.ew(_norm_kind(m), ctx.norm_tokens, h)),
            _Step("lm_head", region="enter"),
            _Step("lm_head", ctx.gemm(rows, h, sh.vocab), regather=True),
        ]
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
        last.append(
            _Step("cross_entropy", ctx.ew(OpKind.cross_entropy, ctx.tokens, ctx.shard.vocab))
        )
    if phase == "forward":
        out = _forward(ctx, first, ctx.act_bytes) + _forward(ctx, last, ctx.act_bytes)
        if last and ctx.tp > 1:
            ce = Op(op=OpKind.all_reduce, dtype=Dtype.fp32, bytes=ctx.tokens * 4, ranks=ctx.tp)
            out.append(LayerOp("tp_allreduce_cross_entropy", ce, count=3))
        return out
    return _backward(ctx, last, ctx.act_bytes) + _backward(ctx, first, ctx.act_bytes)


def optimizer_ops(
    model: ModelConfig, num_params_per_rank: int, dtype: Dtype | str = "fp32"
) -> list[LayerOp]:
    """One AdamW step over the parameters this rank updates (``dtype``: the master
    weights' dtype, fp32 under mixed precision)."""
    _positive_int(num_params_per_rank, "num_params_per_rank")
    return [
        LayerOp("optimizer_adamw", Op(op=OpKind.adamw, dtype=Dtype(dtype), n=num_params_per_rank))
    ]


def _serving_ops(ctx: _Ctx, tokens: int, attn: Op) -> list[LayerOp]:
    """Whole-model forward for serving: layers ``num_layers`` times, logits only for the
    last token of each sequence, gathered to one rank (vLLM's logits processor)."""
    m = ctx.model
    first, last = _stage_steps(ctx, "all", lm_rows=ctx.batch)
    nbytes = tokens * m.hidden_size * DTYPE_BYTES[ctx.dtype]
    layer = [
        LayerOp(o.name, o.op, o.count * m.num_layers)
        for o in _forward(ctx, _layer_steps(ctx, tokens, attn), nbytes)
    ]
    out = _forward(ctx, first, nbytes) + layer + _forward(ctx, last, nbytes)
    if ctx.tp > 1:
        logits = ctx.batch * ctx.shard.vocab * ctx.tp * DTYPE_BYTES[ctx.dtype]
        out.append(LayerOp("tp_allgather_logits", ctx.collective(OpKind.all_gather, logits)))
    return out


def prefill_ops(
    model: ModelConfig,
    batch: int,
    prompt_len: int,
    tp: int = 1,
    dtype: Dtype | str = "bf16",
    attn_backend: str = "",
) -> list[LayerOp]:
    """A prefill step: the whole model's forward over ``batch`` prompts of ``prompt_len``
    tokens (layer ops carry ``count = num_layers``); the LM head runs on the last token of
    each prompt only. No sequence parallelism (serving engines run plain TP)."""
    ctx = _make_ctx(model, batch, prompt_len, tp, False, dtype, attn_backend, seq_name="prompt_len")
    return _serving_ops(ctx, ctx.tokens, _attn_fwd(ctx, True, attn_backend))


def decode_step_ops(
    model: ModelConfig,
    batch: int,
    context_len: int,
    tp: int = 1,
    dtype: Dtype | str = "bf16",
    attn_backend: str = "",
) -> list[LayerOp]:
    """One decode step: ``batch`` sequences each add one token attending over a KV cache
    of ``context_len`` tokens (the new one included). GEMMs have ``m = batch``; layer ops
    carry ``count = num_layers``."""
    ctx = _make_ctx(
        model, batch, context_len, tp, False, dtype, attn_backend, OpKind.attn_decode, "context_len"
    )
    attn = Op(
        op=OpKind.attn_decode,
        dtype=ctx.dtype,
        batch=batch,
        seq_q=1,
        seq_kv=context_len,
        heads_q=ctx.shard.heads,
        heads_kv=ctx.shard.kv_heads,
        head_dim=model.head_dim,
        backend=attn_backend or None,
    )
    # tokens = batch for every GEMM and elementwise op; the embedding gathers `batch` rows.
    decode_ctx = _Ctx(model, batch, 1, ctx.shard, False, ctx.dtype)
    return _serving_ops(decode_ctx, batch, attn)


def total_count(layer_ops: list[LayerOp], name: str) -> int:
    """How many instances of ops called ``name`` a list holds (for tests and reports)."""
    return sum(o.count for o in layer_ops if o.name == name)
