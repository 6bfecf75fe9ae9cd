"""Step costs of sparse attention patterns: what a pattern's attention costs per layer,
per decode step and inside a training micro-batch or a serving iteration.

- :class:`SparsityPricer` prices a pattern (a :mod:`workloads.sparsity` pattern) on one
  GPU: dense attention on the caller's resolved dense cost model (exactly as the training
  and serving step models price it), sparse patterns on the block-sparse kernel model of
  :mod:`costmodels.ops.sparse_attention` from their exact tile tables, NSA on the faster
  of the NSA and FSA kernels; hybrid patterns layer by layer; the slowest TP rank when
  heads differ; decode reads and KV-cache bytes.
- :func:`sparse_step_costs`: a training micro-batch's :class:`StepCosts` with the layers'
  attention (forward, backward, recompute, the CP communication it hides) scaled by the
  pattern's time over dense at the plan's shape.
- :func:`sparse_step_model_ms` and :class:`PatternStepModel`: a serving iteration with the
  pattern's attention (prefill by the forward ratio, decode by the decode-read ratio,
  capped at 1: an engine runs dense attention where the pattern's kernel would be slower;
  ratios on a log-spaced length grid, interpolated in log length). KV capacity is
  unchanged: the block manager still holds every token (true for NSA, conservative for
  windows and S2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from costmodels.ops import sparse_attention as sa
from costmodels.steps.dsa_indexer import indexer_cost
from costmodels.steps.hf_attention import hf_attention_scale
from costmodels.steps.kv_layout import KvLayout
from costmodels.steps.serving import StepModel
from costmodels.steps.training import Phase, StepCosts, cp_comm_s, recompute_phase, step_costs
from hardware_specs.registry import builtin_catalog
from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose import tp_shard
from workloads.decompose.mla import indexer_cache_bytes
from workloads.decompose.training import sinks_attention_ops, sinks_traffic_factors
from workloads.models import ModelConfig
from workloads.ops import Op, OpKind, ops_frame
from workloads.plan import TrainPlan
from workloads.sparsity import (
    ChunkPattern,
    DensePattern,
    HybridPattern,
    NSAPattern,
    Pattern,
    S2Pattern,
    WindowPattern,
    parse_pattern,
)

FLASH = "flash"


class SparseStepError(ValueError):
    """A bad sparse-step input; the message is one line."""


def positive(value: object, name: str) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
        raise SparseStepError(f"{name}={value!r} is invalid; allowed: an integer >= 1")
    return int(value)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class AttentionTimes:
    """One pattern's attention on one TP rank, mean per layer (seconds)."""

    fwd_s: float
    bwd_s: float
    kernel: str
    reason: str = ""
    tile_density: float = 0.0
    dense_layers: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class AttentionShape:
    """Attention shape of one TP rank."""

    heads: int  # query heads of the model
    heads_q: int  # per rank
    heads_kv: int  # per rank
    head_dim: int
    tp: int
    layers: int
    num_kv_heads: int

    @classmethod
    def of(cls, model: ModelConfig, tp: int) -> AttentionShape:
        sh = tp_shard(model, tp)
        return cls(
            model.num_heads,
            sh.heads,
            sh.kv_heads,
            model.head_dim,
            tp,
            model.attention_layers,  # a hybrid's mixer layers have no attention
            model.num_kv_heads,
        )


def layer_mix(pattern: Pattern, num_layers: int) -> list[tuple[Pattern | None, int]]:
    """(pattern, layers) pairs; ``None`` is the dense baseline."""
    if isinstance(pattern, HybridPattern):
        n_dense = len(pattern.dense_layers(num_layers))
        inner = None if isinstance(pattern.inner, DensePattern) else pattern.inner
        mix = [(None, n_dense), (inner, num_layers - n_dense)]
    elif isinstance(pattern, DensePattern):
        mix = [(None, num_layers)]
    else:
        mix = [(pattern, num_layers)]
    return [(p, n) for p, n in mix if n > 0]


# --------------------------------------------------------------------------- pricing


