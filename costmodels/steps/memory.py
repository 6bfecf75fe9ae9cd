"""Peak memory per GPU of a training plan, from tensor sizes (issue "Training plans").

Every pipeline rank holds, at its peak moment (:func:`estimate_memory`):

* **weights, gradients, optimizer state** - bytes per parameter by precision
  (:data:`STATE_BYTES`), the parameters of the rank's layers plus the embedding (first
  rank) or final norm and LM head (last rank); ZeRO-1/2/3 divide the optimizer state,
  then the gradients, then the weights by the data-parallel group, ``dp * cp`` for dense
  and ``dp * cp / ep`` for expert parameters (Rajbhandari et al. 2020, ZeRO, sec. 5;
  Megatron-LM shards over DP x CP). Experts are divided by ``ep``.
* **activations** of the micro-batches in flight on that rank (:func:`in_flight`),
  per layer from the architecture (:func:`layer_activation_bytes`), following the
  accounting of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", sec. 4 (eqs. 1-6), with context parallelism dividing the
  sequence; with recomputation one layer's recomputed activations are live as well.
* **logits and loss buffers** on the last rank (vocabulary split by ``tp``);
  **communication buffers**: the sequence-parallel all-gather buffer, ring-attention KV
  double buffer, ZeRO-2 gradient buckets and ZeRO-3 prefetched parameters; **overhead**:
  cuBLAS workspaces, allocator fragmentation, memory outside the PyTorch allocator.

The peak per GPU is the maximum over pipeline ranks, with that rank's breakdown.

Frameworks: ``megatron`` is Megatron-Core with Transformer Engine (flash attention,
fused RoPE/SwiGLU/norms, a contiguous gradient buffer, the distributed optimizer as
ZeRO-1); ``megatron-unfused`` is Korthikanti et al.'s setting (no flash attention, the
s x s softmax stored, attention and hidden dropout); ``pytorch`` is a plain eager
Llama-style model as in ``calibrate/steps/train_step.py`` (fp32 parameters under
``torch.autocast``, eager RMSNorm and SwiGLU, SDPA, fused AdamW, ``zero_grad(
set_to_none=True)``), validated against the H100 steps in
``calibrate/data/steps-h100/train_step.csv`` (see ``tests/simcli/test_memory.py``), and
with tensor / pipeline parallelism as ``calibrate/steps/par_step.py`` runs it (Megatron's
layout written in PyTorch: fused column-parallel GEMMs, vocab-parallel loss, 1F1B),
validated on every rank of ``calibrate/data/steps-par-h200-x4``;
``pytorch-compile`` the same with ``torch.compile``d blocks, which save fewer activations
(and, with torchao float8, fp8 weight copies), validated with eager, full recompute and
fp8 on the traced suites ``calibrate/data/steps{2,3}-*`` (benchmarks/validate_training.py).
Under full recompute the autocast weight copies are made inside the checkpointed layers,
so only the layer being recomputed holds them, in the backward, after the loss.

Not modelled: pipeline send/receive buffers (one activation, already stored), MoE
all-to-all staging (the received tokens are the stored expert inputs), routing
imbalance, the memory of the optimizer step's temporaries (fused, in place).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from costmodels.steps.memory_constants import (
    ACT_BYTES,
    ALLOCATOR_FRAGMENTATION,
    COMPILED_F_BYTES,
    COMPILED_FP8_COPY_BYTES,
    COMPILED_H_BYTES,
    CUDA_CONTEXT_BYTES,
    DRIVER_RESERVED_BYTES,
    FP8_SAVED_F_BYTES,
    FP8_SAVED_H_BYTES,
    LIBRARY_WORKSPACE_BYTES,
    LOGIT_BYTES,
    NCCL_BUFFER_BYTES,
    STATE_BYTES,
)
from hardware_specs.schema import GIB, GpuSpec
from workloads.decompose.shard import shard_sizes
from workloads.decompose.training import scores_kind
from workloads.models import ModelConfig
from workloads.plan import (
    CP_KINDS,
    PP_SCHEDULES,
    PRECISIONS,
    RECOMPUTE,
    PlanError,
    TrainPlan,
    check_plan,
)

Framework = Literal["megatron", "megatron-unfused", "pytorch", "pytorch-compile"]
FRAMEWORKS: tuple[str, ...] = ("megatron", "megatron-unfused", "pytorch", "pytorch-compile")


_PREC = {name: i for i, name in enumerate(PRECISIONS)}
_RECOMPUTE = {name: i for i, name in enumerate(RECOMPUTE)}
_SCHED = {name: i for i, name in enumerate(PP_SCHEDULES)}
_CP_KIND = {name: i for i, name in enumerate(CP_KINDS)}
_ALLGATHER = _CP_KIND["allgather"]
_BF16 = _PREC["bf16"]
_FP8 = _PREC["fp8"]
_GPIPE, _ONE_F_ONE_B, _INTERLEAVED = (_SCHED[s] for s in ("gpipe", "1f1b", "interleaved"))
_NONE, _SELECTIVE, _FULL = (_RECOMPUTE[r] for r in ("none", "selective", "full"))
_BYTE_FIELDS = (
    "weights_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "logits_bytes",
    "comm_buffer_bytes",
    "overhead_bytes",
    "total_bytes",
    "capacity_bytes",
)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU on the peak pipeline rank, at its peak moment.

    The parts sum to ``total_bytes``; ``grads_bytes`` is what is allocated at that moment
    (eager PyTorch's gradients do not exist yet during the first micro-batch's forward).
    """

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    logits_bytes: float
    comm_buffer_bytes: float
    overhead_bytes: float
    total_bytes: float
    peak_stage: int
    per_stage_total_bytes: tuple[float, ...]
    capacity_bytes: float
    fits: bool
    # each rank's allocated_bytes at its own peak (what every rank's
    # torch.cuda.max_memory_allocated would report)
    per_stage_allocated_bytes: tuple[float, ...] = ()

    @property
    def allocated_bytes(self) -> float:
        """What ``torch.cuda.max_memory_allocated`` would report: the tensors and library
        workspaces, without fragmentation and memory outside the allocator."""
        return (
            self.weights_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.logits_bytes
            + self.comm_buffer_bytes
            + LIBRARY_WORKSPACE_BYTES
        )

    def breakdown_gib(self) -> dict[str, float]:
        """The byte fields in GiB (keys without ``_bytes``), for output."""
        return {f.removesuffix("_bytes"): getattr(self, f) / GIB for f in _BYTE_FIELDS}


