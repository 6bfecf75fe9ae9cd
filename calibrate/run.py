"""Run GPU microbenchmarks and write calibration datasets.

    python3 -m calibrate.run --suite all --out DIR [--quick | --tiny] [--shard i/n]
                             [--time-budget-s S] [--device auto|cuda|cpu]
    python3 -m calibrate.run --suite collectives --ranks 2,4 --out DIR
    python3 -m calibrate.run --merge SHARD_DIR... --out DIR     # join --shard outputs
    python3 -m calibrate.run --summary DIR                      # headline numbers

One CSV per suite (``DIR/<suite>.csv``, or ``<suite>.shard<i>of<n>.csv``) in the
``simcli predict`` op columns plus measured_ms, suite, family, pattern, status,
error, avg_power_w, energy_j; ``meta.json`` beside it, with what the device reports
about itself under ``device`` (so ``simcli calibrate fit`` can derive a spec for a GPU
it does not know). Rows are flushed one by one
and a re-run skips rows already present, so an interrupted run resumes.

Runs on the device machine, where this project is not installed: imports only the
standard library and torch/triton/numpy (rich and pynvml if present).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from calibrate.bench import SINGLE_GPU_SUITES, SUITES
from calibrate.bench import common as C

# Share of the time budget per suite; what a suite leaves unused rolls over.
WEIGHTS = {
    "gemm": 0.22,
    "attention": 0.38,
    "decode": 0.07,
    "blocksparse": 0.15,
    "elementwise": 0.08,
    "power": 0.10,
    "collectives": 1.0,
    "sparse_gemm": 0.15,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python3 -m calibrate.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--suite",
        default="all",
        help=f"'all' (= {','.join(SINGLE_GPU_SUITES)}) or a comma list of {', '.join(SUITES)}",
    )
    ap.add_argument("--out", help="output folder (created)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="reduced shape sets")
    size.add_argument("--tiny", action="store_true", help="tiny shapes, for CPU smoke tests")
    ap.add_argument("--shard", help="i/n: run the i-th of n slices of each suite's cases")
    ap.add_argument("--limit", type=int, help="at most N cases per suite (evenly spaced)")
    ap.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="stop starting new cases after this many seconds (CSV stays complete)",
    )
    ap.add_argument("--device", default="auto", help="auto | cuda | cpu")
    ap.add_argument("--timer", default="events", choices=("events", "triton"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--ranks",
        default="",
        help="collectives: GPU counts, e.g. 2,4 (default: 2, 4, 8 up to the visible GPUs)",
    )
    ap.add_argument("--device-kind", default="", help="label stored in meta.json")
    ap.add_argument("--list", action="store_true", help="print the planned cases; run nothing")
    ap.add_argument("--merge", nargs="+", metavar="DIR", help="merge shard CSVs into --out")
    ap.add_argument("--summary", metavar="DIR", help="print headline numbers of a dataset")
    ap.add_argument(
        "--ops",
        metavar="CSV",
        help="measure these op-CSV rows (gemm, attn_fwd, attn_fwdbwd, attn_decode, elementwise "
        "ops) instead of the built-in suites; an optional 'family' column labels them",
    )
    args = ap.parse_args(argv)
    if not (args.merge or args.summary) and not args.out:
        ap.error("--out is required")
    return args


def suite_names(text: str) -> list[str]:
    if text == "all":
        return list(SINGLE_GPU_SUITES)
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SUITES]
    if bad:
        raise SystemExit(f"unknown suite(s) {', '.join(bad)}; allowed: all, {', '.join(SUITES)}")
    return names


def load_suite(name: str):
    return importlib.import_module(f"calibrate.bench.{name}")


def _meta_path(out: Path, shard: tuple[int, int]) -> Path:
    i, n = shard
    return out / ("meta.json" if n == 1 else f"meta.shard{i}of{n}.json")


# op -> the suite whose `run` measures it
_SUITE_OF_OP = {
    "gemm": "gemm",
    "attn_fwd": "attention",
    "attn_fwdbwd": "attention",
    "attn_decode": "decode",
    **{
        op: "elementwise"
        for op in ("copy", "rmsnorm", "swiglu", "rope", "softmax", "cross_entropy", "adamw")
    },
}
# every size column of the op CSV (all but the text, bool and fraction ones)
_INT_FIELDS = tuple(
    c for c in C.OP_COLUMNS if c not in ("op", "dtype", "causal", "backend", "density")
)


def ops_file_cases(path: Path) -> dict[str, list[C.Case]]:
    """Cases from an op CSV, grouped by the suite that measures them."""
    import csv

    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise SystemExit(f"--ops: cannot read {path}: {exc.strerror or exc}") from None
    out: dict[str, list[C.Case]] = {}
    for i, raw in enumerate(rows, start=1):
        op = (raw.get("op") or "").strip()
        if op not in _SUITE_OF_OP:
            raise SystemExit(
                f"--ops {path} row {i}: op {op!r} cannot be measured from a file; "
                f"allowed: {', '.join(sorted(_SUITE_OF_OP))}"
            )
        row: dict[str, Any] = {"op": op, "dtype": (raw.get("dtype") or "bf16").strip()}
        for f in _INT_FIELDS:
            text = (raw.get(f) or "").strip()
            row[f] = int(float(text)) if text else None
        row["causal"] = (raw.get("causal") or "").strip().lower() in ("1", "true", "yes")
        row["backend"] = (raw.get("backend") or "").strip() or (
            "flash" if op.startswith("attn") else None
        )
        if op == "attn_decode" and not row["seq_q"]:
            row["seq_q"] = 1
        row["family"] = (raw.get("family") or "").strip() or "ops-file"
        out.setdefault(_SUITE_OF_OP[op], []).append(C.Case(row=row))
    return out


# torch.cuda.get_device_properties attribute -> meta.json key (those the build has)
_CUDA_PROPS = {
    "L2_cache_size": "l2_bytes",
    "shared_memory_per_multiprocessor": "shared_memory_per_sm_bytes",
    "memory_bus_width": "memory_bus_width_bits",
    "memory_clock_rate": "memory_clock_khz",
    "clock_rate": "sm_clock_khz",
    "max_threads_per_multi_processor": "max_threads_per_sm",
    "warp_size": "warp_size",
}


def device_properties(ctx: C.Context) -> dict[str, Any]:
    """What the device says about itself: CUDA properties and NVML limits (each only when
    available). ``calibrate fit`` builds a spec from it for a GPU simcli does not know;
    peak FLOP/s are not among them (it derives those from the GEMMs measured)."""
    if not ctx.is_cuda:
        return {"type": "cpu"}
    import torch

    props = torch.cuda.get_device_properties(0)
    out: dict[str, Any] = {
        "type": "cuda",
        "vendor": "amd" if getattr(torch.version, "hip", None) else "nvidia",
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": int(props.multi_processor_count),
        "memory_bytes": int(props.total_memory),
    }
    for attr, key in _CUDA_PROPS.items():
        value = getattr(props, attr, None)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            out[key] = value
    nv, h = C._nvml_handle()
    if nv is None or h is None:
        return out
    readers = {
        "power_default_limit_w": lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1e3,
        "power_max_limit_w": lambda: nv.nvmlDeviceGetPowerManagementLimitConstraints(h)[1] / 1e3,
        "max_sm_clock_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "max_memory_clock_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        "nvml_memory_bus_width_bits": lambda: nv.nvmlDeviceGetMemoryBusWidth(h),
        "pcie_max_generation": lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "pcie_max_width": lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h),
    }
    for key, read in readers.items():
        try:
            out[key] = read()
        except Exception:  # NVML builds differ in what they expose; absent is fine
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out))
    if args.summary:
        from calibrate.bench.summary import summarize

        print(summarize(Path(args.summary)))
        return 0

    # SDPA explains every backend it rejects with a UserWarning; the rows say it once.
    warnings.filterwarnings("ignore", category=UserWarning)
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    names = suite_names(args.suite)
    from_file = ops_file_cases(Path(args.ops)) if args.ops else None
    if from_file is not None:
        names = list(from_file)
    shard = C.parse_shard(args.shard)
    out = Path(args.out)
    t_start = time.monotonic()
    budget = args.time_budget_s if args.time_budget_s is not None else float("inf")
    hard_deadline = t_start + budget

    ctx = C.make_context(mode, args.device, args.timer, args.seed)
    plans: dict[str, list[C.Case]] = {}
    for name in names:
        if name == "collectives":
            continue
        cases = from_file[name] if from_file is not None else load_suite(name).cases(ctx)
        plans[name] = C.select(cases, shard, args.limit)
    if args.list:
        for name, cs in plans.items():
            print(f"{name}: {len(cs)} cases")
            for c in cs[:5]:
                print("   ", {k: v for k, v in c.row.items() if v is not None})
        return 0

    out.mkdir(parents=True, exist_ok=True)
    meta_path = _meta_path(out, shard)
    meta: dict[str, Any] = {}
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError:
            meta = {}
    meta["environment"] = C.environment(ctx, args.device_kind)
    meta["device"] = device_properties(ctx)
    meta.setdefault("runs", [])
    meta["columns"] = list(C.COLUMNS)
    C.write_json_atomic(meta_path, meta)
    print(
        f"device={ctx.device} gpu={ctx.gpu_name or '-'} mode={mode} shard={shard[0]}/{shard[1]} "
        f"torch={meta['environment'].get('torch')} out={out}",
        flush=True,
    )

    exit_code = 0
    remaining = list(names)
    for name in names:
        now = time.monotonic()
        left = hard_deadline - now
        wsum = sum(WEIGHTS[s] for s in remaining)
        deadline = now + left * WEIGHTS[name] / wsum if left != float("inf") else float("inf")
        remaining.remove(name)
        record: dict[str, Any] = {
            "suite": name,
            "mode": mode,
            "shard": f"{shard[0]}/{shard[1]}",
            "clocks_before": C.clocks_snapshot(ctx),
            "budget_s": None if left == float("inf") else round(deadline - now, 1),
        }
        if left <= 0:
            record["skipped"] = "time budget spent"
            meta["runs"].append(record)
            continue
        try:
            if name == "collectives":
                record.update(run_collectives(args, ctx, out, mode, deadline))
            else:
                mod = load_suite(name)
                sink = C.CsvSink(out / C.out_name(name, shard))
                try:
                    res = C.run_cases(
                        name,
                        plans[name],
                        mod.run,
                        ctx,
                        sink,
                        deadline,
                        before_group=getattr(mod, "before_group", None),
                    )
                finally:
                    sink.close()
                record.update(
                    planned=res.planned,
                    already_done=res.skipped_done,
                    counts=res.counts,
                    not_run=res.not_run,
                    stopped_early=res.stopped_early,
                    elapsed_s=round(res.elapsed_s, 1),
                )
                print(
                    f"[{name}] done: {res.counts} skipped(done)={res.skipped_done} "
                    f"not_run={res.not_run} in {res.elapsed_s:.0f}s",
                    flush=True,
                )
        except C.FatalDeviceError as exc:
            record["fatal"] = str(exc)
            print(f"[{name}] FATAL device error, stopping: {exc}", flush=True)
            exit_code = 3
        record["clocks_after"] = C.clocks_snapshot(ctx)
        meta["runs"].append(record)
        C.write_json_atomic(meta_path, meta)
        if exit_code:
            break
        C.cleanup(ctx)
    C.write_json_atomic(meta_path, meta)
    return exit_code


def run_collectives(args, ctx: C.Context, out: Path, mode: str, deadline: float) -> dict:
    from calibrate.bench import collectives

    if args.ranks:
        ranks = [int(x) for x in args.ranks.split(",") if x.strip()]
    elif ctx.is_cuda:
        import torch

        n = torch.cuda.device_count()
        ranks = [r for r in (2, 4, 8) if r <= n] or [1]
    else:
        ranks = [2]
    if ctx.is_cuda:
        import torch

        have = torch.cuda.device_count()
        if any(r > have for r in ranks):
            raise SystemExit(f"--ranks {args.ranks}: only {have} GPU(s) visible")
    rcs = {}
    for r in ranks:
        left = deadline - time.monotonic()
        deadline_unix = 0.0 if left == float("inf") else time.time() + left
        rcs[r] = collectives.launch(r, out, mode, deadline_unix)
    return {"ranks": ranks, "exit_codes": rcs}


def merge(srcs: list[str], out: Path) -> int:
    """Concatenate ``<suite>*.csv`` from shard folders into ``out/<suite>.csv`` (rows
    deduplicated by key) and gather the meta files into ``out/meta.json``."""
    import csv

    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[tuple[str, ...], dict[str, str]]] = {}
    metas: dict[str, Any] = {}
    for src in srcs:
        for p in sorted(Path(src).glob("*.csv")):
            suite = p.name.split(".")[0]
            bucket = rows.setdefault(suite, {})
            for r in C.read_rows(p):
                bucket.setdefault(C.row_key(r), r)
        for p in sorted(Path(src).glob("*.json")):
            metas[f"{Path(src).name}/{p.name}"] = json.loads(p.read_text())
    for suite, bucket in rows.items():
        path = out / f"{suite}.csv"
        tmp = path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(C.COLUMNS), extrasaction="ignore")
            w.writeheader()
            for r in bucket.values():
                w.writerow(r)
        os.replace(tmp, path)
        print(f"{path}: {len(bucket)} rows")
    C.write_json_atomic(out / "meta.json", {"merged_from": metas})
    return 0


if __name__ == "__main__":
    sys.exit(main())
