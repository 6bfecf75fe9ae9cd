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

**Engines.**

- ``vllm`` (the target engine): fused kernels as in vLLM's Llama (fused residual-add +
  RMSNorm, fused QKV and gate-up GEMMs, in-place rotary, ``reshape_and_cache``,
  ``silu_and_mul``), flash attention over a paged KV cache, every step replayed from CUDA
  graphs: no host time, but each kernel costs at least :data:`GRAPH_KERNEL_FLOOR_S`.
- ``pytorch-eager``: the plain PyTorch model measured by ``calibrate/steps/serve_step.py``
  (Llama-style, one GPU): RMSNorm, RoPE and SiLU-mul as the eager kernels the script runs
  (each an HBM pass priced as a ``copy`` of its traffic, like
  :func:`costmodels.steps.training.eager_extra_ops` but forward-only with bf16 weights), cuDNN
  attention (what SDPA picked on the H100). Decode is replayed from a CUDA graph; prefill
  runs eagerly, so each of its ~1,260 torch calls costs the host
  :data:`EAGER_HOST_DISPATCH_S` and host and GPU are combined by a launch-queue recurrence
  (see :func:`launch_queue_s`).

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

**Simplifications.**

- Attention of several prefill chunks is one varlen launch taking the longer of the sum
  of each sequence's share of a GPU-filling batch (:data:`FILL_WAVES` waves of CTAs) and
  the longest sequence alone; decodes are a second launch priced at their mean context
  (their KV traffic is exact, the split-KV walk of the longest sequence is not). vLLM V1
  runs both in one varlen call.
- ``vllm``: no host or scheduler time and every kernel in a graph (V1 runs attention
  outside its piecewise graphs; kernels of large steps are long enough to hide launches);
  MoE routing is perfectly balanced and each active expert a separate GEMM; sampling is
  one softmax over the vocabulary per sequence.
- ``pytorch-eager``: Llama-style dense models on one GPU only; its host constant is a
  property of the measuring VM's CPU and PyTorch version.
- Memory: the non-torch, graph-pool and activation terms follow vLLM's profile of
  Llama-3-8B on an H100 (see the constants); the activation term scales with the model.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodels.ops.select import get_cost_model
from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose import OpTemplate, params_per_tp_rank, serving_templates, tp_shard
from workloads.decompose.serving import total_instances
from workloads.models import ModelConfig, load_model
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, normalise_frame

GIB = 1024**3
ENGINES = ("vllm", "pytorch-eager")
ROOT = Path(__file__).resolve().parents[2]
STEPS_DIR = ROOT / "calibrate" / "data" / "steps-h100"
SERVE_STEP_CSV = STEPS_DIR / "serve_step.csv"
EAGER_DECODE_CSV = STEPS_DIR / "eager-decode" / "serve_step_eager.csv"

# --- launch costs -------------------------------------------------------------------------
# The cost model's op times come from microbenchmarks timed one call at a time with CUDA
# events (calibrate/bench/common.py), so each carries the fitted per-call `launch_s`. A
# kernel queued behind other kernels, or replayed from a CUDA graph, pays a smaller GPU-side
# floor instead; the launch is swapped for that floor (see `_Pricer.work`). Neither floor
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
# Host time per dispatched torch call of the eager engine: the median over the six eager
# (not graph) decode steps in calibrate/data/steps-h100/eager-decode, each solved for the
# constant that makes `launch_queue_s` reproduce its measured time (host-bound steps:
# 21.5-27.9 ms for 1,259 calls). Re-derive with `derive_host_dispatch_s()`; the prefill rows
# it is validated on are not used. The spread (16.7-21.8 us) is drift of the VM's host
# speed within one session; the median is robust to it. It is a property of the host CPU
# and the PyTorch version, not of the GPU: on a later H100 lease whose host was faster,
# eager decode and eager prefill 1x512 timed alternately took the same host time per step
# (15.0 ms each, ~11.9 us per call).
EAGER_HOST_DISPATCH_S = 20.93e-6

# --- memory -------------------------------------------------------------------------------
# vLLM's profile of Llama-3-8B on one H100 at gpu_memory_utilization 0.9 (vllm-project/vllm
# PR #10511, 2024-12): total 79.22 GiB, weights 14.96 GiB, non-torch memory (CUDA context,
# cuBLAS workspaces) 1.79 GiB at tp=1 and 3.58 GiB at tp=2 (NCCL and custom all-reduce
# buffers), activation peak 1.26 GiB, KV cache 53.29 GiB.
NON_TORCH_BYTES = 1.79 * GIB
NON_TORCH_MULTI_GPU_BYTES = 3.58 * GIB
# CUDA graph pools: Llama-3.2-1B (16 layers) "Graph capturing finished in 14 secs, took
# 0.21 GiB" (vllm-project/vllm PR #11349 log); scaled by layers on the GPU.
GRAPH_POOL_BYTES_PER_LAYER = 0.21 * GIB / 16
DEFAULT_MAX_BATCHED_TOKENS = 8192  # vLLM's profile run size for an 8k context
DEFAULT_MAX_SEQS = 256  # vLLM's default max_num_seqs

# --- grids ----------------------------------------------------------------------------------
TOKEN_GRID_MAX = 131072
SEQ_GRID_MAX = 16384
ATTN_GRID_MAX = 131072
DECODE_BATCH_MAX = 4096
FILL_WAVES = 8  # CTA waves that make a varlen attention launch throughput-bound


