"""Registered op models: analytical, learned, energy, sparse GEMMs, sparse attention; the
op samplers and growers they share (see :mod:`costmodels.registry`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from costmodels.registry.base import FACTORS, GPU, Registered, choice, log_int, register
from workloads.ops import Op, ops_frame

# The learned correction is clipped to +-log 2 (LearnedCostModel's bound; the shipped
# profiles' residuals carry it): a prediction stays within a factor 2 of the analytical
# model either way, so where neighbouring shapes get corrections of opposite sign more
# work may cost down to exp(-2 log 2) = 1/4 of less work. That is the documented
# envelope of every model priced by a learned one.
LEARNED_BOUND = math.log(2.0)
LEARNED_ENVELOPE = 1.0 - math.exp(-2.0 * LEARNED_BOUND)


def _heads(rng: np.random.Generator) -> tuple[int, int]:
    hkv = choice(rng, (1, 2, 4, 8, 16, 32))
    return hkv * choice(rng, (1, 2, 4, 8)), hkv


def sample_gemm(rng: np.random.Generator, dtypes: Sequence[str] = ("bf16", "fp16")) -> Op:
    return Op(
        op="gemm",
        m=log_int(rng, 1, 65536),
        n=log_int(rng, 1, 65536),
        k=log_int(rng, 1, 65536),
        batch=log_int(rng, 1, 64),
        dtype=choice(rng, dtypes),
    )


def sample_op(rng: np.random.Generator) -> Op:
    """A valid op of any kind the analytical and learned models price."""
    family = choice(rng, ("gemm", "attn", "decode", "blocksparse", "collective", "elementwise"))
    half = choice(rng, ("bf16", "fp16"))
    if family == "gemm":
        return sample_gemm(rng, ("bf16", "fp16", "fp32", "tf32", "fp8"))
    if family in ("attn", "decode", "blocksparse"):
        hq, hkv = _heads(rng)
        shape = dict(heads_q=hq, heads_kv=hkv, head_dim=choice(rng, (64, 96, 128, 256)))
        if family == "decode":
            return Op(
                op="attn_decode",
                batch=log_int(rng, 1, 512),
                seq_q=log_int(rng, 1, 8),
                seq_kv=log_int(rng, 1, 262144),
                dtype=half,
                **shape,
            )
        if family == "attn":
            return Op(
                op=choice(rng, ("attn_fwd", "attn_bwd", "attn_fwdbwd")),
                batch=log_int(rng, 1, 16),
                seq_q=log_int(rng, 1, 32768),
                seq_kv=log_int(rng, 1, 32768),
                causal=bool(rng.integers(2)),
                backend=choice(rng, (None, "flash", "cudnn", "flex", "efficient")),
                dtype=half,
                **shape,
            )
        return Op(
            op=choice(rng, ("attn_blocksparse_fwd", "attn_blocksparse_bwd")),
            batch=log_int(rng, 1, 8),
            seq_q=log_int(rng, 1, 32768),
            seq_kv=log_int(rng, 1, 32768),
            density=float(rng.uniform(0.001, 1.0)),
            block_size=choice(rng, (64, 128)),
            dtype=half,
            **shape,
        )
    if family == "collective":
        kind = choice(rng, ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"))
        nodes = choice(rng, (1, 1, 2, 4))
        if rng.integers(5) == 0:
            kind, nodes = "send_recv", choice(rng, (1, 2))
        ranks = 2 if kind == "send_recv" else max(2, nodes * choice(rng, (1, 2, 4, 8)))
        return Op(op=kind, bytes=log_int(rng, 1, 2**33), ranks=ranks, nodes=nodes)
    kind = choice(rng, ("copy", "rmsnorm", "swiglu", "rope", "softmax", "adamw", "gelu"))
    if kind == "copy":
        return Op(op=kind, bytes=log_int(rng, 1, 2**34))
    if kind == "adamw":
        return Op(op=kind, n=log_int(rng, 1, 2**34), dtype=choice(rng, ("fp32", "bf16")))
    return Op(op=kind, m=log_int(rng, 1, 65536), n=log_int(rng, 1, 262144), dtype=half)


# Fields that measure an op's work, by op family.
SIZE_FIELDS = {
    "gemm": ("m", "n", "k", "batch"),
    "attn": ("batch", "seq_kv", "heads_q", "heads_kv", "head_dim"),
    "decode": ("batch", "seq_q", "seq_kv", "heads_q", "heads_kv", "head_dim"),
    "sparse": ("batch", "seq_q", "seq_kv", "heads_q", "head_dim", "density"),
    "collective": ("bytes",),
    "elementwise": ("m", "n", "bytes"),
}


def op_family(op: Op) -> str:
    kind = op.op.value
    if kind == "gemm":
        return "gemm"
    if kind == "attn_decode":
        return "decode"
    if kind.startswith("attn_blocksparse"):
        return "sparse"
    if kind.startswith("attn_"):
        return "attn"
    return "collective" if op.bytes is not None and op.ranks is not None else "elementwise"


def grow_op(op: Op, field: str, factor: float) -> Op | None:
    """``op`` with ``field`` grown by ``factor`` (at least by one), or None when that
    makes an invalid op (a KV head count that no longer divides the query heads).

    GEMM ``k`` and ``n`` (16-bit and 8-bit types) grow within their byte-alignment class:
    growing into a better alignment switches cuBLAS to faster kernels (TMA needs 16-byte
    rows: a real, measured speed-up), which is not more work for the same kernel."""
    value = getattr(op, field)
    if value is None:
        return None
    if field == "density":
        new: float = min(1.0, value * factor)
    else:
        new = int(math.ceil(value * factor))
        if new == value:
            new += 1
        if op.op.value == "gemm" and field in ("k", "n") and op.dtype.value != "fp32":
            elt = {"fp8": 1, "int8": 1, "bf16": 2, "fp16": 2}.get(op.dtype.value, 4)

            def align(v: int) -> int:
                return min((v * elt) & -(v * elt), 16)

            while align(new) != align(value):
                new += 1
    data = op.model_dump()
    data[field] = new
    if field == "heads_kv" and data["heads_q"] % new:
        return None
    if field == "heads_q" and new % data["heads_kv"]:
        return None
    return Op(**data)


# Decode packs each KV head's query rows (seq_q x query heads per KV head) into 64-row
# tiles (costmodels.ops.attention.decode_work). Past one tile, more KV heads repack the
# rows into fewer, partial tiles and cut the split-KV combine traffic, and the time can
# drop (by up to ~30%: 9 new tokens x 8 query heads per KV head, KV heads doubled, on a
# short cache). Decode inputs stay within one tile here, where the model is monotone;
# tests/costmodels/test_contract.py keeps the case beyond it as a known failure.
DECODE_ROWS_PER_TILE = 64


def in_domain(op: Op) -> bool:
    """Inputs the op models' monotonicity contract covers (see DECODE_ROWS_PER_TILE)."""
    if op.op.value == "attn_decode":
        return op.seq_q * op.heads_q / op.heads_kv <= DECODE_ROWS_PER_TILE
    return True