# --------------------------------------------------------------------------- shapes


def _framework_key(framework: str) -> str:
    if framework not in FRAMEWORKS:
        raise PlanError(f"unknown framework {framework!r}; allowed: {', '.join(FRAMEWORKS)}")
    # torch.compile'd blocks keep eager PyTorch's state (fp32 masters, fp32 grads, AdamW);
    # what they save per layer differs (the ``compiled`` flag of _stage / _layer_acts)
    return "pytorch" if framework in ("pytorch", "pytorch-compile") else "megatron"


def _shard(model: ModelConfig, tp):
    """Per-TP-rank sizes as floats, vectorised over ``tp`` (:func:`shard_sizes`)."""
    sz = shard_sizes(model, tp)
    d = model.head_dim
    return {
        "heads": sz["heads"] * 1.0,
        "q_w": sz["heads"] * d * 1.0,
        "kv_w": sz["kv_heads"] * d * 1.0,
        "ffn": sz["ffn"] * 1.0,
        "ffn_e": sz["ffn_e"] * 1.0,
        "vocab": sz["vocab"] * 1.0,
        "attn": sz["attn"] * 1.0,
        "expert": sz["expert"] * 1.0,
        "shared": sz["shared"] * 1.0,
        "shared_ffn": float(model.shared_ffn_hidden_size) / tp,
        # a vision-language model's image encoder sits with the embedding (first stage)
        "embedding": sz["embedding"] + (model.vision.params_per_rank(tp) if model.vision else 0.0),
        "head": sz["vocab_h"] * 1.0,
    }


