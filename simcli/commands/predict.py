"""``simcli predict``: op-level time predictions, batch (CSV) or one op at a time."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import typer

from simcli.errors import fail, user_errors
from simcli.output import (
    Format,
    atomic_write_csv,
    atomic_write_json,
    emit_object,
    emit_records,
)
from simcli.reports.bundle import check_output_path, cli_inputs, output_is_dir
from simcli.scenario import resolve_hardware
from workloads.ops import CSV_COLUMNS, Op, OpError, OpKind, normalise_frame, ops_frame

app = typer.Typer(
    help=(
        "Predict op times. Batch: simcli predict --gpu ID --input ops.csv --output pred.csv. "
        "One op: simcli predict gemm|attention|decode|blocksparse|collective|elementwise ..."
    ),
    invoke_without_command=True,
)

FormatOpt = typer.Option(Format.table, "--format", help="table | json | csv")
GpuOpt = typer.Option(..., "--gpu", help="GPU id (see `simcli specs list`).")
ProfileOpt = typer.Option(None, "--profile", help="Calibration profile overriding the defaults.")
HardwareOpt = typer.Option(None, "--hardware", help="Extra hardware spec file (YAML/JSON).")
OutputOpt = typer.Option(
    None,
    "--output",
    help="prediction.csv (one row: the op's columns plus predicted_ms) or .json; any other "
    "name is a folder: predictions.csv, by_op.csv, config.json and report.html.",
)
DtypeOpt = typer.Option("bf16", "--dtype", help="fp64 | fp32 | tf32 | bf16 | fp16 | fp8 | int8")


def read_ops_csv(path: Path) -> pd.DataFrame:
    """Read an ops CSV as strings (values are validated by ``normalise_frame``)."""
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
    return raw


def _model(gpu: str, profile: Path | None, hardware: Path | None):
    """The calibrated profile for the GPU when one ships (or --profile), else the defaults."""
    return resolve_hardware(gpu, profile=profile, hardware_file=hardware).cost_model


def _resolved(path: Path | None) -> str | None:
    return None if path is None else str(path.resolve())


@app.callback()
def batch(
    ctx: typer.Context,
    gpu: str | None = typer.Option(None, "--gpu", help="GPU id (see `simcli specs list`)."),
    input_csv: Path | None = typer.Option(None, "--input", help="Ops CSV (contract columns)."),
    output_csv: Path | None = typer.Option(
        None,
        "--output",
        help="pred.csv (or .json): the input rows plus predicted_ms. Any other name is a "
        "folder: predictions.csv, by_op.csv, config.json and report.html.",
    ),
    profile: Path | None = ProfileOpt,
    hardware: Path | None = HardwareOpt,
    fmt: Format = FormatOpt,
) -> None:
    """Batch mode: every row of --input priced on --gpu, written to --output."""
    if ctx.invoked_subcommand is not None:
        return
    with user_errors():
        if input_csv is None or gpu is None:
            raise fail(
                "batch mode needs --gpu and --input (or use a subcommand: "
                "gemm, attention, decode, blocksparse, collective, elementwise)"
            )
        check_output_path(output_csv)
        model = _model(gpu, profile, hardware)
        raw = read_ops_csv(input_csv)
        frame = normalise_frame(raw)
        work = model.work_many(frame, validated=True)
        out = raw.copy()
        out["predicted_ms"] = work.time_s * 1e3
        summary = {
            "gpu": gpu,
            "model": model.label,
            "rows": len(out),
            "total_predicted_ms": float(np.sum(work.time_s) * 1e3),
        }
        if output_csv is not None and output_is_dir(output_csv):
            from simcli.reports.predict import write_predict_bundle

            inputs = {
                "gpu": gpu,
                "input": _resolved(input_csv),
                "profile": _resolved(profile),
                "hardware": _resolved(hardware),
            }
            write_predict_bundle(
                output_csv,
                gpu=model.gpu,
                model_label=model.label,
                inputs=inputs,
                out=out,
                frame=frame,
                time_s=work.time_s,
                flops=work.flops,
                nbytes=work.bytes,
            )
            summary["output"] = str(output_csv)
            emit_object(summary, fmt, title="simcli predict")
        elif output_csv is not None:
            atomic_write_csv(out, output_csv)
            summary["output"] = str(output_csv)
            emit_object(summary, fmt, title="simcli predict")
        else:
            records = out.to_dict(orient="records")
            emit_records(records, fmt, title=f"predictions on {gpu}", json_wrapper=summary)


def _report(model, op: Op, fmt: Format, output: Path | None = None) -> None:
    """One op's prediction; ``output`` as in batch mode (a one-row predictions.csv)."""
    check_output_path(output)
    work = model.work(op)
    t = float(work.time_s[0])
    flops, nbytes = float(work.flops[0]), float(work.bytes[0])
    result = {
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
    if model.power is not None:
        dtype = np.array([op.dtype.value])
        result["power_w"] = float(model.power.power_w(work, dtype, model.gpu)[0])
        result["energy_j"] = float(model.power.energy_j(work, dtype, model.gpu)[0])
    if output is not None:
        frame = ops_frame([op])
        row = pd.DataFrame([op.row()]).dropna(axis=1, how="all")
        row["predicted_ms"] = t * 1e3
        if output_is_dir(output):
            from simcli.reports.predict import write_predict_bundle

            inputs = {**cli_inputs(), "op": op.op.value}
            write_predict_bundle(
                output,
                gpu=model.gpu,
                model_label=model.label,
                inputs=inputs,
                out=row,
                frame=frame,
                time_s=work.time_s,
                flops=work.flops,
                nbytes=work.bytes,
            )
        elif output.suffix.lower() == ".json":
            atomic_write_json(output, result)
        else:
            atomic_write_csv(row, output)
    emit_object(result, fmt, title=f"{op.op.value} on {model.gpu.id}")


@app.command("gemm")
def gemm(
    m: int = typer.Option(..., "--m", help="rows of A and C"),
    n: int = typer.Option(..., "--n", help="columns of B and C"),
    k: int = typer.Option(..., "--k", help="inner dimension"),
    batch_count: int = typer.Option(1, "--batch", help="independent products (bmm)"),
    dtype: str = DtypeOpt,
    gpu: str = GpuOpt,
    profile: Path | None = ProfileOpt,
    hardware: Path | None = HardwareOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
) -> None:
    """C[m,n] = A[m,k] . B[k,n]."""
    with user_errors():
        op = Op(op=OpKind.gemm, m=m, n=n, k=k, batch=batch_count, dtype=dtype)
        _report(_model(gpu, profile, hardware), op, fmt, output)


@app.command("attention")
def attention(
    phase: str = typer.Option("fwd", "--phase", help="fwd | bwd | fwdbwd"),
    batch_size: int = typer.Option(1, "--batch"),
    seq_q: int = typer.Option(..., "--seq-q"),
    seq_kv: int | None = typer.Option(None, "--seq-kv", help="defaults to --seq-q"),
    heads_q: int = typer.Option(..., "--heads-q"),
    heads_kv: int | None = typer.Option(None, "--heads-kv", help="defaults to --heads-q"),
    head_dim: int = typer.Option(128, "--head-dim"),
    causal: bool = typer.Option(True, "--causal/--no-causal"),
    backend: str = typer.Option("", "--backend", help="flash | cudnn | flex | efficient"),
    dtype: str = DtypeOpt,
    gpu: str = GpuOpt,
    profile: Path | None = ProfileOpt,
    hardware: Path | None = HardwareOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
) -> None:
    """Dense attention (FlashAttention-style kernels)."""
    with user_errors():
        kinds = {"fwd": OpKind.attn_fwd, "bwd": OpKind.attn_bwd, "fwdbwd": OpKind.attn_fwdbwd}
        if phase not in kinds:
            raise OpError(f"unknown --phase {phase!r}; allowed: fwd, bwd, fwdbwd")
        op = Op(
            op=kinds[phase],
            batch=batch_size,
            seq_q=seq_q,
            seq_kv=seq_kv or seq_q,
            heads_q=heads_q,
            heads_kv=heads_kv or heads_q,
            head_dim=head_dim,
            causal=causal,
            backend=backend or None,
            dtype=dtype,
        )
        _report(_model(gpu, profile, hardware), op, fmt, output)


@app.command("decode")
def decode(
    batch_size: int = typer.Option(1, "--batch"),
    context_len: int = typer.Option(..., "--context-len", help="KV-cache length (seq_kv)"),
    new_tokens: int = typer.Option(1, "--seq-q", help="query tokens per sequence"),
    heads_q: int = typer.Option(..., "--heads-q"),
    heads_kv: int | None = typer.Option(None, "--heads-kv"),
    head_dim: int = typer.Option(128, "--head-dim"),
    dtype: str = DtypeOpt,
    gpu: str = GpuOpt,
    profile: Path | None = ProfileOpt,
    hardware: Path | None = HardwareOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
) -> None:
    """Decode attention: new tokens over a KV cache (split-KV)."""
    with user_errors():
        op = Op(
            op=OpKind.attn_decode,
            batch=batch_size,
            seq_q=new_tokens,
            seq_kv=context_len,
            heads_q=heads_q,
            heads_kv=heads_kv or heads_q,
            head_dim=head_dim,
            dtype=dtype,
        )
        _report(_model(gpu, profile, hardware), op, fmt, output)


@app.command("blocksparse")
def blocksparse(
    phase: str = typer.Option("fwd", "--phase", help="fwd | bwd"),
    batch_size: int = typer.Option(1, "--batch"),
    seq_len: int = typer.Option(..., "--seq-len"),
    heads_q: int = typer.Option(..., "--heads-q"),
    heads_kv: int | None = typer.Option(None, "--heads-kv"),
    head_dim: int = typer.Option(128, "--head-dim"),
    density: float = typer.Option(..., "--density", help="fraction of tiles visited, (0, 1]"),
    block_size: int = typer.Option(128, "--block-size"),
    backend: str = typer.Option("", "--backend", help="flex | flash"),
    dtype: str = DtypeOpt,
    gpu: str = GpuOpt,
    profile: Path | None = ProfileOpt,
    hardware: Path | None = HardwareOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
) -> None:
    """Block-sparse attention visiting `density` of the block_size x block_size tiles."""
    with user_errors():
        kinds = {"fwd": OpKind.attn_blocksparse_fwd, "bwd": OpKind.attn_blocksparse_bwd}
        if phase not in kinds:
            raise OpError(f"unknown --phase {phase!r}; allowed: fwd, bwd")
        op = Op(
            op=kinds[phase],
            batch=batch_size,
            seq_q=seq_len,
            seq_kv=seq_len,
            heads_q=heads_q,
            heads_kv=heads_kv or heads_q,
            head_dim=head_dim,
            density=density,
            block_size=block_size,
            backend=backend or None,
            dtype=dtype,
        )
        _report(_model(gpu, profile, hardware), op, fmt, output)


@app.command("collective")
def collective(
    kind: str = typer.Option(
        "all_reduce",
        "--kind",
        help="all_reduce | all_gather | reduce_scatter | all_to_all | send_recv",
    ),
    nbytes: int = typer.Option(..., "--bytes", help="nccl-tests size: buffer per rank"),
    ranks: int = typer.Option(8, "--ranks"),
    nodes: int = typer.Option(1, "--nodes", help="nodes the ranks span"),
    gpu: str = GpuOpt,
    profile: Path | None = ProfileOpt,
    hardware: Path | None = HardwareOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
) -> None:
    """NCCL collective over `ranks` GPUs in `nodes` reference nodes."""
    with user_errors():
        allowed = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
        if kind not in allowed:
            raise OpError(f"unknown --kind {kind!r}; allowed: {', '.join(allowed)}")
        op = Op(op=OpKind(kind), bytes=nbytes, ranks=ranks, nodes=nodes)
        _report(_model(gpu, profile, hardware), op, fmt, output)


@app.command("elementwise")
def elementwise(
    kind: str = typer.Option(..., "--op", help="copy | rmsnorm | swiglu | rope | softmax | ..."),
    m: int | None = typer.Option(None, "--m", help="tokens / rows"),
    n: int | None = typer.Option(None, "--n", help="hidden / columns / parameters (adamw)"),
    nbytes: int | None = typer.Option(None, "--bytes", help="bytes read (copy)"),
    dtype: str = DtypeOpt,
    gpu: str = GpuOpt,
    profile: Path | None = ProfileOpt,
    hardware: Path | None = HardwareOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
) -> None:
    """Memory-bound ops priced by bytes moved."""
    with user_errors():
        from workloads.ops import ELEMENTWISE_KINDS

        allowed = sorted(k.value for k in ELEMENTWISE_KINDS)
        if kind not in allowed:
            raise OpError(f"unknown --op {kind!r}; allowed: {', '.join(allowed)}")
        op = Op(op=OpKind(kind), m=m, n=n, bytes=nbytes, dtype=dtype)
        _report(_model(gpu, profile, hardware), op, fmt, output)


@app.command("layer")
def layer(
    model: str = typer.Option(..., "--model", help="Built-in model id or a config.json path."),
    batch_size: int = typer.Option(1, "--batch", help="sequences per micro-batch"),
    seq_len: int = typer.Option(..., "--seq-len"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel degree"),
    phase: str = typer.Option("fwd", "--phase", help="fwd | bwd | fwdbwd"),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel/--no-sequence-parallel"),
    backend: str = typer.Option("", "--backend", help="attention backend: flash | cudnn | flex"),
    dtype: str = DtypeOpt,
    gpu: str = GpuOpt,
    profile: Path | None = ProfileOpt,
    hardware: Path | None = HardwareOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
) -> None:
    """Every op of one transformer layer on one TP rank, priced; the sum times the layers."""
    with user_errors():
        from workloads.decompose import layer_backward_ops, layer_forward_ops
        from workloads.models import load_model

        if phase not in ("fwd", "bwd", "fwdbwd"):
            raise OpError(f"unknown --phase {phase!r}; allowed: fwd, bwd, fwdbwd")
        arch = load_model(model)
        cost = _model(gpu, profile, hardware)
        args = (arch, batch_size, seq_len, tp, sequence_parallel, dtype, backend)
        named = []
        if phase in ("fwd", "fwdbwd"):
            named += [("fwd", lo) for lo in layer_forward_ops(*args)]
        if phase in ("bwd", "fwdbwd"):
            named += [("bwd", lo) for lo in layer_backward_ops(*args)]
        per_node = cost.system.gpus_per_node
        ops = [
            lo.op.model_copy(update={"nodes": -(-tp // per_node)}) if lo.op.ranks else lo.op
            for _, lo in named
        ]
        check_output_path(output)
        frame = ops_frame(ops)
        work = cost.work_many(frame, validated=True)
        seconds = work.time_s
        rows = []
        for (ph, lo), t in zip(named, seconds, strict=True):
            rows.append(
                {
                    "phase": ph,
                    "name": lo.name,
                    "op": lo.op.op.value,
                    "count": lo.count,
                    "predicted_ms": t * lo.count * 1e3,
                }
            )
        layer_ms = sum(r["predicted_ms"] for r in rows)
        summary = {
            "model": arch.id,
            "gpu": gpu,
            "tp": tp,
            "batch": batch_size,
            "seq_len": seq_len,
            "phase": phase,
            "layer_ms": layer_ms,
            "all_layers_ms": layer_ms * arch.num_layers,
            "cost_model": cost.label,
        }
        if output is not None:
            _write_layer(output, cost, named, frame, work, rows, summary)
        if fmt == Format.json:
            emit_records(rows, fmt, json_wrapper=summary, json_key="ops")
        else:
            emit_records(
                rows,
                fmt,
                title=f"{arch.id} layer on {gpu}: {layer_ms:.3f} ms "
                f"({arch.num_layers} layers: {layer_ms * arch.num_layers:.1f} ms)",
            )


def _write_layer(output: Path, cost, named, frame, work, rows, summary) -> None:
    """``predict layer --output``: the layer's ops (times x their count) as a predict bundle,
    or the rows as one CSV / the result as JSON."""
    if not output_is_dir(output):
        if output.suffix.lower() == ".json":
            obj = {**summary, "ops": rows}
            atomic_write_json(output, obj)
        else:
            atomic_write_csv(pd.DataFrame(rows), output)
        return
    from simcli.reports.predict import write_predict_bundle

    count = np.array([lo.count for _, lo in named], dtype=float)
    out = pd.DataFrame([lo.op.row() for _, lo in named]).dropna(axis=1, how="all")
    out.insert(0, "phase", [ph for ph, _ in named])
    out.insert(1, "name", [lo.name for _, lo in named])
    out.insert(2, "count", count.astype(int))
    out["predicted_ms"] = work.time_s * count * 1e3
    inputs = {**cli_inputs(), "op": f"{summary['model']} layer ({summary['phase']})"}
    write_predict_bundle(
        output,
        gpu=cost.gpu,
        model_label=cost.label,
        inputs=inputs,
        out=out,
        frame=frame,
        time_s=work.time_s * count,
        flops=work.flops * count,
        nbytes=work.bytes * count,
    )


__all__ = ["app", "emit_records", "read_ops_csv"]