@dataclass
class SparsityPricer:
    """Prices patterns on one GPU, caching what repeats across rows of a sweep (dense ops,
    pattern times, step models, step costs). ``dtype``: attention and KV element type.
    ``cost_models(num_gpus)``: the resolved dense cost model of that many GPUs of this
    type (``simcli.scenario`` resolves them; the pricer resolves nothing itself)."""

    gpu: str
    dtype: str = "bf16"
    seed: int = 0
    cost_models: Callable[[int], Any] = field(kw_only=True, repr=False)
    _cms: dict[int, Any] = field(default_factory=dict, repr=False)
    _attn: dict[tuple, AttentionTimes] = field(default_factory=dict, repr=False)
    _dense: dict[tuple, float] = field(default_factory=dict, repr=False)
    _steps: dict[tuple, StepModel] = field(default_factory=dict, repr=False)
    _costs: dict[tuple, StepCosts] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        builtin_catalog().gpu(self.gpu)  # one-line error naming the known GPUs
        if self.dtype not in ("bf16", "fp16"):
            raise SparseStepError(f"dtype {self.dtype!r} is not supported; allowed: bf16, fp16")

    def cost_model(self, num_gpus: int = 1) -> Any:
        if num_gpus not in self._cms:
            self._cms[num_gpus] = self.cost_models(num_gpus)
        return self._cms[num_gpus]

    # ---- dense (the simulators' attention)

    def _dense_ops(self, sh: AttentionShape, kind: str, batch: int, seq_q: int, seq_kv: int) -> Op:
        return Op(
            op=OpKind(kind),
            dtype=Dtype(self.dtype),
            batch=batch,
            seq_q=seq_q,
            seq_kv=seq_kv,
            heads_q=sh.heads_q,
            heads_kv=sh.heads_kv,
            head_dim=sh.head_dim,
            causal=kind != "attn_decode",
        )

    def dense_s(self, sh: AttentionShape, kind: str, batch: int, seq_q: int, seq_kv: int) -> float:
        """Seconds of one dense attention op on one rank (cached)."""
        return self.dense_many(sh, [(kind, batch, seq_q, seq_kv)])[0]

    def dense_many(
        self, sh: AttentionShape, items: Sequence[tuple[str, int, int, int]]
    ) -> list[float]:
        """Several dense ops in one ``predict_many`` (``(kind, batch, seq_q, seq_kv)``)."""
        keys = [(sh, *it) for it in items]
        todo = list(dict.fromkeys(k for k in keys if k not in self._dense))
        if todo:
            ops = [self._dense_ops(sh, *k[1:]) for k in todo]
            times = self.cost_model(sh.tp).predict_many(ops_frame(ops))
            self._dense.update(zip(todo, (float(t) for t in times), strict=True))
        return [self._dense[k] for k in keys]

    # ---- sparse kernels

    def _kw(self, sh: AttentionShape, batch: int, heads_q: int | None = None) -> dict[str, Any]:
        return dict(
            gpu=self.gpu,
            batch=batch,
            head_dim=sh.head_dim,
            dtype=self.dtype,
            heads_q=heads_q or sh.heads_q,
            heads_kv=sh.heads_kv,
        )

    def _nsa(self, p: NSAPattern, sh: AttentionShape, seq: int, batch: int) -> AttentionTimes:
        kw = self._kw(sh, batch)
        nt = sa.nsa_attention_time(
            seq_len=seq,
            heads_q=sh.heads_q,
            heads_kv=sh.heads_kv,
            head_dim=sh.head_dim,
            pattern=p,
            batch=batch,
            dtype=self.dtype,
            gpu=self.gpu,
        )
        table = p.tiles(seq, sh.heads_q, seed=self.seed)
        br = table.branches
        sel = sa.block_sparse_time(br["selected"], **kw)
        comp_b = sa.block_sparse_time(br["compressed"], **kw).bwd_s
        win_b = sa.block_sparse_time(br["window"], **kw).bwd_s
        scale = nt.selected.time_s / sel.fwd_s if sel.fwd_s > 0 else 1.0
        return AttentionTimes(
            fwd_s=nt.total_s,
            bwd_s=comp_b + win_b + sel.bwd_s * scale,
            kernel=nt.selected.choice,
            reason=nt.selected.reason,
            tile_density=table.density,
        )

    def _blocksparse(self, p: Pattern, sh: AttentionShape, seq: int, batch: int) -> AttentionTimes:
        """Every leaf of the pattern on the block-sparse model, the slowest TP rank."""
        table = p.tiles(seq, sh.heads, seed=self.seed)
        leaves = table.leaves()
        hr = sh.heads_q
        ranks: dict[bytes, tuple[float, float]] = {}
        worst_f = worst_b = 0.0
        for r in range(sh.tp):
            sl = slice(r * hr, (r + 1) * hr)
            part = {
                n: replace(lf, full=lf.full[sl], partial=lf.partial[sl]) for n, lf in leaves.items()
            }
            sig = b"".join(lf.full.tobytes() + lf.partial.tobytes() for lf in part.values())
            if sig not in ranks:
                f = b = 0.0
                for lf in part.values():
                    kw = self._kw(sh, batch, hr)
                    if lf.kind == "estimate":
                        f += lf.share * sa.estimate_pass_time(lf, bits=lf.bits, **kw)
                    else:
                        res = sa.block_sparse_time(lf, **kw)
                        f += lf.share * res.fwd_s
                        b += lf.share * res.bwd_s
                ranks[sig] = (f, b)
            f, b = ranks[sig]
            worst_f, worst_b = max(worst_f, f), max(worst_b, b)
        params = sa.kernel_params(self.gpu)
        kinds = {lf.kind for lf in leaves.values()}
        kernel = "flex+estimate" if "estimate" in kinds else "flex"
        notes = (f"slowest of {sh.tp} TP ranks (heads differ)",) if len(ranks) > 1 else ()
        source = params.source.split(":")[0]
        reason = f"block-sparse (FlexAttention) model, {source}"
        return AttentionTimes(worst_f, worst_b, kernel, reason, table.density, notes=notes)

    def attention(
        self, pattern: Pattern, model: ModelConfig, seq_len: int, *, tp: int = 1, batch: int = 1
    ) -> AttentionTimes:
        """Forward and backward attention of ``pattern``: mean per layer, one TP rank,
        ``batch`` sequences of ``seq_len`` tokens (cached)."""
        sh = AttentionShape.of(model, tp)
        key = (pattern.spec, sh, seq_len, batch)
        if key in self._attn:
            return self._attn[key]
        f_d, b_d = self.dense_many(
            sh, [("attn_fwd", batch, seq_len, seq_len), ("attn_bwd", batch, seq_len, seq_len)]
        )
        label = getattr(self.cost_model(tp), "label", "")
        dense = AttentionTimes(f_d, b_d, FLASH, f"dense attention cost model ({label})")
        parts: list[tuple[AttentionTimes, int]] = []
        notes: list[str] = []
        n_dense = 0
        for p, n in layer_mix(pattern, sh.layers):
            span = local_span(p)
            if span is not None and span >= seq_len:
                notes.append(f"{p.kind} {span} >= seq_len {seq_len}: priced as dense")
                p = None
            if p is None:
                parts.append((dense, n))
                n_dense += n
            elif isinstance(p, NSAPattern):
                parts.append((self._nsa(p, sh, seq_len, batch), n))
            else:
                parts.append((self._blocksparse(p, sh, seq_len, batch), n))
        L = sh.layers
        sparse = [a for a, _ in parts if a is not dense] or [dense]
        dense_density = 0.0
        if n_dense:  # causal tiles of the dense layers, for the density column
            dense_density = parse_pattern("causal").tiles(seq_len, 1).density
        out = AttentionTimes(
            fwd_s=sum(a.fwd_s * n for a, n in parts) / L,
            bwd_s=sum(a.bwd_s * n for a, n in parts) / L,
            kernel="+".join(dict.fromkeys(a.kernel for a, _ in parts)),
            reason=sparse[0].reason,
            tile_density=sum(
                (dense_density if a is dense else a.tile_density) * n for a, n in parts
            )
            / L,
            dense_layers=n_dense,
            notes=tuple(notes) + tuple(x for a in sparse for x in a.notes),
        )
        self._attn[key] = out
        return out

    # ---- decode

    def _decode_reads(
        self, pattern: Pattern, sh: AttentionShape, context: int
    ) -> list[tuple[list, int]]:
        """Per layer group: the decode reads (tokens per KV head, one launch each)."""
        out = []
        for p, n in layer_mix(pattern, sh.layers):
            if p is None:
                reads = [context]
            elif isinstance(p, NSAPattern):
                comp = p.num_compressed(context)
                win = min(p.w, context)
                sel = p.decode_read_tokens(context) - comp - win
                reads = [r for r in (comp, sel, win) if r > 0]
            else:
                reads = [p.decode_read_tokens(context)]
            out.append((reads, n))
        return out

    def decode(
        self, pattern: Pattern, model: ModelConfig, context_len: int, *, tp: int = 1, batch: int = 1
    ) -> dict[str, float]:
        """One layer's decode attention (mean over layers, one TP rank) and the tokens it
        reads and keeps per KV head (layer means)."""
        sh = AttentionShape.of(model, tp)
        groups = self._decode_reads(pattern, sh, context_len)
        items = [("attn_decode", batch, 1, r) for reads, _ in groups for r in reads]
        times = iter(self.dense_many(sh, items))
        total = read = 0.0
        for reads, n in groups:
            total += n * sum(next(times) for _ in reads)
            read += n * sum(reads)
        kept = sum(
            n * (context_len if p is None else p.kv_cache_tokens(context_len))
            for p, n in layer_mix(pattern, sh.layers)
        )
        return {
            "decode_attn_s": total / sh.layers,
            "decode_read_tokens": read / sh.layers,
            "kv_cache_tokens": kept / sh.layers,
        }

    def kv_cache_bytes(
        self, pattern: Pattern, model: ModelConfig, context_len: int, *, tp: int = 1, batch: int = 1
    ) -> tuple[float, float]:
        """(whole model, one TP rank) KV bytes of ``batch`` sequences at ``context_len``."""
        sh = AttentionShape.of(model, tp)
        kept = sum(
            n * (context_len if p is None else p.kv_cache_tokens(context_len))
            for p, n in layer_mix(pattern, sh.layers)
        )
        per_head = kept * sh.head_dim * 2 * DTYPE_BYTES[Dtype(self.dtype)] * batch
        return float(per_head * sh.num_kv_heads), float(per_head * sh.heads_kv)

    # ---- simulators

    def step_model(self, model: ModelConfig, tp: int) -> StepModel:
        key = (model.model_dump_json(), tp)
        if key not in self._steps:
            cm = self.cost_model(tp)
            self._steps[key] = StepModel(model, self.gpu, tp=tp, dtype=self.dtype, cost_model=cm)
        return self._steps[key]

    def step_costs(self, model: ModelConfig, plan: TrainPlan) -> StepCosts:
        key = (model.model_dump_json(), plan.model_dump_json())
        if key not in self._costs:
            cm = self.cost_model(plan.num_gpus)
            self._costs[key] = step_costs(model, plan, cm, cm.system)
        return self._costs[key]


