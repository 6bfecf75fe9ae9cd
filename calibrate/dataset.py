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


def meta_parts(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The meta.json itself, then the per-shard ones a merged run keeps (``shards``, or
    ``merged_from`` as ``python -m calibrate.run --merge`` writes it)."""
    parts = [meta]
    for key in ("shards", "merged_from"):
        if isinstance(meta.get(key), dict):
            parts += [v for v in meta[key].values() if isinstance(v, dict)]
    return parts


def environment(meta: Any) -> dict[str, Any]:
    """The machine description of a meta.json; a merged shard run keeps one per shard."""
    if not isinstance(meta, dict):
        return {}
    for part in meta_parts(meta):
        if isinstance(part.get("environment"), dict):
            return part["environment"]
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
    if not (raw["status"] == "ok").any():
        raise DatasetError(f"dataset {path} has no rows with status ok{_why_none(raw)}")
    raw = raw[raw["status"] == "ok"].reset_index(drop=True)
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


def _why_none(raw: pd.DataFrame) -> str:
    """What the runner recorded instead of measurements, e.g. ': 12 unsupported (first:
    ...)', for the error line."""
    if raw.empty:
        return " (the suite CSVs hold no rows)"
    counts = raw["status"].value_counts()
    text = ", ".join(f"{n} {status}" for status, n in counts.items())
    errors = raw["error"] if "error" in raw.columns else pd.Series([], dtype=str)
    first = next((e for e in errors if e), "")
    return f": {text}" + (f" (first: {first[:120]})" if first else "")


def recorded_device(meta: Any) -> dict[str, Any]:
    """The device a dataset was measured on, from its meta.json: ``type`` (cuda | cpu |
    unknown), ``name``, ``sm_count`` and the other properties the runner recorded."""
    env = environment(meta)
    parts = meta_parts(meta) if isinstance(meta, dict) else []
    device = next((p["device"] for p in parts if isinstance(p.get("device"), dict)), None)
    out: dict[str, Any] = dict(device) if device else {}
    for key in ("sm_count", "compute_capability", "memory_bytes", "l2_bytes"):
        if key in env and key not in out:
            out[key] = env[key]
    if env.get("gpu_name") and "name" not in out:
        out["name"] = env["gpu_name"]
    if "type" not in out:
        dev = str(env.get("device", ""))
        out["type"] = (
            "cpu" if dev == "cpu" else "cuda" if dev.startswith("cuda") or out.get("name") else ""
        ) or "unknown"
    return out


def device_mismatch(ds: Dataset, gpu: Any) -> str | None:
    """One line when ``ds`` was measured on something other than ``gpu`` (a GpuSpec),
    None when it matches or the dataset does not say. A warning, not an error: a user may
    fit a new GPU's spec from a sibling's data on purpose, and should be told, not stopped."""
    dev = recorded_device(ds.meta)
    if dev["type"] == "cpu":
        return f"dataset {ds.path} was measured on the CPU, not on {gpu.id}"
    name = str(dev.get("name") or "")
    if not name:
        return None
    sms = dev.get("sm_count")
    if name.lower() == gpu.name.lower() and sms in (None, gpu.sm_count):
        return None  # a spec of this very device (derived from it, or named after it)
    known = gpu_id_from_name(name)
    if known is not None and known != gpu.id:
        return f"dataset {ds.path} was measured on {name!r} ({known}), not {gpu.id}"
    if known is None and isinstance(sms, int) and sms != gpu.sm_count:
        return (
            f"dataset {ds.path} was measured on {name!r} with {sms} SMs; "
            f"{gpu.id} has {gpu.sm_count}"
        )
    return None


