"""Fit composition factors (:mod:`costmodels.steps.composition`) from whole-step traces.

For each engine, the factor of a kernel group is the measured kernel time of that group
summed over the fitting traces, over the decomposition's predicted time for the same
steps (priced without any composition): a ratio of sums, so long steps weigh more and one
odd trace cannot swing it. Held-out traces (by model, never by shape) are then predicted
with and without the factors; their kernel-sum errors are what the fit reports and the
shipped file records.

Only GPU-bound steps (kernels fill >= 90% of the untraced step) fit the group factors:
in a host-bound step the kernels ran apart, not back to back. The host-bound ones fit the
engine's host time per op (:func:`fit_host_s_per_op`).

``python -m calibrate.trace.fit`` refits the shipped H100 and H200 files from the traced
suites in ``calibrate/data/steps2-*`` and ``steps3-*`` (fit: the two Llama-shaped models
of 1.3-1.5B; held out: the Qwen2.5-1.5B- and Llama-3.2-3B-shaped ones).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.trace.compare import (
    ServingWorkload,
    TrainWorkload,
    compare,
    predict_serving,
    predict_train,
)
from calibrate.trace.kineto import load_trace
from calibrate.trace.timeline import build_timeline
from costmodels.ops.select import get_cost_model
from costmodels.steps.composition import GROUPS, HOST_KEY, HOST_MAX_S, SHIPPED_DIR, Composition
from hardware_specs.registry import builtin_catalog
from workloads.models import ModelConfig, load_model
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
HELD_OUT_MODELS = ("llama2-7b-like", "llama3.2-3b-like", "qwen2.5-1.5b-like")
#: traced suites per GPU: steps2 (GPU-bound and 2k-token steps), steps3 (small host-bound
#: steps, calibrate/steps/suite.sh ... host)
SUITES = {
    "h100-sxm": ("steps2-h100-sxm", "steps3-h100-sxm"),
    "h200-sxm": ("steps2-h200-sxm", "steps3-h200-sxm"),
}

#: serving suites (calibrate/steps/serve_step.py, engine pytorch-eager): subfolder -> (model
#: id, the model's name in trace file names); composition keys are ``pytorch-eager/graph``
#: (decode replayed from a CUDA graph) and ``pytorch-eager/stream`` (eager launches)
SERVE_FOLDERS = {
    "serve-llama3-8b": ("llama3-8b", "llama3-8b"),
    "serve-qwen2.5-7b-like": ("qwen2.5-7b", "qwen2.5-7b-like"),
    "serve-eager-decode": ("llama3-8b", "llama3-8b"),
}
SERVE_FIT_MODELS = ("llama3-8b",)
SERVE_HELD_OUT_MODELS = ("qwen2.5-7b",)
SERVE_ENGINE = "pytorch-eager"


@dataclass(frozen=True)
class TracedStep:
    """One traced step: engine, model, shape, and measured / predicted seconds per group."""

    framework: str
    model: str
    label: str
    measured_s: dict[str, float]
    predicted_s: dict[str, float]
    step_s: float = 0.0  # the untraced step (train_step.csv), for the idle factor
    ops: int = 0  # op instances the host dispatches per step (host_s_per_op multiplies it)


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


def _gpu_bound(step: TracedStep) -> bool:
    """Its kernels fill at least GPU_BOUND_SHARE of the untraced step."""
    return sum(step.measured_s.values()) >= GPU_BOUND_SHARE * step.step_s


def fit_factors(steps: Iterable[TracedStep]) -> dict[str, dict[str, float]]:
    """Ratio-of-sums factor per (framework, group); groups with no predicted time are left
    out (factor 1). ``idle``: untraced step time over kernel time of the GPU-bound steps
    (the launch gaps between back-to-back kernels), a factor on every group.
    ``host_s_per_op``: see :func:`fit_host_s_per_op`."""
    steps = list(steps)
    meas: dict[str, dict[str, float]] = {}
    pred: dict[str, dict[str, float]] = {}
    for s in steps:
        meas.setdefault(s.framework, dict.fromkeys(GROUPS, 0.0))
        pred.setdefault(s.framework, dict.fromkeys(GROUPS, 0.0))
        if s.step_s > 0 and not _gpu_bound(s):
            continue  # host-bound: its kernels ran apart, not back to back
        for g in GROUPS:
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
            if s.framework == fw and s.step_s > 0 and _gpu_bound(s)
        ]
        if bound:
            out[fw]["idle"] = sum(a for a, _ in bound) / sum(b for _, b in bound)
        host = fit_host_s_per_op([s for s in steps if s.framework == fw], out[fw])
        if host is not None:
            out[fw][HOST_KEY] = host
    return out


#: a step at least this much slower than its GPU-bound prediction is host-bound
HOST_BOUND_RATIO = 1.15
#: candidate host seconds per op: 0.1 us steps up to the composition file's limit
_HOST_GRID_S = np.arange(1, int(HOST_MAX_S * 1e7) + 1) * 1e-7


def gpu_bound_s(step: TracedStep, factors: dict[str, float] | None) -> float:
    """The step's predicted kernel time with the factors and the idle factor."""
    f = factors or {}
    return sum(step.predicted_s[g] * f.get(g, 1.0) for g in GROUPS) * f.get("idle", 1.0)


