"""Memory-bound ops, eager PyTorch, bf16 activations (adamw: fp32 parameters).

- copy: ``bytes`` read by one device-to-device copy (as many written).
- rmsnorm: m tokens x n hidden, ``F.rms_norm`` with a weight (manual form if absent).
- swiglu: silu(gate) * up, gate and up each m x n, output m x n.
- rope: rotate-half RoPE on an (m, heads, head_dim) tensor, n = heads * head_dim,
  cos/sin of shape (m, 1, head_dim) (the usual eager formulation: several kernels).
- softmax: m rows x n columns, along the last dim.
- cross_entropy: forward ``F.cross_entropy`` of bf16 logits m x n (vocab), int64 targets.
- adamw: ``torch.optim.AdamW(fused=True)`` step over n fp32 parameters split across
  four tensors, fp32 grads.
"""

from __future__ import annotations

from typing import Any

from .common import Case, Context, KiB, bench, rotating, shuffled

NAME = "elementwise"


def _case(op: str, dtype: str = "bf16", family: str = "", **dims: int) -> Case:
    row: dict[str, Any] = {"op": op, "dtype": dtype, "family": family or op, **dims}
    return Case(row=row)


def _bytes(r: dict[str, Any]) -> int:
    op = r["op"]
    if op == "copy":
        return 2 * r["bytes"]
    if op == "adamw":
        return 16 * r["n"]
    if op == "rope":
        return 2 * r["m"] * r["n"] * 2
    mult = {"swiglu": 3, "cross_entropy": 2}.get(op, 2)
    return mult * r["m"] * r["n"] * 2


def cases(ctx: Context) -> list[Case]:
    if ctx.tiny:
        ms_, hidden = [1, 64], [256]
        out = [_case("copy", bytes=b) for b in (4 * KiB, 256 * KiB)]
        for m in ms_:
            for n in hidden:
                out += [
                    _case("rmsnorm", m=m, n=n),
                    _case("swiglu", m=m, n=n),
                    _case("softmax", m=m, n=n),
                    _case("cross_entropy", m=m, n=512),
                    _case("rope", family="rope/h2", m=m, n=2 * 64),
                ]
        out += [_case("adamw", dtype="fp32", n=n) for n in (1000, 100_000)]
        return out

    quick = ctx.quick
    copy_sizes = (
        [4 * KiB * 4**i for i in range(11)] if quick else [4 * KiB * 2**i for i in range(21)]
    )
    tokens = [1, 64, 1024, 16384] if quick else [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536]
    hidden = [4096, 8192] if quick else [2048, 3584, 4096, 8192, 12288]
    inter = [3584, 14336] if quick else [1376, 2368, 3584, 14336, 28672]
    cols = [1024, 32768] if quick else [128, 1024, 4096, 32768, 131072]
    rope_heads = [(32, 128)] if quick else [(8, 128), (32, 128), (64, 128)]
    vocab = [32000, 152064] if quick else [32000, 128256, 152064]
    ce_tokens = [1, 1024, 8192] if quick else [1, 64, 512, 2048, 8192, 16384]
    adam_n = (
        [10**4, 10**6, 10**8] if quick else [10**4, 10**5, 10**6, 10**7, 10**8, 5 * 10**8, 10**9]
    )

    out = [_case("copy", bytes=b) for b in copy_sizes]
    for m in tokens:
        out += [_case("rmsnorm", m=m, n=n) for n in hidden]
        out += [_case("swiglu", m=m, n=n) for n in inter]
        out += [_case("softmax", m=m, n=n) for n in cols]
        out += [_case("rope", family=f"rope/h{h}", m=m, n=h * d) for h, d in rope_heads]
    for m in ce_tokens:
        out += [_case("cross_entropy", m=m, n=v) for v in vocab]
    out += [_case("adamw", dtype="fp32", n=n) for n in adam_n]
    budget = ctx.input_budget_bytes()
    out = [
        c
        for c in out
        if _bytes(c.row) <= budget or (c.row["op"] == "adamw" and _bytes(c.row) <= 2 * budget)
    ]
    return shuffled(out, ctx.seed + 4)