def time_ratio(new: float, old: float) -> float:
    return new / old if old > 0 else 1.0


def sparse_step_costs(
    model: ModelConfig,
    plan: TrainPlan,
    pattern: str | Pattern,
    gpu: str,
    *,
    base: StepCosts | None = None,
    pricer: SparsityPricer,
) -> StepCosts:
    """:func:`costmodels.steps.training.step_costs` of ``plan`` with the layers' attention
    replaced by ``pattern``'s: the forward ``attn`` and backward ``attn_bwd`` entries (and
    the layer's ``compute_s``, the recompute phase and, under context parallelism, the
    exposed ring communication that attention hides) scaled by the pattern's time over
    dense attention at the plan's shape (micro-batch, full sequence, heads / tp). Memory,
    parameters and model FLOPs are unchanged. For ``simcli train --attn-pattern``."""
    p = pattern if isinstance(pattern, Pattern) else parse_pattern(pattern)
    pr = pricer
    c = base if base is not None else pr.step_costs(model, plan)
    a = pr.attention(p, model, plan.seq_len, tp=plan.tp, batch=plan.micro_batch)
    sh = AttentionShape.of(model, plan.tp)
    f_d = pr.dense_s(sh, "attn_fwd", plan.micro_batch, plan.seq_len, plan.seq_len)
    b_d = pr.dense_s(sh, "attn_bwd", plan.micro_batch, plan.seq_len, plan.seq_len)
    if "attn" not in c.layer_fwd.by_op_s or "attn_bwd" not in c.layer_bwd.by_op_s:
        raise SparseStepError(
            "these step costs have no fused attention op to replace; allowed: framework "
            "megatron or pytorch"
        )

    out = scale_attention(c, plan, time_ratio(a.fwd_s, f_d), time_ratio(a.bwd_s, b_d))
    if plan.cp > 1:
        cm = pr.cost_model(plan.num_gpus)
        cp_f, cp_b = cp_comm_s(model, plan, cm, cm.system, out.layer_fwd, out.layer_bwd)
        lf, lb = replace(out.layer_fwd, cp_comm_s=cp_f), replace(out.layer_bwd, cp_comm_s=cp_b)
        out = replace(out, layer_fwd=lf, layer_bwd=lb, layer_recompute=recompute_phase(plan, lf))
    return out


