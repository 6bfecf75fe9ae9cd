"""Pack FlashInfer for a device call: the wheel slimmed to what its JIT needs on Hopper.

    python3 -m calibrate.bench.engine_kernels_pack WHEEL OUT.tar.xz [--no-headers]

The flashinfer-python wheel (0.7.2.post1: 62 MB, 400+ MB unpacked) does not fit the
device tool's 64 MiB working-tree limit beside the repository. The device needs: every
Python module the package imports at ``import flashinfer`` (and the attention wrappers),
the JIT's inputs for the attention kernels (``data/include``, the top-level files of
``data/csrc`` with their jinja templates, CUTLASS's and CCCL's headers, spdlog's), and
nothing else: other kernels' sources, experimental Python packages over 30 kB that the
import never loads, tests and docs stay out (8.2 MB packed). ``--no-headers`` also drops
CUTLASS, CCCL and spdlog, for a call whose modules all come prebuilt (the ``aot.tar.xz``
a previous call returns; calibrate/bench/engine_kernels_device.sh unpacks it as
FlashInfer's AOT folder). Run where the wheel's import works (it needs torch, any build,
and apache-tvm-ffi on the path).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

#: Python subpackages whose large files are dropped unless the import loads them
PRUNED = ("experimental", "moe_ep", "fused_moe", "kda_kernels", "gdn_kernels", "comm",
          "topk_varlen", "msa_ops", "mamba")  # fmt: skip
BIG = 30_000  # bytes: smaller files of those packages are kept anyway
DATA = {  # data/<dir>: the prefixes kept (None: the top-level files only)
    "include": ("",),
    "csrc": None,
    "cutlass": ("include/", "tools/util/include/"),
    "spdlog": ("include/",),
    "cccl": ("cub/cub/", "libcudacxx/include/", "thrust/thrust/"),
}
HEADERS = ("cutlass", "spdlog", "cccl")


def keep_data(parts: list[str], headers: bool) -> bool:
    if len(parts) < 4:
        return False
    top, rest = parts[2], "/".join(parts[3:])
    if top not in DATA or (not headers and top in HEADERS):
        return False
    prefixes = DATA[top]
    return len(parts) == 4 if prefixes is None else rest.startswith(prefixes)


def loaded_modules(root: Path) -> set[str]:
    """Files (relative to ``root``) that ``import flashinfer`` and its wrappers load."""
    code = (
        "import sys, os, flashinfer\n"
        "from flashinfer import BatchDecodeWithPagedKVCacheWrapper, "
        "BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper\n"
        f"root = {str(root)!r}\n"
        "for m in list(sys.modules.values()):\n"
        "    f = getattr(m, '__file__', None)\n"
        "    if f and f.startswith(root):\n"
        "        print(os.path.relpath(f, root))\n"
    )
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=600)  # fmt: skip
    return set(out.stdout.split())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--no-headers", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / "full"
        with zipfile.ZipFile(args.wheel) as z:
            z.extractall(full)
        loaded = loaded_modules(full)
        slim = Path(tmp) / "slim"
        for path in full.rglob("*"):
            if not path.is_file():
                continue
            rel = path.relative_to(full).as_posix()
            parts = rel.split("/")
            if parts[0].endswith(".dist-info"):
                keep = parts[-1] in ("METADATA", "top_level.txt", "WHEEL", "entry_points.txt")
            elif parts[0] != "flashinfer":
                keep = False
            elif len(parts) > 1 and parts[1] == "data":
                keep = keep_data(parts, not args.no_headers)
            elif not (rel.endswith(".py") or rel.endswith(".json")):
                keep = False
            elif len(parts) > 2 and parts[1] in PRUNED:
                keep = rel in loaded or parts[-1] == "__init__.py" or path.stat().st_size < BIG
            else:
                keep = not rel.endswith(".json") or path.stat().st_size < 100_000
            if keep:
                dst = slim / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dst)
        with tarfile.open(args.out, "w:xz", preset=9) as tar:
            for path in sorted(slim.iterdir()):
                tar.add(path, arcname=path.name)
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
