"""Time the serving steps of a Llama-3-8B-shaped model on one GPU, in plain PyTorch.

    python3 -m calibrate.steps.serve_step --out DIR [--tiny] [--phases prefill,decode]
        [--prefill-batches 1,2,4] [--prompt-lens 512,1024] [--decode-batches 1,8]
        [--context-lens 1024,2048] [--max-prefill-tokens 65536] [--decode-mode graph|eager]
        [--time-budget-s S] [--device auto|cuda|cpu] [--seed 0]

The model: Llama-3-8B shapes (32 layers, hidden 4096, 32 query / 8 KV heads of 128,
SwiGLU 14336, vocabulary 128256), bf16, random weights N(0, 0.02), fused QKV and
fused gate-up projections, RMSNorm/RoPE/SiLU as eager elementwise ops (not fused
kernels). The KV cache is preallocated, static and contiguous (not paged):
``[layers, 2, batch, kv_heads, max_ctx, head_dim]``, one per config.

* prefill: ``batch`` prompts of ``prompt_len`` tokens, causal attention through
  ``F.scaled_dot_product_attention(is_causal=True)`` (default backend choice), K/V
  written into the cache, final norm and LM head on each sequence's last token only.
  Eager; median of ``--reps`` (>= 5) after warm-up, CUDA events. Configs over
  ``--max-prefill-tokens`` tokens per step are skipped.
* decode: one new token for each of ``batch`` sequences whose cache holds
  ``context_len`` tokens (the new token attends to context_len + 1 keys); the query
  [batch, heads, 1, head_dim] against the cache slice through SDPA, LM head and greedy
  argmax. Each (batch, context) is captured once in a CUDA graph and timed by
  replaying it (median of ``--reps`` replays after warm-up). Configs whose KV cache
  would not fit in free GPU memory are skipped; on a CPU the graph path is recorded as
  ``unsupported`` (``--decode-mode eager`` times it eagerly instead).

One row of ``serve_step.csv`` per config; ``serve_step.meta.json`` holds the GPU,
driver, versions, clocks and the layout notes above.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from calibrate.bench import common as C
from calibrate.steps import (
    Arch,
    Marks,
    RowWriter,
    add_common_args,
    base_meta,
    free_memory,
    median,
    rope_table,
    run_guarded,
    sdpa_choice,
    tracing,
)

COLUMNS = (
    "phase",
    "batch",
    "prompt_len",
    "context_len",
    "step_ms",
    "tokens",
    "tokens_per_s",
    "kv_cache_bytes",
    "sdpa_backend",
    "timing",
    "reps",
    "status",
    "error",
)

GiB = 1 << 30


LLAMA3_8B = Arch(32, 4096, 32, 8, 14336, 128256, head_dim=128)
TINY = Arch(2, 64, 4, 2, 128, 256, head_dim=16)
#: --model choices: Llama-3-8B (the default, fitted on) and a Qwen2.5-7B-shaped model
#: (GQA 28/4, 152k vocabulary; no QKV bias here), held out of every fit.
MODELS = {
    "llama3-8b": LLAMA3_8B,
    "qwen2.5-7b-like": Arch(28, 3584, 28, 4, 18944, 152064, head_dim=128, rope_theta=1e6),
}

PREFILL_BATCHES = (1, 2, 4, 8, 16)
PROMPT_LENS = (512, 1024, 2048, 4096, 8192)
DECODE_BATCHES = (1, 8, 32, 64, 128, 256)
CONTEXT_LENS = (1024, 2048, 4096, 8192)
TINY_PREFILL_BATCHES = (1, 2)
TINY_PROMPT_LENS = (16, 32)
TINY_DECODE_BATCHES = (1, 4)
TINY_CONTEXT_LENS = (16, 32)

# Left free beside the weights and a config's KV cache, for activations, the graph
# pool, cuBLAS workspaces and fragmentation.
HEADROOM_BYTES = 3 * GiB


class Skip(Exception):
    """Known not to fit (or over a cap): recorded as 'skipped', never attempted."""


# --------------------------------------------------------------------------- model


def make_weights(arch: Arch, device: str, dtype, seed: int) -> dict[str, Any]:
    """Random weights N(0, 0.02) (norm weights 1), QKV and gate-up fused."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype).mul_(0.02)

    h, d = arch.hidden, arch.head_dim
    layers = []
    for _ in range(arch.layers):
        layers.append(
            {
                "attn_norm": torch.ones(h, device=device, dtype=dtype),
                "wqkv": rnd((arch.heads + 2 * arch.kv_heads) * d, h),
                "wo": rnd(h, arch.heads * d),
                "mlp_norm": torch.ones(h, device=device, dtype=dtype),
                "wgu": rnd(2 * arch.ffn, h),
                "wdown": rnd(h, arch.ffn),
            }
        )
    return {
        "embed": rnd(arch.vocab, h),
        "layers": layers,
        "norm": torch.ones(h, device=device, dtype=dtype),
        "lm_head": rnd(arch.vocab, h),
    }