def _grow_any_op(op: Op, rng: np.random.Generator) -> Op:
    """One size of ``op`` grown (:func:`grow_op`); causal attention grows its query and
    key lengths together (bottom-right alignment: one more query alone shifts the
    diagonal, so earlier queries may see one key block less)."""
    family = op_family(op)
    fields = list(SIZE_FIELDS[family])
    if family == "attn":
        fields.append("seq" if op.causal else "seq_q")
    for field_ in rng.permutation(fields):
        factor = choice(rng, FACTORS)
        if field_ == "seq":
            more = max(1, int(op.seq_q * (factor - 1)))
            data = {**op.model_dump(), "seq_q": op.seq_q + more, "seq_kv": op.seq_kv + more}
            grown: Op | None = Op(**data)
        else:
            grown = grow_op(op, str(field_), factor)
        if grown is not None and in_domain(grown):
            return grown
    raise ValueError(f"no size of {op} can grow")


@lru_cache(maxsize=1)
def shipped_model():
    from costmodels.ops.select import get_cost_model

    return get_cost_model(GPU)


def _analytical():
    from costmodels.ops.analytical import AnalyticalCostModel

    return AnalyticalCostModel.for_gpu(GPU)


def _learned_unfitted():
    from costmodels.ops.learned import LearnedCostModel

    return LearnedCostModel(_analytical())


def _learned_frame(rng: np.random.Generator) -> pd.DataFrame:
    """bf16 GEMMs of 6 shape families, 'measured' as the analytical time times a smooth
    family-dependent factor and 3% noise: enough rows for grouped model selection."""
    ops = [sample_gemm(rng, ("bf16",)) for _ in range(60)]
    frame = ops_frame(ops)
    base = _analytical().predict_many(frame)
    family = np.arange(len(ops)) % 6
    frame["family"] = [f"f{f}" for f in family]
    frame["measured_s"] = base * (1.1 + 0.05 * family) * np.exp(rng.normal(0.0, 0.03, len(ops)))
    return frame


def _energy():
    from costmodels.ops.energy import EnergyModel

    model = shipped_model()
    return EnergyModel.from_power(model, model.power)


def _energy_unfitted():
    from costmodels.ops.energy import EnergyModel

    power = shipped_model().power
    return EnergyModel(shipped_model().base, idle_w=power.idle_w, cap_w=power.cap_w)


