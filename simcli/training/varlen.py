"""Variable-length training data: packing, load imbalance and dynamic parallel layouts.

Every step takes a global batch of documents drawn from a length distribution until it
holds ``tokens_per_step`` tokens, and each strategy decides which GPUs process which
document and how the document is split:

- ``static``: a fixed ``dp x cp x tp`` mesh (the plan every framework starts from).
  Documents are packed first-fit-decreasing into bins of the context length ``seq_len``;
  bins go round-robin to the data-parallel ranks; every bin is padded to ``seq_len`` and
  split over the ``cp`` ranks of its CP group (short documents too); a micro-batch holds
  as many bins as fit memory (Megatron's ``micro_batch_size``).
- ``hydraulis`` (Li et al. 2025, "Hydraulis: Balancing Large Transformer Model Training via
  Co-designing Parallel Strategies and Data Assignment"): per step, a heterogeneous
  layout of replicas from a few candidate configurations (wider TP, or CP, inside a node;
  CP groups of whole nodes for documents no node holds), chosen among a handful of
  candidate layouts by predicted step time; documents go to the replicas by greedy LPT on
  *predicted time* (each document, costliest first, to the replica where it would finish
  first); see :func:`hydraulis_lanes`.
- ``bytescale`` (Ge et al. 2025, "ByteScale: ... 2048K Context Length on More Than 12,000
  GPUs", Hybrid Data Parallelism): every TP group is a data-parallel rank; a document too
  long for one rank's memory is split over just enough ranks (``ceil(L / limit)``), which
  form a CP ring for that document only (dynamic communication mesh) and may hold short
  documents too; shards and documents are balanced by predicted time.
- ``flexsp`` (Wang et al., ASPLOS 2025, "FlexSP: Data-Centric and Heterogeneity-Adaptive
  Sequence Parallelism"): per step, the GPUs are cut into sequence-parallel groups of
  ``1, 2, 4, ...`` TP groups and documents are assigned to group sizes by a mixed-integer
  linear program minimising the busiest group's time (scipy ``milp``, HiGHS; see
  :func:`solve_flexsp_milp`), then realised by LPT inside each group size.

Every dynamic planner also prices the static layout without its padding and keeps
whichever it predicts faster (counted as ``fallback_steps``), as a planner with a cost
model would.

Costs (one vectorised ``predict_many`` call when the simulator is built):

- token-linear work per micro-batch -- every GEMM, norm, activation, embedding, LM head,
  loss and TP collective of the whole model (``pp = 1``) -- priced on a grid of per-GPU
  token counts and interpolated; packing documents into one micro-batch runs them as one
  set of GEMMs.
- attention per document: varlen (packed) FlashAttention-style kernels keep documents
  from attending across boundaries, so a document of ``L`` tokens costs causal attention
  of length ``L``. It is priced on a grid of lengths as a batch of same-length documents
  filling a 32k-token pack, divided by the batch (one launch for a pack, not one per
  document); a pack of one 32k document thus costs ~32x the attention of 32 x 1k.
- context parallelism over ``c`` ranks (ring attention, Liu et al. 2023, with Megatron's
  load-balanced causal chunking as in :mod:`costmodels.steps.training`): each rank holds
  ``L / c`` tokens and ``1/c`` of the causal attention; per layer ``c - 1`` KV exchanges
  (KV and dKV backward), each hidden behind one ``1/c`` attention block, the rest exposed.
- per step, the AdamW update of the rank's optimizer shard; gradient reduction is assumed
  overlapped with the backward pass (Megatron's ``overlap_grad_reduce``).

Memory: a micro-batch may give one rank (a TP group: one DP or CP rank; each of its GPUs
keeps ``1/tp`` of the activations under sequence parallelism) at most
``VarlenCoster.limit(tp)`` tokens: the GPU memory (times ``memory_fraction``) minus model
states, over the activation bytes a token leaves on a GPU; see
:meth:`VarlenCoster.activation_bytes_per_token` and :meth:`VarlenCoster.state_bytes`.

Simplifications: no pipeline parallelism; ranks sharing a long document (ByteScale) are
assumed to reach its ring exchanges together (ByteScale's balance scheduler orders the
micro-batches so they do); switching layouts between steps (re-sharding weights for a
wider TP in Hydraulis, rebuilding communicators) is free; every strategy's replicas take
part in the same gradient reduction, which is therefore left out of the comparison.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from scipy.optimize import Bounds, LinearConstraint, milp

from costmodels.steps.training import CostModel, model_flops
from hardware_specs.schema import Dtype
from workloads.decompose import (
    layer_backward_ops,
    layer_forward_ops,
    model_step_ops,
    optimizer_ops,
    params_per_tp_rank,
    valid_tp_degrees,
)
from workloads.lengths import LengthDist
from workloads.models import ModelConfig
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, Op, OpKind, normalise_frame
from workloads.plan import PlanError, make_plan

Strategy = Literal["static", "hydraulis", "bytescale", "flexsp"]
STRATEGIES: tuple[str, ...] = ("static", "hydraulis", "bytescale", "flexsp")
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


class VarlenError(ValueError):
    """An impossible variable-length simulation; one line: what, the value, what is allowed."""


class VarlenConfig(BaseModel):
    """What ``simcli varlen`` simulates (the model, GPU and cost model come separately)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lengths: LengthDist = Field(description="document-length distribution")
    num_gpus: int = Field(gt=0, description="GPUs in the job")
    tp: int = Field(default=1, gt=0, description="tensor-parallel degree of every replica")
    cp: int | None = Field(
        default=None, gt=0, description="static plan's CP degree; default: the smallest that fits"
    )
    seq_len: int | None = Field(
        default=None,
        gt=0,
        description="static context length; longer documents are split into seq_len pieces "
        "for every strategy; default: the distribution's maximum length",
    )
    tokens_per_step: int = Field(gt=0, description="tokens of documents per global batch")
    steps: int = Field(default=50, gt=0, le=100_000, description="steps simulated")
    seed: int = Field(default=0, ge=0, description="seed of the document sampler")
    strategies: tuple[Strategy, ...] = Field(default=STRATEGIES, min_length=1)
    recompute: Literal["none", "full"] = Field(
        default="none", description="full: keep only layer inputs, recompute the forward"
    )
    memory_fraction: float = Field(
        default=0.9, gt=0, le=1, description="share of GPU memory usable (allocator, context)"
    )
    attn_backend: str = Field(default="", description="attention kernel family ('' = default)")

    @model_validator(mode="after")
    def _check(self) -> VarlenConfig:
        if self.num_gpus % self.tp:
            raise ValueError(
                f"tp={self.tp} does not divide num_gpus={self.num_gpus}; allowed: divisors "
                f"of {self.num_gpus}"
            )
        if len(set(self.strategies)) != len(self.strategies):
            raise ValueError(f"strategies {list(self.strategies)} repeat; list each once")
        return self