def _power(path: Path) -> pd.DataFrame | None:
    """NVML power samples of the power suite, if the dataset has them."""
    csv = path / "power.csv"
    if not csv.exists():
        return None
    try:
        raw = pd.read_csv(csv, dtype=str, keep_default_na=False)
        raw = raw[raw["status"] == "ok"].reset_index(drop=True)
        ops = normalise_frame(raw[[c for c in OP_COLUMNS if c in raw.columns]])
        ops["measured_s"] = pd.to_numeric(raw["measured_ms"], errors="coerce").to_numpy() / 1e3
        ops["avg_power_w"] = pd.to_numeric(raw["avg_power_w"], errors="coerce").to_numpy()
        ops["pattern"] = raw["pattern"].to_numpy() if "pattern" in raw.columns else ""
    except (KeyError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise DatasetError(f"dataset file {csv} is corrupt: {str(exc).splitlines()[0]}") from None
    ok = (
        np.isfinite(ops["measured_s"])
        & (ops["measured_s"] > 0)
        & np.isfinite(ops["avg_power_w"])
        & (ops["avg_power_w"] > 0)
    )
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


# --------------------------------------------------------------------------- derived specs

_GIB, _MIB = 1024**3, 1024**2


def _architecture(dev: dict[str, Any]) -> tuple[str, str]:
    """(simcli architecture, why) from the vendor and CUDA compute capability."""
    if dev.get("vendor") == "amd" or "AMD" in str(dev.get("name", "")).upper():
        return "cdna3", "AMD device: the only AMD architecture simcli has defaults for"
    cc = str(dev.get("compute_capability") or "")
    try:
        major, minor = (int(x) for x in cc.split(".")[:2])
    except ValueError:
        raise DatasetError(f"the dataset records no usable compute capability ({cc!r})") from None
    if major >= 10:
        return "blackwell", f"compute capability {cc}"
    if major == 9:
        return "hopper", f"compute capability {cc}"
    if (major, minor) >= (8, 9):
        return "ada", f"compute capability {cc}"
    if major == 8:
        return "ampere", f"compute capability {cc}"
    return "ampere", f"compute capability {cc} predates Ampere; Ampere defaults stand in"


def _fastest(frame: pd.DataFrame, op: str, dtype: str | None) -> tuple[float, str] | None:
    """(best achieved rate, which row) of an op: FLOP/s for GEMMs, bytes/s for copies."""
    rows = frame[(frame["op"] == op) & ((frame["dtype"] == dtype) if dtype else True)]
    if rows.empty:
        return None
    if op == "gemm":
        work = 2.0 * rows["m"] * rows["n"] * rows["k"] * rows["batch"].fillna(1)
    else:
        work = 2.0 * rows["bytes"]  # a copy reads and writes its bytes
    rate = (work / rows["measured_s"]).to_numpy(dtype=float)
    if not np.isfinite(rate).any():
        return None
    i = int(np.nanargmax(rate))
    r = rows.iloc[i]
    shape = f"{int(r['m'])}x{int(r['n'])}x{int(r['k'])}" if op == "gemm" else f"{int(r['bytes'])} B"
    return float(rate[i]), shape


def derive_gpu_spec(gpu_id: str, datasets: list[Dataset]) -> tuple[Any, list[str]]:
    """A GpuSpec for a GPU simcli does not know, from what the runner recorded: the
    device's own properties (name, SMs, memory, L2, clocks, bus width, power limit) and,
    for what no device reports, the measurements. Peak FLOP/s per dtype = the fastest
    GEMM measured / the architecture's default tensor-core efficiency (so the defaults
    reproduce that GEMM and the fit refines from there). Returns (spec, notes); every
    number's ``sources`` entry says where it came from, ASSUMED where nothing did."""
    from costmodels.ops.params import arch_params
    from hardware_specs.schema import GpuSpec

    devices = [recorded_device(ds.meta) for ds in datasets]
    cuda = [d for d in devices if d["type"] == "cuda" and d.get("sm_count")]
    if not cuda:
        kinds = ", ".join(sorted({d["type"] for d in devices}))
        raise DatasetError(
            f"the data records no GPU properties to derive a spec from (measured on: {kinds})"
        )
    dev = cuda[0]
    where = f"dataset meta.json ({datasets[devices.index(dev)].path.name})"
    arch, arch_why = _architecture(dev)
    frame = pd.concat([ds.frame for ds in datasets], ignore_index=True)
    notes: list[str] = []
    sxm = "SXM" in str(dev.get("name", "")).upper()
    form_factor = "oam" if arch == "cdna3" else "sxm" if sxm else "pcie"
    sources: dict[str, str] = {
        "sm_count": f"device: torch.cuda.get_device_properties, {where}",
        "memory_gib": f"device: total_memory, {where}",
    }
    spec: dict[str, Any] = {
        "id": gpu_id,
        "name": str(dev.get("name") or gpu_id),
        "vendor": "amd" if arch == "cdna3" else "nvidia",
        "architecture": arch,
        "form_factor": form_factor,
        "sm_count": int(dev["sm_count"]),
        "memory_gib": float(dev.get("memory_bytes", 0)) / _GIB,
        "memory_type": "unknown (derived spec)",
        "sfu_ops_per_clk_per_sm": 16.0,
        "nvlink_gb_per_s": 0.0,
    }
    sources["sfu_ops_per_clk_per_sm"] = (
        "ASSUMED: CUDA C++ Programming Guide throughput table, 16 exp2/clk/SM for cc 5.x-9.0"
    )
    sources["nvlink_gb_per_s"] = "ASSUMED: 0, no GPU-to-GPU link measured"
    defaults = arch_params(arch).gemm.mma_efficiency
    peaks: dict[str, float] = {}
    for dtype in ("bf16", "fp16", "fp32", "tf32", "fp8", "int8", "fp64"):
        best = _fastest(frame, "gemm", dtype)
        if best is None:
            continue
        eff = float(defaults.get(dtype, defaults.get("bf16", 0.8)))
        peaks[dtype] = best[0] / eff / 1e12
        sources.setdefault(
            "peak_dense_tflops",
            f"DERIVED from measurements, not a datasheet: fastest GEMM per dtype / the "
            f"{arch} default tensor-core efficiency",
        )
        notes.append(
            f"peak {dtype} {peaks[dtype]:.1f} TFLOP/s derived: fastest GEMM {best[1]} ran at "
            f"{best[0] / 1e12:.1f} TFLOP/s / default efficiency {eff:g} (no datasheet figure)"
        )
    for a, b in (("bf16", "fp16"), ("fp16", "bf16")):
        if a in peaks and b not in peaks:
            peaks[b] = peaks[a]  # one tensor-core rate for both on every part simcli knows
    if not peaks.get("bf16"):
        raise DatasetError("the data has no bf16/fp16 GEMM measurements to derive peaks from")
    spec["peak_dense_tflops"] = peaks
    bw, why = _memory_bandwidth(dev, frame, arch)
    spec["memory_bandwidth_gb_per_s"], sources["memory_bandwidth_gb_per_s"] = bw, why
    for key, value, why in _scalar_props(dev, where):
        spec[key], sources[key] = value, why
    spec["sources"] = sources
    notes.insert(0, f"spec for {gpu_id!r} derived from the device ({spec['name']}, {arch_why})")
    return GpuSpec.model_validate(spec), notes


def _memory_bandwidth(dev: dict[str, Any], frame: pd.DataFrame, arch: str) -> tuple[float, str]:
    """Peak DRAM GB/s: bus width x memory clock x 2 (double data rate) when the device
    reports both, else the fastest copy measured / the default copy efficiency."""
    bits = dev.get("memory_bus_width_bits") or dev.get("nvml_memory_bus_width_bits")
    khz = dev.get("memory_clock_khz") or (dev.get("max_memory_clock_mhz") or 0) * 1e3
    if bits and khz:
        gb_per_s = 2.0 * float(khz) * 1e3 * float(bits) / 8.0 / 1e9
        return gb_per_s, f"device: {bits}-bit bus x {float(khz) / 1e3:g} MHz x 2 (DDR)"
    best = _fastest(frame, "copy", None)
    if best is None:
        raise DatasetError(
            "the data has neither the memory bus width and clock nor a copy measurement "
            "to derive the memory bandwidth from"
        )
    from costmodels.ops.params import arch_params

    eff = float(arch_params(arch).elementwise.memory_efficiency.get("copy", 0.9))
    return best[0] / eff / 1e9, (
        f"DERIVED from measurements: fastest copy ({best[1]}) / default copy efficiency {eff:g}"
    )


def _scalar_props(dev: dict[str, Any], where: str) -> list[tuple[str, float, str]]:
    """Clock, L2, shared memory, TDP, PCIe generation: from the device, else ASSUMED."""
    out: list[tuple[str, float, str]] = []

    def pick(key: str, candidates: list[tuple[Any, str]], fallback: float, why: str) -> None:
        for value, source in candidates:
            if isinstance(value, int | float) and value > 0:
                out.append((key, float(value), f"device: {source}, {where}"))
                return
        out.append((key, fallback, f"ASSUMED: {why}"))

    pick("boost_clock_mhz", [(dev.get("max_sm_clock_mhz"), "NVML max SM clock"),
                             ((dev.get("sm_clock_khz") or 0) / 1e3, "CUDA clock_rate")],
         1500.0, "1500 MHz, no clock reported (only softmax exp cost uses it)")  # fmt: skip
    pick("l2_cache_mib", [((dev.get("l2_bytes") or 0) / _MIB, "L2_cache_size")],
         4.0, "4 MiB, no L2 size reported")  # fmt: skip
    pick("smem_per_sm_kib", [((dev.get("shared_memory_per_sm_bytes") or 0) / 1024,
                              "shared_memory_per_multiprocessor")],
         100.0, "100 KiB, no shared memory size reported")  # fmt: skip
    pick("tdp_w", [(dev.get("power_default_limit_w"), "NVML default power limit"),
                   (dev.get("power_max_limit_w"), "NVML max power limit")],
         300.0, "300 W, no power limit reported (bounds the datasheet power estimate)")  # fmt: skip
    gen = dev.get("pcie_max_generation")
    gen = min(max(int(gen), 3), 6) if isinstance(gen, int | float) and gen > 0 else None
    pick("pcie_gen", [(gen, "NVML max PCIe link generation")], 4.0, "PCIe gen 4")
    return [(k, int(v) if k == "pcie_gen" else v, why) for k, v, why in out]
