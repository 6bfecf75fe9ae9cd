"""NCCL collectives, one process per GPU.

Run by ``python3 -m calibrate.run --suite collectives --ranks 2,4 --out DIR``, which
starts ``torchrun --standalone --nproc_per_node N -m calibrate.bench.collectives``
for each N. NVLink multicast (NVLS) stays off: multicast can put shared GPUs out of
service, so NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 are forced here and in the launcher.

``bytes`` follows nccl-tests' "size": all_reduce the buffer; all_gather the full
output each rank ends with; reduce_scatter the full input each rank starts with;
all_to_all each rank's whole send buffer; send_recv the message each rank sends to
the next rank of a ring (and receives from the previous one, as nccl-tests'
sendrecv). Timing as nccl-tests: after warm-up and a barrier, each rank times a loop
of iterations with CUDA events; the per-iteration mean of the slowest rank is
``measured_ms``. Rank 0 writes the rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import CsvSink, KiB, MiB, classify, row_key, write_json_atomic

NAME = "collectives"
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
# nccl-tests bus-bandwidth factors (busbw = algbw * factor)
BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}

os.environ.update(SAFE_ENV)


def sizes(mode: str) -> list[int]:
    if mode == "tiny":
        return [1 * KiB, 64 * KiB]
    if mode == "quick":
        return [KiB * 4**i for i in range(11)]  # 1 KiB .. 1 GiB, x4
    return [KiB * 2**i for i in range(21)]  # 1 KiB .. 1 GiB, x2


def _row(op: str, nbytes: int, world: int, is_cuda: bool = True) -> dict[str, Any]:
    family = f"nccl/{world}gpu" if is_cuda else f"gloo/{world}proc"
    return {
        "op": op,
        "dtype": "bf16",
        "bytes": nbytes,
        "ranks": world,
        "nodes": 1,
        "suite": NAME,
        "family": family,
    }


def _make_op(torch, dist, op: str, nbytes: int, world: int, rank: int, dev):
    elems = nbytes // 2
    bf = torch.bfloat16
    if op == "all_reduce":
        buf = torch.randn(elems, device=dev, dtype=bf)
        return lambda: dist.all_reduce(buf)
    if op == "all_gather":
        out = torch.empty(elems, device=dev, dtype=bf)
        inp = torch.randn(elems // world, device=dev, dtype=bf)
        return lambda: dist.all_gather_into_tensor(out, inp)
    if op == "reduce_scatter":
        inp = torch.randn(elems, device=dev, dtype=bf)
        out = torch.empty(elems // world, device=dev, dtype=bf)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if op == "all_to_all":
        inp = torch.randn(elems, device=dev, dtype=bf)
        out = torch.empty_like(inp)
        return lambda: dist.all_to_all_single(out, inp)
    if op == "send_recv":
        sbuf = torch.randn(elems, device=dev, dtype=bf)
        rbuf = torch.empty_like(sbuf)
        nxt, prv = (rank + 1) % world, (rank - 1) % world

        def sr():
            ops = [dist.P2POp(dist.isend, sbuf, nxt), dist.P2POp(dist.irecv, rbuf, prv)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        return sr
    raise ValueError(op)


def _time_op(torch, dist, fn, dev, target_ms: float, is_cuda: bool) -> float:
    def sync():
        if is_cuda:
            torch.cuda.synchronize()

    for _ in range(3):
        fn()
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    sync()
    est = (time.perf_counter() - t0) / 3 * 1e3
    n = torch.tensor([max(5, min(200, int(target_ms / max(est, 1e-3))))], device=dev)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)  # every rank runs the same count
    iters = int(n.item())
    for _ in range(2):
        fn()
    sync()
    dist.barrier()
    # median of several timed loops: one loop disturbed by the host or another tenant
    # would otherwise become the measurement
    loops, per = 5, max(1, iters // 5)
    samples = []
    for _ in range(loops):
        if is_cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(per):
                fn()
            e.record()
            torch.cuda.synchronize()
            samples.append(s.elapsed_time(e) / per)
        else:
            t0 = time.perf_counter()
            for _ in range(per):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / per)
    ms = statistics.median(samples)
    t = torch.tensor([ms], device=dev, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def worker(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="calibrate.bench.collectives")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="full", choices=("full", "quick", "tiny"))
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--target-ms", type=float, default=60.0)
    ap.add_argument("--csv-name", default="collectives.csv")
    ap.add_argument("--deadline-unix", type=float, default=0.0)
    args = ap.parse_args(argv)

    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)
    is_cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if is_cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    out = Path(args.out)
    path = out / args.csv_name
    sink = CsvSink(path) if rank == 0 else None
    done: set[tuple[str, ...]] = set()
    if path.exists():  # every rank skips the same rows
        from .common import KEY_COLUMNS, read_rows

        done = {tuple(r.get(c) or "" for c in KEY_COLUMNS) for r in read_rows(path)}
    counts: dict[str, int] = {}
    summary = []
    stopped = False
    for op in args.ops.split(","):
        for nbytes in sizes(args.mode):
            row = _row(op, nbytes, world, is_cuda)
            if row_key(row) in done:
                continue
            if args.deadline_unix and time.time() > args.deadline_unix:
                stopped = True
                break
            try:
                fn = _make_op(torch, dist, op, nbytes, world, rank, dev)
                ms = _time_op(
                    torch, dist, fn, dev, args.target_ms if args.mode != "tiny" else 2, is_cuda
                )
                row.update(measured_ms=ms, status="ok")
                algbw = nbytes / (ms * 1e-3) / 1e9
                summary.append((op, nbytes, ms, algbw, algbw * BUSBW[op](world)))
            except Exception as exc:  # recorded; a failure on one rank may hang the rest
                row["status"], row["error"] = classify(exc)
            if sink is not None:
                sink.write(row)
            counts[row["status"]] = counts.get(row["status"], 0) + 1
            if is_cuda:
                torch.cuda.empty_cache()
        if stopped:
            break
    if rank == 0:
        print(
            f"[collectives] ranks={world} {counts}" + (" (time budget spent)" if stopped else ""),
            flush=True,
        )
        for op, nb, ms, alg, bus in summary:
            if nb >= 256 * MiB or nb in (KiB, 1 * MiB):
                print(
                    f"  {op:15s} {nb:>11d} B  {ms:9.3f} ms  algbw {alg:7.1f} GB/s  "
                    f"busbw {bus:7.1f} GB/s",
                    flush=True,
                )
        sink.close()
        meta_path = out / f"collectives.meta.{world}gpu.json"
        meta: dict[str, Any] = {
            "ranks": world,
            "counts": counts,
            "stopped_early": stopped,
            "backend": "nccl" if is_cuda else "gloo",
            "env": {k: os.environ.get(k) for k in SAFE_ENV},
        }
        if is_cuda:
            v = torch.cuda.nccl.version()
            meta["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            meta["gpus"] = [torch.cuda.get_device_name(i) for i in range(world)]
        meta["torch"] = torch.__version__
        meta["topology"] = _topo()
        write_json_atomic(meta_path, meta)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _topo() -> str:
    try:
        r = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20, check=False
        )
        return r.stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def launch(
    nproc: int, out: Path, mode: str, deadline_unix: float, extra: list[str] | None = None
) -> int:
    """Start ``nproc`` workers with torchrun; returns its exit code."""
    env = dict(os.environ)
    env.update(SAFE_ENV)
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "calibrate.bench.collectives",
        "--out",
        str(out),
        "--mode",
        mode,
        "--deadline-unix",
        f"{deadline_unix:.1f}",
    ]
    cmd += extra or []
    print("+ " + " ".join(cmd), flush=True)
    budget = max(30.0, deadline_unix - time.time() + 60) if deadline_unix else None
    try:
        return subprocess.run(cmd, env=env, check=False, timeout=budget).returncode
    except subprocess.TimeoutExpired:
        print(f"[collectives] ranks={nproc}: timed out", flush=True)
        return 124


if __name__ == "__main__":
    sys.exit(worker())
