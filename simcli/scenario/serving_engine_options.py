"""The engine options of ``simcli serve``, ``serve plan`` and ``step``: ``--engine`` (one of
the shipped engine profiles, :data:`costmodels.steps.engines.ENGINE_IDS`), ``--attn-backend``,
``--hardware``, and the engine's defaults (scheduler, max_num_seqs, block size, token budget
on the GPU's memory tier) filled in where a flag was not given."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from costmodels.steps.engines import ENGINE_IDS, load_engine
from hardware_specs.registry import SpecError, load_catalog
from simcli.serving.schedulers import classic_scheduler

CHUNK_HELP = (
    "Sarathi token budget per iteration, tokens (default: the engine's max_num_batched_tokens "
    "on the GPU, else 512)."
)
SEQS_HELP = "Running sequences per replica (max_num_seqs; default: the engine's on the GPU)."
BLOCK_HELP = "KV-cache block, tokens (default: the engine's)."

ENGINE_HELP = (
    f"Engine profile ({' | '.join(ENGINE_IDS)}; vllm = the V1 engine): its kernels per GPU, "
    "CUDA graphs, host work and defaults (costmodels/data/engines, docs/engines.md)."
)


def engine_field(help_text: str = ENGINE_HELP) -> Any:
    """``--engine``: one of the shipped engine profiles (the one registry of ids)."""
    return Field("vllm", description=help_text)


def attn_backend_field() -> Any:
    """``--attn-backend``: the op backend of prefill and decode attention."""
    return Field(
        None,
        description="Attention kernels: flash | cudnn | flex | efficient | flashinfer "
        "(default: the engine's per GPU architecture).",
    )


def hardware_field() -> Any:
    """``--hardware``: an extra hardware spec file (as on ``train`` and ``predict``)."""
    return Field(None, description="Extra hardware spec file (YAML/JSON).")


def profile_field() -> Any:
    """``--profile``: a calibration profile in place of the GPU's shipped one."""
    return Field(None, description="Calibration profile (JSON).")


def composition_field() -> Any:
    """``--composition``: whole-step composition factors for the eager engine."""
    return Field(
        None,
        description="Composition factors from `simcli calibrate from-trace` (JSON); default: "
        "the ones shipped for the GPU (engine pytorch-eager on H100/H200).",
    )


def fill_engine_defaults(data: Any, fields: dict[str, str]) -> Any:
    """``data`` (a command's raw values) with each of ``fields`` (field -> the engine
    default it takes: max_num_seqs, block_size, scheduler, max_num_batched_tokens)
    that is missing or None set from ``--engine``'s profile on ``--gpu`` (its memory tier);
    a bad engine or GPU is left for the field checks to report."""
    if not isinstance(data, dict):
        return data
    engine = data.get("engine") or "vllm"
    if engine not in ENGINE_IDS or all(data.get(k) is not None for k in fields):
        return data
    profile = load_engine(engine)
    gpu_id, memory_gib = str(data.get("gpu") or ""), 0.0
    try:
        if gpu_id:
            memory_gib = load_catalog(data.get("hardware")).gpu(gpu_id).memory_gib
    except (SpecError, OSError, ValueError):
        pass
    tp = data.get("tp") if isinstance(data.get("tp"), int) else 1
    d = profile.defaults_for(gpu_id, memory_gib, tp)
    out = dict(data)
    for name, key in fields.items():
        if out.get(name) is None:
            out[name] = getattr(d, key)
    return out


def serve_engine_defaults(data: Any) -> Any:
    """``simcli serve``'s raw values with the engine's scheduler, max_num_seqs, block size
    and Sarathi budget (its max_num_batched_tokens, else Sarathi-Serve's 512) where the
    flags are not given."""
    chose = isinstance(data, dict) and data.get("scheduler") is not None
    data = fill_engine_defaults(data, {"scheduler": "scheduler",
                                       "max_batch_size": "max_num_seqs",
                                       "block_size": "block_size"})  # fmt: skip
    if isinstance(data, dict) and not chose and _needs_classic_scheduler(data):
        # the engines' own schedulers model plain serving only: disaggregation, drafts,
        # branches and swap run on the closest classic one
        data["scheduler"] = classic_scheduler(data.get("scheduler"))
    if isinstance(data, dict) and data.get("chunk_size") is None:
        data = fill_engine_defaults(data, {"chunk_size": "max_num_batched_tokens"})
        if data.get("chunk_size") is None:
            data["chunk_size"] = 512
    return data


def _needs_classic_scheduler(data: dict[str, Any]) -> bool:
    """Whether a ``serve`` run asks for a feature only the classic schedulers model."""
    branches = data.get("branches")
    return bool(
        data.get("disaggregate")
        or data.get("draft_model")
        or data.get("triforce_kv_budget")
        or (isinstance(branches, int) and branches > 1)
        or data.get("preemption") == "swap"
    )


def engine_inputs(options: Any) -> dict[str, Any]:
    """The options a run took from its engine's defaults, resolved (for ``config.json``)."""
    names = ("scheduler", "max_batch_size", "block_size", "chunk_size")
    return {n: getattr(options, n) for n in names if hasattr(options, n)}
