"""Validation runs of the training simulator against measured and published iterations.

Shared by ``benchmarks/validate_training.py`` (prints the tables) and the tests (assert
the error bounds), so the figures quoted in the README come from one place.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pandas as pd
import yaml

from simcli.training.simulator import simulate_iteration
from workloads.models import ModelConfig, load_model
from workloads.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]
STEPS_CSV = ROOT / "calibrate" / "data" / "steps-h100" / "train_step.csv"
DIST_DIR = ROOT / "calibrate" / "data" / "steps-h200-x4"


def megatron_rows() -> list[dict]:
    """Korthikanti et al. 2022 Table 4, simulated (see data/megatron_published.yaml)."""
    text = resources.files("simcli.training").joinpath("data/megatron_published.yaml")
    d = yaml.safe_load(text.read_text())
    out = []
    for r in d["runs"]:
        model = load_model(r["model"])
        for mode in ("full", "seqsel"):
            plan = make_plan(
                model,
                num_gpus=r["gpus"],
                tp=r["tp"],
                pp=r["pp"],
                vpp=r["vpp"],
                global_batch=r["global_batch"],
                micro_batch=r["micro_batch"],
                seq_len=d["seq_len"],
                precision=d["precision"],
                pp_schedule="interleaved" if r["vpp"] > 1 else "1f1b",
                recompute="full" if mode == "full" else "selective",
                sequence_parallel=mode != "full",
            )
            res = simulate_iteration(model, plan, d["gpu"], framework="megatron-unfused")
            pub = r[f"{mode}_s"]
            out.append(
                {
                    "model": r["model"],
                    "mode": mode,
                    "published_s": pub,
                    "simulated_s": res.iteration_s,
                    "error_pct": 100.0 * (res.iteration_s / pub - 1.0),
                }
            )
    return out


def step_model(row: pd.Series) -> ModelConfig:
    """The Llama-style architecture of one train_step.csv row."""
    return ModelConfig(
        id=str(row.model),
        name=str(row.model),
        family="llama",
        num_layers=int(row.layers),
        hidden_size=int(row.hidden),
        num_heads=int(row.heads),
        num_kv_heads=int(row.kv_heads),
        head_dim=int(row.head_dim),
        ffn_hidden_size=int(row.ffn),
        vocab_size=int(row.vocab),
        max_seq_len=int(row.seq_len),
        activation="swiglu",
        norm="rmsnorm",
        position="rope",
        source=f"calibrate/data/steps-h100/train_step.csv ({row.model})",
    )


def h100_step_rows(path: Path = STEPS_CSV) -> list[dict]:
    """Every ok row of the measured single-H100 steps, simulated."""
    df = pd.read_csv(path)
    out = []
    for _, row in df[df.status == "ok"].iterrows():
        model = step_model(row)
        plan = make_plan(
            model,
            num_gpus=1,
            global_batch=int(row.batch),
            micro_batch=int(row.batch),
            seq_len=int(row.seq_len),
            precision="bf16-mixed",
        )
        res = simulate_iteration(model, plan, "h100-sxm", attn_backend="cudnn", framework="pytorch")
        ms = res.iteration_s * 1e3
        out.append(
            {
                "model": str(row.model),
                "shape": f"{int(row.batch)}x{int(row.seq_len)}",
                "measured_ms": float(row.step_ms),
                "simulated_ms": ms,
                "error_pct": 100.0 * (ms / float(row.step_ms) - 1.0),
                "peak_allocated_bytes": float(row.peak_allocated_bytes),
            }
        )
    return out


def h200_dist_rows(folder: Path = DIST_DIR) -> list[dict]:
    """Measured 1/2/4-GPU steps on H200s (single GPU, DDP = ZeRO-0 with overlapped
    all-reduce, FSDP = ZeRO-3), simulated. ``fitted`` marks the rows the overlap
    interference constant was fitted on (simulator.INTERFERENCE)."""
    frames = []
    single = pd.read_csv(folder / "train_step.csv")
    frames.append(single.assign(mode="single", world_size=1))
    for path in sorted(folder.glob("dist_step.*.csv")):
        frames.append(pd.read_csv(path))
    out = []
    for _, row in pd.concat(frames).iterrows():
        if row.status != "ok":
            continue
        model = step_model(row)
        n = int(row.world_size)
        zero = {"single": 0, "ddp": 0, "fsdp": 3}[str(row["mode"])]
        plan = make_plan(
            model,
            num_gpus=n,
            global_batch=int(row.batch) * n,
            micro_batch=int(row.batch),
            seq_len=int(row.seq_len),
            zero=zero,
            grad_bucket_bytes=25 * 2**20,  # DDP's default bucket_cap_mb
        )
        res = simulate_iteration(model, plan, "h200-sxm", attn_backend="cudnn", framework="pytorch")
        ms = res.iteration_s * 1e3
        out.append(
            {
                "mode": str(row["mode"]),
                "gpus": n,
                "shape": f"{int(row.batch)}x{int(row.seq_len)}",
                "measured_ms": float(row.step_ms),
                "simulated_ms": ms,
                "error_pct": 100.0 * (ms / float(row.step_ms) - 1.0),
                "fitted": str(row["mode"]) == "ddp" and n == 2,
            }
        )
    return out