def _layer_acts(
    model: ModelConfig, fw: str, sh, t_sp, prec, seq_len, unfused: int = 0,
    compiled: bool = False, tp=1,
):  # fmt: skip
    """Bytes per token of one layer on one TP rank: (stored with no recompute, stored
    with selective recompute, stored with full recompute) - see layer_activation_bytes."""
    h, e = float(model.hidden_size), ACT_BYTES
    g = np.where(prec == _FP8, 1.0, 2.0)  # saved GEMM input
    q_w, kv_w, heads = sh["q_w"], sh["kv_w"], sh["heads"]
    gated = model.gated_mlp
    E, k = model.num_experts, model.experts_per_token
    # Q, K, V as the attention kernel saves them (GQA: K and V have kv_w columns), and the
    # attention output O, which is also the saved input of the output projection.
    attn = e * (q_w + 2 * kv_w) + e * q_w
    if fw == "megatron":
        stats = 8.0 if model.norm == "layernorm" else 4.0  # fp32 mean+rstd / rstd
        # Korthikanti eq. 1 terms outside the TP regions: the two norm inputs (2sbh each)
        # and the QKV / FC1 GEMM inputs (2sbh each); dropout masks (sbh each) if any.
        rep = 2 * (e * h + stats) + 2 * g * h + (2 * h if unfused == 1 else 0.0)
        attn = attn + np.where(prec == _FP8, 1.0, 0.0) * q_w  # TE's fp8 copy of O
        # fused bias-SwiGLU saves its input (gate and up, 2f) and FC2 its input (f);
        # GELU: FC1 output (GELU input) and GELU output - Korthikanti's 8sbh + 8sbh.
        inter = (lambda f: e * 2 * f + g * f) if gated else (lambda f: e * f + g * f)
        res_in = e * h
    else:
        pure = prec == _BF16
        res = np.where(pure, 2.0, 4.0)  # residual stream: fp32 under autocast
        if model.norm == "rmsnorm":  # eager: input, fp32 upcast (if bf16), x*rsqrt, rsqrt
            norm = res * h + np.where(pure, 4 * h, 0.0) + 4 * h + 4
        else:  # native_layer_norm in fp32: input, mean, rstd
            norm = res * h + 8.0
        n_lin = 3 + (2 if gated else 1) + (1 if model.is_moe else 0)  # q,k,v; gate,up; router
        # Tensor parallelism is Megatron's layout written in eager PyTorch
        # (calibrate/steps/par_step.py): the column-parallel GEMMs are fused (QKV; gate|up)
        # and each reads one bf16 cast of its norm's output (saved as the sequence shard
        # under SP). Measured at TP 2/4 with SP: exactly this (calibrate/data/steps-par-*).
        n_lin = np.where(np.asarray(tp) > 1, 2 + (1 if model.is_moe else 0), n_lin)
        # autocast casts a GEMM input once per nn.Linear call; pure bf16 shares the norm
        # output (one per norm).
        lin_in = np.where(pure, 2 * 2 * h, n_lin * g * h)
        rep = 2 * norm + lin_in
        # eager SwiGLU: gate out, silu out, up out, their product (FC2 input)
        inter = (lambda f: 3 * e * f + g * f) if gated else (lambda f: e * f + g * f)
        res_in = res * h
        if compiled and not model.is_moe:
            # torch.compile'd blocks: Inductor's partitioner recomputes the pointwise ops
            # (norms, RoPE, SiLU, casts) in the backward and saves 10 B per hidden element
            # (two fp32 residual inputs and one bf16 tensor) and 6 B per FFN element
            # (gate, up and product in bf16) besides attention's Q, K, V, O; torchao
            # float8 saves 6 B per hidden and 2.5 B per FFN element less. Fitted on the
            # peak memory of the Llama-3.2-1B- and Llama-2-shaped steps at 2x4096
            # (calibrate/data/steps2-*/train-compiled), Qwen2.5-1.5B-shaped held out.
            fp8 = prec == _FP8
            rep = np.where(fp8, COMPILED_H_BYTES - FP8_SAVED_H_BYTES, COMPILED_H_BYTES) * h
            per_f = np.where(fp8, COMPILED_F_BYTES - FP8_SAVED_F_BYTES, COMPILED_F_BYTES)
            inter = (lambda f: per_f * f) if gated else inter
    if model.is_moe:
        # router logits (fp32) on the local tokens; per routed copy of a token: the
        # permuted expert input, the expert intermediates, the expert output kept for the
        # probability-weighted combine (TP ranks see every token, the FFN split by tp).
        rep = rep + 4.0 * E
        mlp = k * (g * h + inter(sh["ffn_e"]) + e * h)
        if model.shared_ffn_hidden_size or model.num_dense_layers or model.mlp_free_layers:
            # fine-grained MoE: the shared expert's intermediates beside the routed ones,
            # and the dense layers' MLP, as a mean over the layers
            share = model.moe_layers / model.num_layers
            shared = inter(sh["shared_ffn"]) if model.shared_ffn_hidden_size else 0.0
            dense = model.dense_layers / model.num_layers
            mlp = share * (mlp + shared) + dense * inter(sh["ffn"])
    else:
        mlp = inter(sh["ffn"]) * (model.dense_layers / model.num_layers)
    # unfused, Korthikanti eq. 1: softmax output 2as, dropout mask as, dropout output 2as
    # (transformers' eager attention with sinks, gpt-oss: its softmax output, e as)
    # per token (5as^2b per layer), over the whole sequence of keys. Flash attention
    # stores no s x s tensor, only the fp32 log-sum-exp per query row and head (Dao et
    # al. 2022, FlashAttention, sec. 3.1; FlashAttention-2, algorithm 1).
    core = heads * seq_len * ((e + 1 + e) if unfused == 1 else e) if unfused else 4.0 * heads
    if model.is_hybrid:  # attention, and the mixer's in_proj, conv, scan and norm outputs
        mx, n = model.mixer, model.num_layers  # (what its kernels save), in their shares
        mix = e * (mx.in_proj_width + mx.conv_dim + 2 * mx.inner) / np.asarray(tp) if mx else 0.0
        attn = (model.attention_layers * attn + model.mixer_layers * mix) / n
        core = core * model.attention_layers / n
    none = rep / t_sp + attn + core + mlp
    # selective: core attention recomputed (Korthikanti sec. 4.2, Megatron's
    # --recompute-granularity selective): only its softmax/statistics are not stored.
    selective = none - core
    # full: only the layer input per layer (Korthikanti sec. 4.1: 2sbh, /t with SP).
    full = res_in / t_sp + 0.0 * none
    return none, selective, full


def _final_acts(model: ModelConfig, fw: str, t_sp, prec):
    """Bytes per token of the final norm and the LM-head input (last rank)."""
    h, e = float(model.hidden_size), ACT_BYTES
    g = np.where(prec == _FP8, 1.0, 2.0)
    if fw == "megatron":
        stats = 8.0 if model.norm == "layernorm" else 4.0
        return (e * h + stats + g * h) / t_sp
    pure = prec == _BF16
    res = np.where(pure, 2.0, 4.0)
    if model.norm == "rmsnorm":
        norm = res * h + np.where(pure, 4 * h, 0.0) + 4 * h + 4
    else:
        norm = res * h + 8.0
    return (norm + np.where(pure, 2 * h, 1 * g * h)) / t_sp


def in_flight(schedule, pp, vpp, num_microbatches, rank):
    """Micro-batches (chunk-micro-batches when interleaved) whose activations pipeline
    rank ``rank`` holds at once (vectorised).

    GPipe (Huang et al. 2019): all ``m``. 1F1B (PipeDream-Flush, Narayanan et al. 2021
    sec. 2.2): ``p - rank - 1`` warm-up forwards plus one, ``min(p - rank, m)``.
    Interleaved 1F1B (Megatron-LM's schedule, Narayanan et al. 2021 sec. 2.2.2): warm-up
    of ``2 (p - rank - 1) + (v - 1) p`` forwards plus one, each holding ``L / (p v)``
    layers, capped at ``m v``; on rank 0 that is ``L (1 + (p - 1) / (p v))`` layers,
    Korthikanti et al. 2022 sec. 4's interleaving penalty.
    """
    m = num_microbatches
    warm = np.where(schedule == _INTERLEAVED, 2 * (pp - rank - 1) + (vpp - 1) * pp, pp - rank - 1)
    return np.where(schedule == _GPIPE, m * vpp, np.minimum(warm + 1, m * vpp))


# --------------------------------------------------------------------------- one stage


