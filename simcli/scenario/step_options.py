"""The inputs of ``simcli step``: one engine iteration of one replica, as a pydantic model
whose fields are the command's options (see :mod:`simcli.scenario.serving_options` for
``serve`` and ``serve plan``, which share its engine, precision and sparsity fields)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from costmodels.steps.engines import EngineId
from simcli.scenario import sparsity_options as so
from simcli.scenario.config_base import (
    MAX_SEQS,
    SEQS_WHY,
    CommandConfig,
    count_field,
    tokens_field,
)
from simcli.scenario.image_options import IMAGE_FIELDS, check_image_size
from simcli.scenario.serving_engine_options import (
    BLOCK_HELP,
    attn_backend_field,
    composition_field,
    engine_field,
    fill_engine_defaults,
    hardware_field,
    profile_field,
)
from simcli.scenario.serving_precision import (
    KV_CACHE_DTYPE_HELP,
    WEIGHT_DTYPE_HELP,
    KvCacheDtype,
    WeightDtype,
    check_engine_precision,
)
from workloads.models import moe_imbalance_field


class StepOptions(CommandConfig):
    """``simcli step``: one engine iteration (prefill, decode or a mixed chunked-prefill
    batch) of one replica."""

    model: str = Field(description="Built-in model id or config.json.")
    moe_imbalance: float = moe_imbalance_field()
    gpu: str = Field(description="GPU id (see `simcli specs list`).")
    tp: int = Field(1, gt=0, description="Tensor-parallel degree.")
    pp: int = Field(1, gt=0, description="Pipeline-parallel degree.")
    phase: Literal["prefill", "decode", "mixed"] = Field(
        description="Iteration kind: prefill | decode | mixed"
    )
    batch: int = count_field(
        1,
        MAX_SEQS,
        SEQS_WHY,
        description="prefill: prompts; decode and mixed: decoding sequences.",
    )
    prompt_len: int | None = tokens_field(
        None, description="prefill/mixed: prompt tokens per sequence."
    )
    context_len: int | None = tokens_field(
        None,
        description="decode/mixed: tokens already cached per decoding sequence (>= 1: its "
        "prompt at least).",
        json_schema_extra={"gt_why": "a decoding sequence has at least one cached token"},
    )
    chunk: int | None = tokens_field(
        None, description="prefill/mixed: new tokens per prefill chunk (default: the rest)."
    )
    past: int = tokens_field(
        0, ge=0, description="prefill/mixed: prompt tokens already cached (earlier chunks)."
    )
    prefills: int = Field(1, gt=0, description="mixed: prefill chunks in the batch.")
    engine: EngineId = engine_field()
    attn_backend: str | None = attn_backend_field()
    hardware: Path | None = hardware_field()
    weight_dtype: WeightDtype = Field("bf16", description=WEIGHT_DTYPE_HELP)
    kv_cache_dtype: KvCacheDtype = Field("auto", description=KV_CACHE_DTYPE_HELP)
    weight_sparsity: so.WeightSparsity = so.weight_sparsity_field()
    activation_sparsity: so.ActivationSparsity = so.activation_sparsity_field()
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory the engine may use."
    )
    block_size: int = tokens_field(None, description=BLOCK_HELP)

    @model_validator(mode="before")
    @classmethod
    def _engine_defaults(cls, data: Any) -> Any:
        return fill_engine_defaults(data, {"block_size": "block_size"})

    max_model_len: int | None = tokens_field(
        None,
        description="Longest sequence (prompt + generated) the engine accepts, as vLLM's "
        "--max-model-len; default: the model's max_position_embeddings.",
    )
    profile: Path | None = profile_field()
    composition: Path | None = composition_field()
    images_per_request: int = IMAGE_FIELDS["images_per_request"]()
    image_size: str = IMAGE_FIELDS["image_size"]()

    @field_validator("image_size")
    @classmethod
    def _image_size(cls, v: str) -> str:
        return check_image_size(v)

    @model_validator(mode="after")
    def _phase_inputs(self) -> StepOptions:
        check_engine_precision(self.engine, self.weight_dtype, self.kv_cache_dtype)
        so.check_sparsity_options(self)
        self.step_batch()
        return self

    def step_batch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prefill_new, prefill_past, decode_ctx) of the iteration the options describe."""
        phase, prompt_len, context_len, chunk, past = (
            self.phase,
            self.prompt_len,
            self.context_len,
            self.chunk,
            self.past,
        )
        none = np.zeros(0, np.int64)
        pre_new = pre_past = dec = none
        if phase in ("prefill", "mixed"):
            if prompt_len is None and chunk is None:
                raise ValueError(f"--phase {phase} needs --prompt-len (and optionally --chunk)")
            new = chunk if chunk is not None else prompt_len - past  # type: ignore[operator]
            if new < 1 or (prompt_len is not None and past + new > prompt_len):
                raise ValueError(
                    f"--past {past} + --chunk {new} exceeds --prompt-len {prompt_len}; allowed: "
                    "past + chunk <= prompt-len"
                )
            seqs = self.batch if phase == "prefill" else self.prefills
            pre_new, pre_past = np.full(seqs, new, np.int64), np.full(seqs, past, np.int64)
        if phase in ("decode", "mixed"):
            if context_len is None:
                raise ValueError(
                    f"--phase {phase} needs --context-len (cached tokens per sequence)"
                )
            dec = np.full(self.batch, context_len, np.int64)
        elif context_len is not None:
            raise ValueError(
                "--context-len is for --phase decode|mixed; prefill takes --prompt-len"
            )
        return pre_new, pre_past, dec


__all__ = ["StepOptions"]
