"""Features the learned corrections see, and op classes they are fitted per.

One feature vector for every op, built from the op's own sizes and the analytical
model's view of it (its time, FLOPs, bytes): trees ignore what does not matter for a
class. The same function serves fitting (calibrate) and prediction (run time), so the
two cannot drift apart.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from costmodels.ops.common import ELEMENT_BYTES, Work, by_dtype, distinct
from costmodels.ops.gemm import row_alignment
from hardware_specs.schema import Dtype

DTYPES = [d.value for d in Dtype]
BACKENDS = ["", "flash", "cudnn", "flex", "efficient"]
ELEMENTWISE = [
    "copy", "rmsnorm", "layernorm", "swiglu", "gelu", "rope", "softmax", "cross_entropy",
    "embedding", "residual_add", "adamw",
]  # fmt: skip
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]

# Op classes: each gets its own learned correction and its own fidelity line.
OP_CLASSES = {
    "gemm_half": "GEMM bf16/fp16",
    "gemm_fp32": "GEMM fp32/tf32",
    "gemm_fp8": "GEMM fp8/int8",
    "gemm_fp64": "GEMM fp64",
    "attn": "dense attention fwd / fwd+bwd",
    "decode": "decode attention",
    "blocksparse": "block-sparse attention",
    "elementwise": "memory-bound ops",
    "collective": "NCCL collectives",
    # the serving engines' kernels (FlashInfer), fitted apart so that the classes above
    # keep the corrections they had
    "attn_flashinfer": "FlashInfer prefill attention (paged/ragged, FA3 on Hopper)",
    "decode_flashinfer": "FlashInfer paged decode attention (CUDA-graph replays)",
}

#: (op class, backend) -> the class of that backend's rows (see :func:`op_class`)
_ENGINE_CLASS = {("attn", "flashinfer"): "attn_flashinfer",
                 ("decode", "flashinfer"): "decode_flashinfer"}  # fmt: skip
#: the engine kernels' classes: a profile's "all" figure leaves them out (it is the
#: figure of the profile's own suites, which the engine classes were fitted on top of)
ENGINE_CLASSES = tuple(_ENGINE_CLASS.values())


_CLASS_OF_OP = {
    **{k: "attn" for k in ("attn_fwd", "attn_bwd", "attn_fwdbwd")},
    "attn_decode": "decode",
    **{k: "blocksparse" for k in ("attn_blocksparse_fwd", "attn_blocksparse_bwd")},
    **{k: "elementwise" for k in ELEMENTWISE},
    **{k: "collective" for k in COLLECTIVES},
}
_GEMM_CLASS_OF_DTYPE = {
    "bf16": "gemm_half", "fp16": "gemm_half", "fp32": "gemm_fp32", "tf32": "gemm_fp32",
    "fp8": "gemm_fp8", "int8": "gemm_fp8", "fp64": "gemm_fp64",
}  # fmt: skip


def lookup(values: np.ndarray, table: dict[str, str], default: str = "") -> np.ndarray:
    """Map a string array through ``table`` via its distinct values (fast on big arrays)."""
    codes, uniq = distinct(values)  # over the distinct values: fast on big string arrays
    return np.array([table.get(str(u), default) for u in uniq] + [default], dtype=object)[codes]


def op_class(op: np.ndarray, dtype: np.ndarray, backend: np.ndarray | None = None) -> np.ndarray:
    """The op class of every row (see :data:`OP_CLASSES`); with ``backend``, a serving
    engine's kernels (FlashInfer) get a class of their own."""
    out = lookup(op, _CLASS_OF_OP)
    gemm = op == "gemm"
    if gemm.any():
        out[gemm] = lookup(dtype[gemm], _GEMM_CLASS_OF_DTYPE)
    if backend is not None and len(out):
        for (cls, name), own in _ENGINE_CLASS.items():
            rows = (backend == name) & (out == cls)
            if rows.any():
                out[rows] = own
    return out


#: decode backends that run cuDNN's decode kernel; "" is the default dispatch, which picks
#: cuDNN for decode on Hopper with torch 2.11 (every traced serving step in
#: calibrate/data/steps2-* did)
CUDNN_DECODE = ("cudnn", "")


