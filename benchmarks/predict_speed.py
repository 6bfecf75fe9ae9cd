"""Predictions per second for a large mixed batch of ops (issue: 1M ops in under 2 s).

Run: python benchmarks/predict_speed.py [--rows 1000000] [--gpu h100-sxm]
Prints the time to validate the frame (as `simcli predict` does for a CSV) and the time
to price it, separately; pricing is the cost model's own speed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from costmodels import AnalyticalCostModel
from costmodels.ops.select import get_cost_model
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, normalise_frame


def mixed_ops(rows: int, seed: int = 0) -> pd.DataFrame:
    """A realistic mix: GEMMs, attention, decode, block-sparse, collectives, elementwise."""
    rng = np.random.default_rng(seed)
    kinds = np.array(
        [
            "gemm",
            "attn_fwd",
            "attn_fwdbwd",
            "attn_decode",
            "attn_blocksparse_fwd",
            "all_reduce",
            "all_gather",
            "send_recv",
            "copy",
            "rmsnorm",
            "swiglu",
            "rope",
        ]
    )
    weights = np.array([30, 8, 6, 10, 4, 6, 4, 2, 4, 10, 10, 6], dtype=float)
    op = rng.choice(kinds, rows, p=weights / weights.sum())
    frame = pd.DataFrame({c: np.full(rows, np.nan) for c in (*CSV_COLUMNS, *EXTRA_COLUMNS)})
    frame["op"] = op
    frame["dtype"] = rng.choice(["bf16", "fp16", "fp8", "fp32"], rows, p=[0.6, 0.2, 0.1, 0.1])
    frame["backend"] = ""
    frame["causal"] = rng.random(rows) < 0.7
    log_int = lambda lo, hi: np.round(np.exp(rng.uniform(np.log(lo), np.log(hi), rows)))  # noqa: E731
    gemm = op == "gemm"
    for col in ("m", "n", "k"):
        frame.loc[gemm, col] = log_int(1, 65536)[gemm]
    attn = np.char.startswith(op.astype(str), "attn")
    hkv = rng.choice([1, 2, 4, 8, 16], rows)
    frame.loc[attn, "heads_kv"] = hkv[attn]
    frame.loc[attn, "heads_q"] = (hkv * rng.choice([1, 2, 4, 8], rows))[attn]
    frame.loc[attn, "head_dim"] = rng.choice([64, 128, 256], rows)[attn]
    frame.loc[attn, "batch"] = log_int(1, 64)[attn]
    seq = log_int(128, 131072)
    frame.loc[attn, "seq_q"] = seq[attn]
    frame.loc[attn, "seq_kv"] = seq[attn]
    dec = op == "attn_decode"
    frame.loc[dec, "seq_q"] = 1
    frame.loc[dec, "batch"] = log_int(1, 512)[dec]
    frame.loc[dec, "dtype"] = "bf16"
    sparse = op == "attn_blocksparse_fwd"
    frame.loc[sparse, "density"] = rng.uniform(0.01, 1, rows)[sparse]
    frame.loc[sparse, "block_size"] = 128
    frame.loc[attn & (frame["dtype"].isin(["fp8", "fp32"])).to_numpy(), "dtype"] = "bf16"
    coll = np.isin(op, ["all_reduce", "all_gather", "send_recv", "copy"])
    frame.loc[coll, "bytes"] = log_int(1024, 2**32)[coll]
    frame.loc[np.isin(op, ["all_reduce", "all_gather"]), "ranks"] = 8
    ew = np.isin(op, ["rmsnorm", "swiglu", "rope"])
    frame.loc[ew, "m"] = log_int(1, 131072)[ew]
    frame.loc[ew, "n"] = log_int(1024, 65536)[ew]
    frame.loc[ew & (frame["dtype"].isin(["fp8"])).to_numpy(), "dtype"] = "bf16"
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    frame = mixed_ops(args.rows)
    t0 = time.perf_counter()
    frame = normalise_frame(frame)
    validate_s = time.perf_counter() - t0
    print(f"rows                          {args.rows:>12,}")
    print(f"validate (CSV path)           {validate_s:>12.3f} s")
    models = {
        "analytical": AnalyticalCostModel.for_gpu(args.gpu),
        "default (shipped profile)": get_cost_model(args.gpu),
    }
    for label, model in models.items():
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            seconds = model.predict_many(frame, validated=True)
            best = min(best, time.perf_counter() - t0)
        assert np.isfinite(seconds).all() and (seconds > 0).all()
        rate = f"{args.rows / best:,.0f} predictions/s, best of {args.repeat}"
        print(f"{label:<26}    {best:>12.3f} s  ({rate})")
    print("op mix: " + ", ".join(f"{k} {v}" for k, v in frame["op"].value_counts().items()))


if __name__ == "__main__":
    main()
