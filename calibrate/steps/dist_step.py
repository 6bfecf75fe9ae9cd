"""Time data-parallel training steps (DDP, FSDP) of a Llama-style decoder on several GPUs.

    torchrun --nproc_per_node N -m calibrate.steps.dist_step --out DIR --mode ddp|fsdp
        [--model llama3.2-1b-like] [--shapes 2x4096,1x8192] [--tiny] [--device cuda|cpu]

The model and step are those of ``calibrate.steps.train_step`` (fp32 parameters, forward
under autocast bf16, fused AdamW, eager), wrapped for data parallelism:

- ``ddp``: ``DistributedDataParallel`` with its default 25 MiB buckets, gradients
  all-reduced in fp32 while the backward runs (ZeRO-0 with overlapped grad reduction);
- ``fsdp``: ``FullyShardedDataParallel`` (FULL_SHARD, one unit per block, forward and
  backward prefetch), parameters gathered in bf16 and gradients reduce-scattered in fp32
  (``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)``): ZeRO-3.

Every rank runs the same per-rank batch; rank 0 writes one row per (mode, world size,
micro-batch, sequence) to ``dist_step.csv``: the median step time over ``--steps`` steps
after ``--warmup`` (CUDA events, each step ending with a barrier-free synchronize), the
median forward / backward / optimizer parts, and rank 0's peak memory. Imports only the
standard library, torch and this package's step helpers (runs on a bare GPU machine).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path
from typing import Any

from calibrate.bench import common as C
from calibrate.steps import RowWriter, base_meta, free_memory
from calibrate.steps.train_step import COLUMNS as TRAIN_COLUMNS
from calibrate.steps.train_step import (
    MODELS,
    TINY_MODELS,
    arch_fields,
    build_model,
    make_optimizer,
    parse_shapes,
)
from calibrate.steps.train_step import measure as train_measure

# train_step's columns with per-GPU throughput, without the per-call SDPA details, and
# the job's shape first
COLUMNS = (
    "mode",
    "world_size",
    *(
        "tokens_per_s_per_gpu" if c == "tokens_per_s" else c
        for c in TRAIN_COLUMNS
        if c not in ("sdpa_backend", "gqa_mode")
    ),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="torchrun ... -m calibrate.steps.dist_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--mode", required=True, choices=("ddp", "fsdp"))
    ap.add_argument("--model", default="", help="model name (default: llama3.2-1b-like)")
    ap.add_argument("--shapes", default="", help="comma list of BATCHxSEQ per rank")
    ap.add_argument("--tiny", action="store_true", help="tiny model and shapes (CPU tests)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device-kind", default="", help="lent machine kind, for the metadata")
    return ap.parse_args(argv)


def wrap(model, mode: str, device: str):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    if mode == "ddp":
        ids = [torch.cuda.current_device()] if device == "cuda" else None
        return DDP(model, device_ids=ids)
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    block = type(model.blocks[0])
    return FSDP(
        model,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        auto_wrap_policy=ModuleWrapPolicy({block}),
        mixed_precision=MixedPrecision(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.float32
        ),
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        forward_prefetch=True,
        device_id=torch.cuda.current_device() if device == "cuda" else None,
        use_orig_params=True,
    )


def measure(model, opt, arch, b: int, s: int, args, ctx: C.Context) -> dict[str, Any]:
    """train_step's measurement (same data, warm-up, events, peaks) on the wrapped model;
    every rank runs it, rank 0's numbers are written; throughput is per GPU."""
    row = train_measure(model, opt, arch, b, s, args, ctx)
    row["tokens_per_s_per_gpu"] = row.pop("tokens_per_s")
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    table = TINY_MODELS if args.tiny else MODELS
    name = args.model or next(iter(table))
    if name not in table:
        raise SystemExit(f"--model {name!r}; allowed: {', '.join(table)}")
    arch = table[name]
    shapes = parse_shapes(args.shapes) if args.shapes else ((1, 32),) if args.tiny else ((2, 4096),)
    ctx = C.make_context("tiny" if args.tiny else "full", args.device, "events", args.seed)
    out = Path(args.out)
    sink = None
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        sink = RowWriter(out / f"dist_step.{args.mode}.{world}gpu.csv", COLUMNS)
        meta = base_meta(ctx, args, "calibrate.steps.dist_step")
        meta["method"] = {"mode": args.mode, "world_size": world, "doc": __doc__}
        C.write_json_atomic(out / f"dist_step.{args.mode}.{world}gpu.meta.json", meta)
    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    model = wrap(build_model(arch, args.device, "native", max(s for _, s in shapes)),
                 args.mode, args.device)  # fmt: skip
    opt, _ = make_optimizer(model)
    for b, s in shapes:
        row: dict[str, Any] = {
            "mode": args.mode,
            "world_size": world,
            **arch_fields(name, arch),
            "batch": b,
            "seq_len": s,
            "params": arch.params(),
        }
        try:
            row.update(measure(model, opt, arch, b, s, args, ctx), status="ok")
        except Exception as exc:  # recorded, the run goes on
            row["status"], row["error"] = C.classify(exc)
        opt.zero_grad(set_to_none=True)
        free_memory(cuda)
        if sink is not None:
            sink.write(row)
            print(f"[dist_step] {args.mode} x{world} {b}x{s} {row['status']} "
                  f"{row.get('step_ms', '')} ms", flush=True)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"[dist_step] done in {time.monotonic() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
