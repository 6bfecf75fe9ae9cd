"""Time tensor- and pipeline-parallel training steps of a Llama-style decoder on several GPUs.

    torchrun --nproc_per_node N -m calibrate.steps.par_step --out DIR --tp T --pp P [--cp C]
        [--models llama3.2-1b-like,...] [--shapes 1x4096,2x4096] [--microbatches M]
        [--warmup 3] [--steps 8] [--trace-dir DIR] [--check] [--tiny] [--device cuda|cpu]

``N = T * P`` ranks, no data parallelism; rank ``r`` is TP rank ``r % T`` of pipeline stage
``r // T`` (TP groups are neighbouring GPUs). The step is ``calibrate.steps.train_step``'s
bf16-mixed recipe (fp32 parameters, forward under ``torch.autocast(bf16)``, fused AdamW,
``zero_grad(set_to_none=True)``, eager, no recompute, SDPA attention), so the rows can be
read against the single-GPU steps of the same models:

- **TP** (``T > 1``): Megatron-LM's tensor parallelism with sequence parallelism, written
  out by hand (Shoeybi et al. 2019; Korthikanti et al. 2022). Activations between the
  blocks are ``[s / T, b, h]`` (sequence-first, as Megatron), the residual stream fp32 as in
  the single-GPU model. Each block: RMSNorm on the sequence shard, its output cast to bf16,
  one column-parallel GEMM (fused Q|K|V, fused gate|up) whose input is all-gathered along
  the sequence (Megatron's ``LinearWithGradAccumulationAndAsyncCommunication``: only the
  shard is saved; the backward all-gathers it again, overlapped with the input-gradient
  GEMM, and reduce-scatters the input gradient, overlapped with the weight-gradient GEMM),
  then the local heads / FFN columns, a row-parallel GEMM and a reduce-scatter back to the
  sequence shard. The embedding is vocab-parallel (each rank's rows, partial sums
  reduce-scattered in fp32), the LM head column-parallel over the vocabulary, and the loss
  Megatron's vocab-parallel cross-entropy (three all-reduces of one fp32 per token; the
  fp32 logits become the saved softmax in place). The norm weights' gradients, computed
  on sequence shards, are all-reduced over the TP group before the optimizer step. V is
  copied out of the fused QKV output so that output is freed after RoPE, as with
  separate projections.
- **PP** (``P > 1``): 1F1B over ``P`` stages of an even layer split (the embedding on the
  first stage, final norm and LM head on the last), ``--microbatches`` micro-batches of
  ``--shapes`` each, written out as Megatron-LM's ``forward_backward_pipelining_without_
  interleaving`` (``batch_isend_irecv`` pairs, outputs freed once sent;
  ``torch.distributed.pipelining``'s own handshake differs between torch versions); with
  ``T = 1`` the stages hold ``train_step``'s own blocks, with ``T > 1`` the TP blocks
  above (TP x PP, the activation sent is each TP rank's sequence shard).
- **CP** (``--cp C``, alone): PyTorch's own context parallelism
  (``torch.distributed.tensor.experimental.context_parallel``, as torchtitan uses it):
  tokens, targets and the RoPE tables sharded along the sequence with its causal load
  balancing, SDPA run as ring attention (``--cp-rotate alltoall``: K/V passed around the
  ring; ``allgather``: gathered), train_step's blocks wrapped in DistributedDataParallel
  over the CP ranks (gradients all-reduced; buffers not broadcast). Grouped K/V heads are
  repeated before SDPA (the ring kernels take equal head counts). CUDA only: the CPU SDPA
  kernel is not one context parallelism dispatches.

Per (model, micro-batch shape) rank 0 writes one row to ``par_step.tpT.ppP.csv``: every
rank's median step time over ``--steps`` steps after ``--warmup`` (CUDA events around the
step, optimizer included), the maximum over ranks as ``step_ms``; every rank's
``max_memory_allocated`` / ``max_memory_reserved`` over the timed steps and the bytes still
allocated after ``zero_grad`` (weights and optimizer state) and, without a pipeline, at
the loss of the last timed step (weights, optimizer state, saved activations, logits),
with their maxima. With
``--trace-dir``, rank 0's profiler trace of one step, trimmed (``calibrate/steps/
tracing.py``). ``--check`` first runs tiny fp32 models through the same code and compares
loss and every gradient with the single-process model of ``train_step`` (the result goes
to the meta JSON and each row's ``check_max_rel_error``; above 1e-4 it is a failure, printed,
and the rows are still measured). Imports only the standard library, torch and
this package's step helpers (runs on a bare GPU machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
import warnings
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from calibrate.bench import common as C
from calibrate.steps import Arch, Marks, RowWriter, base_meta, free_memory, median, tracing
from calibrate.steps.par_model import (
    Layout,
    Stage,
    load_tp_from_full,
    tp_grads_as_full,
)
from calibrate.steps.train_step import (
    MODELS,
    TINY_MODELS,
    arch_fields,
    build_model,
    make_optimizer,
    parse_shapes,
)

COLUMNS = (
    "mode",
    "world_size",
    "tp",
    "pp",
    "cp",
    "cp_rotate",
    "sp",
    "microbatches",
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
    "global_batch",
    "params",
    "step_ms",
    "step_ms_rank0",
    "rank_step_ms",
    "fwd_ms",
    "bwd_ms",
    "optim_ms",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "rank_peak_allocated_bytes",
    "rank_peak_reserved_bytes",
    "rank_end_allocated_bytes",
    "rank_after_forward_allocated_bytes",
    "tokens_per_s_per_gpu",
    "sdpa_backend",
    "gqa_mode",
    "steps_timed",
    "loss",
    "check_max_rel_error",
    "status",
    "error",
    "trace",
)

# --------------------------------------------------------------------------- steps


class Runner:
    """One configuration's step on this rank: ``step(marks)`` runs forward, backward and
    the optimizer; ``marks`` gets phase marks (fwd / bwd / optim without a pipeline,
    fwd+bwd / optim with one)."""

    def __init__(self, stage: Stage, tokens, targets, m: int, device_type: str, amp: bool):
        self.stage, self.tokens, self.targets, self.m = stage, tokens, targets, m
        self.device_type, self.amp = device_type, amp
        self.opt, _ = make_optimizer(stage.module)
        self.last_loss = None
        self.after_forward_bytes = math.nan  # allocated at the loss (no pipeline)

    def _amp(self):
        import torch

        if not self.amp:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=torch.bfloat16)

    def step(self, marks: Marks, optimizer: bool = True):
        from torch.profiler import record_function

        st = self.stage
        marks.mark()
        if st.lay.pp == 1:
            with record_function("forward"), self._amp():
                loss = st.loss_fn(st.module(self.tokens), self.targets)
            self.after_forward_bytes = _allocated()
            marks.mark()
            with record_function("backward"):
                loss.backward()
            self.last_loss = loss.detach()
        else:
            with record_function("forward_backward"):
                losses = self.one_f_one_b()
            if losses:
                self.last_loss = sum(losses)
        marks.mark()
        if optimizer:
            with record_function("optimizer"):
                st.sync_replicated_grads()
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            marks.mark()

    # ----------------------------------------------------------------- 1F1B

    def _act_shape(self, mb: int) -> tuple[int, ...]:
        """Shape of the activation between stages: [s / tp, b, h] under TP (sequence
        shard, sequence-first), else train_step's [b, s, h]."""
        a, tp, s = self.stage.arch, self.stage.lay.tp, self.tokens.shape[1]
        return (s // tp, mb, a.hidden) if tp > 1 else (mb, s, a.hidden)

    def _p2p(self, sends, recvs):
        """Send and receive together (``batch_isend_irecv``: one NCCL group, so a pair of
        stages exchanging both ways cannot deadlock) and wait for both."""
        import torch.distributed as dist

        ops = [dist.P2POp(dist.isend, t, peer) for t, peer in sends]
        ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()

    def one_f_one_b(self) -> list:
        """PipeDream-Flush 1F1B as Megatron-LM's ``forward_backward_pipelining_without_
        interleaving`` runs it (Narayanan et al. 2021 sec. 2.2): ``p - rank - 1`` warm-up
        forwards, then one forward and one backward in turn, then the remaining
        backwards; activations in fp32 (the residual stream under autocast), the loss of
        each micro-batch divided by ``m``. A stage's output, once sent, is freed down to
        its autograd node (Megatron's ``deallocate_output_tensor``); its backward runs
        from that node with the received gradient. Returns the last stage's losses."""
        import collections

        import torch

        st, lay, m = self.stage, self.stage.lay, self.m
        first, last = lay.first, lay.last
        prev, nxt = lay.rank - lay.tp, lay.rank + lay.tp
        mb = self.tokens.shape[0] // m
        toks, tgts = self.tokens.split(mb), self.targets.split(mb)
        shape = self._act_shape(mb)
        dev = self.tokens.device

        def buf():
            return torch.empty(shape, dtype=torch.float32, device=dev)

        ins: collections.deque = collections.deque()
        outs: collections.deque = collections.deque()
        losses: list = []

        def forward(i, x):
            with self._amp():
                y = st.module(toks[i] if first else x)
                if last:
                    loss = st.loss_fn(y, tgts[i]) / m
                    losses.append(loss.detach())
                    y = loss
            ins.append(x)
            outs.append(y)
            return y

        def release(y):
            # Megatron's deallocate_output_tensor: the next stage has it; the backward
            # needs only its autograd node
            y.data = torch.empty((1,), device=y.device, dtype=y.dtype)

        def backward(g):
            x, y = ins.popleft(), outs.popleft()
            if g is None:
                y.backward()
            else:  # the output's storage is released: skip autograd's shape check
                torch.autograd.Variable._execution_engine.run_backward(
                    (y,), (g,), False, False, (), True, True
                )
            return None if x is None else x.grad

        def recv_x():
            x = buf()
            self._p2p([], [(x, prev)])
            return x.requires_grad_()

        warm = min(lay.pp - lay.pp_rank - 1, m)
        rest = m - warm
        for i in range(warm):
            y = forward(i, None if first else recv_x())
            self._p2p([(y, nxt)], [])
            release(y)
        x = None if first or rest == 0 else recv_x()
        for j in range(rest):
            y = forward(warm + j, x)
            g = None
            if not last:
                g = buf()
                self._p2p([(y, nxt)], [(g, nxt)])
                release(y)
            gx = backward(g)
            if first:
                continue
            if j == rest - 1:
                self._p2p([(gx, prev)], [])
            else:
                x = buf()
                self._p2p([(gx, prev)], [(x, prev)])
                x.requires_grad_()
        for _ in range(warm):
            g = buf()
            self._p2p([], [(g, nxt)])
            gx = backward(g)
            if not first:
                self._p2p([(gx, prev)], [])
        return losses


def _allocated() -> float:
    """Bytes the caching allocator hands out now (host-side counter: no synchronize)."""
    import torch

    return float(torch.cuda.memory_allocated()) if torch.cuda.is_initialized() else math.nan


def make_data(arch: Arch, rows: int, seq: int, device: str, seed: int):
    """Random token ids, the same on every rank: (tokens, targets), each [rows, seq]."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    data = torch.randint(0, arch.vocab, (rows, seq + 1), device=device, generator=gen)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def gather_floats(values: list[float], device: str) -> list[list[float]]:
    """Every rank's ``values`` (same length everywhere), on every rank."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [x.tolist() for x in out]


def measure(
    runner: Runner, args, cuda: bool, device: str, trace: Path | None, extra: dict, cp_ctx=None
):
    """Warm-up, timed steps, peaks, then (``trace`` given) a profiler trace of one step
    written by rank 0 while the others run the same steps; numbers of every rank.
    ``trace`` must be given on every rank or on none. ``cp_ctx``: the context parallelism
    context the steps run in (it shards the inputs on entry and restores them on exit)."""
    with cp_ctx if cp_ctx is not None else contextlib.nullcontext():
        return _measure(runner, args, cuda, device, trace, extra)


def _measure(runner: Runner, args, cuda: bool, device: str, trace: Path | None, extra: dict):
    import torch
    import torch.distributed as dist

    for _ in range(args.warmup):
        runner.step(Marks(cuda))
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    runs = []
    for _ in range(args.steps):
        m = Marks(cuda)
        runner.step(m)
        runs.append(m)
    parts = [m.intervals_ms() for m in runs]  # synchronizes
    alloc = float(torch.cuda.max_memory_allocated()) if cuda else math.nan
    reserved = float(torch.cuda.max_memory_reserved()) if cuda else math.nan
    end = float(torch.cuda.memory_allocated()) if cuda else math.nan
    step = median([sum(p) for p in parts])
    fb = [median([p[i] for p in parts]) for i in range(len(parts[0]))]
    loss = float(runner.last_loss) if runner.last_loss is not None else math.nan
    after_fwd = runner.after_forward_bytes
    everyone = gather_floats([step, alloc, reserved, end, loss, after_fwd], device)
    if trace is not None:  # after the timed steps; every rank runs the same steps
        if dist.get_rank() == 0:
            tracing.capture(lambda: runner.step(Marks(cuda)), trace, steps=1, cuda=cuda,
                            extra=extra)  # fmt: skip
        else:
            for _ in range(2):  # capture's profiler warm-up step and the traced step
                runner.step(Marks(cuda))
                if cuda:
                    torch.cuda.synchronize()
    dist.barrier()
    col = list(zip(*everyone, strict=True))
    losses = [x for x in col[4] if math.isfinite(x)]
    out = {
        "step_ms": max(col[0]),
        "step_ms_rank0": col[0][0],
        "rank_step_ms": ";".join(f"{x:.3f}" for x in col[0]),
        "optim_ms": fb[-1],
        "peak_allocated_bytes": max(col[1]),
        "peak_reserved_bytes": max(col[2]),
        "rank_peak_allocated_bytes": ";".join(f"{x:.0f}" for x in col[1]),
        "rank_peak_reserved_bytes": ";".join(f"{x:.0f}" for x in col[2]),
        "rank_end_allocated_bytes": ";".join(f"{x:.0f}" for x in col[3]),
        "rank_after_forward_allocated_bytes": ";".join(f"{x:.0f}" for x in col[5]),
        "steps_timed": args.steps,
        "loss": losses[0] if losses else math.nan,
    }
    if len(fb) == 3:
        out["fwd_ms"], out["bwd_ms"] = fb[0], fb[1]
    return out


# --------------------------------------------------------------------------- check


def _unwrap(module):
    """The model inside DistributedDataParallel (or the model)."""
    return getattr(module, "module", module)


def cp_wrap(stage: Stage, mesh, tokens, targets):
    """Wrap the stage's model for context parallelism: DistributedDataParallel over the CP
    ranks (gradient all-reduce; the sharded RoPE tables are not broadcast), and the
    ``context_parallel`` context that shards tokens, targets and the RoPE tables along
    the sequence (returned, to be entered around the steps)."""
    import torch
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = stage.module
    ids = [torch.cuda.current_device()] if tokens.is_cuda else None
    stage.module = DDP(model, device_ids=ids, broadcast_buffers=False)
    return context_parallel(
        mesh, buffers=[tokens, targets, model.cos, model.sin], buffer_seq_dims=[1, 1, 0, 0]
    )


def check(lay: Layout, device: str, seed: int, cp=None) -> dict[str, Any]:
    """Loss and gradients of the parallel code against train_step's single-process model,
    in fp32 on tiny models: the largest relative difference per tensor must stay under
    1e-4 (every rank checks its own tensors; the worst is returned on every rank).
    ``cp``: (mesh, size, rotate) for context parallelism (gradients only: each rank's loss
    is its shard's)."""
    import torch

    cuda = device == "cuda"
    worst, worst_name = 0.0, ""
    for name, arch in TINY_MODELS.items():
        if arch.heads % lay.tp or arch.kv_heads % lay.tp or arch.vocab % lay.tp:
            continue
        m = max(lay.pp, 2) if lay.pp > 1 else 1
        # CP: 64-token chunks (the fp32 check runs the memory-efficient kernel, whose
        # log-sum-exp rows are padded to 32; ring attention merges them per chunk)
        seq = 64 * 2 * cp[1] if cp else 8 * lay.tp
        torch.manual_seed(seed)
        ref = build_model(arch, device, "native", seq)
        tokens, targets = make_data(arch, 2 * m, seq, device, seed)
        loss_ref = torch.nn.functional.cross_entropy(ref(tokens).flatten(0, 1), targets.flatten())
        loss_ref.backward()
        ref_grads = {n: p.grad for n, p in ref.named_parameters()}
        stage = Stage(arch, lay, device, seq, torch.float32)
        if lay.tp > 1:
            load_tp_from_full(stage.parts, ref, arch, lay, stage.lo)
        else:
            with torch.no_grad():
                ours = dict(stage.module.named_parameters())
                for n, p in ref.named_parameters():
                    if n.startswith("blocks."):
                        i = int(n.split(".")[1])
                        if not stage.lo <= i < stage.hi:
                            continue
                        n = f"blocks.{i - stage.lo}." + n.split(".", 2)[2]
                    if n in ours:
                        ours[n].copy_(p)
        cp_ctx = None
        if cp:
            set_gqa_mode(stage, "repeat")  # fp32 ring kernels (efficient) take equal heads
            cp_ctx = cp_wrap(stage, cp[0], tokens, targets)
        runner = Runner(stage, tokens, targets, m, "cuda" if cuda else "cpu", amp=False)
        with cp_ctx if cp_ctx is not None else contextlib.nullcontext():
            runner.step(Marks(cuda), optimizer=False)
        if lay.tp > 1:
            stage.sync_replicated_grads()
            got = tp_grads_as_full(stage.parts, arch, lay, stage.lo)
        else:
            got = {}
            for n, p in _unwrap(stage.module).named_parameters():
                if n.startswith("blocks."):
                    i = int(n.split(".")[1]) + stage.lo
                    n = f"blocks.{i}." + n.split(".", 2)[2]
                got[n] = ("full", p.grad)
        for n, (how, g) in got.items():
            r = ref_grads[n]
            if how == "rows":
                k = g.shape[0]
                r = r[lay.tp_rank * k : (lay.tp_rank + 1) * k]
            elif how == "cols":
                k = g.shape[1]
                r = r[:, lay.tp_rank * k : (lay.tp_rank + 1) * k]
            err = float((g - r).norm() / r.norm().clamp_min(1e-30))
            if err > worst:
                worst, worst_name = err, f"{name}:{n}"
        if runner.last_loss is not None and not cp:
            err = abs(float(runner.last_loss) - float(loss_ref)) / abs(float(loss_ref))
            if err > worst:
                worst, worst_name = err, f"{name}:loss"
    all_worst = gather_floats([worst], device)
    i = max(range(len(all_worst)), key=lambda j: all_worst[j][0])
    where = worst_name if i == torch.distributed.get_rank() else ""
    return {
        "max_rel_error": all_worst[i][0],
        "rank": i,
        "where": where,
        "ok": all_worst[i][0] < 1e-4,
    }


# --------------------------------------------------------------------------- driver


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="torchrun ... -m calibrate.steps.par_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (with SP)")
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages (1F1B)")
    ap.add_argument("--cp", type=int, default=1,
                    help="context-parallel ranks (alone; PyTorch's context_parallel)")  # fmt: skip
    ap.add_argument("--cp-rotate", default="alltoall", choices=("alltoall", "allgather"),
                    help="how ring attention moves K/V (alltoall: around the ring)")  # fmt: skip
    ap.add_argument("--models", default="", help="comma list of model names")
    ap.add_argument("--shapes", default="", help="comma list of micro-batch BATCHxSEQ")
    ap.add_argument("--microbatches", type=int, default=0,
                    help="micro-batches per step (default: 8 with a pipeline, else 1)")  # fmt: skip
    ap.add_argument("--tiny", action="store_true", help="tiny models and shapes (CPU tests)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true",
                    help="first check loss and gradients against one process")  # fmt: skip
    ap.add_argument("--trace-dir", default="", help="rank 0's trimmed trace of each config")
    ap.add_argument("--trace-first-only", action="store_true",
                    help="trace only each model's first shape (keeps the data small)")  # fmt: skip
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="start no new config after this many seconds")  # fmt: skip
    ap.add_argument("--device-kind", default="", help="lent machine kind, for the metadata")
    args = ap.parse_args(argv)
    if args.tp < 1 or args.pp < 1 or args.cp < 1:
        ap.error("--tp, --pp and --cp must be >= 1")
    if args.cp > 1 and (args.tp > 1 or args.pp > 1):
        ap.error("--cp runs alone (--tp 1 --pp 1)")
    if args.cp > 1 and args.device != "cuda":
        ap.error("--cp needs --device cuda (context parallelism runs the CUDA SDPA kernels)")
    if args.microbatches == 0:
        args.microbatches = 8 if args.pp > 1 else 1
    if args.pp == 1 and args.microbatches != 1:
        ap.error("--microbatches needs --pp > 1 (no gradient accumulation without a pipeline)")
    if args.pp > 1 and args.microbatches < args.pp:
        ap.error(f"--microbatches {args.microbatches} < --pp {args.pp}: 1F1B needs m >= p")
    return args


