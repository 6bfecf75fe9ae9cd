"""Hugging Face transformers' attention on local layers (sliding windows, chunks).

Under ``attn_implementation="sdpa"`` (transformers' default where a model allows it), a
layer whose attention is local is handed an explicit 4-D boolean mask once the sequence
is longer than its window or chunk (``sdpa_mask``); PyTorch then runs SDPA with that mask
instead of its causal fast path. Such a layer skips no masked tile: it costs the
measured masked-over-causal ratio of ``costmodels/data/masked_sdpa.yaml`` times causal
attention, not the window's share of it (Phi-3-mini's 2047-token window at 4096 tokens:
~2.5-3x causal). Layers that fit their window take the causal path. This prices the
HF-style frameworks (``pytorch``, ``pytorch-compile``); engines with real local
kernels (FlashAttention's window, FlexAttention, vLLM) run the model's own pattern.
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import yaml


@cache
def _table() -> dict[int, dict[int, tuple[float, float]]]:
    path = Path(str(resources.files("costmodels") / "data" / "masked_sdpa.yaml"))
    raw = yaml.safe_load(path.read_text())["ratios"]
    return {int(d): {int(s): (float(v[0]), float(v[1])) for s, v in by.items()}
            for d, by in raw.items()}  # fmt: skip


def masked_ratio(head_dim: int, seq_len: int) -> tuple[float, float]:
    """(forward, backward) time of masked SDPA over causal SDPA at ``seq_len`` tokens,
    interpolated in log sequence length and linearly in head width (clamped to the
    measured ranges: 64-256 wide, 1k-16k tokens)."""
    t = _table()
    dims = sorted(t)
    x = math.log(seq_len)

    def at_seq(d: int, phase: int) -> float:
        seqs = sorted(t[d])
        return float(np.interp(x, np.log(seqs), [t[d][s][phase] for s in seqs]))

    fwd, bwd = (float(np.interp(head_dim, dims, [at_seq(d, i) for d in dims])) for i in (0, 1))
    return fwd, bwd


def hf_attention_scale(model, seq_len: int) -> tuple[float, float]:
    """(forward, backward) factor on a layer's causal attention time, averaged over the
    layers, for ``model`` under transformers' sdpa at ``seq_len`` tokens: its local layers
    run masked when the sequence exceeds their window or chunk; the rest causal."""
    span = model.sliding_window or model.attention_chunk_size
    if not model.sliding_layers or span is None or seq_len <= span:
        return 1.0, 1.0
    f, b = masked_ratio(model.head_dim, seq_len)
    share = model.sliding_layers / model.num_layers
    return 1.0 + share * (f - 1.0), 1.0 + share * (b - 1.0)


__all__ = ["hf_attention_scale", "masked_ratio"]
