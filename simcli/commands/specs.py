"""``simcli specs list|show``: the hardware catalogue."""

from __future__ import annotations

from pathlib import Path

import typer

from hardware_specs.registry import SpecError, load_catalog
from simcli.errors import user_errors
from simcli.options import SimcliGroup
from simcli.output import Format, emit_object, emit_records

app = typer.Typer(
    cls=SimcliGroup, help="GPUs, links and reference nodes simcli knows.", no_args_is_help=True
)

FormatOpt = typer.Option(Format.table, "--format", help="table | json | csv")
HardwareOpt = typer.Option(None, "--hardware", help="Extra hardware spec file (YAML/JSON).")


def _gpu_row(g) -> dict:
    return {
        "id": g.id,
        "name": g.name,
        "architecture": g.architecture,
        "sms": g.sm_count,
        "memory_gib": g.memory_gib,
        "hbm_tb_per_s": g.memory_bandwidth_gb_per_s / 1000,
        "bf16_dense_tflops": g.peak_dense_tflops.get("bf16"),
        "fp8_dense_tflops": g.peak_dense_tflops.get("fp8"),
        "tdp_w": g.tdp_w,
    }


@app.command("list")
def list_specs(
    kind: str = typer.Option("gpus", "--kind", help="gpus | links | nodes"),
    fmt: Format = FormatOpt,
    hardware: Path | None = HardwareOpt,
) -> None:
    """List known GPUs (default), links or reference nodes."""
    with user_errors():
        cat = load_catalog(hardware)
        if kind == "gpus":
            rows = [_gpu_row(g) for g in cat.gpus.values()]
        elif kind == "links":
            rows = [
                {
                    "id": lk.id,
                    "name": lk.name,
                    "kind": lk.kind,
                    "gb_per_s_per_direction": lk.bandwidth_gb_per_s,
                    "latency_us": lk.latency_us,
                }
                for lk in cat.links.values()
            ]
        elif kind == "nodes":
            rows = [
                {
                    "id": n.id,
                    "name": n.name,
                    "gpu": n.gpu,
                    "gpus_per_node": n.gpus_per_node,
                    "intra_node_link": n.intra_node_link,
                    "intra_node_gb_per_s": n.intra_node_gb_per_s,
                    "nic": n.nic,
                    "nics_per_gpu": n.nics_per_gpu,
                }
                for n in cat.nodes.values()
            ]
        else:
            raise SpecError(f"unknown --kind {kind!r}; allowed: gpus, links, nodes")
        emit_records(rows, fmt, title=f"simcli {kind}", json_key=kind)


@app.command("show")
def show_spec(
    spec_id: str = typer.Argument(..., metavar="ID", help="A GPU, link or node id."),
    fmt: Format = FormatOpt,
    hardware: Path | None = HardwareOpt,
) -> None:
    """Every field of one GPU, link or node, with its sources."""
    with user_errors():
        cat = load_catalog(hardware)
        for table in (cat.gpus, cat.nodes, cat.links):
            if spec_id in table:
                data = table[spec_id].model_dump(mode="json")
                break
        else:
            known = sorted({*cat.gpus, *cat.nodes, *cat.links})
            raise SpecError(f"unknown spec id {spec_id!r}; known: {', '.join(known)}")
        if spec_id in cat.gpus:
            data["reference_node"] = cat.reference_node(spec_id).id
            data["cost_model"] = _provenance(spec_id, cat)
        emit_object(data, fmt, title=spec_id)


def _provenance(gpu_id: str, catalog) -> dict:
    """How ``simcli`` prices ops on this GPU by default (calibrated, transferred or
    datasheet) and the error to expect: what a user should know before trusting it."""
    from costmodels.ops.select import get_cost_model

    prov = get_cost_model(gpu_id, catalog=catalog).provenance
    return {
        "provenance": prov.kind,
        "source": prov.source,
        "expected_error_pct": round(prov.expected_error * 100, 1),
        "error_basis": prov.error_basis,
        "power": prov.power,
    }