def predicted_step_s(step: TracedStep, factors: dict[str, float] | None) -> float:
    """What ``simcli train`` says for the step: the GPU-bound time, or the host's
    dispatch time when that is longer (:mod:`costmodels.steps.composition`)."""
    f = factors or {}
    return max(gpu_bound_s(step, f), step.ops * f.get(HOST_KEY, 0.0))


def fit_host_s_per_op(steps: list[TracedStep], factors: dict[str, float]) -> float | None:
    """Host seconds per op of one engine: the value on a 0.1 us grid that minimises the
    mean |error| of ``max(GPU-bound prediction, ops x host)`` against the untraced step
    times (a median-like fit: host speed drifts between leases and one slow step must not
    carry it). None when no step is host-bound (more than ``HOST_BOUND_RATIO`` slower
    than its GPU-bound prediction): then the data cannot say."""
    use = [s for s in steps if s.step_s > 0 and s.ops > 0]
    if not any(s.step_s > HOST_BOUND_RATIO * gpu_bound_s(s, factors) for s in use):
        return None
    gpu = np.array([gpu_bound_s(s, factors) for s in use])
    ops = np.array([s.ops for s in use], dtype=float)
    meas = np.array([s.step_s for s in use])
    pred = np.maximum(gpu[None, :], _HOST_GRID_S[:, None] * ops[None, :])
    err = np.abs(pred / meas[None, :] - 1.0).mean(axis=1)
    return round(float(_HOST_GRID_S[int(np.argmin(err))]), 8)


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
    return step_errors([s for s in steps if s.step_s > 0 and _gpu_bound(s)], factors)


def step_errors(
    steps: Iterable[TracedStep], factors: dict[str, dict[str, float]] | None
) -> pd.DataFrame:
    """Per step with an untraced time: that time against :func:`predicted_step_s` (with
    ``factors``: what ``simcli train`` says; without: the plain kernel sum)."""
    rows = []
    for s in steps:
        if s.step_s <= 0:
            continue
        pred = predicted_step_s(s, (factors or {}).get(s.framework, {}))
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


def suite_steps(gpu_id: str, folders: Path | Iterable[Path]) -> list[TracedStep]:
    """Every ok, traced training row of the suite folders, compared class by class (read
    once per process: parsing the committed traces is most of a refit's time)."""
    folders = (folders,) if isinstance(folders, Path) else tuple(folders)
    return list(_suite_steps(gpu_id, folders))


@cache
def _suite_steps(gpu_id: str, folders: tuple[Path, ...]) -> tuple[TracedStep, ...]:
    cm = get_cost_model(gpu_id)
    system = builtin_catalog().system(gpu_id, 1)
    out = []
    for csv in sorted(c for f in folders for c in f.glob("train-*/train_step.csv")):
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
                    result.prediction.host_ops,
                )
            )
    return tuple(out)


def serving_suite_steps(gpu_id: str, folders: Path | Iterable[Path]) -> list[TracedStep]:
    """Every ok serving row of the suite folders with its trace, compared class by class
    (priced without composition)."""
    cm = get_cost_model(gpu_id)
    folders = [folders] if isinstance(folders, Path) else list(folders)
    out = []
    for folder in folders:
        for sub, (model_id, file_name) in SERVE_FOLDERS.items():
            csv = folder / sub / "serve_step.csv"
            if not csv.is_file():
                continue
            model = load_model(model_id)
            df = pd.read_csv(csv)
            for _, row in df[df.status == "ok"].iterrows():
                b, phase = int(row.batch), str(row.phase)
                graph = phase == "decode" and str(row.timing) == "cuda_graph"
                n = int(row.prompt_len if phase == "prefill" else row.context_len)
                mode = "graph" if graph else "eager"
                part = "prefill" if phase == "prefill" else f"decode-{mode}"
                trace = folder / sub / "traces" / f"{file_name}.{part}.{b}x{n}.trace.json.gz"
                if not trace.is_file():
                    continue
                w = ServingWorkload(
                    model, phase, b, n, engine=SERVE_ENGINE,  # type: ignore[arg-type]
                    cuda_graphs=graph if phase == "decode" else None,
                )  # fmt: skip
                pred = predict_serving(w, cm, gpu_id, None)
                result = compare(build_timeline(load_trace(trace)), pred)
                out.append(
                    TracedStep(
                        f"{SERVE_ENGINE}/{'graph' if graph else 'stream'}",
                        model_id,
                        f"{part} {b}x{n}",
                        group_sums(result.classes, "measured_s"),
                        group_sums(result.classes, "predicted_s"),
                        float(row.step_ms) / 1e3,
                    )
                )
    return out