def _stage(
    model: ModelConfig, fw: str, unfused: int, a: dict, sh: dict, r, layers_r,
    compiled: bool = False,
):  # fmt: skip
    """Bytes of pipeline rank ``r`` holding ``layers_r`` layers: (total, components at its
    peak moment). Everything is numpy arithmetic over broadcast plan arrays ``a``, so
    the scalar reference (estimate_memory) and the vectorised path share it.

    Megatron's peak is the forward of its last in-flight micro-batch (the loss on the
    last rank): its gradient buffer always exists. Eager PyTorch's is the largest of
    four moments: that forward and its loss, the LM head's backward GEMMs, the cast of
    its weight gradient, and the end of the backward (all gradients, no activations).
    """
    tp, pp, cp, dp, vpp, ep = a["tp"], a["pp"], a["cp"], a["dp"], a["vpp"], a["ep"]
    zero, prec, sched, rc = a["zero"], a["prec"], a["sched"], a["rc"]
    m = a["m"]
    tokens = a["mb"] * a["seq"] / cp
    t_sp = np.where(a["sp"] & (tp > 1), tp, 1) * 1.0
    first, last = r == 0, r == pp - 1
    h = float(model.hidden_size)
    tab = STATE_BYTES[fw]
    w_b, g_b, o_b = (np.take(tab[k], prec) * 1.0 for k in ("weight", "grad", "optim"))
    lcopy_b, hcopy_b = (np.take(tab[k], prec) * 1.0 for k in ("layer_copy", "head_copy"))
    if compiled:  # torchao float8 under compile keeps the fp8 weight only (1 B), no transpose
        lcopy_b = np.where(prec == _FP8, COMPILED_FP8_COPY_BYTES, lcopy_b)
    # a chosen gradient dtype (Megatron --grad-reduce-in-bf16 / NeMo grad_sync_dtype bf16);
    # the fp32 main-grad copy of fp16-mixed's optimizer is unaffected
    g_b = np.where(a["gradb"] > 0, a["gradb"], g_b) * 1.0

    # ---- parameters on this rank: dense (sharded over dp*cp) and expert (dp*cp/ep)
    norm_p = float(model.norm_params)
    local_experts = model.num_experts / ep
    # sh["shared"]: the router (and, for fine-grained MoE, the shared expert and the dense
    # layers' MLP, as a mean over the layers): MLP parameters outside the routed experts
    dense_layer = sh["attn"] + sh["shared"] + 2 * norm_p
    expert_layer = local_experts * sh["expert"]
    head_held = last & ((not model.tie_embeddings) | (pp > 1))  # tied: a copy when pp > 1
    dense = layers_r * dense_layer
    dense = dense + np.where(first, sh["embedding"], 0.0)
    dense = dense + np.where(last, norm_p, 0.0) + np.where(head_held, sh["head"], 0.0)
    expert = layers_r * expert_layer
    d_dense = dp * cp * 1.0
    d_expert = np.maximum(1.0, d_dense / ep)

    def sharded(nbytes, stage):
        on = zero >= stage
        return np.where(on, nbytes[0] / d_dense + nbytes[1] / d_expert, nbytes[0] + nbytes[1])

    w_full = w_b * (dense + expert)
    g_full = g_b * (dense + expert)
    weights = sharded((w_b * dense, w_b * expert), 3)
    grads = sharded((g_b * dense, g_b * expert), 2)
    # the host holds the offloaded share of the optimizer state (ZeRO-Offload; Megatron's
    # --optimizer-cpu-offload keeps --optimizer-offload-fraction of it on the CPU)
    optim = sharded((o_b * dense, o_b * expert), 1) * (1.0 - a["opt_off"])
    linear = layers_r * (sh["attn"] + sh["shared"] + expert_layer)
    flight = in_flight(sched, pp, vpp, m, r)
    n_last = np.where(sched == _GPIPE, m, 1)  # LM-head micro-batches alive at once
    # Weight copies made in the forward and kept for the backward. Megatron's (TE's fp8
    # weights) are cached across micro-batches. Eager autocast casts every weight again in
    # each micro-batch's forward and each cast is saved by that micro-batch's graph, so a
    # pipeline rank holds one set per micro-batch in flight (interleaved: per chunk's
    # layers). Measured on 1F1B stages: calibrate/data/steps-par-* (0.45-1.4 GiB a set).
    n_copy, n_head_copy = (flight / vpp, n_last) if fw == "pytorch" else (1.0, 1.0)
    copies = lcopy_b * linear * n_copy + np.where(last, hcopy_b * sh["head"] * n_head_copy, 0.0)
    # fp8 primary weights (--fp8-param-gather): the layers' GEMM weights live in fp8
    # (1 B, not bf16's 2) and their cached transpose is fp8 too (1 B); the embedding,
    # norms and LM head stay bf16
    fp8p = np.where(a["fp8p"], 1.0, 0.0)
    lin_dense = layers_r * (sh["attn"] + sh["shared"])
    lin_w = sharded((lin_dense, layers_r * expert_layer), 3)
    weights = weights - fp8p * (w_b - 1.0) * lin_w
    copies = copies - fp8p * np.maximum(lcopy_b - 1.0, 0.0) * linear * n_copy
    if fw == "pytorch":
        # FSDP with MixedPrecision(param_dtype=bf16) gathers bf16 weights directly: no
        # autocast copies beyond the gathered units (counted in the ZeRO-3 buffer below)
        copies = np.where(zero >= 3, 0.0, copies)

    # ---- activations of the in-flight micro-batches
    none, sel, full = _layer_acts(model, fw, sh, t_sp, prec, a["seq"], unfused, compiled, tp)
    kept = np.where(rc == _FULL, full, np.where(rc == _SELECTIVE, sel, none))
    stored_layers = flight * layers_r / vpp  # interleaved: the rank's mean per chunk
    # the layer being recomputed in the backward holds its full activations again
    extra = tokens * (none - kept)
    # activation offload: the offloaded share of the stored layers lives on the host;
    # one layer's activations stay in flight on the device (the copy being made or
    # prefetched; TE's cpu_offload double-buffers per layer)
    off = a["act_off"]
    acts = tokens * stored_layers * kept * (1.0 - off) + extra
    acts = acts + np.where(off > 0, tokens * kept * np.minimum(1.0, stored_layers), 0.0)
    acts = acts + np.where(last, tokens * n_last * _final_acts(model, fw, t_sp, prec), 0.0)
    peak_b, kept_b = (np.take([x[i] for x in LOGIT_BYTES[fw]], prec) * 1.0 for i in (0, 1))
    if fw == "pytorch":
        # with TP the loss is Megatron's vocab-parallel cross-entropy (calibrate/steps/
        # par_step.py): the fp32 copy of the logits becomes the saved softmax and, in place,
        # the gradient, cast to bf16 in the backward - Megatron's bytes per logit (measured
        # at TP 2/4: calibrate/data/steps-par-*), not F.cross_entropy's
        vp = [np.take([x[i] for x in LOGIT_BYTES["megatron"]], prec) * 1.0 for i in (0, 1)]
        peak_b, kept_b = np.where(tp > 1, vp[0], peak_b), np.where(tp > 1, vp[1], kept_b)
    vocab_tokens = tokens * sh["vocab"]
    logits = np.where(last, vocab_tokens * (peak_b + kept_b * (n_last - 1)), 0.0)

    # ---- communication buffers
    e = ACT_BYTES
    # while layers run: Megatron's global buffer for the all-gathered sequence-parallel
    # GEMM input, and ring attention's K and V of the local chunk, double-buffered (send
    # one, receive one)
    running = np.where(t_sp > 1, e * tokens * h, 0.0)
    # all-gathered K/V (Llama 3's CP): the whole sequence's K and V of the layer, and in
    # the backward their gradients before the reduce-scatter (fp32)
    kv_full = np.where(a["cpk"] == _ALLGATHER, (2 * e + 2 * 4) * sh["kv_w"] * tokens * cp, 0.0)
    running = running + np.where(cp > 1, np.maximum(2 * 2 * e * sh["kv_w"] * tokens, kv_full), 0.0)
    # ZeRO-2/3: unsharded gradients of the buckets being reduce-scattered (two in flight),
    # never more than the unsharded remainder
    bucket = 2.0 * a["bucket"]
    buckets = np.where(zero >= 2, np.minimum(bucket, g_full - grads), 0.0)
    # ZeRO-3: the all-gathered parameters of the unit in use and the one prefetched
    # (FSDP, Zhao et al. 2023 sec. 3.3: one unit of forward/backward prefetch)
    unit = np.maximum(dense_layer + expert_layer, np.where(first, sh["embedding"], 0.0))
    unit = np.maximum(unit, np.where(head_held, sh["head"], 0.0))
    comm = np.where(zero >= 3, np.minimum(2 * w_b * unit, w_full - weights), 0.0)
    if fw == "pytorch":
        # DistributedDataParallel copies gradients into flat buckets it allocates at
        # construction (gradient_as_bucket_view=False, the default): one more full set of
        # gradients (measured: calibrate/data/steps-h200-x4, +5.6 GiB for 1.5e9 params)
        comm = comm + np.where((zero == 0) & (dp * cp > 1), g_full, 0.0)

    # ---- the peak moment
    if fw == "megatron":
        # the contiguous gradient buffer always exists; the peak is the last in-flight
        # micro-batch's forward (the loss on the last rank)
        parts = {
            "weights_bytes": weights + copies,
            "grads_bytes": grads,
            "optimizer_bytes": optim,
            "activations_bytes": acts,
            "logits_bytes": logits,
            "comm_buffer_bytes": running + comm + buckets,
        }
    else:
        # eager: gradients (and the ZeRO-2 buckets) exist only after the first backward
        # (set_to_none), so at the activation peak only if forwards follow a backward
        live = np.where(flight < m * vpp, 1.0, 0.0)
        # full recompute: autocast's bf16 weight casts are made inside the checkpointed
        # layers and not saved, so only the layer being recomputed holds its copies; and
        # that layer's activations (``extra``) live in the backward, not at the loss
        full_rc = np.where(rc == _FULL, 1.0, 0.0)
        layer_copies = lcopy_b * linear * n_copy
        one_layer = lcopy_b * linear / np.maximum(layers_r, 1)
        fwd_copies = copies - full_rc * np.where(zero >= 3, 0.0, layer_copies)
        held = [weights + fwd_copies, live * grads, optim, acts - full_rc * extra, logits]
        held.append(running + comm + live * buckets)
        # LM-head backward (last rank; elsewhere these equal the forward moment): first
        # its GEMMs, with the bf16 logits gradient and the bf16 weight gradient alive;
        # then that weight gradient's cast to the fp32 .grad (logits gradient freed)
        on = np.where(last, 1.0, 0.0)
        others = kept_b * (n_last - 1) * vocab_tokens  # logits of the other micro-batches
        dgemm, dcast = list(held), list(held)
        dgemm[1] = held[1] + on * 2.0 * sh["head"]
        dgemm[4] = on * (2.0 * vocab_tokens + others)
        dcast[1] = held[1] + on * (g_b + hcopy_b) * sh["head"]
        dcast[4] = on * others
        # full recompute: a layer recomputed in the backward (the LM head's gradient and
        # the other micro-batches' logits alive)
        rcm = list(held)
        rcm[0] = held[0] + full_rc * np.where(zero >= 3, 0.0, one_layer)
        rcm[1] = held[1] + on * g_b * sh["head"]
        rcm[3] = acts
        rcm[4] = on * others
        # end of the backward: every gradient, no activations
        end = [weights, grads, optim, 0.0 * acts, 0.0 * logits, comm + buckets]
        moments = [np.broadcast_arrays(*x) for x in (held, dgemm, dcast, rcm, end)]
        which = np.argmax(np.stack([sum(x) for x in moments]), axis=0)
        chosen = [np.choose(which, [x[i] for x in moments]) for i in range(len(held))]
        parts = dict(zip(_BYTE_FIELDS[:6], chosen, strict=True))
    tensors = sum(parts.values()) + LIBRARY_WORKSPACE_BYTES
    outside = CUDA_CONTEXT_BYTES + (NCCL_BUFFER_BYTES if fw == "megatron" else 0.0)
    overhead = LIBRARY_WORKSPACE_BYTES + ALLOCATOR_FRAGMENTATION * tensors + outside
    parts["overhead_bytes"] = overhead
    total = tensors * (1.0 + ALLOCATOR_FRAGMENTATION) + outside
    return total, parts