def _energy_frame(rng: np.random.Generator) -> pd.DataFrame:
    """Power-suite-like rows: GEMMs and copies with times from the fitted analytical model
    and power from the shipped power model, with 2% noise."""
    ops = [sample_gemm(rng) for _ in range(12)]
    ops += [Op(op="copy", bytes=log_int(rng, 2**24, 2**32)) for _ in range(6)]
    frame = ops_frame(ops)
    model = shipped_model()
    work = model.base.work_many(frame)
    frame["measured_s"] = work.time_s
    watts = model.power.power_w(work, frame["dtype"].to_numpy(dtype=str), model.gpu)
    frame["avg_power_w"] = watts * np.exp(rng.normal(0.0, 0.02, len(ops)))
    return frame


register(
    Registered(
        name="ops/analytical",
        unit="s",
        summary="roofline + efficiency, every op kind (AnalyticalCostModel, uncalibrated H100)",
        build=_analytical,
        sample=sample_op,
        grow=_grow_any_op,
        many=ops_frame,
    )
)

register(
    Registered(
        name="ops/learned",
        unit="s",
        summary="analytical x exp(clipped learned log-ratio) (LearnedCostModel, shipped H100)",
        build=shipped_model,
        sample=sample_op,
        grow=_grow_any_op,
        many=ops_frame,
        monotone_rtol=LEARNED_ENVELOPE,
        tolerance_note="costmodels.ops.learned: corrections clipped to +-log 2",
        unfitted=_learned_unfitted,
        fit_frame=_learned_frame,
    )
)

register(
    Registered(
        name="ops/energy",
        unit="J",
        summary="joules per op: shipped H100 model's work and its fitted PowerModel",
        build=_energy,
        sample=sample_op,
        grow=_grow_any_op,
        many=ops_frame,
        # energy = min(cap t, idle t + compute_w min(flops / peak, t) + memory_w min(bytes /
        # hbm, t)) is non-decreasing in time, FLOPs and bytes: its envelope is the time's
        monotone_rtol=LEARNED_ENVELOPE,
        tolerance_note="the learned time's envelope (energy is monotone in time, FLOPs, bytes)",
        unfitted=_energy_unfitted,
        fit_frame=_energy_frame,
    )
)


# --------------------------------------------------------------------------- sparse ops

SPARSE_GEMMS = {
    "2:4": ("2:4", "fused"),
    "unstructured": ("unstructured:0.8", "fused"),
    "cats": ("cats:0.3", "fused"),
    "cats-gather": ("cats:0.3", "gather"),
}


def _sparse_gemm(sparsity: str, kernel: str) -> Callable[[], Any]:
    def build():
        from costmodels.ops.sparse_gemm import SparseGemmModel

        return SparseGemmModel(GPU, sparsity, cats_kernel=kernel)

    return build


# Weight sides (n, k) of the sparse GEMMs are multiples of 16: torch's cuSPARSELt 2:4 path
# refuses others for 16-bit types (SparseSemiStructuredTensorCUSPARSELT's shape
# constraints), and layers' are anyway. Off that grid the models step with byte alignment
# alone: 2:4 runs the dense tiles over k / 2, so k = 8 mod 16 takes the dense model's
# misaligned-row efficiency (up to ~4x slower than k + 8), and CATS reads its active
# neurons rounded up to 8, so an unaligned layer becomes an aligned, faster GEMM.
WEIGHT_MULTIPLE = 16