def scale_attention(c: StepCosts, plan: TrainPlan, fwd: float, bwd: float) -> StepCosts:
    """``c`` with every layer's forward ``attn`` and backward ``attn_bwd`` op times
    ``fwd`` and ``bwd`` (and the recompute phase that follows the forward)."""

    def swap(ph: Phase, name: str, scale: float) -> Phase:
        old = ph.by_op_s[name]
        new = old * scale
        by_op = dict(ph.by_op_s) | {name: new}
        return replace(ph, compute_s=ph.compute_s - old + new, by_op_s=by_op)

    lf = swap(c.layer_fwd, "attn", fwd)
    lb = swap(c.layer_bwd, "attn_bwd", bwd)
    return replace(c, layer_fwd=lf, layer_bwd=lb, layer_recompute=recompute_phase(plan, lf))


def sparse_step_model_ms(
    model: ModelConfig | str,
    gpu: str,
    pattern: str | Pattern,
    *,
    phase: str,
    length: int,
    batch: int = 1,
    tp: int = 1,
    pricer: SparsityPricer,
) -> dict[str, Any]:
    """One serving step with ``pattern``'s attention: ``phase`` ``prefill`` (``batch``
    prompts of ``length`` tokens) or ``decode`` (``batch`` sequences at a context of
    ``length`` tokens). The StepModel's attention is scaled by the pattern's time over
    dense at that shape. Returns ``step_ms``, ``dense_step_ms``, ``attn_ms`` (all layers)
    and ``breakdown_ms``. For ``simcli serve``/``step --attn-pattern``."""
    from workloads.models import load_model

    cfg = model if isinstance(model, ModelConfig) else load_model(model)
    p = pattern if isinstance(pattern, Pattern) else parse_pattern(pattern)
    pr = pricer
    positive(length, "length")
    positive(batch, "batch")
    sm = pr.step_model(cfg, tp)
    none = np.zeros(0, np.int64)
    sh = AttentionShape.of(cfg, tp)
    if phase == "prefill":
        bd = sm.breakdown(np.full(batch, length), np.zeros(batch, np.int64), none)
        new = pr.attention(p, cfg, length, tp=tp, batch=batch).fwd_s
        old = pr.dense_s(sh, "attn_fwd", batch, length, length)
    elif phase == "decode":
        # StepModel's decode_ctx counts cached tokens; the new token makes `length` keys
        bd = sm.breakdown(none, none, np.full(batch, max(length - 1, 0)))
        new = pr.decode(p, cfg, length, tp=tp, batch=batch)["decode_attn_s"]
        old = pr.decode(DensePattern(), cfg, length, tp=tp, batch=batch)["decode_attn_s"]
    else:
        raise SparseStepError(f"unknown phase {phase!r}; allowed: prefill, decode")
    dense_s = sum(bd.values())
    attn = bd.get("attn", 0.0) * time_ratio(new, old)
    out = dict(bd) | {"attn": attn}
    return {
        "step_ms": 1e3 * sum(out.values()),
        "dense_step_ms": 1e3 * dense_s,
        "attn_ms": 1e3 * attn,
        "breakdown_ms": {k: 1e3 * v for k, v in out.items()},
    }


