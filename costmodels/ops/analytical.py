"""The analytical cost model: every op kind, one call shape.

``predict(op) -> seconds`` and ``predict_many(frame) -> ndarray``. Rows are grouped by
op family and priced by the vectorised models in this package; scalar calls go
through the same code on length-1 arrays, so scalar and vectorised always agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from costmodels.ops.attention import attention_work, decode_work
from costmodels.ops.collectives import collective_work
from costmodels.ops.columns import Columns, frame_columns, op_columns, sparse_gemm_rows
from costmodels.ops.common import CHUNK_ROWS, Work, in_chunks
from costmodels.ops.elementwise import elementwise_work
from costmodels.ops.energy import PowerModel
from costmodels.ops.features import lookup
from costmodels.ops.gemm import gemm_work
from costmodels.ops.params import ArchParams, arch_params
from hardware_specs.registry import Catalog, System, load_catalog
from workloads.ops import (
    COLLECTIVE_KINDS,
    ELEMENTWISE_KINDS,
    SPARSITY_COLUMN,
    Op,
    OpKind,
    normalise_frame,
)

if TYPE_CHECKING:
    import pandas as pd

_ATTN_TILED = [
    OpKind.attn_fwd.value,
    OpKind.attn_bwd.value,
    OpKind.attn_fwdbwd.value,
    OpKind.attn_blocksparse_fwd.value,
    OpKind.attn_blocksparse_bwd.value,
]
_ELEMENTWISE = [k.value for k in ELEMENTWISE_KINDS]
_COLLECTIVES = [k.value for k in COLLECTIVE_KINDS]
_STR_COLUMNS = ("op", "dtype", "backend")
_FAMILY_OF_OP = {
    OpKind.gemm.value: "gemm",
    **{k: "tiled" for k in _ATTN_TILED},
    OpKind.attn_decode.value: "decode",
    **{k: "elementwise" for k in _ELEMENTWISE},
    **{k: "collective" for k in _COLLECTIVES},
}


class AnalyticalCostModel:
    """Roofline-plus-efficiency models for one system (GPU type and its node)."""

    def __init__(self, system: System, params: ArchParams | None = None, *, label: str = ""):
        self.system = system
        self.gpu = system.gpu
        self.params = params if params is not None else arch_params(system.gpu.architecture)
        self.label = label or f"analytical ({system.gpu.architecture} defaults)"
        self.power: PowerModel | None = None  # set when a profile carries an energy model

    @classmethod
    def for_gpu(
        cls,
        gpu_id: str,
        *,
        num_gpus: int | None = None,
        catalog: Catalog | None = None,
        hardware_file: str | Path | None = None,
    ) -> AnalyticalCostModel:
        """The uncalibrated model for ``--gpu ID`` in its reference node (profiles, own or
        shipped, come through :func:`costmodels.ops.select.get_cost_model`)."""
        cat = catalog if catalog is not None else load_catalog(hardware_file)
        return cls(cat.system(gpu_id, num_gpus))

    # --- prediction ------------------------------------------------------------------
    def work_columns(self, cols: Columns) -> Work:
        """Time, FLOPs and bytes for every row of a column dict (large inputs
        :data:`~costmodels.ops.common.CHUNK_ROWS` rows at a time: the same values, every row
        is priced on its own, with the arrays in the CPU caches and memory bounded)."""
        if len(cols["op"]) > CHUNK_ROWS:
            return in_chunks(self.work_columns, cols)
        kind = cols["op"]
        family = lookup(kind, _FAMILY_OF_OP)  # one pass over the distinct op names
        size = len(kind)
        time_s, flops, nbytes = np.zeros(size), np.zeros(size), np.zeros(size)
        gpu, p = self.gpu, self.params

        def put(mask: np.ndarray, work: Work) -> None:
            time_s[mask], flops[mask], nbytes[mask] = work.time_s, work.flops, work.bytes

        def sub(mask: np.ndarray, *names: str) -> list[np.ndarray]:
            return [cols[n][mask] for n in names]

        sparse = sparse_gemm_rows(cols)
        mask = (family == "gemm") & ~sparse
        if mask.any():
            put(mask, gemm_work(*sub(mask, "m", "n", "k", "batch", "dtype"), gpu, p.gemm))
        if sparse.any():
            from costmodels.ops.sparse_gemm import sparse_gemm_work

            kinds = cols[SPARSITY_COLUMN]
            for value in np.unique(kinds[sparse]):
                mask = sparse & (kinds == value)
                args = sub(mask, "m", "n", "k", "batch", "dtype")
                # the dense GEMM under every sparse model is this model's (its profile's)
                put(mask, sparse_gemm_work(*args, str(value), gpu, dense=p.gemm))
        mask = family == "tiled"
        if mask.any():
            args = sub(
                mask,
                "op",
                "batch",
                "seq_q",
                "seq_kv",
                "heads_q",
                "heads_kv",
                "head_dim",
                "causal",
                "backend",
                "dtype",
                "density",
                "block_size",
            )
            put(mask, attention_work(*args, gpu, p.attention))
        mask = family == "decode"
        if mask.any():
            args = sub(
                mask,
                "batch",
                "seq_q",
                "seq_kv",
                "heads_q",
                "heads_kv",
                "head_dim",
                "dtype",
                "backend",
            )
            put(mask, decode_work(*args, gpu, p.attention))
        mask = family == "elementwise"
        if mask.any():
            put(
                mask,
                elementwise_work(*sub(mask, "op", "m", "n", "bytes", "dtype"), gpu, p.elementwise),
            )
        mask = family == "collective"
        if mask.any():
            put(
                mask,
                collective_work(
                    *sub(mask, "op", "bytes", "ranks", "nodes"), self.system, p.collectives
                ),
            )
        return Work(time_s=time_s, flops=flops, bytes=nbytes)

    def predict_many(self, frame: pd.DataFrame, *, validated: bool = False) -> np.ndarray:
        """Seconds per row of an ops frame (validated first unless ``validated``)."""
        if not validated:
            frame = normalise_frame(frame)
        return self.work_columns(frame_columns(frame)).time_s

    def work_many(self, frame: pd.DataFrame, *, validated: bool = False) -> Work:
        if not validated:
            frame = normalise_frame(frame)
        return self.work_columns(frame_columns(frame))

    def predict(self, op: Op) -> float:
        """Seconds for one op."""
        return float(self.work_columns(op_columns(op)).time_s[0])

    def work(self, op: Op) -> Work:
        return self.work_columns(op_columns(op))
