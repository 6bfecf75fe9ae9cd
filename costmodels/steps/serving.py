"""Latency of one serving-engine iteration: prefill, decode or a mixed (chunked-prefill) batch.

``StepModel(model, gpu_id, tp=, pp=, engine=)`` implements the contract in
:mod:`simcli.serving` (``step_s``, ``kv_bytes_per_token``, ``kv_capacity_tokens``,
``verify_step_s``) plus ``breakdown`` (seconds per op) and ``step_ms``.

**What one iteration costs.** One forward pass over every scheduled token. The work that
is linear in tokens (GEMMs, norms, RoPE, the KV-cache write, TP all-reduces) runs once on
all ``T = sum(prefill_new) + len(decode_ctx)`` tokens (GEMM ``m = T``: one pass, as vLLM
and Sarathi-Serve batch them, Agrawal et al. 2024); attention runs per sequence: a prefill
chunk of ``n`` new tokens over ``p`` cached ones attends causally (bottom-right aligned,
``seq_q = n``, ``seq_kv = p + n``), a decode over its ``ctx + 1`` keys. The LM head runs on
one row per sequence. Every op is priced by the calibrated cost model
(:func:`costmodels.ops.select.get_cost_model`); this module only decides which ops run, how
they are launched, and adds them up.

**Engines.** ``engine`` names a profile (:mod:`costmodels.steps.engines`, docs/engines.md):
its attention backends per GPU architecture, its CUDA graphs (capture sizes, padding, what
launches from the host) and host work per iteration
(:class:`~costmodels.steps.serving_launch.EngineLaunch`), its defaults. ``vllm``, ``vllm-v0``,
``sglang``, ``trtllm`` run vLLM's fused kernels (fused residual-add + RMSNorm, fused QKV and
gate-up GEMMs, in-place rotary, ``reshape_and_cache``, ``silu_and_mul``); a kernel replayed
from a graph costs at least :data:`GRAPH_KERNEL_FLOOR_S`, one launched from the host
:data:`STREAM_KERNEL_FLOOR_S`. ``pytorch-eager`` is the plain PyTorch model measured by
``calibrate/steps/serve_step.py`` (one GPU): RMSNorm, RoPE and SiLU-mul as its eager kernels
(each an HBM pass priced as a ``copy``), cuDNN attention; decode replayed from a graph,
prefill eager through the launch-queue recurrence (:func:`launch_queue_s`, host
:data:`EAGER_HOST_DISPATCH_S` per torch call).

**Speed.** Everything is priced once, at construction, with a few vectorised
``predict_many`` calls on grids: token counts (every integer to 256, then both sides of
each multiple of 64 to 16k, where GEMM wave quantisation steps, then 1% apart), sequences
per step, per-sequence prefill attention over (new, past) tokens and decode attention over
(batch, mean context). ``step_s`` interpolates (microseconds per call) and falls back to
exact pricing outside the grids. Grids are cached per configuration.

**Pipeline parallelism.** ``step_s`` is the latency of one micro-batch through all ``pp``
stages: the per-GPU step over all layers plus ``pp - 1`` stage-to-stage sends of the
hidden state and residual; :meth:`StepModel.stage_s` is the slowest stage (what bounds a
pipelined engine's rate). TP adds two all-reduces of the activations per layer (no
sequence parallelism in serving), one for the vocabulary-parallel embedding and a gather
of the logits, priced by the cost model's collectives.

**Precision.** ``weight_dtype`` (bf16, fp16, fp8, int8, int4) and ``kv_cache_dtype``
(auto, bf16, fp16, fp8 and vLLM's fp8_e4m3/fp8_e5m2) as :mod:`workloads.decompose.quant`
stores them. fp8 weights run the quantised GEMMs as fp8 GEMMs (the calibrated fp8 class of
the cost model: the fp8 peak for compute-bound prefill, half the weight bytes for decode)
after an activation-quantisation kernel; int8/int4 weights run weight-only GEMMs priced as
the calibrated bf16 GEMM scaled by :func:`costmodels.ops.gemm.weight_only_gemm_work`'s
analytical ratio (packed weights plus group scales streamed, bf16 compute, published
kernel figures for the dequantisation overhead). An fp8 KV cache halves the cache writes
and the decode-attention reads (the calibrated bf16 decode scaled the same way) and the
bytes per token of :meth:`kv_capacity_tokens`. Prefill attention keeps the activation
dtype (FlashAttention reads the chunk's fresh K/V; the cached part of a chunked prefill
is read as bf16 too, an overestimate of its bytes with an fp8 cache).

**Simplifications.**

- Attention of several prefill chunks is one varlen launch taking the longer of the sum
  of each sequence's share of a GPU-filling batch (:data:`FILL_WAVES` waves of CTAs) and
  the longest sequence alone; decodes are a second launch priced at their mean context
  (their KV traffic is exact, the split-KV walk of the longest sequence is not). vLLM V1
  runs both in one varlen call.
- Fused engines: routed experts as ``fused_moe``'s grouped GEMMs reading only the touched
  experts' weights (:mod:`workloads.decompose.moe`; skew: ``moe_imbalance``); sampling one
  softmax over the vocabulary per sequence; MLA as in :mod:`workloads.decompose.mla`; the
  LM head and sampler at the graph floor (V1 runs them outside its graphs).
- ``pytorch-eager``: Llama-style dense models on one GPU only; its host constant is a
  property of the measuring VM's CPU and PyTorch version.
- Memory: the non-torch, graph-pool and activation terms follow vLLM's profile of
  Llama-3-8B on an H100 (see the constants); the activation term scales with the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodels.ops.select import get_cost_model
from costmodels.steps.composition import Composition, shipped_composition
from costmodels.steps.engines import ENGINE_IDS, EngineError, load_engine
from costmodels.steps.mixer_scan import scale_serving
from costmodels.steps.serving_grid import (
    EAGER_HOST_DISPATCH_S,
    Pricer,
    StepError,
    attention_frame,
    attn_axis,
    bilinear,
    bracket,
    decode_axes,
    int_grid,
    launch_costs,
    launch_queue_s,
    monotone,
    strided_scale,
)
from costmodels.steps.serving_launch import EngineLaunch
from costmodels.steps.serving_launch import IterationCost as _Eval
from costmodels.steps.serving_launch import decode_summary as _decodes
from costmodels.steps.serving_memory import DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_SEQS, VllmMemory
from costmodels.steps.serving_summary import SummaryPricing
from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose import OpTemplate, serving_templates, tp_shard
from workloads.decompose.mla import attention_dims
from workloads.decompose.quant import KV_CACHE_DTYPES, WEIGHT_FORMATS, kv_storage_dtype
from workloads.decompose.serving import total_instances
from workloads.decompose.sparsity import linear_sparsity, sparsify_templates
from workloads.models import ModelConfig, load_model

ENGINES = ENGINE_IDS  # the engine profiles shipped (costmodels/data/engines)

# --- launch costs -------------------------------------------------------------------------
# The cost model's op times come from microbenchmarks timed one call at a time with CUDA
# events (calibrate/bench/common.py), so each carries the fitted per-call `launch_s`. A
# kernel queued behind other kernels, or replayed from a CUDA graph, pays a smaller GPU-side
# floor instead; the launch is swapped for that floor (see `Pricer.work`). Neither floor
# is fitted to the validation steps; both were measured on lent Hopper GPUs (torch 2.11,
# 2026-11; scripts in calibrate/steps/probes/, outputs in calibrate/data/steps-h100/probes/):
#
# In a CUDA graph: a graph of 2,000 dependent tiny elementwise kernels (torch `add_` on
# 4096 bf16 to 32x4096 fp32 elements) replayed at 0.91-1.28 us per kernel (nvidia-h200,
# the H100's SM count and clocks).
GRAPH_KERNEL_FLOOR_S = 1.0e-6
# Launched eagerly from a stream: the eager Llama forward of calibrate/steps/serve_step.py
# (1,323 kernels) took ~1.0 us per kernel longer eagerly than replayed from a graph when
# GPU-bound (prefill 2x512: 33.0 vs 31.8 ms; 1x512: 18.7 vs 17.4 ms; nvidia-h200).
STREAM_KERNEL_FLOOR_S = 2.0e-6

# --- grids ----------------------------------------------------------------------------------
TOKEN_GRID_MAX = 131072
SEQ_GRID_MAX = 16384
ATTN_GRID_MAX = 131072
DECODE_BATCH_MAX = 4096
FILL_WAVES = 8  # CTA waves that make a varlen attention launch throughput-bound


@dataclass(frozen=True)
class _Shape:
    model: ModelConfig
    tp: int
    pp: int
    dtype: str
    hq: int  # query heads per rank
    hkv: int  # KV heads per rank
    ffn: int  # per rank
    expert_ffn: int
    vocab: int  # per rank (padded)
    tp_nodes: int
    pp_nodes: int

    @property
    def elt(self) -> int:
        return DTYPE_BYTES[Dtype(self.dtype)]


_GRID_CACHE: dict[tuple, tuple[Any, Any]] = {}


# --------------------------------------------------------------------------- the model


@dataclass
class _Grids:
    tok_x: np.ndarray
    seq_x: np.ndarray
    tok: dict[str, np.ndarray]  # context -> [n_tok_tpl, n_x] seconds per step-instance
    seq: dict[str, np.ndarray]
    tok_total: dict[str, list]  # context -> [n_x] per-step seconds (python floats)
    seq_total: dict[str, list]
    seq_total_dec: dict[str, list]  # with the decode-only kernels
    n_axis: np.ndarray
    p_axis: np.ndarray
    w1: np.ndarray  # [n, p] one sequence alone: work seconds
    wfill: np.ndarray  # [n, p] one sequence's share of a GPU-filling batch
    dec_b: np.ndarray
    dec_kv: np.ndarray
    wdec: np.ndarray  # [b, kv] decode attention work seconds
    tok_kern: list = field(default_factory=list)  # [n_tok_x] kernels per step
    seq_kern: list = field(default_factory=list)  # [n_seq_x]
    lists: dict[str, Any] = field(default_factory=dict)


# the methods of step_s_summary's scalar path (costmodels.steps.serving_summary)
_SUMMARY_PATH = ("step_s_summary", "step_s_decode", "_prefill_attn_lists", "_grid_total_s",
                 "_decode_share", "_attn_layer_s", "_attn_factors", "_decode_attn")  # fmt: skip


class StepModel(VllmMemory, SummaryPricing):
    """Seconds of one engine iteration on one replica (see the module docstring).

    ``model``: a :class:`ModelConfig`, a built-in id or a config.json path. ``engine``: an
    engine profile id (:data:`ENGINES`). ``attn_backend``: the op backend of prefill and
    decode attention (default: the engine's on the GPU's architecture).
    ``max_num_batched_tokens`` / ``max_num_seqs`` size the activation workspace of
    :meth:`kv_capacity_tokens` (and ``max_num_seqs`` caps vLLM's capture sizes).
    ``dtype``: the activations' (bf16 | fp16); ``weight_dtype``
    (default ``dtype``; fp8, int8, int4 quantised) and ``kv_cache_dtype`` (default
    ``dtype``) as in the module docstring.
    """

    _graph_floor_s = GRAPH_KERNEL_FLOOR_S  # a graph-replayed kernel's floor (summary_tables)
    _stream_floor_s = STREAM_KERNEL_FLOOR_S  # a host-launched kernel's floor (summary_tables)

    def __init__(
        self,
        model: ModelConfig | str,
        gpu_id: str,
        *,
        tp: int = 1,
        pp: int = 1,
        engine: str = "vllm",
        attn_backend: str | None = None,
        dtype: str = "bf16",
        weight_dtype: str | None = None,
        kv_cache_dtype: str | None = None,
        weight_sparsity: str | None = None,
        activation_sparsity: str | None = None,
        max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
        max_num_seqs: int = DEFAULT_MAX_SEQS,
        cost_model: Any = None,
        profile: str | Path | None = None,
        composition: Composition | None | str = "shipped",
        scheduler_steps: int = 1,
    ) -> None:
        self.model = model if isinstance(model, ModelConfig) else load_model(model)
        try:
            self.profile = load_engine(engine)
        except EngineError as exc:
            raise StepError(str(exc)) from None
        for name, v in (("pp", pp), ("max_num_batched_tokens", max_num_batched_tokens),
                        ("max_num_seqs", max_num_seqs), ("scheduler_steps", scheduler_steps)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise StepError(f"{name} must be a positive integer, got {v!r}")
        shard = tp_shard(self.model, tp)  # one-line ModelError for a bad tp
        m = self.model
        if pp > m.num_layers:
            raise StepError(f"pp={pp} exceeds the {m.num_layers} layers of {m.id}")
        if dtype not in ("bf16", "fp16"):
            raise StepError(f"dtype {dtype!r} not supported; allowed: bf16, fp16")
        weight_dtype = weight_dtype or dtype
        if weight_dtype not in WEIGHT_FORMATS:
            raise StepError(
                f"weight_dtype {weight_dtype!r}; allowed: {', '.join(WEIGHT_FORMATS)}"
            )
        fmt = WEIGHT_FORMATS[weight_dtype]
        if not fmt.quantised and weight_dtype != dtype:
            raise StepError(
                f"weight_dtype {weight_dtype} with dtype {dtype}: unquantised weights run in "
                f"the activation dtype; allowed: weight_dtype {dtype}, fp8, int8 or int4"
            )
        if (kv_cache_dtype or "auto") not in KV_CACHE_DTYPES:
            raise StepError(
                f"kv_cache_dtype {kv_cache_dtype!r}; allowed: {', '.join(KV_CACHE_DTYPES)}"
            )
        kv_dt = kv_storage_dtype(kv_cache_dtype, dtype)
        if engine == "pytorch-eager" and (fmt.quantised or kv_dt != dtype):
            raise StepError(
                f"engine pytorch-eager is the plain PyTorch model with {dtype} weights and KV "
                f"cache; got weight_dtype {weight_dtype}, kv_cache_dtype {kv_dt}; allowed: "
                "engine vllm for quantised weights or an fp8 KV cache"
            )
        if engine == "pytorch-eager":
            if tp != 1 or pp != 1:
                raise StepError(
                    f"engine pytorch-eager is the single-GPU plain PyTorch model; got tp={tp}, "
                    f"pp={pp}; allowed: tp=1, pp=1 (use --engine vllm for parallel serving)"
                )
            if not (
                m.norm == "rmsnorm"
                and m.position == "rope"
                and m.gated_mlp
                and not (m.is_hybrid or m.is_mla)
            ):
                raise StepError(
                    f"engine pytorch-eager models Llama-style models (RMSNorm, RoPE, gated "
                    f"MLP, dense or MoE); {m.id} is not one; allowed: --engine vllm"
                )
        self.engine, self.tp, self.pp, self.dtype = engine, tp, pp, dtype
        self.weight_dtype, self.kv_cache_dtype = weight_dtype, kv_dt
        self.gemm_dtype = fmt.gemm_dtype or dtype  # what the quantised GEMMs compute in
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        self.gpu_id = gpu_id
        if composition == "shipped":
            composition = shipped_composition(gpu_id)
        self.composition = composition if isinstance(composition, Composition) else None
        if cost_model is None:
            cost_model = _default_cost_model(gpu_id, str(profile) if profile else None, tp * pp)
        self.cost_model = cost_model
        system = cost_model.system
        self.gpu = system.gpu
        # the engine's kernels on this architecture (one op backend each for prefill and
        # decode attention); --attn-backend overrides both
        kernels = self.profile.kernels_for(self.gpu.architecture)
        self.prefill_backend = attn_backend or kernels.prefill_backend
        self.decode_backend = attn_backend or kernels.decode_backend
        self.attn_backend = self.prefill_backend
        self.launch = EngineLaunch.of(
            self.profile, gpu_id, self.gpu.memory_gib, tp, max_num_seqs
        ).with_scheduler_steps(scheduler_steps)  # fmt: skip
        self.sparsity = linear_sparsity(
            weight_sparsity, activation_sparsity, model=m, gpu=self.gpu, weight_dtype=weight_dtype
        )  # fmt: skip
        if self.sparsity.activation and shard.ffn < m.hidden_size:  # the CATS model's neurons
            raise StepError(  # are the larger GEMM dimension (costmodels.ops.sparse_gemm)
                f"--activation-sparsity at tp={tp}: {m.id}'s MLP has {shard.ffn} neurons per "
                f"rank, fewer than its hidden size {m.hidden_size}; allowed: a smaller --tp"
            )
        for what, value in (("weight_dtype", self.gemm_dtype), ("kv_cache_dtype", kv_dt)):
            if value == "fp8" and not self.gpu.supports("fp8"):
                raise StepError(
                    f"{what} fp8 needs fp8 tensor cores; {self.gpu.id} has none; allowed: "
                    + ("bf16, fp16, int8, int4" if what == "weight_dtype" else "auto, bf16, fp16")
                )
        gpn = system.node.gpus_per_node
        self.shape = _Shape(
            model=m,
            tp=tp,
            pp=pp,
            dtype=dtype,
            hq=shard.heads,
            hkv=shard.kv_heads,
            ffn=shard.ffn,
            expert_ffn=shard.expert_ffn,
            vocab=shard.vocab,
            tp_nodes=-(-tp // gpn),
            pp_nodes=2 if tp * pp > gpn else 1,
        )
        self._attn_dims = {p: attention_dims(m, shard, p) for p in ("prefill", "decode")}
        if kernels.decode_kv_reads == "per_query_head" and not m.is_mla:  # a block per query
            dec = self._attn_dims["decode"]  # head reads its KV head (no L2 reuse modelled)
            self._attn_dims["decode"] = {**dec, "heads_kv": dec["heads_q"]}
        params = getattr(getattr(cost_model, "base", cost_model), "params", None)
        self._launch = launch_costs(params, self.prefill_backend)
        launch_costs(params, self.decode_backend)  # one line for an unknown backend
        self.label = getattr(cost_model, "label", type(cost_model).__name__)
        self._check_weights_fit()
        tpls = serving_templates(
            m, shard, self.profile.decompose, dtype, pp=pp, tp_nodes=self.shape.tp_nodes,
            pp_nodes=self.shape.pp_nodes, weight_dtype=weight_dtype, kv_cache_dtype=kv_dt,
        )  # fmt: skip
        scale_serving(tpls, m)  # a hybrid's scan kernels as measured
        tpls["layer"] = sparsify_templates(tpls["layer"], self.sparsity)
        self._tpls = tpls
        self._layer_tpls = tpls["head"] + tpls["layer"] + tpls["tail"]
        attn = next(i for i, t in enumerate(tpls["layer"]) if t.is_attention)
        self._attn_pos = len(tpls["head"]) + attn
        self._pricer = Pricer(cost_model, self._launch, dtype, strided_scale(params))
        self._grids = self._build_grids()
        dec_only = np.array([t.decode_only for t in tpls["seq"]], dtype=bool)
        self._seq_keep, self._seq_keep_dec = ~dec_only, np.ones(len(dec_only), dtype=bool)
        self._per_tok = self._per_step(self._layer_tpls)
        self._per_seq = self._per_step(tpls["seq"])
        # step_s_summary's scalar path prices attention as _attention does (a subclass
        # that reprices attention takes the general path) and memoises by batch size
        self._summary_fast = type(self)._attention is StepModel._attention
        # ... and summary_tables hands the grids to a compiled copy of that path only
        # where no method of it is repriced
        cls = type(self)
        self._summary_tabled = self._summary_fast and all(
            getattr(cls, n) is getattr(StepModel, n) for n in _SUMMARY_PATH
        )
        self._decode_memo: dict[int, tuple | bool] = {}
        self._first_chunk_memo: dict[int, tuple[float, float]] = {}
        self._attn_f: dict[bool, tuple[float, float]] = {}

    # --- construction ----------------------------------------------------------------
    def _kernels(self, T: int, S: int, n_pre: int, n_dec: int) -> float:
        """Kernels one iteration launches (its attention launches included)."""
        g = self._grids
        i, w = bracket(g.lists["tok_x"], T)
        a = g.tok_kern
        k = a[i] + w * (a[i + 1] - a[i])
        i, w = bracket(g.lists["seq_x"], S)
        b = g.seq_kern
        k = k + (b[i] + w * (b[i + 1] - b[i]))
        return k + self.model.attention_layers * ((n_pre > 0) + (n_dec > 0))

    def _finish(self, gpu: float, ctx: str, T: int, S: int, n_pre: int, n_dec: int) -> float:
        """The iteration's price from its GPU time: a step launched from the host takes at
        least its kernels x the host's seconds per launch; the engine's host work is then
        added or overlapped (:class:`~costmodels.steps.serving_launch.EngineLaunch`)."""
        launch_s = self.launch.launch_s
        if ctx == "stream" and launch_s:
            gpu = max(gpu, self._kernels(T, S, n_pre, n_dec) * launch_s)
        return self.launch.combine(gpu, S, T, n_pre)

    def _per_step(self, tpls: Sequence[OpTemplate]) -> np.ndarray:
        layers = self.model.num_layers
        return np.array([t.count * (layers if t.per_layer else 1) for t in tpls], dtype=float)

    def _contexts(self) -> dict[str, float]:
        """Launch contexts and their per-kernel floor: graph replay and launch from the host
        (a step outside the engine's CUDA graphs, the eager engine's prefill)."""
        return {"graph": GRAPH_KERNEL_FLOOR_S, "stream": STREAM_KERNEL_FLOOR_S}

    def _composition_key(self, ctx: str) -> str:
        """The composition's engine key of a launch context (``pytorch-eager/graph``...)."""
        return f"{self.engine}/{ctx}"

    def _price(self, tpls: Sequence[OpTemplate], x: np.ndarray) -> dict[str, np.ndarray]:
        """Per-instance seconds of each template at x, for each launch context; with a
        composition, each template's work times its kernel group's factor and the
        context's idle factor, floors times idle (:mod:`costmodels.steps.composition`)."""
        work = self._pricer.templates(tpls, x)
        eager_2_4 = self.engine == "pytorch-eager" and self.sparsity.weight == "2:4"
        eager = self._pricer.templates(tpls, x, eager=True) if eager_2_4 else work
        inst = total_instances(tpls, x)
        out = {}
        for ctx, floor in self._contexts().items():
            f, idle = np.ones(len(tpls)), 1.0
            if self.composition is not None:  # group factor x idle; collectives unscaled
                key = self._composition_key(ctx)
                f = self.composition.factors_for(key, [t.op or "copy" for t in tpls])
                idle = self.composition.idle(key)
            w = eager if ctx == "stream" else work  # eager launches: 2:4's per-call set-up
            out[ctx] = w * f[:, None] + idle * floor * inst
        return out

    def _build_grids(self) -> _Grids:
        key = (
            self.model.model_dump_json(),
            self.gpu_id,
            self.tp,
            self.pp,
            self.engine,
            self.prefill_backend,
            self.decode_backend,
            self.dtype,
            self.weight_dtype,
            self.kv_cache_dtype,
            self.sparsity,
            self.label,
            id(self.cost_model),
            None if self.composition is None else repr(sorted(self.composition.factors.items())),
        )
        cached = _GRID_CACHE.get(key)
        if cached is not None and cached[0] is self.cost_model:
            return cached[1]
        tok_x = int_grid(TOKEN_GRID_MAX)
        seq_x = int_grid(SEQ_GRID_MAX)
        # running maxima: the learned corrections wiggle by <0.01% in places; a step never
        # gets faster with more tokens or keys
        tok = {c: monotone(v, 1) for c, v in self._price(self._layer_tpls, tok_x).items()}
        seq = {c: monotone(v, 1) for c, v in self._price(self._tpls["seq"], seq_x).items()}
        w_tok = self._per_step(self._layer_tpls)[:, None]
        w_seq = self._per_step(self._tpls["seq"])[:, None]
        dec_only = np.array([t.decode_only for t in self._tpls["seq"]])[:, None]
        n_axis = attn_axis(ATTN_GRID_MAX)
        p_axis = attn_axis(ATTN_GRID_MAX, zero=True)
        w1, wfill = (monotone(a, 0, 1) for a in self._prefill_attention_grid(n_axis, p_axis))
        dec_b, dec_kv = decode_axes(DECODE_BATCH_MAX, ATTN_GRID_MAX + 1)
        wdec = self._decode_attention_work(
            np.repeat(dec_b, len(dec_kv)), np.tile(dec_kv, len(dec_b))
        ).reshape(len(dec_b), len(dec_kv))
        wdec = monotone(wdec, 0, 1)
        # kernels launched per step (instances x count x layers), for the launch-bound
        # floor of a step outside CUDA graphs
        tok_kern = (total_instances(self._layer_tpls, tok_x) * w_tok).sum(axis=0)
        seq_kern = (total_instances(self._tpls["seq"], seq_x) * w_seq).sum(axis=0)
        g = _Grids(
            tok_kern=tok_kern.tolist(),
            seq_kern=seq_kern.tolist(),
            tok_x=tok_x,
            seq_x=seq_x,
            tok=tok,
            seq=seq,
            tok_total={c: (v * w_tok).sum(axis=0).tolist() for c, v in tok.items()},
            seq_total={c: (v * w_seq * ~dec_only).sum(axis=0).tolist() for c, v in seq.items()},
            seq_total_dec={c: (v * w_seq).sum(axis=0).tolist() for c, v in seq.items()},
            n_axis=n_axis,
            p_axis=p_axis,
            w1=w1,
            wfill=wfill,
            dec_b=dec_b,
            dec_kv=dec_kv,
            wdec=wdec,
        )
        g.lists = {
            "tok_x": tok_x.tolist(),
            "seq_x": seq_x.tolist(),
            "n": n_axis.tolist(),
            "p": p_axis.tolist(),
            "w1": w1.tolist(),
            "wfill": wfill.tolist(),
            "dec_b": dec_b.tolist(),
            "dec_kv": dec_kv.tolist(),
            "wdec": wdec.tolist(),
        }
        if len(_GRID_CACHE) > 16:
            _GRID_CACHE.clear()
        _GRID_CACHE[key] = (self.cost_model, g)
        return g

    def _attn_rows(self, batch: np.ndarray, n: np.ndarray, p: np.ndarray) -> pd.DataFrame:
        dims = self._attn_dims["prefill"]
        return attention_frame("attn_fwd", self.dtype, dims, self.prefill_backend, batch, n, n + p)

    def _fill_batch(self, n: np.ndarray) -> np.ndarray:
        """Sequences of n new tokens whose CTAs fill FILL_WAVES waves of the GPU."""
        bm = self._launch["block_m"]
        ctas = self.shape.hq * np.ceil(n / bm)
        return np.maximum(1.0, np.ceil(FILL_WAVES * self.gpu.sm_count / ctas))

    def _prefill_attention_work(
        self, n: np.ndarray, p: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per sequence: (work alone, work as a share of a GPU-filling varlen batch)."""
        n = np.asarray(n, dtype=float)
        p = np.asarray(p, dtype=float)
        fill = self._fill_batch(n)
        both = self._attn_rows(
            np.concatenate([np.ones(len(n)), fill]), np.concatenate([n, n]), np.concatenate([p, p])
        )
        w = self._pricer.work(both, np.full(2 * len(n), self._launch["fwd"]))
        return w[: len(n)], w[len(n) :] / fill

    def _prefill_attention_grid(
        self, n_axis: np.ndarray, p_axis: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        nn = np.repeat(n_axis, len(p_axis))
        pp = np.tile(p_axis, len(n_axis))
        w1, wf = self._prefill_attention_work(nn, pp)
        shape = (len(n_axis), len(p_axis))
        return w1.reshape(shape), wf.reshape(shape)

    def _decode_attention_work(self, batch: np.ndarray, kv: np.ndarray) -> np.ndarray:
        """Decode attention work over ``batch`` caches of ``kv`` keys. An fp8 cache is
        priced as its calibrated bf16/fp16 twin scaled by the analytical model's ratio
        (the same kernel reading half the K/V bytes, Q and output counted at one byte
        too: they are 1/context of the traffic); no decode over an fp8 cache was
        measured for the shipped profiles."""
        frame = self._decode_frame(batch, kv, self.dtype)
        launch = np.full(len(batch), self._launch["decode"])
        if self.kv_cache_dtype == self.dtype:
            return self._pricer.work(frame, launch)
        fp8 = self._pricer.analytical_of(self._decode_frame(batch, kv, self.kv_cache_dtype))
        return self._pricer.work(frame, launch, fp8)

    def _decode_frame(self, batch: np.ndarray, kv: np.ndarray, dtype: str) -> pd.DataFrame:
        ones = np.ones(len(batch))
        dims = self._attn_dims["decode"]
        return attention_frame("attn_decode", dtype, dims, self.decode_backend, batch, ones, kv)

    # --- time ------------------------------------------------------------------------
    def _args(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any):
        pn = np.asarray(prefill_new)
        pp = np.asarray(prefill_past)
        dc = np.asarray(decode_ctx)
        if pn.ndim != 1 or pp.ndim != 1 or dc.ndim != 1 or pn.size != pp.size:
            raise StepError(
                "prefill_new and prefill_past must be 1-D arrays of equal length and "
                f"decode_ctx 1-D; got shapes {pn.shape}, {pp.shape}, {dc.shape}"
            )
        if pn.size == 0 and dc.size == 0:
            raise StepError("an empty step: give at least one prefill or decode sequence")
        if pn.size and (pn.min() < 1 or pp.min() < 0):
            raise StepError("prefill_new must be >= 1 and prefill_past >= 0 for every sequence")
        if dc.size and dc.min() < 0:
            raise StepError("decode_ctx must be >= 0 for every sequence")
        return pn, pp, dc

    def _prefill_attn(self, pn: np.ndarray, pp: np.ndarray) -> float | None:
        """Per-layer attention work of the prefill chunks (no launch), or None when a
        chunk is outside the grid."""
        if pn.size <= 8:
            return self._prefill_attn_lists(pn.tolist(), pp.tolist())
        g = self._grids
        if pn.max() > g.n_axis[-1] or pp.max() > g.p_axis[-1]:
            return None
        v1 = bilinear(g.n_axis, g.p_axis, g.w1, pn, pp)
        vf = bilinear(g.n_axis, g.p_axis, g.wfill, pn, pp)
        return float(max(vf.sum(), v1.max()))

    def _decode_attn(self, batch: int, ctx_sum: int) -> float | None:
        L = self._grids.lists
        kv = ctx_sum / batch + 1.0
        if batch > L["dec_b"][-1] or kv > L["dec_kv"][-1]:
            return None
        i, wi = bracket(L["dec_b"], batch)
        j, wj = bracket(L["dec_kv"], kv)
        a = L["wdec"]
        r0, r1 = a[i], a[i + 1]
        return (1 - wi) * ((1 - wj) * r0[j] + wj * r0[j + 1]) + wi * (
            (1 - wj) * r1[j] + wj * r1[j + 1]
        )

    def _attention(
        self, pn: np.ndarray, pp: np.ndarray, n_dec: int, ctx_sum: int, exact: bool
    ) -> tuple[float | None, float | None, bool]:
        """(prefill work, decode work, both from the grids) of one layer's attention;
        priced directly when exact or outside the grids. Decode attention depends on the
        decodes' count and context sum only (one launch over the batch at its mean)."""
        n_pre = int(pn.size)
        pre = self._prefill_attn(pn, pp) if n_pre and not exact else None
        dec = self._decode_attn(n_dec, ctx_sum) if n_dec and not exact else None
        in_grid = not exact
        if n_pre and pre is None:
            w1, wf = self._prefill_attention_work(pn, pp)
            pre, in_grid = float(max(wf.sum(), w1.max())), False
        if n_dec and dec is None:
            kv = np.round(np.array([ctx_sum / n_dec + 1.0]))
            dec, in_grid = float(self._decode_attention_work(np.array([n_dec]), kv)[0]), False
        return pre, dec, in_grid

    def _attn_layer_s(self, pre: float | None, dec: float | None, stream: bool) -> float:
        """One layer's attention: the prefill (varlen) and the decode launch each pay a
        kernel floor; the eager engine's cuDNN prefill SDPA adds two memsets (profiler)."""
        floor = STREAM_KERNEL_FLOOR_S if stream else GRAPH_KERNEL_FLOOR_S
        f, idle = self._attn_factors(stream)
        t = 0.0
        if pre is not None:
            t += f * pre + idle * floor * (3 if stream and self.engine == "pytorch-eager" else 1)
        if dec is not None:
            t += f * dec + idle * floor
        return t

    def step_s(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        """Seconds of one iteration (see :mod:`simcli.serving` for the contract)."""
        pn, pp, dc = self._args(prefill_new, prefill_past, decode_ctx)
        return self._evaluate(pn, pp, *_decodes(dc)).total

    def step_ms(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        return 1e3 * self.step_s(prefill_new, prefill_past, decode_ctx)

    def exact_step_s(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        """``step_s`` priced by the cost model at the exact sizes, without the grids (a
        call costs milliseconds; for checking the interpolation)."""
        pn, pp, dc = self._args(prefill_new, prefill_past, decode_ctx)
        return self._evaluate(pn, pp, *_decodes(dc), exact=True).total

    def verify_step_s(self, decode_ctx: Any, k: int) -> float:
        """A speculative-decoding verification step: each sequence scores k + 1 tokens (its
        last accepted token and the k drafts) causally over its ``decode_ctx`` cached tokens
        and gets k + 1 rows of logits; k = 0 is a plain decode step."""
        if not isinstance(k, int | np.integer) or isinstance(k, bool) or k < 0:
            raise StepError(f"k must be a non-negative integer, got {k!r}")
        dc = np.asarray(decode_ctx)
        none = np.zeros(0, np.int64)
        if k == 0:
            return self.step_s(none, none, dc)
        pn, pp, _ = self._args(np.full(dc.size, k + 1), dc, none)
        return self._evaluate(pn, pp, 0, 0, logits_rows=int(dc.size * (k + 1))).total

    def breakdown(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> dict[str, float]:
        """Seconds per op group of one iteration, summed over layers; they add up to
        ``step_s``. ``host_stall``: GPU idle time of an eager step waiting for the host."""
        pn, pp, dc = self._args(prefill_new, prefill_past, decode_ctx)
        ev = self._evaluate(pn, pp, *_decodes(dc), vectors=True)
        out: dict[str, float] = {}
        for t, v, c in zip(self._layer_tpls, ev.tok, self._per_tok, strict=True):
            if t.op:
                out[t.label] = out.get(t.label, 0.0) + float(v * c)
        out["attn"] = self.model.num_layers * ev.attn
        for t, v in zip(self._tpls["seq"], ev.seq, strict=True):
            if v:
                out[t.label] = out.get(t.label, 0.0) + float(v)
        if ev.eager:
            out["host_stall"] = max(0.0, ev.total - sum(out.values()))
        elif ev.total > sum(out.values()):
            # the engine's host work not hidden behind the GPU (serial, or what exceeds the
            # GPU when overlapped) and a host-launched step's launch-bound wait
            out["host"] = ev.total - sum(out.values())
        return out

    def launch_plan(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> dict:
        """How the iteration launches (:meth:`EngineLaunch.describe`)."""
        pn, _, dc = self._args(prefill_new, prefill_past, decode_ctx)
        n = int(pn.size) + int(dc.size)
        return self.launch.describe(self.profile, int(pn.size), n, int(pn.sum()) + int(dc.size))

    def stage_s(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        """The slowest pipeline stage of the iteration (its layers, the embedding on the
        first stage, the final norm and LM head on the last, its send to the next): what
        bounds the rate of a pipelined engine. ``step_s`` when pp = 1."""
        pn, pp, dc = self._args(prefill_new, prefill_past, decode_ctx)
        if self.pp == 1:
            return self._evaluate(pn, pp, *_decodes(dc)).total
        ev = self._evaluate(pn, pp, *_decodes(dc), vectors=True)
        n_head, n_layer = len(self._tpls["head"]), len(self._tpls["layer"])
        cost = ev.tok * self._per_tok
        layer_s = float(cost[n_head : n_head + n_layer].sum()) / self.model.num_layers + ev.attn
        head_s = float(cost[:n_head].sum())
        send_s = tail_s = 0.0
        for t, c in zip(
            self._layer_tpls[n_head + n_layer :], cost[n_head + n_layer :], strict=True
        ):
            if t.name == "pp_send_recv":
                send_s = float(c) / t.count
            else:
                tail_s += float(c)
        tail_s += float(ev.seq.sum())
        stages = []
        for i, n in enumerate(self.stage_layers()):
            t = n * layer_s + (head_s if i == 0 else 0.0)
            stages.append(t + (tail_s if i == self.pp - 1 else send_s))
        return max(stages)

    def _evaluate(
        self,
        pn: np.ndarray,
        pp: np.ndarray,
        n_dec: int,
        ctx_sum: int,
        *,
        logits_rows: int | None = None,
        exact: bool = False,
        vectors: bool = False,
    ) -> _Eval:
        """One iteration: prefill chunks ``pn`` over ``pp`` cached tokens, ``n_dec``
        decodes over ``ctx_sum`` cached tokens in all."""
        n_pre = int(pn.size)
        T = (int(pn.sum()) if n_pre else 0) + n_dec
        S = logits_rows if logits_rows is not None else n_pre + n_dec
        g = self._grids
        eager = self.engine == "pytorch-eager" and n_pre > 0
        ctx, Tg, attn_stream = self.launch.plan(n_pre, T)
        pre, dec, attn_in_grid = self._attention(pn, pp, n_dec, ctx_sum, exact)
        in_grid = attn_in_grid and g.tok_x[-1] >= Tg and g.seq_x[-1] >= S
        attn = self._attn_layer_s(pre, dec, attn_stream)
        layers = self.model.num_layers
        if not (vectors or eager) and in_grid:
            gpu = self._grid_total_s(Tg, S, n_dec > 0, ctx) + layers * attn
            return _Eval(self._finish(gpu, ctx, T, S, n_pre, n_dec), attn)
        tok_v, seq_v = self._vectors(Tg, S, ctx, in_grid)
        keep = self._seq_keep_dec if n_dec else self._seq_keep
        seq_v = np.where(keep, seq_v * self._per_seq, 0.0)
        if eager:
            total = self._launch_queue(tok_v, seq_v[keep], attn, EAGER_HOST_DISPATCH_S)
        else:
            gpu = float((tok_v * self._per_tok).sum() + seq_v.sum()) + layers * attn
            total = self._finish(gpu, ctx, T, S, n_pre, n_dec)
        return _Eval(total, attn, tok_v, seq_v, eager)

    def _launch_queue(
        self, tok_v: np.ndarray, tail: np.ndarray, attn: float, host_s: float
    ) -> float:
        """The eager engine's step: its torch calls in order through `launch_queue_s`."""
        n_head = len(self._tpls["head"])
        layer = tok_v[n_head : n_head + len(self._tpls["layer"])].copy()
        layer[self._attn_pos - n_head] = attn
        return launch_queue_s(host_s, tok_v[:n_head], layer, self.model.num_layers, tail)

    def eager_stream_s(
        self,
        prefill_new: Any,
        prefill_past: Any,
        decode_ctx: Any,
        host_s: float = EAGER_HOST_DISPATCH_S,
    ) -> float:
        """The eager engine's step with every kernel launched from the host (no graph),
        decode included: what the eager-decode rows measured."""
        if self.engine != "pytorch-eager":
            raise StepError("eager_stream_s is for engine pytorch-eager")
        pn, pp, dc = self._args(prefill_new, prefill_past, decode_ctx)
        n_pre, n_dec = int(pn.size), int(dc.size)
        T = (int(pn.sum()) if n_pre else 0) + n_dec
        S = n_pre + n_dec
        pre, dec, _ = self._attention(pn, pp, n_dec, int(dc.sum()), False)
        attn = self._attn_layer_s(pre, dec, True)
        g = self._grids
        tok_v, seq_v = self._vectors(T, S, "stream", g.tok_x[-1] >= T and g.seq_x[-1] >= S)
        keep = self._seq_keep_dec if n_dec else self._seq_keep
        return self._launch_queue(tok_v, seq_v[keep], attn, host_s)

    def _vectors(self, T: int, S: int, ctx: str, in_grid: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per-instance seconds of every token and sequence template at T and S."""
        g = self._grids
        if in_grid:
            i, w = bracket(g.lists["tok_x"], T)
            a = g.tok[ctx]
            tok = a[:, i] + w * (a[:, i + 1] - a[:, i])
            i, w = bracket(g.lists["seq_x"], S)
            a = g.seq[ctx]
            return tok, a[:, i] + w * (a[:, i + 1] - a[:, i])
        tok = self._price(self._layer_tpls, np.array([max(T, 1)]))[ctx][:, 0]
        seq = self._price(self._tpls["seq"], np.array([max(S, 1)]))[ctx][:, 0]
        return tok, seq


@lru_cache(maxsize=16)
def _default_cost_model(gpu_id: str, profile: str | None, num_gpus: int) -> Any:
    return get_cost_model(gpu_id, profile=profile, num_gpus=num_gpus)
