"""Decode suite: one new query token per sequence over a KV cache (``attn_decode``).

q (batch, heads_q, 1, head_dim) against k, v (batch, heads_kv, seq_kv, head_dim), bf16,
through ``scaled_dot_product_attention`` with the backend forced (flash | efficient).
``SIMCLI_DECODE_BACKENDS`` (a comma list, e.g. ``cudnn``: what PyTorch's default dispatch
picks for decode on Hopper with torch 2.11) measures other backends; the shipped H100 and
H200 decode.csv hold cuDNN rows measured that way (calibrate/data/README.md).
"""

from __future__ import annotations

import os
from typing import Any

from .attention import run_sdpa
from .common import Case, Context, shuffled

NAME = "decode"
BACKENDS = tuple(
    b.strip()
    for b in os.environ.get("SIMCLI_DECODE_BACKENDS", "flash,efficient").split(",")
    if b.strip()
)


def _case(backend: str, b: int, hq: int, hkv: int, skv: int, d: int) -> Case:
    row: dict[str, Any] = {
        "op": "attn_decode",
        "dtype": "bf16",
        "batch": b,
        "seq_q": 1,
        "seq_kv": skv,
        "heads_q": hq,
        "heads_kv": hkv,
        "head_dim": d,
        "causal": False,
        "backend": backend,
        "family": f"h{hq}kv{hkv}d{d}",
    }
    return Case(row=row)


def kv_bytes(r: dict[str, Any]) -> int:
    return 2 * r["batch"] * r["heads_kv"] * r["seq_kv"] * r["head_dim"] * 2


def cases(ctx: Context) -> list[Case]:
    if ctx.tiny:
        out = [
            _case(be, b, 4, hkv, skv, 32)
            for be in BACKENDS
            for b in (1, 2)
            for hkv in (4, 1)
            for skv in (64, 256)
        ]
        return out
    if ctx.quick:
        seqs = [512, 4096, 32768, 131072]
        batches = [1, 16, 128]
        heads = [(32, 8), (32, 32)]
    else:
        seqs = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
        # 8 and 32 straddle where split-KV stops (batch x KV heads near the SM count)
        batches = [1, 4, 8, 16, 32, 64, 256]
        heads = [(32, 32), (32, 8), (32, 4), (64, 8)]
    # (heads_q, heads_kv, head_dim): head_dim 128 in every mode, plus the other head dims
    # and GQA groups of real models (d64 small models, d80 Phi-2, d96 Phi-3, d256 Gemma)
    # in full mode; the held-out split is by this family.
    shapes = [(hq, hkv, 128) for hq, hkv in heads]
    if not ctx.quick:
        shapes += [
            (32, 8, 64),
            (16, 16, 64),
            (32, 32, 80),
            (24, 8, 96),
            (28, 4, 128),
            (16, 8, 128),
            (8, 4, 256),
            (32, 16, 256),
            (16, 16, 256),
        ]
    out = [
        _case(be, b, hq, hkv, s, d)
        for (hq, hkv, d) in shapes
        for s in seqs
        for b in batches
        for be in BACKENDS
    ]
    out = [c for c in out if kv_bytes(c.row) <= ctx.input_budget_bytes()]
    return shuffled(out, ctx.seed + 3)


def run(case: Case, ctx: Context) -> dict[str, Any]:
    r = case.row
    ms = run_sdpa(
        ctx,
        op="attn_decode",
        backend=r["backend"],
        b=r["batch"],
        hq=r["heads_q"],
        hkv=r["heads_kv"],
        sq=1,
        skv=r["seq_kv"],
        d=r["head_dim"],
        causal=False,
    )
    return {"measured_ms": ms}
