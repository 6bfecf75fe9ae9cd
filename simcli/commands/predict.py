"""``simcli predict``: op-level time predictions, batch (CSV) or one op at a time.

Every command's options are the fields of its config in :mod:`simcli.scenario.predict`
(plus where the results go); each parses, resolves the op(s) and the hardware, prices
them and emits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import typer

from simcli.errors import user_errors
from simcli.options import SimcliGroup, config_options
from simcli.output import (
    Format,
    atomic_write_csv,
    atomic_write_json,
    emit_object,
    emit_records,
)
from simcli.reports.bundle import check_output_path, cli_inputs, output_is_dir
from simcli.scenario.predict import (
    AttentionConfig,
    BlocksparseConfig,
    CollectiveConfig,
    DecodeConfig,
    ElementwiseConfig,
    GemmConfig,
    LayerConfig,
    LayerPrediction,
    OpConfig,
    OpPrediction,
    PredictBatch,
    PredictBatchConfig,
    read_ops_csv,
    resolve_layer,
    resolve_op,
    resolve_predict_batch,
    run_layer,
    run_op,
    run_predict_batch,
)

app = typer.Typer(
    cls=SimcliGroup,
    help=(
        "Predict op times. Batch: simcli predict --gpu ID --input ops.csv --output pred.csv. "
        "One op: simcli predict gemm|attention|decode|blocksparse|collective|elementwise ..."
    ),
    invoke_without_command=True,
)

FormatOpt = typer.Option(Format.table, "--format", help="table | json | csv")
OutputOpt = typer.Option(
    None,
    "--output",
    help="prediction.csv (one row: the op's columns plus predicted_ms) or .json; any other "
    "name is a folder: predictions.csv, by_op.csv, config.json and report.html.",
)


def _resolved(path: Path | None) -> str | None:
    return None if path is None else str(path.resolve())


@app.callback()
@config_options(PredictBatchConfig)
def batch(
    config: PredictBatchConfig,
    ctx: typer.Context,
    output_csv: Path | None = typer.Option(
        None,
        "--output",
        help="pred.csv (or .json): the input rows plus predicted_ms. Any other name is a "
        "folder: predictions.csv, by_op.csv, config.json and report.html.",
    ),
    fmt: Format = FormatOpt,
) -> None:
    """Batch mode: every row of --input priced on --gpu, written to --output."""
    if ctx.invoked_subcommand is not None:
        return
    with user_errors():
        if config.input_csv is not None and config.gpu is not None:
            check_output_path(output_csv)
        pred = run_predict_batch(resolve_predict_batch(config))
        if output_csv is None:
            title = f"predictions on {config.gpu}"
            emit_records(pred.records(), fmt, title=title, json_wrapper=pred.summary())
            return
        if output_is_dir(output_csv):
            _write_batch_bundle(output_csv, pred)
        elif output_csv.suffix.lower() == ".json":
            atomic_write_json(output_csv, pred.to_dict())  # what --format json prints
        else:
            pred.write_csv(output_csv)
        emit_object({**pred.summary(), "output": str(output_csv)}, fmt, title="simcli predict")


def _write_batch_bundle(folder: Path, pred: PredictBatch) -> None:
    from simcli.reports.predict import write_predict_bundle

    c, cost = pred.scenario.config, pred.scenario.hardware.cost_model
    inputs = {
        "gpu": c.gpu,
        "input": _resolved(c.input_csv),
        "profile": _resolved(c.profile),
        "hardware": _resolved(c.hardware),
    }
    write_predict_bundle(
        folder,
        gpu=cost.gpu,
        model_label=cost.label,
        inputs=inputs,
        out=pred.out,
        frame=pred.scenario.frame,
        time_s=pred.work.time_s,
        flops=pred.work.flops,
        nbytes=pred.work.bytes,
    )


def _one_op(config: OpConfig, fmt: Format, output: Path | None) -> None:
    """One op's prediction; ``output`` as in batch mode (a one-row predictions.csv)."""
    with user_errors():
        scenario = resolve_op(config)
        check_output_path(output)
        pred = run_op(scenario)
        if output is not None:
            _write_op(output, pred)
        gpu_id = scenario.hardware.cost_model.gpu.id
        emit_object(pred.to_dict(), fmt, title=f"{scenario.op.op.value} on {gpu_id}")