def make_cache(arch: Arch, batch: int, max_ctx: int, device: str, dtype, seed: int):
    """[layers, 2, batch, kv_heads, max_ctx, head_dim], contiguous, filled with random
    values (attention over zeros or uninitialised memory would time other data)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed + 1)
    shape = (arch.layers, 2, batch, arch.kv_heads, max_ctx, arch.head_dim)
    return torch.randn(*shape, generator=gen, device=device, dtype=dtype)


def _rmsnorm(x, w, eps: float):
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rope(x, cos, sin):
    import torch

    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


def _layer(arch: Arch, lw: dict, x, cache_l, start: int, cos, sin, gqa: str):
    """One decoder layer over ``x`` [B, S, h] whose tokens sit at positions
    start..start+S-1: writes their K/V into ``cache_l`` [2, B, kvh, max_ctx, d] and
    attends causally over positions 0..start+S-1."""
    import torch.nn.functional as F

    b, s, _ = x.shape
    hq, hk, d = arch.heads, arch.kv_heads, arch.head_dim
    qkv = F.linear(_rmsnorm(x, lw["attn_norm"], arch.norm_eps), lw["wqkv"])
    q, k, v = qkv.split((hq * d, hk * d, hk * d), dim=-1)
    q = _rope(q.view(b, s, hq, d).transpose(1, 2), cos, sin)
    k = _rope(k.view(b, s, hk, d).transpose(1, 2), cos, sin)
    v = v.view(b, s, hk, d).transpose(1, 2)
    cache_l[0, :, :, start : start + s].copy_(k)
    cache_l[1, :, :, start : start + s].copy_(v)
    if start == 0:
        # prefill: attend over the fresh K/V, causal
        keys, vals, causal = k, v, True
    else:
        # decode: S == 1 query at the end attends over the whole cache prefix
        if s != 1:
            raise ValueError("a step after the prefill must be one token per sequence")
        keys, vals, causal = cache_l[0, :, :, : start + 1], cache_l[1, :, :, : start + 1], False
    grouped = hk != hq
    if grouped and gqa == "repeat":
        keys = keys.repeat_interleave(hq // hk, dim=1)
        vals = vals.repeat_interleave(hq // hk, dim=1)
    o = F.scaled_dot_product_attention(
        q, keys, vals, is_causal=causal, enable_gqa=grouped and gqa == "native"
    )
    x = x + F.linear(o.transpose(1, 2).reshape(b, s, hq * d), lw["wo"])
    gu = F.linear(_rmsnorm(x, lw["mlp_norm"], arch.norm_eps), lw["wgu"])
    g, u = gu.chunk(2, dim=-1)
    return x + F.linear(F.silu(g) * u, lw["wdown"])


def forward(arch: Arch, w: dict, cache, tokens, start: int, rope, gqa: str = "native"):
    """Logits [B, vocab] of the last token of ``tokens`` [B, S] placed at positions
    start..start+S-1 (prefill: start 0; decode: S 1 at start = context_len)."""
    import torch.nn.functional as F

    s = tokens.shape[1]
    cos, sin = rope[0][start : start + s], rope[1][start : start + s]
    x = F.embedding(tokens, w["embed"])
    for i, lw in enumerate(w["layers"]):
        x = _layer(arch, lw, x, cache[i], start, cos, sin, gqa)
    return F.linear(_rmsnorm(x[:, -1], w["norm"], arch.norm_eps), w["lm_head"])


def decode_step(arch: Arch, w: dict, cache, tokens, context_len: int, rope, gqa: str):
    """One decode step: logits and the greedy next token of each sequence."""
    logits = forward(arch, w, cache, tokens, context_len, rope, gqa)
    return logits, logits.argmax(dim=-1)


# --------------------------------------------------------------------------- timing


def time_eager(
    fn, ctx: C.Context, warmup: int, reps: int, trace: Path | None = None
) -> tuple[float, int]:
    """Median of ``reps`` timed eager runs; then, if asked, a profiler trace of ``fn``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        m = Marks(ctx.is_cuda)
        m.mark()
        fn()
        m.mark()
        times.append(m.intervals_ms()[0])
    if trace is not None:
        tracing.capture(fn, trace, steps=2, cuda=ctx.is_cuda)
    return median(times), reps


