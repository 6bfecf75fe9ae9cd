"""The vision encoder of a vision-language model and the image tokens it feeds the LLM.

Qwen2.5-VL's (``model_type`` ``qwen2_5_vl``, ``vision_config`` of its ``config.json``) is a
ViT over 14 x 14 patches of two stacked frames (an image is repeated to fill
``temporal_patch_size``), with RMSNorm, a gated SiLU MLP with biases, 2D rotary
positions, window attention (``window_size`` px windows) in every block but the
``fullatt_block_indexes`` ones, and a patch merger that concatenates 2 x 2 neighbouring
patches into one LLM token through a two-layer GELU MLP (transformers'
``modeling_qwen2_5_vl.py``). Parameter counts equal transformers' ``numel``
(``tests/workloads/test_vision.py``).

An image of W x H pixels is resized as Qwen2-VL's processor does (``smart_resize``: each
side rounded to a multiple of ``patch_size * spatial_merge_size``, the area kept within
the processor's ``min_pixels`` / ``max_pixels``, 3136 and 12845056 in the released
``preprocessor_config.json``), then cut into patches; each 2 x 2 of them is one token.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# Qwen2.5-VL's released preprocessor_config.json (min_pixels, max_pixels)
QWEN_MIN_PIXELS = 3136
QWEN_MAX_PIXELS = 12845056
MAX_IMAGE_SIDE_PX = 65536
_SIZE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class VisionError(ValueError):
    """A vision config or image size that cannot be read; one line."""


class VisionEncoder(BaseModel):
    """A Qwen2.5-VL-style vision encoder (see the module)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["qwen2_5_vl"] = "qwen2_5_vl"
    depth: int = Field(gt=0, description="ViT blocks")
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0, description="gated MLP width")
    num_heads: int = Field(gt=0)
    out_hidden_size: int = Field(gt=0, description="the LLM's hidden size (merger output)")
    patch_size: int = Field(14, gt=0, description="pixels per patch side")
    temporal_patch_size: int = Field(2, gt=0, description="frames stacked into one patch")
    spatial_merge_size: int = Field(2, gt=0, description="patches per token side")
    in_channels: int = Field(3, gt=0)
    window_size: int = Field(112, gt=0, description="window attention span, pixels per side")
    fullatt_blocks: tuple[int, ...] = Field((), description="blocks with full attention")
    min_pixels: int = Field(QWEN_MIN_PIXELS, gt=0)
    max_pixels: int = Field(QWEN_MAX_PIXELS, gt=0)

    @model_validator(mode="after")
    def _check(self) -> VisionEncoder:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"vision hidden_size {self.hidden_size} is not a multiple of num_heads "
                f"{self.num_heads}"
            )
        bad = [b for b in self.fullatt_blocks if not 0 <= b < self.depth]
        if bad:
            raise ValueError(f"fullatt_block_indexes {bad} outside 0..{self.depth - 1}")
        if self.window_size % (self.patch_size * self.spatial_merge_size):
            raise ValueError(
                f"window_size {self.window_size} is not a multiple of patch_size x "
                f"spatial_merge_size ({self.patch_size * self.spatial_merge_size})"
            )
        return self

    # --- shapes ----------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Inputs of one patch: channels x frames x pixels (the patch embedding's k)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merged_dim(self) -> int:
        """Width of a token before the merger MLP: its merge x merge patches concatenated."""
        return self.hidden_size * self.spatial_merge_size**2

    @property
    def window_patches_side(self) -> int:
        """Patches per window side (112 px windows of 14 px patches: 8)."""
        return self.window_size // self.patch_size

    @property
    def window_blocks(self) -> int:
        return self.depth - len(set(self.fullatt_blocks))

    # --- parameters ------------------------------------------------------------------
    @property
    def block_params(self) -> int:
        h, f = self.hidden_size, self.intermediate_size
        qkv, proj = h * 3 * h + 3 * h, h * h + h
        mlp = 2 * (h * f + f) + f * h + h  # gate, up, down with biases
        return qkv + proj + mlp + 2 * h  # + two RMSNorm weights

    @property
    def merger_params(self) -> int:
        m = self.merged_dim
        return self.hidden_size + (m * m + m) + (m * self.out_hidden_size + self.out_hidden_size)

    @property
    def params(self) -> int:
        """transformers' ``numel`` of the ``visual`` module: patch embedding (no bias),
        the blocks, the merger."""
        return (
            self.patch_dim * self.hidden_size
            + self.depth * self.block_params
            + (self.merger_params)
        )

    def params_per_rank(self, tp: int) -> int:
        """Parameters one of ``tp`` ranks holds when the encoder is split as the LLM is
        (vLLM: column-parallel QKV, gate-up and first merger linear with their biases,
        row-parallel output, down and second merger linear with replicated biases; the
        patch embedding and norms replicated)."""
        h, f, m = self.hidden_size, self.intermediate_size, self.merged_dim
        block = (3 * h * h + 3 * h + 2 * (h * f + f)) // tp + (h * h + f * h) // tp
        block += 2 * h + 2 * h  # the row-parallel biases and the two norms
        merger = h + (m * m + m) // tp + (m * self.out_hidden_size) // tp + self.out_hidden_size
        return self.patch_dim * h + self.depth * block + merger

    # --- images ----------------------------------------------------------------------
    def grid(self, width_px: int, height_px: int) -> tuple[int, int]:
        """(patch rows, patch columns) of one image after ``smart_resize``."""
        if width_px < 1 or height_px < 1:
            raise VisionError(f"image size {width_px}x{height_px}; allowed: positive sides")
        if max(width_px, height_px) / min(width_px, height_px) > 200:
            raise VisionError(
                f"image size {width_px}x{height_px}: aspect ratio above 200, which the "
                "Qwen2-VL processor refuses; allowed: at most 200:1"
            )
        f = self.patch_size * self.spatial_merge_size
        h_bar, w_bar = round(height_px / f) * f, round(width_px / f) * f  # half to even, as HF
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height_px * width_px / self.max_pixels)
            h_bar = max(f, math.floor(height_px / beta / f) * f)
            w_bar = max(f, math.floor(width_px / beta / f) * f)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height_px * width_px))
            h_bar = math.ceil(height_px * beta / f) * f
            w_bar = math.ceil(width_px * beta / f) * f
        return h_bar // self.patch_size, w_bar // self.patch_size

    def patches(self, width_px: int, height_px: int) -> int:
        gh, gw = self.grid(width_px, height_px)
        return gh * gw

    def tokens(self, width_px: int, height_px: int) -> int:
        """LLM tokens of one image (its placeholder tokens in the prompt)."""
        return self.patches(width_px, height_px) // self.spatial_merge_size**2

    def windows(self, width_px: int, height_px: int) -> list[int]:
        """Patches in each attention window of one image (edge windows are partial):
        windows tile the grid in ``window_size`` px squares of merged tokens."""
        gh, gw = self.grid(width_px, height_px)
        s = self.window_patches_side
        rows = [min(s, gh - i) for i in range(0, gh, s)]
        cols = [min(s, gw - j) for j in range(0, gw, s)]
        return [r * c for r in rows for c in cols]


