"""``simcli train``: time, throughput, MFU and memory of one training iteration."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import typer

from costmodels.ops.select import get_cost_model
from hardware_specs.registry import load_catalog, load_hardware_file
from simcli.errors import user_errors
from simcli.output import (
    Format,
    atomic_write_csv,
    atomic_write_json,
    emit_object,
)
from simcli.progress import set_quiet
from simcli.reports.bundle import (
    check_output_path,
    cli_inputs,
    config_document,
    output_is_dir,
    write_output_dir,
)
from simcli.training.simulator import simulate_iteration
from workloads.models import load_model
from workloads.plan import PlanError, make_plan

app = typer.Typer(help="Simulate one training iteration of a parallel plan.")

GIB = 1024**3


def _layer_split(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise PlanError(
            f"--layer-split {text!r} is not a comma list of integers; allowed: e.g. 7,8,8,9"
        ) from None


@app.callback(invoke_without_command=True)
def train(
    model: str = typer.Option(..., "--model", help="Built-in model id or config.json."),
    gpu: str = typer.Option(..., "--gpu", help="GPU id (see `simcli specs list`)."),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job (reference nodes)."),
    tp: int = typer.Option(1, "--tp"),
    pp: int = typer.Option(1, "--pp"),
    dp: int | None = typer.Option(None, "--dp", help="default: gpus / (tp*pp*cp)"),
    vpp: int = typer.Option(1, "--vpp", help="virtual stages per rank (interleaved)"),
    cp: int = typer.Option(1, "--cp"),
    cp_kind: str = typer.Option("ring", "--cp-kind", help="ring | ulysses | tokenring"),
    ep: int = typer.Option(1, "--ep", help="expert parallel (MoE)"),
    zero: int = typer.Option(0, "--zero", help="0 | 1 | 2 | 3"),
    micro_batch: int = typer.Option(1, "--micro-batch"),
    global_batch: int = typer.Option(..., "--global-batch"),
    seq_len: int = typer.Option(..., "--seq-len"),
    pp_schedule: str = typer.Option("1f1b", "--pp-schedule", help="1f1b | gpipe | interleaved"),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full"),
    sequence_parallel: bool | None = typer.Option(
        None, "--sequence-parallel/--no-sequence-parallel", help="default: on when tp > 1"
    ),
    precision: str = typer.Option(
        "bf16-mixed", "--precision", help="bf16-mixed | fp16-mixed | bf16 | fp8"
    ),
    tp_comm: str = typer.Option("plain", "--tp-comm", help="plain | overlap | ladder"),
    layer_split: str | None = typer.Option(
        None, "--layer-split", help="layers per stage, e.g. 7,9"
    ),
    framework: str = typer.Option("megatron", "--framework", help="megatron | pytorch (eager)"),
    attn_backend: str = typer.Option("", "--attn-backend", help="flash | cudnn | ... (default)"),
    attn_pattern: str | None = typer.Option(
        None,
        "--attn-pattern",
        help="Sparse attention pattern for every layer (e.g. window:4096, nsa, "
        "hybrid:dense_every=4,inner=nsa; see `simcli sparsity compare`).",
    ),
    profile: Path | None = typer.Option(None, "--profile", help="Calibration profile."),
    hardware: Path | None = typer.Option(None, "--hardware", help="Extra hardware spec file."),
    cluster: Path | None = typer.Option(
        None,
        "--cluster",
        help="Hardware file describing one cluster (node groups, measured NIC bandwidths) "
        "instead of reference nodes on a fat-tree.",
    ),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        "--trace-output",
        help="Write the simulated timeline as Chrome/Perfetto trace JSON (ui.perfetto.dev).",
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Folder for summary/breakdown/stages/memory/timeline CSVs, config.json and "
        "report.html; a .json or .csv name writes just the result object or row.",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress output."),
    ignore_memory: bool = typer.Option(
        False, "--ignore-memory", help="Report a plan even if it does not fit in memory."
    ),
    fmt: Format = typer.Option(Format.table, "--format", help="table | json | csv"),
) -> None:
    """Iteration time, tokens/s, MFU, peak memory and a time breakdown for one plan."""
    set_quiet(quiet)
    with user_errors():
        inputs = cli_inputs()
        check_output_path(output, "--output")
        check_output_path(trace, "--trace", kind="file")
        cfg = load_model(model)
        if framework not in ("megatron", "pytorch"):
            raise PlanError(f"--framework {framework!r}; allowed: megatron, pytorch")
        plan = make_plan(
            cfg,
            num_gpus=gpus,
            tp=tp,
            pp=pp,
            dp=dp,
            vpp=vpp,
            cp=cp,
            cp_kind=cp_kind,
            ep=ep,
            zero=zero,
            micro_batch=micro_batch,
            global_batch=global_batch,
            seq_len=seq_len,
            pp_schedule=pp_schedule,
            recompute=recompute,
            sequence_parallel=sequence_parallel,
            precision=precision,
            tp_comm=tp_comm,
            layer_split=_layer_split(layer_split),
        )
        catalog = load_catalog(hardware)
        if cluster is not None:
            catalog = catalog.merged(load_hardware_file(cluster), f"cluster file {cluster}")
            spec = load_hardware_file(cluster).clusters
            if len(spec) != 1:
                raise PlanError(
                    f"cluster file {cluster} describes {len(spec)} clusters; allowed: exactly one"
                )
            system = catalog.system_for_cluster(spec[0], gpus)
            if system.gpu.id != gpu:
                raise PlanError(
                    f"--gpu {gpu} but cluster {spec[0].name} has {system.gpu.id}; "
                    f"allowed: --gpu {system.gpu.id}"
                )
            total = spec[0].num_nodes * system.node.gpus_per_node
            if gpus > total:
                raise PlanError(f"--gpus {gpus} exceeds the {total} GPUs of cluster {spec[0].name}")
        else:
            system = catalog.system(gpu, gpus)
        if plan.compute_dtype == "fp8" and "fp8" not in {
            d.value for d in system.gpu.peak_dense_tflops
        }:
            raise PlanError(f"--precision fp8 needs fp8 tensor cores; {gpu} has none")
        cm = get_cost_model(gpu, profile=profile, num_gpus=gpus, catalog=catalog)
        # (the cost model prices the first node's NICs; the simulator scales the
        # scale-out traffic of other nodes by their bandwidth, see System.slowdown)
        costs = None
        if attn_pattern is not None:
            from costmodels.steps.training import step_costs
            from simcli.sparsity.whatif import sparse_step_costs

            base = step_costs(cfg, plan, cm, system, attn_backend, framework)  # type: ignore[arg-type]
            costs = sparse_step_costs(cfg, plan, attn_pattern, gpu, base=base)
        res = simulate_iteration(
            cfg,
            plan,
            gpu,
            costs=costs,
            cost_model=cm,
            catalog=catalog,
            attn_backend=attn_backend,
            keep_spans=trace is not None or output is not None,
            framework=framework,  # type: ignore[arg-type]
            system=system,
        )
        from costmodels.steps.memory import estimate_memory

        mem = estimate_memory(cfg, plan, system.gpu, framework=framework)  # type: ignore[arg-type]
        if not mem.fits and not ignore_memory:
            raise PlanError(
                f"plan does not fit: peak {mem.total_bytes / GIB:.1f} GiB per GPU on pipeline "
                f"rank {mem.peak_stage} > {mem.capacity_bytes / GIB:.1f} GiB of {gpu}; "
                "allowed: plans that fit (try --recompute selective|full, a higher --zero, "
                "more --tp/--pp, a smaller --micro-batch) or --ignore-memory"
            )
        out = {
            "model": cfg.id,
            "gpu": gpu,
            "num_gpus": gpus,
            "cost_model": getattr(cm, "label", ""),
            "iteration_s": res.iteration_s,
            "tokens_per_s": res.tokens_per_s,
            "tokens_per_s_per_gpu": res.tokens_per_s / gpus,
            "mfu": res.mfu,
            "model_tflops_per_gpu": res.model_flops / res.iteration_s / gpus / 1e12,
            "peak_memory_gib": mem.total_bytes / GIB,
            "memory_capacity_gib": mem.capacity_bytes / GIB,
            "fits": mem.fits,
            "num_microbatches": res.num_microbatches,
            "breakdown_s": res.breakdown_s,
            "memory_gib": mem.breakdown_gib(),
            "stages": res.stages,
            "plan": plan.model_dump(mode="json") | {"dp": plan.data_parallel, "sp": plan.sp},
            "attn_pattern": attn_pattern,
        }
        flat = out | {f"breakdown_{k}": v for k, v in res.breakdown_s.items()}
        flat |= {f"memory_{k}_gib": v for k, v in mem.breakdown_gib().items()}
        if output is not None:
            _write_output(output, out, flat, res.spans, inputs, plan, system)
        if trace is not None:
            res.write_trace(trace)
        emit_object(flat if fmt == Format.csv else out, fmt, title=f"{cfg.id} on {gpus} x {gpu}")


def _write_output(path: Path, out: dict, flat: dict, spans, inputs: dict, plan, system) -> None:
    """``--output``: a folder bundle, or the JSON object (.json) / flat row (.csv)."""
    if not output_is_dir(path):
        if path.suffix.lower() == ".json":
            atomic_write_json(path, out)
        else:
            scalars = {k: v for k, v in flat.items() if not isinstance(v, dict | list)}
            atomic_write_csv(pd.DataFrame([scalars]), path)
        return
    from simcli.reports import train as train_report

    csvs, page = train_report.build(out, spans)
    resolved = {
        "plan": out["plan"],
        "cost_model": out["cost_model"],
        "gpu": system.gpu.model_dump(mode="json"),
        "node": system.node.id,
        "num_nodes": system.num_nodes,
    }
    config = config_document("train", inputs, resolved=resolved)
    write_output_dir(path, csvs=csvs, config=config, report_html=page)
