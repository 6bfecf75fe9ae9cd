"""Fit and validate the tile-table block-sparse attention model on FlexAttention rows.

    python -m calibrate.sparse.attention          # print the fit and validation tables
    python -m calibrate.sparse.attention --write  # and write costmodels/data/sparse_attention.yaml

Data: the measured FlexAttention rows (calibrate/data/{h100,h200}-sxm/blocksparse.csv,
bf16, head_dim 128, batch 1; forward and backward), each with the tile table the
benchmark visited (:func:`calibration_tiles` mirrors ``calibrate/bench/blocksparse.py``).
Splits are by pattern family, never random:

1. The shipped profiles' held-out families (nsa/l2n4, nsa/l4n8, s2/l2s8, topk/k2,
   topk/k32): the tile model is fitted on the other 15 families and compared, family by
   family, with the density-only model (``attention_work``) of the calibrated profile,
   analytical and learned (its learned residuals were fitted without these families too).
   These parameters are the ones written to costmodels/data/sparse_attention.yaml.
2. Leave one pattern out: all window (or top-k, S2, NSA, dense, causal) families held out
   at once, the model fitted on the rest.

Also printed: the H100 run-to-run noise per family (the suite was measured twice).

The fit (:func:`fit_tile_params`): the schedule (which CTAs end on the busiest SM) comes
from the current parameters, the makespan is then linear in the parameters and solved by
robust non-negative least squares on relative errors, repeated. The model it fits is
:mod:`costmodels.ops.sparse_kernel`; nothing here runs at prediction time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from costmodels.ops.sparse_kernel import (
    KernelContext,
    TileKernelParams,
    cta_coefficients,
    cta_features,
    derived_params,
    gpu_spec,
    kernel_extras,
    list_schedule,
    price_launches,
)
from costmodels.ops.sparse_tiles import SparseAttentionError, TileCounts
from hardware_specs.schema import GpuSpec

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibrate" / "data"
OUT = ROOT / "costmodels" / "data" / "sparse_attention.yaml"
COMMAND = "python -m calibrate.sparse.attention"
GPUS = ("h100-sxm", "h200-sxm")
PATTERNS = ("dense", "causal", "window", "topk", "s2", "nsa")
FALLBACK_HELD_OUT = ("nsa/l2n4", "nsa/l4n8", "s2/l2s8", "topk/k2", "topk/k32")


# --------------------------------------------------------------------------- measured rows

_FAMILY = re.compile(r"^(dense|causal|window/w(\d+)|topk/k(\d+)|s2/l(\d+)s(\d+)|nsa/l(\d+)n(\d+))$")


def _bench_masks(family: str, heads: int, seq: int, bs: int, seed: int = 0):
    """(full, partial) boolean [heads, nb, nb] tables of one measured FlexAttention row.

    Mirrors ``calibrate/bench/blocksparse.py`` (``block_layout`` + ``classify_blocks``):
    dense; causal; window (causal, ``q - k < w``); topk (k random key blocks among the
    causal ones, the diagonal always); s2 (``local`` recent blocks plus key blocks
    ``== h mod stride``); nsa (block 0 + ``local`` recent + n random causal blocks). The
    benchmark draws with torch's generator: here numpy's, so the random blocks differ while
    per-row counts match exactly for topk and in distribution for nsa."""
    m = _FAMILY.match(family)
    if not m:
        raise SparseAttentionError(f"unknown calibration family {family!r}")
    nb = seq // bs
    qb, kb = np.arange(nb)[:, None], np.arange(nb)[None, :]
    lower = np.broadcast_to(kb <= qb, (heads, nb, nb))
    causal, window = True, seq
    rng = np.random.default_rng(seed)
    if family == "dense":
        T, causal = np.ones((heads, nb, nb), bool), False
    elif family == "causal":
        T = lower.copy()
    elif m.group(2):
        T, window = lower.copy(), int(m.group(2))
    elif m.group(3) or m.group(7):
        n_sel = int(m.group(3) or m.group(7))
        if m.group(3):  # the diagonal plus k - 1 of the blocks before it
            T = _random_blocks(rng, heads, nb, n_sel - 1, diagonal=False)
            T[:, np.arange(nb), np.arange(nb)] = True
        else:  # n of the causal blocks, plus block 0 and the local blocks
            T = _random_blocks(rng, heads, nb, n_sel, diagonal=True)
            T |= kb == 0
            T |= (qb - kb) < int(m.group(6))
        T &= lower
    else:
        loc, stride = int(m.group(4)), int(m.group(5))
        offs = np.arange(heads)[:, None, None] % stride
        T = (((qb - kb) < loc) | ((kb % stride) == offs)) & lower
    diff = (qb - kb) * bs
    dmin, dmax = diff - (bs - 1), diff + (bs - 1)
    lo = 0 if causal else -(10**12)
    any_ok = (dmax >= lo) & (dmin <= window - 1)
    all_ok = (dmin >= lo) & (dmax <= window - 1)
    return T & all_ok, T & any_ok & ~all_ok


def _random_blocks(
    rng: np.random.Generator, heads: int, nb: int, k: int, diagonal: bool
) -> np.ndarray:
    """[heads, nb, nb] bool: row i holds min(k, c_i) distinct blocks drawn uniformly from
    its c_i candidates (0..i with the diagonal, 0..i-1 without). Rejection sampling of
    duplicates: O(heads x nb x k), not a sort over every row."""
    out = np.zeros((heads, nb, nb), bool)
    if k <= 0:
        return out
    cand = np.arange(nb) + (1 if diagonal else 0)  # candidates per row
    allrow = cand <= k  # rows that take every candidate
    lower = np.arange(nb)[None, :] < cand[:, None]
    out[:, allrow] = lower[allrow]
    rows = np.flatnonzero(~allrow)
    if rows.size:
        c = cand[rows].astype(float)[None, :, None]
        draw = np.floor(rng.random((heads, rows.size, k)) * c).astype(np.int64)
        while True:
            draw.sort(axis=-1)
            dup = np.zeros(draw.shape, bool)
            dup[..., 1:] = draw[..., 1:] == draw[..., :-1]
            if not dup.any():
                break
            redraw = np.floor(rng.random(int(dup.sum())) * np.broadcast_to(c, draw.shape)[dup])
            draw[dup] = redraw.astype(np.int64)
        h = np.arange(heads)[:, None, None]
        out[h, rows[None, :, None], draw] = True
    return out


@lru_cache(maxsize=256)
def calibration_tiles(family: str, heads: int, seq: int, block_size: int) -> TileCounts:
    """Tile counts of a measured FlexAttention row (exact transpose), cached."""
    full, partial = _bench_masks(family, heads, seq, block_size)
    return TileCounts.from_masks(full, partial, block_size, block_size)


@dataclass(frozen=True)
class CalibrationRow:
    direction: str  # "fwd" | "bwd"
    family: str
    pattern: str
    tiles: TileCounts
    batch: int
    heads: int
    head_dim: int
    seq: int
    block_size: int
    dtype: str
    measured_s: float


def calibration_rows(frame: Any) -> list[CalibrationRow]:
    """Measured block-sparse rows (a pandas frame of ``calibrate/data/*/blocksparse.csv``,
    ``status == ok``) with their tile tables."""
    rows = []
    for r in frame.itertuples(index=False):
        if getattr(r, "status", "ok") != "ok" or not np.isfinite(r.measured_ms):
            continue
        if int(r.seq_q) != int(r.seq_kv) or int(r.heads_q) != int(r.heads_kv):
            raise SparseAttentionError("calibration rows must be self-attention without GQA")
        rows.append(
            CalibrationRow(
                direction="fwd" if str(r.op).endswith("fwd") else "bwd",
                family=str(r.family),
                pattern=str(r.pattern),
                tiles=calibration_tiles(
                    str(r.family), int(r.heads_q), int(r.seq_q), int(r.block_size)
                ),
                batch=int(r.batch),
                heads=int(r.heads_q),
                head_dim=int(r.head_dim),
                seq=int(r.seq_q),
                block_size=int(r.block_size),
                dtype=str(r.dtype),
                measured_s=float(r.measured_ms) / 1e3,
            )
        )
    return rows


def _context(spec: GpuSpec, r: CalibrationRow) -> KernelContext:
    return KernelContext(spec, r.dtype, r.batch, r.head_dim, r.heads, r.heads)


def predict_rows(
    rows: Sequence[CalibrationRow], gpu: str | GpuSpec, params: TileKernelParams
) -> np.ndarray:
    """Predicted seconds for calibration rows (each its own direction)."""
    spec = gpu_spec(gpu)
    out = np.zeros(len(rows))
    for direction in ("fwd", "bwd"):
        idx = [i for i, r in enumerate(rows) if r.direction == direction]
        if not idx:
            continue
        ctxs = [_context(spec, rows[i]) for i in idx]
        res = price_launches([rows[i].tiles for i in idx], ctxs, direction, [params] * len(idx))
        out[idx] = [k.time_s for k in res]
    return out


def _nnls_irls(A: np.ndarray, y: np.ndarray, iters: int = 30, delta: float = 0.05) -> np.ndarray:
    """argmin_x>=0 sum huber((A x - y) / y): relative errors, robust to a few noisy rows
    (iteratively reweighted least squares; non-negativity by an active set)."""
    w = 1.0 / y
    x = np.zeros(A.shape[1])
    for _ in range(iters):
        free = np.ones(A.shape[1], bool)
        while True:
            Aw = A[:, free] * w[:, None]
            sol, *_ = np.linalg.lstsq(Aw, y * w, rcond=None)
            if (sol >= 0).all():
                break
            idx = np.flatnonzero(free)[np.argmin(sol)]
            free[idx] = False
        x = np.zeros(A.shape[1])
        x[free] = sol
        r = np.abs(A @ x - y) / y
        w = np.where(r <= delta, 1.0, np.sqrt(delta / np.maximum(r, 1e-12))) / y
    return x


def fit_tile_params(
    rows: Sequence[CalibrationRow],
    gpu: str | GpuSpec,
    *,
    start: TileKernelParams | None = None,
    iterations: int = 5,
    source: str = "",
) -> TileKernelParams:
    """Fit per-block-size efficiencies and mask costs, CTA costs and launch times, per
    direction, on measured rows: the schedule (which CTAs end on the busiest SM) is taken
    from the current parameters, the makespan is then linear in the parameters and solved
    by robust non-negative least squares on relative errors; repeated ``iterations`` times
    (damped), keeping the iterate whose scheduled predictions err least. Block sizes seen
    only forward take the backward efficiency and mask cost of the measured block size
    scaled by the forward ratio."""
    spec = gpu_spec(gpu)
    p = start if start is not None else derived_params(spec, "flex")
    out: dict[str, Any] = {}
    for direction in ("fwd", "bwd"):
        sub = [r for r in rows if r.direction == direction]
        if not sub:
            continue
        sizes = sorted({r.block_size for r in sub})
        ctxs = [_context(spec, r) for r in sub]
        feats, exps, extras = [], [], []
        for r, c in zip(sub, ctxs, strict=True):
            f, e = cta_features(r.tiles, c, direction, p.exp_overlap)
            feats.append(f)
            exps.append(e)
            extras.append(kernel_extras(r.tiles, c, direction, p)[1])
        y = np.array([r.measured_s for r in sub]) - np.array(extras)
        fe = [np.column_stack([f, e]) for f, e in zip(feats, exps, strict=True)]
        slots = spec.sm_count
        x_prev: np.ndarray | None = None
        best: tuple[float, TileKernelParams] | None = None
        for it in range(iterations + 1):
            works = [
                f @ cta_coefficients(p, direction, r.tiles) + e
                for f, e, r in zip(feats, exps, sub, strict=True)
            ]
            makespan, busy = list_schedule(works, slots, fe)
            if it:  # the true (scheduled) error of the current parameters
                launch = p.fwd_launch_s if direction == "fwd" else p.bwd_launch_s
                err = float(np.mean(np.abs((launch + makespan) / y - 1.0)))
                if best is None or err < best[0]:
                    best = (err, p)
            if it == iterations:
                break
            # columns: launch, cta, 1/eff[size]..., mask[size]...
            A = np.zeros((len(sub), 2 + 2 * len(sizes)))
            A[:, 0] = 1.0
            A[:, 1] = busy[:, 0]
            for i, r in enumerate(sub):
                j = sizes.index(r.block_size)
                A[i, 2 + j] = busy[i, 1]
                A[i, 2 + len(sizes) + j] = busy[i, 2]
            x = _nnls_irls(A, np.maximum(y - busy[:, 3], 1e-9))
            if x_prev is not None:  # damped: the busiest slot can flip between near-ties
                x = 0.5 * (x + x_prev)
            x_prev = x
            inv = x[2 : 2 + len(sizes)]
            if (inv <= 0).any():
                raise SparseAttentionError(f"{direction}: tile efficiency not identifiable")
            eff = {s: float(min(1.0, 1.0 / v)) for s, v in zip(sizes, inv, strict=True)}
            mask = {s: float(v) for s, v in zip(sizes, x[2 + len(sizes) :], strict=True)}
            if direction == "fwd":
                p = replace(
                    p,
                    fwd_efficiency=eff,
                    fwd_mask_s=mask,
                    fwd_cta_s=float(x[1]),
                    fwd_launch_s=float(x[0]),
                )
            else:
                p = replace(
                    p,
                    bwd_efficiency=eff,
                    bwd_mask_s=mask,
                    bwd_cta_s=float(x[1]),
                    bwd_launch_s=float(x[0]),
                )
        if best is not None:
            p = best[1]
        out[direction] = sizes
    # block sizes measured forward only: transfer the forward ratios to the backward
    fwd_sizes, bwd_sizes = out.get("fwd", []), out.get("bwd", [])
    if bwd_sizes:
        ref = bwd_sizes[-1]
        beff, bmask = dict(p.bwd_efficiency), dict(p.bwd_mask_s)
        for s in fwd_sizes:
            if s not in beff and ref in p.fwd_efficiency:
                beff[s] = beff[ref] * p.fwd_efficiency[s] / p.fwd_efficiency[ref]
                ratio = p.fwd_mask_s[s] / max(p.fwd_mask_s[ref], 1e-30)
                bmask[s] = bmask[ref] * ratio
        p = replace(p, bwd_efficiency=beff, bwd_mask_s=bmask)
    return replace(p, source=source or f"fitted on {len(rows)} measured rows ({spec.id})")


def mape_by_family(
    rows: Sequence[CalibrationRow], predicted: np.ndarray
) -> dict[str, dict[str, float]]:
    """Mean absolute percentage error per family and direction, plus ``all``."""
    meas = np.array([r.measured_s for r in rows])
    ape = np.abs(np.asarray(predicted) / meas - 1.0) * 100.0
    out: dict[str, dict[str, float]] = {}
    fams = sorted({r.family for r in rows})
    for fam in [*fams, "all"]:
        sel = np.array([fam in ("all", r.family) for r in rows])
        entry = {"rows": int(sel.sum()), "mape": float(ape[sel].mean())}
        for direction in ("fwd", "bwd"):
            s2 = sel & np.array([r.direction == direction for r in rows])
            if s2.any():
                entry[f"{direction}_mape"] = float(ape[s2].mean())
        out[fam] = entry
    return out


def split_rows(
    rows: Sequence[CalibrationRow], held_out: Iterable[str]
) -> tuple[list[CalibrationRow], list[CalibrationRow]]:
    """(fit, held-out) by family name or pattern name (``topk`` holds out every top-k)."""
    held = set(held_out)
    test = [r for r in rows if r.family in held or r.pattern in held]
    fit = [r for r in rows if not (r.family in held or r.pattern in held)]
    return fit, test


# --------------------------------------------------------------------------- validation


def measured(gpu: str) -> pd.DataFrame:
    return pd.read_csv(DATA / gpu / "blocksparse.csv")


def profile_held_out(gpu: str, families: set[str]) -> list[str]:
    """The block-sparse families the shipped profile held out (same split, fair compare)."""
    path = ROOT / "costmodels" / "profiles" / f"{gpu}.json"
    if path.exists():
        held = [g for g in json.loads(path.read_text()).get("held_out_groups", []) if g in families]
        if held:
            return sorted(held)
    return list(FALLBACK_HELD_OUT)


def density_model_predictions(gpu: str, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The density-only model (costmodels.ops.attention.attention_work) with the shipped
    profile: its fitted analytical part and its learned correction, seconds per row."""
    from costmodels.ops.select import get_cost_model
    from workloads.ops import CSV_COLUMNS, normalise_frame

    model = get_cost_model(gpu)
    ops = normalise_frame(frame[[c for c in CSV_COLUMNS if c in frame.columns]].copy())
    base = model.base if hasattr(model, "base") else model
    return {"analytical": base.predict_many(ops), "learned": model.predict_many(ops)}


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)


def fit_shipped(gpu: str) -> dict[str, Any]:
    """The shipped fit of one GPU: fitted on every family but the profile's held-out ones.
    Returns the parameters, the rows on each side and the in-sample MAPE."""
    frame = measured(gpu)
    ok = frame[frame["status"] == "ok"].reset_index(drop=True)
    rows = calibration_rows(ok)
    held = profile_held_out(gpu, {r.family for r in rows})
    fit_rows, test_rows = split_rows(rows, held)
    params = fit_tile_params(
        fit_rows, gpu, source=f"fitted on {len(fit_rows)} rows of {gpu}, held out {held}"
    )
    fit_pred = predict_rows(fit_rows, gpu, params)
    fit_meas = np.array([r.measured_s for r in fit_rows])
    return {
        "gpu": gpu,
        "frame": ok,
        "rows": rows,
        "held_out": held,
        "params": params,
        "fit_rows": len(fit_rows),
        "test_rows": test_rows,
        "fit_mape": mape(fit_pred, fit_meas),
    }


def held_out_table(fit: dict[str, Any]) -> list[dict[str, Any]]:
    """MAPE per held-out family (and ``all``): the tile model forward, backward and both,
    next to the density-only model of the shipped profile on the same rows."""
    gpu, ok, held, test_rows = fit["gpu"], fit["frame"], fit["held_out"], fit["test_rows"]
    pred = predict_rows(test_rows, gpu, fit["params"])
    dens = density_model_predictions(gpu, ok)
    test_mask = ok["family"].isin(held).to_numpy()
    meas = np.array([r.measured_s for r in test_rows])
    fams = np.array([r.family for r in test_rows])
    dirs = np.array([r.direction for r in test_rows])
    ok_test = ok[test_mask].reset_index(drop=True)
    if not (ok_test["family"].to_numpy() == fams).all():
        raise SparseAttentionError("held-out rows are not in the measured order")
    table = []
    for fam in [*held, "all"]:
        s = np.ones(len(fams), bool) if fam == "all" else fams == fam
        fwd, bwd = s & (dirs == "fwd"), s & (dirs == "bwd")
        table.append(
            {
                "family": fam,
                "rows": int(s.sum()),
                "tile_mape": mape(pred[s], meas[s]),
                "tile_fwd": mape(pred[fwd], meas[fwd]),
                "tile_bwd": mape(pred[bwd], meas[bwd]) if bwd.any() else float("nan"),
                "density_analytical": mape(dens["analytical"][test_mask][s], meas[s]),
                "density_learned": mape(dens["learned"][test_mask][s], meas[s]),
            }
        )
    return table


def leave_one_pattern_out(gpu: str, rows: Sequence[CalibrationRow]) -> list[dict[str, Any]]:
    """Every family of one pattern held out at once, the model fitted on the others."""
    out = []
    for pattern in PATTERNS:
        f_rows, t_rows = split_rows(rows, [pattern])
        p = fit_tile_params(f_rows, gpu)
        by_fam = mape_by_family(t_rows, predict_rows(t_rows, gpu, p))
        for fam, entry in by_fam.items():
            out.append({"pattern": pattern, "family": fam, **entry})
    return out


def evaluate(gpu: str) -> dict[str, Any]:
    """The shipped fit of ``gpu`` with its held-out table and the leave-one-pattern-out
    fits."""
    fit = fit_shipped(gpu)
    return {
        "gpu": gpu,
        "held_out": fit["held_out"],
        "params": fit["params"],
        "fit_rows": fit["fit_rows"],
        "fit_mape": fit["fit_mape"],
        "held_out_table": held_out_table(fit),
        "lopo": leave_one_pattern_out(gpu, fit["rows"]),
    }


def repeat_noise() -> dict[str, float]:
    """H100 run-to-run noise: MAPE of the accidental second measurement vs the first."""
    rep = pd.read_csv(DATA / "h100-sxm" / "repeats" / "attention_blocksparse.csv")
    rep = rep[(rep["suite"] == "blocksparse") & (rep["status"] == "ok")]
    main = measured("h100-sxm")
    key = ["op", "seq_q", "heads_q", "block_size", "family"]
    m = main.merge(rep, on=key, suffixes=("", "_rep"))
    m = m[np.isfinite(m["measured_ms"]) & np.isfinite(m["measured_ms_rep"])]
    ape = np.abs(m["measured_ms_rep"] / m["measured_ms"] - 1.0) * 100.0
    out = ape.groupby(m["family"]).mean().to_dict()
    out["all"] = float(ape.mean())
    return out


# --------------------------------------------------------------------------- output


def measured_on(gpu: str) -> dict[str, Any]:
    """Where the rows were measured (calibrate/data/<gpu>/meta.json; the H200 block-sparse
    rows were completed on a one-GPU machine, whose environment is recorded separately)."""
    meta = json.loads((DATA / gpu / "meta.json").read_text())
    env = meta.get("environment") or meta.get("blocksparse_completion", {}).get("meta", {}).get(
        "environment", {}
    )
    keys = ("date", "gpu_name", "sm_count", "device_kind", "driver", "torch", "torch_cuda")
    out = {k: env[k] for k in (*keys, "triton", "timing_method") if k in env}
    if "note" in meta:
        out["note"] = meta.get("blocksparse_completion", {}).get("note", meta["note"])
    return out


def yaml_document(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``data/sparse_attention.yaml`` document of :func:`evaluate` results."""
    backends = {}
    for res in results:
        entry = res["params"].to_dict()
        entry["source"] = (
            f"fitted by {COMMAND} on calibrate/data/{res['gpu']}/"
            f"blocksparse.csv: {res['fit_rows']} rows (FlexAttention, bf16, head_dim 128, "
            f"batch 1), families {', '.join(res['held_out'])} held out"
        )
        entry["measured_on"] = measured_on(res["gpu"])
        entry["fit_mape_pct"] = round(res["fit_mape"], 2)
        entry["held_out_mape_pct"] = {
            r["family"]: round(r["tile_mape"], 2) for r in res["held_out_table"]
        }
        backends[res["gpu"]] = entry
    return {
        "about": (
            "Fitted parameters of costmodels/ops/sparse_kernel.py (tile-table block-sparse "
            f"attention). Regenerate with: {COMMAND} --write. "
            "Efficiencies are of the tile matmuls (forward 2, backward 7 per tile: "
            "FlexAttention's dK/dV and dQ programs both recompute QK^T and dP), keyed by "
            "block size; mask_s is the extra SM-seconds of a partial tile; cta_s the fixed "
            "SM-seconds per CTA; launch_s per call. Block size 64 backward was not measurable "
            "(no inductor config): its values are the 128 ones scaled by the forward ratio."
        ),
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "backends": {"flex": backends},
    }


def write_yaml(results: Sequence[dict[str, Any]], out: Path = OUT) -> None:
    """Write the fitted parameters atomically (temp file, then rename)."""
    text = yaml.safe_dump(yaml_document(results), sort_keys=False, width=100)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, out)
    print(f"wrote {out}")


def print_tables(results: Sequence[dict[str, Any]], noise: dict[str, float]) -> None:
    """The fitted parameters, the held-out table and the leave-one-pattern-out table."""
    for res in results:
        p = res["params"]
        print(
            f"\n== {res['gpu']}: fitted on {res['fit_rows']} rows "
            f"(in-sample MAPE {res['fit_mape']:.1f}%)"
        )
        print(
            f"   fwd efficiency {p.fwd_efficiency}  mask_s {p.fwd_mask_s}  "
            f"cta {p.fwd_cta_s * 1e6:.2f} us  launch {p.fwd_launch_s * 1e6:.1f} us"
        )
        print(
            f"   bwd efficiency {p.bwd_efficiency}  mask_s {p.bwd_mask_s}  "
            f"cta {p.bwd_cta_s * 1e6:.2f} us  launch {p.bwd_launch_s * 1e6:.1f} us"
        )
        print("Held-out families (the shipped profile's split), MAPE %")
        head = ("family", "rows", "tile", "fwd", "bwd", "density", "density+learned")
        print(
            f"{head[0]:12s} {head[1]:>4s} {head[2]:>6s} {head[3]:>6s} {head[4]:>6s} "
            f"{head[5]:>8s} {head[6]:>16s}"
            + ("  H100 repeat noise" if res["gpu"] == "h100-sxm" else "")
        )
        for r in res["held_out_table"]:
            extra = (
                f"  {noise.get(r['family'], float('nan')):8.1f}" if res["gpu"] == "h100-sxm" else ""
            )
            print(
                f"{r['family']:12s} {r['rows']:4d} {r['tile_mape']:6.1f} {r['tile_fwd']:6.1f} "
                f"{r['tile_bwd']:6.1f} {r['density_analytical']:8.1f} "
                f"{r['density_learned']:16.1f}{extra}"
            )
        print("Leave one pattern out (fit on the other patterns), MAPE %")
        print(f"{'held out':8s} {'family':12s} {'rows':>4s} {'mape':>6s} {'fwd':>6s} {'bwd':>6s}")
        for r in res["lopo"]:
            print(
                f"{r['pattern']:8s} {r['family']:12s} {r['rows']:4d} {r['mape']:6.1f} "
                f"{r.get('fwd_mape', float('nan')):6.1f} "
                f"{r.get('bwd_mape', float('nan')):6.1f}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the fitted parameters YAML")
    ap.add_argument(
        "--out", type=Path, default=OUT, help="where --write writes (default: the shipped file)"
    )
    args = ap.parse_args(argv)
    results = [evaluate(g) for g in GPUS]
    print_tables(results, repeat_noise())
    if args.write:
        write_yaml(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
