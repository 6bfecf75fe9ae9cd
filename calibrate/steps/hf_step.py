"""Time Hugging Face transformers' own modeling code: whole training steps and prefills
of the architectures of 2024-25 (gpt-oss, Gemma 2/3, Phi-3/4, a Llama reference).

    python3 -m calibrate.steps.hf_step --configs examples/models --out DIR
        [--models gpt-oss-20b,gemma-2-9b] [--warmup 2] [--steps 5]
        [--time-budget-s S] [--trace-dir DIR] [--list]

Each model is built from its ``examples/models/<name>.config.json`` with random weights
(``AutoModelForCausalLM.from_config``; no checkpoint is downloaded), its layers cut to
``LAYERS[name]`` so that a training step fits one GPU (``layer_types`` cut alike, so
the sliding/full mix is the released one), the attention implementation left as
transformers defaults it for the model (``attn_impl`` records it). The training step is
the "bf16 mixed precision" recipe of :mod:`calibrate.steps.train_step`: fp32 parameters,
forward and loss (the model's own shifted cross-entropy over ``labels``) under
``torch.autocast(bfloat16)``, backward, ``AdamW(fused=True).step()``,
``zero_grad(set_to_none=True)``. The prefill is one forward without gradients, in bf16
parameters, ``use_cache=False``. Rows give the median step time after warm-up (CUDA
events), the forward/backward/optimizer parts, and the peak memory; ``--trace-dir`` keeps
a trimmed profiler trace of every measured config. Runs on the device machine: imports
the standard library, torch, transformers and ``calibrate.bench.common`` only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from calibrate.bench import common as C
from calibrate.steps import (
    Marks,
    RowWriter,
    base_meta,
    free_memory,
    median,
    peaks,
    reset_peak,
    run_guarded,
    tracing,
)

# layers kept per model (the released count where the training step fits one 141 GB H200)
LAYERS = {
    "qwen3-next-80b-a3b": 4,  # 3 Gated DeltaNet + 1 gated attention, 512-expert MoE
    "kimi-linear-48b-a3b": 4,  # 3 KDA + 1 MLA; the first layer dense
    "nemotron-h-8b": 26,  # the "M-M-M-M*-M-M-M-M-M*-M-M-M-" prefix: 12 Mamba-2, 2 attention
    "gpt-oss-20b": 4,
    "gemma-2-9b": 12,
    "gemma-3-27b": 12,
    "gemma-3-1b": 26,
    "phi-3-mini-4k": 32,
    "phi-4": 10,
    "llama-3.2-1b": 16,
}
# (phase, batch, tokens): training steps and prefills
SHAPES = (("train", 1, 2048), ("train", 1, 4096), ("prefill", 1, 2048), ("prefill", 1, 8192))
COLUMNS = (
    "model", "model_type", "phase", "layers", "layers_released", "batch", "seq_len",
    "attn_impl", "params", "status", "step_ms", "fwd_ms", "bwd_ms", "opt_ms", "steps",
    "peak_alloc_bytes", "peak_reserved_bytes", "trace", "error",
)  # fmt: skip


def cut_layers(cfg: dict[str, Any], layers: int) -> dict[str, Any]:
    """``cfg`` (a text model's config dict) with its first ``layers`` layers: every
    per-layer list cut alike (``layer_types``, ``mlp_layer_types``, Nemotron-H's
    ``hybrid_override_pattern``, Kimi-Linear's 1-based ``linear_attn_config`` lists), so
    the kinds of the kept layers are the released ones."""
    out = dict(cfg, num_hidden_layers=layers)
    for key in ("layer_types", "mlp_layer_types", "hybrid_override_pattern"):
        if isinstance(out.get(key), list | str):
            out[key] = out[key][:layers]
    lac = out.get("linear_attn_config")
    if isinstance(lac, dict):
        out["linear_attn_config"] = {
            k: [i for i in v if i <= layers] if k.endswith("_layers") else v
            for k, v in lac.items()
        }
    return out


def load_config(path: Path, layers: int) -> tuple[Any, dict[str, Any]]:
    """The transformers config of ``path`` with ``layers`` layers (and its layer_types)."""
    from transformers import AutoConfig

    raw = json.loads(path.read_text())
    raw.pop("quantization_config", None)  # gpt-oss ships MXFP4 experts; time bf16 ones
    cfg = dict(raw.get("text_config") or raw) if raw.get("model_type") == "gemma3" else raw
    model_type = cfg.pop("model_type")
    released = int(cfg.get("num_hidden_layers") or len(cfg["hybrid_override_pattern"]))
    cfg = cut_layers(cfg, min(layers, released))
    for key in ("architectures", "transformers_version", "torch_dtype", "_name_or_path"):
        cfg.pop(key, None)
    return AutoConfig.for_model(model_type, **cfg), {"model_type": model_type,
                                                      "layers_released": released}


def _train(model, batch: int, seq: int, steps: int, warmup: int, cuda: bool, vocab: int):
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)
    ids = torch.randint(0, vocab, (batch, seq), device="cuda" if cuda else "cpu")

    def step(marks: Marks | None = None):
        if marks:
            marks.mark()
        with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        if marks:
            marks.mark()
        loss.backward()
        if marks:
            marks.mark()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if marks:
            marks.mark()

    for _ in range(warmup):
        step()
    reset_peak(cuda)
    fwd, bwd, optm, tot = [], [], [], []
    for _ in range(steps):
        m = Marks(cuda)
        step(m)
        f, b, o = m.intervals_ms()
        fwd.append(f), bwd.append(b), optm.append(o), tot.append(f + b + o)
    alloc, reserved = peaks(cuda)
    return step, {"step_ms": median(tot), "fwd_ms": median(fwd), "bwd_ms": median(bwd),
                  "opt_ms": median(optm), "steps": steps, "peak_alloc_bytes": alloc,
                  "peak_reserved_bytes": reserved}  # fmt: skip


def _prefill(model, batch: int, seq: int, steps: int, warmup: int, cuda: bool, vocab: int):
    import torch

    ids = torch.randint(0, vocab, (batch, seq), device="cuda" if cuda else "cpu")

    @torch.no_grad()
    def step(marks: Marks | None = None):
        if marks:
            marks.mark()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        if marks:
            marks.mark()

    for _ in range(warmup):
        step()
    reset_peak(cuda)
    tot = []
    for _ in range(steps):
        m = Marks(cuda)
        step(m)
        tot.append(m.intervals_ms()[0])
    alloc, reserved = peaks(cuda)
    return step, {"step_ms": median(tot), "fwd_ms": median(tot), "steps": steps,
                  "peak_alloc_bytes": alloc, "peak_reserved_bytes": reserved}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="examples/models")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(LAYERS))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--time-budget-s", type=float, default=None)
    ap.add_argument("--trace-dir", default="")
    ap.add_argument("--device-kind", default="")
    ap.add_argument("--device", default="auto", help="auto | cuda | cpu")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--bypass-fla-640", action="store_true",
                    help="time GDN's backward on Hopper despite fla's Triton guard "
                    "(calibrate.bench.linear_mixers.bypass_fla_640; rows say so)")  # fmt: skip
    ap.add_argument("--shapes", default="",
                    help="PHASE:BATCH:SEQ,... instead of the default shapes; phase train, "
                    "train-bf16 (bf16 parameters: transformers' grouped_mm experts run "
                    "torch._grouped_mm, not a per-expert fp32 loop) or prefill")  # fmt: skip
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    shapes = SHAPES
    if args.shapes:
        parts = (x.split(":") for x in args.shapes.split(","))
        shapes = tuple((p, int(b), int(s)) for p, b, s in parts)
    plan = [(n, *s) for n in names for s in shapes]
    if args.list:
        for p in plan:
            print(*p)
        return 0
    import torch
    import transformers

    if args.bypass_fla_640:
        from calibrate.bench.linear_mixers import bypass_fla_640

        bypass_fla_640()
    ctx = C.make_context("full", args.device, "events", 0)
    cuda = ctx.is_cuda
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = base_meta(ctx, args, "calibrate.steps.hf_step")
    meta["transformers_version"] = transformers.__version__
    meta["fla_640_bypassed"] = bool(args.bypass_fla_640)
    writer = RowWriter(out / "hf_step.csv", COLUMNS)
    deadline = time.monotonic() + (args.time_budget_s or 1e9)
    dead = None
    built: dict[str, Any] = {}  # the model of the current (name, phase), reused by its shapes
    for name, phase, batch, seq in plan:
        row: dict[str, Any] = {"model": name, "phase": phase, "batch": batch, "seq_len": seq}
        if dead is not None or time.monotonic() > deadline:
            row["status"], row["error"] = "skipped", dead or "time budget"
            writer.write(row)
            continue

        def run(name=name, phase=phase, batch=batch, seq=seq, row=row):
            from transformers import AutoModelForCausalLM

            if built.get("key") != (name, phase):
                built.clear()
                free_memory(cuda)
                path = Path(args.configs) / f"{name}.config.json"
                cfg, info = load_config(path, LAYERS.get(name, 4))
                dtype = torch.float32 if phase == "train" else torch.bfloat16  # train-bf16
                torch.manual_seed(0)
                with torch.device("cuda" if cuda else "cpu"):
                    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
                model.train(phase.startswith("train"))
                built.update(key=(name, phase), model=model, cfg=cfg, info={
                    **info, "layers": cfg.num_hidden_layers,
                    "attn_impl": getattr(model.config, "_attn_implementation", None),
                    "params": sum(p.numel() for p in model.parameters())})  # fmt: skip
            row.update(built["info"])
            fn = _train if phase.startswith("train") else _prefill
            step, res = fn(built["model"], batch, seq, args.steps, args.warmup, cuda,
                           built["cfg"].vocab_size)  # fmt: skip
            if args.trace_dir:
                dst = Path(args.trace_dir) / tracing.trace_name(name, phase, batch, seq)
                dst.parent.mkdir(parents=True, exist_ok=True)
                tracing.capture(step, dst, steps=1, cuda=cuda, extra={"row": dict(row)})
                res["trace"] = dst.name
            return res

        dead = run_guarded(row, run, ctx)
        if row.get("status") != "ok":
            built.clear()
            free_memory(cuda)
        writer.write(row)
        print(name, phase, batch, seq, row.get("status"), row.get("step_ms"), flush=True)
    built.clear()
    meta["clocks_after"] = C.clocks_snapshot(ctx)
    meta["counts"] = writer.counts()
    (out / "hf_step.meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
