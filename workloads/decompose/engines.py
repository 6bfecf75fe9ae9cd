"""The software that runs a model: which kernels a layer becomes, per engine and phase.

One decomposition serves every engine; an engine only picks variants of it:

- ``megatron``: Megatron-LM / Transformer Engine training: fused kernels (one norm, one
  RoPE, one SwiGLU and one residual add per layer position), FlashAttention.
- ``megatron-unfused``: Megatron-LM's core attention before FlashAttention (batched
  score and context GEMMs over the s x s square, fused scale-mask-softmax, dropout).
- ``pytorch-eager``: plain eager PyTorch. Training (``calibrate/steps/train_step.py``:
  fp32 parameters under ``torch.autocast(bf16)``) is the fused layer plus the extra HBM
  traffic of the eager kernels; serving (``calibrate/steps/serve_step.py``: bf16 weights)
  is the eager kernels one by one (RMSNorm as 8 kernels, RoPE as 6, SiLU and mul as 2,
  strided KV-cache copies).
- ``pytorch-compile``: the same PyTorch training step with each transformer block
  ``torch.compile``d (Inductor fuses the layer's norms, RoPE, SwiGLU and casts, like the
  fused layer) while the embedding, LM head, loss and optimizer stay eager; fp8 means
  torchao float8 (dynamic tensorwise scaling: an amax pass before every cast).
- ``vllm``: vLLM's fused serving kernels (fused residual-add + RMSNorm, in-place rotary,
  ``reshape_and_cache``, ``silu_and_mul``), every step replayed from CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workloads.models import ModelError

Phase = Literal["train", "serve"]
# How the kernels of a layer run: megatron-style fused ops with separate residual adds,
# vLLM's fused add-norm kernels, or eager PyTorch's kernel-by-kernel calls.
LayerKernels = Literal["fused", "vllm", "eager"]


@dataclass(frozen=True)
class Engine:
    name: str
    phases: tuple[Phase, ...]
    kernels: dict[Phase, LayerKernels]
    unfused_attention: bool = False  # megatron-unfused: attention as GEMMs + softmax
    eager_training_traffic: bool = False  # pytorch-eager training: autocast casts, fp32 stream
    compiled_layers: bool = False  # pytorch-compile: layers fused, only stage extras eager
    # FP8 scaling: Transformer Engine's delayed scaling (amax history, fused cast-transpose)
    # or torchao's dynamic tensorwise scaling (an amax reduction before every cast)
    fp8_scaling: Literal["delayed", "dynamic"] = "delayed"
    summary: str = ""


ENGINES: dict[str, Engine] = {
    "megatron": Engine(
        "megatron", ("train",), {"train": "fused"}, summary="fused kernels, FlashAttention"
    ),
    "megatron-unfused": Engine(
        "megatron-unfused",
        ("train",),
        {"train": "fused"},
        unfused_attention=True,
        summary="Megatron-LM core attention before FlashAttention",
    ),
    "pytorch-eager": Engine(
        "pytorch-eager",
        ("train", "serve"),
        {"train": "fused", "serve": "eager"},
        eager_training_traffic=True,
        fp8_scaling="dynamic",
        summary="plain eager PyTorch (autocast training, bf16 inference)",
    ),
    "pytorch-compile": Engine(
        "pytorch-compile",
        ("train",),
        {"train": "fused"},
        eager_training_traffic=True,
        compiled_layers=True,
        fp8_scaling="dynamic",
        summary="PyTorch with torch.compile'd blocks (torchao float8 for fp8)",
    ),
    "vllm": Engine(
        "vllm", ("serve",), {"serve": "vllm"}, summary="vLLM fused kernels in CUDA graphs"
    ),
}
# `simcli train --framework pytorch` names the eager engine by its framework.
ALIASES = {"pytorch": "pytorch-eager"}


def engines_for(phase: Phase) -> list[str]:
    """Engine names that run ``phase``."""
    return [n for n, e in ENGINES.items() if phase in e.phases]


def get_engine(name: str, phase: Phase) -> Engine:
    """The engine called ``name`` (or an alias) for ``phase``; a one-line error otherwise."""
    engine = ENGINES.get(ALIASES.get(name, name))
    if engine is None or phase not in engine.phases:
        raise ModelError(
            f"unknown {phase} engine {name!r}; allowed: {', '.join(engines_for(phase))}"
        )
    return engine
