"""Whole-iteration validation of `simcli train` against real runs (not its own formulas).

Run: python benchmarks/validate_training.py
1. Published Megatron-LM iteration times on DGX A100 (Korthikanti et al. 2022, Table 4),
   simulated with Megatron's pre-FlashAttention core attention (framework megatron-unfused).
2. Real single-H100 training steps of plain PyTorch Llama-style models measured by
   calibrate/steps/train_step.py (calibrate/data/steps-h100/train_step.csv), simulated with
   framework pytorch (eager kernels under autocast) and the cuDNN attention PyTorch picked.
3. Real 1/2/4-GPU DDP and FSDP steps of the same model on H200s
   (calibrate/data/steps-h200-x4, calibrate/steps/dist_step.py).
4. Real tensor-parallel (TP 2/4 with sequence parallelism), pipeline-parallel (1F1B, PP
   2/4), TP2 x PP2 and context-parallel (CP 2/4, PyTorch's ring attention) steps on 4
   H200s, with the one-GPU steps of the same machines (calibrate/data/steps-par-h200-x4,
   calibrate/steps/par_step.py): step time and every rank's peak memory.

The rows are built here and nowhere else: the tests (tests/simcli/test_simulator.py)
import :func:`megatron_rows`, :func:`h100_step_rows`, :func:`h200_dist_rows` and
:func:`h200_par_rows` to assert
the error bounds, so the figures quoted in the README come from one place. The published
runs are data/megatron_published.yaml next to this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from calibrate.trace.fit import FIT_MODELS, single_gpu_plan, step_model
from costmodels.steps.composition import shipped_composition
from costmodels.steps.memory import estimate_memory
from costmodels.steps.training import host_launches
from simcli.scenario import resolve_hardware
from simcli.training.simulator import TrainResult, simulate_iteration
from workloads.models import ModelConfig, load_model
from workloads.plan import TrainPlan, make_plan

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = Path(__file__).resolve().parent / "data" / "megatron_published.yaml"
STEPS_CSV = ROOT / "calibrate" / "data" / "steps-h100" / "train_step.csv"
DIST_DIR = ROOT / "calibrate" / "data" / "steps-h200-x4"
PAR_DIR = ROOT / "calibrate" / "data" / "steps-par-h200-x4"
#: a row is GPU-bound by the simulator's own terms when its host dispatch time (the
#: engine's host seconds per op times the ops it launches) is at most this share of the
#: GPU-bound iteration: several processes per host dispatched up to 1.9x slower per op
#: than one process on the same machine (calibrate/data/steps-par-h200-x4/README.md)
GPU_BOUND_HOST_SHARE = 0.5
#: whole steps with profiler traces (calibrate/steps/suite.sh), one folder per GPU
TRACED_DIRS = {
    "h100-sxm": (ROOT / "calibrate/data/steps2-h100-sxm", ROOT / "calibrate/data/steps3-h100-sxm"),
    "h200-sxm": (ROOT / "calibrate/data/steps2-h200-sxm", ROOT / "calibrate/data/steps3-h200-sxm"),
}
#: how each measured mode is simulated: eager PyTorch is the pytorch engine; compiled
#: blocks (fused elementwise) and torchao float8 (+compile) are the fused megatron engine
MODE_ENGINE = {"eager": ("pytorch", "bf16-mixed"), "compile": ("pytorch-compile", "bf16-mixed"),
               "fp8": ("pytorch-compile", "fp8")}  # fmt: skip


def _simulate(model: ModelConfig, plan: TrainPlan, gpu: str, **kw: Any) -> TrainResult:
    """One iteration of ``plan`` on ``plan.num_gpus`` GPUs of ``gpu`` (reference nodes,
    the shipped calibration)."""
    hw = resolve_hardware(gpu, plan.num_gpus)
    comp = shipped_composition(gpu)  # as `simcli train` resolves it
    return simulate_iteration(
        model, plan, system=hw.system, cost_model=hw.cost_model, composition=comp, **kw
    )


def megatron_rows() -> list[dict]:
    """Korthikanti et al. 2022 Table 4, simulated (see data/megatron_published.yaml)."""
    d = yaml.safe_load(PUBLISHED.read_text())
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
            res = _simulate(model, plan, d["gpu"], framework="megatron-unfused")
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


def h100_step_rows(path: Path = STEPS_CSV) -> list[dict]:
    """Every ok row of the measured single-H100 steps, simulated."""
    df = pd.read_csv(path)
    out = []
    for _, row in df[df.status == "ok"].iterrows():
        model = step_model(row)
        plan = single_gpu_plan(model, row, "bf16-mixed")
        res = _simulate(model, plan, "h100-sxm", attn_backend="cudnn", framework="pytorch")
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
        res = _simulate(model, plan, "h200-sxm", attn_backend="cudnn", framework="pytorch")
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


def _par_frames(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    """(lease, rows) of every par_step and one-GPU train_step CSV under ``folder``: one
    folder per device call (``main``, ``host``, ``cp``), one-GPU rows with mode
    ``single``; rows written before ``--cp`` existed get ``cp`` 1."""
    out = []
    for lease in sorted(p for p in folder.iterdir() if p.is_dir()):
        for csv in sorted(lease.glob("par/par_step.*.csv")):
            df = pd.read_csv(csv)
            if "cp" not in df:
                df = df.assign(cp=1, cp_rotate="")
            out.append((lease.name, df))
        for name in ("single", "single-alone"):
            csv = lease / name / "train_step.csv"
            if csv.exists():
                df = pd.read_csv(csv).assign(mode="single", tp=1, pp=1, cp=1, microbatches=1)
                per_rank = df.peak_allocated_bytes.astype(str)
                out.append((lease.name, df.assign(rank_peak_allocated_bytes=per_rank)))
    return out


def h200_par_rows(folder: Path = PAR_DIR) -> list[dict]:
    """Measured TP (with SP), PP (1F1B), TP x PP and CP steps on 2-4 H200s and the one-GPU
    steps of the same machines, simulated as :func:`h200_dist_rows` does (eager PyTorch,
    cuDNN attention, the shipped H200 calibration): ``tp``, ``pp``, ``cp`` (ring for K/V
    passed around the ring, allgather for gathered) and sequence parallelism (with TP) as
    run, the micro-batch and the global batch of its micro-batches, the layers split as
    the plan does. Memory: the largest peak of any
    rank against the estimate's, and each rank against its stage's
    (``rank_memory_error_pct``: the largest error of any rank). ``gpu_bound``: the
    simulator's host dispatch time is at most :data:`GPU_BOUND_HOST_SHARE` of its
    GPU-bound iteration (see there); the other rows are paced by the host, whose speed
    differs between machines of the same kind (the repeated shapes of the two device calls
    differ by up to 30%). Nothing here was fitted on these rows."""
    hw = resolve_hardware("h200-sxm", 1)
    host_s = shipped_composition("h200-sxm").host_s_per_op("pytorch")
    out = []
    for lease, df in _par_frames(folder):
        for _, row in df[df.status == "ok"].iterrows():
            model = step_model(row)
            tp, pp, cp, m = int(row.tp), int(row.pp), int(row.cp), int(row.microbatches)
            b, s = int(row.batch), int(row.seq_len)
            kind = "allgather" if row.get("cp_rotate") == "allgather" else "ring"
            plan = make_plan(
                model, num_gpus=tp * pp * cp, tp=tp, pp=pp, cp=cp, cp_kind=kind, micro_batch=b,
                global_batch=b * m, seq_len=s, sequence_parallel=tp > 1, pp_schedule="1f1b",
            )  # fmt: skip
            res = _simulate(model, plan, "h200-sxm", attn_backend="cudnn", framework="pytorch")
            mem = estimate_memory(model, plan, hw.system.gpu, framework="pytorch")
            ms = res.iteration_s * 1e3
            ranks = [float(x) for x in str(row.rank_peak_allocated_bytes).split(";")]
            stage_mem = mem.per_stage_allocated_bytes
            # rank i is TP rank i % tp of stage (i // tp) % pp (CP ranks outermost)
            rank_err = [100.0 * (stage_mem[i // tp % pp] / x - 1.0) for i, x in enumerate(ranks)]
            chunks = plan.layers_per_chunk(model.num_layers)
            host = max(
                host_launches(res.costs, chunks[r], m, r == 0, r == pp - 1, 1) * host_s
                for r in range(pp)
            )
            gpu_s = res.iteration_s - res.breakdown_s["host_bound_s"]
            measured_mem = float(row.peak_allocated_bytes)
            out.append(
                {
                    "lease": lease,
                    "mode": str(row["mode"]) + ("-" + kind if cp > 1 else ""),
                    "tp": tp,
                    "pp": pp,
                    "cp": cp,
                    "model": str(row.model),
                    "shape": f"{b}x{s}",
                    "microbatches": m,
                    "measured_ms": float(row.step_ms),
                    "simulated_ms": ms,
                    "error_pct": 100.0 * (ms / float(row.step_ms) - 1.0),
                    "measured_peak_bytes": measured_mem,
                    "simulated_peak_bytes": mem.allocated_bytes,
                    "memory_error_pct": 100.0 * (mem.allocated_bytes / measured_mem - 1.0),
                    "rank_memory_error_pct": max(rank_err, key=abs),
                    "gpu_bound": host <= GPU_BOUND_HOST_SHARE * gpu_s,
                }
            )
    return out


def _par_summary(rows: list[dict]) -> None:
    head = ("call", "mode", "tp", "pp", "cp", "model", "shape", "meas_ms", "sim_ms", "err",
            "meas_GiB", "sim_GiB", "err", "rank err")  # fmt: skip
    print("{:5s} {:12s} {:>2s} {:>2s} {:>2s} {:17s} {:>7s} {:>8s} {:>8s} {:>7s} {:>8s} {:>8s} "
          "{:>6s} {:>8s}".format(*head))  # fmt: skip
    for r in rows:
        tag = "" if r["gpu_bound"] else "  host-paced"
        print(f"{r['lease']:5s} {r['mode']:12s} {r['tp']:2d} {r['pp']:2d} {r['cp']:2d} "
              f"{r['model']:17s} "
              f"{r['shape']:>7s} {r['measured_ms']:8.1f} {r['simulated_ms']:8.1f} "
              f"{r['error_pct']:6.1f}% {r['measured_peak_bytes'] / 2**30:8.2f} "
              f"{r['simulated_peak_bytes'] / 2**30:8.2f} {r['memory_error_pct']:5.1f}% "
              f"{r['rank_memory_error_pct']:7.1f}%{tag}")  # fmt: skip
    df = pd.DataFrame(rows)
    df["abs_t"], df["abs_m"] = df.error_pct.abs(), df.rank_memory_error_pct.abs()
    df["regime"] = df.gpu_bound.map({True: "GPU-bound", False: "host-paced"})
    print("\nstep time, mean / max |error| by regime and mode")
    print(df.groupby(["regime", "mode"])["abs_t"].agg(["mean", "max", "count"]).round(1))
    print("\npeak memory of every rank, mean / max |error| by mode")
    print(df.groupby("mode")["abs_m"].agg(["mean", "max", "count"]).round(2).to_string())


def traced_step_rows(dirs: dict[str, tuple[Path, ...]] = TRACED_DIRS) -> list[dict]:
    """Every ok training row of the traced suites (eager, compiled, fp8, full recompute;
    GPU-bound and host-bound sizes), simulated. ``held_out``: the model is not among
    those the shipped composition was fitted on (calibrate.trace.fit.FIT_MODELS)."""
    out = []
    for gpu, folders in dirs.items():
        gpu_spec = resolve_hardware(gpu, 1).system.gpu
        for csv in sorted(c for f in folders for c in f.glob("train-*/train_step.csv")):
            df = pd.read_csv(csv)
            for _, row in df[df.status == "ok"].iterrows():
                model = step_model(row)
                framework, precision = MODE_ENGINE[str(row["mode"])]
                plan = single_gpu_plan(model, row, precision)
                res = _simulate(model, plan, gpu, attn_backend="cudnn", framework=framework)
                ms = res.iteration_s * 1e3
                mem = estimate_memory(model, plan, gpu_spec, framework=framework).allocated_bytes
                measured_mem = float(row.peak_allocated_bytes)
                out.append(
                    {
                        "gpu": gpu,
                        "model": str(row.model),
                        "mode": str(row["mode"]) + ("+rc" if row.recompute == "full" else ""),
                        "shape": f"{int(row.batch)}x{int(row.seq_len)}",
                        "tokens": int(row.batch) * int(row.seq_len),
                        "measured_ms": float(row.step_ms),
                        "simulated_ms": ms,
                        "error_pct": 100.0 * (ms / float(row.step_ms) - 1.0),
                        "memory_error_pct": 100.0 * (mem / measured_mem - 1.0),
                        "host_bound": res.breakdown_s["host_bound_s"] > 0,
                        "held_out": str(row.model) not in FIT_MODELS,
                    }
                )
    return out


def _traced_summary(rows: list[dict]) -> None:
    df = pd.DataFrame(rows)
    for r in df.itertuples():
        flag = ("host" if r.host_bound else "") + (" held-out" if r.held_out else "")
        print(f"{r.gpu:9s} {r.model:18s} {r.mode:8s} {r.shape:>7s} {r.measured_ms:8.1f} "
              f"{r.simulated_ms:8.1f} {r.error_pct:6.1f}%  {flag}")  # fmt: skip
    df["abs"] = df.error_pct.abs()
    df["size"] = ["8k tokens" if t >= 8192 else "<= 2k tokens" for t in df.tokens]
    df["models"] = df.held_out.map({True: "held out", False: "fitted"})
    mean = df.groupby(["gpu", "mode", "size"])["abs"].agg(["mean", "max", "count"])
    print("\nmean |error| by GPU, mode and tokens per step (small steps: host-bound)")
    print(mean.round(1).to_string())
    held = df.groupby(["gpu", "models"])["abs"].agg(["mean", "max", "count"])
    print("\nmean |error| by GPU, fitted vs held-out models (all modes and sizes)")
    print(held.round(1).to_string())
    df["mem_abs"] = df.memory_error_pct.abs()
    mem = df.groupby(["mode", "models"])["mem_abs"].agg(["mean", "max", "count"])
    print("\npeak memory (max_memory_allocated): mean |error| by mode, both GPUs")
    print(mem.round(2).to_string())


def main() -> None:
    rows = megatron_rows()
    print("Megatron-LM, Korthikanti et al. 2022 Table 4 (DGX A100 80GB)")
    print(f"{'model':14s} {'mode':7s} {'published_s':>11s} {'simulated_s':>11s} {'error':>7s}")
    for r in rows:
        print(f"{r['model']:14s} {r['mode']:7s} {r['published_s']:11.2f} "
              f"{r['simulated_s']:11.2f} {r['error_pct']:6.1f}%")  # fmt: skip
    errs = [abs(r["error_pct"]) for r in rows]
    print(f"mean |error| {sum(errs) / len(errs):.1f}%  max {max(errs):.1f}%\n")
    print("Single H100, plain PyTorch (calibrate/data/steps-h100/train_step.csv)")
    head = ("model", "batch x seq", "measured_ms", "simulated_ms", "error")
    print(f"{head[0]:20s} {head[1]:>12s} {head[2]:>11s} {head[3]:>12s} {head[4]:>7s}")
    steps = h100_step_rows()
    for r in steps:
        print(f"{r['model']:20s} {r['shape']:>12s} {r['measured_ms']:11.1f} "
              f"{r['simulated_ms']:12.1f} {r['error_pct']:6.1f}%")  # fmt: skip
    errs = [abs(r["error_pct"]) for r in steps]
    print(f"mean |error| {sum(errs) / len(errs):.1f}%  max {max(errs):.1f}%\n")
    print("1/2/4 H200s, plain PyTorch DDP / FSDP (calibrate/data/steps-h200-x4)")
    dist = h200_dist_rows()
    for r in dist:
        tag = " (fitted)" if r["fitted"] else ""
        print(f"{r['mode']:6s} x{r['gpus']} {r['shape']:>8s} {r['measured_ms']:8.1f} "
              f"{r['simulated_ms']:8.1f} {r['error_pct']:6.1f}%{tag}")  # fmt: skip
    errs = [abs(r["error_pct"]) for r in dist if not r["fitted"]]
    print(f"not fitted: mean |error| {sum(errs) / len(errs):.1f}%  max {max(errs):.1f}%\n")
    print("Single H100 / H200 with traces, eager / compiled / fp8 (calibrate/data/steps2-*)")
    _traced_summary(traced_step_rows())
    print("\nTP (with SP) / PP (1F1B) / TP x PP / CP on 2-4 H200s, plain PyTorch, and one GPU "
          "of the same machines (calibrate/data/steps-par-h200-x4; CP step time is not "
          "modelled: see its README)")  # fmt: skip
    _par_summary(h200_par_rows())


if __name__ == "__main__":
    main()
