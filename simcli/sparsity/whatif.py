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
  (:func:`costmodels.steps.sparse.sparse_step_costs`).

Simplifications: memory is not re-estimated (activations of the attention kernels are
O(seq) either way; the KV cache is reported, not used to change serving capacity); model
FLOPs (MFU) keep counting dense causal attention; hybrid layers are averaged, which is
exact for one pipeline stage; under context parallelism the pattern is assumed as well
balanced over the ranks as causal attention.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from costmodels.steps.sparse import (
    AttentionTimes,
    SparseStepError,
    SparsityPricer,
    positive,
    sparse_step_costs,
    sparse_step_model_ms,
    time_ratio,
)
from simcli.training.simulator import simulate_iteration
from workloads.models import ModelConfig
from workloads.plan import TrainPlan, make_plan
from workloads.sparsity import (
    ALLOWED,
    DensePattern,
    Pattern,
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

_FLAGS = {"per_head"}  # parameters written without =VALUE (workloads.sparsity._PARAMS)


# A bad what-if input (one line); the step pricer's errors are the same class.
WhatIfError = SparseStepError


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
    seq_len = positive(seq_len, "seq_len")
    batch = positive(batch, "batch")
    positive(tp, "tp")
    ctx_len = positive(context_len if context_len is not None else seq_len, "context_len")
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
            "attn_fwd_speedup": time_ratio(base_attn.fwd_s, a.fwd_s),
            "attn_bwd_speedup": time_ratio(base_attn.bwd_s, a.bwd_s),
            "decode_read_tokens": _fmt_tokens(dec["decode_read_tokens"]),
            "decode_attn_ms": 1e3 * dec["decode_attn_s"],
            "decode_attn_speedup": time_ratio(base_dec["decode_attn_s"], dec["decode_attn_s"]),
            "kv_cache_tokens": _fmt_tokens(dec["kv_cache_tokens"]),
            "kv_cache_bytes": kv,
            "kv_cache_bytes_per_gpu": kv_gpu,
            "kv_cache_ratio": time_ratio(kv, base_kv[0]),
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
                "prefill_speedup": time_ratio(base_pre["step_ms"], pre["step_ms"]),
                "decode_step_ms": step["step_ms"],
                "decode_step_speedup": time_ratio(base_step["step_ms"], step["step_ms"]),
                "train_iteration_s": tr.iteration_s,
                "train_tokens_per_s": tr.tokens_per_s,
                "train_speedup": time_ratio(base_train.iteration_s, tr.iteration_s),
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
    out = [positive(v, name) for v in values]
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
