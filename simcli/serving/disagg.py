"""Prefill/decode disaggregation: separate prefill and decode pools joined by KV transfers.

Splitwise (Patel et al., ISCA 2024) and DistServe (Zhong et al., OSDI 2024) run prompts and
token generation on different replicas, so long prefills never stall decode iterations and
each pool gets its own parallelism (``--prefill-tp``, ``--decode-tp``) and size.

**Flow.** A request is routed (the run's router) to a prefill replica, which runs its
prefill with the run's scheduler and samples its first token. Its KV cache then moves to a
decode replica: the prefill replica keeps the blocks until the transfer completes
(DistServe's pull: a decode replica takes a transfer only when it has the blocks for it and
a batch seat, so a full decode pool pushes back on the prefill pool, whose KV fills with
finished prompts). Waiting transfers are served first come, first served, each to the decode
engine the decode router picks among those with room (``kv_aware``: most free KV blocks;
``least_outstanding``; ``round_robin``). The first token reaches the user with the KV: TTFT
counts queueing, prefill, waiting for decode room and the transfer.

**Transfer time.** ``kv_bytes_per_token x prompt tokens`` (the smaller of the two pools'
per-token KV bytes: a KV head replicated over TP ranks is moved once), split over
``min(prefill GPUs, decode GPUs)`` GPU pairs that send in parallel (each GPU owns its
shard of the heads and its own NIC or NVLink port), each priced as one ``send_recv`` by the
cost model (:mod:`costmodels.ops.collectives`: one GPU's NIC(s) between nodes,
``--kv-transfer inter``; the node's NVLink/NVSwitch port when the pools share a node,
``intra``; ``simcli serve``'s default is ``intra`` when every GPU of both pools fits in one
node, else ``inter``). Transfers leaving one prefill replica, or entering one decode replica,
share its links: each replica's link is a FIFO resource, a transfer starts when both ends
are free.

**Pools of two GPU types** (``DisaggConfig.prefill_gpu``/``decode_gpu``; Splitwise-HA's
H100 prompt and A100 token machines, Patel et al. ISCA 2024) never share a node, so the
link is always ``inter``, and each lane is priced by both pools' cost models -- each over
its own reference node's NIC (DGX A100: 200 Gb/s HDR per GPU; DGX H100: 400 Gb/s NDR) --
taking the slower (:meth:`KVTransferModel.slowest_of`). Both pools must store the cache
alike (:func:`check_compatible`: one model, one KV dtype). Each pool's GPUs, price, cost
and energy are reported on their own (:func:`pool_summary`).

**Layer-by-layer overlap** (``kv_transfer_overlap``; DistServe and Splitwise send each
layer's KV as soon as it is computed): with ``L`` layers, a prefill of ``c`` seconds and a
transfer of ``t`` seconds, layer ``i`` is sent after its compute and the previous layer's
send, so the transfer ends ``max(t / L, t - c (L - 1) / L)`` after the prefill (a pipeline
of L stages). The overlap applies only when the transfer starts as soon as the prefill ends
(a decode engine had room and the links were free); a transfer that waited is sent whole.
The prefill iteration's time ``c`` is that of the whole batch that finished the prompt
(its last chunk under chunked prefill).

**Simplifications.** The transfer does not slow the iterations running beside it on
either side; the decode replica's blocks for a transfer are taken when it starts; the
copy of the first token's KV is folded into the decode replica's first iteration.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcli.serving.requests import Sequence
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, normalise_frame

if TYPE_CHECKING:
    from simcli.serving.engine import Engine
    from simcli.serving.metrics import Metrics
    from simcli.serving.replica import Replica


class DisaggConfig(BaseModel):
    """Pool sizes and the KV link of a disaggregated deployment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefill_replicas: int = Field(gt=0)
    decode_replicas: int = Field(gt=0)
    prefill_gpus_per_replica: int | None = Field(
        default=None, gt=0, description="tp x pp of a prefill replica (default: the run's)"
    )
    decode_gpus_per_replica: int | None = Field(default=None, gt=0)
    kv_transfer: Literal["intra", "inter"] = "inter"
    kv_transfer_overlap: bool = False
    decode_router: Literal["round_robin", "least_outstanding", "kv_aware"] = "kv_aware"
    # Heterogeneous pools (Splitwise-HA: H100 prompt machines, A100 token machines): each
    # pool's GPU id and US$ per GPU-hour, for the per-pool outputs (None: the run's)
    prefill_gpu: str | None = None
    decode_gpu: str | None = None
    prefill_price_per_gpu_hour: float | None = Field(default=None, ge=0)
    decode_price_per_gpu_hour: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _link(self) -> DisaggConfig:
        if self.heterogeneous and self.kv_transfer == "intra":
            raise ValueError(
                f"kv_transfer intra between prefill pool {self.prefill_gpu} and decode pool "
                f"{self.decode_gpu}: GPUs of two types never share a node; allowed: inter"
            )
        return self

    @property
    def heterogeneous(self) -> bool:
        """The pools run on different GPU types."""
        return (
            self.prefill_gpu is not None
            and self.decode_gpu is not None
            and self.prefill_gpu != self.decode_gpu
        )


