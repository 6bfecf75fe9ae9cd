"""CLI start-up time: wall seconds of whole ``simcli`` commands, each in a fresh process.

Run: python benchmarks/cli_startup.py [--repeat 7] [--commands "--help;specs list;..."]

Every command runs ``--repeat`` times in a subprocess through the installed ``simcli``
script beside this interpreter (else ``python -c "from simcli.cli import main; main()"``);
the median wall time is printed with the spread. Bytecode is cached (in a temporary
``PYTHONPYCACHEPREFIX``, after one warm-up run) as an installed package's is, even where
the environment sets ``PYTHONDONTWRITEBYTECODE``; ``--no-bytecode-cache`` measures
without (every module of simcli compiled from source on every run). Issue 18's target:
<= 0.3 s for ``--help``, ``specs list`` and ``predict gemm`` on the 2-core development
machine. A bare ``python -c pass`` is timed too, as the floor no CLI can go under.
Finding what a command imports:
``python -X importtime -m simcli.cli specs list 2>&1 | sort -t'|' -k2 -n``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = (
    "--help;specs list;predict gemm --m 4096 --n 4096 --k 4096 --gpu h100-sxm;"
    "models list;step --help;serve --help;train --help;plan --help"
)


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, check=False, env=env)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"{shlex.join(argv)} failed:\n{out.stderr.decode()[-2000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--commands", default=DEFAULT, help="';'-separated simcli argument lists")
    ap.add_argument("--no-bytecode-cache", action="store_true")
    args = ap.parse_args()
    env = dict(os.environ)
    cache = tempfile.TemporaryDirectory()
    if not args.no_bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache.name
    # the script beside this interpreter: a version manager's shim (pyenv) on PATH would
    # add its own ~0.1 s of bash to every run
    script = Path(sys.executable).with_name("simcli")
    script = str(script) if script.exists() else shutil.which("simcli")
    entry = [script] if script else [sys.executable, "-c", "from simcli.cli import main; main()"]
    floor = [_time([sys.executable, "-c", "pass"], env) for _ in range(args.repeat)]
    print(f"{'python -c pass':<66} {statistics.median(floor):6.3f} s (median of {args.repeat})")
    for command in args.commands.split(";"):
        argv = [*entry, *shlex.split(command)]
        _time(argv, env)  # warm-up: fills the bytecode cache
        walls = sorted(_time(argv, env) for _ in range(args.repeat))
        print(
            f"{'simcli ' + command:<66} {statistics.median(walls):6.3f} s "
            f"(min {walls[0]:.3f}, max {walls[-1]:.3f})"
        )


if __name__ == "__main__":
    main()