def make_varlen_config(**fields: object) -> VarlenConfig:
    """Build a config; any problem is one :class:`VarlenError` line."""
    try:
        return VarlenConfig(**fields)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        got = err.get("input")
        shown = f" (got {got!r})" if where and not isinstance(got, dict | BaseModel) else ""
        raise VarlenError(f"{where}: {msg}{shown}" if where else msg) from None


# ----------------------------------------------------------------------------- costs


def _frame(ops: list[Op]) -> pd.DataFrame:
    return normalise_frame(
        pd.DataFrame([o.row() for o in ops], columns=[*CSV_COLUMNS, *EXTRA_COLUMNS])
    )


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
    """Prices micro-batches of packed documents on ``tp``-way replicas (see module doc)."""

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
            template = {
                lo.op.op: lo.op
                for lo in layer_forward_ops(model, 1, tp * 16, tp, sp, "bf16", attn_backend)
                + layer_backward_ops(model, 1, tp * 16, tp, sp, "bf16", attn_backend)
                if lo.op.op in ATTENTION
            }
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
        times = np.asarray(self.cost_model.predict_many(_frame(ops)), dtype=float)

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
            per_doc = self.layers / np.maximum(1, ATTN_PACK_TOKENS // lengths)
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
        :func:`costmodels.steps.training._cp_comm`)."""
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


# ----------------------------------------------------------------------------- plans


@dataclass
class Lane:
    """GPUs that run micro-batches together: one TP group (``cp == 1``) or a CP group of
    ``cp`` TP groups. ``docs[i]`` is held split over ``shards[i]`` ranks: a CP group's
    documents have ``shards == cp``; a ByteScale rank holds ``1/shards`` of a long document
    whose other shards sit on other lanes. ``bins`` fixes the micro-batches (static);
    otherwise they are packed first-fit-decreasing up to the memory limit."""

    tp: int
    cp: int
    docs: list[int] = field(default_factory=list)
    shards: list[int] = field(default_factory=list)
    bins: list[list[int]] | None = None  # micro-batches as positions into docs
    padded_tokens: list[int] | None = None  # per micro-batch: per-GPU tokens padded to

    @property
    def gpus(self) -> int:
        return self.tp * self.cp

    def add(self, doc: int, shards: int) -> None:
        self.docs.append(doc)
        self.shards.append(shards)


@dataclass
class LaneCost:
    busy_s: float
    micro_batches: int
    tokens_per_rank_max: float  # largest micro-batch per rank, padding included
    fill_max: float  # tokens_per_rank_max / the memory limit
    padding_tokens: float


def ffd(sizes: np.ndarray, capacity: float) -> list[list[int]]:
    """First-fit-decreasing bin packing; returns positions per bin (items larger than the
    capacity get a bin of their own)."""
    order = np.argsort(-np.asarray(sizes, dtype=float), kind="stable")
    bins: list[list[int]] = []
    room: list[float] = []
    for i in order:
        s = float(sizes[i])
        for j, r in enumerate(room):
            if s <= r + 1e-9:
                bins[j].append(int(i))
                room[j] = r - s
                break
        else:
            bins.append([int(i)])
            room.append(capacity - s)
    return bins


def lane_cost(coster: VarlenCoster, lane: Lane, lengths: np.ndarray) -> LaneCost:
    """Price one lane micro-batch by micro-batch (see the module docstring)."""
    if not lane.docs:
        return LaneCost(0.0, 0, 0.0, 0.0, 0.0)
    L = lengths[np.asarray(lane.docs)].astype(float)
    c = np.asarray(lane.shards, dtype=float)
    per_rank = L / c
    limit = coster.limit(lane.tp)
    bins = lane.bins if lane.bins is not None else ffd(per_rank, limit)
    attn_f, attn_b = coster.attention_s(lane.tp, L)
    attn_f, attn_b = attn_f / c, attn_b / c  # per rank
    fwd_passes = 2.0 if coster.recompute == "full" else 1.0
    busy = pad = 0.0
    peak = 0.0
    for j, positions in enumerate(bins):
        idx = np.asarray(positions)
        tok = float(per_rank[idx].sum())
        run = max(tok, float(lane.padded_tokens[j])) if lane.padded_tokens else tok
        pad += (run - tok) * lane.cp
        peak = max(peak, run)
        busy += float(coster.linear_s(lane.tp, run))
        busy += float(fwd_passes * attn_f[idx].sum() + attn_b[idx].sum())
        for deg in np.unique(c[idx]):
            if deg <= 1:
                continue
            sel = idx[c[idx] == deg]
            busy += coster.ring_exposed_s(
                lane.tp,
                int(deg),
                float(per_rank[sel].sum()),
                float(attn_f[sel].sum()),
                float(attn_b[sel].sum()),
            )
    return LaneCost(busy, len(bins), peak, peak / limit if limit else math.inf, pad)


@dataclass
class StepOutcome:
    """One strategy on one step."""

    step_s: float
    busy_s: np.ndarray  # per GPU
    tokens: int
    padding_tokens: float
    fill_max: float
    tokens_per_rank_max: float
    fallback: bool
    lanes: list[Lane]
    layout: str

    @property
    def imbalance(self) -> float:
        mean = float(self.busy_s.mean())
        return float(self.busy_s.max()) / mean if mean > 0 else 1.0


def evaluate(
    coster: VarlenCoster, lanes: list[Lane], lengths: np.ndarray, layout: str = ""
) -> StepOutcome:
    """Price a plan: step time = the busiest lane + the optimizer step."""
    busy: list[np.ndarray] = []
    pad = fill = peak = 0.0
    for lane in lanes:
        lc = lane_cost(coster, lane, lengths)
        busy.append(np.full(lane.gpus, lc.busy_s))
        pad += lc.padding_tokens
        fill = max(fill, lc.fill_max)
        peak = max(peak, lc.tokens_per_rank_max)
    per_gpu = np.concatenate(busy) if busy else np.zeros(1)
    return StepOutcome(
        step_s=float(per_gpu.max()) + coster.optimizer_s,
        busy_s=per_gpu,
        tokens=int(lengths.sum()),
        padding_tokens=pad,
        fill_max=fill,
        tokens_per_rank_max=peak,
        fallback=False,
        lanes=lanes,
        layout=layout,
    )


# ----------------------------------------------------------------------------- strategies


@dataclass(frozen=True)
class StaticPlan:
    tp: int
    cp: int
    dp: int
    seq_len: int
    micro_batch: int = 1  # bins (sequences of seq_len) per micro-batch


def static_lanes(plan: StaticPlan, lengths: np.ndarray, padded: bool = True) -> list[Lane]:
    """The static layout: FFD into ``seq_len`` bins, bins round-robin over the DP ranks,
    ``plan.micro_batch`` bins per micro-batch, each bin padded to ``seq_len``."""
    bins = ffd(lengths, plan.seq_len)
    per_dp: list[list[list[int]]] = [[] for _ in range(plan.dp)]
    for i, b in enumerate(bins):
        per_dp[i % plan.dp].append(b)
    lanes = []
    bin_tokens = plan.seq_len // plan.cp
    for mine in per_dp:
        lane = Lane(plan.tp, plan.cp, bins=[], padded_tokens=[] if padded else None)
        for first in range(0, len(mine), plan.micro_batch):
            group = mine[first : first + plan.micro_batch]
            start = len(lane.docs)
            for d in (d for b in group for d in b):
                lane.add(d, plan.cp)
            assert lane.bins is not None
            lane.bins.append(list(range(start, len(lane.docs))))
            if lane.padded_tokens is not None:
                lane.padded_tokens.append(bin_tokens * len(group))
        lanes.append(lane)
    return lanes


def _eft(
    costs: list[np.ndarray], counts: list[int], order: np.ndarray | None = None
) -> tuple[list[list[list[int]]], float]:
    """Greedy LPT / earliest-finish-time over heterogeneous lanes: documents in decreasing
    order of their cheapest cost, each to the lane where it would finish first.
    ``costs[t][d]`` is document d's time on a lane of type t (inf: does not fit);
    ``counts[t]`` lanes of type t. Returns documents per lane per type and the makespan."""
    best = np.min(np.vstack(costs), axis=0) if costs else np.zeros(0)
    if order is None:
        order = np.argsort(-best, kind="stable")
    heaps = [[(0.0, i) for i in range(n)] for n in counts]
    out: list[list[list[int]]] = [[[] for _ in range(n)] for n in counts]
    live = [t for t, n in enumerate(counts) if n > 0]
    for d in order:
        pick, finish = -1, math.inf
        for t in live:
            cost = costs[t][d]
            if cost == math.inf:
                continue
            f = heaps[t][0][0] + cost
            if f < finish:
                pick, finish = t, f
        if pick < 0:
            raise VarlenError(f"document {d} fits no lane of the layout")
        _, lane = heapq.heappop(heaps[pick])
        heapq.heappush(heaps[pick], (finish, lane))
        out[pick][lane].append(int(d))
    return out, max((load for hs in heaps for load, _ in hs), default=0.0)


def bytescale_lanes(coster: VarlenCoster, tp: int, lengths: np.ndarray) -> list[Lane]:
    """ByteScale-style HDP: each document on ``ceil(L / limit)`` TP groups (1 for most),
    shards and documents balanced by predicted time over the TP groups."""
    units = coster.num_gpus // tp
    limit = coster.limit(tp)
    c = np.maximum(1, np.ceil(lengths / limit)).astype(np.int64)
    if int(c.max()) > units:
        raise VarlenError(
            f"a {int(lengths.max())}-token document needs {int(c.max())} TP groups of "
            f"{limit} tokens each but there are {units}; allowed: more GPUs, larger tp, or "
            f"a smaller --seq-len"
        )
    cost = coster.doc_cost_s(tp, lengths, c)
    lanes = [Lane(tp, 1) for _ in range(units)]
    heap = [(0.0, u) for u in range(units)]
    # Longest work first: CP documents occupy several ranks at once, then LPT for the rest.
    for d in np.lexsort((-cost, -c)):
        k = int(c[d])
        taken = [heapq.heappop(heap) for _ in range(k)]
        for load, u in taken:
            lanes[u].add(int(d), k)
            heapq.heappush(heap, (load + float(cost[d]), u))
    return lanes


def _bytescale_layout(coster: VarlenCoster, tp: int, lengths: np.ndarray) -> str:
    """``dpU`` plus ``cpK xN``: N documents split over K TP groups this step."""
    c = np.maximum(1, np.ceil(lengths / coster.limit(tp))).astype(np.int64)
    sharded = Counter(int(k) for k in c if k > 1)
    parts = [f"dp{coster.num_gpus // tp}"] + [f"cp{k}x{n}" for k, n in sorted(sharded.items())]
    return ",".join(parts)


@dataclass(frozen=True)
class _Config:
    tp: int
    cp: int

    @property
    def gpus(self) -> int:
        return self.tp * self.cp


def hydraulis_configs(coster: VarlenCoster, tp: int, block: int) -> tuple[list[_Config], list[int]]:
    """Candidate configurations of one block (wider TP, or CP, inside it) and the TP
    degrees they need priced."""
    valid = set(valid_tp_degrees(coster.model))
    out: list[_Config] = []
    k = 1
    while tp * k <= block:
        if block % (tp * k) == 0:
            if tp * k in valid:
                out.append(_Config(tp * k, 1))
            if k > 1:
                out.append(_Config(tp, k))
        k *= 2
    return out, sorted({cfg.tp for cfg in out})


def hydraulis_lanes(
    coster: VarlenCoster, tp: int, lengths: np.ndarray, configs: list[_Config], block: int
) -> tuple[list[Lane], str]:
    """Hydraulis-style: choose the step's heterogeneous layout, then EFT/LPT on predicted
    time.

    A layout is a number of replicas of each candidate configuration: ``configs`` fit in a
    node-sized block (wider TP, or CP, inside it); merged groups of ``m`` blocks (CP across
    nodes) hold documents no block can. Candidates, each priced by the makespan of its EFT
    assignment: the configuration with the fewest GPU-seconds for the step's documents
    everywhere; half of the GPUs given to the runner-up; and 1, 2 or 4 replicas of each
    configuration that holds the step's longest document (the cheapest in-block one and
    every merged one), the rest as before."""
    n_gpus = coster.num_gpus
    blocks = n_gpus // block
    in_cfgs = [cfg for cfg in configs if coster.limit(cfg.tp) > 0]
    merged = {1 << i for i in range(1, int(math.log2(blocks)) + 1)} | ({blocks} - {1})
    types = in_cfgs + [_Config(tp, m * block // tp) for m in sorted(merged)]
    costs = []
    for cfg in types:
        fits = lengths <= coster.limit(cfg.tp) * cfg.cp
        costs.append(np.where(fits, coster.doc_cost_s(cfg.tp, lengths, cfg.cp), math.inf))
    cheapest = np.min(np.vstack(costs), axis=0)
    if not np.all(np.isfinite(cheapest)):
        raise VarlenError(
            f"a {int(lengths.max())}-token document fits no group of {n_gpus} GPUs "
            f"at tp={tp} ({coster.limit(tp)} tokens per rank); allowed: more GPUs, larger "
            "tp, or a smaller --seq-len"
        )
    order = np.argsort(-cheapest, kind="stable")

    def gpu_seconds(t: int) -> float:
        ok = np.isfinite(costs[t])
        return float(costs[t][ok].sum()) * types[t].gpus / max(1, int(ok.sum()))

    ranked = sorted(range(len(in_cfgs)), key=gpu_seconds)
    base = in_cfgs.index(_Config(tp, 1))  # tp divides every size: it fills any remainder

    def complete(partial: dict[int, int]) -> dict[int, int] | None:
        layout = {t: n for t, n in partial.items() if n > 0}
        free = n_gpus - sum(n * types[t].gpus for t, n in layout.items())
        for t in (ranked[0], base):
            n = max(0, free) // types[t].gpus
            if n:
                layout[t] = layout.get(t, 0) + n
                free -= n * types[t].gpus
        return layout if free == 0 else None

    longest = int(np.argmax(lengths))
    holds = [t for t in range(len(types)) if np.isfinite(costs[t][longest])]
    wide = sorted((t for t in holds if t < len(in_cfgs)), key=gpu_seconds)[:1]
    wide += [t for t in holds if t >= len(in_cfgs)]
    partials: list[dict[int, int]] = [{}]
    if len(ranked) > 1:
        partials.append({ranked[1]: (n_gpus // 2) // types[ranked[1]].gpus})
    partials += [{t: n} for t in wide for n in (1, 2, 4) if n * types[t].gpus <= n_gpus]

    best: tuple[float, list[int]] | None = None
    seen: set[tuple[int, ...]] = set()
    for partial in partials:
        layout = complete(partial)
        if layout is None:
            continue
        counts = [layout.get(t, 0) for t in range(len(types))]
        if tuple(counts) in seen:
            continue
        seen.add(tuple(counts))
        try:
            _, makespan = _eft(costs, counts, order)
        except VarlenError:  # some document fits none of this layout's configurations
            continue
        if best is None or makespan < best[0]:
            best = (makespan, counts)
    if best is None:  # pragma: no cover - a replica of a config holding the longest fits all
        raise VarlenError("no Hydraulis layout holds every document")
    assigned, _ = _eft(costs, best[1], order)
    lanes: list[Lane] = []
    names: Counter[str] = Counter()
    for t, per_lane in enumerate(assigned):
        cfg = types[t]
        for docs in per_lane:
            lane = Lane(cfg.tp, cfg.cp)
            for d in docs:
                lane.add(d, cfg.cp)
            lanes.append(lane)
            names[f"tp{cfg.tp}cp{cfg.cp}"] += 1
    return lanes, ",".join(f"{k}x{v}" for k, v in sorted(names.items()))


@dataclass(frozen=True)
class FlexSPSolution:
    """An integer solution of the FlexSP assignment program at makespan bound ``bound_s``.

    ``groups[k]``: SP groups of ``k`` TP groups; ``assign[b][k]``: documents of bucket b on
    groups of size k; ``load_s[b][k]``: a bucket-b document's predicted time on size k."""

    sizes: tuple[int, ...]
    groups: dict[int, int]
    assign: list[dict[int, int]]
    bucket_docs: list[np.ndarray]
    load_s: list[dict[int, float]]
    bound_s: float
    units: int


