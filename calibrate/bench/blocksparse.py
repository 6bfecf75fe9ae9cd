"""Block-sparse attention suite: compiled ``flex_attention`` over block masks.

Every pattern is a per-(head, q-block, kv-block) table T of visited tiles plus an
element rule (causal, sliding window). The BlockMask is built at block level with
``BlockMask.from_kv_blocks`` (no N x N tensor: seq 64k stays cheap): a tile is
*full* when T visits it and every element passes the rule, *partial* when some do
(the kernel then evaluates ``mask_mod`` inside it). One ``mask_mod`` code object
serves every pattern (T, the causal flag and the window are tensors it closes over),
so one compiled kernel per (seq, heads, block size) group serves all patterns.

``density`` = (kv_num_blocks + full_kv_num_blocks summed) / (batch * heads *
q_blocks * kv_blocks): the fraction of tiles visited. ``attn_blocksparse_bwd`` rows
are the backward alone: median(fwd+bwd) - median(fwd), both timed here.

Patterns: dense (non-causal, density 1), causal, window (causal sliding window of w
tokens), topk (random k kv-blocks per q-block among the causal ones, diagonal always),
s2 (per-head strided: local blocks plus every stride-th block from a per-head offset),
nsa (initial block + local blocks + n random selected blocks).
"""

from __future__ import annotations

import time
from typing import Any

from .common import Case, Context, Unsupported, bench

NAME = "blocksparse"
HEAD_DIM = 128
COMPILE_RESERVE_S = 10.0  # don't start a new compiled group with less time left


def _pattern_specs(S: int, bs: int, quick: bool, tiny: bool) -> list[tuple[str, str, dict]]:
    """(pattern, family, params)."""
    nb = S // bs
    specs: list[tuple[str, str, dict]] = [("dense", "dense", {}), ("causal", "causal", {})]
    windows = [256, 2048] if (quick or tiny) else [256, 1024, 4096, 8192]
    for w in windows:
        if w < S:
            specs.append(("window", f"window/w{w}", {"w": w}))
    topk = [4, 16] if (quick or tiny) else [2, 4, 8, 16, 32]
    for k in topk:
        if k < nb:
            specs.append(("topk", f"topk/k{k}", {"k": k}))
    s2 = [(2, 4)] if tiny else [(2, 8)] if quick else [(2, 4), (2, 8), (2, 16), (4, 8), (4, 16)]
    for loc, stride in s2:
        if stride < nb:
            specs.append(("s2", f"s2/l{loc}s{stride}", {"local": loc, "stride": stride}))
    nsa = [(2, 4)] if (quick or tiny) else [(2, 4), (2, 16), (4, 8), (4, 32)]
    for loc, sel in nsa:
        if loc + sel + 1 < nb:
            specs.append(("nsa", f"nsa/l{loc}n{sel}", {"local": loc, "sel": sel}))
    return specs


def block_layout(torch, pattern: str, params: dict, H: int, S: int, bs: int, seed: int):
    """(T [H,nq,nkv] bool, causal: bool, window: int) on the CPU, deterministic."""
    nb = S // bs
    qb = torch.arange(nb)[:, None]
    kb = torch.arange(nb)[None, :]
    lower = (kb <= qb).expand(H, nb, nb)
    g = torch.Generator().manual_seed(seed)
    if pattern == "dense":
        return torch.ones(H, nb, nb, dtype=torch.bool), False, S
    if pattern == "causal":
        return lower.clone(), True, S
    if pattern == "window":
        return lower.clone(), True, int(params["w"])
    if pattern in ("topk", "nsa"):
        n_sel = params["k"] if pattern == "topk" else params["sel"]
        scores = torch.rand(H, nb, nb, generator=g)
        scores = scores.masked_fill(~lower, -1.0)
        if pattern == "topk":
            scores[:, torch.arange(nb), torch.arange(nb)] = 2.0  # the diagonal always
        k = min(n_sel, nb)
        idx = scores.topk(k, dim=-1).indices
        T = torch.zeros(H, nb, nb, dtype=torch.bool)
        T.scatter_(-1, idx, True)
        if pattern == "nsa":
            T |= (kb == 0).expand(H, nb, nb)
            T |= ((qb - kb) < params["local"]).expand(H, nb, nb)
        return T & lower, True, S
    if pattern == "s2":
        offs = torch.arange(H)[:, None, None] % params["stride"]
        T = ((qb - kb) < params["local"]) | ((kb % params["stride"]) == offs)
        return T & lower, True, S
    raise ValueError(f"unknown pattern {pattern!r}")


def classify_blocks(torch, T, causal: bool, window: int, bs: int):
    """(partial, full) bool tables for tile visits under the element rule
    (q >= kv if causal) and (q - kv < window)."""
    nb = T.shape[-1]
    diff = (torch.arange(nb)[:, None] - torch.arange(nb)[None, :]) * bs
    dmin, dmax = diff - (bs - 1), diff + (bs - 1)
    lo = 0 if causal else -(10**12)
    hi = window - 1
    any_ok = (dmax >= lo) & (dmin <= hi)
    all_ok = (dmin >= lo) & (dmax <= hi)
    full = T & all_ok
    partial = T & any_ok & ~all_ok
    return partial, full


def density_of(torch, partial, full) -> float:
    return float((partial.sum() + full.sum()).item()) / partial.numel()


