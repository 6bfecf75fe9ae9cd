"""Serving precision options of ``simcli step``, ``simcli serve`` and ``simcli serve plan``:
``--weight-dtype`` and ``--kv-cache-dtype`` (what they mean: :mod:`workloads.decompose.quant`),
the combinations the engines do not run, and what a GPU without fp8 refuses.
"""

from __future__ import annotations

from typing import Any, Literal

from hardware_specs.registry import load_catalog

# Serving precision (workloads.decompose.quant); the choices are the fields' Literals.
WeightDtype = Literal["bf16", "fp16", "fp8", "int8", "int4", "mxfp4"]
KvCacheDtype = Literal["auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2"]
WEIGHT_DTYPE_HELP = (
    "Weight precision: bf16 | fp16 (unquantised; the activations run in it too) | fp8 "
    "(W8A8, fp8 GEMMs) | int8 | int4 (weight-only W8A16/W4A16, group-128 scales, "
    "Marlin-style kernels) | mxfp4 (the MoE experts only, 4.25 bits, as gpt-oss ships them)."
)
KV_CACHE_DTYPE_HELP = (
    "KV-cache element type, vLLM's --kv-cache-dtype: auto (the activation dtype) | bf16 | "
    "fp16 | fp8 | fp8_e4m3 | fp8_e5m2 (the fp8 spellings are priced alike: one byte)."
)


def check_engine_precision(engine: str, weight_dtype: str, kv_cache_dtype: str) -> None:
    """The plain PyTorch engine runs unquantised weights and a KV cache in their dtype."""
    if engine != "pytorch-eager":
        return
    if weight_dtype not in ("bf16", "fp16"):
        raise ValueError(
            f"--weight-dtype {weight_dtype} with --engine pytorch-eager is not modelled (the "
            "plain PyTorch model runs unquantised weights); allowed: --engine vllm, or "
            "--weight-dtype bf16 or fp16"
        )
    if kv_cache_dtype not in ("auto", weight_dtype):
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype} with --engine pytorch-eager is not modelled; "
            "allowed: --engine vllm, or --kv-cache-dtype auto"
        )


def check_precision(
    gpu_id: str,
    weight_dtype: str,
    kv_cache_dtype: str,
    *,
    gpu_flag: str | None = None,
    catalog: Any = None,
) -> None:
    """fp8 weights (W8A8 GEMMs) and an fp8 KV cache need a GPU with fp8 tensor cores (its
    spec lists an fp8 rate); one line naming what the GPU allows otherwise (``gpu_flag``:
    the flag listing several GPUs, suggested as the other way out; ``catalog``: the one
    with any ``--hardware`` file merged, default the built-in)."""
    gpu = (catalog or load_catalog()).gpu(gpu_id)
    if gpu.supports("fp8"):
        return
    out = f" (or leave {gpu_id} out of {gpu_flag})" if gpu_flag else ""
    if weight_dtype == "fp8":
        raise ValueError(
            f"--weight-dtype fp8 needs fp8 tensor cores, which {gpu_id} lacks; allowed on "
            f"{gpu_id}: bf16, fp16, int8, int4{out}"
        )
    if kv_cache_dtype.startswith("fp8"):
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype} needs fp8 support, which {gpu_id} lacks; "
            f"allowed on {gpu_id}: auto, bf16, fp16{out}"
        )


def activation_dtype(weight_dtype: str) -> str:
    """The activations' dtype under ``--weight-dtype``: fp16 for fp16 weights, else bf16."""
    return "fp16" if weight_dtype == "fp16" else "bf16"


__all__ = [
    "KV_CACHE_DTYPE_HELP",
    "WEIGHT_DTYPE_HELP",
    "KvCacheDtype",
    "WeightDtype",
    "activation_dtype",
    "check_engine_precision",
    "check_precision",
]
