"""The sparse_gemm runner suite on the CPU (``--tiny``): dense and CATS rows measured, 2:4
rows ``unsupported`` where torch has no semi-structured kernel (the CPU), resumable."""

from __future__ import annotations

import ast
import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from calibrate.bench import SUITES  # noqa: E402
from calibrate.bench import common as C  # noqa: E402
from calibrate.bench import sparse_gemm as SG  # noqa: E402
from calibrate.run import main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sparse")
    rc = main(["--suite", "sparse_gemm", "--tiny", "--device", "cpu", "--out", str(out)])
    assert rc == 0
    return out


def test_registered() -> None:
    assert "sparse_gemm" in SUITES


def test_rows_follow_the_contract(tiny: Path) -> None:
    path = tiny / "sparse_gemm.csv"
    with path.open(newline="") as f:
        assert next(csv.reader(f)) == list(C.COLUMNS)
    rows = _rows(path)
    assert rows
    for r in rows:
        assert r["op"] == "gemm" and r["suite"] == "sparse_gemm"
        assert r["status"] in C.STATUSES
        assert r["pattern"] in ("dense", "2:4") or r["pattern"].startswith("cats:")
        if r["status"] == "ok":
            assert float(r["measured_ms"]) > 0 and not r["error"]
        else:
            assert r["error"] and not r["measured_ms"]
    assert {r["pattern"] for r in rows} >= {"dense", "2:4", "cats:0.3"}
    assert {r["backend"] for r in rows if r["pattern"] == "2:4"} == {
        "cusparselt",
        "cusparselt_graph",
        "cutlass",
    }
    assert {r["backend"] for r in rows if r["pattern"].startswith("cats")} == {"gather", "compact"}


def test_statuses_on_cpu(tiny: Path) -> None:
    rows = _rows(tiny / "sparse_gemm.csv")
    assert all(r["status"] == "ok" for r in rows if r["pattern"] == "dense")
    assert all(r["status"] == "ok" for r in rows if r["pattern"].startswith("cats"))
    semi = [r for r in rows if r["pattern"] == "2:4"]
    assert semi
    # torch's semi-structured tensors are CUDA-only today; should a CPU kernel appear,
    # those rows are measured instead: either way never `error`
    assert all(r["status"] in ("ok", "unsupported") for r in semi)
    if not torch.cuda.is_available():
        assert all(r["status"] == "unsupported" for r in semi)
        assert all("2:4" in r["error"] or "cuSPARSELt" in r["error"] for r in semi)
    assert all(float(r["density"]) == 0.5 for r in semi)


def test_cats_density_is_the_batch_union(tiny: Path) -> None:
    for r in _rows(tiny / "sparse_gemm.csv"):
        if not r["pattern"].startswith("cats:"):
            continue
        active = float(r["pattern"].split(":")[1])
        neurons = max(int(r["n"]), int(r["k"]))
        rows = SG.cats_rows_read(neurons, active, int(r["m"]))
        assert float(r["density"]) == pytest.approx(rows / neurons, rel=1e-5)


def test_cats_rows_read() -> None:
    assert SG.cats_rows_read(14336, 0.3, 1) == 8 * math.ceil(14336 * 0.3 / 8)
    assert SG.cats_rows_read(14336, 0.3, 64) == 14336  # the union of 64 tokens: all of them
    prev = 0
    for t in (1, 2, 4, 8, 16):
        cur = SG.cats_rows_read(4096, 0.1, t)
        assert cur % 8 == 0 and cur >= prev
        prev = cur


def test_resume_skips_done_rows(tiny: Path) -> None:
    before = len(_rows(tiny / "sparse_gemm.csv"))
    assert main(["--suite", "sparse_gemm", "--tiny", "--device", "cpu", "--out", str(tiny)]) == 0
    assert len(_rows(tiny / "sparse_gemm.csv")) == before


def test_full_plan_covers_llm_layers_and_decode_batches() -> None:
    ctx = C.Context(mode="full", device="cuda", mem_bytes=80 * C.GiB)
    cases = SG.cases(ctx)
    keys = [c.key for c in cases]
    assert len(keys) == len(set(keys))
    cats = [c.row for c in cases if c.row["pattern"].startswith("cats")]
    assert {r["m"] for r in cats} == {1, 2, 4, 8, 16, 64}
    semi = [c.row for c in cases if c.row["pattern"] == "2:4"]
    assert {r["m"] for r in semi} >= {1, 16, 256, 4096, 16384}
    assert {r["dtype"] for r in semi} == {"bf16", "fp16"}
    assert all(2 * r["m"] * r["n"] * r["k"] <= SG.FLOP_CAP for r in semi)
    # a layer's cases are contiguous (its weight is built once)
    groups = [(c.group, c.row["family"]) for c in cases]
    seen: set[str] = set()
    for i, g in enumerate(groups):
        if i and g != groups[i - 1]:
            assert g not in seen
        seen.add(g)


def test_runner_file_imports_only_stdlib_and_torch() -> None:
    tree = ast.parse((REPO / "calibrate" / "bench" / "sparse_gemm.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: the runner's own modules
                continue
            names = [(node.module or "").split(".")[0]]
        else:
            continue
        for name in names:
            assert name == "torch" or name in sys.stdlib_module_names or name == "__future__", name


def test_importing_the_suite_loads_no_torch() -> None:
    code = (
        "import sys, calibrate.run, calibrate.bench.sparse_gemm\n"
        "assert 'torch' not in sys.modules\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('workloads', 'costmodels', 'hardware_specs', 'simcli', 'pydantic', 'numpy')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
