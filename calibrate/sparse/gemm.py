"""Fit and validate the sparse-weight GEMM parameters on a ``sparse_gemm`` suite CSV.

    python -m calibrate.sparse.gemm fit calibrate/data/h100-sxm/sparse_gemm.csv
    python -m calibrate.sparse.gemm eval calibrate/data/h100-sxm/sparse_gemm.csv [--params Y]

``fit`` refits the measured parameters of ``costmodels/data/sparse_gemm.yaml`` on the rows
outside the held-out models (2:4 kernel, on the CUDA-graph rows: ``compute_efficiency``,
``memory_efficiency_factor``, ``narrow_memory_efficiency_factor``, ``kernel_overhead_s``;
2:4 eager, on the eager rows: ``call_floor_s``; CATS gather: ``gather_memory_efficiency``
and ``gather_launch_s``) and prints them with the train / held-out error per kind and, for
the held-out rows, per model and per layer. ``eval`` prints the error of the shipped
parameters, or of a ``--params`` YAML (e.g. an older ``sparse_gemm.yaml`` from git, for
before/after figures). The split is by model, never random: every layer of the held-out
models (Qwen2.5-7B and -72B at every TP degree) is kept out of the fit. The model
(prediction only) is :mod:`costmodels.ops.sparse_gemm`.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from costmodels.ops.params import GemmParams
from costmodels.ops.sparse_gemm import (
    SparseGemmParams,
    dense_gemm_params,
    semi_structured_terms,
    sparse_gemm_work,
    sparse_params,
)
from hardware_specs.schema import GpuSpec

COMMAND = "python -m calibrate.sparse.gemm"
# held-out split of the measured rows: every family of these models
HELD_OUT_PREFIXES = ("qwen2.5-7b/", "qwen2.5-72b/")


def read_measured(path: str | Path) -> dict[str, np.ndarray]:
    """The ``ok`` rows of a sparse_gemm suite CSV as numpy columns."""
    with Path(path).open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    if not rows:
        raise ValueError(f"{path}: no rows with status ok")
    cols: dict[str, np.ndarray] = {}
    for c in ("m", "n", "k"):
        cols[c] = np.array([float(r[c]) for r in rows])
    cols["measured_s"] = np.array([float(r["measured_ms"]) * 1e-3 for r in rows])
    for c in ("dtype", "pattern", "backend", "family"):
        cols[c] = np.array([r[c] for r in rows], dtype=str)
    return cols


def held_out_mask(families: np.ndarray, prefixes=HELD_OUT_PREFIXES) -> np.ndarray:
    return np.array([any(f.startswith(p) for p in prefixes) for f in families], dtype=bool)


def _kind_masks(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    pat, be = d["pattern"], d["backend"]
    cats = np.char.startswith(pat, "cats:")
    return {
        "dense": pat == "dense",
        "2:4": (pat == "2:4") & (be == "cusparselt_graph"),
        "2:4/eager": (pat == "2:4") & (be == "cusparselt"),
        "cats/fused": cats & (be == "compact"),
        "cats/gather": cats & (be == "gather"),
    }


def predict_measured(
    d: dict[str, np.ndarray], gpu: GpuSpec, p: SparseGemmParams, dense: GemmParams
) -> np.ndarray:
    """Model seconds for every measured row (its pattern and backend)."""
    pred = np.full(len(d["m"]), np.nan)
    for name, mask in _kind_masks(d).items():
        if not mask.any():
            continue
        m, n, k, dt, pats = (d[c][mask] for c in ("m", "n", "k", "dtype", "pattern"))
        kernel = name.split("/")[1] if name.startswith("cats") else "fused"
        eager = name == "2:4/eager"
        out = np.empty(int(mask.sum()))
        for pat in np.unique(pats):
            s = pats == pat
            w = sparse_gemm_work(
                m[s],
                n[s],
                k[s],
                None,
                dt[s],
                pat,
                gpu,
                p,
                dense=dense,
                cats_kernel=kernel,
                eager=eager,
            )
            out[s] = w.time_s
        pred[mask] = out
    return pred


def _ape_stats(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    ape = np.abs(pred / meas - 1.0)
    return {
        "rows": int(len(ape)),
        "mape": round(float(ape.mean()), 4) if len(ape) else math.nan,
        "p50": round(float(np.median(ape)), 4) if len(ape) else math.nan,
        "p90": round(float(np.quantile(ape, 0.9)), 4) if len(ape) else math.nan,
    }


def _grid_best(loss: np.ndarray, *axes: np.ndarray) -> tuple[float, ...]:
    i = np.unravel_index(int(np.argmin(loss)), loss.shape)
    return tuple(float(ax[j]) for ax, j in zip(axes, i, strict=True))


def fit(
    d: dict[str, np.ndarray],
    gpu: GpuSpec,
    base: SparseGemmParams | None = None,
    dense: GemmParams | None = None,
    held_out_prefixes=HELD_OUT_PREFIXES,
) -> tuple[SparseGemmParams, dict[str, Any]]:
    """Fit the measured parameters on the rows outside the held-out families.

    2:4 kernel (CUDA-graph rows): ``compute_efficiency`` and the wide
    ``memory_efficiency_factor`` on the rows above ``narrow_rows`` tokens, then the
    ``narrow_memory_efficiency_factor`` and ``kernel_overhead_s`` on the rows at or below
    it, twice over (the overhead feeds back into the wide rows), each on a grid minimising
    the mean |log(predicted / measured)|. 2:4 eager: ``call_floor_s`` on the eager rows
    given the kernel. CATS gather: ``gather_memory_efficiency`` and ``gather_launch_s``
    likewise. Returns the fitted parameters and a report (train / held-out error per kind).
    """
    p0 = base if base is not None else sparse_params(gpu.architecture)
    dp = dense if dense is not None else dense_gemm_params(gpu)
    held = held_out_mask(d["family"], held_out_prefixes)
    masks = _kind_masks(d)
    meas = d["measured_s"]
    sp = p0.semi_structured

    # --- 2:4 kernel: time = max(bound, launch + ovh + max(C / eff, M / factor))
    tr = masks["2:4"] & ~held
    t = semi_structured_terms(
        d["m"][tr], d["n"][tr], d["k"][tr], None, d["dtype"][tr], gpu, p0, dense=dp
    )
    y = meas[tr]
    narrow = t.narrow
    effs = np.round(np.arange(0.20, 1.0001, 0.005), 4)
    factors = np.round(np.arange(0.10, 1.0001, 0.005), 4)
    overheads = np.round(np.arange(0.0, 30e-6 + 1e-12, 0.25e-6), 9)
    ovh, fn = sp.kernel_overhead_s, sp.narrow_memory_efficiency_factor
    for _ in range(2):
        w = ~narrow
        kern = (
            t.launch_s
            + ovh
            + np.maximum(
                t.compute_s[w][None, None, :] / effs[:, None, None],
                t.memory_s[w][None, None, :] / factors[None, :, None],
            )
        )
        loss = np.abs(np.log(np.maximum(kern, t.bound_s[w]) / y[w])).mean(axis=-1)
        eff, fw = _grid_best(loss, effs, factors)
        kern = (
            t.launch_s
            + overheads[None, :, None]
            + np.maximum(
                t.compute_s[narrow][None, None, :] / eff,
                t.memory_s[narrow][None, None, :] / factors[:, None, None],
            )
        )
        loss = np.abs(np.log(np.maximum(kern, t.bound_s[narrow]) / y[narrow])).mean(axis=-1)
        fn, ovh = _grid_best(loss, factors, overheads)
    sp1 = sp.model_copy(
        update={
            "compute_efficiency": eff,
            "memory_efficiency_factor": fw,
            "narrow_memory_efficiency_factor": fn,
            "kernel_overhead_s": ovh,
        }
    )

    # --- 2:4 eager: time = max(kernel, floor)
    etr = masks["2:4/eager"] & ~held
    te = semi_structured_terms(
        d["m"][etr], d["n"][etr], d["k"][etr], None, d["dtype"][etr], gpu, p0, dense=dp
    )
    kern_e = te.time_s(sp1)
    floors = np.round(np.arange(0.0, 3e-3 + 1e-12, 5e-6), 9)
    eloss = np.abs(np.log(np.maximum(kern_e[None, :], floors[:, None]) / meas[etr])).mean(-1)
    (floor,) = _grid_best(eloss, floors)
    sp1 = sp1.model_copy(update={"call_floor_s": floor})

    # --- CATS gather: fused + launch + 2 w / (hbm eff)
    cp = p0.cats
    gtr = masks["cats/gather"] & ~held
    sub = {c: v[gtr] for c, v in d.items()}
    c0 = cp.model_copy(update={"gather_launch_s": 0.0, "gather_memory_efficiency": 1.0})
    pc = p0.model_copy(update={"cats": c0})
    fused = predict_measured({**sub, "backend": np.full(gtr.sum(), "compact")}, gpu, pc, dp)
    g1 = predict_measured(sub, gpu, pc, dp)
    copy1 = g1 - fused  # 2 w / hbm at efficiency 1
    geffs = np.round(np.arange(0.20, 1.0001, 0.005), 4)
    glaunch = np.round(np.arange(0.0, 40e-6 + 1e-12, 0.5e-6), 9)
    tg = fused[None, None, :] + glaunch[None, :, None] + copy1[None, None, :] / geffs[:, None, None]
    gloss = np.abs(np.log(tg / meas[gtr])).mean(axis=-1)
    geff, gl = _grid_best(gloss, geffs, glaunch)

    fitted = p0.model_copy(
        update={
            "semi_structured": sp1,
            "cats": cp.model_copy(update={"gather_memory_efficiency": geff, "gather_launch_s": gl}),
        }
    )
    return fitted, report(d, gpu, fitted, dp, held_out_prefixes)


def report(
    d: dict[str, np.ndarray],
    gpu: GpuSpec,
    p: SparseGemmParams,
    dense: GemmParams | None = None,
    held_out_prefixes=HELD_OUT_PREFIXES,
) -> dict[str, Any]:
    """Train / held-out error per kind, and the 2:4 speedup over dense by token count
    (measured, and predicted with and without the per-call floor)."""
    dp = dense if dense is not None else dense_gemm_params(gpu)
    held = held_out_mask(d["family"], held_out_prefixes)
    pred = predict_measured(d, gpu, p, dp)
    out: dict[str, Any] = {"held_out_families": [f"{x}*" for x in held_out_prefixes]}
    meas = d["measured_s"]
    model = np.array([f.split("/")[0] for f in d["family"]])
    layer = np.array([f.rsplit("/", 1)[-1] for f in d["family"]])
    for name, mask in _kind_masks(d).items():
        h = mask & held
        out[name] = {
            "train": _ape_stats(pred[mask & ~held], meas[mask & ~held]),
            "held_out": _ape_stats(pred[h], meas[h]),
            "held_out_by_model": {
                str(x): _ape_stats(pred[h & (model == x)], meas[h & (model == x)])
                for x in np.unique(model[h])
            },
            "held_out_by_layer": {
                str(x): _ape_stats(pred[h & (layer == x)], meas[h & (layer == x)])
                for x in np.unique(layer[h])
            },
        }
    out["speedup_2:4"] = speedup_table(d, gpu, p, dp)
    return out


def speedup_table(
    d: dict[str, np.ndarray], gpu: GpuSpec, p: SparseGemmParams, dense: GemmParams
) -> dict[int, dict[str, float]]:
    """Median over layer shapes (bf16, cuSPARSELt graph replay) of dense / 2:4 kernel time,
    per token count."""
    key = {
        (dt, mm, nn, kk): t
        for dt, mm, nn, kk, t, pat in zip(
            d["dtype"], d["m"], d["n"], d["k"], d["measured_s"], d["pattern"], strict=True
        )
        if pat == "dense"
    }
    sel = _kind_masks(d)["2:4"] & (d["dtype"] == "bf16") & (d["family"] != "square")
    table: dict[int, dict[str, float]] = {}
    for mm in np.unique(d["m"][sel]):
        s = sel & (d["m"] == mm)
        cols = zip(d["dtype"][s], d["n"][s], d["k"][s], d["measured_s"][s], strict=True)
        pairs = [(key[(dt, mm, nn, kk)], t) for dt, nn, kk, t in cols if (dt, mm, nn, kk) in key]
        if not pairs:
            continue
        args = (np.full(int(s.sum()), mm), d["n"][s], d["k"][s], None, "bf16")
        dn = sparse_gemm_work(*args, "dense", gpu, p, dense=dense).time_s
        sw = sparse_gemm_work(*args, "2:4", gpu, p, dense=dense).time_s
        ratios = [a / b for a, b in pairs]
        table[int(mm)] = {
            "measured": round(float(np.median(ratios)), 3),
            "measured_max": round(float(np.max(ratios)), 3),
            "model": round(float(np.median(dn / sw)), 3),
            "shapes": len(pairs),
        }
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="refit on a sparse_gemm CSV and print held-out error")
    f.add_argument("csv")
    f.add_argument("--gpu", default="h100-sxm")
    e = sub.add_parser("eval", help="held-out error of the shipped parameters on a CSV")
    e.add_argument("csv")
    e.add_argument("--gpu", default="h100-sxm")
    e.add_argument(
        "--params", help="a sparse_gemm.yaml to evaluate instead of the shipped one (its base)"
    )
    args = ap.parse_args(argv)
    from hardware_specs.registry import builtin_catalog

    gpus = builtin_catalog().gpus
    if args.gpu not in gpus:
        print(f"unknown --gpu {args.gpu!r}; known: {', '.join(sorted(gpus))}", file=sys.stderr)
        return 2
    gpu = gpus[args.gpu]
    d = read_measured(args.csv)
    if args.cmd == "fit":
        p, rep = fit(d, gpu)
        semi = (
            "compute_efficiency",
            "memory_efficiency_factor",
            "narrow_memory_efficiency_factor",
            "kernel_overhead_s",
            "call_floor_s",
        )
        cats = ("gather_memory_efficiency", "gather_launch_s")
        fitted = {
            "semi_structured": {k: getattr(p.semi_structured, k) for k in semi},
            "cats": {k: getattr(p.cats, k) for k in cats},
        }
        print(yaml.safe_dump(fitted, sort_keys=False))
    elif args.params:
        raw = yaml.safe_load(Path(args.params).read_text())
        rep = report(d, gpu, SparseGemmParams.model_validate(raw["base"]))
    else:
        rep = report(d, gpu, sparse_params(gpu.architecture))
    print(yaml.safe_dump(rep, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
