"""Efficiency parameters of the analytical models, per GPU architecture.

The analytical models are physics (FLOPs, bytes, tiles, waves, link bandwidths);
these parameters say how close real kernels get to the datasheet. Defaults per
architecture live in ``data/efficiency.yaml`` with their justification; a
calibration profile overrides them with values fitted on measurements.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hardware_specs.schema import Dtype


class _P(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The head-dim points the attention models interpolate between (128 is the reference, 1.0).
HEAD_DIM_POINTS = (64, 256)


def _complete_head_dims(factors: dict[int, float]) -> dict[int, float]:
    """A factor table with both interpolation points: a fit that saw only one side of 128
    (or a profile that overrides one point) leaves the other at 1.0, the neutral value
    that the defaults use, instead of a table the attention models cannot index."""
    return {**{d: 1.0 for d in HEAD_DIM_POINTS}, **factors}


class GemmParams(_P):
    mma_efficiency: dict[Dtype, float] = Field(
        description="fraction of dense peak a large, well-shaped tile reaches in its main loop"
    )
    tiles: list[tuple[int, int]] = Field(
        description="CTA tile shapes (Tm, Tn) the library chooses among"
    )
    operand_feed_bytes_per_s: float = Field(
        gt=0,
        description="L2->SMEM operand bandwidth across the chip; small tiles become feed-bound",
    )
    k_overhead: float = Field(
        ge=0, description="per-tile prologue/epilogue cost, in equivalent k elements"
    )
    max_split_k: int = Field(ge=1, description="largest split-K factor considered")
    misaligned_efficiency: dict[int, dict[int, float]] = Field(
        description="element bytes (1, 2, 4) -> byte alignment of the k and n rows below 16 "
        "(8, 4, 2, 1) -> rate factor: no TMA/wgmma kernels"
    )
    wave_latency_s: float = Field(
        ge=0, description="fixed cost per wave: pipeline fill from HBM and the epilogue's stores"
    )
    memory_efficiency: float = Field(gt=0, le=1, description="fraction of HBM peak for operands")
    launch_s: float = Field(ge=0, description="fixed time per GEMM call (launch, heuristics)")


class AttentionBackendParams(_P):
    fwd_efficiency: float = Field(gt=0, le=1, description="tensor-core efficiency of fwd tiles")
    bwd_efficiency: float = Field(gt=0, le=1, description="tensor-core efficiency of bwd tiles")
    exp_overlap: float = Field(
        ge=0, le=1, description="fraction of softmax exp time hidden under matmuls (FA3 ~1)"
    )
    block_m: int = Field(gt=0, description="query rows per tile")
    block_n: int = Field(gt=0, description="key columns per tile")
    launch_s: float = Field(ge=0)
    bwd_launch_s: float = Field(ge=0, description="extra fixed cost of the backward kernels")
    fwd_head_dim_factor: dict[int, float] = Field(
        default_factory=lambda: {64: 1.0, 256: 1.0},
        description="forward efficiency at head_dim 64 and 256 relative to 128 (kernels are "
        "compiled per head dim; 128 is usually the best tuned)",
    )
    bwd_head_dim_factor: dict[int, float] = Field(
        default_factory=lambda: {64: 1.0, 256: 1.0},
        description="backward efficiency at head_dim 64 and 256 relative to 128",
    )
    cta_latency_s: float = Field(
        default=1.0e-6, ge=0, description="per wave of CTAs: loading Q (or K, V), storing outputs"
    )
    bwd_row_bytes: float = Field(
        default=24.0,
        ge=0,
        description="backward bytes per query row x head x head_dim moved by kernels that run "
        "before and after the main one (dO.O, fp32 dQ accumulator zero, accumulate, convert)",
    )

    _head_dims = field_validator("fwd_head_dim_factor", "bwd_head_dim_factor")(_complete_head_dims)


class DecodeBackendParams(_P):
    """A decode kernel family measured apart from PyTorch's (FlashInfer's paged decode):
    its own values of the split-KV decode parameters of the same names in
    :class:`AttentionParams` (``decode_`` prefix dropped). A backend listed here always
    splits the KV cache over CTAs."""

    memory_efficiency: float = Field(gt=0, le=1)
    crowded_bytes_per_s: float = Field(gt=0)
    ctas_per_sm: float = Field(gt=0)
    launch_s: float = Field(ge=0)
    split_iter_s: float = Field(ge=0)
    head_dim_factor: dict[int, float] = Field(default_factory=lambda: {64: 1.0, 256: 1.0})

    _head_dims = field_validator("head_dim_factor")(_complete_head_dims)


class AttentionParams(_P):
    backends: dict[str, AttentionBackendParams]
    decode_backends: dict[str, DecodeBackendParams] = Field(
        default_factory=dict,
        description="decode parameters of backends measured apart (the decode_* fields "
        "below describe PyTorch's split-KV kernels)",
    )
    decode_memory_efficiency: float = Field(gt=0, le=1)
    decode_crowded_bytes_per_s: float = Field(
        default=2.7e12,
        gt=0,
        description="KV-read rate of a split-KV backend once batch x KV heads exceeds the SM "
        "count (no split, several cache streams per SM): measured ~2.7 TB/s on both H100 "
        "and H200, where one stream per SM reads 3.0 and 4.4 TB/s",
    )
    decode_ctas_per_sm: float = Field(
        gt=0, description="CTAs per SM needed to saturate HBM in split-KV decode"
    )
    decode_launch_s: float = Field(ge=0, description="split-KV kernel plus combine kernel")
    decode_split_iter_s: float = Field(
        default=0.3e-6, ge=0, description="one CTA's step over a 128-key block, split-KV"
    )
    decode_nosplit_iter_s: float = Field(
        default=2.0e-6, ge=0, description="one CTA's step over a 64-key block, no split-KV"
    )
    decode_nosplit_ctas_per_sm: float = Field(
        default=2.0, gt=0, description="resident CTAs per SM of the non-split decode kernel"
    )
    decode_nosplit_head_dim_factor: dict[int, float] = Field(
        default_factory=lambda: {64: 1.0, 256: 1.0},
        description="non-split decode step speed at head_dim 64 and 256 relative to 128",
    )
    decode_head_dim_factor: dict[int, float] = Field(
        default_factory=lambda: {64: 1.0, 256: 1.0},
        description="decode HBM efficiency at head_dim 64 and 256 relative to 128 (short "
        "K/V rows make less efficient loads)",
    )
    decode_split_kv_backends: list[str] = Field(
        default=["flash", "cudnn", "flex"],
        description="backends whose decode kernels split the KV cache over CTAs (Flash-Decoding)",
    )
    memory_efficiency: float = Field(gt=0, le=1)

    _head_dims = field_validator("decode_nosplit_head_dim_factor", "decode_head_dim_factor")(
        _complete_head_dims
    )


class ElementwiseParams(_P):
    memory_efficiency: dict[str, float] = Field(
        description="achieved fraction of HBM bandwidth per op kind (`default` for the rest)"
    )
    ramp_bytes: float = Field(
        ge=0, description="bytes of extra traffic-equivalent before bandwidth saturates"
    )
    launch_s: float = Field(ge=0)


class ProtocolParams(_P):
    base_latency_s: float = Field(ge=0, description="per-call latency (NCCL baseLat)")
    step_latency_s: float = Field(ge=0, description="per ring/tree step on NVLink (NCCL hwLat)")
    net_step_latency_s: float = Field(ge=0, description="per step that crosses the network")
    bandwidth_fraction: float = Field(
        gt=0, le=1, description="payload share of the wire (LL 0.5, LL128 120/128, Simple 1)"
    )


class CollectiveParams(_P):
    protocols: dict[str, ProtocolParams]
    intra_node_efficiency: dict[str, float] = Field(
        description="achieved fraction of the per-GPU fabric bandwidth per collective kind"
    )
    network_efficiency: float = Field(gt=0, le=1)
    launch_s: float = Field(ge=0)
    send_recv_latency_s: float = Field(
        default=12.0e-6, ge=0, description="small-message time of a send/recv pair (P2P transport)"
    )
    all_to_all_latency_s: float = Field(
        default=12.0e-6, ge=0, description="small-message time of an all-to-all (grouped P2P)"
    )


class ArchParams(_P):
    """All efficiency parameters for one architecture."""

    source: str = Field(description="where these numbers come from")
    gemm: GemmParams
    attention: AttentionParams
    elementwise: ElementwiseParams
    collectives: CollectiveParams


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; keys match by their string form (JSON turns 8 into "8")."""
    out = dict(base)
    by_text = {str(k): k for k in out}
    for raw_key, value in over.items():
        key = by_text.get(str(raw_key), raw_key)
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


@lru_cache(maxsize=1)
def _raw_defaults() -> dict[str, Any]:
    path = Path(str(resources.files("costmodels") / "data" / "efficiency.yaml"))
    # libyaml's parser when installed: the same objects as safe_load, ~8x faster
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def arch_params(architecture: str, overrides: dict[str, Any] | None = None) -> ArchParams:
    """Parameters for an architecture: the shared base, its own entries, then ``overrides``."""
    raw = _raw_defaults()
    archs = raw["architectures"]
    if architecture not in archs:
        raise ValueError(
            f"no efficiency parameters for architecture {architecture!r}; "
            f"known: {', '.join(sorted(archs))}"
        )
    merged = deep_merge(raw["base"], archs[architecture])
    if overrides:
        merged = deep_merge(merged, overrides)
    try:
        return ArchParams.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"efficiency parameters for {architecture}: {loc}: {err['msg']}") from exc
