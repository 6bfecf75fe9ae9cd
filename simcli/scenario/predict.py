"""Op-level predictions: the inputs of ``simcli predict`` and its subcommands as pydantic
configs, resolved once (the op or ops table, and the hardware with its cost model) and run.

Each config *is* its command's options (:func:`simcli.options.config_options` turns the
fields into typer options: flag, type, default, help), so the CLI, the JSON schema and a
sweep's parameters cannot drift. Values are checked where they always were: the op's
fields by :class:`~workloads.ops.Op` (one :class:`~workloads.ops.OpError` line naming the
field), the choices of ``--phase`` / ``--kind`` / ``--op`` here, the GPU by the catalog.

``resolve_*`` builds the op(s) and resolves the hardware; ``run_*`` prices them and
returns a result whose ``to_dict()`` is the JSON object the command prints with
``--format json`` (without ``--output``). The commands only add where results go.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from costmodels.ops.common import CHUNK_ROWS, Work
from simcli.scenario.hardware import Hardware, resolve_hardware
from simcli.scenario.ops_csv import FastOps, read_fast, write_predictions
from workloads.ops import (
    ADAMW_N_LIMIT,
    CSV_COLUMNS,
    ELEMENTWISE_KINDS,
    SIZE_LIMITS,
    Op,
    OpError,
    OpKind,
    canonical_sparsity,
    check_size_limits,
    normalise_frame,
    ops_frame,
    size_limit,
)

if TYPE_CHECKING:  # pandas and the model catalogue load where used: `predict gemm` needs neither
    import pandas as pd

    from workloads.models import ModelConfig

# defer_build: a command validates one of these configs; the others' validators are never
# built (start-up time)
_CONFIG = ConfigDict(extra="forbid", frozen=True, defer_build=True)
DTYPES = "fp64 | fp32 | tf32 | bf16 | fp16 | fp8 | int8"
ATTENTION_KINDS = {"fwd": OpKind.attn_fwd, "bwd": OpKind.attn_bwd, "fwdbwd": OpKind.attn_fwdbwd}
BLOCKSPARSE_KINDS = {"fwd": OpKind.attn_blocksparse_fwd, "bwd": OpKind.attn_blocksparse_bwd}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
LAYER_PHASES = ("fwd", "bwd", "fwdbwd")
SUBCOMMANDS = "gemm, attention, decode, blocksparse, collective, elementwise"


# the options every op command ends with (fields are declared per class, in this order)
def _dtype() -> Any:
    return Field("bf16", description=f"Data type: {DTYPES}.")


def _gpu() -> Any:
    return Field(description="GPU id (see `simcli specs list`).")


def _profile() -> Any:
    return Field(None, description="Calibration profile overriding the defaults.")


def _hardware() -> Any:
    return Field(None, description="Extra hardware spec file (YAML/JSON).")


def _size(column: str, default: Any = ..., *, description: str, **extra: Any) -> Any:
    """A size flag: a whole number from 1 to the column's bound in
    :data:`workloads.ops.SIZE_LIMITS` (the error says the bound and why)."""
    limit, why = size_limit(column)
    extra = {"le_why": why, **extra}
    return Field(default, gt=0, le=limit, description=description, json_schema_extra=extra)


class GemmConfig(BaseModel):
    """``simcli predict gemm``: C[m,n] = A[m,k] . B[k,n]."""

    model_config = _CONFIG

    m: int = _size("m", description="Rows of A and C.")
    n: int = _size("n", description="Columns of B and C.")
    k: int = _size("k", description="Inner dimension.")
    batch: int = _size("batch", 1, description="Independent products (bmm).")
    sparsity: str = Field(
        "",
        description="Sparsity of B (the weight; cats: of the MLP activations), as the ops "
        "CSV's sparsity column: empty/dense, 2:4, unstructured:S, cats:F. 2:4 is the "
        "cuSPARSELt kernel as a CUDA-graph replay runs it (no per-call host plan setup).",
    )
    dtype: str = _dtype()
    gpu: str = _gpu()
    profile: Path | None = _profile()
    hardware: Path | None = _hardware()

    def op(self) -> Op:
        return Op(
            op=OpKind.gemm,
            m=self.m,
            n=self.n,
            k=self.k,
            batch=self.batch,
            dtype=self.dtype,
            sparsity=canonical_sparsity(self.sparsity) or None,
        )


class AttentionConfig(BaseModel):
    """``simcli predict attention``: dense attention (FlashAttention-style kernels)."""

    model_config = _CONFIG

    phase: str = Field("fwd", description="fwd | bwd | fwdbwd")
    batch: int = _size("batch", 1, description="Sequences.")
    seq_q: int = _size("seq_q", description="Query tokens per sequence.")
    seq_kv: int | None = _size("seq_kv", None, description="Key/value tokens; defaults to --seq-q.")
    heads_q: int = _size("heads_q", description="Query heads.")
    heads_kv: int | None = _size(
        "heads_kv", None, description="Key/value heads; defaults to --heads-q."
    )
    head_dim: int = _size("head_dim", 128, description="Channels per head.")
    causal: bool = Field(True, description="Causal mask.")
    backend: str = Field(
        "", description="Kernel family: flash | cudnn | flex | efficient | flashinfer (fwd)."
    )
    dtype: str = _dtype()
    gpu: str = _gpu()
    profile: Path | None = _profile()
    hardware: Path | None = _hardware()

    def op(self) -> Op:
        if self.phase not in ATTENTION_KINDS:
            raise OpError(f"unknown --phase {self.phase!r}; allowed: fwd, bwd, fwdbwd")
        return Op(
            op=ATTENTION_KINDS[self.phase],
            batch=self.batch,
            seq_q=self.seq_q,
            seq_kv=self.seq_kv or self.seq_q,
            heads_q=self.heads_q,
            heads_kv=self.heads_kv or self.heads_q,
            head_dim=self.head_dim,
            causal=self.causal,
            backend=self.backend or None,
            dtype=self.dtype,
        )


class DecodeConfig(BaseModel):
    """``simcli predict decode``: new tokens over a KV cache (split-KV)."""

    model_config = _CONFIG

    batch: int = _size("batch", 1, description="Sequences.")
    context_len: int = _size("seq_kv", description="KV-cache length (seq_kv).")
    seq_q: int = _size("seq_q", 1, description="Query tokens per sequence.")
    heads_q: int = _size("heads_q", description="Query heads.")
    heads_kv: int | None = _size(
        "heads_kv", None, description="Key/value heads; defaults to --heads-q."
    )
    head_dim: int = _size("head_dim", 128, description="Channels per head.")
    backend: str = Field(
        "", description="Kernel family: flash | cudnn | flex | efficient | flashinfer."
    )
    dtype: str = _dtype()
    gpu: str = _gpu()
    profile: Path | None = _profile()
    hardware: Path | None = _hardware()

    def op(self) -> Op:
        return Op(
            op=OpKind.attn_decode,
            batch=self.batch,
            seq_q=self.seq_q,
            seq_kv=self.context_len,
            heads_q=self.heads_q,
            heads_kv=self.heads_kv or self.heads_q,
            head_dim=self.head_dim,
            dtype=self.dtype,
            backend=self.backend or None,
        )


class BlocksparseConfig(BaseModel):
    """``simcli predict blocksparse``: attention visiting ``density`` of the tiles."""

    model_config = _CONFIG

    phase: str = Field("fwd", description="fwd | bwd")
    batch: int = _size("batch", 1, description="Sequences.")
    seq_len: int = _size("seq_q", description="Tokens per sequence (queries and keys).")
    heads_q: int = _size("heads_q", description="Query heads.")
    heads_kv: int | None = _size(
        "heads_kv", None, description="Key/value heads; defaults to --heads-q."
    )
    head_dim: int = _size("head_dim", 128, description="Channels per head.")
    density: float = Field(description="Fraction of block_size x block_size tiles visited, (0, 1].")
    block_size: int = _size("block_size", 128, description="Tile side, in tokens.")
    backend: str = Field("", description="Kernel family: flex | flash.")
    dtype: str = _dtype()
    gpu: str = _gpu()
    profile: Path | None = _profile()
    hardware: Path | None = _hardware()

    def op(self) -> Op:
        if self.phase not in BLOCKSPARSE_KINDS:
            raise OpError(f"unknown --phase {self.phase!r}; allowed: fwd, bwd")
        return Op(
            op=BLOCKSPARSE_KINDS[self.phase],
            batch=self.batch,
            seq_q=self.seq_len,
            seq_kv=self.seq_len,
            heads_q=self.heads_q,
            heads_kv=self.heads_kv or self.heads_q,
            head_dim=self.head_dim,
            density=self.density,
            block_size=self.block_size,
            backend=self.backend or None,
            dtype=self.dtype,
        )


class CollectiveConfig(BaseModel):
    """``simcli predict collective``: an NCCL collective over ``ranks`` GPUs."""

    model_config = _CONFIG

    kind: str = Field("all_reduce", description=" | ".join(COLLECTIVES))
    nbytes: int = _size(
        "bytes", description="nccl-tests size: buffer per rank, in bytes.", cli=["--bytes"]
    )
    ranks: int = _size("ranks", 8, description="GPUs taking part.")
    nodes: int = _size("nodes", 1, description="Reference nodes the ranks span.")
    gpu: str = _gpu()
    profile: Path | None = _profile()
    hardware: Path | None = _hardware()

    def op(self) -> Op:
        if self.kind not in COLLECTIVES:
            raise OpError(f"unknown --kind {self.kind!r}; allowed: {', '.join(COLLECTIVES)}")
        return Op(op=OpKind(self.kind), bytes=self.nbytes, ranks=self.ranks, nodes=self.nodes)


class ElementwiseConfig(BaseModel):
    """``simcli predict elementwise``: a memory-bound op priced by bytes moved."""

    model_config = _CONFIG

    kind: str = Field(
        description="copy | rmsnorm | swiglu | rope | softmax | ...",
        json_schema_extra={"cli": ["--op"]},
    )
    m: int | None = _size("m", None, description="Tokens / rows.")
    n: int | None = Field(
        None,
        gt=0,
        le=ADAMW_N_LIMIT[0],
        description=f"Hidden / columns (at most {SIZE_LIMITS['n'][0]}) / parameters (adamw).",
        json_schema_extra={"le_why": ADAMW_N_LIMIT[1]},
    )
    nbytes: int | None = _size("bytes", None, description="Bytes read (copy).", cli=["--bytes"])
    dtype: str = _dtype()
    gpu: str = _gpu()
    profile: Path | None = _profile()
    hardware: Path | None = _hardware()

    def op(self) -> Op:
        allowed = sorted(k.value for k in ELEMENTWISE_KINDS)
        if self.kind not in allowed:
            raise OpError(f"unknown --op {self.kind!r}; allowed: {', '.join(allowed)}")
        limit, why = size_limit("n", self.kind)
        if self.n is not None and self.n > limit:
            raise OpError(f"--n {self.n} is too large for --op {self.kind}; allowed: at most "
                          f"{limit} ({why})")  # fmt: skip
        return Op(op=OpKind(self.kind), m=self.m, n=self.n, bytes=self.nbytes, dtype=self.dtype)


OpConfig = (
    GemmConfig
    | AttentionConfig
    | DecodeConfig
    | BlocksparseConfig
    | CollectiveConfig
    | ElementwiseConfig
)


def _hardware_of(config: Any) -> Hardware:
    """The GPU's calibrated profile when one ships (or --profile), else the defaults."""
    return resolve_hardware(config.gpu, profile=config.profile, hardware_file=config.hardware)