def _weight_sides(op: Op) -> Op:
    m = WEIGHT_MULTIPLE
    return op.model_copy(update={"n": m * -(-op.n // m), "k": m * -(-op.k // m)})


def _sample_weight_gemm(rng: np.random.Generator) -> Op:
    return _weight_sides(sample_gemm(rng))


def _grow_sparse_gemm(op: Op, rng: np.random.Generator) -> Op:
    """More tokens (m), a bigger layer (n, k, kept multiples of :data:`WEIGHT_MULTIPLE`) or
    more products. The smaller of n and k grows at most to the larger: CATS's neurons are
    the layer's intermediate dimension, the larger of the two, and a layer whose other side
    overtakes it is another layer."""
    for field_ in rng.permutation(SIZE_FIELDS["gemm"]):
        grown = grow_op(op, str(field_), choice(rng, FACTORS))
        if grown is None:
            continue
        grown = _weight_sides(grown)
        small = "n" if op.n < op.k else "k"
        if field_ == small and getattr(grown, small) > max(op.n, op.k):
            continue
        return grown
    return grow_op(op, "m", 2.0)


# 2:4 is not monotone in tokens, as measured: cuSPARSELt's default heuristic runs a narrow
# kernel up to 128 tokens and a faster wide one from 256 (H100, all 52 layer shapes of
# calibrate/data/h100-sxm/sparse_gemm.csv: 0.60-1.02x the 128-token time at 256). The
# model's drop is at most narrow/wide memory factor (0.4 / 0.815 = 0.49x), so its
# envelope is 0.55; every other growth (n, k, batch, tokens within a kernel) stays monotone.
SPARSE_MONOTONE_RTOL = {"2:4": 0.55}
for _name, (_sparsity, _kernel) in SPARSE_GEMMS.items():
    register(
        Registered(
            name=f"ops/sparse_gemm/{_name}",
            unit="s",
            summary=f"sparse-weight GEMM, {_sparsity} ({_kernel} kernel; SparseGemmModel)",
            build=_sparse_gemm(_sparsity, _kernel),
            sample=_sample_weight_gemm,
            grow=_grow_sparse_gemm,
            many=ops_frame,
            monotone_rtol=SPARSE_MONOTONE_RTOL.get(_name, 0.0),
            tolerance_note="measured kernel switch at 128 -> 256 tokens"
            if _name in SPARSE_MONOTONE_RTOL
            else "",
        )
    )


@dataclass(frozen=True)
class SparseAttentionSample:
    """A pattern spec and shape; ``call()`` makes the :class:`SparseAttentionCall`."""

    spec: str
    seq: int
    heads_q: int
    heads_kv: int
    batch: int = 1
    head_dim: int = 128
    direction: str = "fwd"

    def call(self):
        from costmodels.ops.sparse_attention import SparseAttentionCall
        from workloads.sparsity import parse_pattern

        pattern = parse_pattern(self.spec)
        return SparseAttentionCall(
            table=pattern.tiles(self.seq, self.heads_kv),
            masks=pattern.tile_masks(self.seq, self.heads_kv)["main"],
            direction=self.direction,
            batch=self.batch,
            head_dim=self.head_dim,
            heads_q=self.heads_q,
            heads_kv=self.heads_kv,
        )


_SPARSE_SPECS = ("dense", "causal", "window:{w}", "topk:k={k}", "s2:local=2,stride={s}")


def _sample_sparse_attention(rng: np.random.Generator) -> Any:
    hkv = choice(rng, (1, 2, 4, 8))
    seq = log_int(rng, 256, 8192)
    spec = choice(rng, _SPARSE_SPECS).format(
        w=choice(rng, (256, 1024, 4096)), k=choice(rng, (2, 4, 8)), s=choice(rng, (4, 8))
    )
    if spec.startswith("window:") and int(spec.split(":")[1]) > seq:
        spec = "causal"
    return SparseAttentionSample(
        spec=spec,
        seq=seq,
        heads_q=hkv * choice(rng, (1, 2, 4)),
        heads_kv=hkv,
        batch=log_int(rng, 1, 4),
        head_dim=choice(rng, (64, 128)),
        direction=choice(rng, ("fwd", "bwd", "fwdbwd")),
    )


def _grow_sparse_attention(x: SparseAttentionSample, rng: np.random.Generator) -> Any:
    """More sequences (batch), wider heads (head_dim), a longer sequence of the same
    pattern, or more tiles of the same kinds: a window twice as long, twice the top-k
    blocks, half the S2 stride (a superset of the blocks).

    Not growth here, because the model says they may be cheaper: turning partial tiles
    into full ones (a window as long as the sequence into causal, causal into dense: a
    partial tile costs ~2.9x a full one, see the module docstring), and lengthening a
    top-k sequence (its random selection is drawn anew, so the backward's per-key-block
    work is another draw)."""
    what = choice(rng, ("batch", "head_dim", "seq", "tiles"))
    if what == "batch":
        return replace(x, batch=x.batch + log_int(rng, 1, 4))
    if what == "head_dim":
        return replace(x, head_dim=x.head_dim + choice(rng, (8, 32, 64)))
    if what == "seq" and not x.spec.startswith("topk:"):
        return replace(x, seq=x.seq + 128 * log_int(rng, 1, 16))
    spec = x.spec
    if spec.startswith("window:") and 2 * int(spec.split(":")[1]) <= x.seq:
        spec = f"window:{2 * int(spec.split(':')[1])}"
    elif spec.startswith("topk:k="):
        spec = f"topk:k={int(spec.split('=')[1]) * 2}"
    elif spec.startswith("s2:") and not spec.endswith("stride=1"):
        spec = f"s2:local=2,stride={int(spec.rsplit('=', 1)[1]) // 2}"
    else:  # dense, causal: no superset of the same kind of tiles
        return replace(x, batch=x.batch + 1)
    return replace(x, spec=spec)


def _sparse_attention():
    from costmodels.ops.sparse_attention import SparseAttentionModel

    return SparseAttentionModel(GPU)


register(
    Registered(
        name="ops/sparse_attention",
        unit="s",
        summary="tile-table block-sparse attention, FlexAttention (SparseAttentionModel)",
        build=_sparse_attention,
        sample=_sample_sparse_attention,
        grow=_grow_sparse_attention,
        as_input=SparseAttentionSample.call,
    )
)
