"""Ops of model architectures that no calibration suite measures, for independent validation.

    python -m calibrate.validation_ops calibrate/validation/ops.csv
    python -m calibrate.validation_ops --set 2 calibrate/validation/ops-2.csv

Set 1: layer GEMMs (forward, TP 1/2/4), attention, decode and memory-bound ops of
Mistral-NeMo-12B, Qwen2.5-32B, Phi-3-mini and Gemma-2-9B shapes.
Set 2 (made after set 1 had been used to compare model changes, so that one set stays
unseen): Llama-3.1-405B, Qwen3-14B, Yi-34B, Falcon-7B (hidden 4544, head_dim 64, MQA) and
StarCoder2-15B; forward GEMMs at TP 1-8, their backward (dgrad, wgrad) GEMMs, fp32, tf32
and fp8 GEMMs, attention fwd / fwd+bwd with flash, cuDNN and efficient, decode.
Architecture numbers are from the models' HuggingFace config.json files. Measured with
``python3 -m calibrate.run --ops FILE``, they test a profile on shape families it
never saw.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from workloads.decompose import layer_forward_ops
from workloads.models import ModelConfig
from workloads.ops import CSV_COLUMNS

# (id, layers, hidden, heads, kv_heads, head_dim, ffn, vocab)
ARCHS = [
    ("mistral-nemo-12b", 40, 5120, 32, 8, 128, 14336, 131072),
    ("qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064),
    ("phi3-mini", 32, 3072, 32, 32, 96, 8192, 32064),
    ("gemma2-9b", 42, 3584, 16, 8, 256, 14336, 256000),
]

# set 2
ARCHS_2 = [
    ("llama3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256),
    ("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936),
    ("yi-34b", 60, 7168, 56, 8, 128, 20480, 64000),
    ("falcon-7b", 32, 4544, 71, 1, 64, 18176, 65024),
    ("starcoder2-15b", 40, 6144, 48, 4, 128, 24576, 49152),
]


def model(arch: tuple) -> ModelConfig:
    mid, layers, hidden, heads, kv, hd, ffn, vocab = arch
    return ModelConfig(
        id=mid,
        name=mid,
        family="validation",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        max_seq_len=131072,
        activation="swiglu",
        norm="rmsnorm",
        position="rope",
        source="HuggingFace config.json of the model",
    )


def _row(op_row: dict, family: str) -> dict:
    row = {c: op_row.get(c) for c in CSV_COLUMNS}
    row["family"] = family
    return row


def _attention(m: ModelConfig, seqs: tuple[int, ...], backends: tuple[str, ...]) -> list[dict]:
    """Causal fwd and fwd+bwd at 16k tokens per call (batch = 16384 / seq)."""
    hq, hkv, hd = m.num_heads, m.num_kv_heads, m.head_dim
    return [
        _row(
            {
                "op": op, "dtype": "bf16", "batch": max(1, 16384 // seq), "seq_q": seq,
                "seq_kv": seq, "heads_q": hq, "heads_kv": hkv, "head_dim": hd, "causal": True,
                "backend": backend,
            },
            f"{m.id}/attn",
        )
        for seq in seqs
        for op in ("attn_fwd", "attn_fwdbwd")
        for backend in backends
    ]  # fmt: skip


def _decode(m: ModelConfig, batches: tuple[int, ...], contexts: tuple[int, ...]) -> list[dict]:
    hq, hkv, hd = m.num_heads, m.num_kv_heads, m.head_dim
    return [
        _row(
            {
                "op": "attn_decode", "dtype": "bf16", "batch": batch, "seq_q": 1,
                "seq_kv": ctx, "heads_q": hq, "heads_kv": hkv, "head_dim": hd,
                "backend": "flash",
            },
            f"{m.id}/decode",
        )
        for batch in batches
        for ctx in contexts
    ]  # fmt: skip


def rows() -> list[dict]:
    out: list[dict] = []

    def add(op_row: dict, family: str) -> None:
        out.append(_row(op_row, family))

    for arch in ARCHS:
        m = model(arch)
        for tp in (1, 2, 4):
            if m.num_heads % tp or m.num_kv_heads % tp:
                continue
            for tokens in (128, 1024, 4096, 16384):
                for lo in layer_forward_ops(m, 1, tokens, tp=tp):
                    if lo.op.op.value == "gemm":
                        add(lo.op.row(), f"{m.id}/{lo.name}")
            add(
                {
                    "op": "gemm",
                    "dtype": "bf16",
                    "m": 4096,
                    "n": -(-m.vocab_size // tp),
                    "k": m.hidden_size,
                },
                f"{m.id}/lmhead",
            )
        out += _attention(m, (512, 2048, 8192, 32768), ("flash", "cudnn"))
        out += _decode(m, (1, 16, 64), (2048, 8192, 32768))
        for tokens in (256, 4096, 16384):
            add({"op": "rmsnorm", "dtype": "bf16", "m": tokens, "n": m.hidden_size}, f"{m.id}/ew")
            add(
                {"op": "swiglu", "dtype": "bf16", "m": tokens, "n": m.ffn_hidden_size}, f"{m.id}/ew"
            )
    return out


def rows_2() -> list[dict]:
    out: list[dict] = []

    def gemm(m: int, n: int, k: int, dtype: str, family: str) -> None:
        out.append(_row({"op": "gemm", "dtype": dtype, "m": m, "n": n, "k": k}, family))

    for arch in ARCHS_2:
        m = model(arch)
        for tp in (1, 2, 4, 8):
            if m.num_heads % tp or m.num_kv_heads % tp and m.num_kv_heads > 1:
                continue
            for tokens in (256, 2048, 8192):
                for lo in layer_forward_ops(m, 1, tokens, tp=tp):
                    if lo.op.op.value != "gemm":
                        continue
                    r = lo.op.row()
                    gm, gn, gk = int(r["m"]), int(r["n"]), int(r["k"])
                    gemm(gm, gn, gk, "bf16", f"{m.id}/{lo.name}")
                    if tokens == 2048 and tp in (1, 4):
                        # dgrad: dX[m,k] = dY[m,n] . W[n,k];  wgrad: dW[k,n] = X^T[k,m] . dY[m,n]
                        gemm(gm, gk, gn, "bf16", f"{m.id}/{lo.name}/dgrad")
                        gemm(gk, gn, gm, "bf16", f"{m.id}/{lo.name}/wgrad")
                    if tokens == 2048 and tp == 2:
                        for dtype in ("fp32", "tf32", "fp8"):
                            if dtype == "fp8" and (gn % 16 or gk % 16):
                                continue  # torch._scaled_mm needs multiples of 16
                            gemm(gm, gn, gk, dtype, f"{m.id}/{lo.name}")
            gemm(4096, -(-m.vocab_size // tp), m.hidden_size, "bf16", f"{m.id}/lmhead")
        out += _attention(m, (1024, 4096, 16384), ("flash", "cudnn", "efficient"))
        out += _decode(m, (1, 32), (4096, 32768))
    return out


def main() -> int:
    args = sys.argv[1:]
    which = "1"
    if args[:1] == ["--set"]:
        which, args = args[1], args[2:]
    if which not in ("1", "2"):
        raise SystemExit(f"--set must be 1 or 2, not {which!r}")
    path = Path(args[0] if args else f"calibrate/validation/ops{'' if which == '1' else '-2'}.csv")
    frame = pd.DataFrame(rows() if which == "1" else rows_2())
    frame = frame[~frame.duplicated(subset=list(CSV_COLUMNS))]
    frame.to_csv(path, index=False)
    print(f"{len(frame)} ops -> {path}")
    print(frame["op"].value_counts().to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
