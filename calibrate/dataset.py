"""Calibration datasets: the runner's CSVs plus meta.json, validated, and the held-out split.

A dataset folder holds one CSV per suite (op-contract columns + measured_ms, suite,
family, status, ...) and ``meta.json`` describing the machine. Only rows with status
``ok`` are used. The split never mixes a shape family between fit and test:

- GEMM rows are grouped by dtype class and model (all of a model's layer shapes
  together) or family ("random", "odd", "square"); each dtype class holds out its own;
- attention and decode by head configuration, block-sparse by mask pattern;
- collectives and memory-bound ops by op and size decade.

A quarter of each stratum's groups, chosen by a stable hash, go to the held-out side.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodels.ops.features import op_class
from workloads.ops import CSV_COLUMNS, EXTRA_COLUMNS, OpError, normalise_frame

OP_COLUMNS = (*CSV_COLUMNS, *EXTRA_COLUMNS)
NON_OP_SUITES = {"power", "sparse_gemm"}  # sparse_gemm: fitted by calibrate.sparse.gemm


class DatasetError(ValueError):
    """A dataset folder that cannot be used; one line for users."""


# torch.cuda.get_device_name() -> simcli GPU id
_NAME_RULES: list[tuple[tuple[str, ...], str]] = [
    (("H200",), "h200-sxm"),
    (("H100", "PCIE"), "h100-pcie"),
    (("H100",), "h100-sxm"),
    (("A100", "40GB"), "a100-sxm-40gb"),
    (("A100",), "a100-sxm-80gb"),
    (("L40S",), "l40s"),
    (("B200",), "b200"),
    (("MI300X",), "mi300x"),
]


def gpu_id_from_name(name: str) -> str | None:
    upper = name.upper()
    for words, gpu_id in _NAME_RULES:
        if all(w in upper for w in words):
            return gpu_id
    return None


def environment(meta: Any) -> dict[str, Any]:
    """The machine description of a meta.json; a merged shard run keeps one per shard."""
    if not isinstance(meta, dict):
        return {}
    if isinstance(meta.get("environment"), dict):
        return meta["environment"]
    shards = meta.get("shards")
    if isinstance(shards, dict):
        for shard in shards.values():
            if isinstance(shard, dict) and isinstance(shard.get("environment"), dict):
                return shard["environment"]
    return {}


@dataclass
class Dataset:
    path: Path
    frame: pd.DataFrame  # op columns (normalised) + measured_s, suite, family, pattern, group
    meta: dict[str, Any]
    gpu_id: str | None
    skipped: dict[str, int]  # status -> rows not usable (oom, error, unsupported)
    power: pd.DataFrame | None = None  # op columns + measured_s + avg_power_w (power suite)


def load_dataset(path: str | Path, *, expect_gpu: str | None = None) -> Dataset:
    """Read and validate one dataset folder."""
    path = Path(path)
    if not path.is_dir():
        raise DatasetError(f"dataset folder {path} does not exist")
    meta_path = path / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise DatasetError(
            f"dataset {path} has no meta.json (was it written by the runner?)"
        ) from None
    except json.JSONDecodeError as exc:
        raise DatasetError(f"dataset {path}: meta.json is corrupt: {exc}") from None
    env = environment(meta)
    gpu_name = str(env.get("gpu_name", ""))
    gpu_id = gpu_id_from_name(gpu_name)
    if expect_gpu is not None and gpu_id is not None and gpu_id != expect_gpu:
        raise DatasetError(
            f"dataset {path} was measured on {gpu_name!r} ({gpu_id}), not {expect_gpu}"
        )
    csvs = sorted(p for p in path.glob("*.csv") if p.stem not in NON_OP_SUITES)
    if not csvs:
        raise DatasetError(f"dataset {path} has no suite CSV files")
    frames = []
    for csv in csvs:
        try:
            raw = pd.read_csv(csv, dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise DatasetError(
                f"dataset file {csv} is corrupt: {str(exc).splitlines()[0]}"
            ) from None
        missing = [c for c in ("op", "measured_ms", "status") if c not in raw.columns]
        if missing:
            raise DatasetError(f"dataset file {csv} lacks column(s) {', '.join(missing)}")
        raw["source_file"] = csv.name
        frames.append(raw)
    raw = pd.concat(frames, ignore_index=True)
    skipped = raw.loc[raw["status"] != "ok", "status"].value_counts().to_dict()
    raw = raw[raw["status"] == "ok"].reset_index(drop=True)
    if raw.empty:
        raise DatasetError(f"dataset {path} has no rows with status ok")
    measured_ms = pd.to_numeric(raw["measured_ms"], errors="coerce").to_numpy()
    bad = ~(np.isfinite(measured_ms) & (measured_ms > 0))
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise DatasetError(
            f"dataset file {raw['source_file'][j]}: measured_ms must be a positive number, "
            f"got {raw['measured_ms'][j]!r}"
        )
    try:
        ops = normalise_frame(raw[[c for c in OP_COLUMNS if c in raw.columns]])
    except OpError as exc:
        raise DatasetError(f"dataset {path}: {exc}") from None
    for col in ("suite", "family", "pattern"):
        ops[col] = raw[col].to_numpy() if col in raw.columns else ""
    ops["measured_s"] = measured_ms / 1e3
    ops["group"] = split_groups(ops)
    ops["stratum"] = strata(ops)
    return Dataset(
        path=path, frame=ops, meta=meta, gpu_id=gpu_id, skipped=skipped, power=_power(path)
    )


def _power(path: Path) -> pd.DataFrame | None:
    """NVML power samples of the power suite, if the dataset has them."""
    csv = path / "power.csv"
    if not csv.exists():
        return None
    try:
        raw = pd.read_csv(csv, dtype=str, keep_default_na=False)
        raw = raw[raw["status"] == "ok"].reset_index(drop=True)
        ops = normalise_frame(raw[[c for c in OP_COLUMNS if c in raw.columns]])
        ops["measured_s"] = pd.to_numeric(raw["measured_ms"]).to_numpy() / 1e3
        ops["avg_power_w"] = pd.to_numeric(raw["avg_power_w"]).to_numpy()
    except (KeyError, ValueError, pd.errors.ParserError) as exc:
        raise DatasetError(f"dataset file {csv} is corrupt: {str(exc).splitlines()[0]}") from None
    ok = np.isfinite(ops["measured_s"]) & np.isfinite(ops["avg_power_w"]) & (ops["avg_power_w"] > 0)
    return ops[ok].reset_index(drop=True) if ok.any() else None


def split_groups(frame: pd.DataFrame) -> np.ndarray:
    """The unit the held-out split moves as a whole (see module docstring)."""
    op = frame["op"].to_numpy(dtype=str)
    family = frame["family"].astype(str).to_numpy()
    groups = np.array([f.split("/")[0] if "/" in f else f for f in family], dtype=object)
    gemm = op == "gemm"
    classes = op_class(op, frame["dtype"].to_numpy(dtype=str))
    groups[gemm] = classes[gemm] + ":" + groups[gemm]
    attn = np.char.startswith(op, "attn_") & ~np.char.startswith(op, "attn_blocksparse")
    groups[attn] = family[attn]
    sparse = np.char.startswith(op, "attn_blocksparse")
    groups[sparse] = family[sparse]
    by_decade = ~(op == "gemm") & ~attn & ~sparse
    by_bytes = frame["op"].isin(["copy", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                 "send_recv"])  # fmt: skip
    size = np.where(
        by_bytes, frame["bytes"], np.where(op == "adamw", frame["n"], frame["m"] * frame["n"])
    )
    decade = np.floor(np.log10(np.nan_to_num(size.astype(float), nan=1.0) + 1.0)).astype(int)
    ranks = frame["ranks"].fillna(1).astype(int).to_numpy()
    for i in np.flatnonzero(by_decade):
        groups[i] = f"{op[i]}/r{ranks[i]}/1e{decade[i]}"
    return groups.astype(str)


def strata(frame: pd.DataFrame) -> np.ndarray:
    """Where a quarter of the groups is held out: per suite, and per dtype class for GEMMs
    (so fp32 and fp8 get held-out families of their own, not just what bf16 leaves them)."""
    suite = frame["suite"].astype(str).to_numpy().astype(object)
    gemm = frame["op"].to_numpy(dtype=str) == "gemm"
    classes = op_class(frame["op"].to_numpy(dtype=str), frame["dtype"].to_numpy(dtype=str))
    suite[gemm] = "gemm:" + classes[gemm].astype(str)
    return suite.astype(str)


def held_out(
    groups: np.ndarray, suites: np.ndarray, fraction: float = 0.25, salt: str = "simcli"
) -> np.ndarray:
    """Per stratum (suite), a quarter of its groups (at least one, if it has two), chosen
    by a stable hash of the group name, go to the held-out side."""
    out = np.zeros(len(groups), dtype=bool)
    for suite in np.unique(suites):
        in_suite = suites == suite
        uniq = sorted(set(groups[in_suite]), key=lambda g: zlib.crc32(f"{salt}:{g}".encode()))
        if len(uniq) < 2:
            continue
        chosen = set(uniq[: max(1, round(fraction * len(uniq)))])
        out |= in_suite & np.isin(groups, list(chosen))
    return out