# --------------------------------------------------------------------------- one op


@dataclass(frozen=True)
class OpScenario:
    config: OpConfig
    op: Op
    hardware: Hardware


def resolve_op(config: OpConfig) -> OpScenario:
    """The op of a single-op command (checked first, as the command always did), then the
    hardware; bad input is one :class:`ValueError` line."""
    op = config.op()
    return OpScenario(config=config, op=op, hardware=_hardware_of(config))


@dataclass(frozen=True)
class OpPrediction:
    """One op priced: its time, work, achieved rates and (with a power model) energy."""

    scenario: OpScenario
    work: Work
    result: dict[str, Any]

    @property
    def time_s(self) -> float:
        return float(self.work.time_s[0])

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``simcli predict gemm|attention|...``."""
        return dict(self.result)


def run_op(scenario: OpScenario) -> OpPrediction:
    """Price the scenario's op with its hardware's cost model."""
    model, op = scenario.hardware.cost_model, scenario.op
    work = model.work(op)
    t = float(work.time_s[0])
    flops, nbytes = float(work.flops[0]), float(work.bytes[0])
    result: dict[str, Any] = {
        "op": op.op.value,
        "gpu": model.gpu.id,
        "dtype": op.dtype.value,
        "predicted_ms": t * 1e3,
        "flops": flops,
        "bytes": nbytes,
        "achieved_tflops": flops / t / 1e12 if t > 0 else 0.0,
        "achieved_gb_per_s": nbytes / t / 1e9 if t > 0 else 0.0,
        "model": model.label,
    }
    power = getattr(model, "power", None)
    if power is not None:
        dtype = np.array([op.dtype.value])
        result["power_w"] = float(power.power_w(work, dtype, model.gpu)[0])
        result["energy_j"] = float(power.energy_j(work, dtype, model.gpu)[0])
    return OpPrediction(scenario=scenario, work=work, result=result)


# --------------------------------------------------------------------------- one layer


class LayerConfig(BaseModel):
    """``simcli predict layer``: every op of one transformer layer on one TP rank."""

    model_config = _CONFIG

    model: str = Field(description="Built-in model id or a config.json path.")
    batch: int = _size("batch", 1, description="Sequences per micro-batch.")
    seq_len: int = _size("seq_q", description="Tokens per sequence.")
    tp: int = _size("ranks", 1, description="Tensor-parallel degree.")
    phase: str = Field("fwd", description="fwd | bwd | fwdbwd")
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism.")
    backend: str = Field("", description="Attention backend: flash | cudnn | flex.")
    dtype: str = _dtype()
    gpu: str = _gpu()
    profile: Path | None = _profile()
    hardware: Path | None = _hardware()


@dataclass(frozen=True)
class LayerScenario:
    config: LayerConfig
    model: ModelConfig
    hardware: Hardware


def resolve_layer(config: LayerConfig) -> LayerScenario:
    if config.phase not in LAYER_PHASES:
        raise OpError(f"unknown --phase {config.phase!r}; allowed: fwd, bwd, fwdbwd")
    tokens = config.batch * config.seq_len  # the m of the layer's GEMMs
    limit, why = size_limit("m")
    if tokens > limit:
        raise OpError(
            f"--batch {config.batch} x --seq-len {config.seq_len} = {tokens} tokens is too "
            f"large; allowed: at most {limit} tokens, the GEMMs' m ({why})"
        )
    from workloads.models import load_model

    model = load_model(config.model)
    return LayerScenario(config=config, model=model, hardware=_hardware_of(config))


@dataclass(frozen=True)
class LayerPrediction:
    """The layer's ops (phase, named op), priced: one row per op, times its count."""

    scenario: LayerScenario
    named: list[tuple[str, Any]]  # (phase, LayerOp)
    frame: pd.DataFrame
    work: Work
    rows: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def layer_ms(self) -> float:
        return float(self.summary["layer_ms"])

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``simcli predict layer``: the summary and its ``ops``."""
        return {**self.summary, "ops": [dict(r) for r in self.rows]}


def run_layer(scenario: LayerScenario) -> LayerPrediction:
    """Decompose one layer (``workloads.decompose``) and price every op in one batch; a
    collective spans the nodes its TP ranks need."""
    from workloads.decompose import layer_backward_ops, layer_forward_ops

    c, arch, cost = scenario.config, scenario.model, scenario.hardware.cost_model
    args = (arch, c.batch, c.seq_len, c.tp, c.sequence_parallel, c.dtype, c.backend)
    named: list[tuple[str, Any]] = []
    if c.phase in ("fwd", "fwdbwd"):
        named += [("fwd", lo) for lo in layer_forward_ops(*args)]
    if c.phase in ("bwd", "fwdbwd"):
        named += [("bwd", lo) for lo in layer_backward_ops(*args)]
    per_node = cost.system.gpus_per_node
    ops = [
        lo.op.model_copy(update={"nodes": -(-c.tp // per_node)}) if lo.op.ranks else lo.op
        for _, lo in named
    ]
    frame = ops_frame(ops)
    work = cost.work_many(frame, validated=True)
    rows = [
        {
            "phase": ph,
            "name": lo.name,
            "op": lo.op.op.value,
            "count": lo.count,
            "predicted_ms": t * lo.count * 1e3,
        }
        for (ph, lo), t in zip(named, work.time_s, strict=True)
    ]
    layer_ms = sum(r["predicted_ms"] for r in rows)
    summary = {
        "model": arch.id,
        "gpu": c.gpu,
        "tp": c.tp,
        "batch": c.batch,
        "seq_len": c.seq_len,
        "phase": c.phase,
        "layer_ms": layer_ms,
        "all_layers_ms": layer_ms * arch.num_layers,
        "cost_model": cost.label,
    }
    return LayerPrediction(scenario, named, frame, work, rows, summary)


# --------------------------------------------------------------------------- batch (CSV)


def read_ops_csv(path: Path) -> pd.DataFrame:
    """Read an ops CSV as strings (values are validated by ``normalise_frame``)."""
    import pandas as pd

    try:
        with warnings.catch_warnings():
            # rows longer than the header would silently become an index: refuse them
            warnings.simplefilter("error", pd.errors.ParserWarning)
            raw = pd.read_csv(
                path, dtype=str, keep_default_na=False, skipinitialspace=True, index_col=False
            )
    except FileNotFoundError:
        raise OSError(f"input CSV {path} does not exist") from None
    except pd.errors.EmptyDataError:
        raise OpError(f"input CSV {path} is empty (expected a header with at least 'op')") from None
    except (pd.errors.ParserError, pd.errors.ParserWarning, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise OpError(f"input CSV {path} is malformed: {first}") from None
    except IsADirectoryError:
        raise OSError(f"input CSV {path} is a directory") from None
    raw.columns = [str(c).strip() for c in raw.columns]
    if "op" not in raw.columns:
        raise OpError(f"input CSV {path} has no 'op' column; columns are: {', '.join(CSV_COLUMNS)}")
    if raw.empty:
        raise OpError(f"input CSV {path} has a header but no rows; allowed: at least one op row")
    return raw


class PredictBatchConfig(BaseModel):
    """``simcli predict --gpu ID --input ops.csv``: every row of an ops CSV priced.

    Both fields are optional here because they are the options of the ``predict`` group,
    which a subcommand (``predict gemm ...``) passes through; batch mode needs both."""

    model_config = _CONFIG

    gpu: str | None = Field(None, description="GPU id (see `simcli specs list`).")
    input_csv: Path | None = Field(
        None, description="Ops CSV (contract columns).", json_schema_extra={"cli": ["--input"]}
    )
    profile: Path | None = _profile()
    hardware: Path | None = _hardware()


@dataclass(frozen=True)
class PredictBatchScenario:
    """An ops CSV read, validated and (the fast way) priced.

    Read by pandas as strings (``raw``) and validated whole (``validated``); or, for the
    plain CSVs that are almost all input, read by :mod:`simcli.scenario.ops_csv`
    (``fast``), validated and priced chunk by chunk as it goes (``priced``): a million
    rows then never exist as a frame of strings or a validated frame, only as the file's
    bytes and the times. ``rows`` and ``frame`` build those frames when a caller wants them
    (JSON rows, report bundles)."""

    config: PredictBatchConfig
    hardware: Hardware
    raw: pd.DataFrame | None  # the CSV as read (strings); None when read the fast way
    validated: pd.DataFrame | None  # its validated frame; None when read the fast way
    fast: FastOps | None = None  # the fast read (its bytes: the output repeats them)
    priced: Work | None = None  # the fast path's prices

    @cached_property
    def rows(self) -> pd.DataFrame:
        """The CSV as read (strings): the output repeats its rows."""
        if self.raw is not None:
            return self.raw
        assert self.config.input_csv is not None
        return read_ops_csv(self.config.input_csv)

    @cached_property
    def frame(self) -> pd.DataFrame:
        """The validated ops frame."""
        return self.validated if self.validated is not None else normalise_frame(self.rows)


_THREADS = 2


def _price_fast(frame: pd.DataFrame, cost_model: Any) -> Work:
    """Validate (:func:`normalise_frame`, :func:`check_size_limits`) and price the rows of
    a fast read, :data:`~costmodels.ops.common.CHUNK_ROWS` at a time; the first bad row
    raises :class:`OpError` (the caller then reads the file the reference way, which
    finds the first error of the whole file and words it)."""

    def price(i: int) -> Work:
        chunk = normalise_frame(frame.iloc[i : i + CHUNK_ROWS], row_offset=i)
        check_size_limits(chunk, row_offset=i)
        return cost_model.work_many(chunk, validated=True)

    starts = range(0, len(frame), CHUNK_ROWS)
    if len(starts) < 4:
        parts = [price(i) for i in starts]
    else:  # numpy lets go of the GIL in its loops: two threads use two cores
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=_THREADS) as pool:
            parts = list(pool.map(price, starts))
    return Work(
        time_s=np.concatenate([w.time_s for w in parts]),
        flops=np.concatenate([w.flops for w in parts]),
        bytes=np.concatenate([w.bytes for w in parts]),
    )


def resolve_predict_batch(config: PredictBatchConfig) -> PredictBatchScenario:
    """The hardware, then the ops CSV read and validated (one line per bad row or file)."""
    if config.input_csv is None or config.gpu is None:
        raise OpError(f"batch mode needs --gpu and --input (or use a subcommand: {SUBCOMMANDS})")
    hardware = _hardware_of(config)
    fast = read_fast(config.input_csv)
    if fast is not None and fast.frame is not None:
        try:
            priced = _price_fast(fast.frame, hardware.cost_model)
        except OpError:
            pass  # the reference read below finds the file's first error and words it
        else:
            kept = FastOps(frame=None, data=fast.data)
            return PredictBatchScenario(config, hardware, None, None, kept, priced)
    raw = read_ops_csv(config.input_csv)
    frame = normalise_frame(raw)
    check_size_limits(frame)
    return PredictBatchScenario(config, hardware, raw, frame)


@dataclass(frozen=True)
class PredictBatch:
    """Every row priced: the input rows plus ``predicted_ms``, and the totals."""

    scenario: PredictBatchScenario
    work: Work

    @cached_property
    def out(self) -> pd.DataFrame:
        """The input rows (strings) plus ``predicted_ms``."""
        out = self.scenario.rows.copy()
        out["predicted_ms"] = self.work.time_s * 1e3
        return out

    def write_csv(self, path: Path) -> None:
        """:attr:`out` as a CSV (``--output pred.csv``), written atomically; rows read by
        the fast path are written by it (the same bytes, without the frame of strings)."""
        if self.scenario.fast is not None:
            write_predictions(self.scenario.fast, self.work.time_s * 1e3, path)
            return
        from simcli.output import atomic_write_csv

        atomic_write_csv(self.out, path)

    def summary(self) -> dict[str, Any]:
        """gpu, cost model label, row count and total time (the object printed with
        ``--output``, which adds ``output``)."""
        s = self.scenario
        return {
            "gpu": s.config.gpu,
            "model": s.hardware.cost_model.label,
            "rows": len(self.work.time_s),
            "total_predicted_ms": float(np.sum(self.work.time_s) * 1e3),
        }

    def records(self) -> list[dict[str, Any]]:
        return self.out.to_dict(orient="records")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``simcli predict --input`` without ``--output``: the summary
        with ``rows`` the priced rows."""
        return {**self.summary(), "rows": self.records()}


def run_predict_batch(scenario: PredictBatchScenario) -> PredictBatch:
    work = scenario.priced
    if work is None:
        work = scenario.hardware.cost_model.work_many(scenario.frame, validated=True)
    return PredictBatch(scenario=scenario, work=work)


__all__ = [
    "AttentionConfig",
    "BlocksparseConfig",
    "CollectiveConfig",
    "DecodeConfig",
    "ElementwiseConfig",
    "GemmConfig",
    "LayerConfig",
    "LayerPrediction",
    "LayerScenario",
    "OpConfig",
    "OpPrediction",
    "OpScenario",
    "PredictBatch",
    "PredictBatchConfig",
    "PredictBatchScenario",
    "read_ops_csv",
    "resolve_layer",
    "resolve_op",
    "resolve_predict_batch",
    "run_layer",
    "run_op",
    "run_predict_batch",
]