# --------------------------------------------------------------------------- serving

GRID_POINTS = 12
MIN_LEN = 256


# --------------------------------------------------------------------------- serving KV


def local_span(p: Pattern | None) -> int | None:
    """Keys a local layer attends at most: a window's, or a chunk's (None otherwise)."""
    if isinstance(p, WindowPattern):
        return p.window
    if isinstance(p, ChunkPattern):
        return p.chunk
    return None


def _window_layout(
    p: WindowPattern | ChunkPattern, dense_layers: int, sparse_layers: int
) -> KvLayout:
    g = math.gcd(dense_layers, sparse_layers) or 1
    if isinstance(p, ChunkPattern):  # the current chunk: at most `chunk` tokens
        span, sinks = p.chunk, 0
        what = f"{sparse_layers} chunked-attention layers free the blocks of past chunks "
        what += f"({p.chunk} tokens each)"
    else:
        span, sinks = p.window, p.sinks
        what = f"{sparse_layers} sliding-window layers free blocks older than the window "
        what += f"({p.window} tokens) and keep {p.sinks} sink tokens"
    return KvLayout(
        full_units=dense_layers // g,
        capped_units=sparse_layers // g,
        window_tokens=span,
        sink_tokens=sinks,
        note=what + (f"; {dense_layers} dense layers keep everything" if dense_layers else ""),
    )


