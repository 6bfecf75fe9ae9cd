"""GPU microbenchmarks that produce calibration datasets.

This package runs on the device machine, where neither this project nor pydantic is
installed: modules here import only the standard library, torch, triton and numpy
(rich and pynvml optionally). Never import ``workloads``, ``costmodels``,
``hardware_specs`` or ``simcli`` from here; the op names and columns below mirror
``workloads/ops.py`` by hand (``tests/calibrate`` checks that they agree).

Entry point: ``python3 -m calibrate.run --suite all --out DIR``.
"""

SUITES = (
    "gemm",
    "attention",
    "decode",
    "blocksparse",
    "elementwise",
    "power",
    "collectives",
    "sparse_gemm",
)
# `--suite all` runs every single-GPU suite; collectives need several GPUs; sparse_gemm
# (2:4 and CATS sparse GEMMs) runs only when named.
SINGLE_GPU_SUITES = ("gemm", "attention", "decode", "blocksparse", "elementwise", "power")