class StepError(ValueError):
    """A step-model input that cannot be priced; the message is one line for users."""


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


# --------------------------------------------------------------------------- pricing


_NUMERIC = (
    "m",
    "n",
    "k",
    "batch",
    "seq_q",
    "seq_kv",
    "heads_q",
    "heads_kv",
    "head_dim",
    "density",
    "block_size",
    "bytes",
    "ranks",
    "nodes",
)


def _frame_of(
    tpls: Sequence[OpTemplate], x: np.ndarray, dtype: str, strided_scale: float = 1.0
) -> pd.DataFrame:
    """An ops frame with every template at every x (template-major rows)."""
    n, k = len(x), len(tpls)
    num = {c: np.full(k * n, np.nan) for c in _NUMERIC}
    op = np.empty(k * n, dtype=object)
    dt = np.full(k * n, dtype, dtype=object)
    for idx, t in enumerate(tpls):
        sl = slice(idx * n, (idx + 1) * n)
        op[sl] = t.op
        for c, v in t.fields_at(x, strided_scale).items():
            if c == "dtype":
                dt[sl] = v
            elif v is not None:
                num[c][sl] = v
    cols: dict[str, Any] = {"op": op, "dtype": dt, **num}
    cols["causal"] = np.zeros(k * n, dtype=bool)
    cols["backend"] = np.full(k * n, "", dtype=object)
    return normalise_frame(pd.DataFrame(cols).reindex(columns=[*CSV_COLUMNS, *EXTRA_COLUMNS]))


@dataclass
class _Pricer:
    """Prices op rows with the cost model and swaps the fitted launch cost for a floor."""

    cost_model: Any
    launch_s: dict[str, float]
    dtype: str
    strided_scale: float = 1.0  # bytes multiplier of strided eager kernels

    def __post_init__(self) -> None:
        self.analytical = getattr(self.cost_model, "base", self.cost_model)

    def work(self, frame: pd.DataFrame, launch: np.ndarray) -> np.ndarray:
        """Seconds per row with the launch removed: ``t * (t_an - launch) / t_an`` (the
        learned correction scales the analytical time; keep its ratio on the rest)."""
        t = np.asarray(self.cost_model.predict_many(frame, validated=True), dtype=float)
        if self.analytical is self.cost_model:
            ta = t
        else:
            ta = np.asarray(self.analytical.predict_many(frame, validated=True), dtype=float)
        return t * np.maximum(ta - launch, 0.0) / np.maximum(ta, 1e-30)

    def templates(self, tpls: Sequence[OpTemplate], x: np.ndarray) -> np.ndarray:
        """[len(tpls), len(x)] seconds of work per template instance (MoE: x active)."""
        real = [t for t in tpls if t.op]
        out = np.zeros((len(tpls), len(x)))
        if not real:
            return out
        frame = _frame_of(real, x, self.dtype, self.strided_scale)
        launch = np.repeat([self.launch_s[t.launch] for t in real], len(x))
        w = self.work(frame, launch).reshape(len(real), len(x))
        j = 0
        for i, t in enumerate(tpls):
            if not t.op:
                continue
            out[i] = w[j] * t.instances_at(x)
            j += 1
        return out


