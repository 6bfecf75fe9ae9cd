"""A hybrid layer's linear-attention / state-space mixer as op templates (the mixers are
described in :mod:`workloads.mixers`).

Tensor parallelism splits the mixer's heads as attention's (vLLM's ``MambaMixer2`` and
Qwen3-Next's GDN: column-parallel ``in_proj``, row-parallel ``out_proj``, each rank scanning
its heads); Mamba-2's B/C groups are split when they divide, else replicated (like KV
heads); Mamba-1 splits ``d_inner``. The projections are GEMMs (priced by the GEMM model),
the depthwise causal conv and the gated RMSNorm memory-bound kernels.

**The scan.** Prefill and training run the chunked scan (GDN/KDA: flash-linear-attention's
``chunk_*`` pipeline, Yang et al. 2024 sec. 3.3; Mamba-2: ``mamba_chunk_scan_combined``,
Dao and Gu 2024 sec. 6; Mamba-1: the fused ``selective_scan``), priced as the memory
traffic of its kernels per token (:func:`scan_bytes_per_token`). A decode step instead
reads and writes each sequence's state once per layer (``fused_recurrent`` /
``selective_state_update``): a per-sequence template, ``decode_only``, whose bytes are
the state traffic less the chunked traffic its token already pays in the layer.
"""

from __future__ import annotations

from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose.moe import constant
from workloads.decompose.templates import OpTemplate, elementwise, gemm, traffic
from workloads.mixers import LinearMixer
from workloads.models import ModelConfig
from workloads.ops import OpKind


def rank_mixer(model: ModelConfig, tp: int) -> LinearMixer:
    """What one tensor-parallel rank holds of the model's mixer (see the module)."""
    mx = model.mixer
    assert mx is not None
    if mx.kind == "mamba":
        return mx.model_copy(update={"head_dim": mx.head_dim // tp})
    return mx.model_copy(
        update={"heads": mx.heads // tp, "key_heads": max(1, mx.key_heads // tp)}
    )


def mixer_tp_problem(model: ModelConfig, tp: int) -> str | None:
    """Why ``tp`` cannot split the model's mixer, or None."""
    mx = model.mixer
    if mx is None or tp == 1:
        return None
    if mx.kind == "mamba":
        return None if mx.inner % tp == 0 else f"tp={tp} does not divide d_inner={mx.inner}"
    if mx.heads % tp:
        return f"tp={tp} does not divide the {mx.kind} mixer's {mx.heads} heads"
    if mx.key_heads % tp and tp % mx.key_heads:
        groups = mx.key_heads
        return f"tp={tp} neither divides the mixer's {groups} key heads/groups nor is a multiple"
    return None


def scan_bytes_per_token(mx: LinearMixer, e: float) -> float:
    """Bytes the chunked scan's kernels read and write per token (one rank's heads).

    GDN/KDA (fla ``chunk_gated_delta_rule`` / ``chunk_kda`` forward, per value head, chunk
    ``C``): q/k L2 norms (``4 d_k``), ``K K^T`` into an fp32 ``[C]`` row per token
    (``2 C``), its triangular inverse (``3 C``), W and U (``2 d_k + 2 d_v + C``), the
    chunk states (``2 d_k + 2 d_v`` plus ``d_k d_v / C`` written) and the output
    (``2 d_k + 2 d_v`` plus the state read): ``12 d_k + 6 d_v + 6 C + 2 d_k d_v / C``
    elements; KDA's per-channel gate adds ``4 d_k``. Mamba-2 SSD: x read thrice and the
    output written (``4 H P``), B and C twice each (``4 G N``), the fp32 ``C B^T`` per chunk
    written and read (``4 G C``), the chunk states written and read (``2 H P N / C``).
    Mamba-1's fused scan: x, dt, z read, y written, B and C read: ``4 d_inner + 2 N``."""
    c = mx.chunk_size
    if mx.kind == "mamba":
        return e * (4 * mx.inner + 2 * mx.key_dim)
    if mx.kind == "mamba2":
        g, n = mx.key_heads, mx.key_dim
        hp = mx.inner
        return e * (4 * hp + 4 * g * n + 4 * g * c + 2 * hp * n / c)
    dk = mx.key_dim if mx.kind == "gdn" else mx.head_dim
    dv = mx.head_dim
    per_head = 12 * dk + 6 * dv + 6 * c + 2 * dk * dv / c + (4 * dk if mx.kind == "kda" else 0)
    return e * mx.heads * per_head


def mixer_templates(model: ModelConfig, tp: int, dtype: str, kernels: str) -> list[OpTemplate]:
    """One layer's mixer on one TP rank (the mean layer's share of it), between the
    attention's region markers (their collective closes whichever mixer the layer has)."""
    if model.mixer is None:
        return []
    mx = rank_mixer(model, tp)
    h, e = model.hidden_size, DTYPE_BYTES[Dtype(dtype)]
    kw = {"mult": constant(model.mixer_layers / model.num_layers)}
    lab = {"label": "mixer"}
    out = [gemm("mixer_in_proj", h, mx.in_proj_width, dtype, regather=kernels == "fused", **kw)]
    # depthwise causal conv + SiLU: reads and writes the conv channels
    out.append(traffic("mixer_conv", 2.0 * e * mx.conv_dim, **lab, **kw))
    out += [gemm(name, k, n, dtype, **kw) for name, k, n in mx.side_gemms()]
    out.append(traffic("mixer_scan", scan_bytes_per_token(mx, e), **lab, **kw))
    if mx.out_norm:  # gated RMSNorm: norm(y) * silu(z), reads y and z
        out.append(elementwise("mixer_norm", OpKind.rmsnorm.value, mx.inner, dtype, rows=2.0,
                               label="norm", **kw))  # fmt: skip
    else:  # y * silu(z)
        out.append(traffic("mixer_gate", 3.0 * e * mx.inner, **lab, **kw))
    out.append(gemm("mixer_out_proj", mx.inner, h, dtype, **kw))
    return out


def mixer_decode_templates(
    model: ModelConfig, tp: int, dtype: str, kv_dtype: str | None = None
) -> list[OpTemplate]:
    """Per decoding sequence and layer: the recurrent step reads and writes the state
    (scan state and conv window), less the chunked traffic its token pays in the layer.
    The scan state counts 4 bytes an element whatever its dtype: the update runs in fp32
    and takes the same time on a bf16 state as on an fp32 one (H200, mamba_ssm's
    ``selective_state_update``: calibrate/data/linear-mixers-h200-sxm)."""
    if model.mixer is None:
        return []
    mx = rank_mixer(model, tp)
    e = DTYPE_BYTES[Dtype(dtype)]
    kv_e = DTYPE_BYTES[Dtype(kv_dtype)] if kv_dtype else e
    state = 2.0 * (4.0 * mx.state_elements + kv_e * mx.conv_state_elements)  # read + write
    extra = max(1.0, state - scan_bytes_per_token(mx, e))
    share = constant(model.mixer_layers / model.num_layers)
    return [traffic("mixer_state", extra, "mixer", decode_only=True, per_layer=True, mult=share)]
