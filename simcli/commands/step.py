"""``simcli step``: latency of one serving-engine iteration (prefill, decode or mixed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer

from costmodels.steps.serving import ENGINES, StepError, StepModel
from costmodels.steps.serving_memory import GIB
from simcli.errors import user_errors
from simcli.output import Format, emit_object

app = typer.Typer(
    help="Latency of one prefill, decode or mixed (chunked-prefill) engine iteration."
)

PHASES = ("prefill", "decode", "mixed")


def _positive(value: int | None, flag: str) -> int | None:
    if value is not None and value < 1:
        raise StepError(f"{flag} must be a positive integer, got {value}")
    return value


def _batch(
    phase: str,
    batch: int,
    prompt_len: int | None,
    context_len: int | None,
    chunk: int | None,
    past: int,
    prefills: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prefill_new, prefill_past, decode_ctx) of the step the flags describe."""
    if phase not in PHASES:
        raise StepError(f"unknown --phase {phase!r}; allowed: {', '.join(PHASES)}")
    for value, flag in ((batch, "--batch"), (prefills, "--prefills")):
        _positive(value, flag)
    _positive(prompt_len, "--prompt-len")
    _positive(chunk, "--chunk")
    if context_len is not None and context_len < 0:
        raise StepError(f"--context-len must be >= 0, got {context_len}")
    if past < 0:
        raise StepError(f"--past must be >= 0, got {past}")
    none = np.zeros(0, np.int64)
    pre_new = pre_past = none
    dec = none
    if phase in ("prefill", "mixed"):
        if prompt_len is None and chunk is None:
            raise StepError(f"--phase {phase} needs --prompt-len (and optionally --chunk)")
        new = chunk if chunk is not None else prompt_len - past  # type: ignore[operator]
        if new < 1 or (prompt_len is not None and past + new > prompt_len):
            raise StepError(
                f"--past {past} + --chunk {new} exceeds --prompt-len {prompt_len}; allowed: "
                "past + chunk <= prompt-len"
            )
        seqs = batch if phase == "prefill" else prefills
        pre_new, pre_past = np.full(seqs, new, np.int64), np.full(seqs, past, np.int64)
    if phase in ("decode", "mixed"):
        if context_len is None:
            raise StepError(f"--phase {phase} needs --context-len (cached tokens per sequence)")
        dec = np.full(batch, context_len, np.int64)
    elif context_len is not None:
        raise StepError("--context-len is for --phase decode|mixed; prefill takes --prompt-len")
    return pre_new, pre_past, dec


@app.callback(invoke_without_command=True)
def step(
    model: str = typer.Option(..., "--model", help="Built-in model id or config.json."),
    gpu: str = typer.Option(..., "--gpu", help="GPU id (see `simcli specs list`)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree."),
    phase: str = typer.Option(..., "--phase", help="prefill | decode | mixed"),
    batch: int = typer.Option(
        1, "--batch", help="prefill: prompts; decode and mixed: decoding sequences"
    ),
    prompt_len: int | None = typer.Option(
        None, "--prompt-len", help="prefill/mixed: prompt tokens per sequence"
    ),
    context_len: int | None = typer.Option(
        None, "--context-len", help="decode/mixed: tokens already cached per decoding sequence"
    ),
    chunk: int | None = typer.Option(
        None, "--chunk", help="prefill/mixed: new tokens per prefill chunk (default: the rest)"
    ),
    past: int = typer.Option(
        0, "--past", help="prefill/mixed: prompt tokens already cached (earlier chunks)"
    ),
    prefills: int = typer.Option(1, "--prefills", help="mixed: prefill chunks in the batch"),
    engine: str = typer.Option("vllm", "--engine", help="vllm | pytorch-eager"),
    attn_backend: str | None = typer.Option(
        None, "--attn-backend", help="flash | cudnn | flex | efficient (default per engine)"
    ),
    gpu_memory_utilization: float = typer.Option(
        0.9, "--gpu-memory-utilization", help="share of GPU memory the engine may use"
    ),
    block_size: int = typer.Option(16, "--block-size", help="KV-cache block, tokens"),
    profile: Path | None = typer.Option(None, "--profile", help="Calibration profile."),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Step time, tokens/s and a per-op breakdown of one engine iteration on one replica."""
    with user_errors():
        if engine not in ENGINES:
            raise StepError(f"unknown --engine {engine!r}; allowed: {', '.join(ENGINES)}")
        args = _batch(phase, batch, prompt_len, context_len, chunk, past, prefills)
        sm = StepModel(
            model, gpu, tp=tp, pp=pp, engine=engine, attn_backend=attn_backend, profile=profile
        )
        capacity = sm.kv_capacity_tokens(block_size, gpu_memory_utilization)
        step_s = sm.step_s(*args)
        tokens = int(args[0].sum()) + int(args[2].size)
        out = {
            "model": sm.model.id,
            "gpu": gpu,
            "engine": engine,
            "cost_model": sm.label,
            "attn_backend": sm.attn_backend,
            "tp": tp,
            "pp": pp,
            "num_gpus": tp * pp,
            "phase": phase,
            "batch": batch,
            "prompt_len": prompt_len,
            "context_len": context_len,
            "prefill_seqs": int(args[0].size),
            "prefill_new_tokens": int(args[0].sum()),
            "decode_seqs": int(args[2].size),
            "tokens": tokens,
            "step_ms": 1e3 * step_s,
            "tokens_per_s": tokens / step_s,
            "stage_ms": 1e3 * sm.stage_s(*args),
            "kv_bytes_per_token": sm.kv_bytes_per_token,
            "kv_capacity_tokens": capacity,
            "kv_cache_gib": capacity * sm.kv_bytes_per_token / GIB,
            "breakdown_ms": {k: 1e3 * v for k, v in sm.breakdown(*args).items()},
        }
        emit_object(out, fmt, title=f"{sm.model.id} {phase} step on {tp * pp} x {gpu} ({engine})")