class KVTransferModel:
    """Seconds to move a prompt's KV from a prefill to a decode replica."""

    GRID_MAX_TOKENS = 1 << 21

    def __init__(
        self,
        lane_seconds: Callable[[np.ndarray], np.ndarray],
        bytes_per_token: float,
        *,
        lanes: int = 1,
        layers: int = 1,
        overlap: bool = False,
    ) -> None:
        self.bytes_per_token = float(bytes_per_token)
        self.lanes = max(1, int(lanes))
        self.layers = max(1, int(layers))
        self.overlap = overlap
        grid = np.unique(np.geomspace(1, self.GRID_MAX_TOKENS, 400).astype(np.int64))
        secs = np.asarray(lane_seconds(grid * self.bytes_per_token / self.lanes), dtype=float)
        self._x = grid.tolist()
        self._y = secs.tolist()

    @classmethod
    def from_cost_model(
        cls,
        cost_model: Any,
        bytes_per_token: float,
        *,
        inter_node: bool,
        lanes: int = 1,
        layers: int = 1,
        overlap: bool = False,
        dtype: str = "bf16",
    ) -> KVTransferModel:
        """Each lane is one ``send_recv`` of the cost model between two GPUs, over the NIC
        (``inter_node``) or the node's fabric."""

        def lane_seconds(nbytes: np.ndarray) -> np.ndarray:
            n = len(nbytes)
            frame = pd.DataFrame(
                {
                    "op": np.full(n, "send_recv", dtype=object),
                    "dtype": np.full(n, dtype, dtype=object),
                    "bytes": np.maximum(1, np.ceil(nbytes)),
                    "ranks": np.full(n, 2.0),
                    "nodes": np.full(n, 2.0 if inter_node else np.nan),
                }
            )
            frame = normalise_frame(frame.reindex(columns=[*CSV_COLUMNS, *EXTRA_COLUMNS]))
            return np.asarray(cost_model.predict_many(frame, validated=True), dtype=float)

        return cls(lane_seconds, bytes_per_token, lanes=lanes, layers=layers, overlap=overlap)

    @classmethod
    def slowest_of(
        cls,
        cost_models: list[Any],
        bytes_per_token: float,
        *,
        lanes: int = 1,
        layers: int = 1,
        overlap: bool = False,
    ) -> KVTransferModel:
        """Pools on different GPU types (never in one node): each lane is one ``send_recv``
        between two nodes priced by *each* side's cost model (its reference node's NIC,
        e.g. DGX A100's 200 Gb/s HDR, DGX H100's 400 Gb/s NDR) and takes the slower: a
        transfer cannot leave or enter a node faster than that node's NIC."""
        sides = [
            cls.from_cost_model(cm, bytes_per_token, inter_node=True, lanes=lanes)
            for cm in cost_models
        ]

        def lane_seconds(nbytes: np.ndarray) -> np.ndarray:
            tokens = nbytes * lanes / bytes_per_token
            return np.max([[s.seconds(int(round(t))) for t in tokens] for s in sides], axis=0)

        return cls(lane_seconds, bytes_per_token, lanes=lanes, layers=layers, overlap=overlap)

    @classmethod
    def alpha_beta(
        cls,
        latency_s: float,
        bytes_per_s: float,
        bytes_per_token: float,
        **kw: Any,
    ) -> KVTransferModel:
        """A plain ``latency + bytes / bandwidth`` link per lane (tests, what-ifs)."""
        return cls(lambda b: latency_s + b / bytes_per_s, bytes_per_token, **kw)

    def seconds(self, tokens: int) -> float:
        """Transfer time of ``tokens`` tokens of KV (linear between grid points; the
        alpha-beta price is linear in bytes)."""
        x, y = self._x, self._y
        i = bisect.bisect_left(x, tokens)
        if i < len(x) and x[i] == tokens:
            return y[i]
        i = min(max(i, 1), len(x) - 1)
        x0, x1 = x[i - 1], x[i]
        return y[i - 1] + (y[i] - y[i - 1]) * (tokens - x0) / (x1 - x0)

    def exposed_s(self, transfer_s: float, prefill_s: float) -> float:
        """What a layer-by-layer transfer adds after a prefill of ``prefill_s``."""
        if not self.overlap:
            return transfer_s
        L = self.layers
        return max(transfer_s / L, transfer_s - prefill_s * (L - 1) / L)


