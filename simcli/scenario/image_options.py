"""The image options of ``simcli step``, ``serve`` and ``serve plan``: images every
request carries to a vision-language model (:mod:`workloads.vision`). Their placeholder
tokens join each prompt; the encoder runs over them in the request's first prefill step
(:mod:`costmodels.steps.vision_step`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from workloads.models import ModelConfig
from workloads.vision import ImageLoad, VisionError, parse_image_size

MAX_IMAGES_PER_REQUEST = 64
DEFAULT_IMAGE_SIZE = "1024x1024"

IMAGE_FIELDS: dict[str, Any] = {
    "images_per_request": lambda: Field(
        0,
        ge=0,
        le=MAX_IMAGES_PER_REQUEST,
        description="Images each request carries (a vision-language model, e.g. Qwen2.5-VL): "
        "their tokens join the prompt and the vision encoder runs on them in the request's "
        "first prefill step.",
    ),
    "image_size": lambda: Field(
        DEFAULT_IMAGE_SIZE,
        description="Pixels of each image, WIDTHxHEIGHT; resized as the model's processor "
        "does (Qwen2-VL's smart_resize: sides to multiples of 28, at most 12.8 MP).",
    ),
}


def check_image_size(value: str) -> str:
    """A field validator's body: ``WxH`` or one line."""
    try:
        parse_image_size(value)
    except VisionError:
        raise ValueError(
            "allowed: WIDTHxHEIGHT pixels, e.g. 1024x768, each side 1 to 65536"
        ) from None
    return value.strip().lower()


def image_load(options: Any, model: ModelConfig) -> ImageLoad | None:
    """The images of ``options`` for ``model`` (None without images); one line when the
    model has no vision encoder."""
    n = getattr(options, "images_per_request", 0) or 0
    if n == 0:
        return None
    if model.vision is None:
        raise ValueError(
            f"--images-per-request {n}: {model.id} has no vision encoder; allowed: 0, or a "
            "vision-language model (e.g. examples/models/qwen2.5-vl-7b.config.json)"
        )
    w, h = parse_image_size(options.image_size)
    return ImageLoad(n, w, h)


def image_tokens(options: Any, model: ModelConfig) -> int:
    """Prompt tokens the images add to each request (0 without images)."""
    load = image_load(options, model)
    return load.tokens(model.vision) if load is not None else 0  # type: ignore[arg-type]


def image_fields(options: Any, model: ModelConfig) -> dict[str, Any]:
    """The images in a command's output: count, size and tokens per request."""
    n = getattr(options, "images_per_request", 0) or 0
    return {
        "images_per_request": n,
        "image_size": options.image_size if n else None,
        "image_tokens_per_request": image_tokens(options, model),
    }


__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "IMAGE_FIELDS",
    "MAX_IMAGES_PER_REQUEST",
    "check_image_size",
    "image_fields",
    "image_load",
    "image_tokens",
]
