"""Fit composition factors (:mod:`costmodels.steps.composition`) from whole-step traces.

For each engine, the factor of a kernel group is the measured kernel time of that group
summed over the fitting traces, over the decomposition's predicted time for the same
steps (priced without any composition): a ratio of sums, so long steps weigh more and one
odd trace cannot swing it. Held-out traces (by model, never by shape) are then predicted
with and without the factors; their kernel-sum errors are what the fit reports and the
shipped file records.

``python -m calibrate.trace.fit`` refits the shipped H100 and H200 files from the traced
suites in ``calibrate/data/steps2-*`` (fit: the two Llama-shaped models; held out:
Qwen2.5-1.5B-shaped).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pandas as pd

from calibrate.trace.compare import TrainWorkload, compare, predict_train
from calibrate.trace.kineto import load_trace
from calibrate.trace.timeline import build_timeline
from costmodels.ops.select import get_cost_model
from costmodels.steps.composition import GROUPS, SHIPPED_DIR, Composition
from hardware_specs.registry import builtin_catalog
from workloads.models import ModelConfig
from workloads.plan import TrainPlan, make_plan

ROOT = Path(__file__).resolve().parents[2]
#: op class of the trace classifier -> composition group (collectives, other: not scaled)
CLASS_GROUP = {
    "gemm": "gemm",
    "attn_fwd": "attention",
    "attn_bwd": "attention",
    "optimizer": "optimizer",
    **{
        c: "memory_bound"
        for c in ("norm", "elementwise", "rope", "softmax_ce", "embedding", "memcpy", "fp8_cast")
    },
}
#: how each measured mode of calibrate/steps/train_step.py is simulated
MODE_FRAMEWORK = {"eager": "pytorch", "compile": "pytorch-compile", "fp8": "pytorch-compile"}
FIT_MODELS = ("llama3.2-1b-like", "llama2-small-mha")
HELD_OUT_MODELS = ("qwen2.5-1.5b-like",)
SUITES = {"h100-sxm": "steps2-h100-sxm", "h200-sxm": "steps2-h200-sxm"}


@dataclass(frozen=True)
class TracedStep:
    """One traced step: engine, model, shape, and measured / predicted seconds per group."""

    framework: str
    model: str
    label: str
    measured_s: dict[str, float]
    predicted_s: dict[str, float]
    step_s: float = 0.0  # the untraced step (train_step.csv), for the idle factor


def group_sums(classes: pd.DataFrame, column: str) -> dict[str, float]:
    """Seconds per composition group from a comparison's class table."""
    out = dict.fromkeys(GROUPS, 0.0)
    for row in classes.itertuples():
        group = CLASS_GROUP.get(str(row.op_class))
        if group is not None:
            out[group] += float(getattr(row, column))
    return out


#: a step whose kernels fill at least this share of its untraced time is GPU-bound; only
#: those say how much idle time separates back-to-back kernels (host-bound steps do not)
GPU_BOUND_SHARE = 0.9


def fit_factors(steps: Iterable[TracedStep]) -> dict[str, dict[str, float]]:
    """Ratio-of-sums factor per (framework, group); groups with no predicted time are left
    out (factor 1). ``idle``: untraced step time over kernel time of the GPU-bound steps
    (the launch gaps between back-to-back kernels), a factor on every group."""
    steps = list(steps)
    meas: dict[str, dict[str, float]] = {}
    pred: dict[str, dict[str, float]] = {}
    for s in steps:
        for g in GROUPS:
            meas.setdefault(s.framework, {}).setdefault(g, 0.0)
            pred.setdefault(s.framework, {}).setdefault(g, 0.0)
            meas[s.framework][g] += s.measured_s[g]
            pred[s.framework][g] += s.predicted_s[g]
    out = {
        fw: {g: meas[fw][g] / pred[fw][g] for g in GROUPS if pred[fw][g] > 0 and meas[fw][g] > 0}
        for fw in meas
    }
    for fw in out:
        bound = [
            (s.step_s, sum(s.measured_s.values()))
            for s in steps
            if s.framework == fw and s.step_s > 0
            and sum(s.measured_s.values()) >= GPU_BOUND_SHARE * s.step_s
        ]  # fmt: skip
        if bound:
            out[fw]["idle"] = sum(a for a, _ in bound) / sum(b for _, b in bound)
    return out


def kernel_sum_errors(
    steps: Iterable[TracedStep], factors: dict[str, dict[str, float]] | None
) -> pd.DataFrame:
    """Per step: measured and predicted kernel sums (groups that scale) and the error."""
    rows = []
    for s in steps:
        f = (factors or {}).get(s.framework, {})
        pred = sum(s.predicted_s[g] * f.get(g, 1.0) for g in GROUPS)
        meas = sum(s.measured_s[g] for g in GROUPS)
        rows.append((s.framework, s.model, s.label, meas, pred, pred / meas - 1.0))
    return pd.DataFrame(
        rows, columns=["framework", "model", "step", "measured_s", "predicted_s", "error"]
    )


def gpu_bound_step_errors(
    steps: Iterable[TracedStep], factors: dict[str, dict[str, float]] | None
) -> pd.DataFrame:
    """Per GPU-bound step: the untraced step time against the prediction with the
    factors and the idle factor (what ``simcli train`` now says), or the plain kernel sum."""
    rows = []
    for s in steps:
        if s.step_s <= 0 or sum(s.measured_s.values()) < GPU_BOUND_SHARE * s.step_s:
            continue
        f = (factors or {}).get(s.framework, {})
        pred = sum(s.predicted_s[g] * f.get(g, 1.0) for g in GROUPS) * f.get("idle", 1.0)
        rows.append((s.framework, s.model, s.label, s.step_s, pred, pred / s.step_s - 1.0))
    return pd.DataFrame(
        rows, columns=["framework", "model", "step", "measured_s", "predicted_s", "error"]
    )


