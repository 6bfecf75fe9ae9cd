"""Layer dimensions of the models whose GEMM shapes the suites measure.

Mirrors workloads/data/models.yaml (by hand: the runner must not import the project).
"""

from __future__ import annotations

from typing import NamedTuple


class Dims(NamedTuple):
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int


# mirrors workloads/data/models.yaml
MODELS: dict[str, Dims] = {
    "llama3-8b": Dims(4096, 32, 8, 128, 14336, 128256),
    "llama3-70b": Dims(8192, 64, 8, 128, 28672, 128256),
    "llama2-7b": Dims(4096, 32, 32, 128, 11008, 32000),
    "mistral-7b": Dims(4096, 32, 8, 128, 14336, 32000),
    "qwen2.5-7b": Dims(3584, 28, 4, 128, 18944, 152064),
    "qwen2.5-72b": Dims(8192, 64, 8, 128, 29568, 152064),
    "gpt3-175b": Dims(12288, 96, 96, 128, 49152, 51200),
    "mixtral-8x7b": Dims(4096, 32, 8, 128, 14336, 32000),
}


def layer_shapes(d: Dims, tp: int) -> dict[str, tuple[int, int]] | None:
    """(n, k) of each linear layer of one tensor-parallel rank, or None when the
    heads don't split over ``tp`` ranks. KV heads fewer than ``tp`` are replicated."""
    if d.heads % tp or d.ffn % tp:
        return None
    kv_per_rank = max(1, d.kv_heads // tp)
    return {
        "qkv": ((d.heads // tp + 2 * kv_per_rank) * d.head_dim, d.hidden),
        "out": (d.hidden, d.heads * d.head_dim // tp),
        "gateup": (2 * d.ffn // tp, d.hidden),
        "down": (d.hidden, d.ffn // tp),
        "lmhead": (-(-d.vocab // tp), d.hidden),
    }