# --------------------------------------------------------------------------- public API


def layer_activation_bytes(
    model: ModelConfig,
    *,
    micro_batch: int,
    seq_len: int,
    tp: int = 1,
    cp: int = 1,
    sp: bool = False,
    recompute: str = "none",
    precision: str = "bf16-mixed",
    framework: Framework = "megatron",
) -> float:
    """Stored activation bytes of one transformer layer for one micro-batch on one rank.

    Derived per tensor the backward needs (Korthikanti et al. 2022 sec. 4.1, generalised
    to GQA, SwiGLU, RMSNorm and MoE; ``tokens = micro_batch * seq_len / cp``):

    megatron, per token (e = 2 bytes, g = saved GEMM input bytes: 2, or 1 under fp8):
      outside TP regions (divided by tp only under SP): two norm inputs ``2 (e h +
      stats)``, QKV and FC1 GEMM inputs ``2 g h`` (Korthikanti's 4sbh of LayerNorm
      inputs and the 2sbh QKV and 2sbh FC1 inputs);
      per TP rank: Q, K, V ``e (q + 2 kv)`` (GQA: kv < q), attention output ``e q`` (also
      the projection input), flash's log-sum-exp ``4 heads``; MLP: SwiGLU ``e 2f + g f``
      (fused bias-SwiGLU input and FC2 input; GELU: ``e f + g f``, Korthikanti's
      8sbh + 8sbh at f = 4h); MoE: ``k (g h + inter + e h)`` per token plus fp32 router
      logits. ``megatron-unfused`` adds the dropout masks ``2 h`` and the softmax terms
      ``5 heads s`` (Korthikanti's 5as^2b): with MHA, GELU, f = 4h this is exactly eq. 1,
      ``sbh (34 + 5as/h)``, eq. 2 with tp and eq. 4 with SP, plus the norms' statistics.
    pytorch (eager, autocast): fp32 residual stream, so each eager RMSNorm keeps its fp32
      input, ``x * rsqrt`` and ``rsqrt`` (8h + 4); autocast keeps one bf16 cast of the
      input per nn.Linear (q, k, v, gate, up: 5 x 2h); SDPA keeps Q, K, V, O and the
      log-sum-exp; SwiGLU keeps gate, silu, up and their product (8f). Measured on H100:
      exactly ``26h + 4q + 4kv + 8f + 4 heads + 8`` bytes per token per layer.

    Selective recompute drops the core-attention terms; full keeps the layer input only.
    """
    fw = _framework_key(framework)
    sh = _shard(model, np.asarray(tp))
    t_sp = float(tp if (sp and tp > 1) else 1)
    prec = np.asarray(_code(precision, _PREC, "precision"))
    parts = _layer_acts(
        model, fw, sh, t_sp, prec, seq_len, scores_kind(model, framework),
        framework == "pytorch-compile", np.asarray(tp),
    )  # fmt: skip
    kept = parts[_code(recompute, _RECOMPUTE, "recompute")]
    return float(kept * micro_batch * seq_len / cp)