def time_graph(
    fn, ctx: C.Context, warmup: int, reps: int, trace: Path | None = None
) -> tuple[float, int]:
    """Capture ``fn`` once in a CUDA graph; median of ``reps`` timed replays; then, if
    asked, a profiler trace of two replays."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(max(1, warmup)):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    ms = median([a.elapsed_time(b) for a, b in zip(starts, ends, strict=True)])
    if trace is not None:
        tracing.capture(graph.replay, trace, steps=2, cuda=True)
    del graph
    return ms, reps


def resolve_gqa(mode: str, arch: Arch, q, k, causal: bool) -> tuple[str, str]:
    """(gqa handling, SDPA backend the default dispatch picks); ``auto`` passes grouped
    KV heads to SDPA unless that would pick the unfused math kernel on a GPU."""
    if arch.kv_heads == arch.heads:
        return "mha", sdpa_choice(q, k, k, is_causal=causal, enable_gqa=False)
    native = sdpa_choice(q, k, k, is_causal=causal, enable_gqa=True)
    if mode == "native" or (mode == "auto" and (not q.is_cuda or native not in ("MATH", "ERROR"))):
        return "native", native
    kr = k.repeat_interleave(arch.heads // arch.kv_heads, dim=1)
    return "repeat", sdpa_choice(q, kr, kr, is_causal=causal, enable_gqa=False)


def check_fits(ctx: C.Context, kv_bytes: int, extra_bytes: int) -> None:
    if not ctx.is_cuda:
        return
    import torch

    free, _ = torch.cuda.mem_get_info()
    need = kv_bytes + extra_bytes + HEADROOM_BYTES
    if need > free:
        raise Skip(
            f"KV cache {kv_bytes / GiB:.1f} GiB + work {extra_bytes / GiB:.1f} GiB "
            f"+ headroom {HEADROOM_BYTES / GiB:.0f} GiB > free {free / GiB:.1f} GiB"
        )


def run_prefill(arch, w, rope, batch, prompt, args, ctx, dtype) -> dict[str, Any]:
    import torch

    C.maybe_inject_failure("prefill")
    tokens_n = batch * prompt
    kv_bytes = arch.kv_bytes_per_token() * tokens_n
    if tokens_n > args.max_prefill_tokens:
        raise Skip(f"{tokens_n} tokens per step > --max-prefill-tokens {args.max_prefill_tokens}")
    # activations of one layer at a time: the gate-up output dominates (bf16)
    check_fits(ctx, kv_bytes, tokens_n * (2 * arch.ffn + 8 * arch.hidden) * 2)
    gen = torch.Generator(device=ctx.device).manual_seed(args.seed)
    tokens = torch.randint(0, arch.vocab, (batch, prompt), device=ctx.device, generator=gen)
    cache = make_cache(arch, batch, prompt, ctx.device, dtype, args.seed)
    q = torch.empty(batch, arch.heads, prompt, arch.head_dim, device=ctx.device, dtype=dtype)
    k = cache[0, 0, :, :, :prompt]
    gqa, backend = resolve_gqa(args.gqa, arch, q, k, True)
    del q, k

    def fn():
        return forward(arch, w, cache, tokens, 0, rope, gqa)

    with torch.inference_mode():
        logits = fn()
        if not bool(torch.isfinite(logits).all()):
            raise RuntimeError("non-finite logits")
        trace = _trace_path(args, "prefill", batch, prompt)
        ms, reps = time_eager(fn, ctx, args.warmup, args.reps, trace)
    return {
        "step_ms": ms,
        "tokens": tokens_n,
        "tokens_per_s": tokens_n / (ms / 1e3),
        "kv_cache_bytes": kv_bytes,
        "sdpa_backend": backend,
        "timing": "eager",
        "reps": reps,
    }


def run_decode(arch, w, rope, batch, context, args, ctx, dtype) -> dict[str, Any]:
    import torch

    C.maybe_inject_failure("decode")
    use_graph = args.decode_mode == "graph"
    if use_graph and not ctx.is_cuda:
        raise C.Unsupported("CUDA graphs need a CUDA device (use --decode-mode eager on a CPU)")
    max_ctx = context + 1
    kv_bytes = arch.kv_bytes_per_token() * batch * max_ctx
    check_fits(ctx, kv_bytes, batch * arch.vocab * 8 + batch * 2 * arch.ffn * 2)
    gen = torch.Generator(device=ctx.device).manual_seed(args.seed)
    tokens = torch.randint(0, arch.vocab, (batch, 1), device=ctx.device, generator=gen)
    cache = make_cache(arch, batch, max_ctx, ctx.device, dtype, args.seed)
    q = torch.empty(batch, arch.heads, 1, arch.head_dim, device=ctx.device, dtype=dtype)
    gqa, backend = resolve_gqa(args.gqa, arch, q, cache[0, 0, :, :, :max_ctx], False)
    del q

    def fn():
        return decode_step(arch, w, cache, tokens, context, rope, gqa)

    with torch.inference_mode():
        logits, _ = fn()
        if not bool(torch.isfinite(logits).all()):
            raise RuntimeError("non-finite logits")
        del logits
        trace = _trace_path(args, f"decode-{args.decode_mode}", batch, context)
        if use_graph:
            ms, reps = time_graph(fn, ctx, args.warmup, args.reps, trace)
        else:
            ms, reps = time_eager(fn, ctx, args.warmup, args.reps, trace)
    return {
        "step_ms": ms,
        "tokens": batch,
        "tokens_per_s": batch / (ms / 1e3),
        "kv_cache_bytes": kv_bytes,
        "sdpa_backend": backend,
        "timing": "cuda_graph" if use_graph else "eager",
        "reps": reps,
    }


# --------------------------------------------------------------------------- driver


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"{flag}: {text!r} is not a comma list of integers") from None
    if not vals or min(vals) < 1:
        raise SystemExit(f"{flag}: {text!r} needs positive integers")
    return vals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python3 -m calibrate.steps.serve_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--tiny", action="store_true", help="tiny model and shapes (CPU tests)")
    ap.add_argument("--phases", default="prefill,decode", help="prefill, decode or both")
    ap.add_argument(
        "--model",
        default="llama3-8b",
        choices=tuple(MODELS),
        help="model shape (default llama3-8b)",
    )
    ap.add_argument("--prefill-batches", default="")
    ap.add_argument("--prompt-lens", default="")
    ap.add_argument("--decode-batches", default="")
    ap.add_argument("--context-lens", default="")
    ap.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=65536,
        help="skip prefill configs with more tokens per step (default 65536)",
    )
    ap.add_argument(
        "--decode-mode",
        default="graph",
        choices=("graph", "eager"),
        help="decode steps replayed from a CUDA graph (default) or run eagerly",
    )
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    ap.add_argument(
        "--reps", type=int, default=0, help="timed runs (default: 5 prefill, 20 decode)"
    )
    ap.add_argument(
        "--prefill-share",
        type=float,
        default=0.5,
        help="share of --time-budget-s the prefill phase may use (default 0.5)",
    )
    add_common_args(ap)
    args = ap.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    bad = [p for p in phases if p not in ("prefill", "decode")]
    if bad or not phases:
        ap.error(f"--phases {args.phases!r}: allowed prefill, decode (comma list)")
    args.phase_list = phases
    if args.reps and args.reps < 5:
        ap.error("--reps must be >= 5")
    return args


def plan(args) -> list[tuple[str, int, int]]:
    t = args.tiny
    pb = (
        _ints(args.prefill_batches, "--prefill-batches")
        if args.prefill_batches
        else (TINY_PREFILL_BATCHES if t else PREFILL_BATCHES)
    )
    pl = (
        _ints(args.prompt_lens, "--prompt-lens")
        if args.prompt_lens
        else (TINY_PROMPT_LENS if t else PROMPT_LENS)
    )
    db = (
        _ints(args.decode_batches, "--decode-batches")
        if args.decode_batches
        else (TINY_DECODE_BATCHES if t else DECODE_BATCHES)
    )
    cl = (
        _ints(args.context_lens, "--context-lens")
        if args.context_lens
        else (TINY_CONTEXT_LENS if t else CONTEXT_LENS)
    )
    cfgs: list[tuple[str, int, int]] = []
    if "prefill" in args.phase_list:
        # fewest tokens first: a run cut short by its budget loses the largest steps
        cfgs += sorted(
            (("prefill", b, p) for b in pb for p in pl), key=lambda c: (c[1] * c[2], c[2])
        )
    if "decode" in args.phase_list:
        cfgs += [("decode", b, c) for c in cl for b in db]
    return cfgs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    arch = TINY if args.tiny else MODELS[args.model]
    args.model_name = "tiny" if args.tiny else args.model
    cfgs = plan(args)
    if args.list:
        print(f"model: {asdict(arch)} params={arch.params():,}")
        for c in cfgs:
            print("   ", c)
        return 0
    warnings.filterwarnings("ignore", category=UserWarning)
    import torch

    mode = "tiny" if args.tiny else "full"
    ctx = C.make_context(mode, args.device, "events", args.seed)
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "serve_step.meta.json"
    meta = base_meta(ctx, args, "calibrate.steps.serve_step")
    meta["model"] = {
        **asdict(arch),
        "name": "tiny" if args.tiny else f"{args.model}-shaped",
        "params": arch.params(),
        "dtype": str(dtype).replace("torch.", ""),
        "weights": "random N(0, 0.02), norm weights 1; fused QKV and fused gate-up",
        "kv_bytes_per_token": arch.kv_bytes_per_token(),
    }
    meta["method"] = {
        "kv_cache": "static, preallocated, contiguous (NOT paged): one tensor [layers, 2, "
        "batch, kv_heads, max_ctx, head_dim] per config; max_ctx = prompt_len (prefill) "
        "or context_len + 1 (decode); filled with random values",
        "elementwise": "RMSNorm, RoPE, SiLU*mul as eager torch ops (not fused kernels)",
        "prefill": "eager; causal SDPA over the fresh K/V, K/V copied into the cache; final "
        "norm + LM head on the last token only; no sampling",
        "decode": "one token per sequence at position context_len attending to "
        "context_len + 1 cached keys (SDPA, query length 1, not causal); LM head + greedy "
        "argmax; one CUDA graph per (batch, context_len), timed by replays",
        "timing": "median of reps runs after warm-up; CUDA events around each",
        "skips": f"prefill over --max-prefill-tokens; configs whose KV cache + work + "
        f"{HEADROOM_BYTES // GiB} GiB headroom exceed free GPU memory",
        "sdpa_backend": "what torch._fused_sdp_choice returned for the config's inputs",
        "precision": f"{str(dtype).replace('torch.', '')} weights, activations and cache",
    }
    meta["runs"] = []
    C.write_json_atomic(meta_path, meta)
    sink = RowWriter(out / "serve_step.csv", COLUMNS)
    print(
        f"device={ctx.device} gpu={ctx.gpu_name or '-'} torch={torch.__version__} "
        f"mode={mode} params={arch.params():,} out={out}",
        flush=True,
    )

    t0 = time.monotonic()
    budget = args.time_budget_s if args.time_budget_s is not None else math.inf
    deadline = t0 + budget
    prefill_deadline = t0 + budget * args.prefill_share if "decode" in args.phase_list else deadline
    if "prefill" not in args.phase_list:
        prefill_deadline = deadline
    tb = time.monotonic()
    w = None
    try:
        w = make_weights(arch, ctx.device, dtype, args.seed)
        rope = rope_table(arch, max(c[2] for c in cfgs) + 1, ctx.device)
        C.synchronize(ctx)
        meta["model"]["build_s"] = round(time.monotonic() - tb, 2)
        if ctx.is_cuda:
            meta["model"]["weights_allocated_bytes"] = int(torch.cuda.memory_allocated())
    except Exception as exc:
        status, err = C.classify(exc)
        for phase, b, n in cfgs:
            sink.write(_row(phase, b, n) | {"status": status, "error": "model build: " + err})
        meta.update(counts=sink.counts(), fatal="model build: " + err)
        C.write_json_atomic(meta_path, meta)
        print(f"[serve_step] model build failed: {err}", flush=True)
        return 3

    not_run: list[str] = []
    fatal = ""
    for phase, b, n in cfgs:
        limit = prefill_deadline if phase == "prefill" else deadline
        if fatal or time.monotonic() > limit:
            not_run.append(f"{phase} {b}x{n}")
            continue
        row = _row(phase, b, n)
        run = run_prefill if phase == "prefill" else run_decode
        reps = args.reps or (5 if phase == "prefill" else 20)

        def one(run=run, b=b, n=n, reps=reps) -> dict[str, Any]:
            return run(arch, w, rope, b, n, _with(args, reps=reps), ctx, dtype)

        fatal = run_guarded(row, one, ctx, skip=Skip) or fatal
        free_memory(ctx.is_cuda)
        sink.write(row)
        print(_line(row), flush=True)
    meta.update(
        counts=sink.counts(),
        not_run=not_run,
        fatal=fatal or None,
        elapsed_s=round(time.monotonic() - t0, 1),
        clocks_after=C.clocks_snapshot(ctx),
    )
    C.write_json_atomic(meta_path, meta)
    print(f"[serve_step] {sink.counts()} not_run={len(not_run)} -> {sink.path}", flush=True)
    return 3 if fatal else 0


def _trace_path(args: argparse.Namespace, phase: str, batch: int, n: int) -> Path | None:
    """Where this config's profiler trace goes (``--trace-dir``), or None."""
    if not args.trace_dir:
        return None
    return Path(args.trace_dir) / tracing.trace_name(args.model_name, phase, f"{batch}x{n}")


def _with(args: argparse.Namespace, **kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **kw})


def _row(phase: str, batch: int, n: int) -> dict[str, Any]:
    row: dict[str, Any] = {"phase": phase, "batch": batch}
    row["prompt_len" if phase == "prefill" else "context_len"] = n
    return row


def _line(row: dict[str, Any]) -> str:
    n = row.get("prompt_len") or row.get("context_len")
    base = f"[serve_step] {row['phase']} b={row['batch']} n={n} {row['status']}"
    if row["status"] != "ok":
        return f"{base} {str(row.get('error', ''))[:140]}"
    return (
        f"{base} {row['step_ms']:.2f}ms tok/s={row['tokens_per_s']:.0f} "
        f"kv={row['kv_cache_bytes'] / GiB:.2f}GiB sdpa={row['sdpa_backend']} {row['timing']}"
    )


if __name__ == "__main__":
    sys.exit(main())