def _groups(ctx: Context) -> list[tuple[str, int, int, int]]:
    """(kind, S, H, block_size)."""
    if ctx.tiny:
        return [("fwd", 1024, 2, 128), ("bwd", 1024, 2, 128)]
    if ctx.quick:
        return [("fwd", 8192, 16, 128), ("bwd", 8192, 16, 128), ("fwd", 32768, 16, 128)]
    return [
        ("fwd", 16384, 16, 128),
        ("fwd", 4096, 32, 128),
        ("fwd", 65536, 16, 128),
        ("bwd", 16384, 16, 128),
        ("fwd", 16384, 16, 64),
        ("fwd", 32768, 32, 128),
        ("bwd", 4096, 32, 128),
        ("fwd", 8192, 32, 128),
        ("fwd", 131072, 8, 128),
        ("bwd", 8192, 16, 64),
        ("fwd", 4096, 16, 64),
        ("bwd", 32768, 16, 128),
    ]


def cases(ctx: Context) -> list[Case]:
    import torch

    out = []
    for kind, S, H, bs in _groups(ctx):
        group = f"{kind}/s{S}h{H}b{bs}"
        specs = _pattern_specs(S, bs, ctx.quick, ctx.tiny)
        for j, (pattern, family, params) in enumerate(specs):
            seed = ctx.seed * 1000 + j
            T, causal, window = block_layout(torch, pattern, params, H, S, bs, seed)
            partial, full = classify_blocks(torch, T, causal, window, bs)
            row: dict[str, Any] = {
                "op": "attn_blocksparse_fwd" if kind == "fwd" else "attn_blocksparse_bwd",
                "dtype": "bf16",
                "batch": 1,
                "seq_q": S,
                "seq_kv": S,
                "heads_q": H,
                "heads_kv": H,
                "head_dim": HEAD_DIM,
                "causal": causal,
                "backend": "flex",
                "density": round(density_of(torch, partial, full), 6),
                "block_size": bs,
                "family": family,
                "pattern": pattern,
            }
            out.append(
                Case(row=row, params={"pattern": pattern, "p": params, "seed": seed}, group=group)
            )
    return out


_COMPILED: dict[str, Any] = {}


def _flex(torch):
    if "flex" not in _COMPILED:
        from torch.nn.attention.flex_attention import flex_attention

        try:
            import torch._dynamo as dynamo

            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(dynamo.config, name):
                    setattr(dynamo.config, name, 256)
        except Exception:
            pass
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def build_block_mask(torch, T, causal: bool, window: int, bs: int, device: str):
    from torch.nn.attention.flex_attention import BlockMask

    partial, full = classify_blocks(torch, T, causal, window, bs)

    def ordered(tbl):
        num = tbl.sum(-1).to(torch.int32)[None]
        idx = torch.argsort(tbl.to(torch.int8), dim=-1, descending=True, stable=True)
        return num.to(device), idx.to(torch.int32)[None].to(device)

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    Td = T.to(device)
    c_t = torch.tensor(1 if causal else 0, device=device)
    w_t = torch.tensor(window, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        inside = Td[h, q_idx // bs, kv_idx // bs]
        ok_c = (q_idx >= kv_idx) | (c_t == 0)
        return inside & ok_c & ((q_idx - kv_idx) < w_t)

    bm = BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=bs, mask_mod=mask_mod
    )
    dens = (float(kv_num.sum().item()) + float(full_num.sum().item())) / (
        T.shape[0] * T.shape[1] * T.shape[2]
    )
    return bm, dens


def before_group(group: str, ctx: Context, deadline: float) -> str | None:
    left = deadline - time.monotonic()
    need = COMPILE_RESERVE_S * (2 if group.startswith("bwd") else 1)
    if ctx.is_cuda and not ctx.tiny and left < need:
        return f"only {left:.0f}s left, a compile needs ~{need:.0f}s"
    return None


def run(case: Case, ctx: Context) -> dict[str, Any]:
    import torch

    if not ctx.is_cuda:
        raise Unsupported("flex_attention benchmarks need CUDA (Triton kernels)")
    r = case.row
    S, H, bs = r["seq_q"], r["heads_q"], r["block_size"]
    T, causal, window = block_layout(
        torch, case.params["pattern"], case.params["p"], H, S, bs, case.params["seed"]
    )
    bm, dens = build_block_mask(torch, T, causal, window, bs, ctx.device)
    if abs(dens - r["density"]) > 1e-5:
        raise RuntimeError(f"block-mask density {dens} != planned {r['density']}")
    flex = _flex(torch)
    bwd = r["op"] == "attn_blocksparse_bwd"
    dev, dt = ctx.device, torch.bfloat16
    q, k, v = (
        torch.randn(1, H, S, HEAD_DIM, device=dev, dtype=dt, requires_grad=bwd) for _ in range(3)
    )
    # flex's default tiles on Hopper are 128 x 64; block size 64 needs 64-row tiles
    # (the backward picks a config that divides the block size by itself).
    opts = None
    if bs < 128:
        opts = {"fwd_BLOCK_M": bs, "fwd_BLOCK_N": bs} if bwd else {"BLOCK_M": bs, "BLOCK_N": bs}
    t0 = time.monotonic()
    out = flex(q, k, v, block_mask=bm, kernel_options=opts)
    torch.cuda.synchronize()
    t_first = time.monotonic() - t0
    if t_first > 5:
        print(f"[blocksparse] first call (compile) {t_first:.1f}s for {case.group}", flush=True)
    if not bool(torch.isfinite(out).all()):
        raise RuntimeError("non-finite output")

    def fwd():
        return flex(q, k, v, block_mask=bm, kernel_options=opts)

    fwd_ms = bench(fwd, ctx)
    if not bwd:
        return {"measured_ms": fwd_ms}
    dout = torch.randn_like(out)
    torch.autograd.grad(out, (q, k, v), dout)
    del out

    def fwdbwd():
        o = flex(q, k, v, block_mask=bm, kernel_options=opts)
        return torch.autograd.grad(o, (q, k, v), dout)

    fb_ms = bench(fwdbwd, ctx)
    return {"measured_ms": max(fb_ms - fwd_ms, 0.0)}
