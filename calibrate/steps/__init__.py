"""Whole-step measurements: a training step and serving steps of real models, in plain
PyTorch, to validate simcli's step simulators end to end (not to fit op models).

    python3 -m calibrate.steps.train_step --out DIR [--tiny] [--time-budget-s S]
    python3 -m calibrate.steps.serve_step --out DIR [--tiny] [--time-budget-s S]

Like ``calibrate.run``, these run on the device machine, where this project is not
installed: they import only the standard library, torch and ``calibrate.bench.common``
(itself stdlib-only at import). This module holds what the two scripts share; it
imports torch lazily so that ``--help`` works without it.
"""

from __future__ import annotations

import csv
import gc
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.bench import common as C

# Statuses a row may carry: the runner's four plus 'skipped' (known not to fit or over
# the token cap, so not attempted).
STATUSES = (*C.STATUSES, "skipped")


class RowWriter:
    """The CSV rewritten whole (temp file, then rename) after every row: an interrupted
    run leaves a complete CSV of the rows measured so far, never a half-written one."""

    def __init__(self, path: Path, columns: Sequence[str]):
        self.path = Path(path)
        self.columns = list(columns)
        self.rows: list[dict[str, str]] = []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._flush()

    def write(self, row: dict[str, Any]) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise KeyError(f"row has columns the CSV does not: {sorted(unknown)}")
        self.rows.append({c: C.fmt(row.get(c)) for c in self.columns})
        self._flush()

    def _flush(self) -> None:
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns)
            w.writeheader()
            w.writerows(self.rows)
        os.replace(tmp, self.path)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


class Marks:
    """Time marks within a step: CUDA events on a GPU (read after one synchronize),
    the wall clock on the CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            import torch

            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        """Milliseconds between consecutive marks (synchronizes on a GPU)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:], strict=False)]


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def sdpa_choice(q, k, v, *, is_causal: bool, enable_gqa: bool) -> str:
    """The SDPA backend PyTorch's default dispatch picks for these inputs (the same
    function ``F.scaled_dot_product_attention`` consults), e.g. FLASH_ATTENTION."""
    try:
        import torch
        from torch.nn.attention import SDPBackend

        i = torch._fused_sdp_choice(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)
        return SDPBackend(int(i)).name
    except Exception as exc:  # private API: record why rather than fail the run
        return f"unknown ({type(exc).__name__})"


def free_memory(cuda: bool) -> None:
    gc.collect()
    if cuda:
        import torch

        torch.cuda.empty_cache()


def reset_peak(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peaks(cuda: bool) -> tuple[int | None, int | None]:
    if not cuda:
        return None, None
    import torch

    return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())


def base_meta(ctx: C.Context, args: Any, script: str) -> dict[str, Any]:
    """Environment (GPU, driver, torch, CUDA, cuDNN, versions), clocks, arguments."""
    import torch

    env = C.environment(ctx, getattr(args, "device_kind", ""))
    for k in ("warmup_ms", "rep_ms", "timer", "timing_method"):
        env.pop(k, None)  # the op runner's timing settings; these scripts time otherwise
    env["torch_git_version"] = getattr(torch.version, "git_version", None)
    env["cudnn_enabled"] = bool(torch.backends.cudnn.enabled)
    env["pytorch_cuda_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return {
        "script": script,
        "args": {k: v for k, v in vars(args).items()},
        "environment": env,
        "clocks_before": C.clocks_snapshot(ctx),
    }


def stopped_for_budget(deadline: float) -> bool:
    return time.monotonic() > deadline


def add_common_args(ap) -> None:
    """Options both step scripts take: budget, device, GQA mode, seed, labels, --list."""
    ap.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="start no new config after this many seconds (the CSV stays complete)",
    )
    ap.add_argument("--device", default="auto", help="auto | cuda | cpu")
    ap.add_argument(
        "--gqa",
        default="auto",
        choices=("auto", "native", "repeat"),
        help="grouped KV heads: SDPA enable_gqa (native), repeated first, or auto",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device-kind", default="", help="label stored in the meta JSON")
    ap.add_argument("--list", action="store_true", help="print the planned configs; run none")
    ap.add_argument(
        "--trace-dir",
        default="",
        help="also write a trimmed torch.profiler trace of each config there (after timing)",
    )
    ap.add_argument("--trace-steps", type=int, default=2, help="steps per trace (default 2)")


class _NoSkip(Exception):
    """Never raised: the default for ``run_guarded(skip=...)``."""


def run_guarded(row: dict[str, Any], fn, ctx, skip: type[Exception] = _NoSkip) -> str | None:
    """Run one config into ``row`` (status ok, skipped, or the classified failure).

    Returns an error message when the device can no longer be used (a sticky CUDA error,
    or one that surfaces at the next synchronize), so the caller stops starting configs.
    """
    failure = None
    try:
        row.update(fn())
        row["status"] = "ok"
    except KeyboardInterrupt:
        raise
    except skip as exc:
        row["status"], row["error"] = "skipped", str(exc)
    except Exception as exc:
        row["status"], row["error"] = C.classify(exc)
        failure = exc
    if failure is None:
        return None
    if C.is_sticky(failure):
        return row["error"]
    try:
        C.synchronize(ctx)
    except Exception as exc2:
        return C.classify(exc2)[1]
    return None


@dataclass(frozen=True)
class Arch:
    """A Llama-style decoder's shape (both step scripts build models from it)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int = 0  # 0: hidden // heads
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    def kv_bytes_per_token(self, elem_bytes: int = 2) -> int:
        """K and V of every layer for one token: 2*32*8*128*2 = 131072 B for Llama-3-8B."""
        return 2 * self.layers * self.kv_heads * self.head_dim * elem_bytes

    def params(self) -> int:
        """Weights of the untied model: attention, SwiGLU MLP, two norms per layer, embedding,
        LM head and the final norm."""
        h, d = self.hidden, self.head_dim
        per_layer = (
            h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h + 3 * h * self.ffn + 2 * h
        )
        return self.layers * per_layer + 2 * self.vocab * h + h


def rope_table(arch: Arch, n: int, device: str):
    """cos, sin of shape [n, head_dim] (fp32), rotate-half convention."""
    import torch

    d = arch.head_dim
    inv = 1.0 / (arch.rope_theta ** (torch.arange(0, d, 2, device=device).float() / d))
    freqs = torch.outer(torch.arange(n, device=device).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