def _int_grid(hi: int, dense: int = 256, aligned: int = 16384) -> np.ndarray:
    """Every integer to ``dense``, both sides of each multiple of 64 to ``aligned`` (GEMM
    tiles step there), then 1% apart; exact interpolation where the time is piecewise
    linear between multiples of 64."""
    hi = max(int(hi), dense + 1)
    a = np.arange(1, dense + 1)
    top = min(aligned, hi)
    b = np.arange(64 * (dense // 64), top + 64, 64)
    parts = [a, b, b + 1]
    if hi > aligned:
        parts.append(np.round(np.geomspace(aligned, hi, int(math.log(hi / aligned) / 0.01) + 2)))
    g = np.unique(np.concatenate(parts).astype(np.int64))
    return g[g <= max(hi, dense)]


def _attn_axis(hi: int, zero: bool = False) -> np.ndarray:
    """Attention lengths: integers to 16, multiples of 64 (and +1) to 2048 (128-key blocks
    step there), then 4% apart."""
    parts = [np.arange(1, 17), np.arange(64, 2049, 64), np.arange(65, 2049, 64)]
    parts.append(np.round(np.geomspace(2048, hi, int(math.log(hi / 2048) / 0.04) + 2)))
    if zero:
        parts.append(np.array([0]))
    g = np.unique(np.concatenate(parts).astype(np.int64))
    return g[g <= hi]


def _decode_axes(b_hi: int, kv_hi: int) -> tuple[np.ndarray, np.ndarray]:
    b = np.unique(np.concatenate([np.arange(1, 65), np.round(np.geomspace(64, b_hi, 120))]))
    kv = np.unique(
        np.concatenate([np.arange(1, 33), np.round(np.geomspace(32, kv_hi, 260))])
    ).astype(np.int64)
    return b.astype(np.int64), kv


def _bracket(grid: list, x: float) -> tuple[int, float]:
    """Index i and weight w with x = (1 - w) grid[i] + w grid[i + 1] (x inside the grid)."""
    i = bisect_right(grid, x) - 1
    if i >= len(grid) - 1:
        i = len(grid) - 2
    g0 = grid[i]
    return i, (x - g0) / (grid[i + 1] - g0)


def launch_queue_s(
    host_s: float,
    head: np.ndarray,
    layer: np.ndarray,
    layers: int,
    tail: np.ndarray,
) -> float:
    """GPU finish time of a stream of kernels that the host dispatches one per ``host_s``.

    Kernel k (1-based) can start when the host has dispatched it (``k * host_s``) and the
    previous kernel has finished: ``end_k = max(k c, end_{k-1}) + g_k``, whose closed form is
    ``end_N = max_k (k c + sum_{i >= k} g_i)`` (the max-plus form of a single-server queue
    with deterministic arrivals, e.g. Baccelli et al. 1992, ch. 1). With ``layers``
    identical copies of ``layer`` between ``head`` and ``tail``, the maximum over the layers
    is at the first (GPU-bound: ``G_layer >= m c``) or the last (host-bound) copy, so the
    cost is O(ops per layer). Neither ``max(host, gpu)`` nor their sum: host-bound stretches
    (many small kernels) and GPU-bound ones (big GEMMs) within a layer do not cancel.
    """
    c = host_s

    def best(g: np.ndarray) -> float:  # max_q (q c + sum_{i >= q} g_i), q = 1..len(g)
        if len(g) == 0:
            return -math.inf
        suf = np.cumsum(g[::-1])[::-1]
        return float(np.max(np.arange(1, len(g) + 1) * c + suf))

    a, m = len(head), len(layer)
    g_layer, g_tail = float(layer.sum()), float(tail.sum())
    terms = [best(head) + layers * g_layer + g_tail]
    if layers > 0:
        terms.append(a * c + best(layer) + (layers - 1) * max(m * c, g_layer) + g_tail)
    terms.append((a + layers * m) * c + best(tail))
    return max(terms)


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
    lists: dict[str, Any] = field(default_factory=dict)


class StepModel:
    """Seconds of one engine iteration on one replica (see the module docstring).

    ``model``: a :class:`ModelConfig`, a built-in id or a config.json path. ``engine``:
    ``vllm`` or ``pytorch-eager``. ``attn_backend``: the attention kernels (default
    ``flash`` for vllm, ``cudnn`` for pytorch-eager, what PyTorch's SDPA picked on the
    H100). ``max_num_batched_tokens`` / ``max_num_seqs`` size the activation workspace of
    :meth:`kv_capacity_tokens`.
    """

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
        kv_cache_dtype: str | None = None,
        max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
        max_num_seqs: int = DEFAULT_MAX_SEQS,
        cost_model: Any = None,
        profile: str | Path | None = None,
    ) -> None:
        self.model = model if isinstance(model, ModelConfig) else load_model(model)
        if engine not in ENGINES:
            raise StepError(f"unknown engine {engine!r}; allowed: {', '.join(ENGINES)}")
        for name, v in (
            ("pp", pp),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_num_seqs", max_num_seqs),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise StepError(f"{name} must be a positive integer, got {v!r}")
        shard = tp_shard(self.model, tp)  # one-line ModelError for a bad tp
        m = self.model
        if pp > m.num_layers:
            raise StepError(f"pp={pp} exceeds the {m.num_layers} layers of {m.id}")
        if dtype not in ("bf16", "fp16"):
            raise StepError(f"dtype {dtype!r} not supported; allowed: bf16, fp16")
        kv_dt = kv_cache_dtype or dtype
        if kv_dt not in ("bf16", "fp16", "fp8"):
            raise StepError(f"kv_cache_dtype {kv_dt!r}; allowed: bf16, fp16, fp8")
        if engine == "pytorch-eager":
            if tp != 1 or pp != 1:
                raise StepError(
                    f"engine pytorch-eager is the single-GPU plain PyTorch model; got tp={tp}, "
                    f"pp={pp}; allowed: tp=1, pp=1 (use --engine vllm for parallel serving)"
                )
            if not (
                m.norm == "rmsnorm"
                and m.position == "rope"
                and m.activation == "swiglu"
                and not m.is_moe
            ):
                raise StepError(
                    f"engine pytorch-eager models dense Llama-style models (RMSNorm, RoPE, "
                    f"SwiGLU); {m.id} is not one; allowed: --engine vllm"
                )
        self.engine, self.tp, self.pp, self.dtype = engine, tp, pp, dtype
        self.kv_cache_dtype = kv_dt
        self.attn_backend = attn_backend or ("cudnn" if engine == "pytorch-eager" else "flash")
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        self.gpu_id = gpu_id
        if cost_model is None:
            cost_model = _default_cost_model(gpu_id, str(profile) if profile else None, tp * pp)
        self.cost_model = cost_model
        system = cost_model.system
        self.gpu = system.gpu
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
        params = getattr(getattr(cost_model, "base", cost_model), "params", None)
        self._launch = _launch_costs(params, self.attn_backend)
        self.label = getattr(cost_model, "label", type(cost_model).__name__)
        self._check_weights_fit()
        tpls = serving_templates(
            m, shard, engine, dtype, pp=pp, tp_nodes=self.shape.tp_nodes,
            pp_nodes=self.shape.pp_nodes,
        )  # fmt: skip
        self._tpls = tpls
        self._layer_tpls = tpls["head"] + tpls["layer"] + tpls["tail"]
        attn = next(i for i, t in enumerate(tpls["layer"]) if t.is_attention)
        self._attn_pos = len(tpls["head"]) + attn
        self._pricer = _Pricer(cost_model, self._launch, dtype, _strided_scale(params))
        self._grids = self._build_grids()
        dec_only = np.array([t.decode_only for t in tpls["seq"]], dtype=bool)
        self._seq_keep, self._seq_keep_dec = ~dec_only, np.ones(len(dec_only), dtype=bool)
        self._per_tok = self._per_step(self._layer_tpls)
        self._per_seq = self._per_step(tpls["seq"])

    # --- construction ----------------------------------------------------------------
    def _per_step(self, tpls: Sequence[OpTemplate]) -> np.ndarray:
        layers = self.model.num_layers
        return np.array([t.count * (layers if t.per_layer else 1) for t in tpls], dtype=float)

    def _contexts(self) -> dict[str, float]:
        """Launch contexts and their per-kernel floor: graph replay (vllm, eager decode)
        and eager stream launch (the eager engine's prefill)."""
        if self.engine == "pytorch-eager":
            return {"graph": GRAPH_KERNEL_FLOOR_S, "stream": STREAM_KERNEL_FLOOR_S}
        return {"graph": GRAPH_KERNEL_FLOOR_S}

    def _price(self, tpls: Sequence[OpTemplate], x: np.ndarray) -> dict[str, np.ndarray]:
        """Per-instance seconds of each template at x, for each launch context."""
        work = self._pricer.templates(tpls, x)
        inst = total_instances(tpls, x)
        return {ctx: work + floor * inst for ctx, floor in self._contexts().items()}

    def _build_grids(self) -> _Grids:
        key = (
            self.model.model_dump_json(),
            self.gpu_id,
            self.tp,
            self.pp,
            self.engine,
            self.attn_backend,
            self.dtype,
            self.label,
            id(self.cost_model),
        )
        cached = _GRID_CACHE.get(key)
        if cached is not None and cached[0] is self.cost_model:
            return cached[1]
        tok_x = _int_grid(TOKEN_GRID_MAX)
        seq_x = _int_grid(SEQ_GRID_MAX)
        # running maxima: the learned corrections wiggle by <0.01% in places; a step never
        # gets faster with more tokens or keys
        tok = {c: _monotone(v, 1) for c, v in self._price(self._layer_tpls, tok_x).items()}
        seq = {c: _monotone(v, 1) for c, v in self._price(self._tpls["seq"], seq_x).items()}
        w_tok = self._per_step(self._layer_tpls)[:, None]
        w_seq = self._per_step(self._tpls["seq"])[:, None]
        dec_only = np.array([t.decode_only for t in self._tpls["seq"]])[:, None]
        n_axis = _attn_axis(ATTN_GRID_MAX)
        p_axis = _attn_axis(ATTN_GRID_MAX, zero=True)
        w1, wfill = (_monotone(a, 0, 1) for a in self._prefill_attention_grid(n_axis, p_axis))
        dec_b, dec_kv = _decode_axes(DECODE_BATCH_MAX, ATTN_GRID_MAX + 1)
        wdec = self._decode_attention_work(
            np.repeat(dec_b, len(dec_kv)), np.tile(dec_kv, len(dec_b))
        ).reshape(len(dec_b), len(dec_kv))
        wdec = _monotone(wdec, 0, 1)
        g = _Grids(
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
        s = self.shape
        size = len(n)
        return normalise_frame(
            pd.DataFrame(
                {
                    "op": "attn_fwd",
                    "dtype": self.dtype,
                    "batch": batch.astype(np.int64),
                    "seq_q": n.astype(np.int64),
                    "seq_kv": (n + p).astype(np.int64),
                    "heads_q": np.full(size, s.hq),
                    "heads_kv": np.full(size, s.hkv),
                    "head_dim": np.full(size, self.model.head_dim),
                    "causal": np.ones(size, dtype=bool),
                    "backend": self.attn_backend,
                }
            ).reindex(columns=[*CSV_COLUMNS, *EXTRA_COLUMNS])
        )

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
        s = self.shape
        size = len(batch)
        frame = normalise_frame(
            pd.DataFrame(
                {
                    "op": "attn_decode",
                    "dtype": self.dtype,
                    "batch": np.asarray(batch, dtype=np.int64),
                    "seq_q": np.ones(size, dtype=np.int64),
                    "seq_kv": np.asarray(kv, dtype=np.int64),
                    "heads_q": np.full(size, s.hq),
                    "heads_kv": np.full(size, s.hkv),
                    "head_dim": np.full(size, self.model.head_dim),
                    "backend": self.attn_backend,
                }
            ).reindex(columns=[*CSV_COLUMNS, *EXTRA_COLUMNS])
        )
        return self._pricer.work(frame, np.full(size, self._launch["decode"]))

    def _check_weights_fit(self) -> None:
        cap = self.gpu.memory_bytes
        for stage in range(self.pp):
            need = self.weight_bytes_per_gpu(stage) + self._non_torch_bytes()
            if need > cap:
                raise StepError(
                    f"{self.model.id} does not fit on {self.gpu.id} at tp={self.tp}, "
                    f"pp={self.pp}: weights {self.weight_bytes_per_gpu(stage) / GIB:.1f} GiB "
                    f"+ runtime {self._non_torch_bytes() / GIB:.2f} GiB per GPU > "
                    f"{cap / GIB:.1f} GiB; allowed: a larger --tp or --pp, or a bigger GPU"
                )

    # --- memory ----------------------------------------------------------------------
    def stage_layers(self) -> list[int]:
        """Layers per pipeline stage, as vLLM splits them (``get_pp_indices``: the
        remainder goes to the stages before the last, which also holds the LM head)."""
        base = [self.model.num_layers // self.pp] * self.pp
        for i in range(2, self.model.num_layers % self.pp + 2):
            base[-i] += 1
        return base

    def weight_bytes_per_gpu(self, stage: int = 0) -> float:
        p = params_per_tp_rank(self.model, self.tp)
        n = p["layer"] * self.stage_layers()[stage]
        if stage == 0:
            n += p["embedding"]
        if stage == self.pp - 1:
            head = p["lm_head"] or (p["embedding"] if self.pp > 1 else 0)  # tied: own copy
            n += head + p["final_norm"]
        return float(n * DTYPE_BYTES[Dtype(self.dtype)])

    def _non_torch_bytes(self) -> float:
        return NON_TORCH_BYTES if self.tp * self.pp == 1 else NON_TORCH_MULTI_GPU_BYTES

    def activation_bytes(self) -> float:
        """Peak activation workspace of a ``max_num_batched_tokens`` profile run: the
        largest live set of one layer (QKV out, gate-up out, its activation, two hidden
        buffers; bf16) plus fp32 logits, probabilities and log-probabilities of
        ``max_num_seqs`` sequences over the full vocabulary. For Llama-3-8B at 8192
        tokens: 1.24 GiB (vLLM profiled 1.26 GiB, PR #10511)."""
        s, m = self.shape, self.model
        up = (2 if m.activation == "swiglu" else 1) * s.ffn
        per_token = s.elt * ((s.hq + 2 * s.hkv) * m.head_dim + up + s.ffn + 2 * m.hidden_size)
        logits = self.max_num_seqs * m.vocab_size * 4.0 * 3
        return float(self.max_num_batched_tokens * per_token + logits)

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token on one replica: all layers, every TP rank's heads (a KV
        head replicated over ranks when tp > num_kv_heads counts on each)."""
        kv_elt = DTYPE_BYTES[Dtype(self.kv_cache_dtype)]
        heads = self.shape.hkv * self.tp
        return float(2 * self.model.num_layers * heads * self.model.head_dim * kv_elt)

    def kv_bytes_per_token_per_gpu(self, stage: int = 0) -> float:
        kv_elt = DTYPE_BYTES[Dtype(self.kv_cache_dtype)]
        layers = self.stage_layers()[stage]
        return float(2 * layers * self.shape.hkv * self.model.head_dim * kv_elt)

    def memory_bytes_per_gpu(
        self, gpu_memory_utilization: float = 0.9, stage: int = 0
    ) -> dict[str, float]:
        """Where one GPU's memory goes (vLLM's ``determine_available_memory``)."""
        budget = self.gpu.memory_bytes * gpu_memory_utilization
        graphs = GRAPH_POOL_BYTES_PER_LAYER * self.stage_layers()[stage]
        parts = {
            "budget": budget,
            "weights": self.weight_bytes_per_gpu(stage),
            "activations": self.activation_bytes(),
            "non_torch": self._non_torch_bytes(),
            "cuda_graphs": graphs,
        }
        parts["kv_cache"] = budget - sum(v for k, v in parts.items() if k != "budget")
        return parts

    def kv_capacity_tokens(self, block_size: int = 16, gpu_memory_utilization: float = 0.9) -> int:
        """Tokens of KV cache one replica holds: (memory x utilisation - weights -
        activation workspace - non-torch memory - CUDA graph pools) / KV bytes per token on
        the fullest GPU, rounded down to whole blocks."""
        if not isinstance(block_size, int | np.integer) or block_size < 1:
            raise StepError(f"block_size must be a positive integer, got {block_size!r}")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise StepError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}"
            )
        tokens = math.inf
        for stage in range(self.pp):
            mem = self.memory_bytes_per_gpu(gpu_memory_utilization, stage)
            per_tok = self.kv_bytes_per_token_per_gpu(stage)
            if mem["kv_cache"] < per_tok * block_size:
                used = mem["budget"] - mem["kv_cache"]
                raise StepError(
                    f"{self.model.id} leaves no room for a KV block on {self.gpu.id} at "
                    f"tp={self.tp}, pp={self.pp}: weights, activations and runtime take "
                    f"{used / GIB:.1f} GiB of {mem['budget'] / GIB:.1f} GiB "
                    f"({gpu_memory_utilization:g} x {self.gpu.memory_gib} GiB); allowed: a "
                    "larger --tp or --pp, a bigger GPU or a higher gpu_memory_utilization"
                )
            tokens = min(tokens, mem["kv_cache"] / per_tok)
        return int(tokens // block_size) * int(block_size)

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
        L = self._grids.lists
        n_hi, p_hi = L["n"][-1], L["p"][-1]
        if pn.size <= 8:
            tot = 0.0
            top = 0.0
            for n, p in zip(pn.tolist(), pp.tolist(), strict=True):
                if n > n_hi or p > p_hi:
                    return None
                i, wi = _bracket(L["n"], n)
                j, wj = _bracket(L["p"], p)
                a1, af = L["w1"], L["wfill"]
                r0, r1 = a1[i], a1[i + 1]
                v1 = (1 - wi) * ((1 - wj) * r0[j] + wj * r0[j + 1]) + wi * (
                    (1 - wj) * r1[j] + wj * r1[j + 1]
                )
                r0, r1 = af[i], af[i + 1]
                vf = (1 - wi) * ((1 - wj) * r0[j] + wj * r0[j + 1]) + wi * (
                    (1 - wj) * r1[j] + wj * r1[j + 1]
                )
                tot += vf
                top = max(top, v1)
            return max(tot, top)
        g = self._grids
        if pn.max() > n_hi or pp.max() > p_hi:
            return None
        v1 = _bilinear(g.n_axis, g.p_axis, g.w1, pn, pp)
        vf = _bilinear(g.n_axis, g.p_axis, g.wfill, pn, pp)
        return float(max(vf.sum(), v1.max()))

    def _decode_attn(self, batch: int, ctx_sum: int) -> float | None:
        L = self._grids.lists
        kv = ctx_sum / batch + 1.0
        if batch > L["dec_b"][-1] or kv > L["dec_kv"][-1]:
            return None
        i, wi = _bracket(L["dec_b"], batch)
        j, wj = _bracket(L["dec_kv"], kv)
        a = L["wdec"]
        r0, r1 = a[i], a[i + 1]
        return (1 - wi) * ((1 - wj) * r0[j] + wj * r0[j + 1]) + wi * (
            (1 - wj) * r1[j] + wj * r1[j + 1]
        )

    def _attention(
        self, pn: np.ndarray, pp: np.ndarray, dc: np.ndarray, exact: bool
    ) -> tuple[float | None, float | None, bool]:
        """(prefill work, decode work, both from the grids) of one layer's attention;
        priced directly when exact or outside the grids."""
        n_pre, n_dec = int(pn.size), int(dc.size)
        pre = self._prefill_attn(pn, pp) if n_pre and not exact else None
        dec = self._decode_attn(n_dec, int(dc.sum())) if n_dec and not exact else None
        in_grid = not exact
        if n_pre and pre is None:
            w1, wf = self._prefill_attention_work(pn, pp)
            pre, in_grid = float(max(wf.sum(), w1.max())), False
        if n_dec and dec is None:
            kv = np.round(np.array([int(dc.sum()) / n_dec + 1.0]))
            dec, in_grid = float(self._decode_attention_work(np.array([n_dec]), kv)[0]), False
        return pre, dec, in_grid

    def _attn_layer_s(self, pre: float | None, dec: float | None, stream: bool) -> float:
        """One layer's attention: the prefill (varlen) and the decode launch each pay a
        kernel floor; the eager engine's cuDNN prefill SDPA adds two memsets (profiler)."""
        floor = STREAM_KERNEL_FLOOR_S if stream else GRAPH_KERNEL_FLOOR_S
        t = 0.0
        if pre is not None:
            t += pre + floor * (3 if stream and self.engine == "pytorch-eager" else 1)
        if dec is not None:
            t += dec + floor
        return t

    def step_s(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        """Seconds of one iteration (see :mod:`simcli.serving` for the contract)."""
        pn, pp, dc = self._args(prefill_new, prefill_past, decode_ctx)
        return self._evaluate(pn, pp, dc).total

    def step_ms(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        return 1e3 * self.step_s(prefill_new, prefill_past, decode_ctx)

    def exact_step_s(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        """``step_s`` priced by the cost model at the exact sizes, without the grids (a
        call costs milliseconds; for checking the interpolation)."""
        pn, pp, dc = self._args(prefill_new, prefill_past, decode_ctx)
        return self._evaluate(pn, pp, dc, exact=True).total

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
        return self._evaluate(pn, pp, none, logits_rows=int(dc.size * (k + 1))).total

    def breakdown(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> dict[str, float]:
        """Seconds per op group of one iteration, summed over layers; they add up to
        ``step_s``. ``host_stall``: GPU idle time of an eager step waiting for the host."""
        pn, pp, dc = self._args(prefill_new, prefill_past, decode_ctx)
        ev = self._evaluate(pn, pp, dc, vectors=True)
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
        return out

    def stage_s(self, prefill_new: Any, prefill_past: Any, decode_ctx: Any) -> float:
        """The slowest pipeline stage of the iteration (its layers, the embedding on the
        first stage, the final norm and LM head on the last, its send to the next): what
        bounds the rate of a pipelined engine. ``step_s`` when pp = 1."""
        pn, pp, dc = self._args(prefill_new, prefill_past, decode_ctx)
        if self.pp == 1:
            return self._evaluate(pn, pp, dc).total
        ev = self._evaluate(pn, pp, dc, vectors=True)
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
        dc: np.ndarray,
        *,
        logits_rows: int | None = None,
        exact: bool = False,
        vectors: bool = False,
    ) -> _Eval:
        n_pre, n_dec = int(pn.size), int(dc.size)
        T = (int(pn.sum()) if n_pre else 0) + n_dec
        S = logits_rows if logits_rows is not None else n_pre + n_dec
        g = self._grids
        eager = self.engine == "pytorch-eager" and n_pre > 0
        ctx = "stream" if eager else "graph"
        pre, dec, attn_in_grid = self._attention(pn, pp, dc, exact)
        in_grid = attn_in_grid and g.tok_x[-1] >= T and g.seq_x[-1] >= S
        attn = self._attn_layer_s(pre, dec, eager)
        layers = self.model.num_layers
        if not (vectors or eager) and in_grid:
            # the fast path: per-step totals interpolated on the token and sequence grids
            i, w = _bracket(g.lists["tok_x"], T)
            tt = g.tok_total[ctx]
            tok = tt[i] + w * (tt[i + 1] - tt[i])
            i, w = _bracket(g.lists["seq_x"], S)
            st = (g.seq_total_dec if n_dec else g.seq_total)[ctx]
            return _Eval(tok + st[i] + w * (st[i + 1] - st[i]) + layers * attn, attn)
        tok_v, seq_v = self._vectors(T, S, ctx, in_grid)
        keep = self._seq_keep_dec if n_dec else self._seq_keep
        seq_v = np.where(keep, seq_v * self._per_seq, 0.0)
        if eager:
            total = self._launch_queue(tok_v, seq_v[keep], attn, EAGER_HOST_DISPATCH_S)
        else:
            total = float((tok_v * self._per_tok).sum() + seq_v.sum()) + layers * attn
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
        pre, dec, _ = self._attention(pn, pp, dc, False)
        attn = self._attn_layer_s(pre, dec, True)
        g = self._grids
        tok_v, seq_v = self._vectors(T, S, "stream", g.tok_x[-1] >= T and g.seq_x[-1] >= S)
        keep = self._seq_keep_dec if n_dec else self._seq_keep
        return self._launch_queue(tok_v, seq_v[keep], attn, host_s)

    def _vectors(self, T: int, S: int, ctx: str, in_grid: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per-instance seconds of every token and sequence template at T and S."""
        g = self._grids
        if in_grid:
            i, w = _bracket(g.lists["tok_x"], T)
            a = g.tok[ctx]
            tok = a[:, i] + w * (a[:, i + 1] - a[:, i])
            i, w = _bracket(g.lists["seq_x"], S)
            a = g.seq[ctx]
            return tok, a[:, i] + w * (a[:, i + 1] - a[:, i])
        tok = self._price(self._layer_tpls, np.array([max(T, 1)]))[ctx][:, 0]
        seq = self._price(self._tpls["seq"], np.array([max(S, 1)]))[ctx][:, 0]
        return tok, seq


@dataclass
class _Eval:
    total: float
    attn: float  # one layer's attention, seconds
    tok: np.ndarray | None = None  # per-instance seconds of the token templates
    seq: np.ndarray | None = None  # per-step seconds of the sequence templates
    eager: bool = False


@lru_cache(maxsize=16)
def _default_cost_model(gpu_id: str, profile: str | None, num_gpus: int) -> Any:
    return get_cost_model(gpu_id, profile=profile, num_gpus=num_gpus)


def _monotone(a: np.ndarray, *axes: int) -> np.ndarray:
    for ax in axes:
        a = np.maximum.accumulate(a, axis=ax)
    return a


_GRID_CACHE: dict[tuple, tuple[Any, _Grids]] = {}


def _bilinear(
    xa: np.ndarray, ya: np.ndarray, grid: np.ndarray, x: np.ndarray, y: np.ndarray
) -> np.ndarray:
    i = np.clip(np.searchsorted(xa, x, side="right") - 1, 0, len(xa) - 2)
    j = np.clip(np.searchsorted(ya, y, side="right") - 1, 0, len(ya) - 2)
    wi = (x - xa[i]) / (xa[i + 1] - xa[i])
    wj = (y - ya[j]) / (ya[j + 1] - ya[j])
    return (1 - wi) * ((1 - wj) * grid[i, j] + wj * grid[i, j + 1]) + wi * (
        (1 - wj) * grid[i + 1, j] + wj * grid[i + 1, j + 1]
    )


def _launch_costs(params: Any, backend: str) -> dict[str, float]:
    """The fitted per-call launch costs the cost model's times carry (0 if unknown)."""
    if params is None:
        return {"gemm": 0.0, "ew": 0.0, "coll": 0.0, "fwd": 0.0, "decode": 0.0, "block_m": 128}
    be = params.attention.backends.get(backend)
    if be is None:
        raise StepError(
            f"no attention parameters for backend {backend!r}; "
            f"allowed: {', '.join(params.attention.backends)}"
        )
    return {
        "gemm": params.gemm.launch_s,
        "ew": params.elementwise.launch_s,
        "coll": 0.0,  # collectives keep their latency (NCCL's base latency in a graph too)
        "fwd": be.launch_s,
        "decode": params.attention.decode_launch_s,
        "block_m": float(be.block_m),
    }


def _strided_scale(params: Any) -> float:
    """Bytes multiplier for eager kernels on the non-vectorised (broadcast, strided,
    mixed-dtype) path: copy efficiency / the achieved HBM fraction of the calibrated eager
    ``rope`` microbenchmark, whose 5 kernels (mul, neg of a half, cat, mul, add) move 10
    input-sized tensor passes for the 2 its ``rope`` op counts (calibrate/bench/
    elementwise.py)."""
    if params is None:
        return 1.0
    eff = params.elementwise.memory_efficiency
    copy = eff.get("copy", eff.get("default", 0.75))
    rope = eff.get("rope", eff.get("default", 0.75)) * 10.0 / 2.0
    return max(1.0, copy / min(rope, copy))


# --------------------------------------------------------------------------- validation
#
# Notes on the H100 validation (benchmarks/validate_serving_step.py prints the table):
#
# - Prefill 1x512 is the one row outside 10% (-13.7%). The model has it host-bound (26.3 ms
#   of dispatch for ~20 ms of GPU work); it was measured in another session than the
#   eager-decode rows the host constant comes from, and its 31.0 ms implies ~24 us per call,
#   slower than any eager-decode row (16.7-21.8 us; those drift by 30% within one session).
#   On a later H100 lease (2026-11, same software, a faster host) eager decode 1x1024 and
#   prefill 1x512 timed alternately in one process spent the same host time (15.0 ms each)
#   and took 15.4 and 19.2 ms; the constant solved from that session's decode steps
#   (11.9 us) predicts the prefill at 20.1 ms (+4.5%) and 2x512 at 34.8 ms (32.8, +6.2%).
# - The per-kernel floors were probed on lent Hopper GPUs with the scripts in
#   calibrate/steps/probes/ (outputs in calibrate/data/steps-h100/probes/): a CUDA graph of
#   2,000 in-place adds replayed (graph_floor.py: graph floor), and the serve_step.py
#   forward run eagerly, replayed from a graph, and profiled with torch.profiler
#   (graph_floor.py, prefill_kernels.py: stream floor, kernel counts per layer, the HBM
#   fractions of the eager pointwise kernels); host_session.py times eager decode and
#   prefill alternately in one process.


@lru_cache(maxsize=4)
def cached_step_model(model_id: str, gpu_id: str, engine: str, tp: int = 1) -> StepModel:
    return StepModel(model_id, gpu_id, engine=engine, tp=tp)


def eager_decode_stream_s(sm: StepModel, batch: int, context_len: int, host_s: float) -> float:
    """A decode step of the eager engine run eagerly, not from a graph (the eager-decode
    rows): the launch-queue recurrence over its torch calls."""
    none = np.zeros(0, np.int64)
    return sm.eager_stream_s(none, none, np.full(batch, context_len), host_s)


def derive_host_dispatch_s(
    csv_path: Path = EAGER_DECODE_CSV, model_id: str = "llama3-8b", gpu_id: str = "h100-sxm"
) -> tuple[float, list[dict[str, float]]]:
    """The eager engine's host seconds per torch call: for each measured eager decode step,
    the constant whose launch-queue time equals the measurement (bisection; the time is
    increasing in it); their median. Returns (median, per-row values)."""
    sm = cached_step_model(model_id, gpu_id, "pytorch-eager")
    rows = pd.read_csv(csv_path)
    rows = rows[rows["status"] == "ok"]
    out = []
    for r in rows.itertuples():
        target = float(r.step_ms) / 1e3
        lo, hi = 0.0, 1e-3
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if eager_decode_stream_s(sm, int(r.batch), int(r.context_len), mid) > target:
                hi = mid
            else:
                lo = mid
        out.append(
            {
                "batch": int(r.batch),
                "context_len": int(r.context_len),
                "measured_ms": float(r.step_ms),
                "host_s_per_call": lo,
            }
        )
    return statistics.median(o["host_s_per_call"] for o in out), out


def h100_validation_rows(model_id: str = "llama3-8b") -> list[dict[str, Any]]:
    """Every ok row of calibrate/data/steps-h100/serve_step.csv (eager prefill, graph
    decode) and the eager decode rows, with both engines' predictions."""
    eager = cached_step_model(model_id, "h100-sxm", "pytorch-eager")
    vllm = cached_step_model(model_id, "h100-sxm", "vllm")
    none = np.zeros(0, np.int64)
    out: list[dict[str, Any]] = []
    steps = pd.read_csv(SERVE_STEP_CSV)
    for r in steps[steps["status"] == "ok"].itertuples():
        b = int(r.batch)
        if r.phase == "prefill":
            n = int(r.prompt_len)
            args = (np.full(b, n), np.zeros(b, np.int64), none)
        else:
            n = int(r.context_len)
            args = (none, none, np.full(b, n))
        pred = eager.step_s(*args)
        out.append(
            {
                "phase": r.phase,
                "batch": b,
                "length": n,
                "timing": r.timing,
                "measured_ms": float(r.step_ms),
                "predicted_ms": 1e3 * pred,
                "vllm_ms": 1e3 * vllm.step_s(*args),
                "error_pct": 100.0 * (1e3 * pred / float(r.step_ms) - 1.0),
                "used_for": "validation",
            }
        )
    ed = pd.read_csv(EAGER_DECODE_CSV)
    for r in ed[ed["status"] == "ok"].itertuples():
        b, n = int(r.batch), int(r.context_len)
        pred = eager_decode_stream_s(eager, b, n, EAGER_HOST_DISPATCH_S)
        out.append(
            {
                "phase": "decode-eager",
                "batch": b,
                "length": n,
                "timing": r.timing,
                "measured_ms": float(r.step_ms),
                "predicted_ms": 1e3 * pred,
                "vllm_ms": math.nan,
                "error_pct": 100.0 * (1e3 * pred / float(r.step_ms) - 1.0),
                "used_for": "host constant",
            }
        )
    return out