def fit_gpu(gpu_id: str, subs: tuple[str, ...]) -> Composition:
    """The shipped composition of one GPU: training engines fitted on the training traces,
    serving contexts on the serving traces (each split by model); meta ``serving`` holds
    the serving half's fit and held-out errors."""
    folders = [ROOT / "calibrate" / "data" / sub for sub in subs]
    where = ", ".join(f"calibrate/data/{sub}" for sub in subs)
    train = fit_suite(gpu_id, suite_steps(gpu_id, folders), source=f"{where} (train-*/traces)")
    serve = fit_suite(
        gpu_id, serving_suite_steps(gpu_id, folders), SERVE_FIT_MODELS, SERVE_HELD_OUT_MODELS,
        source=f"{where} (serve-*/traces)",
    )  # fmt: skip
    factors = {**train.factors, **serve.factors}
    return Composition(gpu_id, factors, {**train.meta, "serving": serve.meta})


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
        # kernel sums of the GPU-bound steps: the groups are fitted on those alone
        bound = [s for s in sel if s.step_s <= 0 or _gpu_bound(s)] or sel
        before = kernel_sum_errors(bound, None).error.abs().mean()
        after = kernel_sum_errors(bound, factors).error.abs().mean()
        bound_before = gpu_bound_step_errors(sel, None).error.abs()
        bound_after = gpu_bound_step_errors(sel, factors).error.abs()
        all_before = step_errors(sel, None).error.abs()
        all_after = step_errors(sel, factors).error.abs()
        held_out[fw] = {
            "steps": len(sel),
            "kernel_sum_mape_before": round(float(before), 4),
            "kernel_sum_mape_after": round(float(after), 4),
            "gpu_bound_steps": int(len(bound_after)),
            "gpu_bound_step_mape_before": round(float(bound_before.mean()), 4),
            "gpu_bound_step_mape_after": round(float(bound_after.mean()), 4),
            "timed_steps": int(len(all_after)),
            "step_mape_before": round(float(all_before.mean()), 4),
            "step_mape_after": round(float(all_after.mean()), 4),
        }
    meta = {
        "fitted_on": sorted(fit_models),
        "held_out": sorted(held_out_models),
        "fit_steps": len(fit),
        "held_out_error": held_out,
        "method": "ratio of summed measured to predicted kernel seconds per (engine, group) "
        "over the fitting traces; predictions without composition; host_s_per_op: the "
        "0.1 us grid value minimising mean |error| of max(GPU-bound, ops x host) against "
        "the untraced step times",
        "source": source,
        "date": date.today().isoformat(),
    }
    rounded = {
        fw: {g: v if g == HOST_KEY else round(v, 4) for g, v in fs.items()}
        for fw, fs in factors.items()
    }
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
    for gpu_id, subs in SUITES.items():
        comp = fit_gpu(gpu_id, subs)
        write_composition(comp, Path(args.out_dir) / f"{gpu_id}.json")
        print(f"{gpu_id}: {json.dumps(comp.factors)}")
        held = {**comp.meta["held_out_error"], **comp.meta["serving"]["held_out_error"]}
        for fw, e in held.items():
            print(
                f"  held out {fw:16s} {e['steps']} steps: kernel-sum MAPE "
                f"{100 * e['kernel_sum_mape_before']:.1f}% -> "
                f"{100 * e['kernel_sum_mape_after']:.1f}%; {e['gpu_bound_steps']} GPU-bound "
                f"steps: step MAPE {100 * e['gpu_bound_step_mape_before']:.1f}% -> "
                f"{100 * e['gpu_bound_step_mape_after']:.1f}%; all {e['timed_steps']} "
                f"steps: {100 * e['step_mape_before']:.1f}% -> {100 * e['step_mape_after']:.1f}%"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "fit_factors",
    "fit_gpu",
    "fit_suite",
    "gpu_bound_step_errors",
    "group_sums",
    "kernel_sum_errors",
    "serving_suite_steps",
    "single_gpu_plan",
    "step_model",
    "suite_steps",
]
