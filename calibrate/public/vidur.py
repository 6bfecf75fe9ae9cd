"""Vidur's public A100 operator profiles as a simcli calibration dataset.

No A100 is lent here, so its op models would be datasheet-only. Vidur (Agrawal et al.,
MLSys 2024, github.com/microsoft/vidur) publishes per-operator times it measured on A100s
for eight models (``data/profiling/compute/a100/<org>/<model>/mlp.csv``): for each token
count (1-32k) and tensor-parallel degree, the fp16 time of the QKV projection, the output
projection, the MLP up (gate+up) and down projections, the activation, the two RMSNorms /
LayerNorms and the residual add of one layer, each a summary over repeats (CUDA-timed
kernels). Those operators are exactly simcli's GEMM, ``swiglu``/``gelu``, ``rmsnorm`` and
``residual_add`` ops, so each row becomes one op row of the runner's format with the
median as ``measured_ms`` and the model as its ``family``; ``calibrate fit`` then splits by
model (never by shape), like our own datasets.

    python -m calibrate.public.vidur --src VIDUR_CHECKOUT --out calibrate/data/public-vidur-a100

Only the public CSVs are read; no Vidur code is used.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import pandas as pd

from calibrate.dataset import OP_COLUMNS

#: Vidur operator -> (simcli op, how m, n, k follow from the model row)
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = {
    "input_layernorm": "rmsnorm",
    "post_attention_layernorm": "rmsnorm",
    "mlp_act": "swiglu",
    "add": "residual_add",
}
#: the profiled models' head size and norm kind (not in the CSV; from their config.json)
NORM = {"microsoft/phi-2": "layernorm"}
DEVICE = "NVIDIA A100-SXM4-80GB"


def _gemm_shape(op: str, r: pd.Series) -> tuple[int, int]:
    """(k, n) of one Vidur GEMM on one TP rank: C[tokens, n] = A[tokens, k] . B[k, n]."""
    tp = int(r.num_tensor_parallel_workers)
    h, ffn = int(r.n_embd), int(r.n_expanded_embd)
    d = h // int(r.n_head)
    if op == "attn_pre_proj":
        return h, (int(r.n_head) + 2 * int(r.n_kv_head)) * d // tp
    if op == "attn_post_proj":
        return int(r.n_head) * d // tp, h
    if op == "mlp_up_proj":
        return h, (2 if bool(r.use_gated_mlp) else 1) * ffn // tp
    return ffn // tp, h


def kept(tokens: int) -> bool:
    """Token counts kept: powers of two and multiples of 4096 (Vidur profiles every
    multiple of 256; 40 sizes per model and TP degree span the same range)."""
    return tokens & (tokens - 1) == 0 or tokens % 4096 == 0


def rows_of(csv: Path, model: str) -> list[dict]:
    """The op rows of one Vidur mlp.csv (``model``: org/name, the family)."""
    df = pd.read_csv(csv)
    df = df[[kept(int(t)) for t in df.num_tokens]]
    out = []
    for _, r in df.iterrows():
        tokens, tp = int(r.num_tokens), int(r.num_tensor_parallel_workers)
        base = {"dtype": "fp16", "suite": "public-vidur", "status": "ok", "pattern": f"tp{tp}"}
        for op in GEMMS:
            if pd.isna(r.get(f"time_stats.{op}.median")):
                continue
            k, n = _gemm_shape(op, r)
            out.append(
                {**base, "op": "gemm", "m": tokens, "n": n, "k": k,
                 "measured_ms": float(r[f"time_stats.{op}.median"]),
                 "family": f"{model}/{op}"}  # fmt: skip
            )
        for op, kind in ELEMENTWISE.items():
            if pd.isna(r.get(f"time_stats.{op}.median")):  # phi-2: one norm per layer
                continue
            if kind == "rmsnorm":
                kind = NORM.get(model, "rmsnorm")
            if kind == "swiglu" and not bool(r.use_gated_mlp):
                kind = "gelu"
            n = int(r.n_expanded_embd) // tp if op == "mlp_act" else int(r.n_embd)
            out.append(
                {**base, "op": kind, "m": tokens, "n": n,
                 "measured_ms": float(r[f"time_stats.{op}.median"]), "family": model}  # fmt: skip
            )
    return out


def convert(src: Path, out: Path) -> int:
    """Write ``out/gemm.csv``, ``out/elementwise.csv`` and ``meta.json`` from a Vidur
    checkout at ``src``; returns the row count."""
    root = src / "data" / "profiling" / "compute" / "a100"
    rows: list[dict] = []
    models = []
    for csv in sorted(root.glob("*/*/mlp.csv")):
        model = f"{csv.parent.parent.name}/{csv.parent.name}"
        models.append(model)
        rows += rows_of(csv, model)
    if not rows:
        raise SystemExit(f"no data/profiling/compute/a100/*/*/mlp.csv under {src}")
    frame = pd.DataFrame(rows)
    for col in OP_COLUMNS:
        if col not in frame:
            frame[col] = None
    extra = ["measured_ms", "suite", "family", "pattern", "status", "error"]
    frame = frame.reindex(columns=[*OP_COLUMNS, *extra])
    out.mkdir(parents=True, exist_ok=True)
    for suite, sel in (("gemm", frame.op == "gemm"), ("elementwise", frame.op != "gemm")):
        part = frame[sel].assign(suite=suite)
        _atomic(out / f"{suite}.csv", part.to_csv(index=False))
    meta = {
        "environment": {
            "gpu_name": DEVICE,
            "device": "cuda",
            "sm_count": 108,
            "torch": "not recorded by the source (Vidur's profiles carry no versions)",
            "driver": "not recorded by the source",
            "source": "microsoft/vidur data/profiling/compute/a100/*/mlp.csv (Agrawal et al., "
            "MLSys 2024): public per-operator A100 measurements, fp16, median of repeats",
            "models": models,
            "timing_method": "Vidur's CudaTimer (kernel time per operator), median column",
        },
        "runs": [],
        "columns": [*OP_COLUMNS, *extra],
    }
    _atomic(out / "meta.json", json.dumps(meta, indent=1) + "\n")
    return len(frame)


def _atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.public.vidur", description=__doc__)
    ap.add_argument("--src", required=True, help="a checkout of github.com/microsoft/vidur")
    ap.add_argument("--out", required=True, help="dataset folder to write")
    args = ap.parse_args(argv)
    n = convert(Path(args.src), Path(args.out))
    print(f"{n} op rows -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
