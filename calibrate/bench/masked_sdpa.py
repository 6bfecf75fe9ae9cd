"""Time PyTorch SDPA with an explicit boolean mask against its causal fast path: what a
sliding-window (or chunked) layer costs under Hugging Face transformers' ``sdpa``
attention, which passes such layers a 4-D mask instead of ``is_causal=True``.

    python3 -m calibrate.bench.masked_sdpa --out DIR [--quick]          # on the GPU
    python -m calibrate.bench.masked_sdpa --out - --table DIR/masked_sdpa.csv  # its table

For each head width, head count and sequence length (batch 1, bf16): the forward and the
forward + backward of ``F.scaled_dot_product_attention`` (a) causal, ``is_causal=True``
with ``enable_gqa`` (HF's path when no mask is needed), and (b) with the bool mask of a
sliding window of half the sequence, KV heads repeated first (HF's ``repeat_kv`` path
with a mask). Rows: median milliseconds over CUDA-event-timed repeats, the SDPA backend
PyTorch picked for each. Imports the standard library, torch and
``calibrate.bench.common`` only (it runs on the device machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from calibrate.bench import common as C
from calibrate.steps import RowWriter, median, sdpa_choice

COLUMNS = ("head_dim", "heads", "kv_heads", "seq_len", "variant", "backend", "fwd_ms",
           "fwdbwd_ms", "status", "error")  # fmt: skip
HEAD_DIMS = (64, 96, 128, 256)
SEQS = (1024, 2048, 4096, 8192, 16384)


def _time(fn, reps: int) -> float:
    return median(C.cuda_event_times_ms(fn, reps))


def measure(d: int, h: int, hkv: int, s: int, variant: str, reps: int) -> dict:
    import torch
    import torch.nn.functional as F

    q = torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    if variant == "causal":
        kw = {"is_causal": True, "enable_gqa": True}
        args = (q, k, v)
    else:
        i = torch.arange(s, device="cuda")
        mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < s // 2)
        kw = {"attn_mask": mask[None, None]}
        rep = h // hkv
        args = (q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
    backend = sdpa_choice(*args, is_causal=kw.get("is_causal", False),
                          enable_gqa=kw.get("enable_gqa", False))  # fmt: skip

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(*args, **kw)

    grad = torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16)

    def fwdbwd():
        out = F.scaled_dot_product_attention(*args, **kw)
        out.backward(grad)

    return {"backend": backend, "fwd_ms": _time(fwd, reps), "fwdbwd_ms": _time(fwdbwd, reps)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--table", default="", help="print the ratio table of this CSV (no GPU)")
    args = ap.parse_args(argv)
    if args.table:
        import yaml

        print(yaml.safe_dump({"ratios": ratio_table(Path(args.table))}, sort_keys=True), end="")
        return 0
    import torch

    ctx = C.make_context("full", "cuda", "events", 0)
    out = Path(args.out)
    writer = RowWriter(out / "masked_sdpa.csv", COLUMNS)
    seqs = SEQS[:3] if args.quick else SEQS
    for d in HEAD_DIMS:
        for h, hkv in ((32, 8), (16, 16)):
            for s in seqs:
                for variant in ("causal", "masked"):
                    row = {"head_dim": d, "heads": h, "kv_heads": hkv, "seq_len": s,
                           "variant": variant}  # fmt: skip
                    try:
                        row.update(measure(d, h, hkv, s, variant, args.reps), status="ok")
                    except Exception as exc:  # one bad shape (OOM) does not stop the sweep
                        row["status"], row["error"] = C.classify(exc)
                    torch.cuda.empty_cache()
                    writer.write(row)
    meta = {"environment": C.environment(ctx, ""), "torch": torch.__version__}
    (out / "masked_sdpa.meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return 0



def ratio_table(csv_path: Path) -> dict:
    """Masked over causal time per head width and sequence length, forward and backward
    (backward = forward + backward minus forward), the mean over the head configurations
    measured: the table ``costmodels/data/masked_sdpa.yaml`` ships."""
    import csv as _csv

    with Path(csv_path).open() as f:
        rows = [r for r in _csv.DictReader(f) if r["status"] == "ok"]
    t: dict[tuple, dict[str, float]] = {}
    for r in rows:
        key = (int(r["head_dim"]), int(r["heads"]), int(r["seq_len"]))
        f, fb = float(r["fwd_ms"]), float(r["fwdbwd_ms"])
        t.setdefault(key, {})[r["variant"]] = (f, fb - f)
    out: dict[int, dict[int, list[list[float]]]] = {}
    for (d, _h, s), v in sorted(t.items()):
        if "causal" in v and "masked" in v:
            (cf, cb), (mf, mb) = v["causal"], v["masked"]
            out.setdefault(d, {}).setdefault(s, []).append([mf / cf, mb / cb])
    return {
        d: {s: [round(sum(x[i] for x in xs) / len(xs), 3) for i in (0, 1)]
            for s, xs in by_s.items()}  # fmt: skip
        for d, by_s in out.items()
    }


if __name__ == "__main__":
    sys.exit(main())
