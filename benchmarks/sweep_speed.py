"""Sweep throughput on the local executor, and the overhead per point.

    python benchmarks/sweep_speed.py [--workers 2] [--points 10000] [--train-points 400]

For a 10,000-point ``predict gemm`` sweep and a smaller ``train`` sweep it prints points/s
through ``simcli sweep`` (process pool, SQLite store) and the time of the same points
run directly in one process (``Target.run``: the command's library call, no pool, no
store). The overhead per
point is ``sweep wall x workers / points - direct time per point``: what the pool, IPC and
store add per point on one worker. Not a timed test.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from simcli.sweep.runner import run_sweep
from simcli.sweep.spec import expand, parse_spec
from simcli.sweep.store import open_store
from simcli.sweep.target import resolve


def gemm_spec(n_points: int) -> dict:
    side = max(1, round(n_points ** (1 / 3)))
    sizes = [128 * (i + 1) for i in range(side)]
    return {
        "command": "predict gemm",
        "fixed": {"gpu": "h100-sxm", "dtype": "bf16"},
        "grid": {"m": sizes, "n": sizes, "k": sizes},
    }


def train_spec(n_points: int) -> dict:
    mbs = [1, 2, 4, 8]
    seqs = [1024 * (i + 1) for i in range(max(1, n_points // (3 * 2 * 4 * 2 * len(mbs))))]
    return {
        "command": "train",
        "fixed": {"model": "llama3-8b", "gpus": 16, "global-batch": 64, "ignore-memory": True},
        "grid": {
            "gpu": ["h100-sxm", "a100-sxm-80gb"],
            "tp": [1, 2, 8],
            "pp": [1, 2],
            "micro-batch": mbs,
            "recompute": ["selective", "full"],
            "seq-len": seqs,
        },
    }


def bench(name: str, doc: dict, workers: int, direct_sample: int) -> None:
    spec = parse_spec(doc)
    points = expand(spec)
    target = resolve(spec.command)
    sample = points[:: max(1, len(points) // direct_sample)][:direct_sample]
    for p in sample[:3]:  # warm caches, as a long-lived worker has them
        target.run(p.params)
    start = time.perf_counter()
    for p in sample:
        target.run(p.params)
    direct_s = (time.perf_counter() - start) / len(sample)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "bench.sqlite", "sqlite", create=True)
        try:
            s = run_sweep(spec, points, store, workers=workers)
        finally:
            store.close()
    per_point = s.wall_s * workers / s.points_run
    print(
        f"{name:<13} {s.points_run:>6} points  {workers} workers  wall {s.wall_s:7.2f} s  "
        f"{s.points_per_s:8.1f} points/s  direct {direct_s * 1e3:7.3f} ms/point  "
        f"sweep {per_point * 1e3:7.3f} ms/point/worker  overhead "
        f"{(per_point - direct_s) * 1e3:+7.3f} ms/point ({per_point / direct_s - 1:+.0%})  "
        f"failed {s.points_failed}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--train-points", type=int, default=400)
    args = ap.parse_args()
    print(f"simcli sweep, local executor, {os.cpu_count()} CPUs")
    bench("predict gemm", gemm_spec(args.points), args.workers, 300)
    bench("train", train_spec(args.train_points), args.workers, 30)


if __name__ == "__main__":
    main()
