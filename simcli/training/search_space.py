"""The plan space of the search: which knobs vary (:class:`SearchSpace`) and every plan
that passes the pruning rules, as integer columns (:func:`enumerate_plans`).

Pruning follows Galvatron (Miao et al. 2022) and Megatron-LM's own rules (see
:mod:`simcli.training.search`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodels.steps.training import hierarchical_split
from workloads.decompose import valid_tp_degrees
from workloads.models import ModelConfig
from workloads.plan import (
    CP_KINDS,
    MAX_PIPELINE_TASKS,
    PRECISIONS,
    RANK_ORDERS,
    RECOMPUTE,
    TP_COMMS,
    PlanError,
    TrainPlan,
)

SCHEDULES = ("1f1b", "interleaved")
# the tensor-core type each precision computes in
COMPUTE_DTYPE = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16": "bf16", "fp8": "fp8"}

# --------------------------------------------------------------------------- enumeration


@dataclass(frozen=True)
class SearchSpace:
    """Which knobs the search varies; the defaults are the whole (pruned) space."""

    max_tp: int | None = None  # default: GPUs per node (TP stays inside a node)
    tp: tuple[int, ...] | None = None  # only these degrees (default: all that pass)
    pp: tuple[int, ...] | None = None
    max_pp: int | None = None
    max_cp: int | None = None
    # Galvatron-style prune of hopeless context parallelism: below ~512 tokens per rank
    # the ring's KV exchanges no longer hide behind the attention blocks and the GEMMs
    # shrink (the cost model puts GPT-3 at seq 2048 >10% off the best from cp=8 on).
    min_tokens_per_cp_rank: int = 512
    max_micro_batch: int | None = None
    max_vpp: int | None = None
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    schedules: tuple[str, ...] = SCHEDULES
    cp_kinds: tuple[str, ...] = CP_KINDS
    # TP communication exposed or overlapped with the GEMMs (Ladder Residual changes the
    # model's architecture, so the search leaves it to `train --tp-comm ladder`)
    tp_comms: tuple[str, ...] = ("plain", "overlap")
    sequence_parallel: tuple[bool, ...] = (True, False)
    precision: str = "bf16-mixed"
    # shares of the optimizer state offloaded to the host CPU (ZeRO-Offload); (0.0,): none
    optimizer_offload: tuple[float, ...] = (0.0,)
    # rank layouts (workloads.plan.RANK_ORDERS): Megatron's, or also Llama 3's DP-outermost
    rank_orders: tuple[str, ...] = ("tp-cp-dp-pp",)
    # memory options applied to every plan (not searched): fp8 primary weights and the
    # gradient buffer's dtype (None: the precision's default)
    fp8_params: bool = False
    grad_reduce_dtype: str | None = None

    def __post_init__(self) -> None:
        for name, values, allowed in (
            ("recompute", self.recompute, RECOMPUTE),
            ("schedule", self.schedules, SCHEDULES),
            ("cp_kind", self.cp_kinds, CP_KINDS),
            ("tp_comm", self.tp_comms, TP_COMMS),
            ("zero", self.zero, (0, 1, 2, 3)),
        ):
            bad = [x for x in values if x not in allowed]
            if bad or not values:
                raise PlanError(
                    f"{name} choices {list(values)} are invalid; allowed: "
                    f"{', '.join(map(str, allowed))}"
                )
        if self.precision not in PRECISIONS:
            raise PlanError(
                f"precision {self.precision!r} is invalid; allowed: {', '.join(PRECISIONS)}"
            )
        if not self.optimizer_offload or any(not 0 <= f <= 1 for f in self.optimizer_offload):
            raise PlanError(
                f"optimizer offload shares {list(self.optimizer_offload)} are invalid; "
                "allowed: values in [0, 1]"
            )
        if self.fp8_params and self.precision != "fp8":
            raise PlanError("fp8 params need precision fp8; allowed: --precision fp8")
        bad = [o for o in self.rank_orders if o not in RANK_ORDERS]
        if bad or not self.rank_orders:
            raise PlanError(
                f"rank orders {list(self.rank_orders)} are invalid; allowed: "
                f"{', '.join(RANK_ORDERS)}"
            )


COLUMNS = (
    "tp", "pp", "cp", "dp", "ep", "vpp", "mb", "m", "zero", "rec", "sp", "kind", "tpc", "trim",
    "off", "ord",
)  # fmt: skip
# ``off``: the optimizer-offload share in percent (0..100); ``ord``: RANK_ORDERS index

# Stage layouts where pp * vpp does not divide the layers: layers removed from the first
# and the last model chunk of an otherwise even split (code -> (first, last)). 1: both
# one lighter (Llama 3 405B: 126 layers on 16 stages, arXiv:2407.21783 sec. 3.3.2);
# 2: the last (Megatron's --account-for-loss-in-pipeline-split); 3: the first
# (--account-for-embedding-in-pipeline-split). A chunk trimmed to 0 holds the embedding
# or the LM head and loss alone.
TRIMS: tuple[tuple[int, int], ...] = ((0, 0), (1, 1), (0, 1), (1, 0))


def trim_layers(trim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Layers the first and the last chunk hold fewer, per TRIMS code (arrays)."""
    table = np.array(TRIMS)
    return table[trim, 0], table[trim, 1]


