"""Fit the analytical model's efficiency parameters to measurements.

Each parameter group (GEMM, attention per backend, decode, memory-bound ops,
collectives) owns some op rows and some parameters; least squares on log(time)
errors (scipy's bounded trust-region solver) moves those parameters only. The
learned correction then fits what the physics still misses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from costmodels.ops.analytical import AnalyticalCostModel, Columns
from costmodels.ops.features import COLLECTIVES, ELEMENTWISE
from costmodels.ops.gemm import row_alignment
from costmodels.ops.params import ArchParams
from hardware_specs.registry import System


@dataclass(frozen=True)
class Param:
    """A parameter path into the efficiency tree, with bounds (fitted in log space)."""

    path: tuple[str, ...]
    lo: float
    hi: float


@dataclass(frozen=True)
class Group:
    name: str
    rows: Callable[[Columns], np.ndarray]  # mask of the rows this group explains
    params: tuple[Param, ...]


def _ops(*names: str) -> Callable[[Columns], np.ndarray]:
    return lambda cols: np.isin(cols["op"], names)


def _attn_backend(backend: str, default: str) -> Callable[[Columns], np.ndarray]:
    dense = ("attn_fwd", "attn_bwd", "attn_fwdbwd")
    sparse = ("attn_blocksparse_fwd", "attn_blocksparse_bwd")

    def rows(cols: Columns) -> np.ndarray:
        chosen = cols["backend"]
        is_dense = np.isin(cols["op"], dense) & (np.where(chosen == "", "flash", chosen) == backend)
        is_sparse = np.isin(cols["op"], sparse) & (
            np.where(chosen == "", "flex", chosen) == backend
        )
        return is_dense | is_sparse

    return rows


def _eff(*path: str) -> Param:
    return Param(path, 0.05, 1.0)


def _attn_group(backend: str) -> Group:
    b = ("attention", "backends", backend)
    return Group(
        f"attention:{backend}",
        _attn_backend(backend, "flash"),
        (
            _eff(*b, "fwd_efficiency"),
            _eff(*b, "bwd_efficiency"),
            Param((*b, "launch_s"), 1e-7, 1e-4),
            Param((*b, "bwd_launch_s"), 1e-7, 1e-4),
            Param((*b, "cta_latency_s"), 1e-8, 2e-5),
            Param((*b, "fwd_head_dim_factor", "64"), 0.5, 2.0),
            Param((*b, "fwd_head_dim_factor", "256"), 0.25, 2.0),
            Param((*b, "bwd_head_dim_factor", "64"), 0.5, 2.0),
            Param((*b, "bwd_head_dim_factor", "256"), 0.25, 2.0),
            Param((*b, "bwd_row_bytes"), 0.1, 2000.0),
        ),
    )


#: backends measured through the serving engines' own kernels, with groups of their own
ENGINE_BACKENDS = ("flashinfer",)


def _engine_groups(backend: str) -> Group:
    """One group for a serving backend's prefill (forward tiles) and paged decode: its
    own parameters only (``attention.backends.<b>`` forward fields and
    ``attention.decode_backends.<b>``)."""
    b = ("attention", "backends", backend)
    dec = ("attention", "decode_backends", backend)

    def rows(cols: Columns) -> np.ndarray:
        return np.isin(cols["op"], ("attn_fwd", "attn_decode")) & (cols["backend"] == backend)

    return Group(
        f"engine:{backend}",
        rows,
        (
            _eff(*b, "fwd_efficiency"),
            Param((*b, "launch_s"), 1e-7, 1e-4),
            Param((*b, "cta_latency_s"), 1e-8, 2e-5),
            Param((*b, "fwd_head_dim_factor", "64"), 0.5, 2.0),
            Param((*b, "fwd_head_dim_factor", "256"), 0.25, 2.0),
            Param((*dec, "memory_efficiency"), 0.2, 1.0),
            Param((*dec, "crowded_bytes_per_s"), 1e11, 1e13),
            Param((*dec, "ctas_per_sm"), 0.25, 16.0),
            Param((*dec, "launch_s"), 1e-7, 1e-4),
            Param((*dec, "split_iter_s"), 1e-8, 1e-5),
            Param((*dec, "head_dim_factor", "64"), 0.5, 2.0),
            Param((*dec, "head_dim_factor", "256"), 0.25, 2.0),
        ),
    )


GROUPS: tuple[Group, ...] = (
    Group(
        "gemm",
        _ops("gemm"),
        (
            *(
                _eff("gemm", "mma_efficiency", d)
                for d in ("bf16", "fp16", "fp32", "tf32", "fp8", "int8", "fp64")
            ),
            Param(("gemm", "operand_feed_bytes_per_s"), 1e12, 1e14),
            Param(("gemm", "memory_efficiency"), 0.3, 1.0),
            Param(("gemm", "launch_s"), 1e-7, 5e-5),
            Param(("gemm", "wave_latency_s"), 1e-8, 2e-5),
            *(
                Param(("gemm", "misaligned_efficiency", e, a), 0.03, 1.0)
                for e, aligns in (("1", "8421"), ("2", "842"), ("4", "84"))
                for a in aligns
            ),
            Param(("gemm", "k_overhead"), 1.0, 2048.0),
        ),
    ),
    *(_attn_group(b) for b in ("flash", "cudnn", "flex", "efficient")),
    Group(
        "decode",
        # the analytical decode parameters describe the split-KV kernels (flash,
        # efficient); cuDNN's decode kernel is a learned correction on top of them (its
        # own kernel family, costmodels.ops.features.kernel_family)
        # FlashInfer's rows have a group of their own (the last)
        lambda cols: (cols["op"] == "attn_decode")
        & ~np.isin(cols["backend"], ("cudnn", *ENGINE_BACKENDS)),
        (
            Param(("attention", "decode_memory_efficiency"), 0.2, 1.0),
            Param(("attention", "decode_crowded_bytes_per_s"), 1e11, 1e13),
            Param(("attention", "decode_ctas_per_sm"), 0.25, 16.0),
            Param(("attention", "decode_launch_s"), 1e-7, 1e-4),
            Param(("attention", "decode_head_dim_factor", "64"), 0.5, 2.0),
            Param(("attention", "decode_head_dim_factor", "256"), 0.25, 2.0),
            Param(("attention", "decode_split_iter_s"), 1e-8, 1e-5),
            Param(("attention", "decode_nosplit_iter_s"), 1e-7, 2e-5),
            Param(("attention", "decode_nosplit_ctas_per_sm"), 0.5, 16.0),
            Param(("attention", "decode_nosplit_head_dim_factor", "64"), 0.5, 2.0),
            Param(("attention", "decode_nosplit_head_dim_factor", "256"), 0.25, 2.0),
        ),
    ),
    Group(
        "elementwise",
        _ops(*ELEMENTWISE),
        (
            *(Param(("elementwise", "memory_efficiency", k), 0.05, 1.0) for k in ELEMENTWISE),
            Param(("elementwise", "ramp_bytes"), 1e3, 1e9),
            Param(("elementwise", "launch_s"), 1e-7, 5e-5),
        ),
    ),
    Group(
        "collectives",
        _ops(*COLLECTIVES),
        (
            *(Param(("collectives", "intra_node_efficiency", k), 0.05, 1.0) for k in COLLECTIVES),
            Param(("collectives", "protocols", "LL", "base_latency_s"), 1e-7, 1e-4),
            Param(("collectives", "protocols", "LL", "step_latency_s"), 1e-8, 1e-5),
            Param(("collectives", "protocols", "LL", "bandwidth_fraction"), 0.02, 1.0),
            Param(("collectives", "protocols", "LL128", "base_latency_s"), 1e-7, 1e-4),
            Param(("collectives", "protocols", "Simple", "base_latency_s"), 1e-7, 1e-4),
            Param(("collectives", "send_recv_latency_s"), 1e-7, 2e-4),
            Param(("collectives", "all_to_all_latency_s"), 1e-7, 2e-4),
        ),
    ),
    # Last, so that every group above fits exactly as it did before they existed: the
    # serving engines' kernels (calibrate/data/engine-kernels-*), forward and decode only.
    *(_engine_groups(b) for b in ENGINE_BACKENDS),
)
ENGINE_GROUPS = tuple(g for g in GROUPS if g.name.startswith("engine:"))


def _get(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = tree
    for key in path:
        node = node[key]
    return node


def _set(tree: dict[str, Any], path: tuple[str, ...], value: float) -> None:
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


_FACTORS = (
    "head_dim_factor",
    "fwd_head_dim_factor",
    "bwd_head_dim_factor",
    "decode_head_dim_factor",
    "decode_nosplit_head_dim_factor",
)
_FACTOR_POINTS = (64.0, 128.0, 256.0)  # 128 is the reference (factor 1)


def _factor_informed(head_dim: np.ndarray, point: float) -> bool:
    """Whether rows can fit the head-dim factor at ``point`` (64 or 256): some rows on its
    side of 128 (any head dim there, not only ``point``: 32 and 96 are priced through it)
    and some not, else the factor and the efficiency are the same unknown."""
    d = head_dim[np.isfinite(head_dim)]
    side = d < 128 if point < 128 else d > 128
    return bool(side.any() and (~side).any())


def _relevant(cols: Columns, mask: np.ndarray, params: list[Param]) -> list[Param]:
    """Drop parameters the rows cannot inform (e.g. fp8 efficiency without fp8 rows)."""
    per_dtype = ("gemm", "mma_efficiency")
    per_op = (("elementwise", "memory_efficiency"), ("collectives", "intra_node_efficiency"))
    keep = []
    for prm in params:
        if prm.path[:2] == per_dtype and not np.any(mask & (cols["dtype"] == prm.path[2])):
            continue
        if prm.path[:2] in per_op and not np.any(mask & (cols["op"] == prm.path[2])):
            continue
        if prm.path[-2] in _FACTORS and not _factor_informed(
            cols["head_dim"][mask], float(prm.path[-1])
        ):
            continue
        if prm.path[:2] == ("gemm", "misaligned_efficiency"):
            elt = np.where(
                np.isin(cols["dtype"], ["fp8", "int8"]),
                1,
                np.where(np.isin(cols["dtype"], ["bf16", "fp16"]), 2, 4),
            )
            align = np.minimum(row_alignment(cols["k"] * elt), row_alignment(cols["n"] * elt))
            rows = mask & (elt == int(prm.path[2])) & (align == float(prm.path[3]))
            if not np.any(rows & (cols["dtype"] != "fp32")):
                continue
        keep.append(prm)
    return keep


def _head_dim_notes(group: Group, head_dim: np.ndarray, params: list[Param]) -> list[str]:
    """Say which head-dim factor points the rows could not fit (all on one side of 128)."""
    if not any(p.path[-2] in _FACTORS for p in group.params):
        return []
    d = np.unique(head_dim[np.isfinite(head_dim)])
    kept = {float(p.path[-1]) for p in params if p.path[-2] in _FACTORS}
    notes = []
    for point in (64.0, 256.0):
        side = d < 128 if point < 128 else d > 128
        if side.any() and point not in kept:
            notes.append(
                f"{group.name}: every row is on one side of head_dim 128, so the factor at "
                f"{point:g} keeps its default and the efficiency carries the level"
            )
    return notes


def unseen_head_dims(cols: Columns) -> list[str]:
    """One note per op class with head dims the factor tables (64, 128, 256) lack: those
    are priced with the factor pooled over their side of 128, interpolated in log2 between
    the points and held flat outside 64-256."""
    notes = []
    attn = np.char.startswith(cols["op"].astype(str), "attn_")
    for label, rows in (("attention", attn & (cols["op"] != "attn_decode")),
                        ("decode", cols["op"] == "attn_decode")):  # fmt: skip
        d = np.unique(cols["head_dim"][rows & np.isfinite(cols["head_dim"])])
        unseen = [str(int(x)) for x in d if x not in _FACTOR_POINTS]
        if unseen:
            notes.append(
                f"{label}: head_dim {', '.join(unseen)} not in the factor table (64, 128, "
                "256): priced with the factor pooled over its side of 128 (interpolated in "
                "log2 between the points, held flat outside 64-256)"
            )
    return notes


@dataclass
class GroupFit:
    name: str
    rows: int
    values: dict[str, float]
    train_mape_before: float
    train_mape_after: float
    notes: list[str] = field(default_factory=list)  # fallbacks taken, one line each


def _fit_group(
    system: System, tree: dict[str, Any], params: list[Param], sub: Columns, target: np.ndarray
) -> tuple[np.ndarray, float, float]:
    """Solve one group; returns (log-values, train MAPE before, after)."""

    def model_at(x: np.ndarray) -> np.ndarray:
        trial = _tree_copy(tree)
        for prm, v in zip(params, x, strict=True):
            _set(trial, prm.path, float(np.exp(v)))
        model = AnalyticalCostModel(system, ArchParams.model_validate(trial))
        return np.log(model.work_columns(sub).time_s)

    x0 = np.array([np.log(np.clip(_get(tree, p.path), p.lo, p.hi)) for p in params])
    bounds = (np.log([p.lo for p in params]), np.log([p.hi for p in params]))
    sol = least_squares(
        lambda x: model_at(x) - target, x0, bounds=bounds, loss="soft_l1", f_scale=0.1,
        max_nfev=60 * (len(params) + 1),
    )  # fmt: skip
    return sol.x, _mape(target, model_at(x0)), _mape(target, model_at(sol.x))


def fit_params(
    system: System,
    start: ArchParams,
    cols: Columns,
    measured_s: np.ndarray,
    groups: tuple[Group, ...] = GROUPS,
) -> tuple[dict[str, Any], list[GroupFit]]:
    """Overrides (nested dict, same shape as efficiency.yaml) fitted group by group
    (``groups``: all of them, or a few, e.g. the engine backends' alone)."""
    tree = start.model_dump(mode="json")
    overrides: dict[str, Any] = {}
    report: list[GroupFit] = []
    for group in groups:
        mask = group.rows(cols)
        if mask.sum() < 3:
            if mask.any():
                note = f"{group.name}: only {int(mask.sum())} row(s), defaults kept (3 needed)"
                report.append(GroupFit(group.name, int(mask.sum()), {}, np.nan, np.nan, [note]))
            continue
        params = _relevant(cols, mask, list(group.params))
        notes = _head_dim_notes(group, cols["head_dim"][mask], params)
        if not params:
            continue
        sub = {k: v[mask] for k, v in cols.items()}
        x, before, after = _fit_group(system, tree, params, sub, np.log(measured_s[mask]))
        values = {}
        if after < before:
            for prm, v in zip(params, x, strict=True):
                _set(tree, prm.path, float(np.exp(v)))
                _set(overrides, prm.path, float(np.exp(v)))
                values[".".join(prm.path)] = float(np.exp(v))
        fit = GroupFit(group.name, int(mask.sum()), values, before, min(before, after), notes)
        report.append(fit)
    return overrides, report


def _tree_copy(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: _tree_copy(v) if isinstance(v, dict) else v for k, v in tree.items()}


def _mape(log_measured: np.ndarray, log_pred: np.ndarray) -> float:
    return float(np.mean(np.abs(np.exp(log_pred - log_measured) - 1.0)) * 100.0)