def mode_name(tp: int, pp: int, cp: int = 1) -> str:
    if cp > 1:
        return "cp"
    return "tp" if pp == 1 else "pp" if tp == 1 else "tp-pp"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if world != args.tp * args.pp * args.cp:
        n = args.tp * args.pp * args.cp
        raise SystemExit(f"WORLD_SIZE={world} but --tp {args.tp} x --pp {args.pp} x --cp "
                         f"{args.cp} = {n}; start that many ranks")  # fmt: skip
    if cuda:
        torch.cuda.set_device(local)
    # a rank that fails (e.g. out of memory) leaves the others in a collective: a short
    # timeout ends the job instead of waiting NCCL's default 10 minutes
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=180))
    device = "cuda" if cuda else "cpu"
    # one collective of every rank first: NCCL's communicator then spans the whole job
    # before any pair of stages starts sending (batch_isend_irecv's documented contract)
    dist.all_reduce(torch.zeros(1, device=device))
    lay = Layout(args.tp, args.pp, rank % (args.tp * args.pp))  # CP ranks: one stage each
    cp = None
    if args.cp > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method(args.cp_rotate)
        cp = (init_device_mesh(device, (args.cp,)), args.cp, args.cp_rotate)
    table = TINY_MODELS if args.tiny else MODELS
    names = [n.strip() for n in args.models.split(",") if n.strip()] or [next(iter(table))]
    bad = [n for n in names if n not in table]
    if bad:
        raise SystemExit(f"--models: unknown {', '.join(bad)}; allowed: {', '.join(table)}")
    shapes = parse_shapes(args.shapes) if args.shapes else (
        ((1, 16 * args.tp * args.cp),) if args.tiny else ((1, 4096),))  # fmt: skip
    ctx = C.make_context("tiny" if args.tiny else "full", device, "events", args.seed)
    out = Path(args.out)
    tag = f"tp{args.tp}.pp{args.pp}" + (f".cp{args.cp}-{args.cp_rotate}" if cp else "")
    meta_path = out / f"par_step.{tag}.meta.json"
    sink = None
    meta: dict[str, Any] = {}
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        sink = RowWriter(out / f"par_step.{tag}.csv", COLUMNS)
        meta = base_meta(ctx, args, "calibrate.steps.par_step")
        meta["environment"]["world_size"] = world
        meta["environment"]["nccl_env"] = {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("NCCL_", "TORCH_SYMM", "TORCH_NCCL"))
        }
        meta["method"] = {"tp": args.tp, "pp": args.pp, "cp": args.cp,
                          "cp_rotate": args.cp_rotate if cp else None,
                          "microbatches": args.microbatches, "doc": __doc__}  # fmt: skip
        meta["models"] = {n: {**asdict(table[n]), "params": table[n].params()} for n in names}
        C.write_json_atomic(meta_path, meta)
    t0 = time.monotonic()
    checked = math.nan
    if args.check:
        res = check(lay, device, args.seed, cp)
        checked = res["max_rel_error"]
        if rank == 0:
            meta["check"] = res
            C.write_json_atomic(meta_path, meta)
            word = "ok" if res["ok"] else "FAILED (the rows are kept; see check_max_rel_error)"
            print(f"[par_step] {tag} check {word} {json.dumps(res)}", flush=True)
        free_memory(cuda)
    deadline = t0 + (args.time_budget_s if args.time_budget_s is not None else math.inf)
    trace_dir = Path(args.trace_dir) if args.trace_dir else None
    not_run: list[str] = []
    for name in names:
        arch = table[name]
        for j, (b, s) in enumerate(shapes):
            label = f"{name} {b}x{s}"
            row: dict[str, Any] = {
                "mode": mode_name(args.tp, args.pp, args.cp), "world_size": world,
                "tp": args.tp, "pp": args.pp, "cp": args.cp,
                "cp_rotate": args.cp_rotate if cp else "", "sp": args.tp > 1,
                "microbatches": args.microbatches,
                **arch_fields(name, arch), "batch": b, "seq_len": s,
                "check_max_rel_error": checked,
                "global_batch": b * args.microbatches, "params": arch.params(),
            }  # fmt: skip
            go = time.monotonic() <= deadline
            go = bool(gather_floats([1.0 if go else 0.0], device)[0][0])  # rank 0 decides
            if not go:
                not_run.append(label)
                continue
            if args.tp > 1 and (arch.heads % args.tp or arch.kv_heads % args.tp
                                or arch.vocab % args.tp or s % args.tp):  # fmt: skip
                row.update(status="skipped", error="tp does not divide heads/kv_heads/vocab/seq")
            elif s % (2 * args.cp):
                row.update(status="skipped", error="causal load balancing needs 2*cp | seq")
            else:
                trace = None
                if trace_dir is not None and not (args.trace_first_only and j):
                    fname = tracing.trace_name(name, tag, f"{b}x{s}")
                    trace = trace_dir / fname
                    row["trace"] = fname
                try:
                    torch.manual_seed(args.seed + lay.tp_rank)
                    stage = Stage(arch, lay, device, s, torch.bfloat16)
                    if cp:  # the ring kernels take equal head counts
                        mode = "mha" if arch.kv_heads == arch.heads else "repeat"
                        s_rank = s // args.cp
                        native = sdpa_backend(arch, 1, b, s_rank, device, mode == "mha")
                        row["gqa_mode"], row["sdpa_backend"] = mode, native
                    else:
                        row["gqa_mode"], row["sdpa_backend"] = resolve_gqa(
                            arch, args.tp, b, s, device
                        )
                    set_gqa_mode(stage, row["gqa_mode"])
                    tokens, targets = make_data(arch, b * args.microbatches, s, device, args.seed)
                    cp_ctx = cp_wrap(stage, cp[0], tokens, targets) if cp else None
                    runner = Runner(stage, tokens, targets, args.microbatches, device, amp=True)
                    extra = {"batch": b, "seq_len": s, "tp": args.tp, "pp": args.pp,
                             "microbatches": args.microbatches, "arch": asdict(arch)}  # fmt: skip
                    row.update(measure(runner, args, cuda, device, trace, extra, cp_ctx))
                    extra["cp"] = args.cp
                    row["tokens_per_s_per_gpu"] = (
                        b * args.microbatches * s / world / (row["step_ms"] / 1e3)
                    )
                    row["status"] = "ok"
                except Exception as exc:  # recorded; the job ends if a rank is left behind
                    row["status"], row["error"] = C.classify(exc)
                    print(f"[par_step] rank {rank} {label}: {row['error'][:300]}", flush=True)
                runner = stage = cp_ctx = None
                free_memory(cuda)
            if sink is not None:
                sink.write(row)
                print(_line(tag, row), flush=True)
    if rank == 0:
        meta.update(not_run=not_run, elapsed_s=round(time.monotonic() - t0, 1),
                    clocks_after=C.clocks_snapshot(ctx))  # fmt: skip
        C.write_json_atomic(meta_path, meta)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def sdpa_backend(arch: Arch, tp: int, b: int, s: int, device: str, native: bool) -> str:
    """The backend SDPA's dispatch picks for one rank's attention call, with the strides
    the step passes (sequence-first views under TP, train_step's otherwise); ``native``:
    grouped K/V heads passed as they are (``enable_gqa``), else repeated first."""
    import torch

    from calibrate.steps import sdpa_choice

    nq, d = arch.heads // tp, arch.head_dim
    nkv = arch.kv_heads // tp if native else nq

    def qkv(n):
        kw = {"device": device, "dtype": torch.bfloat16}
        if tp > 1:
            return torch.empty(s, b, n, d, **kw).permute(1, 2, 0, 3).requires_grad_()
        return torch.empty(b, s, n, d, **kw).transpose(1, 2).requires_grad_()

    return sdpa_choice(qkv(nq), qkv(nkv), qkv(nkv), is_causal=True, enable_gqa=nq != nkv)


