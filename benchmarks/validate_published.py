"""`simcli train` against published NeMo pre-training throughput on DGX H100 (FP8, and
long-context runs with context parallelism, 4k-1M tokens). Validation only: nothing of
simcli was fitted on these numbers (see data/nemo_published.yaml for sources and the
assumptions the tables leave open).

Run: python benchmarks/validate_published.py
The rows are built here and nowhere else; tests/simcli/test_published.py asserts bounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from costmodels.steps.composition import shipped_composition
from costmodels.steps.memory import estimate_memory
from hardware_specs.registry import get_gpu
from hardware_specs.schema import GIB
from simcli.scenario import resolve_hardware
from simcli.scenario.training import DEFAULT_MEMORY_MARGIN, memory_margin_bytes
from simcli.training.simulator import simulate_iteration
from workloads.models import ModelConfig, load_model
from workloads.plan import make_plan

PUBLISHED = Path(__file__).resolve().parent / "data" / "nemo_published.yaml"


def _iteration_s(model: ModelConfig, gpu: str, tp_comm: str = "plain", **plan: Any) -> float:
    p = make_plan(model, tp_comm=tp_comm, **plan)
    hw = resolve_hardware(gpu, p.num_gpus)
    res = simulate_iteration(
        model, p, system=hw.system, cost_model=hw.cost_model,
        composition=shipped_composition(gpu),
    )  # fmt: skip
    return res.iteration_s


def headroom_gib(model: ModelConfig, gpu: str, **plan: Any) -> float:
    """Usable memory left at the peak (negative: does not fit), less the default margin."""
    mem = estimate_memory(model, make_plan(model, **plan), get_gpu(gpu))
    margin = memory_margin_bytes(DEFAULT_MEMORY_MARGIN, mem.capacity_bytes)
    return (mem.capacity_bytes - margin - mem.total_bytes) / GIB


def _memory(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in ("fp8_params", "grad_reduce_dtype") if k in d}


def _layout(r: dict[str, Any]) -> dict[str, Any]:
    return dict(
        num_gpus=r["gpus"], tp=r["tp"], pp=r["pp"], cp=r["cp"], vpp=r["vpp"],
        pp_schedule="interleaved" if r["vpp"] > 1 else "1f1b",
    )  # fmt: skip


def fp8_rows(path: Path = PUBLISHED) -> list[dict[str, Any]]:
    """NeMo 24.07 FP8 rows: published vs simulated iteration seconds, with TP communication
    exposed (``tp_comm plain``) and with simcli's overlap model (``overlap``, TP > 1 only)."""
    d = yaml.safe_load(path.read_text())["fp8"]
    out = []
    for r in d["runs"]:
        model = load_model(r["model"])
        pub = r["global_batch"] * r["seq_len"] / (r["tokens_per_s_per_gpu"] * r["gpus"])
        plan = dict(
            _layout(r), global_batch=r["global_batch"], micro_batch=r["micro_batch"],
            seq_len=r["seq_len"], precision=d["precision"], zero=d["zero"], **_memory(d),
        )  # fmt: skip
        row = {"model": r["model"], "gpus": r["gpus"], "published_s": pub}
        row["headroom_gib"] = headroom_gib(model, d["gpu"], **plan)
        for tp_comm in ("plain", "overlap"):
            if tp_comm == "overlap" and r["tp"] == 1:
                row["overlap_s"] = row["plain_s"]
                continue
            row[f"{tp_comm}_s"] = _iteration_s(model, d["gpu"], tp_comm, **plan)
        row["error_pct"] = 100.0 * (row["plain_s"] / pub - 1.0)
        row["overlap_error_pct"] = 100.0 * (row["overlap_s"] / pub - 1.0)
        out.append(row)
    return out


def nemo_llama2_flops(model: ModelConfig, tokens: int, seq_len: int) -> float:
    """NeMo's llama2 model FLOPs of that release (nemo/utils/flops_formulas.py): the
    GEMMs, full s x s attention (no causal halving) and the LM head, forward + backward."""
    h, layers = model.hidden_size, model.num_layers
    per_token = layers * h * h * (
        12 + 12 * model.num_kv_heads / model.num_heads + 18 * model.ffn_hidden_size / h
        + 12 * seq_len / h + 6 * model.vocab_size / (layers * h)
    )  # fmt: skip
    return tokens * per_token


def long_context_rows(path: Path = PUBLISHED) -> list[dict[str, Any]]:
    """NeMo 24.03 LLAMA2-7B FP8 with context parallelism: published iteration seconds
    (NeMo's FLOPs over its TFLOPS per GPU) vs simulated."""
    d = yaml.safe_load(path.read_text())["long_context"]
    model = load_model(d["model"])
    out = []
    for r in d["runs"]:
        seq = r["seq_k"] * 1024
        gbs = r["dp"] * d["microbatches_per_dp_rank"]
        pub = nemo_llama2_flops(model, gbs * seq, seq) / (r["tflops_per_gpu"] * 1e12 * r["gpus"])
        plan = dict(
            _layout({**r, "vpp": 1}), global_batch=gbs, micro_batch=1, seq_len=seq,
            precision=d["precision"], zero=d["zero"], **_memory(d),
        )  # fmt: skip
        sim = _iteration_s(model, d["gpu"], **plan)
        out.append(
            {
                "seq_k": r["seq_k"],
                "gpus": r["gpus"],
                "cp": r["cp"],
                "published_s": pub,
                "simulated_s": sim,
                "error_pct": 100.0 * (sim / pub - 1.0),
                "headroom_gib": headroom_gib(model, d["gpu"], **plan),
            }
        )
    return out


def main() -> None:
    rows = fp8_rows()
    print("NeMo 24.07 FP8 pre-training on DGX H100 (tokens/s/GPU -> seconds per iteration)")
    print(f"{'model':11s} {'gpus':>5s} {'published_s':>11s} {'tp_comm plain':>12s} {'error':>7s}"
          f" {'overlap':>8s} {'error':>7s} {'headroom_gib':>12s}")  # fmt: skip
    for r in rows:
        print(f"{r['model']:11s} {r['gpus']:5d} {r['published_s']:11.3f} "
              f"{r['plain_s']:12.3f} {r['error_pct']:+6.1f}% {r['overlap_s']:8.3f} "
              f"{r['overlap_error_pct']:+6.1f}% {r['headroom_gib']:12.1f}")  # fmt: skip
    for key, what in (("error_pct", "TP comm exposed"), ("overlap_error_pct", "TP overlap model")):
        errs = [abs(r[key]) for r in rows]
        print(f"{what}: mean |error| {sum(errs) / len(errs):.1f}%  max {max(errs):.1f}%")
    rows = long_context_rows()
    print("\nNeMo 24.03 LLAMA2-7B FP8 with context parallelism on DGX H100, 4k-1M tokens")
    print(f"{'seq':>6s} {'gpus':>5s} {'cp':>3s} {'published_s':>11s} {'simulated_s':>11s} "
          f"{'error':>7s} {'headroom_gib':>12s}")  # fmt: skip
    for r in rows:
        print(f"{r['seq_k']:5d}k {r['gpus']:5d} {r['cp']:3d} {r['published_s']:11.2f} "
              f"{r['simulated_s']:11.2f} {r['error_pct']:+6.1f}% "
              f"{r['headroom_gib']:12.1f}")  # fmt: skip
    errs = [abs(r["error_pct"]) for r in rows]
    print(f"mean |error| {sum(errs) / len(errs):.1f}%  max {max(errs):.1f}%")


if __name__ == "__main__":
    main()