def estimate_memory(
    model: ModelConfig,
    plan: TrainPlan,
    gpu: GpuSpec,
    framework: Framework = "megatron",
) -> MemoryEstimate:
    """Peak bytes per GPU of ``plan`` (the maximum over its pipeline ranks) and where they
    go; ``fits`` compares with the GPU's memory less :data:`DRIVER_RESERVED_BYTES`.

    Each rank is evaluated in turn with its own layers (``plan.layers_per_chunk``, so a
    custom ``layer_split`` is honoured) and micro-batches in flight (:func:`in_flight`).
    """
    check_plan(plan, model)
    fw = _framework_key(framework)
    a = _arrays(**plan_memory_fields(plan))
    sh = _shard(model, a["tp"])
    chunks = plan.layers_per_chunk(model.num_layers)
    unfused = scores_kind(model, framework)
    compiled = framework == "pytorch-compile"
    stages = []
    for r in range(plan.pp):
        layers_r = sum(n for c, n in enumerate(chunks) if plan.stage_of_chunk(c) == r)
        total, parts = _stage(
            model, fw, unfused, a, sh, np.asarray(r), np.asarray(layers_r), compiled
        )
        stages.append((float(total), {k: float(v) for k, v in parts.items()}))
    per_stage = tuple(t for t, _ in stages)
    # the tensors of each rank at its peak (the parts but overhead) and the workspaces
    per_stage_alloc = tuple(
        sum(v for k, v in p.items() if k != "overhead_bytes") + LIBRARY_WORKSPACE_BYTES
        for _, p in stages
    )
    peak = int(np.argmax(per_stage))
    total, parts = stages[peak]
    capacity = gpu.memory_bytes - DRIVER_RESERVED_BYTES
    return MemoryEstimate(
        **parts,
        total_bytes=total,
        peak_stage=peak,
        per_stage_total_bytes=per_stage,
        capacity_bytes=capacity,
        fits=total <= capacity,
        per_stage_allocated_bytes=per_stage_alloc,
    )


