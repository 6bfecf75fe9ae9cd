"""What an attention sparsity pattern buys: per layer, per decode step, end to end.

``compare(model, gpu, seq_len, patterns)`` prices each pattern (a ``workloads.sparsity``
pattern string) on one model and GPU and returns one flat row per pattern; ``sweep`` does
it over sequence lengths and GQA groups (``num_kv_heads = num_heads / group``). The
columns and their units are :data:`COLUMNS`.

What is priced, and by which model:

- **dense** is the model's own attention, exactly as ``simcli train`` and ``simcli step``
  price it: causal FlashAttention on the calibrated dense cost model the caller resolved
  (``SparsityPricer.cost_models``, ops ``attn_fwd``/``attn_bwd``/``attn_decode``).
  It is the baseline of every speedup, so its speedups are exactly 1. (The bidirectional
  ``dense`` of :mod:`workloads.sparsity` has no meaning for a decoder.)
- **sparse patterns** run on a block-sparse kernel priced from their exact tile tables by
  :mod:`costmodels.ops.sparse_attention` (FlexAttention, fitted on measured H100/H200 rows):
  multi-branch patterns as ``sum(share x branch)``, estimation passes (SALE, AdaSpa)
  forward only. ``causal`` is the causal mask as a block mask on that kernel: the
  kernel-family reference that every sparse speedup contains (it shows what moving from
  FlashAttention to the block-sparse kernel costs or gains by itself).
- **NSA** forward: :func:`costmodels.ops.sparse_attention.nsa_attention_time` (compressed and
  window branches block-sparse, the selected branch on the faster of the NSA and FSA
  kernels: ``attn_kernel`` and ``kernel_reason`` say which and why). Backward: the three
  branches on the block-sparse model, the selected one scaled by the forward ratio of the
  chosen kernel to the block-sparse one (same gather structure; no measured NSA backward).
- **hybrid** patterns (LongGen): ``layer_patterns`` decides which layers are dense; dense
  layers are priced as the dense baseline, the others as the inner pattern; per-layer
  columns are the mean over layers.
- Tensor parallelism: each rank runs ``num_heads / tp`` query heads (and its KV heads);
  patterns whose heads differ (S2's per-head strides, AdaSpa's head densities, per-head
  top-k) take the slowest rank.
- **decode** at a context of ``context_len`` (default ``seq_len``) tokens, ``batch``
  sequences: FlashAttention's split-KV decode over the tokens the pattern reads
  (``decode_read_tokens``); NSA as its three decode reads (compressed keys, ``n x lsel``
  selected tokens, the window), each its own launch. KV bytes: ``kv_cache_tokens`` x KV
  heads x head_dim x 2 (K and V) x layers x batch x element bytes.
- **end to end**: the simulators' own dense attention times scaled by the pattern's ratio
  over dense at the same shape (so dense reproduces ``simcli step``/``simcli train``
  exactly and their calibration, launch floors and overlap stay as they are): a prefill
  of ``batch`` prompts of ``seq_len`` tokens and a decode step of ``batch`` sequences
  through :class:`costmodels.steps.serving.StepModel` (vLLM engine), and one training iteration
  through :func:`simcli.training.simulator.simulate_iteration` with a :class:`StepCosts`
  whose attention forward, backward and recompute are those of the pattern
  (:func:`sparse_step_costs`).

Simplifications: memory is not re-estimated (activations of the attention kernels are
O(seq) either way; the KV cache is reported, not used to change serving capacity); model
FLOPs (MFU) keep counting dense causal attention; hybrid layers are averaged, which is
exact for one pipeline stage; under context parallelism the pattern is assumed as well
balanced over the ranks as causal attention.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from costmodels.ops import sparse_attention as sa
from costmodels.steps.serving import StepModel
from costmodels.steps.training import Phase, StepCosts, cp_comm_s, recompute_phase, step_costs
from hardware_specs.registry import builtin_catalog
from hardware_specs.schema import DTYPE_BYTES, Dtype
from simcli.training.simulator import simulate_iteration
from workloads.decompose import tp_shard
from workloads.models import ModelConfig
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, Op, OpKind, normalise_frame
from workloads.plan import TrainPlan, make_plan
from workloads.sparsity import (
    ALLOWED,
    DensePattern,
    HybridPattern,
    NSAPattern,
    Pattern,
    WindowPattern,
    parse_pattern,
)

# Output columns, in order, with their meaning (units in the names; ms and s as named).
COLUMNS: dict[str, str] = {
    "model": "model id",
    "gpu": "GPU id",
    "tp": "tensor-parallel degree (attention per rank: num_heads / tp query heads)",
    "batch": "sequences per prefill and per decode step",
    "seq_len": "tokens per sequence (prefill, training, per-layer attention)",
    "context_len": "tokens in the KV cache at the decode step",
    "gqa_group": "query heads per KV head (num_heads / num_kv_heads)",
    "num_heads": "query heads of the model",
    "num_kv_heads": "KV heads of the model (overridden by --gqa-groups)",
    "pattern": "pattern string as parsed (canonical form)",
    "attn_kernel": "kernel priced: flash (dense cost model), flex (block-sparse), nsa | fsa",
    "tile_density": "visited 128x128 tiles / all tiles, mean over layers (causal ~0.5)",
    "attn_fwd_ms": "attention forward of one layer on one TP rank, batch sequences",
    "attn_bwd_ms": "attention backward of one layer on one TP rank, batch sequences",
    "attn_fwd_speedup": "dense attn_fwd_ms / this attn_fwd_ms",
    "attn_bwd_speedup": "dense attn_bwd_ms / this attn_bwd_ms",
    "decode_read_tokens": "tokens read per KV head per layer by one decode step (layer mean)",
    "decode_attn_ms": "decode attention of one layer on one TP rank (batch sequences)",
    "decode_attn_speedup": "dense decode_attn_ms / this decode_attn_ms",
    "kv_cache_tokens": "tokens kept per KV head per layer at context_len (layer mean)",
    "kv_cache_bytes": "KV cache of the whole model for batch sequences at context_len",
    "kv_cache_bytes_per_gpu": "KV cache on one TP rank",
    "kv_cache_ratio": "kv_cache_bytes / dense kv_cache_bytes",
    "prefill_ms": "prefill of batch prompts of seq_len tokens (StepModel, vllm engine)",
    "prefill_speedup": "dense prefill_ms / this prefill_ms",
    "decode_step_ms": "one decode step of batch sequences at context_len (StepModel)",
    "decode_step_speedup": "dense decode_step_ms / this decode_step_ms",
    "train_iteration_s": "one training iteration (simulate_iteration) of the training plan",
    "train_tokens_per_s": "training tokens per second of the whole job",
    "train_speedup": "dense train_iteration_s / this train_iteration_s",
    "dense_layers": "layers priced as dense attention (hybrid patterns)",
    "kernel_reason": "why the kernel was chosen (NSA vs FSA), else the kernel's parameters",
    "note": "adjustments made for this row",
}

FLASH = "flash"
_FLAGS = {"per_head"}  # parameters written without =VALUE (workloads.sparsity._PARAMS)


class WhatIfError(ValueError):
    """A bad what-if input; the message is one line."""


# --------------------------------------------------------------------------- parsing


def split_patterns(text: str) -> list[str]:
    """Split a ``--patterns`` list. Patterns are separated by ``;``, or by ``,`` where the
    next item starts a new pattern (``kind`` or ``kind:...``); the ``NAME=VALUE`` items
    (and flags) after a pattern are its parameters: ``dense,s2:local=2,stride=8,nsa`` is
    three patterns. A hybrid's ``inner=`` takes the parameters that follow it."""
    if not isinstance(text, str) or not text.strip():
        raise WhatIfError(f"no patterns given; allowed: a comma list of {ALLOWED}")
    if ";" in text:
        items = [t.strip() for t in text.split(";")]
    else:
        items = []
        for tok in (t.strip() for t in text.split(",")):
            head = tok.split(":", 1)[0].strip().lower()
            # NAME=VALUE and flags continue the pattern before; anything else starts one
            # (an unknown kind too, so that its error names it)
            starts = "=" not in head and head not in _FLAGS
            if starts or not items:
                items.append(tok)
            else:
                items[-1] += "," + tok
    if any(not t for t in items):
        raise WhatIfError(f"empty pattern in {text!r}; allowed: a comma list of {ALLOWED}")
    return items


