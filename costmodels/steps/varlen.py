"""Price tables of the variable-length simulation: :class:`VarlenCoster` prices token-linear
work, per-document attention, ring exchanges and the optimizer step from one vectorised
``predict_many`` call (the strategies that use them: :mod:`simcli.training.varlen`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodels.steps.training import CostModel
from hardware_specs.schema import Dtype
from workloads.decompose import (
    layer_backward_ops,
    layer_forward_ops,
    model_step_ops,
    optimizer_ops,
    params_per_tp_rank,
)
from workloads.models import ModelConfig
from workloads.ops import Op, OpKind, ops_frame

ATTENTION = {OpKind.attn_fwd, OpKind.attn_bwd, OpKind.attn_fwdbwd}
COLLECTIVES = {
    OpKind.all_reduce,
    OpKind.all_gather,
    OpKind.reduce_scatter,
    OpKind.all_to_all,
    OpKind.send_recv,
}
ATTN_PACK_TOKENS = 32768  # tokens of the reference pack attention is priced in
ACT_BYTES = 2  # bf16 activations


def _geometric(lo: int, hi: int, per_octave: int) -> np.ndarray:
    top = max(lo, hi)
    n = int(math.ceil(math.log2(top / lo) * per_octave)) + 1
    return np.unique(np.ceil(lo * 2.0 ** (np.arange(n) / per_octave)).astype(np.int64))


@dataclass(frozen=True)
class _TPGrid:
    """Per-tp price tables (whole model, one GPU)."""

    tokens: np.ndarray  # per-GPU tokens of a micro-batch
    lin_f: np.ndarray  # seconds of the token-linear forward work at those tokens
    lin_b: np.ndarray
    lengths: np.ndarray  # document lengths
    attn_f: np.ndarray  # seconds of one document's causal attention forward, all layers
    attn_b: np.ndarray
    kv_bytes_per_token: float  # K and V of one layer, one token, one TP rank
    limit_tokens: int  # tokens per rank per micro-batch that fit memory (0: none)


class VarlenCoster:
    """Prices micro-batches of packed documents on ``tp``-way replicas (see
    :mod:`simcli.training.varlen`)."""

    def __init__(
        self,
        model: ModelConfig,
        cost_model: CostModel,
        num_gpus: int,
        tps: tuple[int, ...],
        max_len: int,
        recompute: str = "none",
        memory_fraction: float = 0.9,
        attn_backend: str = "",
    ) -> None:
        self.model = model
        self.cost_model = cost_model
        self.system = cost_model.system
        self.gpn = self.system.gpus_per_node
        self.num_gpus = num_gpus
        self.recompute = recompute
        self.memory_fraction = memory_fraction
        self.layers = model.num_layers
        self.grids: dict[int, _TPGrid] = {}
        self.optimizer_s = 0.0
        if tps:  # no tps: only the memory model is wanted
            self._build(sorted(set(tps)), max_len, attn_backend)

    # ---------------------------------------------------------------- memory
    def state_bytes(self, tp: int) -> float:
        """Model states per GPU under mixed precision with a distributed optimizer: bf16
        weights (2 B) and fp32 gradient buffer (4 B) per parameter, fp32 master weights and
        Adam moments (12 B) sharded over the ``num_gpus / tp`` data-parallel replicas
        (ZeRO stage 1; Rajbhandari et al. 2020, sec. 3.1: K = 12 of 2 + 2 + K bytes)."""
        return self.params_per_gpu(tp) * (2.0 + 4.0 + 12.0 / (self.num_gpus // tp))

    def params_per_gpu(self, tp: int) -> int:
        """Parameters one GPU of a ``tp``-way replica holds (no pipeline parallelism)."""
        p = params_per_tp_rank(self.model, tp)
        return p["layer"] * self.layers + p["embedding"] + p["final_norm"] + p["lm_head"]

    def activation_bytes_per_token(self, tp: int) -> float:
        """Activation bytes one token leaves on one GPU until its backward pass.

        Per layer, Korthikanti et al. 2022 Table 2, tensor + sequence parallel:
        ``s b h (34/t + 5 a s / (h t))``; FlashAttention keeps no ``a s^2`` score matrix,
        so ``34 h / t`` bytes per token (the selective-recompute row). Full recompute keeps
        the layer input only (``2 h / t`` under SP) plus one layer's working set. Plus fp32
        logits of the vocab-parallel loss, ``4 V / t``."""
        h, t = self.model.hidden_size, tp
        layer = 34.0 * h / t
        kept = 2.0 * h / t if self.recompute == "full" else layer
        working = layer if self.recompute == "full" else 0.0
        return self.layers * kept + working + 4.0 * self.model.vocab_size / t

    def tokens_limit(self, tp: int) -> int:
        """Tokens one rank (TP group) may hold in a micro-batch: free memory per GPU over
        the activation bytes per token per GPU (0 when the states alone do not fit)."""
        free = self.system.gpu.memory_bytes * self.memory_fraction - self.state_bytes(tp)
        return max(0, int(free // self.activation_bytes_per_token(tp)))

    # ---------------------------------------------------------------- price tables
    def _build(self, tps: list[int], max_len: int, attn_backend: str) -> None:
        """Every price table in one ``predict_many`` call."""
        model, ops = self.model, []
        plans = {}
        for tp in tps:
            sp = tp > 1
            nodes = max(1, math.ceil(tp / self.gpn))
            # Token counts 2^k and 3 * 2^(k-1), multiples of 8 * tp: packed micro-batches are
            # padded to tensor-core-aligned sizes (cuBLAS's fast bf16 path wants K % 8 == 0,
            # and the wgrad GEMMs' inner dimension is the token count).
            align = 8 * tp
            top = max(64, self.tokens_limit(tp))
            raw = np.concatenate([_geometric(64, top, 1), 3 * _geometric(32, top, 1)])
            tokens = np.unique(np.ceil(raw / align).astype(np.int64) * align)
            lin: list[tuple[int, int, int, str]] = []  # (op index, grid point, count, phase)
            for i, t in enumerate(int(x) for x in tokens):
                args = (model, 1, t, tp, sp, "bf16", attn_backend)
                parts = (
                    ("f", self.layers, layer_forward_ops(*args)),
                    ("b", self.layers, layer_backward_ops(*args)),
                    ("f", 1, model_step_ops(model, 1, t, tp, "forward", sp, "bf16", "all")),
                    ("b", 1, model_step_ops(model, 1, t, tp, "backward", sp, "bf16", "all")),
                )
                for phase, mult, layer_ops in parts:
                    for lo in layer_ops:
                        if lo.op.op not in ATTENTION:
                            lin.append((len(ops), i, lo.count * mult, phase))
                            ops.append(self._placed(lo.op, nodes))
            attn_los = [
                lo
                for lo in layer_forward_ops(model, 1, tp * 16, tp, sp, "bf16", attn_backend)
                + layer_backward_ops(model, 1, tp * 16, tp, sp, "bf16", attn_backend)
                if lo.op.op in ATTENTION
            ]
            template = {lo.op.op: lo.op for lo in attn_los}
            # a hybrid's mean layer runs attention in the attention layers' share only
            self._attn_share = float(attn_los[0].count) if attn_los else 1.0
            lengths = _geometric(16, max(16, max_len), 4)
            attn_start = len(ops)
            for L in (int(x) for x in lengths):
                upd = {"batch": max(1, ATTN_PACK_TOKENS // L), "seq_q": L, "seq_kv": L}
                ops.append(template[OpKind.attn_fwd].model_copy(update=upd))
                ops.append(template[OpKind.attn_bwd].model_copy(update=upd))
            plans[tp] = (tokens, lin, lengths, attn_start)
        sr_bytes = _geometric(1024, 2**36, 2)
        sr_start = len(ops)
        for nb in (int(x) for x in sr_bytes):
            ops.append(Op(op=OpKind.send_recv, dtype=Dtype.bf16, bytes=nb, ranks=2))
            ops.append(Op(op=OpKind.send_recv, dtype=Dtype.bf16, bytes=nb, ranks=2, nodes=2))
        shard = self.params_per_gpu(tps[0]) // (self.num_gpus // tps[0])
        opt_start = len(ops)
        ops.extend(lo.op for lo in optimizer_ops(model, max(1, int(shard)), "fp32"))
        times = np.asarray(self.cost_model.predict_many(ops_frame(ops)), dtype=float)

        n_sr = len(sr_bytes)
        self._sr_bytes = sr_bytes.astype(float)
        self._sr_intra = times[sr_start : sr_start + 2 * n_sr : 2]
        self._sr_inter = times[sr_start + 1 : sr_start + 2 * n_sr : 2]
        self.optimizer_s = float(times[opt_start:].sum())
        lo, hi = 2.0**28, 2.0**32
        self._sr_slope_intra = float(np.diff(self.send_recv_s([lo, hi], False))[0] / (hi - lo))
        self._sr_slope_inter = float(np.diff(self.send_recv_s([lo, hi], True))[0] / (hi - lo))
        for tp in tps:
            tokens, lin, lengths, a0 = plans[tp]
            lin_f = np.zeros(len(tokens))
            lin_b = np.zeros(len(tokens))
            for idx, i, mult, phase in lin:
                (lin_f if phase == "f" else lin_b)[i] += times[idx] * mult
            per_doc = self.layers * self._attn_share / np.maximum(1, ATTN_PACK_TOKENS // lengths)
            kv_heads = max(1, model.num_kv_heads // tp)
            self.grids[tp] = _TPGrid(
                tokens=tokens.astype(float),
                lin_f=lin_f,
                lin_b=lin_b,
                lengths=lengths.astype(float),
                attn_f=times[a0 : a0 + 2 * len(lengths) : 2] * per_doc,
                attn_b=times[a0 + 1 : a0 + 2 * len(lengths) : 2] * per_doc,
                kv_bytes_per_token=2.0 * kv_heads * model.head_dim * ACT_BYTES,
                limit_tokens=self.tokens_limit(tp),
            )

    def _placed(self, op: Op, nodes: int) -> Op:
        if op.op in COLLECTIVES and nodes > 1:
            return op.model_copy(update={"nodes": nodes})
        return op

    # ---------------------------------------------------------------- lookups
    def limit(self, tp: int) -> int:
        """Tokens per rank per micro-batch that fit memory at ``tp``."""
        return self.grids[tp].limit_tokens if tp in self.grids else self.tokens_limit(tp)

    def linear_s(self, tp: int, tokens: np.ndarray | float) -> np.ndarray:
        """Token-linear seconds (forward + backward [+ recompute]) of micro-batches with
        ``tokens`` tokens per rank; linear beyond the table, 0 for empty micro-batches."""
        g = self.grids[tp]
        x = np.asarray(tokens, dtype=float)
        f = _interp(x, g.tokens, g.lin_f)
        b = _interp(x, g.tokens, g.lin_b)
        out = f + b + (f if self.recompute == "full" else 0.0)
        return np.where(x > 0, out, 0.0)

    def attention_s(self, tp: int, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) seconds of each whole document's causal attention, all
        layers, on one TP group (quadratic extrapolation beyond the table)."""
        g = self.grids[tp]
        x = np.asarray(lengths, dtype=float)
        f = _interp(x, g.lengths, g.attn_f, power=2.0)
        b = _interp(x, g.lengths, g.attn_b, power=2.0)
        return f, b

    def send_recv_s(self, nbytes: np.ndarray | float, inter_node: bool) -> np.ndarray:
        ys = self._sr_inter if inter_node else self._sr_intra
        x = np.asarray(nbytes, dtype=float)
        return np.where(x > 0, _interp(x, self._sr_bytes, ys), 0.0)

    def inter_node(self, tp: int, c: int | np.ndarray) -> np.ndarray:
        """A CP ring of ``c`` TP groups crosses nodes when it spans more than one node."""
        return np.asarray(tp * np.asarray(c) > self.gpn)

    def ring_exposed_s(
        self,
        tp: int,
        c: int,
        tokens_per_rank: float,
        attn_f_rank: float,
        attn_b_rank: float,
    ) -> float:
        """Exposed ring-attention communication of one micro-batch on a ``c``-rank ring,
        all layers: per layer ``c - 1`` steps, each moving the rank's KV (dKV too in the
        backward) while one ``1/c`` block of the rank's attention runs (as in
        :func:`costmodels.steps.training.cp_comm_s`)."""
        if c <= 1 or tokens_per_rank <= 0:
            return 0.0
        inter = bool(self.inter_node(tp, c))
        step_bytes = tokens_per_rank * self.grids[tp].kv_bytes_per_token
        step_f = float(self.send_recv_s(step_bytes, inter))
        step_b = float(self.send_recv_s(2.0 * step_bytes, inter))
        block_f = attn_f_rank / self.layers / c
        block_b = attn_b_rank / self.layers / c
        exp_f = max(0.0, step_f - block_f)
        exp_b = max(0.0, step_b - block_b)
        fwd_passes = 2.0 if self.recompute == "full" else 1.0
        return self.layers * (c - 1) * (fwd_passes * exp_f + exp_b)

    def doc_cost_s(self, tp: int, lengths: np.ndarray, c: int | np.ndarray) -> np.ndarray:
        """Predicted seconds one GPU of a ``c``-rank group spends on each document (its
        ``1/c`` share): token-linear work at the full-micro-batch rate, attention, and the
        exposed ring exchange of the document alone. Used to plan; plans are then priced
        micro-batch by micro-batch."""
        L = np.asarray(lengths, dtype=float)
        cc = np.broadcast_to(np.asarray(c, dtype=float), L.shape)
        g = self.grids[tp]
        ref = float(max(g.limit_tokens, 1024))
        rate = float(self.linear_s(tp, ref)) / ref
        f, b = self.attention_s(tp, L)
        fwd_passes = 2.0 if self.recompute == "full" else 1.0
        attn = (fwd_passes * f + b) / cc
        out = rate * L / cc + attn
        multi = cc > 1
        if np.any(multi):
            inter = self.inter_node(tp, cc)
            nbytes = L / cc * g.kv_bytes_per_token

            def ring_step(x: np.ndarray) -> np.ndarray:
                # bandwidth term only: in a packed micro-batch the documents share one
                # exchange per ring step, so a document adds its bytes, not a latency
                return x * np.where(inter, self._sr_slope_inter, self._sr_slope_intra)

            block_f = f / cc / cc / self.layers
            block_b = b / cc / cc / self.layers
            exp_f = np.maximum(0.0, ring_step(nbytes) - block_f)
            exp_b = np.maximum(0.0, ring_step(2.0 * nbytes) - block_b)
            exposed = self.layers * (cc - 1) * (fwd_passes * exp_f + exp_b)
            out = out + np.where(multi, exposed, 0.0)
        return out


def _interp(x: np.ndarray, xs: np.ndarray, ys: np.ndarray, power: float = 1.0) -> np.ndarray:
    """Piecewise-linear interpolation; below the table the first value, above it
    ``ys[-1] * (x / xs[-1]) ** power``."""
    out = np.interp(x, xs, ys)
    above = x > xs[-1]
    if np.any(above):
        out = np.where(above, ys[-1] * (np.maximum(x, 1.0) / xs[-1]) ** power, out)
    return out
