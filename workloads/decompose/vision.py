"""The kernels of a vision encoder's forward over a batch of images (:mod:`workloads.vision`).

Two ways to run it, as the engines do:

- ``fused`` (vLLM, SGLang, TensorRT-LLM; vLLM's ``Qwen2_5_VisionTransformer``): the
  patch embedding as one GEMM over the flattened patches, then per block RMSNorm, the
  QKV GEMM (bias fused), 2D rotary on q and k, one variable-length FlashAttention launch
  over every window (or every image, in the full-attention blocks), the output GEMM,
  a residual add, RMSNorm, the gate-up GEMM, SiLU-and-mul, the down GEMM, a residual
  add; the merger's RMSNorm, GEMM, GELU, GEMM. Linear layers are split over TP as the
  LLM's are (column-parallel QKV / gate-up / first merger GEMM, row-parallel output /
  down / second merger GEMM, each followed by an all-reduce).
- ``eager`` (transformers' ``modeling_qwen2_5_vl.py`` with SDPA, its default): RMSNorm
  as 8 kernels (fp32 cast, pow, mean, add, rsqrt, mul, cast, weight mul), rotary as 14
  (fp32 casts, ``rotate_half`` slices, neg, cat, muls, adds), and one SDPA call per
  window: without ``flash_attention_2`` the attention splits q, k, v at the windows'
  boundaries and loops over them; the outputs are concatenated.

Each op is a :class:`~workloads.decompose.templates.LayerOp` with a whole count, in the
order the kernels launch (an eager engine's host dispatches them one by one).
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from workloads.decompose.templates import LayerOp, copy_traffic
from workloads.ops import Dtype, Op, OpKind
from workloads.vision import ImageLoad, VisionEncoder

Mode = Literal["fused", "eager"]
# transformers' eager kernels of one RMSNorm and one rotary application (see the module)
EAGER_NORM_KERNELS = 8
EAGER_ROPE_KERNELS = 14


def _ew(name: str, kind: OpKind, m: int, n: int, dtype: Dtype) -> LayerOp:
    return LayerOp(name, Op(op=kind, dtype=dtype, m=max(1, m), n=max(1, n)))


def _traffic(name: str, traffic_bytes: float, kernels: int = 1) -> list[LayerOp]:
    return [copy_traffic(name, traffic_bytes, kernels)]


def _norm(name: str, rows: int, h: int, dtype: Dtype, eager: bool) -> list[LayerOp]:
    """RMSNorm: one fused kernel, or transformers' 8 eager ones (fp32 cast, pow, mean, add,
    rsqrt, mul, cast, weight mul; bytes as ``workloads.decompose.layer.rms_eager``)."""
    if eager:
        return _traffic(name, rows * (36.0 * h + 16.0), EAGER_NORM_KERNELS)
    return [_ew(name, OpKind.rmsnorm, rows, h, dtype)]


def _rope(name: str, rows: int, width: int, eager: bool) -> list[LayerOp]:
    """2D rotary on q and k (``width`` rotated elements per row each): vLLM rotates them
    in place (read and write bf16); transformers casts q and k to fp32, multiplies by cos,
    builds ``rotate_half`` (slice, neg, cat), multiplies by sin, adds and casts back: 7
    kernels each, 42 bytes per element (``layer._rope_eager`` plus the first cast)."""
    if eager:
        return _traffic(name, 2 * rows * 42.0 * width, EAGER_ROPE_KERNELS)
    return _traffic(name, 2 * rows * 4.0 * width)


def _gemm(name: str, m: int, k: int, n: int, dtype: Dtype) -> LayerOp:
    return LayerOp(name, Op(op=OpKind.gemm, dtype=dtype, m=m, k=k, n=n))


def _all_reduce(name: str, elements: int, tp: int, dtype: Dtype) -> list[LayerOp]:
    if tp == 1:
        return []
    nbytes = elements * (2 if dtype != Dtype.fp32 else 4)
    return [LayerOp(name, Op(op=OpKind.all_reduce, dtype=dtype, bytes=nbytes, ranks=tp))]


def _attention(
    enc: VisionEncoder, lengths: Counter[int], heads: int, mode: Mode, dtype: Dtype
) -> list[LayerOp]:
    """Non-causal attention over independent segments of ``length: count`` tokens: one
    varlen launch (its work the sum of the segments', priced per distinct length) or, in
    eager mode, one SDPA call per segment (named ``vit_attn_call``: the host pays a
    Python loop iteration per call)."""
    out = []
    eager = mode == "eager"
    for seq, n in sorted(lengths.items()):
        op = Op(
            op=OpKind.attn_fwd, dtype=dtype, batch=1 if eager else n, seq_q=seq, seq_kv=seq,
            heads_q=heads, heads_kv=heads, head_dim=enc.head_dim, causal=False,
            backend="cudnn" if eager else "flash",
        )  # fmt: skip
        out.append(
            LayerOp(f"vit_attn_call_{seq}" if eager else f"vit_attn_{seq}", op, n if eager else 1)
        )
    return out


def vision_encoder_ops(
    enc: VisionEncoder, images: ImageLoad, n_images: int, tp: int = 1, mode: Mode = "fused",
    dtype: Dtype = Dtype.bf16,
) -> list[LayerOp]:  # fmt: skip
    """The kernels of one encoder forward over ``n_images`` images of ``images``' size, in
    launch order (per block, then the merger)."""
    if n_images < 1:
        raise ValueError(f"n_images must be >= 1, got {n_images}")
    if enc.num_heads % tp:
        raise ValueError(
            f"TP {tp} does not divide the vision encoder's {enc.num_heads} heads; allowed: a "
            "TP that divides them"
        )
    w, h = images.width_px, images.height_px
    p = n_images * enc.patches(w, h)  # patches of the batch
    t = p // enc.spatial_merge_size**2  # tokens after the merger
    d, f, heads = enc.hidden_size, -(-enc.intermediate_size // tp), enc.num_heads // tp
    eager = mode == "eager"
    windows = Counter({s: c * n_images for s, c in Counter(enc.windows(w, h)).items()})
    full = Counter({enc.patches(w, h): n_images})
    # transformers' patch embedding is a Conv3d with stride = kernel: one implicit GEMM
    ops = [_gemm("vit_patch_embed", p, enc.patch_dim, d, dtype)]
    # transformers runs gate and up as two GEMMs, vLLM as one merged column-parallel GEMM
    ups = [("vit_gate", f), ("vit_up", f)] if eager else [("vit_gate_up", 2 * f)]

    def block(kind: str, segments: Counter[int]) -> list[LayerOp]:
        b = [
            *_norm(f"vit_{kind}_norm1", p, d, dtype, eager),
            _gemm(f"vit_{kind}_qkv", p, d, 3 * d // tp, dtype),
            *_rope(f"vit_{kind}_rope", p, heads * enc.head_dim, eager),
            *_attention(enc, segments, heads, mode, dtype),
        ]
        if eager:  # the per-window outputs concatenated, then made contiguous
            b += _traffic(f"vit_{kind}_attn_cat", 2 * p * 2.0 * heads * enc.head_dim, 2)
        b += [
            _gemm(f"vit_{kind}_proj", p, d // tp, d, dtype),
            *_all_reduce(f"vit_{kind}_proj_allreduce", p * d, tp, dtype),
            _ew(f"vit_{kind}_residual", OpKind.residual_add, p, d, dtype),
            *_norm(f"vit_{kind}_norm2", p, d, dtype, eager),
            *[_gemm(f"{name}_{kind}", p, d, n, dtype) for name, n in ups],
        ]
        if eager:  # act_fn(gate) then * up
            b += _traffic(f"vit_{kind}_silu", p * 4.0 * f) + _traffic(
                f"vit_{kind}_mul", p * 6.0 * f
            )
        else:
            b.append(_ew(f"vit_{kind}_silu_mul", OpKind.swiglu, p, f, dtype))
        b += [
            _gemm(f"vit_{kind}_down", p, f, d, dtype),
            *_all_reduce(f"vit_{kind}_down_allreduce", p * d, tp, dtype),
            _ew(f"vit_{kind}_residual2", OpKind.residual_add, p, d, dtype),
        ]
        return b

    full_blocks = set(enc.fullatt_blocks)
    for i in range(enc.depth):
        ops += block(
            "full" if i in full_blocks else "window", full if i in full_blocks else windows
        )
    m = enc.merged_dim
    ops += [
        *_norm("vit_merger_norm", p, d, dtype, eager),
        _gemm("vit_merger_fc1", t, m, m // tp, dtype),
        _ew("vit_merger_gelu", OpKind.gelu, t, m // tp, dtype),
        _gemm("vit_merger_fc2", t, m // tp, enc.out_hidden_size, dtype),
        *_all_reduce("vit_merger_allreduce", t * enc.out_hidden_size, tp, dtype),
    ]
    return ops


def vision_flops(enc: VisionEncoder, images: ImageLoad, n_images: int = 1) -> float:
    """Matmul and attention FLOPs of one encoder forward (2 per multiply-add)."""
    total = 0.0
    for o in vision_encoder_ops(enc, images, n_images):
        op = o.op
        if op.op == OpKind.gemm:
            total += 2.0 * op.m * op.n * op.k * o.count
        elif op.op == OpKind.attn_fwd:
            total += 4.0 * op.batch * op.seq_q * op.seq_kv * op.heads_q * op.head_dim * o.count
    return total


__all__ = ["EAGER_NORM_KERNELS", "EAGER_ROPE_KERNELS", "vision_encoder_ops", "vision_flops"]
