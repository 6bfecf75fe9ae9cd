"""Attention suite: ``scaled_dot_product_attention`` with one backend forced.

Layout (batch, heads, seq, head_dim), bf16. ``backend`` is the SDPA backend that was
forced (flash | cudnn | efficient); when the forced backend has no kernel for a case
(e.g. GQA, a head_dim, the CPU) the row says ``unsupported``: we never expand KV heads
or fall back silently, since that would time another kernel. ``attn_fwdbwd`` times
forward and backward together (``torch.autograd.grad`` of the output).
"""

from __future__ import annotations

from typing import Any

from .common import Case, Context, Unsupported, bench, dedupe, rotating, shuffled

NAME = "attention"
BACKENDS = ("flash", "cudnn", "efficient")
FWD_FLOP_CAP = 6e13  # one forward call; fwd+bwd cases use a third of it


def attn_flops(b: int, hq: int, sq: int, skv: int, d: int, causal: bool) -> float:
    f = 4.0 * b * hq * sq * skv * d
    return f / 2 if causal and sq == skv else f


def _case(
    op: str, backend: str, b: int, hq: int, hkv: int, s: int, d: int, causal: bool, family: str
) -> Case:
    row: dict[str, Any] = {
        "op": op,
        "dtype": "bf16",
        "batch": b,
        "seq_q": s,
        "seq_kv": s,
        "heads_q": hq,
        "heads_kv": hkv,
        "head_dim": d,
        "causal": causal,
        "backend": backend,
        "family": family,
    }
    return Case(row=row)


def _fits(c: Case, ctx: Context) -> bool:
    r = c.row
    f = attn_flops(r["batch"], r["heads_q"], r["seq_q"], r["seq_kv"], r["head_dim"], r["causal"])
    cap = FWD_FLOP_CAP if r["op"] == "attn_fwd" else FWD_FLOP_CAP / 3
    if ctx.tiny:
        cap = 1e9
    tokens = r["batch"] * r["seq_q"]
    nbytes = tokens * (2 * r["heads_q"] + 2 * r["heads_kv"]) * r["head_dim"] * 2
    if r["op"] != "attn_fwd":
        nbytes *= 2
    return f <= cap and nbytes <= ctx.input_budget_bytes()


def cases(ctx: Context) -> list[Case]:
    out: list[Case] = []
    ops = ("attn_fwd", "attn_fwdbwd")
    if ctx.tiny:
        for op in ops:
            for be in BACKENDS:
                for hq, hkv in ((4, 4), (4, 2)):
                    out.append(_case(op, be, 1, hq, hkv, 64, 32, True, f"h{hq}kv{hkv}d32"))
                out.append(_case(op, be, 2, 2, 2, 128, 64, False, "h2kv2d64"))
        return [c for c in out if _fits(c, ctx)]

    if ctx.quick:
        seqs = [512, 2048, 8192, 32768]
        grid = [((32, 8), 128), ((16, 16), 128), ((32, 8), 64)]
        extra_tokens: tuple[int, ...] = ()
    else:
        seqs = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
        grid = [
            ((32, 32), 128),
            ((32, 8), 128),
            ((32, 4), 128),
            ((64, 8), 128),
            ((16, 16), 128),
            ((32, 8), 64),
            ((16, 16), 64),
            ((32, 8), 256),
            ((16, 16), 256),
        ]
        extra_tokens = (8192, 131072)
    tokens = 32768
    anchors = [
        _case("attn_fwd", "flash", max(1, tokens // 8192), 32, 8, 8192, 128, True, "h32kv8d128")
    ]
    for (hq, hkv), d in grid:
        for s in seqs:
            for causal in (True, False):
                for op in ops:
                    for be in BACKENDS:
                        out.append(
                            _case(
                                op,
                                be,
                                max(1, tokens // s),
                                hq,
                                hkv,
                                s,
                                d,
                                causal,
                                f"h{hq}kv{hkv}d{d}",
                            )
                        )
    # other batch sizes (same tokens per sequence, different batch), flash only
    for t in extra_tokens:
        for s in seqs:
            if s > t:
                continue
            for causal in (True, False):
                for op in ops:
                    out.append(
                        _case(
                            op,
                            "flash",
                            max(1, t // s),
                            32,
                            8,
                            s,
                            128,
                            causal,
                            f"h32kv8d128/t{t // 1024}k",
                        )
                    )
    out = [c for c in dedupe(anchors + out) if _fits(c, ctx)]
    return shuffled(out, ctx.seed + 2, head=1)


def sdpa_backend(torch, name: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


def make_sdpa_fn(torch, backend: str, causal: bool, gqa: bool):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    be = sdpa_backend(torch, backend)
    kw: dict[str, Any] = {"is_causal": causal}
    if gqa:
        kw["enable_gqa"] = True

    def attn(q, k, v):
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, **kw)

    return attn


def check_finite(torch, t) -> None:
    if not bool(torch.isfinite(t).all()):
        raise RuntimeError("non-finite output")


def run_sdpa(
    ctx: Context,
    *,
    op: str,
    backend: str,
    b: int,
    hq: int,
    hkv: int,
    sq: int,
    skv: int,
    d: int,
    causal: bool,
) -> float:
    import torch

    dev, dt = ctx.device, torch.bfloat16
    attn = make_sdpa_fn(torch, backend, causal, hq != hkv)
    grad = op != "attn_fwd" and op != "attn_decode"

    def make():
        q = torch.randn(b, hq, sq, d, device=dev, dtype=dt, requires_grad=grad)
        k = torch.randn(b, hkv, skv, d, device=dev, dtype=dt, requires_grad=grad)
        v = torch.randn(b, hkv, skv, d, device=dev, dtype=dt, requires_grad=grad)
        return q, k, v

    set_bytes = (b * hq * sq + 2 * b * hkv * skv) * d * 2
    sets = rotating(make, set_bytes, ctx)
    try:
        out = attn(*sets[0])
    except RuntimeError as exc:
        if "No available kernel" in str(exc) or "No viable backend" in str(exc):
            raise Unsupported(f"sdpa backend {backend} has no kernel for this case") from exc
        raise
    check_finite(torch, out)
    i = [0]
    if not grad:

        def fn():
            q, k, v = sets[i[0] % len(sets)]
            i[0] += 1
            return attn(q, k, v)
    else:
        dout = torch.randn_like(out)
        del out

        def fn():
            q, k, v = sets[i[0] % len(sets)]
            i[0] += 1
            o = attn(q, k, v)
            return torch.autograd.grad(o, (q, k, v), dout)

    return bench(fn, ctx)


def run(case: Case, ctx: Context) -> dict[str, Any]:
    r = case.row
    ms = run_sdpa(
        ctx,
        op=r["op"],
        backend=r["backend"],
        b=r["batch"],
        hq=r["heads_q"],
        hkv=r["heads_kv"],
        sq=r["seq_q"],
        skv=r["seq_kv"],
        d=r["head_dim"],
        causal=r["causal"],
    )
    return {"measured_ms": ms}