class TransferDone:
    """Event: a prompt's KV reached its decode engine."""

    __slots__ = ("time_s", "seq", "blocks", "src", "dst", "coordinator")

    def __init__(
        self,
        time_s: float,
        seq: Sequence,
        blocks: int,
        src: Engine,
        dst: Engine,
        coordinator: Disaggregation,
    ) -> None:
        self.time_s = time_s
        self.seq = seq
        self.blocks = blocks
        self.src = src
        self.dst = dst
        self.coordinator = coordinator

    def handle(self, sim: object) -> list:
        return self.coordinator.arrived(self, self.time_s)


class TransferStats:
    def __init__(self) -> None:
        self.count = 0
        self.transfer_s = 0.0  # link time (whole transfer)
        self.exposed_s = 0.0  # added after the prefill (less with overlap)
        self.wait_s = 0.0  # prefill end to transfer start (decode room, links)
        self.max_transfer_s = 0.0
        self.bytes = 0.0


class Disaggregation:
    """Moves prefilled sequences from the prefill pool to the decode pool."""

    def __init__(
        self,
        config: DisaggConfig,
        prefill: list[Replica],
        decode: list[Replica],
        transfer: KVTransferModel,
        max_seqs: int,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.prefill = prefill
        self.decode = decode
        self.transfer = transfer
        self.max_seqs = max_seqs
        self.metrics = metrics
        self.pending: deque[tuple[Sequence, Engine, float, float]] = deque()
        self.stats = TransferStats()
        self.link_free: dict[int, float] = {}  # id(replica) -> time its link is free
        self.rr = 0
        self.engines = [e for r in decode for e in r.engines]
        for r in prefill:
            r.role = "prefill"
            r.hold_kv = True
            r.handoff = self.handoff
        for r in decode:
            r.role = "decode"
            r.on_free = self.pump

    def handoff(self, seq: Sequence, now_s: float, src: Engine, prefill_s: float) -> list:
        self.pending.append((seq, src, now_s, prefill_s))
        return self.pump(now_s)

    def _choose(self, blocks: int) -> Engine | None:
        fits = [e for e in self.engines if e.can_take_transfer(blocks, self.max_seqs)]
        if not fits:
            return None
        policy = self.config.decode_router
        if policy == "round_robin":
            n = len(self.engines)
            for j in range(n):
                e = self.engines[(self.rr + j) % n]
                if e in fits:
                    self.rr = (self.rr + j + 1) % n
                    return e
        if policy == "least_outstanding":
            return min(fits, key=lambda e: (e.replica.outstanding + e.in_transit, e.index))
        return max(fits, key=lambda e: e.kv.available_blocks)

    def pump(self, now_s: float) -> list:
        """Start every waiting transfer that has a decode engine with room, in order."""
        events: list = []
        pending = self.pending
        tr = self.transfer
        st = self.stats
        while pending:
            seq, src, ready_s, prefill_s = pending[0]
            blocks = self.engines[0].transfer_blocks(seq)
            dst = self._choose(blocks)
            if dst is None:
                break
            pending.popleft()
            dst.start_transfer_in(blocks)
            a, b = id(src.replica), id(dst.replica)
            start = max(now_s, self.link_free.get(a, 0.0), self.link_free.get(b, 0.0))
            full = tr.seconds(seq.ctx_tokens)
            exposed = tr.exposed_s(full, prefill_s) if start <= ready_s else full
            end = start + exposed
            self.link_free[a] = self.link_free[b] = end
            st.count += 1
            st.transfer_s += full
            st.exposed_s += exposed
            st.wait_s += start - ready_s
            st.bytes += seq.ctx_tokens * tr.bytes_per_token
            if full > st.max_transfer_s:
                st.max_transfer_s = full
            self.metrics.kv_transfer(end - ready_s)
            events.append(TransferDone(end, seq, blocks, src, dst, self))
        return events

    def arrived(self, ev: TransferDone, now_s: float) -> list:
        seq = ev.seq
        req = seq.request
        if req.first_token_s is None:
            req.first_token_s = now_s  # the first token leaves with the KV
        seq.last_token_s = now_s
        req.replica = ev.dst.replica.index
        events = ev.src.transfer_sent(seq, now_s)
        events.extend(ev.dst.transfer_arrived(seq, ev.blocks, now_s))
        events.extend(self.pump(now_s))
        return events


def check_compatible(pre: Any, dec: Any) -> None:
    """The decode pool must read the KV cache the prefill pool wrote: the same model and
    the same KV element type (a block moves byte for byte; vLLM's disaggregated connectors
    and Splitwise send the cache as is). One line naming both when not."""
    pm, dm = getattr(pre, "model", None), getattr(dec, "model", None)
    if pm is not None and dm is not None and pm.id != dm.id:
        raise ValueError(
            f"the prefill pool serves {pm.id}, the decode pool {dm.id}; allowed: one model "
            "in both pools (the KV cache moves between them)"
        )
    pk, dk = getattr(pre, "kv_cache_dtype", None), getattr(dec, "kv_cache_dtype", None)
    if pk is not None and dk is not None and pk != dk:
        raise ValueError(
            f"the prefill pool stores its KV cache in {pk}, the decode pool in {dk}; "
            "allowed: one KV cache dtype in both pools (--kv-cache-dtype a GPU of each pool "
            "supports)"
        )


def default_transfer(
    dis: DisaggConfig, pre: Any, dec: Any, pre_gpus: int, dec_gpus: int
) -> KVTransferModel:
    """The KV transfer of ``dis`` priced by the pools' op cost models: ``min(pre_gpus,
    dec_gpus)`` lanes of ``send_recv`` over the NIC (``inter``) or the node's fabric
    (``intra``); pools of two GPU types over the slower of their nodes' NICs
    (:meth:`KVTransferModel.slowest_of`)."""
    check_compatible(pre, dec)
    models = [getattr(pre, "cost_model", None)]
    if dis.heterogeneous:
        models.append(getattr(dec, "cost_model", None))
    if any(cm is None for cm in models):
        raise ValueError(
            "disaggregation needs a KV transfer model: pass kv_transfer= (the step model has "
            "no cost_model to price send_recv)"
        )
    kw: dict[str, Any] = dict(
        lanes=min(pre_gpus, dec_gpus),
        layers=getattr(getattr(pre, "model", None), "num_layers", 1),
        overlap=dis.kv_transfer_overlap,
    )
    # a KV head replicated over TP ranks is moved once: the smaller per-token footprint
    bytes_per_token = min(float(pre.kv_bytes_per_token), float(dec.kv_bytes_per_token))
    if dis.heterogeneous:
        return KVTransferModel.slowest_of(models, bytes_per_token, **kw)
    return KVTransferModel.from_cost_model(
        models[0], bytes_per_token, inter_node=dis.kv_transfer == "inter", **kw
    )


def pool_summary(
    dis: DisaggConfig | None,
    prefill: list[Replica],
    decode: list[Replica],
    duration_s: float,
    price_per_gpu_hour: float | None,
) -> dict[str, Any]:
    """Per-pool keys of a disaggregated run (None when not disaggregated): each pool's GPU
    type, GPUs, price, GPU-hours, cost, and energy (its iterations by its own power model,
    its idle GPUs at its own idle power) when the run prices energy."""
    keys = ("gpu", "gpus", "price_per_gpu_hour", "gpu_hours", "cost_usd", "energy_kwh")
    out: dict[str, Any] = {f"{p}_{k}": None for p in ("prefill", "decode") for k in keys}
    if dis is None:
        return out
    # a meter both pools share cannot split its joules between them
    shared = {id(r.energy) for r in prefill} & {id(r.energy) for r in decode}
    for name, reps, gpu, price in (
        ("prefill", prefill, dis.prefill_gpu, dis.prefill_price_per_gpu_hour),
        ("decode", decode, dis.decode_gpu, dis.decode_price_per_gpu_hour),
    ):
        price = price if price is not None else price_per_gpu_hour
        gpus = sum(r.gpus for r in reps)
        hours = gpus * duration_s / 3600.0
        meters = {id(r.energy): r.energy for r in reps if r.energy is not None}
        joules = None
        if len(meters) == 1 and not shared & set(meters):
            meter = next(iter(meters.values()))
            busy_gpu_s = sum(e.busy_s * r.gpus / r.pp for r in reps for e in r.engines)
            idle = max(gpus * duration_s - busy_gpu_s, 0.0)
            joules = meter.busy_joules() + idle * meter.idle_w
        out |= {
            f"{name}_gpu": gpu,
            f"{name}_gpus": gpus,
            f"{name}_price_per_gpu_hour": price,
            f"{name}_gpu_hours": hours,
            f"{name}_cost_usd": hours * price if price is not None else None,
            f"{name}_energy_kwh": joules / 3.6e6 if joules is not None else None,
        }
    return out


__all__ = [
    "DisaggConfig",
    "Disaggregation",
    "KVTransferModel",
    "TransferDone",
    "TransferStats",
    "check_compatible",
    "default_transfer",
    "pool_summary",
]