def step_model(row: pd.Series) -> ModelConfig:
    """The Llama-style architecture of one train_step.csv row (calibrate/steps/train_step.py
    builds it from the same fields)."""
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
        source=f"calibrate/steps/train_step.py ({row.model})",
    )


def single_gpu_plan(model: ModelConfig, row: pd.Series, precision: str) -> TrainPlan:
    """The one-GPU plan of a train_step.csv row (micro-batch = global batch)."""
    recompute = str(row.recompute) if "recompute" in row and pd.notna(row.recompute) else "none"
    return make_plan(
        model,
        num_gpus=1,
        global_batch=int(row.batch),
        micro_batch=int(row.batch),
        seq_len=int(row.seq_len),
        precision=precision,
        recompute=recompute,
    )


def suite_steps(gpu_id: str, folder: Path) -> list[TracedStep]:
    """Every ok, traced training row of a suite folder, compared class by class."""
    cm = get_cost_model(gpu_id)
    system = builtin_catalog().system(gpu_id, 1)
    out = []
    for csv in sorted(folder.glob("train-*/train_step.csv")):
        df = pd.read_csv(csv)
        for _, row in df[(df.status == "ok") & df.trace.notna()].iterrows():
            trace = csv.parent / "traces" / str(row.trace)
            framework = MODE_FRAMEWORK[str(row["mode"])]
            model = step_model(row)
            plan = single_gpu_plan(model, row, "fp8" if row["mode"] == "fp8" else "bf16-mixed")
            w = TrainWorkload(model=model, plan=plan, framework=framework, attn_backend="cudnn")
            timeline = build_timeline(load_trace(trace))
            result = compare(timeline, predict_train(w, cm, system))
            label = (
                f"{row['mode']}{'+rc' if row.recompute == 'full' else ''} {row.batch}x{row.seq_len}"
            )
            out.append(
                TracedStep(
                    framework,
                    str(row.model),
                    label,
                    group_sums(result.classes, "measured_s"),
                    group_sums(result.classes, "predicted_s"),
                    float(row.step_ms) / 1e3,
                )
            )
    return out


def fit_suite(
    gpu_id: str,
    steps: list[TracedStep],
    fit_models: tuple[str, ...] = FIT_MODELS,
    held_out_models: tuple[str, ...] = HELD_OUT_MODELS,
    source: str = "",
) -> Composition:
    """Factors from the fitting models' steps; held-out errors before and after in meta."""
    fit = [s for s in steps if s.model in fit_models]
    held = [s for s in steps if s.model in held_out_models]
    factors = fit_factors(fit)
    held_out = {}
    for fw in sorted({s.framework for s in held}):
        sel = [s for s in held if s.framework == fw]
        before = kernel_sum_errors(sel, None).error.abs().mean()
        after = kernel_sum_errors(sel, factors).error.abs().mean()
        bound_before = gpu_bound_step_errors(sel, None).error.abs()
        bound_after = gpu_bound_step_errors(sel, factors).error.abs()
        held_out[fw] = {
            "steps": len(sel),
            "kernel_sum_mape_before": round(float(before), 4),
            "kernel_sum_mape_after": round(float(after), 4),
            "gpu_bound_steps": int(len(bound_after)),
            "gpu_bound_step_mape_before": round(float(bound_before.mean()), 4),
            "gpu_bound_step_mape_after": round(float(bound_after.mean()), 4),
        }
    meta = {
        "fitted_on": sorted(fit_models),
        "held_out": sorted(held_out_models),
        "fit_steps": len(fit),
        "held_out_error": held_out,
        "method": "ratio of summed measured to predicted kernel seconds per (engine, group) "
        "over the fitting traces; predictions without composition",
        "source": source,
        "date": date.today().isoformat(),
    }
    rounded = {fw: {g: round(v, 4) for g, v in fs.items()} for fw, fs in factors.items()}
    return Composition(gpu_id, rounded, meta)


def write_composition(comp: Composition, path: Path) -> None:
    """Atomic write (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(comp.to_dict(), fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.trace.fit", description=__doc__)
    ap.add_argument("--out-dir", default=str(SHIPPED_DIR), help="where <gpu>.json go")
    args = ap.parse_args(argv)
    for gpu_id, sub in SUITES.items():
        folder = ROOT / "calibrate" / "data" / sub
        steps = suite_steps(gpu_id, folder)
        comp = fit_suite(gpu_id, steps, source=f"calibrate/data/{sub} (train-*/traces)")
        write_composition(comp, Path(args.out_dir) / f"{gpu_id}.json")
        print(f"{gpu_id}: {json.dumps(comp.factors)}")
        for fw, e in comp.meta["held_out_error"].items():
            print(
                f"  held out {fw:16s} {e['steps']} steps: kernel-sum MAPE "
                f"{100 * e['kernel_sum_mape_before']:.1f}% -> "
                f"{100 * e['kernel_sum_mape_after']:.1f}%; {e['gpu_bound_steps']} GPU-bound "
                f"steps: step MAPE {100 * e['gpu_bound_step_mape_before']:.1f}% -> "
                f"{100 * e['gpu_bound_step_mape_after']:.1f}%"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "fit_factors",
    "fit_suite",
    "gpu_bound_step_errors",
    "group_sums",
    "kernel_sum_errors",
    "single_gpu_plan",
    "step_model",
    "suite_steps",
]