def plan_memory_fields(plan: TrainPlan) -> dict[str, Any]:
    """The fields of ``plan`` that memory depends on, named as :func:`memory_bytes_many`
    takes them."""
    return {
        "tp": plan.tp,
        "pp": plan.pp,
        "cp": plan.cp,
        "dp": plan.data_parallel,
        "vpp": plan.vpp,
        "ep": plan.ep,
        "zero": plan.zero,
        "micro_batch": plan.micro_batch,
        "num_microbatches": plan.num_microbatches,
        "seq_len": plan.seq_len,
        "recompute": plan.recompute,
        "sp": plan.sp,
        "precision": plan.precision,
        "pp_schedule": plan.pp_schedule,
        "grad_bucket_bytes": plan.grad_bucket_bytes,
        "cp_kind": plan.cp_kind,
        "fp8_params": plan.fp8_params,
        "grad_bytes": 0 if plan.grad_reduce_dtype is None else plan.grad_bytes,  # 0: default
        "optimizer_offload": plan.optimizer_offload,
        "activation_offload": plan.activation_offload,
    }


def memory_bytes_of_plans(
    model: ModelConfig, gpu: GpuSpec, plans: list[TrainPlan], framework: Framework = "megatron"
) -> np.ndarray:
    """:func:`memory_bytes_many` of a list of plans (one vectorised evaluation)."""
    if not plans:
        return np.zeros(0)
    rows = [plan_memory_fields(p) for p in plans]
    cols = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    return memory_bytes_many(model, gpu, framework=framework, **cols)


