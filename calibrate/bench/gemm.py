"""GEMM suite: C[m,n] = A[m,k] . B[k,n] (``batch`` independent products for bmm).

Layout is nn.Linear's: A row-major [m,k], B the transpose of a row-major weight [n,k]
(cuBLAS "TN"), the same for every dtype (``torch._scaled_mm`` needs B column-major).
dtypes: fp32 (TF32 off), tf32 (fp32 storage, TF32 on), bf16, fp16, fp8 (e4m3 inputs,
per-tensor scales, bf16 output).
"""

from __future__ import annotations

import math
import random
from typing import Any

from .common import Case, Context, bench, dedupe, rotating, shuffled
from .models import MODELS, layer_shapes

NAME = "gemm"

ELEM_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
OUT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
# FLOP ceilings per case, so that no single case eats the time budget.
FLOP_CAP = {"bf16": 8e12, "fp16": 8e12, "fp8": 8e12, "tf32": 2e12, "fp32": 5e11}


def _gemm(m: int, n: int, k: int, dtype: str, family: str, batch: int | None = None) -> Case:
    row: dict[str, Any] = {
        "op": "gemm",
        "dtype": dtype,
        "m": m,
        "n": n,
        "k": k,
        "batch": batch,
        "family": family,
    }
    return Case(row=row)


def _fits(c: Case, ctx: Context) -> bool:
    r = c.row
    b = r.get("batch") or 1
    dt = r["dtype"]
    flops = 2.0 * b * r["m"] * r["n"] * r["k"]
    if flops > FLOP_CAP[dt] * (0.02 if ctx.tiny else 1):
        return False
    if dt == "fp8" and (r["k"] % 16 or r["n"] % 16):
        return False  # _scaled_mm needs k and n multiples of 16
    in_bytes = b * (r["m"] * r["k"] + r["k"] * r["n"]) * ELEM_BYTES[dt]
    out_bytes = b * r["m"] * r["n"] * OUT_BYTES[dt]
    return in_bytes + out_bytes <= ctx.input_budget_bytes()


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _odd(rng: random.Random, lo: int, hi: int) -> int:
    v = _log_uniform(rng, lo, hi)
    if v % 8 == 0:
        v += rng.choice((1, 3, 5, 7))
    return v


def cases(ctx: Context) -> list[Case]:
    rng = random.Random(ctx.seed + 1)
    if ctx.tiny:
        out = [_gemm(128, 128, 128, "bf16", "square")]
        for dt in ("fp32", "tf32", "bf16", "fp8"):
            out += [_gemm(64, 96, 128, dt, "random"), _gemm(33, 47, 65, dt, "odd")]
        out.append(_gemm(32, 64, 64, "bf16", "bmm", batch=4))
        return [c for c in dedupe(out) if _fits(c, ctx)]

    quick = ctx.quick
    models = ["llama3-8b", "llama3-70b", "qwen2.5-7b"] if quick else list(MODELS)
    tokens = [1, 64, 1024, 16384] if quick else [1, 16, 64, 256, 1024, 4096, 16384, 65536]
    tps = [1, 8] if quick else [1, 2, 4, 8]
    bwd_tokens = [4096] if quick else [1024, 4096, 16384]
    bwd_tps = [1, 8]

    anchors = [_gemm(8192, 8192, 8192, "bf16", "square")]
    fwd, bwd = [], []
    for name in models:
        for tp in tps:
            shapes = layer_shapes(MODELS[name], tp)
            if shapes is None:
                continue
            for layer, (n, k) in shapes.items():
                for m in tokens:
                    fwd.append(_gemm(m, n, k, "bf16", f"{name}/{layer}"))
                if tp in bwd_tps:
                    for m in bwd_tokens:
                        # dgrad: dX[m,k] = dY[m,n] . W[n,k];  wgrad: dW[k,n] = X^T[k,m] . dY[m,n]
                        bwd.append(_gemm(m, k, n, "bf16", f"{name}/{layer}/dgrad"))
                        bwd.append(_gemm(k, n, m, "bf16", f"{name}/{layer}/wgrad"))
    sizes = [256, 512, 1024, 2048, 4096, 8192, 16384]
    square = [_gemm(s, s, s, "bf16", "square") for s in sizes]
    n_rand, n_odd = (40, 15) if quick else (400, 100)
    rand = [
        _gemm(
            _log_uniform(rng, 64, 16384),
            _log_uniform(rng, 64, 16384),
            _log_uniform(rng, 64, 16384),
            "bf16",
            "random",
        )
        for _ in range(n_rand)
    ]
    odd = [
        _gemm(_odd(rng, 17, 12000), _odd(rng, 17, 12000), _odd(rng, 17, 12000), "bf16", "odd")
        for _ in range(n_odd)
    ]
    bmm = []
    for b in (8, 32, 128):
        for m, n, k in ((512, 512, 128), (2048, 2048, 128), (4096, 128, 4096), (1, 4096, 128)):
            bmm.append(_gemm(m, n, k, "bf16", "bmm", batch=b))
    if quick:
        bmm = bmm[::3]

    subset = square + rand[: (10 if quick else 60)] + odd[: (5 if quick else 20)]
    subset += [
        c
        for c in fwd
        if c.row["family"].startswith("llama3-8b/") and c.row["m"] in (16, 256, 4096, 16384)
    ][: (10 if quick else 40)]
    other = []
    for dt in ("fp16", "tf32", "fp32", "fp8"):
        for c in subset:
            r = c.row
            other.append(_gemm(r["m"], r["n"], r["k"], dt, r["family"], r.get("batch")))
    other.append(_gemm(8192, 8192, 8192, "fp8", "square"))

    allc = [
        c for c in dedupe(anchors + fwd + bwd + square + rand + odd + bmm + other) if _fits(c, ctx)
    ]
    return shuffled(allc, ctx.seed, head=1)


def _torch_dtype(torch, dt: str):
    return {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8": torch.float8_e4m3fn,
    }[dt]


def run(case: Case, ctx: Context) -> dict[str, Any]:
    import torch

    r = case.row
    dt, m, n, k, b = r["dtype"], r["m"], r["n"], r["k"], r.get("batch")
    torch.set_float32_matmul_precision("high" if dt == "tf32" else "highest")
    dev = ctx.device
    lead = (b,) if b else ()

    def make():
        if dt == "fp8":
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
            return a, w.t()
        tdt = _torch_dtype(torch, dt)
        a = torch.randn(*lead, m, k, device=dev, dtype=tdt)
        w = torch.randn(*lead, n, k, device=dev, dtype=tdt)
        return a, w.transpose(-1, -2)

    set_bytes = (b or 1) * (m * k + n * k) * ELEM_BYTES[dt]
    sets = rotating(make, set_bytes, ctx)
    i = [0]
    if dt == "fp8":
        if not hasattr(torch, "_scaled_mm"):
            raise NotImplementedError("torch._scaled_mm not available")
        sa = torch.ones((), device=dev, dtype=torch.float32)
        sb = torch.ones((), device=dev, dtype=torch.float32)

        def fn():
            a, w = sets[i[0] % len(sets)]
            i[0] += 1
            return torch._scaled_mm(a, w, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    else:
        out = torch.empty(*lead, m, n, device=dev, dtype=_torch_dtype(torch, dt))
        mm = torch.bmm if b else torch.mm

        def fn():
            a, w = sets[i[0] % len(sets)]
            i[0] += 1
            return mm(a, w, out=out)

    try:
        ms = bench(fn, ctx)
    finally:
        torch.set_float32_matmul_precision("highest")
    return {"measured_ms": ms}
