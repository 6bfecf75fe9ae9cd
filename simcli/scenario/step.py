"""Step models and ``simcli step``: the step model of one replica
(:func:`build_step_model`, shared by every serving scenario: ``simcli serve``, ``serve plan``
and ``simcli step`` price a deployment's iterations with it), the engine's max model
length, and ``simcli step`` resolved (:class:`StepScenario`) and priced (:func:`run_step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from costmodels.ops.select import provenance_fields
from costmodels.steps.composition import Composition, load_composition
from costmodels.steps.serving import StepModel
from costmodels.steps.serving_memory import DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_SEQS, GIB
from costmodels.steps.vision_step import with_images
from simcli.scenario.hardware import Hardware, resolve_hardware
from simcli.scenario.image_options import image_fields, image_load, image_tokens
from simcli.scenario.serving_precision import activation_dtype, check_precision
from simcli.scenario.sparsity_options import sparsity_fields
from simcli.scenario.step_options import StepOptions
from workloads.models import ModelConfig, load_model, with_moe_imbalance
from workloads.vision import ImageLoad

# --------------------------------------------------------------------------- step models


def build_step_model(
    model: ModelConfig,
    hardware: Hardware,
    *,
    tp: int,
    pp: int = 1,
    engine: str = "vllm",
    attn_pattern: str | None = None,
    attn_backend: str | None = None,
    weight_dtype: str = "bf16",
    kv_cache_dtype: str = "auto",
    weight_sparsity: str | None = None,
    activation_sparsity: str | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_SEQS,
    composition: Composition | None | str = "shipped",
    scheduler_steps: int = 1,
    images: ImageLoad | None = None,
) -> StepModel:
    """The step model of one replica of ``tp x pp`` ``hardware`` GPUs, priced by the
    hardware's op cost model and ``composition`` (default: the GPU's shipped file); with
    ``attn_pattern`` the sparse-attention variant
    (:class:`simcli.sparsity.serving.PatternStepModel`). ``weight_dtype`` fp16 runs the
    activations in fp16, every other in bf16 (:mod:`workloads.decompose.quant`);
    ``weight_sparsity``/``activation_sparsity``: sparse linear layers
    (:mod:`workloads.decompose.sparsity`); ``images``: the images every request carries
    to a vision-language model (:func:`costmodels.steps.vision_step.with_images`)."""
    check_precision(hardware.gpu_id, weight_dtype, kv_cache_dtype, catalog=hardware.catalog)
    if weight_dtype == "mxfp4" and not model.is_moe:
        raise ValueError(
            f"--weight-dtype mxfp4 stores MoE experts; {model.id} has none; allowed: bf16, "
            "fp16, fp8, int8, int4"
        )
    kw: dict[str, Any] = dict(
        tp=tp,
        pp=pp,
        engine=engine,
        attn_backend=attn_backend,
        dtype=activation_dtype(weight_dtype),
        weight_dtype=weight_dtype,
        kv_cache_dtype=kv_cache_dtype,
        weight_sparsity=weight_sparsity,
        activation_sparsity=activation_sparsity,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        cost_model=hardware.cost_model,
        composition=composition,
        scheduler_steps=scheduler_steps,
    )
    own = attn_pattern is None
    if own:  # the architecture's own local layers (gpt-oss, Gemma, Llama 4)
        attn_pattern = model.native_attn_pattern
    if attn_pattern is not None:
        from costmodels.steps.sparse import PatternStepModel

        # the eager engine is the transformers-style model: masked SDPA on local layers
        hf = own and engine == "pytorch-eager"
        step = PatternStepModel(model, hardware.gpu_id, pattern=attn_pattern, hf_masked=hf, **kw)
    else:
        step = StepModel(model, hardware.gpu_id, **kw)
    return with_images(step, images)


# --------------------------------------------------------------------------- simcli step


@dataclass(frozen=True)
class StepScenario:
    """``simcli step`` resolved: the hardware, the step model and the iteration's batch."""

    options: StepOptions
    hardware: Hardware
    step: StepModel
    batch: tuple[np.ndarray, np.ndarray, np.ndarray]  # prefill_new, prefill_past, decode_ctx

    @property
    def title(self) -> str:
        o = self.options
        where = f"{o.tp * o.pp} x {o.gpu} ({o.engine})"
        return f"{self.step.model.id} {o.phase} step on {where}"


def resolve_step(options: StepOptions) -> StepScenario:
    o = options
    model = with_moe_imbalance(load_model(o.model), o.moe_imbalance)
    hardware = resolve_hardware(o.gpu, o.tp * o.pp, profile=o.profile, hardware_file=o.hardware)
    step = build_step_model(
        model, hardware, tp=o.tp, pp=o.pp, engine=o.engine, attn_backend=o.attn_backend,
        weight_dtype=o.weight_dtype, kv_cache_dtype=o.kv_cache_dtype,
        weight_sparsity=o.weight_sparsity, activation_sparsity=o.activation_sparsity,
        composition=resolve_composition(o.composition), images=image_load(o, model),
    )  # fmt: skip
    pn, pp, dc = o.step_batch()
    if o.images_per_request:  # the images' tokens lead each prompt that starts here
        pn = np.where(pp == 0, pn + image_tokens(o, model), pn)
    return StepScenario(o, hardware, step, (pn, pp, dc))