def memory_bytes_many(
    model: ModelConfig,
    gpu: GpuSpec,
    *,
    tp,
    pp,
    cp,
    dp,
    vpp,
    ep,
    zero,
    micro_batch,
    num_microbatches,
    seq_len,
    recompute,
    sp,
    precision,
    pp_schedule,
    framework: Framework = "megatron",
    grad_bucket_bytes=None,
    cp_kind="ring",
    trim_first=0,
    trim_last=0,
    fp8_params=False,
    grad_bytes=None,
    optimizer_offload=0.0,
    activation_offload=0.0,
) -> np.ndarray:
    """Peak bytes per GPU of many plans at once (``estimate_memory(...).total_bytes``).

    Arguments are scalars or numpy arrays that broadcast together (one element per
    plan). ``recompute``, ``precision`` and ``pp_schedule`` are arrays of their string
    values or of integer codes: the index in ``workloads.plan.RECOMPUTE`` (none 0,
    selective 1, full 2), ``PRECISIONS`` (bf16-mixed 0, fp16-mixed 1, bf16 2, fp8 3) and
    ``PP_SCHEDULES`` (1f1b 0, gpipe 1, interleaved 2). ``sp`` is a boolean array (off
    wherever tp = 1). Layers are split as ``TrainPlan.layers_per_chunk`` does by
    default, ``grad_bucket_bytes`` defaults to TrainPlan's. Plans are assumed valid
    (``check_plan``); only cheap shape checks are made. ``gpu`` is unused here (kept so
    the plan search passes one context); compare the result with
    ``gpu.memory_bytes - DRIVER_RESERVED_BYTES``. ``trim_first`` / ``trim_last``: a
    layout whose first / last chunk holds that many layers fewer than the even split of
    ``num_layers + trim_first + trim_last`` (which must divide; the plan search's
    trimmed layouts).

    No loop over plans: the peak rank is found in closed form among five candidates, as
    memory grows with a rank's layers and micro-batches in flight, which falls with the
    rank: rank 0 (most in flight, the embedding), the last rank (LM head, logits), the
    lowest rank holding one more layer than others (the default split gives the
    remainder to the central chunks), and for eager PyTorch the lowest rank whose
    gradients already exist at its activation peak and the lowest such rank with the
    extra layer.
    """
    del gpu
    fw = _framework_key(framework)
    a = _arrays(
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        vpp=vpp,
        ep=ep,
        zero=zero,
        micro_batch=micro_batch,
        num_microbatches=num_microbatches,
        seq_len=seq_len,
        recompute=recompute,
        sp=sp,
        precision=precision,
        pp_schedule=pp_schedule,
        grad_bucket_bytes=grad_bucket_bytes,
        cp_kind=cp_kind,
        fp8_params=fp8_params,
        grad_bytes=grad_bytes,
        optimizer_offload=optimizer_offload,
        activation_offload=activation_offload,
    )
    if np.any(model.num_heads % a["tp"]):
        bad = np.unique(a["tp"][model.num_heads % a["tp"] != 0])
        raise PlanError(f"tp={bad.tolist()} does not divide num_heads={model.num_heads}")
    t0, tl = np.asarray(trim_first), np.asarray(trim_last)
    total = model.num_layers + t0 + tl
    if np.any(a["pp"] * a["vpp"] > total):
        raise PlanError(f"pp*vpp exceeds num_layers={model.num_layers} for some plans")
    sh = _shard(model, a["tp"])
    unfused = scores_kind(model, framework)
    compiled = framework == "pytorch-compile"
    pp, vpp = a["pp"], a["vpp"]
    chunks = pp * vpp
    base, extra = np.divmod(total, chunks)
    if np.any((t0 + tl > 0) & (extra > 0)):
        raise PlanError("a trimmed stage layout needs pp*vpp dividing the trimmed layers")
    # TrainPlan.layers_per_chunk gives the `extra` chunks nearest the middle one more
    # layer: the contiguous chunk range [lo, lo + extra - 1].
    lo = np.where(chunks % 2 == 0, chunks // 2 - (extra + 1) // 2, (chunks - 1) // 2 - extra // 2)
    hi = lo + extra - 1

    def layers_of(r):
        more = np.floor_divide(hi - r, pp) - np.floor_divide(lo - 1 - r, pp)
        trimmed = np.where(r == 0, t0, 0) + np.where(r == pp - 1, tl, 0)
        return vpp * base + np.where(extra > 0, more, 0) - trimmed

    # ranks holding ceil(extra / pp) of those chunks: residues lo, lo+1, ... mod pp
    width, start = extra % pp, lo % pp
    r_extra = np.where((width == 0) | (start + width > pp), 0, start)
    # eager PyTorch: the lowest rank whose forwards follow a backward, so gradients exist
    # at its activation peak (in_flight(r) < m * vpp), and the lowest rank from there on
    # holding the extra layer
    m_total = a["m"] * vpp
    slope = np.where(a["sched"] == _INTERLEAVED, 2, 1)
    top = in_flight(a["sched"], pp, vpp, a["m"], 0)  # uncapped at rank 0 when < m * vpp
    warm0 = np.where(a["sched"] == _INTERLEAVED, 2 * (pp - 1) + (vpp - 1) * pp, pp - 1)
    r_live = np.maximum(0, np.floor_divide(warm0 + 1 - m_total, slope) + 1)
    r_live = np.where((a["sched"] == _GPIPE) | (top < m_total), 0, np.minimum(r_live, pp - 1))
    in_set = (r_live - start) % pp < width
    r_live_extra = np.where(in_set | (width == 0) | (start <= r_live), r_live, start)
    best = None
    # a trimmed first stage: rank 1 holds the full layers with the most in flight
    r_one = np.where((t0 > 0) & (pp > 1), 1, 0)
    for r in (np.zeros_like(pp), r_extra, r_live, r_live_extra, pp - 1, r_one):
        total, _ = _stage(model, fw, unfused, a, sh, r, layers_of(r), compiled)
        best = total if best is None else np.maximum(best, total)
    return np.asarray(best, dtype=float)


# --------------------------------------------------------------------------- inputs


def _code(values, names: dict[str, int], what: str):
    """String names or integer codes -> integer codes (vectorised over a few names)."""
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        if arr.size and (arr.min() < 0 or arr.max() >= len(names)):
            raise PlanError(
                f"{what} codes must be 0..{len(names) - 1} ({', '.join(names)}); "
                f"got {np.unique(arr).tolist()}"
            )
        return arr
    codes = np.full(arr.shape, -1, dtype=np.int64)
    for name, i in names.items():
        codes[arr == name] = i
    if np.any(codes < 0):
        bad = sorted({str(x) for x in np.atleast_1d(arr)[np.atleast_1d(codes) < 0]})
        raise PlanError(f"unknown {what} {', '.join(bad)}; allowed: {', '.join(names)}")
    return codes if codes.ndim else codes[()]


def _arrays(*, grad_bucket_bytes=None, **fields) -> dict:
    """Plan fields as broadcast numpy arrays (int64 codes for the string fields)."""
    if grad_bucket_bytes is None:
        grad_bucket_bytes = TrainPlan.model_fields["grad_bucket_bytes"].default
    raw = {k: fields[k] for k in ("tp", "pp", "cp", "dp", "vpp", "ep", "zero")}
    raw.update(mb=fields["micro_batch"], m=fields["num_microbatches"])
    raw.update(seq=fields["seq_len"], bucket=grad_bucket_bytes)
    arrs = {k: np.asarray(v, dtype=np.int64) for k, v in raw.items()}
    arrs["rc"] = _code(fields["recompute"], _RECOMPUTE, "recompute")
    arrs["prec"] = _code(fields["precision"], _PREC, "precision")
    arrs["sched"] = _code(fields["pp_schedule"], _SCHED, "pp_schedule")
    arrs["sp"] = np.asarray(fields["sp"], dtype=bool)
    arrs["cpk"] = _code(fields.get("cp_kind", "ring"), _CP_KIND, "cp_kind")
    arrs["fp8p"] = np.asarray(fields.get("fp8_params", False), dtype=bool)
    # gradient bytes: the precision's default unless given (0 = default)
    gb = fields.get("grad_bytes")
    arrs["gradb"] = np.asarray(0 if gb is None else gb, dtype=np.int64)
    arrs["opt_off"] = np.asarray(fields.get("optimizer_offload", 0.0), dtype=float)
    arrs["act_off"] = np.asarray(fields.get("activation_offload", 0.0), dtype=float)
    for k in ("tp", "pp", "cp", "dp", "vpp", "ep", "mb", "m", "seq", "bucket"):
        if np.any(arrs[k] < 1):
            raise PlanError(f"{k} must be >= 1; got {np.unique(arrs[k]).tolist()}")
    if np.any((arrs["zero"] < 0) | (arrs["zero"] > 3)):
        raise PlanError(f"zero must be 0..3; got {np.unique(arrs['zero']).tolist()}")
    keys = list(arrs)
    return dict(zip(keys, np.broadcast_arrays(*(arrs[k] for k in keys)), strict=True))