def kv_layout(pattern: Pattern | None, num_layers: int) -> KvLayout:
    """The :class:`KvLayout` of ``pattern`` over ``num_layers`` layers.

    - window (StreamingLLM: window + sinks): capped; hybrid dense/window: only the window
      layers are capped.
    - NSA: nothing freed (the selection scores every block, NSA sec. 3.3.2), plus the
      compressed-key cache, ``(c - l) // d + 1 <= c / d`` tokens (NSA eq. 7): KV grows by
      ``1 / d`` on the NSA layers.
    - S2 (Lin et al. 2024): each query head keeps its local blocks and its own strided
      blocks (residue ``h mod stride``), but the query heads of a layer (and of a GQA
      group) together cover every residue, and a paged engine's block holds all KV heads
      of a layer (vLLM, SGLang: ``[block, kv_heads, head_dim]``), so no block can be freed;
      only per-head block tables would free ``1 - 1/stride`` of it: not modelled.
    - others (top-k, SALE, AdaSpa): the selection is dynamic, every block is kept.
    """
    if pattern is None or isinstance(pattern, DensePattern):
        return KvLayout()
    inner, dense = pattern, 0
    if isinstance(pattern, HybridPattern):
        inner, dense = pattern.inner, len(pattern.dense_layers(num_layers))
    sparse = num_layers - dense
    if isinstance(inner, WindowPattern | ChunkPattern) and sparse > 0:
        return _window_layout(inner, dense, sparse)
    if isinstance(inner, NSAPattern) and sparse > 0:
        extra = sparse / num_layers / inner.d
        return KvLayout(
            bytes_factor=1.0 + extra,
            note=(
                f"NSA keeps the whole context (selection scores every block) plus one "
                f"compressed token per {inner.d}: KV grows {extra:.1%}"
            ),
        )
    if isinstance(inner, S2Pattern):
        return KvLayout(
            note=(
                "S2: each head needs only its strided and local blocks, but the heads of a "
                "layer cover every block and a paged block holds all KV heads: nothing freed"
            )
        )
    return KvLayout(note=f"{inner.kind}: the selection is dynamic, every block is kept")