def _rope_cache(torch, m: int, d: int, dev):
    pos = torch.arange(m, device=dev, dtype=torch.float32)[:, None]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    ang = torch.cat([pos * inv, pos * inv], dim=-1)
    return ang.cos().to(torch.bfloat16)[:, None, :], ang.sin().to(torch.bfloat16)[:, None, :]


def run(case: Case, ctx: Context) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    r = case.row
    op, dev, bf = r["op"], ctx.device, torch.bfloat16
    i = [0]

    def cycle(sets, body):
        def fn():
            s = sets[i[0] % len(sets)]
            i[0] += 1
            return body(*s)

        return fn

    if op == "copy":
        nelem = r["bytes"] // 2
        dst = torch.empty(nelem, device=dev, dtype=bf)
        sets = rotating(lambda: (torch.randn(nelem, device=dev, dtype=bf),), r["bytes"], ctx)
        fn = cycle(sets, lambda src: dst.copy_(src))
    elif op == "rmsnorm":
        m, n = r["m"], r["n"]
        w = torch.randn(n, device=dev, dtype=bf)
        sets = rotating(lambda: (torch.randn(m, n, device=dev, dtype=bf),), m * n * 2, ctx)
        if hasattr(F, "rms_norm"):
            fn = cycle(sets, lambda x: F.rms_norm(x, (n,), w, 1e-6))
        else:

            def _rms(x):
                xf = x.float()
                return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf) * w

            fn = cycle(sets, _rms)
    elif op == "swiglu":
        m, n = r["m"], r["n"]
        sets = rotating(
            lambda: (
                torch.randn(m, n, device=dev, dtype=bf),
                torch.randn(m, n, device=dev, dtype=bf),
            ),
            2 * m * n * 2,
            ctx,
        )
        fn = cycle(sets, lambda g, u: F.silu(g) * u)
    elif op == "rope":
        m, n = r["m"], r["n"]
        d = 128 if n % 128 == 0 and n >= 128 else 64
        h = n // d
        cos, sin = _rope_cache(torch, m, d, dev)

        def _rope(x):
            x1, x2 = x[..., : d // 2], x[..., d // 2 :]
            return x * cos + torch.cat((-x2, x1), dim=-1) * sin

        sets = rotating(lambda: (torch.randn(m, h, d, device=dev, dtype=bf),), m * n * 2, ctx)
        fn = cycle(sets, _rope)
    elif op == "softmax":
        m, n = r["m"], r["n"]
        sets = rotating(lambda: (torch.randn(m, n, device=dev, dtype=bf),), m * n * 2, ctx)
        fn = cycle(sets, lambda x: torch.softmax(x, dim=-1))
    elif op == "cross_entropy":
        m, n = r["m"], r["n"]
        sets = rotating(
            lambda: (
                torch.randn(m, n, device=dev, dtype=bf),
                torch.randint(0, n, (m,), device=dev),
            ),
            m * n * 2,
            ctx,
        )
        fn = cycle(sets, lambda x, t: F.cross_entropy(x, t))
    elif op == "adamw":
        n = r["n"]
        sizes = [n // 4] * 3 + [n - 3 * (n // 4)]
        params = [
            torch.nn.Parameter(torch.randn(s, device=dev, dtype=torch.float32))
            for s in sizes
            if s > 0
        ]
        for p in params:
            p.grad = torch.randn_like(p)
        fused = ctx.is_cuda
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=fused)
        opt.step()  # creates the state outside the timed region

        def fn():
            opt.step()
    else:
        raise NotImplementedError(f"op {op!r} not in the elementwise suite")
    return {"measured_ms": bench(fn, ctx)}