def resolve_gqa(arch: Arch, tp: int, b: int, s: int, device: str) -> tuple[str, str]:
    """(gqa_mode, SDPA backend) as train_step's ``--gqa auto``: grouped K/V heads go to
    SDPA as they are unless that would send it to the unfused math kernel on a GPU."""
    if arch.kv_heads == arch.heads:
        return "mha", sdpa_backend(arch, tp, b, s, device, True)
    native = sdpa_backend(arch, tp, b, s, device, True)
    if device == "cuda" and native in ("MATH", "ERROR"):
        return "repeat", sdpa_backend(arch, tp, b, s, device, False)
    return "native", native


def set_gqa_mode(stage: Stage, mode: str) -> None:
    """How every attention layer of the stage passes grouped K/V heads (read per call)."""
    mode = "native" if mode == "mha" else mode
    for blk in _unwrap(stage.module).blocks:
        if hasattr(blk, "gqa_mode"):
            blk.gqa_mode = mode
        else:
            blk.attn.gqa_mode = mode


def _line(tag: str, row: dict[str, Any]) -> str:
    base = f"[par_step] {tag} {row['model']} {row['batch']}x{row['seq_len']} {row['status']}"
    if row["status"] != "ok":
        return f"{base} {str(row.get('error', ''))[:160]}"
    return (f"{base} step={row['step_ms']:.1f}ms (rank0 {row['step_ms_rank0']:.1f}) "
            f"peak={row['peak_allocated_bytes'] / 2**30:.2f}GiB "
            f"ranks={row['rank_peak_allocated_bytes']}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