class PatternStepModel(StepModel):
    """:class:`StepModel` with ``pattern``'s attention in every layer (see the module).

    Its KV follows :func:`kv_layout`: ``kv_bytes_per_token`` (and so the KV capacity)
    include NSA's compressed keys, and ``kv_layout`` tells the serving simulator which
    layers free old blocks."""

    @property
    def kv_layout(self) -> KvLayout:
        # the base constructor may ask for KV sizes before the pattern is set
        lay = kv_layout(getattr(self, "pattern", None), self.model.attention_layers)
        state = self.state_tokens_per_seq  # 0 without mixers
        lay = replace(lay, state_tokens=state) if state else lay
        ix = indexer_cache_bytes(self.model)  # DSA: the indexer's fp8 keys beside the latent
        if ix:
            mla = self.model.kv_elements_per_token_per_layer * DTYPE_BYTES[
                Dtype(getattr(self, "kv_cache_dtype", "bf16"))
            ]
            lay = replace(lay, bytes_factor=lay.bytes_factor * (1.0 + ix / mla),
                          note=lay.note + f"; DSA's indexer keys add {ix} B per token per layer")
        return lay

    @property
    def kv_bytes_per_token(self) -> float:
        return super().kv_bytes_per_token * self.kv_layout.bytes_factor

    def kv_bytes_per_token_per_gpu(self, stage: int = 0) -> float:
        return super().kv_bytes_per_token_per_gpu(stage) * self.kv_layout.bytes_factor

    def __init__(
        self, *args: Any, pattern: str | Pattern, max_len: int = 131072, hf_masked: bool = False,
        **kw: Any,
    ) -> None:  # fmt: skip
        """``hf_masked``: the model's own local layers as transformers runs them eagerly
        (masked SDPA in prefill, :mod:`costmodels.steps.hf_attention`; decode reads the
        window its cache keeps)."""
        super().__init__(*args, **kw)
        self.pattern = pattern if isinstance(pattern, Pattern) else parse_pattern(pattern)
        gpu = args[1] if len(args) > 1 else kw["gpu_id"]
        # dense attention priced by this step model's own (resolved) cost model
        pricer = SparsityPricer(gpu, seed=0, cost_models=lambda _n: self.cost_model)
        lens = np.unique(
            np.geomspace(MIN_LEN, max(max_len, MIN_LEN * 2), GRID_POINTS).astype(int) // 128 * 128
        )
        pre, dec = [], []
        span = local_span(self.pattern)
        # transformers' eager attention with sinks (gpt-oss): seconds per prompt length
        self._sinks_eager = hf_masked and self.model.attention_sinks
        for n in lens.tolist():
            if self._sinks_eager:  # no SDPA: the s x s scores, priced whole (_attention)
                pre.append(self._sinks_prefill_s(n))
            elif hf_masked:
                pre.append(hf_attention_scale(self.model, n)[0])
            elif span is not None and span >= n:
                pre.append(1.0)  # the window (or chunk) covers the whole prompt
            else:
                a = pricer.attention(self.pattern, self.model, n, tp=self.tp, batch=1)
                dense = pricer.attention(parse_pattern("causal"), self.model, n, tp=self.tp)
                pre.append(a.fwd_s / dense.fwd_s if dense.fwd_s > 0 else 1.0)
            d = pricer.decode(self.pattern, self.model, n, tp=self.tp)["decode_attn_s"]
            d0 = pricer.decode(parse_pattern("causal"), self.model, n, tp=self.tp)
            dec.append(d / d0["decode_attn_s"] if d0["decode_attn_s"] > 0 else 1.0)
        self._log_lens = np.log(lens.astype(float))
        self._pre_ratio = np.array(pre) if hf_masked else np.minimum(np.array(pre), 1.0)
        self._dec_ratio = np.minimum(np.array(dec), 1.0)
        try:  # a GPU of a --hardware file, not in the built-in catalog: bf16
            fp8 = Dtype.fp8 in builtin_catalog().gpu(gpu).peak_dense_tflops
        except (KeyError, ValueError):
            fp8 = False
        self._indexer = indexer_cost(self.model, self.cost_model, fp8)  # DSA's scoring pass

    def _sinks_prefill_s(self, n: int) -> float:
        """transformers' eager attention with sinks over one prompt of ``n`` tokens
        (:func:`workloads.decompose.training.sinks_attention_ops`, forward)."""
        heads = self.model.num_heads // self.tp
        ops = sinks_attention_ops(heads, n, self.model.head_dim, Dtype(self.dtype),
                                  sinks_traffic_factors())[0]  # fmt: skip
        t = self.cost_model.predict_many(ops_frame([o.op for o in ops]))
        return float(sum(x * o.count for o, x in zip(ops, t, strict=True)))

    def _ratio(self, table: np.ndarray, length: float) -> float:
        return float(np.interp(np.log(max(length, 1.0)), self._log_lens, table))

    def _attention(
        self, pn: np.ndarray, pp: np.ndarray, n_dec: int, ctx_sum: int, exact: bool
    ) -> tuple[float | None, float | None, bool]:
        pre, dec, in_grid = super()._attention(pn, pp, n_dec, ctx_sum, exact)
        if pre is not None and self._sinks_eager:  # each prompt's own s x s scores
            lens = np.log(np.maximum((pn + pp).astype(float), 1.0))
            pre = float(np.exp(np.interp(lens, self._log_lens, np.log(self._pre_ratio))).sum())
            # measured kernels already: the eager steps' attention factor (fitted on SDPA
            # in traced steps, applied by _attn_layer_s) is taken out again
            pre /= self._attn_factors(True)[0] * self.model.num_layers / self.model.attention_layers
        elif pre is not None:
            pre *= self._ratio(self._pre_ratio, float((pn + pp).max()))
        if dec is not None:
            dec *= self._ratio(self._dec_ratio, ctx_sum / n_dec + 1.0)
        ix = self._indexer  # DSA's scoring pass, beside the pattern's attention kernels
        if ix is not None and pre is not None:
            pre += ix.prefill_s(pn, pp)
        if ix is not None and dec is not None:
            dec += ix.decode_s(n_dec, ctx_sum)
        return pre, dec, in_grid