def kernel_family(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Which kernel family a row runs: for GEMMs "aligned" or "unaligned" (k or n rows
    not 16-byte aligned: cuBLAS falls back from its TMA/wgmma kernels); for decode
    attention "cudnn" (cuDNN's kernel, also the default dispatch) or "flash" (flash and
    efficient, split-KV kernels); "" for other ops.

    A learned correction may be fitted per family within an op class when grouped CV
    says the split predicts better (see :class:`costmodels.ops.learned.LearnedCostModel`).
    """
    out = np.full(len(cols["op"]), "", dtype=object)
    gemm = np.flatnonzero(cols["op"] == "gemm")
    if len(gemm):
        elt = by_dtype(cols["dtype"][gemm], ELEMENT_BYTES, "features")
        align = np.minimum(
            row_alignment(cols["k"][gemm] * elt), row_alignment(cols["n"][gemm] * elt)
        )
        out[gemm] = "unaligned"
        out[gemm[align >= 16]] = "aligned"
    decode = np.flatnonzero(cols["op"] == "attn_decode")
    if len(decode) and "backend" in cols:
        backend = np.asarray(cols["backend"][decode]).astype(str)
        out[decode] = np.where(np.isin(backend, CUDNN_DECODE), "cudnn", "flash")
    return out


def _log(x: np.ndarray) -> np.ndarray:
    return np.log2(np.where(np.isnan(x), 1.0, np.maximum(x, 1.0)))


def _aligned(x: np.ndarray, to: int) -> np.ndarray:
    return np.where(np.isnan(x), 1.0, (np.mod(x, to) == 0).astype(float))


FEATURE_NAMES: list[str] = [
    "log_time", "log_flops", "log_bytes", "log_intensity",
    "log_m", "log_n", "log_k", "log_batch", "log_seq_q", "log_seq_kv", "log_heads_q",
    "log_group", "log_head_dim", "causal", "density", "log_block", "log_bytes_col",
    "ranks", "nodes", "align8", "align64", "align128", "row_align_k", "row_align_n", "row_align_m",
    "phase_bwd", "phase_fwdbwd",
    *[f"dtype_{d}" for d in DTYPES],
    *[f"backend_{b or 'default'}" for b in BACKENDS],
    *[f"ew_{e}" for e in ELEMENTWISE],
    *[f"coll_{c}" for c in COLLECTIVES],
]  # fmt: skip


class Features:
    """The columns of :func:`feature_matrix` for ``cols`` and their analytical ``work``,
    each computed when first asked for (``features(i)``, i indexing
    :data:`FEATURE_NAMES`) and kept: a correction reads only the few features its trees
    split on, and prediction builds only those. Same expressions as the matrix, so the
    same values bit for bit."""

    def __init__(self, cols: dict[str, np.ndarray], work: Work) -> None:
        self.cols, self.work = cols, work
        self._done: dict[int, np.ndarray] = {}

    def __call__(self, i: int) -> np.ndarray:
        col = self._done.get(i)
        if col is None:
            col = self._done[i] = _FEATURES[i](self)
        return col

    @cached_property
    def gemm_rows(self) -> np.ndarray:
        return self.cols["op"] == "gemm"

    @cached_property
    def elt(self) -> np.ndarray:
        return by_dtype(self.cols["dtype"], ELEMENT_BYTES, "features")

    @cached_property
    def dims(self) -> list[np.ndarray]:
        return [np.where(np.isnan(x), 1.0, x) for x in (self.cols[c] for c in "mnk")]

    def log(self, name: str) -> np.ndarray:
        key = f"log:{name}"
        got = self.__dict__.get(key)
        if got is None:
            src = self.work.flops if name == "flops" else self.work.bytes
            got = self.__dict__[key] = _log(src)
        return got

    def align(self, a: int) -> np.ndarray:
        return np.where(self.gemm_rows, np.prod([_aligned(d, a) for d in self.dims], axis=0), 1.0)

    def row_align(self, c: str) -> np.ndarray:
        return np.where(self.gemm_rows, np.log2(row_alignment(self.cols[c] * self.elt)), 4.0)

    def group(self) -> np.ndarray:
        hq, hkv = self.cols["heads_q"], self.cols["heads_kv"]
        group = np.where(np.isnan(hq) | np.isnan(hkv), 1.0, hq / np.where(np.isnan(hkv), 1.0, hkv))
        return np.log2(group)

    def equal(self, c: str, value: str) -> np.ndarray:
        return (self.cols[c] == value).astype(float)


def _is(c: str, value: str):
    return lambda f: f.equal(c, value)


# one function per name of FEATURE_NAMES, in order
_FEATURES = [
    lambda f: np.log2(np.maximum(f.work.time_s, 1e-9) * 1e9),
    lambda f: f.log("flops"),
    lambda f: f.log("bytes"),
    lambda f: f.log("flops") - f.log("bytes"),
    *[(lambda f, c=c: _log(f.cols[c]))
      for c in ("m", "n", "k", "batch", "seq_q", "seq_kv", "heads_q")],
    lambda f: f.group(),
    lambda f: _log(f.cols["head_dim"]),
    lambda f: f.cols["causal"].astype(float),
    lambda f: np.nan_to_num(f.cols["density"], nan=1.0),
    lambda f: _log(f.cols["block_size"]),
    lambda f: _log(f.cols["bytes"]),
    lambda f: np.nan_to_num(f.cols["ranks"], nan=1.0),
    lambda f: np.nan_to_num(f.cols["nodes"], nan=1.0),
    *[(lambda f, a=a: f.align(a)) for a in (8, 64, 128)],
    *[(lambda f, c=c: f.row_align(c)) for c in ("k", "n", "m")],
    lambda f: np.isin(f.cols["op"], ["attn_bwd", "attn_blocksparse_bwd"]).astype(float),
    _is("op", "attn_fwdbwd"),
    *[_is("dtype", d) for d in DTYPES],
    *[_is("backend", b) for b in BACKENDS],
    *[_is("op", e) for e in ELEMENTWISE],
    *[_is("op", c) for c in COLLECTIVES],
]  # fmt: skip
assert len(_FEATURES) == len(FEATURE_NAMES)


def feature_matrix(cols: dict[str, np.ndarray], work: Work) -> np.ndarray:
    """Rows x len(FEATURE_NAMES) float matrix."""
    features = Features(cols, work)
    return np.column_stack([features(i) for i in range(len(FEATURE_NAMES))])
