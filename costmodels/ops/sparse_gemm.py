"""Sparse-weight GEMMs: 2:4 structured, unstructured (Flash-LLM) and CATS activation sparsity.

C[m,n] = X[m,k] . W[n,k]^T (nn.Linear: m tokens, n outputs, k inputs), ``batch``
independent products, with the weight W sparse. ``sparsity`` is one of:

- ``"2:4"``: two of every four consecutive k elements kept, on sparse tensor cores
  (cuSPARSELt). The main loop runs the dense kernel's tiles over k / ``sparse_speedup``
  (the spec's sparse rate; 2 on Ampere and later) at a fitted fraction of the dense
  model's efficiency; HBM traffic is the kept values plus 2 bits of metadata per kept
  value (cuSPARSELt's compressed layout), and the activations are padded to a multiple
  of 8 rows (torch's ``to_sparse_semi_structured`` path), read at a fitted fraction of
  the dense GEMM's HBM efficiency: one for ``narrow_rows`` tokens or fewer, another above
  (cuSPARSELt's default heuristic switches kernels between 128 and 256 tokens in every
  measured layer shape; the narrow kernel streams the weight at about a third of the
  dense GEMV's rate, so 2:4 *loses* at decode on H100), plus a fitted per-kernel
  ``kernel_overhead_s``. That is the kernel as a CUDA-graph replay (or a plan-caching
  torch) runs it, the default. ``eager=True`` adds ``call_floor_s``: what torch 2.11's
  eager ``_cslt_sparse_mm`` costs per call whatever the shape, since it rebuilds the
  cuSPARSELt descriptors and plan on every call (pytorch/pytorch#153825; cached from
  pytorch PR 179642 on); the kernel hides under that host time until it is longer.
- ``"unstructured:S"`` (S = fraction of zero weights): Flash-LLM's "load as sparse,
  compute as dense" (Xia et al. 2023, VLDB 2024): nonzeros are stored in Tiled-CSL (each
  a 16-bit value and a 16-bit in-tile location, plus one offset per 64x64 tile), loaded
  from HBM and expanded into dense tiles in shared memory, where the tensor cores run the
  *dense* work. So memory-bound GEMMs (decode) gain by the weight bytes saved, minus the
  index overhead (no gain below 50% sparsity in 16-bit), and compute-bound ones gain
  nothing (slightly lose to the extraction). Analytical only: no Flash-LLM kernel is
  measured here (torch has none); its two efficiencies are assumptions from the paper.
- ``"cats:F"`` (F = fraction of MLP neurons active per token; CATS, Lee et al. 2024):
  the up/gate rows and down columns of inactive neurons are not read. A decode batch of
  m tokens reads the union of its tokens' active sets, ``1 - (1-F)^m`` of the neurons for
  independent tokens (pessimistic: real activations correlate), rounded up to 8 neurons.
  The neurons index the MLP's intermediate dimension, the larger of n and k (n for the
  up projection, k for the down one). ``cats_kernel="fused"`` (default) prices a kernel
  that reads only the active rows (measured as a dense GEMM on pre-gathered rows);
  ``"gather"`` adds the ``index_select`` copy that plain torch code makes (measured).
  The dense gate projection and the threshold are separate ops, not priced here.
- ``"dense"``: the dense GEMM model itself.

``Work.flops`` counts the multiply-adds on kept weights (2:4: half the dense count);
``Work.bytes`` the HBM traffic including indices and metadata.

:class:`SparseGemmModel` is the cost-model face: ``predict(op)`` and
``predict_many(ops_frame)`` in seconds for ``gemm`` ops whose weight has one sparsity.

Parameters with provenance are in ``data/sparse_gemm.yaml``; ``calibrate.sparse.gemm``
refits them on a ``calibrate.run --suite sparse_gemm`` CSV with families held out:

    python -m calibrate.sparse.gemm fit calibrate/data/h100-sxm/sparse_gemm.csv

numpy only (and the project's pydantic/yaml parameter loading); no torch, no simcli.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from costmodels.ops.columns import Columns, frame_columns, op_columns
from costmodels.ops.common import ELEMENT_BYTES, GEMM_OUT_BYTES, Work, by_dtype, cdiv, peak_flops
from costmodels.ops.gemm import SPLIT_FACTORS, gemm_work, row_alignment
from costmodels.ops.params import GemmParams, arch_params, deep_merge
from hardware_specs.schema import GpuSpec
from workloads.ops import Op, normalise_frame, parse_gemm_sparsity

if TYPE_CHECKING:
    import pandas as pd

SPARSITY_KINDS = ("dense", "2:4", "unstructured", "cats")


class _P(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SemiStructuredParams(_P):
    source: str
    metadata_bits_per_kept: float = Field(
        ge=0, description="index bits stored per kept value (2:4: 2 bits pick 2 of 4)"
    )
    compute_efficiency: float = Field(
        gt=0,
        le=1,
        description="sparse main loop's rate relative to the dense model's tiles over "
        "k / sparse_speedup (fitted)",
    )
    memory_efficiency_factor: float = Field(
        gt=0, le=1, description="HBM efficiency relative to the dense GEMM's, above narrow_rows"
    )
    narrow_rows: int = Field(
        0, ge=0, description="token counts at or below this run the narrow (decode) kernel"
    )
    narrow_memory_efficiency_factor: float = Field(
        1.0, gt=0, le=1, description="HBM efficiency relative to the dense GEMM's, narrow kernel"
    )
    kernel_overhead_s: float = Field(
        0.0, ge=0, description="fixed time per sparse kernel beyond the dense launch (fitted)"
    )
    call_floor_s: float = Field(
        ge=0,
        description="per-call time floor of torch 2.11's eager path (host-side plan setup); "
        "applied only to eager calls",
    )
    dense_row_multiple: int = Field(ge=1, description="activation rows are padded to this")


class UnstructuredParams(_P):
    source: str
    index_bytes: float = Field(ge=0, description="location bytes stored per nonzero")
    tile_elements: int = Field(gt=0, description="weight elements per sparse tile")
    tile_offset_bytes: float = Field(ge=0, description="offset bytes per tile")
    compute_efficiency: float = Field(
        gt=0, le=1, description="tensor-core rate relative to the dense kernel (extraction)"
    )
    load_efficiency: float = Field(
        gt=0, le=1, description="HBM efficiency of the sparse loads relative to the dense GEMM's"
    )


class CatsParams(_P):
    source: str
    row_multiple: int = Field(ge=1, description="active neurons read, rounded up to this")
    index_bytes: float = Field(ge=0, description="bytes of index per active neuron")
    gather_memory_efficiency: float = Field(
        gt=0, le=1, description="fraction of HBM peak of the index_select copy (fitted)"
    )
    gather_launch_s: float = Field(ge=0, description="fixed cost of the gathers (fitted)")


class SparseGemmParams(_P):
    source: str
    semi_structured: SemiStructuredParams
    unstructured: UnstructuredParams
    cats: CatsParams
    fit: dict[str, Any] = Field(
        default_factory=dict, description="provenance: dataset, split, held-out fidelity"
    )


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    path = Path(str(resources.files("costmodels") / "data" / "sparse_gemm.yaml"))
    return yaml.safe_load(path.read_text())


def sparse_params(architecture: str, overrides: dict[str, Any] | None = None) -> SparseGemmParams:
    """Parameters for an architecture: the shared (Hopper-fitted) base, its entries,
    then ``overrides``."""
    raw = _raw()
    archs = raw["architectures"]
    if architecture not in archs:
        raise ValueError(
            f"no sparse GEMM parameters for architecture {architecture!r}; "
            f"known: {', '.join(sorted(archs))}"
        )
    merged = deep_merge(raw["base"], archs[architecture] or {})
    if overrides:
        merged = deep_merge(merged, overrides)
    try:
        return SparseGemmParams.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"sparse GEMM parameters for {architecture}: {loc}: {err['msg']}") from exc


def dense_gemm_params(gpu: GpuSpec) -> GemmParams:
    """The dense GEMM parameters the sparse models build on: the shipped calibration
    profile of this GPU (or of one of its architecture), else the architecture defaults."""
    from costmodels.ops.profile import shipped_profiles

    profiles = [p for p in shipped_profiles() if p.scope == "gpu"]
    own = [p for p in profiles if p.gpu == gpu.id]
    if own:
        return arch_params(gpu.architecture, own[0].params).gemm
    from hardware_specs.registry import builtin_catalog

    gpus = builtin_catalog().gpus
    same = [p for p in profiles if p.gpu in gpus and gpus[p.gpu].architecture == gpu.architecture]
    return arch_params(gpu.architecture, same[0].params if same else None).gemm


def parse_sparsity(text: str) -> tuple[str, float]:
    """``"2:4"`` -> ("2:4", 0.5); ``"unstructured:0.8"`` -> ("unstructured", 0.8);
    ``"cats:0.3"`` -> ("cats", 0.3); ``"dense"`` -> ("dense", 1.0)
    (:func:`workloads.ops.parse_gemm_sparsity`, whose error is a ValueError)."""
    return parse_gemm_sparsity(text)


def stored_bytes_per_weight(
    sparsity: str, element_bytes: float, params: SparseGemmParams | None = None
) -> float:
    """HBM bytes a weight matrix stores per dense element under ``sparsity`` (the formats
    the kernels below read): 2:4 keeps half the values plus ``metadata_bits_per_kept`` bits
    of index each (cuSPARSELt's compressed matrix: the 2 kept values of every 4 and their
    2-bit positions, NVIDIA A100 whitepaper sec. "Fine-grained structured sparsity";
    0.5625x a bf16 matrix); unstructured:S is Flash-LLM's Tiled-CSL (Xia et al., VLDB
    2024, sec. 4.1): ``1 - S`` of the values, each with a 16-bit in-tile location, plus
    one offset per tile (no saving below S = 0.5 in 16-bit); dense and CATS (activation
    sparsity: every weight stays) store the dense matrix."""
    kind, value = parse_sparsity(sparsity)
    p = params if params is not None else sparse_params("hopper")  # formats: shared base
    if kind == "2:4":
        sp = p.semi_structured
        return 0.5 * (element_bytes + sp.metadata_bits_per_kept / 8.0)
    if kind == "unstructured":
        up = p.unstructured
        tile = up.tile_offset_bytes / up.tile_elements
        return (1.0 - value) * (element_bytes + up.index_bytes) + tile
    return float(element_bytes)


def cats_rows_read(neurons: np.ndarray, active: float, tokens: np.ndarray, multiple: int = 8):
    """Neurons a batch of ``tokens`` reads: the union of independent per-token active
    sets of fraction ``active``, rounded up to ``multiple`` (as the benchmark does)."""
    neurons = np.asarray(neurons, dtype=float)
    union = 1.0 - (1.0 - active) ** np.asarray(tokens, dtype=float)
    rows = multiple * np.ceil(neurons * union / multiple)
    return np.minimum(neurons, np.maximum(multiple, rows))


def _compute_only_s(m, n, k, batch, dtype, gpu: GpuSpec, dense: GemmParams) -> np.ndarray:
    """The dense kernel's tile/wave time (split-K partial sums included) without the launch
    and the operands' HBM floor: the loop of :func:`costmodels.ops.gemm.gemm_work`, which
    returns ``launch_s + max(this, operand bytes / HBM)`` (a test checks they agree)."""
    m, n, k, batch = (np.asarray(x, dtype=float) for x in (m, n, k, batch))
    in_b = by_dtype(dtype, ELEMENT_BYTES, "GEMM")
    eff = by_dtype(dtype, {str(d): v for d, v in dense.mma_efficiency.items()}, "GEMM efficiency")
    align = np.minimum(row_alignment(k * in_b), row_alignment(n * in_b))
    factor = np.ones(len(align))
    for elt_bytes, table in dense.misaligned_efficiency.items():
        for bytes_, f in table.items():
            factor[(in_b == elt_bytes) & (align == bytes_)] = f
    eff = np.where(dtype == "fp32", eff, eff * factor)
    sm = float(gpu.sm_count)
    sm_rate = peak_flops(dtype, gpu) * eff / sm
    feed_per_sm = dense.operand_feed_bytes_per_s / sm
    hbm = gpu.hbm_bytes_per_s * dense.memory_efficiency
    best = np.full(m.shape, np.inf)
    for tm, tn in dense.tiles:
        tile_rate = np.minimum(sm_rate, feed_per_sm * 2.0 * tm * tn / ((tm + tn) * in_b))
        tiles = cdiv(m, tm) * cdiv(n, tn) * batch
        for split in SPLIT_FACTORS:
            if split > dense.max_split_k:
                break
            waves = cdiv(tiles * split, sm)
            k_per = cdiv(k, split)
            t = waves * (
                2.0 * tm * tn * (k_per + dense.k_overhead) / tile_rate + dense.wave_latency_s
            )
            if split > 1:
                t = t + 2.0 * split * m * n * batch * 4.0 / hbm
            best = np.minimum(best, t)
    return best


@dataclass(frozen=True)
class _Rows:
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    batch: np.ndarray
    dtype: np.ndarray


def _rows(m, n, k, batch, dtype) -> _Rows:
    m, n, k = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (m, n, k))
    size = len(m)
    b = np.atleast_1d(np.asarray(1.0 if batch is None else batch, dtype=float))
    b = np.where(np.isnan(b), 1.0, b) * np.ones(size)
    d = np.atleast_1d(np.asarray(dtype, dtype=str))
    d = np.broadcast_to(d, (size,)).copy()
    return _Rows(m, n, k, b, d)


@dataclass(frozen=True)
class SemiStructuredTerms:
    """A 2:4 GEMM's time before its fitted parameters (seconds per row): ``max(bound_s,
    [call_floor_s if eager], launch_s + kernel_overhead_s + max(compute_s /
    compute_efficiency, memory_s / factor))`` with ``factor`` the narrow or the wide
    memory-efficiency factor (``narrow`` rows). What ``calibrate.sparse.gemm`` grid-searches."""

    compute_s: np.ndarray  # the dense kernel's tiles over k / sparse_speedup, efficiency 1
    memory_s: np.ndarray  # kept values, metadata, padded activations, outputs at dense HBM eff.
    bound_s: np.ndarray  # the spec's sparse peak and HBM bandwidth
    narrow: np.ndarray  # rows at or below narrow_rows tokens
    launch_s: float
    flops: np.ndarray
    bytes: np.ndarray

    def time_s(self, sp: SemiStructuredParams, *, eager: bool = False) -> np.ndarray:
        factor = np.where(
            self.narrow, sp.narrow_memory_efficiency_factor, sp.memory_efficiency_factor
        )
        kernel = (
            self.launch_s
            + sp.kernel_overhead_s
            + np.maximum(self.compute_s / sp.compute_efficiency, self.memory_s / factor)
        )
        if eager:
            kernel = np.maximum(kernel, sp.call_floor_s)
        return np.maximum(kernel, self.bound_s)


def _semi_structured(
    r: _Rows, gpu: GpuSpec, sp: SemiStructuredParams, dp: GemmParams
) -> SemiStructuredTerms:
    in_b = by_dtype(r.dtype, ELEMENT_BYTES, "sparse GEMM")
    out_b = by_dtype(r.dtype, GEMM_OUT_BYTES, "sparse GEMM")
    hbm = gpu.hbm_bytes_per_s
    dense_flops = 2.0 * r.m * r.n * r.k * r.batch
    rows = cdiv(r.m, sp.dense_row_multiple) * sp.dense_row_multiple
    kept = 0.5 * r.n * r.k * r.batch
    bytes_ = (
        r.batch * (rows * r.k * in_b + r.m * r.n * out_b)
        + kept * in_b
        + kept * sp.metadata_bits_per_kept / 8.0
    )
    k_eff = r.k / gpu.sparse_speedup
    return SemiStructuredTerms(
        compute_s=_compute_only_s(rows, r.n, k_eff, r.batch, r.dtype, gpu, dp),
        memory_s=bytes_ / (hbm * dp.memory_efficiency),
        narrow=r.m <= sp.narrow_rows,
        bound_s=np.maximum(
            dense_flops / (peak_flops(r.dtype, gpu) * gpu.sparse_speedup), bytes_ / hbm
        ),
        launch_s=dp.launch_s,
        flops=0.5 * dense_flops,
        bytes=bytes_,
    )


def semi_structured_terms(
    m,
    n,
    k,
    batch,
    dtype,
    gpu: GpuSpec,
    params: SparseGemmParams | None = None,
    *,
    dense: GemmParams | None = None,
) -> SemiStructuredTerms:
    """The parts of the 2:4 time of :func:`sparse_gemm_work` (see
    :class:`SemiStructuredTerms`); defaults as there."""
    p = params if params is not None else sparse_params(gpu.architecture)
    dp = dense if dense is not None else dense_gemm_params(gpu)
    return _semi_structured(_rows(m, n, k, batch, dtype), gpu, p.semi_structured, dp)


def sparse_gemm_work(
    m,
    n,
    k,
    batch,
    dtype,
    sparsity: str,
    gpu: GpuSpec,
    params: SparseGemmParams | None = None,
    *,
    dense: GemmParams | None = None,
    cats_kernel: Literal["fused", "gather"] = "fused",
    eager: bool = False,
) -> Work:
    """Time, useful FLOPs and HBM bytes of sparse-weight GEMMs (see the module docstring).

    ``params`` defaults to the GPU architecture's entry of ``data/sparse_gemm.yaml``;
    ``dense`` to :func:`dense_gemm_params`; ``eager`` adds 2:4's per-call floor of torch
    2.11's eager path (no CUDA graph, no plan cache).
    """
    kind, value = parse_sparsity(sparsity)
    p = params if params is not None else sparse_params(gpu.architecture)
    dp = dense if dense is not None else dense_gemm_params(gpu)
    r = _rows(m, n, k, batch, dtype)
    if kind == "dense":
        return gemm_work(r.m, r.n, r.k, r.batch, r.dtype, gpu, dp)
    in_b = by_dtype(r.dtype, ELEMENT_BYTES, "sparse GEMM")
    out_b = by_dtype(r.dtype, GEMM_OUT_BYTES, "sparse GEMM")
    peak = peak_flops(r.dtype, gpu)
    hbm = gpu.hbm_bytes_per_s
    dense_flops = 2.0 * r.m * r.n * r.k * r.batch

    if kind == "2:4":
        sp = p.semi_structured
        t = _semi_structured(r, gpu, sp, dp)
        return Work(time_s=t.time_s(sp, eager=eager), flops=t.flops, bytes=t.bytes)

    if kind == "unstructured":
        up = p.unstructured
        nnz = (1.0 - value) * r.n * r.k * r.batch
        tiles = cdiv(r.n * r.k, up.tile_elements) * r.batch
        bytes_ = (
            r.batch * (r.m * r.k * in_b + r.m * r.n * out_b)
            + nnz * (in_b + up.index_bytes)
            + tiles * up.tile_offset_bytes
        )
        flops = (1.0 - value) * dense_flops
        compute = _compute_only_s(r.m, r.n, r.k, r.batch, r.dtype, gpu, dp) / up.compute_efficiency
        memory = bytes_ / (hbm * dp.memory_efficiency * up.load_efficiency)
        time_s = dp.launch_s + np.maximum(compute, memory)
        bound = np.maximum(flops / (peak * gpu.sparse_speedup), bytes_ / hbm)
        return Work(time_s=np.maximum(time_s, bound), flops=flops, bytes=bytes_)

    # cats
    cp = p.cats
    neurons_on_n = r.n >= r.k
    neurons = np.where(neurons_on_n, r.n, r.k)
    read = cats_rows_read(neurons, value, r.m, cp.row_multiple)
    n_eff = np.where(neurons_on_n, read, r.n)
    k_eff = np.where(neurons_on_n, r.k, read)
    fused = gemm_work(r.m, n_eff, k_eff, r.batch, r.dtype, gpu, dp)
    idx_bytes = read * cp.index_bytes * r.batch
    bytes_ = fused.bytes + idx_bytes
    time_s = fused.time_s + idx_bytes / (hbm * dp.memory_efficiency)
    if cats_kernel == "gather":
        w_bytes = n_eff * k_eff * in_b * r.batch  # read and written once more by the copy
        time_s = time_s + cp.gather_launch_s + 2.0 * w_bytes / (hbm * cp.gather_memory_efficiency)
        bytes_ = bytes_ + 2.0 * w_bytes
    elif cats_kernel != "fused":
        raise ValueError(f"cats_kernel {cats_kernel!r} not understood; allowed: fused, gather")
    bound = np.maximum(fused.flops / (peak * gpu.sparse_speedup), bytes_ / hbm)
    return Work(time_s=np.maximum(time_s, bound), flops=fused.flops, bytes=bytes_)


class SparseGemmModel:
    """Sparse-weight GEMMs as a cost model: ``predict(op)`` and ``predict_many(frame)`` in
    seconds for ``gemm`` ops (C[m,n] = X[m,k] . W[n,k]^T, ``batch`` products) whose weight
    has ``sparsity`` (see the module docstring); ``cats_kernel`` is CATS's kernel, ``eager``
    adds 2:4's per-call floor of torch's eager path. Scalar
    calls run the vectorised code on length-1 arrays. Parameters are loaded
    (:func:`sparse_params`, :func:`dense_gemm_params`), never fitted here."""

    def __init__(
        self,
        gpu: str | GpuSpec = "h100-sxm",
        sparsity: str = "2:4",
        *,
        cats_kernel: Literal["fused", "gather"] = "fused",
        params: SparseGemmParams | None = None,
        dense: GemmParams | None = None,
        eager: bool = False,
    ) -> None:
        if not isinstance(gpu, GpuSpec):
            from hardware_specs.registry import builtin_catalog

            gpu = builtin_catalog().gpu(str(gpu))
        parse_sparsity(sparsity)  # one-line error for a bad sparsity
        if cats_kernel not in ("fused", "gather"):
            raise ValueError(f"cats_kernel {cats_kernel!r} not understood; allowed: fused, gather")
        self.gpu = gpu
        self.sparsity = sparsity
        self.cats_kernel = cats_kernel
        self.eager = eager
        self.params = params if params is not None else sparse_params(gpu.architecture)
        self.dense = dense if dense is not None else dense_gemm_params(gpu)

    @property
    def label(self) -> str:
        return f"sparse GEMM {self.sparsity} ({self.gpu.id})"

    def work_columns(self, cols: Columns) -> Work:
        """Time, FLOPs and HBM bytes for every row of a column dict (``gemm`` rows only)."""
        other = cols["op"] != "gemm"
        if other.any():
            raise ValueError(f"op {cols['op'][other][0]!r} is not priced here; allowed: gemm")
        return sparse_gemm_work(
            cols["m"],
            cols["n"],
            cols["k"],
            cols["batch"],
            cols["dtype"],
            self.sparsity,
            self.gpu,
            self.params,
            dense=self.dense,
            cats_kernel=self.cats_kernel,
            eager=self.eager,
        )

    def work_many(self, frame: pd.DataFrame, *, validated: bool = False) -> Work:
        if not validated:
            frame = normalise_frame(frame)
        return self.work_columns(frame_columns(frame))

    def predict_many(self, frame: pd.DataFrame, *, validated: bool = False) -> np.ndarray:
        """Seconds per row of an ops frame (validated first unless ``validated``)."""
        return self.work_many(frame, validated=validated).time_s

    def work(self, op: Op) -> Work:
        return self.work_columns(op_columns(op))

    def predict(self, op: Op) -> float:
        """Seconds for one op."""
        return float(self.work(op).time_s[0])


# tokens at which break-even is searched: every count up to 65,536 (the largest prefill
# chunk any engine runs); the 2:4 kernel switch and padding steps make the curves jagged,
# so no bisection
BREAK_EVEN_MAX_TOKENS = 65536


@dataclass(frozen=True)
class BreakEven:
    """Where a sparse GEMM pays against the dense one on the same layer, over token counts
    1..``BREAK_EVEN_MAX_TOKENS``: ``pays`` is ``"below"`` (sparse faster at 1 token, up to
    ``break_even_tokens`` exclusive), ``"above"`` (faster from ``break_even_tokens`` on),
    ``"always"`` or ``"never"``; ``crossings`` counts the sign changes (more than one: the
    curves cross again, e.g. at 2:4's 128 -> 256-token kernel switch)."""

    pays: str
    break_even_tokens: int | None
    crossings: int
    speedup_1_token: float
    speedup_max_tokens: float


def break_even(
    n: float,
    k: float,
    dtype: str,
    sparsity: str,
    gpu: GpuSpec,
    params: SparseGemmParams | None = None,
    *,
    dense: GemmParams | None = None,
    max_tokens: int = BREAK_EVEN_MAX_TOKENS,
    eager: bool = False,
) -> BreakEven:
    """The token count at which the ``sparsity`` GEMM of weight [n, k] starts or stops
    beating the dense GEMM, both from the models (dense / sparse time at every count)."""
    m = np.arange(1, max_tokens + 1, dtype=float)
    nn, kk = np.full(len(m), float(n)), np.full(len(m), float(k))
    dp = dense if dense is not None else dense_gemm_params(gpu)
    kw = {"dense": dp, "eager": eager}
    sparse = sparse_gemm_work(m, nn, kk, None, dtype, sparsity, gpu, params, **kw).time_s
    base = sparse_gemm_work(m, nn, kk, None, dtype, "dense", gpu, params, **kw).time_s
    wins = sparse < base
    flips = np.flatnonzero(wins[1:] != wins[:-1])
    if not len(flips):
        pays, at = ("always" if wins[0] else "never"), None
    else:
        pays, at = ("below" if wins[0] else "above"), int(flips[0]) + 2  # first count after
    return BreakEven(
        pays=pays,
        break_even_tokens=at,
        crossings=int(len(flips)),
        speedup_1_token=float(base[0] / sparse[0]),
        speedup_max_tokens=float(base[-1] / sparse[-1]),
    )
