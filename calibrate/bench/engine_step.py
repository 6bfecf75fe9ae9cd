"""A decode step of a Llama-3-8B-shaped model with FlashInfer's paged attention, timed.

    python3 -m calibrate.bench.engine_step --out DIR [--batches 1,8,32] [--contexts 1024]
        [--time-budget-s S] [--mem-fraction F] [--traces] [--tiny]

The model and weights are ``calibrate.steps.serve_step``'s (Llama-3-8B shapes, bf16,
random weights, eager RMSNorm/RoPE/SiLU, fused QKV and gate-up GEMMs); only the KV cache
and attention differ, as a serving engine's do: every layer's cache is a pool of pages
(``[pages, 2, 16, kv_heads, head_dim]``, NHD, page size 16) and each sequence a random
draw of its pages; the new token's K and V are scattered into its page slot (one
index-put per layer, as vLLM's ``reshape_and_cache``) and attention is
``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, use_cuda_graph=True)``
(vLLM V1's FlashInfer backend), planned once before capture. The whole step (embedding,
32 layers, final norm, LM head, argmax) is captured in one CUDA graph and its replays
are timed (median). With ``--traces``, a trimmed ``torch.profiler`` trace of two
replays is kept per shape (``calibrate.steps.tracing``).

Rows of ``engine_step.csv``: batch, context_len (tokens in each sequence's cache; the new
token attends to context_len + 1 keys, as in ``serve_step``), step_ms, kv_cache_bytes,
status. Imports only the standard library and this repository's stdlib-only helpers at
module level.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (the device copy): the repo root on the path
    sys.path.insert(0, os.getcwd())

from calibrate.bench import common as C  # noqa: E402
from calibrate.steps import Arch, RowWriter, rope_table, tracing  # noqa: E402
from calibrate.steps.serve_step import (  # noqa: E402
    LLAMA3_8B,
    TINY,
    _rmsnorm,
    _rope,
    make_weights,
)

PAGE_SIZE = 16
COLUMNS = ("batch", "context_len", "step_ms", "kv_cache_bytes", "attention", "timing", "reps",
           "status", "error")  # fmt: skip


def _step(arch: Arch, w: dict, kv, wrapper, tokens, pos, slot_page, slot_off, cos, sin):
    """Logits' argmax of one decode step; writes each layer's new K/V into its page slot."""
    import torch.nn.functional as F

    b = tokens.shape[0]
    hq, hk, d = arch.heads, arch.kv_heads, arch.head_dim
    x = F.embedding(tokens, w["embed"])  # [b, h]
    c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)  # [b, 1, d]
    for i, lw in enumerate(w["layers"]):
        qkv = F.linear(_rmsnorm(x, lw["attn_norm"], arch.norm_eps), lw["wqkv"])
        q, k, v = qkv.split((hq * d, hk * d, hk * d), dim=-1)
        q = _rope(q.view(b, hq, d), c, s)
        k = _rope(k.view(b, hk, d), c, s)
        kv[i][slot_page, 0, slot_off] = k
        kv[i][slot_page, 1, slot_off] = v.view(b, hk, d)
        o = wrapper.run(q, kv[i])
        x = x + F.linear(o.reshape(b, hq * d), lw["wo"])
        gu = F.linear(_rmsnorm(x, lw["mlp_norm"], arch.norm_eps), lw["wgu"])
        g, u = gu.chunk(2, dim=-1)
        x = x + F.linear(F.silu(g) * u, lw["wdown"])
    logits = F.linear(_rmsnorm(x, w["norm"], arch.norm_eps), w["lm_head"])
    return logits.argmax(dim=-1)


def run_one(arch, w, rope, kv, pages, ws, batch, context, ctx, reps, trace) -> dict[str, Any]:
    import flashinfer
    import torch

    dev = ctx.device
    keys = context + 1  # the cache holds ``context`` tokens; the new one attends to itself too
    per_seq = math.ceil(keys / PAGE_SIZE)
    if batch * per_seq > pages:
        raise C.Unsupported(f"needs {batch * per_seq} pages a layer, the pool holds {pages}")
    gen = torch.Generator(device=dev).manual_seed(batch * 131 + context)
    indices = torch.randperm(pages, device=dev, generator=gen)[: batch * per_seq].to(torch.int32)
    indptr = torch.arange(batch + 1, device=dev, dtype=torch.int32) * per_seq
    last = torch.full((batch,), keys - (per_seq - 1) * PAGE_SIZE, device=dev, dtype=torch.int32)
    # the new token sits at position ``context``: the last slot of its last page
    rows = indices.view(batch, per_seq)
    slot_page = rows[:, -1].long().contiguous()
    slot_off = (last - 1).long()
    pos = torch.full((batch,), context, device=dev, dtype=torch.long)
    tokens = torch.randint(0, arch.vocab, (batch,), device=dev, generator=gen)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_cuda_graph=True, use_tensor_cores=True, paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last,
    )  # fmt: skip
    wrapper.plan(indptr, indices, last, arch.heads, arch.kv_heads, arch.head_dim, PAGE_SIZE,
                 q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)  # fmt: skip

    def fn():
        return _step(arch, w, kv, wrapper, tokens, pos, slot_page, slot_off, *rope)

    with torch.inference_mode():
        fn()
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(3):
            graph.replay()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize()
        times = sorted(a.elapsed_time(b) for a, b in zip(starts, ends, strict=True))
        if trace is not None:
            tracing.capture(graph.replay, trace, steps=2, cuda=True)
        del graph
    return {
        "step_ms": times[len(times) // 2],
        "kv_cache_bytes": arch.kv_bytes_per_token() * batch * keys,
        "attention": "flashinfer:decode-tc-graph",
        "timing": "cuda_graph",
        "reps": reps,
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--contexts", default="1024,2048,4096,8192")
    ap.add_argument("--mem-fraction", type=float, default=0.6,
                    help="share of free GPU memory (after weights) for the page pools")  # fmt: skip
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--time-budget-s", type=float, default=120.0)
    ap.add_argument("--traces", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer toy model")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("engine_step needs a CUDA device (FlashInfer kernels)")
    deadline = time.monotonic() + args.time_budget_s
    ctx = C.make_context("full", "cuda", "events", 0)
    arch = TINY if args.tiny else LLAMA3_8B
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches, contexts = _ints(args.batches), _ints(args.contexts)
    w = make_weights(arch, ctx.device, torch.bfloat16, 0)
    rope = rope_table(arch, max(contexts) + 1, ctx.device)
    page_elems = 2 * PAGE_SIZE * arch.kv_heads * arch.head_dim
    budget = int(torch.cuda.mem_get_info()[0] * args.mem_fraction)
    pages = budget // (2 * page_elems * arch.layers)
    flat = torch.empty(arch.layers * pages * page_elems, dtype=torch.bfloat16, device=ctx.device)
    flat.normal_()
    kv = flat.view(arch.layers, pages, 2, PAGE_SIZE, arch.kv_heads, arch.head_dim)
    ws = torch.zeros(256 * C.MiB, dtype=torch.uint8, device=ctx.device)
    meta = {"environment": C.environment(ctx), "arch": asdict(arch), "pages_per_layer": pages,
            "page_size": PAGE_SIZE, "clocks_before": C.clocks_snapshot(ctx)}  # fmt: skip
    writer = RowWriter(out / "engine_step.csv", COLUMNS)
    trace_dir = out / "traces"
    for b in batches:
        for n in contexts:
            row: dict[str, Any] = {"batch": b, "context_len": n}
            if time.monotonic() > deadline:
                row.update(status="skipped", error="time budget spent")
                writer.write(row)
                continue
            trace = None
            if args.traces:
                trace_dir.mkdir(exist_ok=True)
                trace = trace_dir / tracing.trace_name("decode", f"b{b}", f"n{n}")
            try:
                row.update(run_one(arch, w, rope, kv, pages, ws, b, n, ctx, args.reps, trace))
                row["status"] = "ok"
            except C.Unsupported as exc:
                row.update(status="skipped", error=str(exc))
            except Exception as exc:  # recorded, the rest still run
                row["status"], row["error"] = C.classify(exc)
                C.cleanup(ctx)
            writer.write(row)
            print(f"[step] b={b} n={n} {row.get('status')} {row.get('step_ms', '')}", flush=True)
    meta["clocks_after"] = C.clocks_snapshot(ctx)
    C.write_json_atomic(out / "engine_step.meta.json", meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
