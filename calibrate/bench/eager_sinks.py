"""Time transformers' eager attention with sinks (gpt-oss's ``eager_attention_forward``)
on its own, forward and backward, at several head counts and lengths.

    python3 -m calibrate.bench.eager_sinks --out DIR [--steps 10]

The function is transformers' as gpt-oss runs it under ``torch.autocast(bf16)`` with bf16
tensors: ``matmul(q, k^T) * scaling``, ``+ mask`` (a causal [1, 1, s, s] bf16 mask),
``cat`` with the per-head sink logit expanded over the rows, subtract the row max,
``softmax(dtype=bf16)``, drop the sink column, ``matmul(probs, v)``. q, k and v are
[1, heads, s, 64] (GQA's ``repeat_kv`` is not part of it). Rows: median forward and
forward+backward time (CUDA events, after warm-up), and the GPU time per kernel class of
one profiled forward+backward (``cat``, ``elementwise``, ``reduce``, ``softmax``,
``gemm``, ``other``). Imports the standard library and torch only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from .common import cuda_event_times_ms

HEADS = (8, 16, 32, 64)
SEQS = (1024, 2048, 4096, 8192)
HEAD_DIM = 64


def kernel_class(name: str) -> str:
    n = name.lower()
    if "catarray" in n:
        return "cat"
    if "softmax" in n:
        return "softmax"
    if any(s in n for s in ("gemm", "cutlass", "nvjet", "xmma")):
        return "gemm"
    if "reduce_kernel" in n:
        return "reduce"
    if "elementwise" in n or "fill" in n or "index" in n:
        return "elementwise"
    return "other"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    dev, bf = "cuda", torch.bfloat16
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def attention(q, k, v, mask, sinks, scaling):
        w = torch.matmul(q, k.transpose(2, 3)) * scaling
        w = w + mask
        sk = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], -1)
        c = torch.cat([w, sk], dim=-1)
        c = c - c.max(dim=-1, keepdim=True).values
        p = F.softmax(c, dim=-1, dtype=c.dtype)
        return torch.matmul(p[..., :-1], v)

    def timed(fn, n):
        return statistics.median(cuda_event_times_ms(fn, n, warmup=3))

    scaling = HEAD_DIM**-0.5
    rows = []
    for s in SEQS:
        for h in HEADS:
            q, k, v = (torch.randn(1, h, s, HEAD_DIM, device=dev, dtype=bf, requires_grad=True)
                       for _ in range(3))  # fmt: skip
            sinks = torch.randn(h, device=dev, dtype=bf, requires_grad=True)
            mask = torch.full((s, s), float("-inf"), device=dev, dtype=bf).triu(1)[None, None]
            g = torch.randn(1, h, s, HEAD_DIM, device=dev, dtype=bf)

            def fwd(q=q, k=k, v=v, mask=mask, sinks=sinks):
                with torch.no_grad(), torch.autocast("cuda", dtype=bf):
                    attention(q, k, v, mask, sinks, scaling)

            def fwdbwd(q=q, k=k, v=v, mask=mask, sinks=sinks, g=g):
                with torch.autocast("cuda", dtype=bf):
                    o = attention(q, k, v, mask, sinks, scaling)
                o.backward(g)

            row = {"heads": h, "seq_len": s, "head_dim": HEAD_DIM, "fwd_ms": timed(fwd, args.steps),
                   "fwdbwd_ms": timed(fwdbwd, args.steps)}  # fmt: skip
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fwdbwd()
                torch.cuda.synchronize()
            classes: dict[str, float] = {}
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    key = kernel_class(e.name) + "_ms"
                    classes[key] = classes.get(key, 0.0) + e.device_time / 1e3
            row.update(classes)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del q, k, v, sinks, mask, g
            torch.cuda.empty_cache()
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "when": time.time()}
    (out / "eager_sinks.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