def flexsp_buckets(lengths: np.ndarray, per_octave: int = 2) -> list[np.ndarray]:
    """Documents grouped into length buckets of ``2**(1/per_octave)`` width (FlexSP buckets
    sequences to keep its program small)."""
    key = np.floor(np.log2(np.maximum(lengths, 1)) * per_octave).astype(np.int64)
    return [np.flatnonzero(key == k) for k in np.unique(key)]


def solve_flexsp_milp(
    doc_cost: dict[int, np.ndarray],
    fits: dict[int, np.ndarray],
    buckets: list[np.ndarray],
    units: int,
    bound_s: float,
    time_limit_s: float = 1.0,
) -> FlexSPSolution | None:
    """Can every document finish within ``bound_s``? The program (after FlexSP, Wang et al.
    2025, sec. 4, aggregated over buckets and group sizes):

    variables ``y_k`` (groups of size k, integer), ``z_bk`` (bucket-b documents on size-k
    groups, integer);
    ``sum_k k y_k <= units``; ``sum_k z_bk = n_b``; ``sum_b t_bk z_bk <= bound * y_k``
    (a size's work fits its groups); ``z_bk = 0`` unless every bucket-b document fits a
    size-k group's memory and takes at most ``bound`` there;
    minimise GPU-seconds ``sum k t_bk z_bk``. Returns None when infeasible."""
    sizes = tuple(sorted(doc_cost))
    pairs: list[tuple[int, int, float]] = []
    for b, docs in enumerate(buckets):
        for k in sizes:
            if not np.all(fits[k][docs]):
                continue
            t = doc_cost[k][docs]
            if float(t.max()) <= bound_s:
                pairs.append((b, k, float(t.mean())))
    nk, nz = len(sizes), len(pairs)
    n = nk + nz
    rows, lo, hi = [], [], []
    row = np.zeros(n)
    row[:nk] = sizes
    rows.append(row)
    lo.append(-np.inf)
    hi.append(units)
    for b, docs in enumerate(buckets):
        row = np.zeros(n)
        for j, (bb, _, _) in enumerate(pairs):
            if bb == b:
                row[nk + j] = 1.0
        if not row.any():
            return None
        rows.append(row)
        lo.append(len(docs))
        hi.append(len(docs))
    for i, k in enumerate(sizes):
        row = np.zeros(n)
        row[i] = -bound_s
        for j, (_, kk, t) in enumerate(pairs):
            if kk == k:
                row[nk + j] = t
        rows.append(row)
        lo.append(-np.inf)
        hi.append(0.0)
    c = np.zeros(n)
    for j, (_, k, t) in enumerate(pairs):
        c[nk + j] = k * t
    upper = np.array([units // k for k in sizes] + [len(buckets[b]) for b, _, _ in pairs])
    res = milp(
        c=c,
        constraints=LinearConstraint(np.vstack(rows), np.array(lo), np.array(hi)),
        integrality=np.ones(n),
        bounds=Bounds(np.zeros(n), upper.astype(float)),
        options={"time_limit": time_limit_s, "mip_rel_gap": 1e-2},
    )
    if res.x is None or res.status not in (0, 1):
        return None
    x = np.rint(res.x).astype(np.int64)
    groups = {k: int(x[i]) for i, k in enumerate(sizes)}
    assign: list[dict[int, int]] = [{} for _ in buckets]
    load: list[dict[int, float]] = [{} for _ in buckets]
    for j, (b, k, t) in enumerate(pairs):
        assign[b][k] = int(x[nk + j])
        load[b][k] = t
    return FlexSPSolution(sizes, groups, assign, buckets, load, bound_s, units)


def flexsp_realise(
    sol: FlexSPSolution, doc_cost: dict[int, np.ndarray], lengths: np.ndarray, tp: int
) -> tuple[list[Lane], float]:
    """Turn an aggregated solution into groups: in each bucket the longest documents go
    to the largest groups chosen, then LPT on predicted time inside each group size."""
    per_size: dict[int, list[int]] = {k: [] for k in sol.sizes}
    for b, docs in enumerate(sol.bucket_docs):
        ordered = docs[np.argsort(-lengths[docs], kind="stable")]
        pos = 0
        for k in sorted(sol.assign[b], reverse=True):
            n = sol.assign[b][k]
            per_size[k].extend(int(d) for d in ordered[pos : pos + n])
            pos += n
    lanes: list[Lane] = []
    makespan = 0.0
    for k in sol.sizes:
        docs = per_size[k]
        if not sol.groups[k]:
            continue
        group = [Lane(tp, k) for _ in range(sol.groups[k])]
        heap = [(0.0, i) for i in range(len(group))]
        for d in sorted(docs, key=lambda d: -doc_cost[k][d]):
            load, i = heapq.heappop(heap)
            group[i].add(d, k)
            heapq.heappush(heap, (load + float(doc_cost[k][d]), i))
        makespan = max(makespan, max(h[0] for h in heap))
        lanes.extend(group)
    return lanes, makespan


def flexsp_lanes(
    coster: VarlenCoster, tp: int, lengths: np.ndarray, iterations: int = 10
) -> tuple[list[Lane], str]:
    """FlexSP-style: bisection on the makespan bound, one MILP per bound
    (:func:`solve_flexsp_milp`), the best realised plan kept."""
    units = coster.num_gpus // tp
    limit = coster.limit(tp)
    sizes = sorted({1 << i for i in range(int(math.log2(units)) + 1)} | {units})
    doc_cost = {k: coster.doc_cost_s(tp, lengths, k) for k in sizes}
    fits = {k: lengths <= limit * k for k in sizes}
    for k in sizes:
        doc_cost[k] = np.where(fits[k], doc_cost[k], math.inf)
    if not np.all(fits[sizes[-1]]):
        raise VarlenError(
            f"a {int(lengths.max())}-token document does not fit {sizes[-1]} TP groups of "
            f"{limit} tokens; allowed: more GPUs, larger tp, or a smaller --seq-len"
        )
    buckets = flexsp_buckets(lengths)
    gpu_s = np.min(np.vstack([k * doc_cost[k] for k in sizes]), axis=0)
    lo = max(float(gpu_s.sum()) / units, float(np.min(np.vstack(list(doc_cost.values())), 0).max()))
    # A feasible start (and upper bound): every document on groups of the smallest size
    # that holds them all, assigned by EFT.
    k_all = next(k for k in sizes if np.all(fits[k]))
    assigned, hi = _eft([doc_cost[k_all]], [units // k_all])
    best_lanes = []
    for docs in assigned[0]:
        lane = Lane(tp, k_all)
        for d in docs:
            lane.add(d, k_all)
        best_lanes.append(lane)
    best_span, best_groups = hi, {k_all: units // k_all}
    for _ in range(iterations):
        if hi - lo <= 0.01 * hi:
            break
        mid = 0.5 * (lo + hi)
        sol = solve_flexsp_milp(doc_cost, fits, buckets, units, mid)
        if sol is None:
            lo = mid
            continue
        hi = mid
        lanes, span = flexsp_realise(sol, doc_cost, lengths, tp)
        if span < best_span:
            best_lanes, best_span, best_groups = lanes, span, sol.groups
    layout = ",".join(f"sp{k}x{n}" for k, n in sorted(best_groups.items()) if n)
    return best_lanes, layout


# ----------------------------------------------------------------------------- simulation


def sample_steps(
    dist: LengthDist, tokens_per_step: int, steps: int, seed: int, seq_len: int
) -> list[np.ndarray]:
    """Documents of every step: drawn in order until the step holds at least
    ``tokens_per_step`` tokens; documents longer than ``seq_len`` are cut into
    ``seq_len`` pieces (as pre-training loaders do). One generator, seeded once."""
    rng = np.random.default_rng(seed)
    pool = dist.sample(256, rng)
    chunk = int(min(1 << 16, max(256, 2 * tokens_per_step / max(1.0, float(pool.mean())))))
    pos = 0
    out: list[np.ndarray] = []
    for _ in range(steps):
        docs: list[int] = []
        total = 0
        while total < tokens_per_step:
            if pos == len(pool):
                pool, pos = dist.sample(chunk, rng), 0
            L = int(pool[pos])
            pos += 1
            while seq_len < L:
                docs.append(seq_len)
                total += seq_len
                L -= seq_len
            docs.append(L)
            total += L
        out.append(np.asarray(docs, dtype=np.int64))
    return out


@dataclass
class StrategyResult:
    name: str
    outcomes: list[StepOutcome]
    plan_wall_s: float

    def summary(self, static_step_s: float | None, peak_flops: float, flops: float) -> dict:
        steps = np.array([o.step_s for o in self.outcomes])
        tokens = float(sum(o.tokens for o in self.outcomes))
        total_s = float(steps.sum())
        processed = tokens + float(sum(o.padding_tokens for o in self.outcomes))
        gpus = len(self.outcomes[0].busy_s)
        layouts = Counter(o.layout for o in self.outcomes if o.layout)
        return {
            "mean_step_s": float(steps.mean()),
            "p50_step_s": float(np.median(steps)),
            "max_step_s": float(steps.max()),
            "tokens_per_s": tokens / total_s,
            "speedup_vs_static": (static_step_s / float(steps.mean())) if static_step_s else None,
            "imbalance": float(np.mean([o.imbalance for o in self.outcomes])),
            "idle_fraction": float(
                np.mean([1.0 - o.busy_s.mean() / o.busy_s.max() for o in self.outcomes])
            ),
            "padding_fraction": (processed - tokens) / processed if processed else 0.0,
            "mfu": flops / (total_s * gpus * peak_flops),
            "peak_tokens_per_rank": float(max(o.tokens_per_rank_max for o in self.outcomes)),
            "peak_memory_fill": float(max(o.fill_max for o in self.outcomes)),
            "fallback_steps": int(sum(o.fallback for o in self.outcomes)),
            "common_layout": layouts.most_common(1)[0][0] if layouts else "",
            "plan_wall_s_per_step": self.plan_wall_s / len(self.outcomes),
        }


@dataclass
class VarlenResult:
    config: VarlenConfig
    model_id: str
    gpu_id: str
    static_plan: StaticPlan
    tokens_limit: int
    optimizer_s: float
    steps: list[np.ndarray]
    results: dict[str, StrategyResult]
    peak_flops_per_s: float
    flops_per_step: list[float]

    def to_dict(self) -> dict:
        static = self.results["static"]
        static_mean = float(np.mean([o.step_s for o in static.outcomes]))
        flops = float(sum(self.flops_per_step))
        docs = np.concatenate(self.steps)
        return {
            "model": self.model_id,
            "gpu": self.gpu_id,
            "num_gpus": self.config.num_gpus,
            "tp": self.config.tp,
            "lengths": self.config.lengths.spec,
            "tokens_per_step": self.config.tokens_per_step,
            "steps": self.config.steps,
            "seed": self.config.seed,
            "recompute": self.config.recompute,
            "seq_len": self.static_plan.seq_len,
            "static_plan": {
                "dp": self.static_plan.dp,
                "cp": self.static_plan.cp,
                "tp": self.static_plan.tp,
                "seq_len": self.static_plan.seq_len,
                "micro_batch": self.static_plan.micro_batch,
            },
            "tokens_limit_per_rank": self.tokens_limit,
            "optimizer_s": self.optimizer_s,
            "docs_per_step": float(np.mean([len(s) for s in self.steps])),
            "mean_doc_len": float(docs.mean()),
            "max_doc_len": int(docs.max()),
            "strategies": {
                name: res.summary(static_mean, self.peak_flops_per_s, flops)
                for name, res in self.results.items()
                if name in self.config.strategies
            },
        }


def choose_static_plan(
    coster: VarlenCoster, model: ModelConfig, cfg: VarlenConfig, seq_len: int
) -> StaticPlan:
    """The static mesh: the given ``cp`` or the smallest dividing the TP groups whose
    ``seq_len / cp`` tokens per rank fit memory; ``seq_len`` rounded up to a multiple of
    ``2 cp`` (load-balanced causal CP)."""
    units = cfg.num_gpus // cfg.tp
    limit = coster.limit(cfg.tp)
    divisors = [c for c in range(1, units + 1) if units % c == 0]
    options = [cfg.cp] if cfg.cp is not None else divisors
    for c in options:
        s = -(-seq_len // (2 * c)) * (2 * c) if c > 1 else seq_len
        if s // c <= limit:
            try:
                fields = dict(num_gpus=cfg.num_gpus, tp=cfg.tp, cp=c, seq_len=s)
                make_plan(model, global_batch=units // c, **fields)
            except PlanError as exc:
                raise VarlenError(f"static plan: {exc}") from None
            # Megatron's micro_batch_size: as many seq_len sequences as fit memory.
            return StaticPlan(cfg.tp, c, units // c, s, max(1, limit // (s // c)))
    if cfg.cp is not None:
        ok = [c for c in divisors if -(-seq_len // (2 * c)) * 2 <= limit or seq_len <= limit]
        allowed = f"--cp in {{{', '.join(map(str, ok))}}}, or " if ok else ""
        raise VarlenError(
            f"static plan: seq_len/cp = {seq_len // cfg.cp} tokens per rank exceeds the memory "
            f"limit of {limit} at tp={cfg.tp}; allowed: {allowed}a smaller --seq-len"
        )
    raise VarlenError(
        f"seq_len={seq_len} does not fit: {limit} tokens per rank at tp={cfg.tp} times "
        f"{units} TP groups; allowed: more GPUs, larger --tp, or a smaller --seq-len"
    )


def simulate_varlen(model: ModelConfig, cost_model: CostModel, cfg: VarlenConfig) -> VarlenResult:
    """Simulate ``cfg.steps`` steps of every strategy on the same sampled documents."""
    try:
        units = cfg.num_gpus // cfg.tp
        make_plan(model, num_gpus=cfg.num_gpus, tp=cfg.tp, global_batch=units, seq_len=2 * cfg.tp)
    except PlanError as exc:
        raise VarlenError(str(exc)) from None
    seq_len = cfg.seq_len or cfg.lengths.max_length
    if seq_len is None:
        raise VarlenError(
            f"--lengths {cfg.lengths.spec} has no maximum length; allowed: give --seq-len "
            "(longer documents are cut into seq_len pieces) or a bounded distribution "
            "(e.g. lognormal:MEDIAN:SIGMA:MAX)"
        )
    gpn = cost_model.system.gpus_per_node
    block = math.gcd(cfg.num_gpus, gpn)
    block = block if block % cfg.tp == 0 and block >= cfg.tp else cfg.tp
    mem = (cfg.recompute, cfg.memory_fraction, cfg.attn_backend)
    probe = VarlenCoster(model, cost_model, cfg.num_gpus, (), 0, *mem)
    if probe.limit(cfg.tp) <= 0:
        gib = probe.state_bytes(cfg.tp) / 2**30
        raise VarlenError(
            f"model states of {model.id} take {gib:.1f} GiB per GPU at tp={cfg.tp}, leaving "
            "no memory for activations; allowed: larger --tp or more GPUs"
        )
    tps: tuple[int, ...] = (cfg.tp,)
    configs: list[_Config] = []
    if "hydraulis" in cfg.strategies:
        configs, extra = hydraulis_configs(probe, cfg.tp, block)
        tps = tuple(sorted({cfg.tp, *extra}))
    coster = VarlenCoster(model, cost_model, cfg.num_gpus, tps, seq_len, *mem)
    static = choose_static_plan(coster, model, cfg, seq_len)
    steps = sample_steps(cfg.lengths, cfg.tokens_per_step, cfg.steps, cfg.seed, seq_len)

    planners = {
        "hydraulis": lambda L: hydraulis_lanes(coster, cfg.tp, L, configs, block),
        "bytescale": lambda L: (
            bytescale_lanes(coster, cfg.tp, L),
            _bytescale_layout(coster, cfg.tp, L),
        ),
        "flexsp": lambda L: flexsp_lanes(coster, cfg.tp, L),
    }
    results: dict[str, StrategyResult] = {
        "static": StrategyResult("static", [], 0.0),
        **{n: StrategyResult(n, [], 0.0) for n in cfg.strategies if n != "static"},
    }
    for L in steps:
        t0 = time.perf_counter()
        base = evaluate(coster, static_lanes(static, L), L, f"dp{static.dp}cp{static.cp}")
        results["static"].plan_wall_s += time.perf_counter() - t0
        results["static"].outcomes.append(base)
        unpadded: StepOutcome | None = None
        for name, planner in planners.items():
            if name not in results:
                continue
            t0 = time.perf_counter()
            lanes, layout = planner(L)
            out = evaluate(coster, lanes, L, layout)
            if unpadded is None:
                unpadded = evaluate(coster, static_lanes(static, L, padded=False), L, base.layout)
            if unpadded.step_s < out.step_s:
                out = unpadded
                out = StepOutcome(**{**out.__dict__, "fallback": True})
            results[name].plan_wall_s += time.perf_counter() - t0
            results[name].outcomes.append(out)
    # model_flops is dense (linear in tokens) + causal attention (tokens x seq_len): per step
    # the dense part of all tokens plus the attention of each document over itself.
    attn_per_sq = model_flops(model, 1, 1) - model_flops(model, 1, 0)
    flops = [
        model_flops(model, int(L.sum()), 0) + attn_per_sq * float(np.sum(L.astype(float) ** 2))
        for L in steps
    ]
    return VarlenResult(
        config=cfg,
        model_id=model.id,
        gpu_id=cost_model.system.gpu.id,
        static_plan=static,
        tokens_limit=coster.limit(cfg.tp),
        optimizer_s=coster.optimizer_s,
        steps=steps,
        results=results,
        peak_flops_per_s=cost_model.system.gpu.peak_flops_per_s("bf16"),
        flops_per_step=flops,
    )


__all__ = [
    "STRATEGIES",
    "FlexSPSolution",
    "Lane",
    "StaticPlan",
    "VarlenConfig",
    "VarlenCoster",
    "VarlenError",
    "VarlenResult",
    "bytescale_lanes",
    "evaluate",
    "ffd",
    "flexsp_buckets",
    "flexsp_lanes",
    "hydraulis_lanes",
    "make_varlen_config",
    "sample_steps",
    "simulate_varlen",
    "solve_flexsp_milp",
    "static_lanes",
]
