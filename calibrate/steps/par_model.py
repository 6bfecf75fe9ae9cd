"""The models of ``calibrate.steps.par_step``: the ranks of a TP x PP job, Megatron-style
tensor-parallel layers with sequence parallelism written out in eager PyTorch, and the
pipeline stage one rank runs (train_step's own blocks without TP).

Imports only the standard library, torch (inside the functions) and this package's step
helpers, like the scripts that use it (runs on a bare GPU machine).
"""

from __future__ import annotations

from typing import Any

from calibrate.steps import Arch
from calibrate.steps.train_step import build_model

# --------------------------------------------------------------------------- layout


class Layout:
    """Ranks of a TP x PP job: TP innermost (neighbouring GPUs), then pipeline stages."""

    def __init__(self, tp: int, pp: int, rank: int):
        import torch.distributed as dist

        self.tp, self.pp, self.rank = tp, pp, rank
        self.tp_rank, self.pp_rank = rank % tp, rank // tp
        self.tp_group = self.pp_group = None
        # every rank creates every group, in the same order (new_group's contract)
        for s in range(pp):
            ranks = [s * tp + i for i in range(tp)]
            g = dist.new_group(ranks) if tp > 1 else None
            if s == self.pp_rank:
                self.tp_group = g
        for i in range(tp):
            ranks = [s * tp + i for s in range(pp)]
            g = dist.new_group(ranks) if pp > 1 else None
            if i == self.tp_rank:
                self.pp_group = g

    @property
    def first(self) -> bool:
        return self.pp_rank == 0

    @property
    def last(self) -> bool:
        return self.pp_rank == self.pp - 1


def stage_layers(layers: int, pp: int, stage: int) -> tuple[int, int]:
    """[lo, hi) of an even split; the remainder goes to the middle stages, as
    ``TrainPlan.layers_per_chunk`` places it."""
    base, extra = divmod(layers, pp)
    lo_x = pp // 2 - (extra + 1) // 2 if pp % 2 == 0 else (pp - 1) // 2 - extra // 2
    counts = [base + (1 if lo_x <= s < lo_x + extra else 0) for s in range(pp)]
    lo = sum(counts[:stage])
    return lo, lo + counts[stage]


# --------------------------------------------------------------------------- TP pieces


