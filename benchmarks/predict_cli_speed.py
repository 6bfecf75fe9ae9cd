"""``simcli predict`` end to end on a large ops CSV: wall time and peak RSS of the command.

Run: python benchmarks/predict_cli_speed.py [--rows 1000000] [--mix gemm|mixed]
     [--gpu h100-sxm] [--repeat 3]

Writes an ops CSV with the contract's header (unused columns empty), then runs
``simcli predict --gpu GPU --input ops.csv --output pred.csv --format json`` in a fresh
process ``--repeat`` times and prints the best and median wall time and the peak RSS
(``os.wait4``'s ``ru_maxrss`` of that process alone), after one warm-up run that fills a
temporary bytecode cache (as ``benchmarks/cli_startup.py`` does). ``--mix gemm``: GEMMs only (see
:func:`gemm_ops`), dtypes bf16/fp16/fp8/fp32 (issue 18: 1M rows in <= 2 s and
<= 500 MB); ``--mix mixed``: the op mix of ``benchmarks/predict_speed.py``. Where the time
goes inside the process: ``python -m cProfile -s cumtime -m simcli.cli predict ...``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from predict_speed import mixed_ops  # noqa: E402

from workloads.ops import CSV_COLUMNS  # noqa: E402


def gemm_ops(rows: int, seed: int = 0) -> pd.DataFrame:
    """m, n, k log-uniform in [1, 65536]; half the rows rounded up to multiples of 64 (the
    aligned shapes of real models, priced by the profile's aligned-kernel correction)."""
    rng = np.random.default_rng(seed)
    dims = np.round(np.exp(rng.uniform(0, np.log(65536), (3, rows)))).astype(np.int64)
    model_like = rng.random(rows) < 0.5
    dims[:, model_like] = -(-dims[:, model_like] // 64) * 64
    frame = pd.DataFrame({c: "" for c in CSV_COLUMNS}, index=range(rows))
    frame["op"] = "gemm"
    frame["dtype"] = rng.choice(["bf16", "fp16", "fp8", "fp32"], rows, p=[0.6, 0.2, 0.1, 0.1])
    frame["m"], frame["n"], frame["k"] = dims
    return frame


def _csv(mix: str, rows: int, folder: Path) -> Path:
    path = folder / f"ops_{mix}_{rows}.csv"
    frame = gemm_ops(rows) if mix == "gemm" else mixed_ops(rows)
    if mix == "mixed":  # as a user's CSV: integers without ".0", NaN as empty
        frame = frame[list(CSV_COLUMNS)].astype(object)
        for col in frame.columns:
            values = frame[col]
            if col in ("op", "dtype", "backend", "causal"):
                continue
            numeric = pd.to_numeric(values)
            whole = numeric.dropna()
            if (whole == np.round(whole)).all():
                frame[col] = numeric.astype("Int64")
    frame.to_csv(path, index=False)
    return path


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv)} failed:\n{err.decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024  # KiB -> MiB (Linux)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--mix", choices=("gemm", "mixed"), default="gemm")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:
        _csv(args.mix, args.rows, args.write)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        # written by a child process: this one stays small, and the peak RSS of the runs
        # below (ru_maxrss counts what a forked child inherits) is theirs alone
        ops = folder / f"ops_{args.mix}_{args.rows}.csv"
        write = [sys.executable, __file__, "--write", str(folder), "--mix", args.mix]
        subprocess.run([*write, "--rows", str(args.rows)], check=True)
        size_mb = ops.stat().st_size / 1e6
        print(f"{args.rows:,} {args.mix} rows, {size_mb:.0f} MB CSV "
              f"(written in {time.perf_counter() - t0:.1f} s)")  # fmt: skip
        out = folder / "pred.csv"
        entry = [sys.executable, "-c", "from simcli.cli import main; main()"]
        argv = [*entry, "predict", "--gpu", args.gpu, "--input", str(ops), "--output", str(out)]
        env = dict(os.environ)  # bytecode cached, as an installed package's (cli_startup.py)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
        _run([*argv, "--format", "json"], env)  # warm-up: fills the bytecode cache
        runs = [_run([*argv, "--format", "json"], env) for _ in range(args.repeat)]
        walls = sorted(w for w, _ in runs)
        print(
            f"simcli predict --gpu {args.gpu} --input ops.csv --output pred.csv: "
            f"best {walls[0]:.2f} s, median {statistics.median(walls):.2f} s "
            f"({args.rows / walls[0] / 1e3:,.0f}k rows/s), "
            f"peak RSS {max(r for _, r in runs):.0f} MiB (of {args.repeat} runs)"
        )


if __name__ == "__main__":
    main()