def resolve_composition(path: Path | None) -> Composition | str:
    """``--composition FILE``, or the GPU's shipped composition."""
    return load_composition(path) if path is not None else "shipped"


def step_seq_lens(args: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Tokens each sequence of a step holds after it: cached + new (prefills), context +
    the generated one (decodes)."""
    pre_new, pre_past, dec = args
    return np.concatenate([pre_new + pre_past, dec + 1]).astype(np.int64)


def weight_gib_per_gpu(step: Any) -> float | None:
    """Weights on the fullest GPU of a replica (any pipeline stage), GiB (None for a step
    model that does not say)."""
    per_gpu = getattr(step, "weight_bytes_per_gpu", None)
    if per_gpu is None:
        return None
    return max(per_gpu(i) for i in range(getattr(step, "pp", 1))) / GIB


def model_len_limit(model: ModelConfig, max_model_len: int | None) -> int:
    """The engine's max model length: ``--max-model-len`` (vLLM's ``max_model_len``), at
    most and by default the model's ``max_position_embeddings``."""
    if max_model_len is not None and max_model_len > model.max_seq_len:
        raise ValueError(
            f"--max-model-len {max_model_len} exceeds {model.id}'s max_position_embeddings "
            f"{model.max_seq_len}; allowed: <= {model.max_seq_len}"
        )
    return max_model_len or model.max_seq_len


def check_model_len(model: ModelConfig, max_model_len: int | None, longest: int) -> int:
    """The engine's max model length (:func:`model_len_limit`); a longer sequence is
    refused in one line."""
    limit = model_len_limit(model, max_model_len)
    if longest > limit:
        raise ValueError(
            f"a sequence of {longest} tokens exceeds the max model length {limit} of "
            f"{model.id}; allowed: prompt + cached + generated <= {limit} (--max-model-len)"
        )
    return limit


def run_step(scenario: StepScenario) -> dict[str, Any]:
    """What ``simcli step`` prints: step time, tokens/s, KV capacity (and whether the
    batch's sequences fit in it), per-op breakdown."""
    o, sm, args = scenario.options, scenario.step, scenario.batch
    lens = step_seq_lens(args)
    limit = check_model_len(sm.model, o.max_model_len, int(lens.max(initial=0)))
    capacity = sm.kv_capacity_tokens(o.block_size, o.gpu_memory_utilization)
    # paged KV: each sequence holds whole blocks
    needed = int((-(-lens // o.block_size) * o.block_size).sum())
    step_s = sm.step_s(*args)
    tokens = int(args[0].sum()) + int(args[2].size)
    plan = sm.launch_plan(*args)
    return {
        "model": sm.model.id,
        "gpu": o.gpu,
        "engine": o.engine,
        **engine_fields(sm),
        "weight_dtype": sm.weight_dtype,
        "kv_cache_dtype": sm.kv_cache_dtype,
        **sparsity_fields(o),
        "cost_model": sm.label,
        **provenance_fields(sm.cost_model),
        "attn_backend": sm.attn_backend,
        "tp": o.tp,
        "pp": o.pp,
        "num_gpus": o.tp * o.pp,
        "phase": o.phase,
        "batch": o.batch,
        "prompt_len": o.prompt_len,
        "context_len": o.context_len,
        **image_fields(o, sm.model),
        "prefill_seqs": int(args[0].size),
        "prefill_new_tokens": int(args[0].sum()),
        "decode_seqs": int(args[2].size),
        "tokens": tokens,
        "step_ms": 1e3 * step_s,
        "tokens_per_s": tokens / step_s,
        "stage_ms": 1e3 * sm.stage_s(*args),
        "weight_gib_per_gpu": weight_gib_per_gpu(sm),
        "kv_bytes_per_token": sm.kv_bytes_per_token,
        "kv_capacity_tokens": capacity,
        "kv_cache_gib": capacity * sm.kv_bytes_per_token / GIB,
        "kv_tokens_needed": needed,
        "kv_fits": needed <= capacity,
        "max_model_len": limit,
        "cuda_graph": plan["cuda_graph"],
        "padded_tokens": plan["padded_tokens"],
        "host_ms": 1e3 * plan["host_s"],
        "host_overlapped": plan["host_overlapped"],
        "breakdown_ms": {k: 1e3 * v for k, v in sm.breakdown(*args).items()},
    }


def engine_fields(step: Any) -> dict[str, Any]:
    """The engine profile a step model prices (``engine_version_family``) and the attention
    op backends it took (empty for a step model without a profile)."""
    profile = getattr(step, "profile", None)
    if profile is None:
        return {}
    return {
        "engine_version_family": profile.version_family,
        "attn_backend_prefill": step.prefill_backend,
        "attn_backend_decode": step.decode_backend,
    }


__all__ = [
    "StepOptions",
    "StepScenario",
    "build_step_model",
    "check_model_len",
    "engine_fields",
    "model_len_limit",
    "resolve_composition",
    "resolve_step",
    "run_step",
    "step_seq_lens",
    "weight_gib_per_gpu",
]