def stage_trims(layers: int, chunks: int) -> list[int]:
    """TRIMS codes that make ``chunks`` model chunks hold ``layers``: the even split when it
    divides, else the trimmed layouts that do (none for one chunk)."""
    if layers % chunks == 0:
        return [0]
    if chunks == 1:
        return []
    return [
        code
        for code, (first, last) in enumerate(TRIMS)
        if code and (layers + first + last) % chunks == 0 and (layers + first + last) >= chunks
    ]


def trimmed_split(layers: int, chunks: int, trim: int) -> tuple[int, ...] | None:
    """The layer_split of a TRIMS layout (None for the even one)."""
    if trim == 0:
        return None
    first, last = TRIMS[trim]
    base = (layers + first + last) // chunks
    split = [base] * chunks
    split[0] -= first
    split[-1] -= last
    return tuple(split)


def even_on_nodes(group: int, gpus_per_node: int) -> bool:
    """A group of ``group`` consecutive ranks sits on whole nodes or inside one: its size
    divides the node or is a multiple of it (the collective models need an even split)."""
    return gpus_per_node % group == 0 or group % gpus_per_node == 0


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_plans(
    model: ModelConfig,
    num_gpus: int,
    seq_len: int,
    global_batch: int,
    gpus_per_node: int,
    space: SearchSpace | None = None,
) -> dict[str, np.ndarray]:
    """Every plan of the pruned space as columns of equal length (see ``COLUMNS``:
    ``rec`` indexes RECOMPUTE, ``kind`` CP_KINDS, ``sp`` is 0/1; ``vpp == 1`` is 1F1B)."""
    space = space or SearchSpace()
    max_tp = space.max_tp or (max(space.tp) if space.tp else gpus_per_node)
    layers = model.num_layers
    blocks: list[np.ndarray] = []
    rec_codes = [RECOMPUTE.index(r) for r in space.recompute]
    offs = sorted({int(round(100 * f)) for f in space.optimizer_offload})
    ords = [RANK_ORDERS.index(o) for o in space.rank_orders]
    for tp in valid_tp_degrees(model):
        if tp > max_tp or num_gpus % tp or (space.tp and tp not in space.tp):
            continue
        if not even_on_nodes(tp, gpus_per_node):
            continue  # a TP group would straddle two nodes unevenly (e.g. TP 3 on 8-GPU nodes)
        for pp in _divisors(num_gpus // tp):
            if not stage_trims(layers, pp) or (space.max_pp and pp > space.max_pp):
                continue
            if space.pp and pp not in space.pp:
                continue
            for cp in _divisors(num_gpus // (tp * pp)):
                if cp > 1 and (
                    not even_on_nodes(tp * cp, gpus_per_node)
                    or seq_len % (2 * cp)
                    or (space.max_cp and cp > space.max_cp)
                    or seq_len // cp < space.min_tokens_per_cp_rank
                ):
                    continue
                dp = num_gpus // (tp * pp * cp)
                if global_batch % dp:
                    continue
                kinds = [0]
                if cp > 1:
                    heads = model.num_heads // tp
                    u, r = hierarchical_split(cp, tp, gpus_per_node)
                    skip = {
                        "ulysses": heads % cp != 0,
                        # a real split only (else it is ring or Ulysses), heads over u
                        "hierarchical": u == 1 or r == 1 or heads % u != 0,
                    }
                    kinds = [CP_KINDS.index(k) for k in space.cp_kinds if not skip.get(k)]
                    if not kinds:
                        continue
                eps = [1]
                if model.num_experts > 1:
                    eps = [e for e in _divisors(dp) if model.num_experts % e == 0]
                # ZeRO shards over the dp * cp group (Megatron-LM: DP with CP)
                zeros = [z for z in space.zero if z == 0 or dp * cp > 1]
                if not zeros:
                    continue
                # Megatron's sequence parallelism splits each CP rank's tokens over TP
                sps = [1, 0] if tp > 1 and (seq_len // cp) % tp == 0 else [0]
                sps = [s for s in sps if bool(s) in space.sequence_parallel] or sps[:1]
                tpcs = [TP_COMMS.index(c) for c in space.tp_comms] if tp > 1 else [0]
                for mb in _divisors(global_batch // dp):
                    if space.max_micro_batch and mb > space.max_micro_batch:
                        continue
                    m = global_batch // (dp * mb)
                    layouts = []  # (vpp, trim)
                    if "1f1b" in space.schedules:
                        layouts += [(1, t) for t in stage_trims(layers, pp)]
                    if "interleaved" in space.schedules and pp > 1 and m % pp == 0:
                        layouts += [
                            (v, t)
                            for v in range(2, (layers + 2) // pp + 1)
                            if not (space.max_vpp and v > space.max_vpp)
                            for t in stage_trims(layers, pp * v)
                        ]
                    # the event simulator's bound (workloads.plan.MAX_PIPELINE_TASKS)
                    layouts = [(v, t) for v, t in layouts if m * pp * v <= MAX_PIPELINE_TASKS]
                    if not layouts:
                        continue
                    grid = np.stack(
                        np.meshgrid(
                            np.arange(len(layouts)), zeros, rec_codes, sps, kinds, eps, tpcs,
                            offs, ords if pp > 1 and dp > 1 else ords[:1], indexing="ij",
                        ),
                        axis=-1,
                    ).reshape(-1, 9)  # fmt: skip
                    lay = np.array(layouts, dtype=np.int64)[grid[:, 0]]
                    block = np.empty((len(grid), len(COLUMNS)), dtype=np.int64)
                    block[:, 0:5] = (tp, pp, cp, dp, 0)
                    block[:, 4] = grid[:, 5]
                    block[:, 5] = lay[:, 0]
                    block[:, 6] = mb
                    block[:, 7] = m
                    block[:, 8:12] = grid[:, 1:5]
                    block[:, 12] = grid[:, 6]
                    block[:, 13] = lay[:, 1]
                    block[:, 14] = grid[:, 7]
                    block[:, 15] = grid[:, 8]
                    blocks.append(block)
    table = np.concatenate(blocks) if blocks else np.zeros((0, len(COLUMNS)), np.int64)
    return {c: table[:, i] for i, c in enumerate(COLUMNS)}


def select_rows(table: dict[str, np.ndarray], idx: np.ndarray | slice) -> dict[str, np.ndarray]:
    return {k: v[idx] for k, v in table.items()}


def plan_from_row(
    table: dict[str, np.ndarray],
    i: int,
    *,
    num_gpus: int,
    seq_len: int,
    global_batch: int,
    precision: str,
    layer_split: tuple[int, ...] | None = None,
    num_layers: int | None = None,
    fp8_params: bool = False,
    grad_reduce_dtype: str | None = None,
) -> TrainPlan:
    """The TrainPlan of row ``i`` of an enumerated table (``layer_split`` replaces the
    row's stage layout)."""
    tp, pp, vpp = int(table["tp"][i]), int(table["pp"][i]), int(table["vpp"][i])
    if layer_split is None and "trim" in table and int(table["trim"][i]):
        if num_layers is None:
            raise ValueError("a trimmed stage layout needs num_layers")
        layer_split = trimmed_split(num_layers, pp * vpp, int(table["trim"][i]))
    return TrainPlan(
        num_gpus=num_gpus,
        tp=tp,
        pp=pp,
        cp=int(table["cp"][i]),
        dp=int(table["dp"][i]),
        ep=int(table["ep"][i]),
        vpp=vpp,
        zero=int(table["zero"][i]),  # type: ignore[arg-type]
        micro_batch=int(table["mb"][i]),
        global_batch=global_batch,
        seq_len=seq_len,
        pp_schedule="interleaved" if vpp > 1 else "1f1b",
        recompute=RECOMPUTE[int(table["rec"][i])],  # type: ignore[arg-type]
        sequence_parallel=bool(table["sp"][i]) if tp > 1 else False,
        precision=precision,  # type: ignore[arg-type]
        cp_kind=CP_KINDS[int(table["kind"][i])],  # type: ignore[arg-type]
        tp_comm=TP_COMMS[int(table["tpc"][i])] if tp > 1 else "plain",  # type: ignore[arg-type]
        layer_split=layer_split,
        optimizer_offload=int(table["off"][i]) / 100 if "off" in table else 0.0,
        rank_order=RANK_ORDERS[int(table["ord"][i])] if "ord" in table else "tp-cp-dp-pp",  # type: ignore[arg-type]
        fp8_params=fp8_params,
        grad_reduce_dtype=grad_reduce_dtype,  # type: ignore[arg-type]
    )