def vision_from_hf(vc: Any, out_hidden: int, where: str) -> VisionEncoder:
    """A Qwen2.5-VL ``vision_config``; missing keys take transformers'
    ``Qwen2_5_VLVisionConfig`` defaults (depth 32, hidden 3584 out, ...)."""
    if not isinstance(vc, dict):
        raise VisionError(f"{where}: vision_config must be a JSON object")
    act = vc.get("hidden_act", "silu")
    if act != "silu":
        raise VisionError(f"{where}: vision_config hidden_act {act!r}; allowed: 'silu'")
    try:
        return VisionEncoder(
            depth=vc.get("depth", 32),
            hidden_size=vc.get("hidden_size", 1280),
            intermediate_size=vc.get("intermediate_size", 3420),
            num_heads=vc.get("num_heads", 16),
            out_hidden_size=vc.get("out_hidden_size", out_hidden),
            patch_size=vc.get("patch_size", 14),
            temporal_patch_size=vc.get("temporal_patch_size", 2),
            spatial_merge_size=vc.get("spatial_merge_size", 2),
            in_channels=vc.get("in_channels", vc.get("in_chans", 3)),
            window_size=vc.get("window_size", 112),
            fullatt_blocks=tuple(vc.get("fullatt_block_indexes", (7, 15, 23, 31))),
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err.get("loc", ()))
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        raise VisionError(f"{where}: vision_config: {field + ': ' if field else ''}{msg}") from None


@dataclass(frozen=True)
class ImageLoad:
    """Images every request carries: how many and their size in pixels."""

    per_request: int
    width_px: int
    height_px: int

    def tokens(self, enc: VisionEncoder) -> int:
        """Prompt tokens the images add to each request."""
        return self.per_request * enc.tokens(self.width_px, self.height_px)


def parse_image_size(text: str) -> tuple[int, int]:
    """``WxH`` pixels (``1024x768``); one line otherwise."""
    m = _SIZE.match(text or "")
    if m is None:
        raise VisionError(f"--image-size {text!r}; allowed: WIDTHxHEIGHT pixels, e.g. 1024x768")
    w, h = int(m.group(1)), int(m.group(2))
    if not (0 < w <= MAX_IMAGE_SIDE_PX and 0 < h <= MAX_IMAGE_SIDE_PX):
        raise VisionError(
            f"--image-size {text!r}; allowed: sides between 1 and {MAX_IMAGE_SIDE_PX} px"
        )
    return w, h


__all__ = [
    "ImageLoad",
    "VisionEncoder",
    "VisionError",
    "parse_image_size",
    "vision_from_hf",
]