def _write_op(output: Path, pred: OpPrediction) -> None:
    import pandas as pd

    op, cost, work = pred.scenario.op, pred.scenario.hardware.cost_model, pred.work
    row = pd.DataFrame([op.row()]).dropna(axis=1, how="all")
    row["predicted_ms"] = pred.time_s * 1e3
    if output_is_dir(output):
        from simcli.reports.predict import write_predict_bundle
        from workloads.ops import ops_frame

        write_predict_bundle(
            output,
            gpu=cost.gpu,
            model_label=cost.label,
            inputs={**cli_inputs(), "op": op.op.value},
            out=row,
            frame=ops_frame([op]),
            time_s=work.time_s,
            flops=work.flops,
            nbytes=work.bytes,
        )
    elif output.suffix.lower() == ".json":
        atomic_write_json(output, pred.to_dict())
    else:
        atomic_write_csv(row, output)


@app.command("gemm")
@config_options(GemmConfig)
def gemm(config: GemmConfig, fmt: Format = FormatOpt, output: Path | None = OutputOpt) -> None:
    """C[m,n] = A[m,k] . B[k,n]."""
    _one_op(config, fmt, output)


@app.command("attention")
@config_options(AttentionConfig)
def attention(
    config: AttentionConfig, fmt: Format = FormatOpt, output: Path | None = OutputOpt
) -> None:
    """Dense attention (FlashAttention-style kernels)."""
    _one_op(config, fmt, output)


@app.command("decode")
@config_options(DecodeConfig)
def decode(config: DecodeConfig, fmt: Format = FormatOpt, output: Path | None = OutputOpt) -> None:
    """Decode attention: new tokens over a KV cache (split-KV)."""
    _one_op(config, fmt, output)


@app.command("blocksparse")
@config_options(BlocksparseConfig)
def blocksparse(
    config: BlocksparseConfig, fmt: Format = FormatOpt, output: Path | None = OutputOpt
) -> None:
    """Block-sparse attention visiting `density` of the block_size x block_size tiles."""
    _one_op(config, fmt, output)


@app.command("collective")
@config_options(CollectiveConfig)
def collective(
    config: CollectiveConfig, fmt: Format = FormatOpt, output: Path | None = OutputOpt
) -> None:
    """NCCL collective over `ranks` GPUs in `nodes` reference nodes."""
    _one_op(config, fmt, output)


@app.command("elementwise")
@config_options(ElementwiseConfig)
def elementwise(
    config: ElementwiseConfig, fmt: Format = FormatOpt, output: Path | None = OutputOpt
) -> None:
    """Memory-bound ops priced by bytes moved."""
    _one_op(config, fmt, output)


@app.command("layer")
@config_options(LayerConfig)
def layer(config: LayerConfig, fmt: Format = FormatOpt, output: Path | None = OutputOpt) -> None:
    """Every op of one transformer layer on one TP rank, priced; the sum times the layers."""
    with user_errors():
        scenario = resolve_layer(config)
        check_output_path(output)
        pred = run_layer(scenario)
        if output is not None:
            _write_layer(output, pred)
        if fmt == Format.json:
            emit_records(pred.rows, fmt, json_wrapper=pred.summary, json_key="ops")
            return
        arch, ms = scenario.model, pred.layer_ms
        title = (
            f"{arch.id} layer on {config.gpu}: {ms:.3f} ms "
            f"({arch.num_layers} layers: {ms * arch.num_layers:.1f} ms)"
        )
        emit_records(pred.rows, fmt, title=title)


def _write_layer(output: Path, pred: LayerPrediction) -> None:
    """``predict layer --output``: the layer's ops (times x their count) as a predict bundle,
    or the rows as one CSV / the result as JSON."""
    import pandas as pd

    if not output_is_dir(output):
        if output.suffix.lower() == ".json":
            atomic_write_json(output, pred.to_dict())
        else:
            atomic_write_csv(pd.DataFrame(pred.rows), output)
        return
    from simcli.reports.predict import write_predict_bundle

    named, work, summary = pred.named, pred.work, pred.summary
    cost = pred.scenario.hardware.cost_model
    count = np.array([lo.count for _, lo in named], dtype=float)
    out = pd.DataFrame([lo.op.row() for _, lo in named]).dropna(axis=1, how="all")
    out.insert(0, "phase", [ph for ph, _ in named])
    out.insert(1, "name", [lo.name for _, lo in named])
    out.insert(2, "count", count.astype(int))
    out["predicted_ms"] = work.time_s * count * 1e3
    op = f"{summary['model']} layer ({summary['phase']})"
    inputs: dict[str, Any] = {**cli_inputs(), "op": op}
    write_predict_bundle(
        output,
        gpu=cost.gpu,
        model_label=cost.label,
        inputs=inputs,
        out=out,
        frame=pred.frame,
        time_s=work.time_s * count,
        flops=work.flops * count,
        nbytes=work.bytes * count,
    )


__all__ = ["app", "emit_records", "read_ops_csv"]