def tp_ops(group, tp: int):
    """Megatron's sequence-parallel communication as autograd functions over ``group``
    (sequence along dim 0)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    def gather(x, async_op=False):
        x = x.contiguous()
        out = x.new_empty((x.shape[0] * tp, *x.shape[1:]))
        h = dist.all_gather_into_tensor(out, x, group=group, async_op=async_op)
        return (out, h) if async_op else out

    def scatter(x, async_op=False):
        x = x.contiguous()
        out = x.new_empty((x.shape[0] // tp, *x.shape[1:]))
        h = dist.reduce_scatter_tensor(out, x, group=group, async_op=async_op)
        return (out, h) if async_op else out

    class GatherLinear(torch.autograd.Function):
        """Column-parallel GEMM of the all-gathered sequence shard ``x`` (saved as the
        shard): forward all-gather + GEMM; backward all-gather again (async) beside the
        input-gradient GEMM, reduce-scatter of that gradient (async) beside the
        weight-gradient GEMM (Megatron-LM ``LinearWithGradAccumulationAndAsyncCommunication``
        with ``sequence_parallel``)."""

        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return F.linear(gather(x), w)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            total, h = gather(x, async_op=True)
            g = g.contiguous()
            grad_total = g.matmul(w)
            h.wait()
            grad_x, h = scatter(grad_total, async_op=True)
            grad_w = g.reshape(-1, g.shape[-1]).t().matmul(total.reshape(-1, total.shape[-1]))
            h.wait()
            return grad_x, grad_w

    class ScatterSeq(torch.autograd.Function):
        """Row-parallel exit: reduce-scatter forward, all-gather backward."""

        @staticmethod
        def forward(ctx, x):
            return scatter(x)

        @staticmethod
        def backward(ctx, g):
            return gather(g)

    class VocabParallelCE(torch.autograd.Function):
        """Megatron-LM's ``_VocabParallelCrossEntropy``: per-token loss from logits split
        over the vocabulary; the fp32 copy of the logits becomes the saved softmax (in
        place), its gradient made from it in place in the backward."""

        @staticmethod
        def forward(ctx, logits, target, vocab_start):
            lf = logits.float() if logits.dtype != torch.float32 else logits.clone()
            vmax = lf.max(dim=-1).values
            dist.all_reduce(vmax, op=dist.ReduceOp.MAX, group=group)
            lf.sub_(vmax.unsqueeze(-1))
            n = lf.shape[-1]
            outside = (target < vocab_start) | (target >= vocab_start + n)
            idx = (target - vocab_start).masked_fill(outside, 0)
            flat = lf.view(-1, n)
            rows = torch.arange(flat.shape[0], device=lf.device)
            pred = flat[rows, idx.view(-1)].masked_fill(outside.view(-1), 0.0)
            dist.all_reduce(pred, group=group)
            lf.exp_()
            total = lf.sum(dim=-1)
            dist.all_reduce(total, group=group)
            loss = torch.log(total) - pred.view_as(total)
            lf.div_(total.unsqueeze(-1))
            ctx.save_for_backward(lf, outside, idx)
            return loss

        @staticmethod
        def backward(ctx, g):
            soft, outside, idx = ctx.saved_tensors
            n = soft.shape[-1]
            flat = soft.view(-1, n)
            rows = torch.arange(flat.shape[0], device=soft.device)
            flat[rows, idx.view(-1)] -= 1.0 - outside.view(-1).float()
            soft.mul_(g.unsqueeze(-1))
            return soft, None, None

    return GatherLinear, ScatterSeq, VocabParallelCE


def build_tp_parts(arch: Arch, lay: Layout, device: str, max_seq: int, cdt, lo: int, hi: int):
    """This rank's share of the TP model: (embedding or None, blocks lo..hi-1, head or
    None), each an nn.Module of fp32 parameters; ``cdt`` is the GEMM dtype (bf16; fp32 in
    ``--check``). Norm weights carry ``sequence_parallel = True`` (replicated, gradients
    all-reduced over the TP group)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from calibrate.steps import rope_table

    tp, r = lay.tp, lay.tp_rank
    GatherLinear, ScatterSeq, VocabCE = tp_ops(lay.tp_group, tp)
    d = arch.head_dim
    nq, nkv, f = arch.heads // tp, arch.kv_heads // tp, arch.ffn // tp
    vocab_local = arch.vocab // tp

    def param(*shape):
        return nn.Parameter(torch.empty(*shape, device=device))

    class RMSNorm(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.eps = arch.norm_eps
            self.weight = nn.Parameter(torch.ones(dim, device=device))
            self.weight.sequence_parallel = True

        def forward(self, x):
            xf = x.float()
            return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h = arch.hidden
            self.attn_norm = RMSNorm(h)
            self.qkv = param((nq + 2 * nkv) * d, h)
            self.o = param(h, nq * d)
            self.mlp_norm = RMSNorm(h)
            self.fc1 = param(2 * f, h)  # gate | up
            self.fc2 = param(h, f)
            for w in (self.qkv, self.o, self.fc1, self.fc2):
                nn.init.normal_(w, std=0.02)
            self.gqa_mode = "native"  # or "repeat" (K and V heads repeated), as train_step

        def forward(self, x, cos, sin):
            s = x.shape[0] * tp
            b = x.shape[1]
            xn = self.attn_norm(x).to(cdt)
            qkv = GatherLinear.apply(xn, self.qkv.to(cdt))
            q, k, v = qkv.split((nq * d, nkv * d, nkv * d), dim=-1)
            q = rope(q.view(s, b, nq, d), cos, sin).permute(1, 2, 0, 3)
            k = rope(k.view(s, b, nkv, d), cos, sin).permute(1, 2, 0, 3)
            v = v.contiguous().view(s, b, nkv, d).permute(1, 2, 0, 3)
            if nq != nkv and self.gqa_mode == "repeat":
                k, v = k.repeat_interleave(nq // nkv, 1), v.repeat_interleave(nq // nkv, 1)
            gqa = nq != nkv and self.gqa_mode == "native"
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            o = o.permute(2, 0, 1, 3).reshape(s, b, nq * d)
            x = x + ScatterSeq.apply(F.linear(o, self.o.to(cdt)))
            gate, up = GatherLinear.apply(self.mlp_norm(x).to(cdt), self.fc1.to(cdt)).chunk(2, -1)
            return x + ScatterSeq.apply(F.linear(F.silu(gate) * up, self.fc2.to(cdt)))

    class Embedding(nn.Module):
        """Vocab-parallel: this rank's rows; partial sums reduce-scattered (fp32)."""

        def __init__(self):
            super().__init__()
            self.weight = param(vocab_local, arch.hidden)
            nn.init.normal_(self.weight)
            self.start = r * vocab_local

        def forward(self, tokens):  # [b, s] -> [s / tp, b, h]
            t = tokens.t()
            outside = (t < self.start) | (t >= self.start + vocab_local)
            e = F.embedding((t - self.start).masked_fill(outside, 0), self.weight)
            e = e.masked_fill(outside.unsqueeze(-1), 0.0)
            return ScatterSeq.apply(e)

    class Head(nn.Module):
        """Final norm on the shard, column-parallel LM head over the vocabulary."""

        def __init__(self):
            super().__init__()
            self.norm = RMSNorm(arch.hidden)
            self.weight = param(vocab_local, arch.hidden)
            nn.init.normal_(self.weight, std=0.02)
            self.start = r * vocab_local

        def forward(self, x):  # -> logits [s, b, vocab / tp]
            return GatherLinear.apply(self.norm(x).to(cdt), self.weight.to(cdt))

        def loss(self, logits, targets):  # targets [b, s]
            return VocabCE.apply(logits, targets.t().contiguous(), self.start).mean()

    cos, sin = rope_table(arch, max_seq, device)
    cos, sin = cos[:, None, None, :], sin[:, None, None, :]  # [s, 1, 1, d]
    emb = Embedding() if lay.first else None
    head = Head() if lay.last else None
    blocks = nn.ModuleList(Block() for _ in range(lo, hi))
    return emb, blocks, head, (cos, sin)


def load_tp_from_full(parts, full, arch: Arch, lay: Layout, lo: int) -> None:
    """Copy the slices of the single-process model ``full`` (train_step.build_model) that
    this rank holds into ``parts`` (``--check``)."""
    import torch

    emb, blocks, head, _ = parts
    tp, r = lay.tp, lay.tp_rank
    d = arch.head_dim
    nq, nkv, f, v = arch.heads // tp, arch.kv_heads // tp, arch.ffn // tp, arch.vocab // tp

    def rows(w, n):
        return w[r * n : (r + 1) * n]

    with torch.no_grad():
        if emb is not None:
            emb.weight.copy_(rows(full.embed.weight, v))
        for i, blk in enumerate(blocks):
            ref = full.blocks[lo + i]
            a, m = ref.attn, ref.mlp
            blk.attn_norm.weight.copy_(ref.attn_norm.weight)
            blk.mlp_norm.weight.copy_(ref.mlp_norm.weight)
            qkv = (rows(a.q.weight, nq * d), rows(a.k.weight, nkv * d), rows(a.v.weight, nkv * d))
            blk.qkv.copy_(torch.cat(qkv))
            blk.o.copy_(a.o.weight[:, r * nq * d : (r + 1) * nq * d])
            blk.fc1.copy_(torch.cat((rows(m.gate.weight, f), rows(m.up.weight, f))))
            blk.fc2.copy_(m.down.weight[:, r * f : (r + 1) * f])
        if head is not None:
            head.norm.weight.copy_(full.norm.weight)
            head.weight.copy_(rows(full.lm_head.weight, v))


def tp_grads_as_full(parts, arch: Arch, lay: Layout, lo: int) -> dict[str, Any]:
    """This rank's gradients under the names and slices of the single-process model."""
    emb, blocks, head, _ = parts
    tp = lay.tp
    d = arch.head_dim
    nq, nkv, f = arch.heads // tp, arch.kv_heads // tp, arch.ffn // tp
    out: dict[str, Any] = {}
    if emb is not None:
        out["embed.weight"] = ("rows", emb.weight.grad)
    for i, blk in enumerate(blocks):
        p = f"blocks.{lo + i}."
        q, k, v = blk.qkv.grad.split((nq * d, nkv * d, nkv * d))
        gate, up = blk.fc1.grad.split((f, f))
        out.update({
            p + "attn_norm.weight": ("full", blk.attn_norm.weight.grad),
            p + "mlp_norm.weight": ("full", blk.mlp_norm.weight.grad),
            p + "attn.q.weight": ("rows", q), p + "attn.k.weight": ("rows", k),
            p + "attn.v.weight": ("rows", v), p + "attn.o.weight": ("cols", blk.o.grad),
            p + "mlp.gate.weight": ("rows", gate), p + "mlp.up.weight": ("rows", up),
            p + "mlp.down.weight": ("cols", blk.fc2.grad),
        })  # fmt: skip
    if head is not None:
        out["norm.weight"] = ("full", head.norm.weight.grad)
        out["lm_head.weight"] = ("rows", head.weight.grad)
    return out


# --------------------------------------------------------------------------- models


def plain_parts(arch: Arch, lay: Layout, device: str, max_seq: int):
    """The pieces of train_step's model that pipeline stage ``lay.pp_rank`` holds:
    (embedding or None, its blocks, final norm or None, LM head or None, cos, sin).
    The model is built on the meta device and only these pieces are materialised (fresh
    nn.Linear / nn.Embedding initialisation, norm weights 1), so no rank ever holds the
    whole model."""
    import torch

    from calibrate.steps import rope_table

    full = build_model(arch, "meta", "native", max_seq)
    lo, hi = stage_layers(arch.layers, lay.pp, lay.pp_rank)
    keep = [full.embed if lay.first else None, *full.blocks[lo:hi]]
    keep += [full.norm, full.lm_head] if lay.last else [None, None]
    for mod in (m for m in keep if m is not None):
        mod.to_empty(device=device)
        with torch.no_grad():
            for sub in mod.modules():
                if hasattr(sub, "reset_parameters"):
                    sub.reset_parameters()
                elif hasattr(sub, "eps"):  # RMSNorm
                    sub.weight.fill_(1.0)
    cos, sin = rope_table(arch, max_seq, device)
    return keep[0], keep[1:-2], keep[-2], keep[-1], cos, sin


class Stage:
    """Builds the module one rank runs (a pipeline stage, or the whole model when
    ``pp == 1``) and knows its loss."""

    def __init__(self, arch: Arch, lay: Layout, device: str, max_seq: int, cdt):
        from torch import nn

        self.arch, self.lay = arch, lay
        self.lo, self.hi = stage_layers(arch.layers, lay.pp, lay.pp_rank)
        lo, hi = self.lo, self.hi
        if lay.tp > 1:
            parts = build_tp_parts(arch, lay, device, max_seq, cdt, lo, hi)
            self.parts = parts
            emb, blocks, head, (cos, sin) = parts

            class TPStage(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.embed, self.blocks, self.head = emb, blocks, head
                    self.register_buffer("cos", cos, persistent=False)
                    self.register_buffer("sin", sin, persistent=False)

                def forward(self, x):
                    if self.embed is not None:
                        x = self.embed(x)
                    s = x.shape[0] * lay.tp
                    for blk in self.blocks:
                        x = blk(x, self.cos[:s], self.sin[:s])
                    return self.head(x) if self.head is not None else x

            self.module = TPStage()
            self.loss_fn = head.loss if head is not None else None
        else:
            import torch.nn.functional as F

            embed, blocks, norm, lm_head, cos, sin = plain_parts(arch, lay, device, max_seq)

            class PlainStage(nn.Module):
                """train_step's Decoder cut to layers [lo, hi) (its own blocks)."""

                def __init__(self):
                    super().__init__()
                    self.embed, self.blocks = embed, nn.ModuleList(blocks)
                    self.norm, self.lm_head = norm, lm_head
                    self.register_buffer("cos", cos, persistent=False)
                    self.register_buffer("sin", sin, persistent=False)

                def forward(self, x):
                    if self.embed is not None:
                        x = self.embed(x)
                    s = x.shape[1]
                    for blk in self.blocks:
                        x = blk(x, self.cos[:s], self.sin[:s])
                    return self.lm_head(self.norm(x)) if self.lm_head is not None else x

            self.module = PlainStage()
            self.loss_fn = (
                (lambda logits, t: F.cross_entropy(logits.flatten(0, 1), t.flatten()))
                if lay.last
                else None
            )
        self.replicated = [
            p for p in self.module.parameters() if getattr(p, "sequence_parallel", False)
        ]

    def sync_replicated_grads(self) -> None:
        """All-reduce the sequence-parallel norm weights' gradients over the TP group
        (Megatron's ``allreduce_sequence_parallel_grads``), one flat buffer."""
        import torch
        import torch.distributed as dist

        grads = [p.grad for p in self.replicated if p.grad is not None]
        if self.lay.tp == 1 or not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.lay.tp_group)
        off = 0
        for g in grads:
            g.copy_(flat[off : off + g.numel()].view_as(g))
            off += g.numel()
