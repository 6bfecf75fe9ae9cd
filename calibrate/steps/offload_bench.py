"""Host offload truth on one GPU machine: what CPU offload of optimizer states and
activations costs there (torch only; no pydantic: it runs on the device machine).

    python3 -m calibrate.steps.offload_bench --out DIR [--device-kind KIND]

Writes ``DIR/offload.csv`` (one row per measurement: ``what, size_bytes, threads,
seconds, bytes_per_s``) and ``DIR/meta.json``:

* ``h2d`` / ``d2h``: pinned host <-> device copies of 64 MiB to 1 GiB (the host link of
  activation offload and of ZeRO-Offload's gradient / weight copies);
* ``adamw_cpu``: one ``torch.optim.AdamW`` step on fp32 CPU tensors (fused where this
  torch has a CPU kernel, else foreach) at 1-16 threads, ``bytes_per_s`` counted as
  :data:`costmodels.steps.training.CPU_ADAM_BYTES_PER_PARAM` bytes per parameter;
* ``overlap``: a bf16 GEMM chain alone (``gemm``), a D2H copy stream alone (``copy``) and
  both at once (``both``): whether a copy on its own stream hides behind compute, as
  activation offload (TE's cpu_offload) assumes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time
from pathlib import Path

import torch

CPU_ADAM_BYTES_PER_PARAM = 30.0  # same accounting as costmodels.steps.training
MIB = 1 << 20


def _sync() -> None:
    torch.cuda.synchronize()


def _timed(fn, repeat: int = 5) -> float:
    fn()
    _sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copies(rows: list[dict]) -> None:
    for size in (64 * MIB, 256 * MIB, 1024 * MIB):
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(size, dtype=torch.uint8, device="cuda")
        for what, fn in (
            ("h2d", lambda h=host, d=dev: d.copy_(h, non_blocking=True)),
            ("d2h", lambda h=host, d=dev: h.copy_(d, non_blocking=True)),
        ):
            s = _timed(fn)
            rows.append({"what": what, "size_bytes": size, "threads": 0, "seconds": s,
                         "bytes_per_s": size / s})  # fmt: skip
        del host, dev


def adamw(rows: list[dict], sizes: list[int], threads: list[int]) -> None:
    for n in sizes:
        p = torch.zeros(n, dtype=torch.float32)
        p.grad = torch.full((n,), 1e-3, dtype=torch.float32)
        kind = "fused"
        try:
            opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
            opt.step()
        except (RuntimeError, TypeError, ValueError):
            kind = "foreach"
            opt = torch.optim.AdamW([p], lr=1e-4, foreach=True)
            opt.step()
        for t in threads:
            torch.set_num_threads(t)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                opt.step()
                times.append(time.perf_counter() - t0)
            s = statistics.median(times)
            rate = n * CPU_ADAM_BYTES_PER_PARAM / s
            rows.append({"what": f"adamw_cpu_{kind}", "size_bytes": n * 4, "threads": t,
                         "seconds": s, "bytes_per_s": rate})  # fmt: skip
        del opt, p
    torch.set_num_threads(max(threads))


def overlap(rows: list[dict]) -> None:
    """A GEMM chain on the default stream and a D2H copy on a side stream, alone and
    together (sized so each alone takes ~0.2-0.5 s)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    size = 1024 * MIB
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()

    def gemm() -> None:
        for _ in range(200):
            torch.mm(a, b)

    def copy() -> None:
        with torch.cuda.stream(side):
            for _ in range(8):
                host.copy_(dev, non_blocking=True)

    def both() -> None:
        copy()
        gemm()

    for what, fn, nbytes in (("gemm", gemm, 0), ("copy", copy, 8 * size), ("both", both, 8 * size)):
        s = _timed(fn, repeat=3)
        rows.append({"what": f"overlap_{what}", "size_bytes": nbytes, "threads": 0,
                     "seconds": s, "bytes_per_s": nbytes / s if nbytes else 0.0})  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device-kind", default="")
    ap.add_argument("--adam-sizes", default="100000000,400000000")
    ap.add_argument("--threads", default="1,4,8,16")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    copies(rows)
    overlap(rows)
    adamw(rows, [int(x) for x in args.adam_sizes.split(",")],
          [int(x) for x in args.threads.split(",")])  # fmt: skip
    with open(args.out / "offload.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    meta = {
        "device_kind": args.device_kind,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "cpu_model": next(
            (ln.split(":", 1)[1].strip() for ln in cpuinfo if "model name" in ln), ""
        ),
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
