"""Verification attention: a few query tokens per sequence over a long KV cache, the
attention of a speculative-decoding verification step (k + 1 tokens scored at once) and of
a chunked prefill's short last chunk.

The step model prices such a chunk with the prefill-attention model, calibrated on prefill
shapes; this bench measures what the kernels do there: PyTorch SDPA (cuDNN, flash,
efficient: the backends the shipped profiles were measured with) and, when the
``flash_attn`` package is installed, ``flash_attn_with_kvcache`` (FlashAttention-2's decode
path with split-KV, which takes ``seqlen_q > 1``). One call runs the sweep and writes
``verify_attn.csv``; torch only (no pydantic), run on the GPU:

    python3 -m calibrate.bench.verify_attn --out DIR [--quick]

Rows: ``backend, batch, seq_q, seq_kv, heads_q, heads_kv, head_dim, ms, status``. Times are
the median of CUDA-event-timed calls (the KV set rotates over several copies larger than
L2, so every call reads the cache from HBM).
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path
from typing import Any

HEADS = (32, 8, 128)  # Llama-3-8B: query heads, KV heads, head dim
BATCHES = (1, 4, 32)
SEQ_KV = (1024, 8192, 32768, 65536)
SEQ_Q = (1, 2, 5, 8, 16)
L2_BYTES = 50 * 2**20


def _median_ms(torch: Any, fn: Any, reps: int = 30) -> float:
    fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(3):
        fn()
    for s, e in zip(starts, ends, strict=True):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def _sets(torch: Any, b: int, sq: int, skv: int, layout: str) -> list[tuple]:
    """Input copies whose KV together exceed 4x L2 (at most 8)."""
    hq, hkv, d = HEADS
    kv_bytes = 2 * b * hkv * skv * d * 2
    n = min(8, max(2, -(-4 * L2_BYTES // kv_bytes)))
    out = []
    for _ in range(n):
        if layout == "bhsd":  # SDPA
            q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16)
        else:  # flash_attn: (batch, seq, heads, dim)
            q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, skv, hkv, d, device="cuda", dtype=torch.bfloat16)
        out.append((q, k, torch.randn_like(k)))
    return out


def _sdpa(torch: Any, backend: str) -> Any:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[backend]

    def attn(q, k, v):
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    return attn


def _flash_attn_kvcache() -> Any:
    from flash_attn import flash_attn_with_kvcache  # type: ignore[import-not-found]

    def attn(q, k, v):
        return flash_attn_with_kvcache(q, k, v, causal=True)

    return attn


def run(out: Path, quick: bool) -> None:
    import torch

    backends: dict[str, tuple[Any, str]] = {
        b: (_sdpa(torch, b), "bhsd") for b in ("cudnn", "flash", "efficient")
    }
    try:
        backends["flash_attn_kvcache"] = (_flash_attn_kvcache(), "bshd")
    except ImportError as exc:
        print(f"flash_attn not installed: {exc}")
    batches, seq_kv = (BATCHES[:2], SEQ_KV[1::2]) if quick else (BATCHES, SEQ_KV)
    hq, hkv, d = HEADS
    rows = []
    for name, (fn, layout) in backends.items():
        for b in batches:
            for skv in seq_kv:
                for sq in SEQ_Q:
                    row = {"backend": name, "batch": b, "seq_q": sq, "seq_kv": skv,
                           "heads_q": hq, "heads_kv": hkv, "head_dim": d}  # fmt: skip
                    sets: list[tuple] = []
                    try:
                        sets = _sets(torch, b, sq, skv, layout)
                        i = [0]

                        def call(sets=sets, i=i, fn=fn):
                            q, k, v = sets[i[0] % len(sets)]
                            i[0] += 1
                            return fn(q, k, v)

                        row |= {"ms": _median_ms(torch, call), "status": "ok"}
                    except (RuntimeError, ValueError) as exc:
                        row |= {"ms": "", "status": f"unsupported: {str(exc)[:80]}"}
                    del sets
                    torch.cuda.empty_cache()
                    rows.append(row)
                    print(row, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "verify_attn.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    (out / "verify_attn.meta.txt").write_text(repr(meta) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    run(args.out, args.quick)


if __name__ == "__main__":
    main()