def _parse_all(patterns: str | Sequence[str | Pattern]) -> list[Pattern]:
    items = split_patterns(patterns) if isinstance(patterns, str) else list(patterns)
    out = [p if isinstance(p, Pattern) else parse_pattern(p) for p in items]
    if not out:
        raise WhatIfError(f"no patterns given; allowed: a comma list of {ALLOWED}")
    return out


def gqa_model(model: ModelConfig, group: int | None) -> ModelConfig:
    """``model`` with ``num_kv_heads = num_heads / group`` (``None``: unchanged)."""
    if group is None:
        return model
    h = model.num_heads
    if not isinstance(group, int) or isinstance(group, bool) or group < 1 or h % group:
        allowed = ", ".join(str(g) for g in range(1, h + 1) if h % g == 0)
        raise WhatIfError(
            f"gqa group {group!r} does not divide num_heads={h} of {model.id}; allowed: {allowed}"
        )
    if h // group == model.num_kv_heads:
        return model
    return ModelConfig.model_validate(model.model_dump() | {"num_kv_heads": h // group})


def _positive(value: object, name: str) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
        raise WhatIfError(f"{name}={value!r} is invalid; allowed: an integer >= 1")
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
class _Shape:
    """Attention shape of one TP rank."""

    heads: int  # query heads of the model
    heads_q: int  # per rank
    heads_kv: int  # per rank
    head_dim: int
    tp: int
    layers: int
    num_kv_heads: int

    @classmethod
    def of(cls, model: ModelConfig, tp: int) -> _Shape:
        sh = tp_shard(model, tp)
        return cls(
            model.num_heads,
            sh.heads,
            sh.kv_heads,
            model.head_dim,
            tp,
            model.num_layers,
            model.num_kv_heads,
        )


def ops_frame(ops: list[Op]) -> pd.DataFrame:
    return normalise_frame(
        pd.DataFrame([o.row() for o in ops], columns=[*CSV_COLUMNS, *EXTRA_COLUMNS])
    )


def _layer_mix(pattern: Pattern, num_layers: int) -> list[tuple[Pattern | None, int]]:
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
            raise WhatIfError(f"dtype {self.dtype!r} is not supported; allowed: bf16, fp16")

    def cost_model(self, num_gpus: int = 1) -> Any:
        if num_gpus not in self._cms:
            self._cms[num_gpus] = self.cost_models(num_gpus)
        return self._cms[num_gpus]

    # ---- dense (the simulators' attention)

    def _dense_ops(self, sh: _Shape, kind: str, batch: int, seq_q: int, seq_kv: int) -> Op:
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

    def dense_s(self, sh: _Shape, kind: str, batch: int, seq_q: int, seq_kv: int) -> float:
        """Seconds of one dense attention op on one rank (cached)."""
        return self.dense_many(sh, [(kind, batch, seq_q, seq_kv)])[0]

    def dense_many(self, sh: _Shape, items: Sequence[tuple[str, int, int, int]]) -> list[float]:
        """Several dense ops in one ``predict_many`` (``(kind, batch, seq_q, seq_kv)``)."""
        keys = [(sh, *it) for it in items]
        todo = list(dict.fromkeys(k for k in keys if k not in self._dense))
        if todo:
            ops = [self._dense_ops(sh, *k[1:]) for k in todo]
            times = self.cost_model(sh.tp).predict_many(ops_frame(ops))
            self._dense.update(zip(todo, (float(t) for t in times), strict=True))
        return [self._dense[k] for k in keys]

    # ---- sparse kernels

    def _kw(self, sh: _Shape, batch: int, heads_q: int | None = None) -> dict[str, Any]:
        return dict(
            gpu=self.gpu,
            batch=batch,
            head_dim=sh.head_dim,
            dtype=self.dtype,
            heads_q=heads_q or sh.heads_q,
            heads_kv=sh.heads_kv,
        )

    def _nsa(self, p: NSAPattern, sh: _Shape, seq: int, batch: int) -> AttentionTimes:
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

    def _blocksparse(self, p: Pattern, sh: _Shape, seq: int, batch: int) -> AttentionTimes:
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
        sh = _Shape.of(model, tp)
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
        for p, n in _layer_mix(pattern, sh.layers):
            if isinstance(p, WindowPattern) and p.window >= seq_len:
                notes.append(f"window {p.window} >= seq_len {seq_len}: priced as dense")
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

    def _decode_reads(self, pattern: Pattern, sh: _Shape, context: int) -> list[tuple[list, int]]:
        """Per layer group: the decode reads (tokens per KV head, one launch each)."""
        out = []
        for p, n in _layer_mix(pattern, sh.layers):
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
        sh = _Shape.of(model, tp)
        groups = self._decode_reads(pattern, sh, context_len)
        items = [("attn_decode", batch, 1, r) for reads, _ in groups for r in reads]
        times = iter(self.dense_many(sh, items))
        total = read = 0.0
        for reads, n in groups:
            total += n * sum(next(times) for _ in reads)
            read += n * sum(reads)
        kept = sum(
            n * (context_len if p is None else p.kv_cache_tokens(context_len))
            for p, n in _layer_mix(pattern, sh.layers)
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
        sh = _Shape.of(model, tp)
        kept = sum(
            n * (context_len if p is None else p.kv_cache_tokens(context_len))
            for p, n in _layer_mix(pattern, sh.layers)
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


def _ratio(new: float, old: float) -> float:
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
    sh = _Shape.of(model, plan.tp)
    f_d = pr.dense_s(sh, "attn_fwd", plan.micro_batch, plan.seq_len, plan.seq_len)
    b_d = pr.dense_s(sh, "attn_bwd", plan.micro_batch, plan.seq_len, plan.seq_len)
    if "attn" not in c.layer_fwd.by_op_s or "attn_bwd" not in c.layer_bwd.by_op_s:
        raise WhatIfError(
            "these step costs have no fused attention op to replace; allowed: framework "
            "megatron or pytorch"
        )

    def swap(ph: Phase, name: str, scale: float) -> Phase:
        old = ph.by_op_s[name]
        new = old * scale
        by_op = dict(ph.by_op_s) | {name: new}
        return replace(ph, compute_s=ph.compute_s - old + new, by_op_s=by_op)

    lf = swap(c.layer_fwd, "attn", _ratio(a.fwd_s, f_d))
    lb = swap(c.layer_bwd, "attn_bwd", _ratio(a.bwd_s, b_d))
    if plan.cp > 1:
        cm = pr.cost_model(plan.num_gpus)
        cp_f, cp_b = cp_comm_s(model, plan, cm, cm.system, lf, lb)
        lf, lb = replace(lf, cp_comm_s=cp_f), replace(lb, cp_comm_s=cp_b)
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
    _positive(length, "length")
    _positive(batch, "batch")
    sm = pr.step_model(cfg, tp)
    none = np.zeros(0, np.int64)
    sh = _Shape.of(cfg, tp)
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
        raise WhatIfError(f"unknown phase {phase!r}; allowed: prefill, decode")
    dense_s = sum(bd.values())
    attn = bd.get("attn", 0.0) * _ratio(new, old)
    out = dict(bd) | {"attn": attn}
    return {
        "step_ms": 1e3 * sum(out.values()),
        "dense_step_ms": 1e3 * dense_s,
        "attn_ms": 1e3 * attn,
        "breakdown_ms": {k: 1e3 * v for k, v in out.items()},
    }


# --------------------------------------------------------------------------- compare


def _train_plan(
    model: ModelConfig,
    seq_len: int,
    tp: int,
    train_gpus: int | None,
    global_batch: int | None,
    micro_batch: int,
    recompute: str,
    plan_fields: dict[str, Any] | None,
) -> TrainPlan:
    gpus = train_gpus if train_gpus is not None else tp
    extra = dict(plan_fields or {})
    denom = tp * int(extra.get("pp", 1)) * int(extra.get("cp", 1))
    dp = max(1, gpus // denom)
    gb = global_batch if global_batch is not None else dp * micro_batch
    return make_plan(
        model,
        num_gpus=gpus,
        tp=tp,
        global_batch=gb,
        micro_batch=micro_batch,
        seq_len=seq_len,
        recompute=recompute,
        **extra,
    )


def _fmt_tokens(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 1)


def compare(
    model: ModelConfig,
    gpu: str,
    seq_len: int,
    patterns: str | Sequence[str | Pattern],
    *,
    tp: int = 1,
    batch: int = 1,
    context_len: int | None = None,
    gqa_group: int | None = None,
    train_gpus: int | None = None,
    global_batch: int | None = None,
    micro_batch: int = 1,
    recompute: str = "none",
    plan_fields: dict[str, Any] | None = None,
    end_to_end: bool = True,
    pricer: SparsityPricer,
) -> list[dict[str, Any]]:
    """One row per pattern (columns: :data:`COLUMNS`); see the module docstring.

    Training iteration: a plan of ``train_gpus`` (default ``tp``) GPUs at this ``tp``,
    ``micro_batch`` sequences of ``seq_len`` per micro-batch, ``global_batch`` (default one
    micro-batch per data-parallel rank), ``recompute``; ``plan_fields`` adds any other
    :class:`TrainPlan` field (pp, cp, zero, ...). ``end_to_end=False`` skips the prefill,
    decode-step and training columns (None)."""
    seq_len = _positive(seq_len, "seq_len")
    batch = _positive(batch, "batch")
    _positive(tp, "tp")
    ctx_len = _positive(context_len if context_len is not None else seq_len, "context_len")
    pats = _parse_all(patterns)
    pr = pricer
    cfg = gqa_model(model, gqa_group)
    dense = DensePattern()
    base_attn = pr.attention(dense, cfg, seq_len, tp=tp, batch=batch)
    base_dec = pr.decode(dense, cfg, ctx_len, tp=tp, batch=batch)
    base_kv = pr.kv_cache_bytes(dense, cfg, ctx_len, tp=tp, batch=batch)
    plan = None
    base_pre = base_step = base_train = None
    if end_to_end:
        plan = _train_plan(
            cfg, seq_len, tp, train_gpus, global_batch, micro_batch, recompute, plan_fields
        )
        base_costs = pr.step_costs(cfg, plan)
        cm = pr.cost_model(plan.num_gpus)
        base_train = simulate_iteration(
            cfg, plan, system=cm.system, cost_model=cm, costs=base_costs
        )
        base_pre = sparse_step_model_ms(
            cfg, gpu, dense, phase="prefill", length=seq_len, batch=batch, tp=tp, pricer=pr
        )
        base_step = sparse_step_model_ms(
            cfg, gpu, dense, phase="decode", length=ctx_len, batch=batch, tp=tp, pricer=pr
        )

    rows = []
    for p in pats:
        a = pr.attention(p, cfg, seq_len, tp=tp, batch=batch)
        dec = pr.decode(p, cfg, ctx_len, tp=tp, batch=batch)
        kv, kv_gpu = pr.kv_cache_bytes(p, cfg, ctx_len, tp=tp, batch=batch)
        row: dict[str, Any] = {
            "model": cfg.id,
            "gpu": gpu,
            "tp": tp,
            "batch": batch,
            "seq_len": seq_len,
            "context_len": ctx_len,
            "gqa_group": cfg.num_heads // cfg.num_kv_heads,
            "num_heads": cfg.num_heads,
            "num_kv_heads": cfg.num_kv_heads,
            "pattern": p.spec,
            "attn_kernel": a.kernel,
            "tile_density": a.tile_density,
            "attn_fwd_ms": 1e3 * a.fwd_s,
            "attn_bwd_ms": 1e3 * a.bwd_s,
            "attn_fwd_speedup": _ratio(base_attn.fwd_s, a.fwd_s),
            "attn_bwd_speedup": _ratio(base_attn.bwd_s, a.bwd_s),
            "decode_read_tokens": _fmt_tokens(dec["decode_read_tokens"]),
            "decode_attn_ms": 1e3 * dec["decode_attn_s"],
            "decode_attn_speedup": _ratio(base_dec["decode_attn_s"], dec["decode_attn_s"]),
            "kv_cache_tokens": _fmt_tokens(dec["kv_cache_tokens"]),
            "kv_cache_bytes": kv,
            "kv_cache_bytes_per_gpu": kv_gpu,
            "kv_cache_ratio": _ratio(kv, base_kv[0]),
            "prefill_ms": None,
            "prefill_speedup": None,
            "decode_step_ms": None,
            "decode_step_speedup": None,
            "train_iteration_s": None,
            "train_tokens_per_s": None,
            "train_speedup": None,
            "dense_layers": a.dense_layers,
            "kernel_reason": a.reason,
            "note": "; ".join(a.notes),
        }
        if end_to_end:
            assert plan is not None and base_pre and base_step and base_train
            pre = sparse_step_model_ms(
                cfg, gpu, p, phase="prefill", length=seq_len, batch=batch, tp=tp, pricer=pr
            )
            step = sparse_step_model_ms(
                cfg, gpu, p, phase="decode", length=ctx_len, batch=batch, tp=tp, pricer=pr
            )
            costs = sparse_step_costs(cfg, plan, p, gpu, pricer=pr)
            cm = pr.cost_model(plan.num_gpus)
            tr = simulate_iteration(cfg, plan, system=cm.system, cost_model=cm, costs=costs)
            row |= {
                "prefill_ms": pre["step_ms"],
                "prefill_speedup": _ratio(base_pre["step_ms"], pre["step_ms"]),
                "decode_step_ms": step["step_ms"],
                "decode_step_speedup": _ratio(base_step["step_ms"], step["step_ms"]),
                "train_iteration_s": tr.iteration_s,
                "train_tokens_per_s": tr.tokens_per_s,
                "train_speedup": _ratio(base_train.iteration_s, tr.iteration_s),
            }
        if isinstance(p, DensePattern):  # the baseline itself: exactly 1
            for k in row:
                if k.endswith("_speedup") or k == "kv_cache_ratio":
                    row[k] = 1.0 if row[k] is not None else None
        rows.append(row)
    return rows


def _int_list(values: Iterable[int] | None, name: str) -> list[int | None]:
    if values is None:
        return [None]
    out = [_positive(v, name) for v in values]
    if not out:
        raise WhatIfError(f"{name}: empty list; allowed: one or more integers >= 1")
    return list(dict.fromkeys(out))


def sweep(
    model: ModelConfig,
    gpu: str,
    seq_lens: Iterable[int],
    patterns: str | Sequence[str | Pattern],
    *,
    gqa_groups: Iterable[int] | None = None,
    pricer: SparsityPricer,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """:func:`compare` for every (seq_len, gqa group): one row per (seq, group, pattern),
    in that order. ``context_len`` (if given) is used for every sequence length; by default
    each row decodes at its own ``seq_len``. Patterns are parsed once, before any pricing,
    so a bad one fails fast."""
    pats = _parse_all(patterns)
    groups = _int_list(gqa_groups, "gqa_groups")
    seqs = _int_list(seq_lens, "seq_lens")
    for g in groups:
        gqa_model(model, g)  # check all groups before pricing
    rows: list[dict[str, Any]] = []
    for s in seqs:
        for g in groups:
            rows += compare(model, gpu, s, pats, gqa_group=g, pricer=pricer, **kwargs)  # type: ignore[arg-type]
    return rows


def timed_sweep(*args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], float]:
    """:func:`sweep` and its wall-clock seconds."""
    t0 = time.perf_counter()
    rows = sweep(*args, **kwargs)
    return rows, time.perf_counter() - t0


__all__ = [
    "COLUMNS",
    "AttentionTimes",
    "SparsityPricer",
    "WhatIfError",
    "compare",
    "gqa_model",
    "sparse_step_costs",
    "sparse_step_model_ms",
    "split_patterns",
    "sweep",
    "timed_sweep",
]
