"""Time whole training steps of Llama-style decoders on one GPU, in plain eager PyTorch.

    python3 -m calibrate.steps.train_step --out DIR [--tiny] [--models a,b]
        [--shapes 1x2048,4x2048] [--warmup 3] [--steps 6] [--time-budget-s S]
        [--device auto|cuda|cpu] [--gqa auto|native|repeat] [--seed 0]
        [--modes eager,compile,fp8] [--recompute none,full] [--trace-dir DIR]

The model: token embedding, N blocks of (RMSNorm, attention with RoPE and grouped
KV heads through ``F.scaled_dot_product_attention(is_causal=True)`` with PyTorch's
default backend choice, RMSNorm, SwiGLU MLP), final RMSNorm, untied LM head,
cross-entropy over the full vocabulary. The step is the common "bf16 mixed precision"
recipe: fp32 parameters (the master weights), forward under
``torch.autocast(dtype=bfloat16)``, backward, ``AdamW(fused=True).step()``,
``zero_grad(set_to_none=True)``. Random token ids. By default eager with no activation
recompute; ``--modes eager,compile,fp8`` and ``--recompute none,full`` add the compiled,
torchao-float8 and recomputed variants, and ``--trace-dir DIR`` keeps a trimmed profiler
trace of each config (``calibrate/steps/tracing.py``).

Each (model, micro-batch, sequence length) gives one row of ``train_step.csv``: the
median step time over ``--steps`` steps after ``--warmup`` steps (CUDA events around
each step), the median forward / backward / optimizer parts of those steps (events
between the phases), and the peak memory of the timed steps (``max_memory_allocated``
and ``max_memory_reserved`` after ``reset_peak_memory_stats``). A config that does not
fit is recorded with status ``oom`` and the run goes on. ``train_step.meta.json``
holds the GPU, driver, torch/CUDA/cuDNN versions and clocks before and after.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from calibrate.bench import common as C
from calibrate.steps import (
    Arch,
    Marks,
    RowWriter,
    add_common_args,
    base_meta,
    free_memory,
    median,
    peaks,
    reset_peak,
    rope_table,
    run_guarded,
    sdpa_choice,
    tracing,
)

COLUMNS = (
    "model",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn",
    "vocab",
    "batch",
    "seq_len",
    "params",
    "step_ms",
    "fwd_ms",
    "bwd_ms",
    "optim_ms",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "tokens_per_s",
    "sdpa_backend",
    "gqa_mode",
    "steps_timed",
    "loss",
    "status",
    "error",
    "mode",
    "recompute",
    "trace",
)


# Shapes of public models (config.json of each), chosen so that fp32 weights + grads +
# AdamW state (16 bytes/param) leave room for activations on an 80 GB card.
MODELS: dict[str, Arch] = {
    # meta-llama/Llama-3.2-1B (which ties embeddings; untied here): ~1.50e9 params
    "llama3.2-1b-like": Arch(16, 2048, 32, 8, 8192, 128256),
    # meta-llama/Llama-3.2-3B shapes (untied): ~3.6e9 params, ~58 GB of static state
    "llama3.2-3b-like": Arch(28, 3072, 24, 8, 8192, 128256),
    # a small Llama-2-style model with full multi-head attention: ~1.3e9 params
    "llama2-small-mha": Arch(24, 2048, 16, 16, 5504, 32000, rope_theta=10000.0),
    # Qwen/Qwen2.5-1.5B shapes (untied; no QKV bias here): GQA 12/2, head_dim 128,
    # a 151,936-token vocabulary: ~1.78e9 params. Held out of every fit.
    "qwen2.5-1.5b-like": Arch(28, 1536, 12, 2, 8960, 151936, rope_theta=1e6),
    # meta-llama/Llama-2-7b-hf shapes: ~6.7e9 params, 108 GB of static state: a 141 GB H200
    # only (an 80 GB card records it as oom). Held out of every fit.
    "llama2-7b-like": Arch(32, 4096, 32, 32, 11008, 32000, rope_theta=10000.0),
}
SHAPES: tuple[tuple[int, int], ...] = ((1, 2048), (4, 2048), (2, 4096), (1, 8192))

TINY_MODELS: dict[str, Arch] = {
    "tiny-gqa": Arch(2, 64, 4, 2, 128, 256),
    "tiny-mha": Arch(2, 64, 4, 4, 96, 128, rope_theta=10000.0),
}
TINY_SHAPES: tuple[tuple[int, int], ...] = ((1, 32), (2, 16))


# --------------------------------------------------------------------------- model


def build_model(arch: Arch, device: str, gqa_mode: str, max_seq: int):
    """A Llama-style decoder (fp32 parameters) on ``device``."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.eps = arch.norm_eps
            self.weight = nn.Parameter(torch.ones(dim, device=device))

        def forward(self, x):
            xf = x.float()
            return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            h, d = arch.hidden, arch.head_dim
            self.q = nn.Linear(h, arch.heads * d, bias=False, device=device)
            self.k = nn.Linear(h, arch.kv_heads * d, bias=False, device=device)
            self.v = nn.Linear(h, arch.kv_heads * d, bias=False, device=device)
            self.o = nn.Linear(arch.heads * d, h, bias=False, device=device)
            self.gqa_mode = gqa_mode  # native | repeat (see resolve_gqa)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            d = arch.head_dim
            q = self.q(x).view(b, s, arch.heads, d).transpose(1, 2)
            k = self.k(x).view(b, s, arch.kv_heads, d).transpose(1, 2)
            v = self.v(x).view(b, s, arch.kv_heads, d).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            grouped = arch.kv_heads != arch.heads
            if grouped and self.gqa_mode == "repeat":
                rep = arch.heads // arch.kv_heads
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=grouped and self.gqa_mode == "native"
            )
            return self.o(o.transpose(1, 2).reshape(b, s, arch.heads * d))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            h, f = arch.hidden, arch.ffn
            self.gate = nn.Linear(h, f, bias=False, device=device)
            self.up = nn.Linear(h, f, bias=False, device=device)
            self.down = nn.Linear(f, h, bias=False, device=device)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = RMSNorm(arch.hidden)
            self.attn = Attention()
            self.mlp_norm = RMSNorm(arch.hidden)
            self.mlp = MLP()

        def forward(self, x, cos, sin):
            x = x + self.attn(self.attn_norm(x), cos, sin)
            return x + self.mlp(self.mlp_norm(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(arch.vocab, arch.hidden, device=device)
            self.blocks = nn.ModuleList(Block() for _ in range(arch.layers))
            self.norm = RMSNorm(arch.hidden)
            self.lm_head = nn.Linear(arch.hidden, arch.vocab, bias=False, device=device)
            cos, sin = rope_table(arch, max_seq, device)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        recompute = False  # full activation recompute: each block re-run in backward

        def forward(self, tokens):
            s = tokens.shape[1]
            cos, sin = self.cos[:s], self.sin[:s]
            x = self.embed(tokens)
            for blk in self.blocks:
                if self.recompute and torch.is_grad_enabled():
                    x = checkpoint(blk, x, cos, sin, use_reentrant=False)
                else:
                    x = blk(x, cos, sin)
            return self.lm_head(self.norm(x))

    from torch.utils.checkpoint import checkpoint

    return Decoder()


MODES = ("eager", "compile", "fp8")


def prepare(model, mode: str):
    """Make ``model`` run in ``mode`` (in place); parameters stay the same tensors.

    - ``eager``: as built.
    - ``compile``: each transformer block ``torch.compile``d (``dynamic=False``), as
      torchtitan does: identical blocks share one compiled graph, so compiling costs
      seconds, not minutes; embedding, final norm, LM head and loss stay eager.
    - ``fp8``: torchao float8 training (tensorwise scaling, the default recipe) on every
      ``nn.Linear`` but the LM head, as torchtitan does, then the blocks compiled; the
      casts, amax reductions and transposes are what the trace is for."""
    import torch

    if mode == "fp8":
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    if mode in ("compile", "fp8"):
        # All blocks of all models share Block.forward's code object, so dynamo's
        # recompile limit (8 graphs) would silently send later models back to eager.
        torch._dynamo.reset()
        for i, blk in enumerate(model.blocks):
            model.blocks[i] = torch.compile(blk, dynamic=False)
    return model


def make_optimizer(model) -> tuple[Any, str]:
    import torch

    try:
        return torch.optim.AdamW(
            model.parameters(), lr=1e-4, weight_decay=0.1, fused=True
        ), "adamw-fused"
    except (RuntimeError, ValueError) as exc:  # fused AdamW needs a supported device
        print(f"fused AdamW unavailable ({exc}); using foreach", flush=True)
        return torch.optim.AdamW(
            model.parameters(), lr=1e-4, weight_decay=0.1, foreach=True
        ), "adamw-foreach"


# --------------------------------------------------------------------------- step


def train_step(model, opt, tokens, targets, device_type: str, marks: Marks):
    """One optimizer step; marks before forward, after the loss, after backward, after
    the optimizer step and zero_grad. Returns the loss (not synchronized).

    The phases are also ``record_function`` ranges (``forward``, ``backward``,
    ``optimizer``), so a profiler trace of the step names them (free when not tracing)."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import record_function

    marks.mark()
    with record_function("forward"), torch.autocast(device_type=device_type, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
    marks.mark()
    with record_function("backward"):
        loss.backward()
    marks.mark()
    with record_function("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    marks.mark()
    return loss.detach()


def resolve_gqa(mode: str, arch: Arch, device: str, batch: int, seq: int) -> tuple[str, str]:
    """(gqa_mode, backend SDPA's default dispatch picks) for one attention call.

    ``auto`` passes the grouped KV heads to SDPA (``enable_gqa``) unless that would
    send it to the unfused math kernel on a GPU; then KV heads are repeated first."""
    import torch

    dtype = torch.bfloat16
    d = arch.head_dim
    q = torch.empty(batch, arch.heads, seq, d, device=device, dtype=dtype, requires_grad=True)

    def probe(kv_heads: int, gqa: bool) -> str:
        k = torch.empty(batch, kv_heads, seq, d, device=device, dtype=dtype, requires_grad=True)
        return sdpa_choice(q, k, k, is_causal=True, enable_gqa=gqa)

    if arch.kv_heads == arch.heads:
        return "mha", probe(arch.heads, False)
    if mode == "repeat":
        return "repeat", probe(arch.heads, False)
    native = probe(arch.kv_heads, True)
    if mode == "auto" and device.startswith("cuda") and native in ("MATH", "ERROR"):
        return "repeat", probe(arch.heads, False)
    return "native", native


def measure(
    model, opt, arch: Arch, batch: int, seq: int, args, ctx: C.Context, trace: Path | None = None
) -> dict:
    import torch

    C.maybe_inject_failure("train_step")
    cuda = ctx.is_cuda
    gen = torch.Generator(device=ctx.device).manual_seed(args.seed)
    data = torch.randint(0, arch.vocab, (batch, seq + 1), device=ctx.device, generator=gen)
    tokens, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    dev_type = "cuda" if cuda else "cpu"
    for _ in range(args.warmup):
        train_step(model, opt, tokens, targets, dev_type, Marks(cuda))
    reset_peak(cuda)
    runs = []
    loss = None
    for _ in range(args.steps):
        m = Marks(cuda)
        loss = train_step(model, opt, tokens, targets, dev_type, m)
        runs.append(m)
    parts = [m.intervals_ms() for m in runs]  # synchronizes
    alloc, reserved = peaks(cuda)
    if trace is not None:  # after the timed steps: profiling never touches their times
        tracing.capture(
            lambda: train_step(model, opt, tokens, targets, dev_type, Marks(cuda)),
            trace,
            steps=args.trace_steps,
            cuda=cuda,
            extra={"batch": batch, "seq_len": seq, "arch": asdict(arch)},
        )
    step_ms = median([sum(p) for p in parts])
    loss_v = float(loss) if loss is not None else math.nan
    if not math.isfinite(loss_v):
        raise RuntimeError(f"non-finite loss {loss_v}")
    return {
        "step_ms": step_ms,
        "fwd_ms": median([p[0] for p in parts]),
        "bwd_ms": median([p[1] for p in parts]),
        "optim_ms": median([p[2] for p in parts]),
        "peak_allocated_bytes": alloc,
        "peak_reserved_bytes": reserved,
        "tokens_per_s": batch * seq / (step_ms / 1e3),
        "steps_timed": args.steps,
        "loss": loss_v,
    }


# --------------------------------------------------------------------------- driver


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            b, s = (int(x) for x in part.split("x"))
        except ValueError:
            raise SystemExit(
                f"--shapes: {part!r} is not BATCHxSEQ (e.g. 4x2048); "
                "give a comma list such as 1x2048,4x2048"
            ) from None
        if b < 1 or s < 2:
            raise SystemExit(f"--shapes: {part!r} needs batch >= 1 and seq >= 2")
        out.append((b, s))
    return tuple(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python3 -m calibrate.steps.train_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--tiny", action="store_true", help="tiny models and shapes (CPU tests)")
    ap.add_argument("--models", default="", help="comma list of model names (default: all)")
    ap.add_argument("--shapes", default="", help="comma list of BATCHxSEQ (default: built-in)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps (default 6)")
    ap.add_argument(
        "--modes", default="eager", help=f"comma list of {', '.join(MODES)} (default eager)"
    )
    ap.add_argument("--recompute", default="none", help="comma list of none, full (default none)")
    add_common_args(ap)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.recompute_list = [r.strip() for r in args.recompute.split(",") if r.strip()]
    if not args.mode_list or set(args.mode_list) - set(MODES):
        ap.error(f"--modes {args.modes!r}: allowed {', '.join(MODES)} (comma list)")
    if not args.recompute_list or set(args.recompute_list) - {"none", "full"}:
        ap.error(f"--recompute {args.recompute!r}: allowed none, full (comma list)")
    return args


def plan(args) -> list[tuple[str, Arch, tuple[tuple[int, int], ...]]]:
    table = TINY_MODELS if args.tiny else MODELS
    names = [n.strip() for n in args.models.split(",") if n.strip()] or list(table)
    bad = [n for n in names if n not in table]
    if bad:
        raise SystemExit(f"--models: unknown {', '.join(bad)}; allowed: {', '.join(table)}")
    shapes = parse_shapes(args.shapes) if args.shapes else TINY_SHAPES if args.tiny else SHAPES
    return [(n, table[n], shapes) for n in names]


def arch_fields(name: str, arch: Arch) -> dict[str, Any]:
    return {
        "model": name,
        "layers": arch.layers,
        "hidden": arch.hidden,
        "heads": arch.heads,
        "kv_heads": arch.kv_heads,
        "head_dim": arch.head_dim,
        "ffn": arch.ffn,
        "vocab": arch.vocab,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configs = plan(args)
    if args.list:
        for name, arch, shapes in configs:
            print(f"{name}: {asdict(arch)} params={arch.params():,} shapes={list(shapes)}")
        return 0
    # SDPA explains every backend it rejects with a UserWarning; the rows say which ran.
    warnings.filterwarnings("ignore", category=UserWarning)
    import torch

    mode = "tiny" if args.tiny else "full"
    ctx = C.make_context(mode, args.device, "events", args.seed)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "train_step.meta.json"
    meta = base_meta(ctx, args, "calibrate.steps.train_step")
    meta["method"] = {
        "precision": "fp32 parameters (master weights), forward under torch.autocast bf16",
        "optimizer": "torch.optim.AdamW(lr=1e-4, weight_decay=0.1, fused=True)",
        "step": "forward + cross-entropy, backward, optimizer.step, zero_grad(set_to_none)",
        "execution": "one GPU; column mode: eager, compile (torch.compile(dynamic=False)) or "
        "fp8 (torchao convert_to_float8_training, tensorwise, every Linear but the LM head, "
        "then compiled); column recompute: none or full (torch.utils.checkpoint per block, "
        "use_reentrant=False)",
        "trace": "column trace: a trimmed torch.profiler trace of --trace-steps steps taken "
        "after the timed steps (calibrate/steps/tracing.py)",
        "attention": "F.scaled_dot_product_attention(is_causal=True), default backend "
        "choice (column sdpa_backend: what torch._fused_sdp_choice returned)",
        "timing": f"median of {args.steps} steps after {args.warmup} warm-up steps, CUDA "
        "events around each step and between its phases (wall clock on CPU)",
        "memory": "peak over the timed steps, after reset_peak_memory_stats",
        "data": "random token ids, one batch reused",
    }
    meta["models"] = {n: {**asdict(a), "params": a.params()} for n, a, _ in configs}
    meta["runs"] = []
    C.write_json_atomic(meta_path, meta)
    sink = RowWriter(out / "train_step.csv", COLUMNS)
    print(
        f"device={ctx.device} gpu={ctx.gpu_name or '-'} torch={torch.__version__} "
        f"mode={mode} out={out}",
        flush=True,
    )

    t0 = time.monotonic()
    deadline = t0 + (args.time_budget_s if args.time_budget_s is not None else math.inf)
    not_run: list[str] = []
    fatal = ""
    trace_dir = Path(args.trace_dir) if args.trace_dir else None
    for name, arch, shapes in configs:
        for mode in args.mode_list:
            for recompute in args.recompute_list:
                group = (name, arch, shapes, mode, recompute)
                fatal = _run_group(
                    group, args, ctx, sink, meta, deadline, not_run, trace_dir, fatal
                )
                C.write_json_atomic(meta_path, meta)
    meta.update(
        counts=sink.counts(),
        not_run=not_run,
        fatal=fatal or None,
        elapsed_s=round(time.monotonic() - t0, 1),
        clocks_after=C.clocks_snapshot(ctx),
    )
    C.write_json_atomic(meta_path, meta)
    print(f"[train_step] {sink.counts()} not_run={len(not_run)} -> {sink.path}", flush=True)
    return 3 if fatal else 0


def _run_group(group, args, ctx, sink, meta, deadline, not_run, trace_dir, fatal) -> str:
    """Build one (model, mode, recompute) and measure its shapes; the first fatal error."""
    name, arch, shapes, mode, recompute = group
    label = f"{name} {mode}" + (" recompute" if recompute == "full" else "")
    if fatal or time.monotonic() > deadline:
        not_run += [f"{label} {b}x{s}" for b, s in shapes]
        return fatal
    record: dict[str, Any] = {
        "model": name,
        "mode": mode,
        "recompute": recompute,
        "clocks_before": C.clocks_snapshot(ctx),
    }
    model = run_model = opt = None
    build_error = None
    try:
        tb = time.monotonic()
        model = build_model(arch, ctx.device, "native", max(s for _, s in shapes))
        model.recompute = recompute == "full"
        run_model = prepare(model, mode)
        opt, opt_name = make_optimizer(model)
        record.update(
            build_s=round(time.monotonic() - tb, 2),
            params=sum(p.numel() for p in model.parameters()),
            optimizer=opt_name,
        )
    except Exception as exc:
        build_error = C.classify(exc)
        record["build_error"] = build_error[1]
    for b, s in shapes:
        if fatal or time.monotonic() > deadline:
            not_run.append(f"{label} {b}x{s}")
            continue
        row: dict[str, Any] = {
            **arch_fields(name, arch),
            "batch": b,
            "seq_len": s,
            "params": record.get("params", arch.params()),
            "mode": mode,
            "recompute": recompute,
        }
        if build_error is not None:
            row["status"], row["error"] = build_error[0], "model build: " + build_error[1]
            sink.write(row)
            continue
        trace = None
        if trace_dir is not None:
            fname = tracing.trace_name(name, mode, recompute, f"{b}x{s}")
            trace, row["trace"] = trace_dir / fname, fname

        def one(b=b, s=s, row=row, trace=trace, m=model, run=run_model, o=opt) -> dict[str, Any]:
            gqa_mode, backend = resolve_gqa(args.gqa, arch, ctx.device, b, s)
            row.update(gqa_mode=gqa_mode, sdpa_backend=backend)
            set_gqa_mode(m, gqa_mode)
            return measure(run, o, arch, b, s, args, ctx, trace)

        fatal = run_guarded(row, one, ctx) or fatal
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        free_memory(ctx.is_cuda)
        sink.write(row)
        print(_line(row), flush=True)
    del model, run_model, opt
    free_memory(ctx.is_cuda)
    record["clocks_after"] = C.clocks_snapshot(ctx)
    meta["runs"].append(record)
    return fatal


def set_gqa_mode(model, mode: str) -> None:
    """Set how every attention layer passes grouped KV heads (read at call time)."""
    for blk in model.blocks:
        getattr(blk, "_orig_mod", blk).attn.gqa_mode = mode


def _line(row: dict[str, Any]) -> str:
    tag = f"{row.get('mode', 'eager')}{'+rc' if row.get('recompute') == 'full' else ''}"
    base = f"[train_step] {row['model']} {tag} b={row['batch']} s={row['seq_len']} {row['status']}"
    if row["status"] != "ok":
        return f"{base} {row.get('error', '')[:120]}"
    return (
        f"{base} step={row['step_ms']:.1f}ms fwd={row['fwd_ms']:.1f} bwd={row['bwd_ms']:.1f} "
        f"opt={row['optim_ms']:.1f} tok/s={row['tokens_per_s']:.0f} "
        f"peak={(row['peak_allocated_bytes'] or 0) / 2**30:.1f}GiB sdpa={row['sdpa_backend']}"
    )


if __name__ == "__main__":
    sys.exit(main())
