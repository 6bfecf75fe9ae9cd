"""Ops of model architectures that no calibration suite measures, for independent validation.

    python -m calibrate.validation_ops calibrate/data/validation-ops.csv

Layer GEMMs (forward, TP 1/2/4), attention, decode and memory-bound ops of
Mistral-NeMo-12B, Qwen2.5-32B, Phi-3-mini and Gemma-2-9B shapes (architecture numbers
from their HuggingFace config.json files). Measured with
``python3 -m calibrate.run --ops FILE``, they test a profile on shape families it
never saw.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from workloads.layers import layer_forward_ops
from workloads.models import ModelConfig
from workloads.ops import CSV_COLUMNS

# (id, layers, hidden, heads, kv_heads, head_dim, ffn, vocab)
ARCHS = [
    ("mistral-nemo-12b", 40, 5120, 32, 8, 128, 14336, 131072),
    ("qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064),
    ("phi3-mini", 32, 3072, 32, 32, 96, 8192, 32064),
    ("gemma2-9b", 42, 3584, 16, 8, 256, 14336, 256000),
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


def rows() -> list[dict]:
    out: list[dict] = []

    def add(op_row: dict, family: str) -> None:
        row = {c: op_row.get(c) for c in CSV_COLUMNS}
        row["family"] = family
        out.append(row)

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
        hq, hkv, hd = m.num_heads, m.num_kv_heads, m.head_dim
        for seq in (512, 2048, 8192, 32768):
            batch = max(1, 16384 // seq)
            for op in ("attn_fwd", "attn_fwdbwd"):
                for backend in ("flash", "cudnn"):
                    add(
                        {
                            "op": op,
                            "dtype": "bf16",
                            "batch": batch,
                            "seq_q": seq,
                            "seq_kv": seq,
                            "heads_q": hq,
                            "heads_kv": hkv,
                            "head_dim": hd,
                            "causal": True,
                            "backend": backend,
                        },
                        f"{m.id}/attn",
                    )
        for batch in (1, 16, 64):
            for ctx in (2048, 8192, 32768):
                add(
                    {
                        "op": "attn_decode",
                        "dtype": "bf16",
                        "batch": batch,
                        "seq_q": 1,
                        "seq_kv": ctx,
                        "heads_q": hq,
                        "heads_kv": hkv,
                        "head_dim": hd,
                        "backend": "flash",
                    },
                    f"{m.id}/decode",
                )
        for tokens in (256, 4096, 16384):
            add({"op": "rmsnorm", "dtype": "bf16", "m": tokens, "n": m.hidden_size}, f"{m.id}/ew")
            add(
                {"op": "swiglu", "dtype": "bf16", "m": tokens, "n": m.ffn_hidden_size}, f"{m.id}/ew"
            )
    return out


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "calibrate/data/validation-ops.csv")
    frame = pd.DataFrame(rows())
    frame = frame[~frame.duplicated(subset=list(CSV_COLUMNS))]
    frame.to_csv(path, index=False)
    print(f"{len(frame)} ops -> {path}")
    print(frame["op"].value_counts().to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
