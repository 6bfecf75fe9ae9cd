"""The microbenchmark runner on the CPU (``--tiny``): columns, statuses, resume,
failures recorded rather than fatal. Needs torch (skipped without it)."""

from __future__ import annotations

import ast
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from calibrate.bench import common as C  # noqa: E402
from calibrate.run import main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONTRACT = [
    "op",
    "dtype",
    "m",
    "n",
    "k",
    "batch",
    "seq_q",
    "seq_kv",
    "heads_q",
    "heads_kv",
    "head_dim",
    "causal",
    "backend",
    "density",
    "block_size",
    "bytes",
    "ranks",
]
OP_KINDS = {
    "gemm",
    "attn_fwd",
    "attn_bwd",
    "attn_fwdbwd",
    "attn_decode",
    "attn_blocksparse_fwd",
    "attn_blocksparse_bwd",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
    "copy",
    "rmsnorm",
    "layernorm",
    "swiglu",
    "gelu",
    "rope",
    "softmax",
    "cross_entropy",
    "embedding",
    "residual_add",
    "adamw",
}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    rc = main(
        [
            "--suite",
            "gemm,attention,decode,elementwise,blocksparse,power",
            "--tiny",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    return out


def test_columns_follow_the_op_csv_contract(tiny_run: Path) -> None:
    for suite in ("gemm", "attention", "decode", "elementwise", "blocksparse", "power"):
        path = tiny_run / f"{suite}.csv"
        assert path.exists(), suite
        with path.open(newline="") as f:
            header = next(csv.reader(f))
        assert header[: len(CONTRACT)] == CONTRACT
        assert header == list(C.COLUMNS)
        for r in _rows(path):
            assert r["op"] in OP_KINDS
            assert r["suite"] == suite
            assert r["status"] in C.STATUSES
            if r["status"] == "ok":
                assert float(r["measured_ms"]) > 0
                assert not r["error"]
            else:
                assert r["error"] and not r["measured_ms"]


def test_contract_columns_match_workloads_ops() -> None:
    """The runner can't import workloads (no pydantic on the device): compare by parsing."""
    src = (REPO / "workloads" / "ops.py").read_text()
    tree = ast.parse(src)
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id in ("CSV_COLUMNS", "EXTRA_COLUMNS"):
                found[node.target.id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.ClassDef) and node.name == "OpKind":
            found["kinds"] = {
                s.value.value
                for s in node.body
                if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)
            }
    assert tuple(CONTRACT) == found["CSV_COLUMNS"]
    assert found["CSV_COLUMNS"] + found["EXTRA_COLUMNS"] == C.OP_COLUMNS
    assert found["kinds"] == OP_KINDS


def test_cpu_statuses(tiny_run: Path) -> None:
    gemm = _rows(tiny_run / "gemm.csv")
    ok = {(r["dtype"]) for r in gemm if r["status"] == "ok"}
    assert {"fp32", "bf16"} <= ok
    attn = _rows(tiny_run / "attention.csv")
    # SDPA's CPU flash kernel runs; cudnn/efficient don't exist on the CPU
    assert any(r["backend"] == "flash" and r["status"] == "ok" for r in attn)
    assert all(r["status"] == "unsupported" for r in attn if r["backend"] in ("cudnn", "efficient"))
    assert {r["op"] for r in attn} == {"attn_fwd", "attn_fwdbwd"}
    assert all(r["status"] == "unsupported" for r in _rows(tiny_run / "blocksparse.csv"))
    bs = _rows(tiny_run / "blocksparse.csv")
    assert all(0 < float(r["density"]) <= 1 for r in bs)
    assert {r["pattern"] for r in bs} >= {"causal", "window", "topk", "s2", "nsa"}
    ew = {r["op"] for r in _rows(tiny_run / "elementwise.csv") if r["status"] == "ok"}
    assert ew == {"copy", "rmsnorm", "swiglu", "softmax", "cross_entropy", "rope", "adamw"}
    meta = (tiny_run / "meta.json").read_text()
    assert '"torch"' in meta and '"runs"' in meta


def test_resume_skips_rows_already_present(tiny_run: Path) -> None:
    before = {p.name: len(_rows(p)) for p in tiny_run.glob("*.csv")}
    rc = main(
        [
            "--suite",
            "gemm,elementwise,blocksparse",
            "--tiny",
            "--device",
            "cpu",
            "--out",
            str(tiny_run),
        ]
    )
    assert rc == 0
    after = {p.name: len(_rows(p)) for p in tiny_run.glob("*.csv")}
    assert after == before


def test_interrupted_run_resumes(tmp_path: Path) -> None:
    main(["--suite", "gemm", "--tiny", "--device", "cpu", "--out", str(tmp_path), "--limit", "3"])
    assert len(_rows(tmp_path / "gemm.csv")) == 3
    main(["--suite", "gemm", "--tiny", "--device", "cpu", "--out", str(tmp_path)])
    rows = _rows(tmp_path / "gemm.csv")
    keys = [C.row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) > 3


def test_failing_kernel_is_recorded_not_fatal(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(C.INJECT_FAIL_ENV, "rmsnorm")
    rc = main(["--suite", "elementwise", "--tiny", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    rows = _rows(tmp_path / "elementwise.csv")
    bad = [r for r in rows if r["op"] == "rmsnorm"]
    assert bad and all(r["status"] == "error" and "injected" in r["error"] for r in bad)
    assert all(r["status"] == "ok" for r in rows if r["op"] != "rmsnorm")


def test_time_budget_stops_cleanly(tmp_path: Path) -> None:
    rc = main(
        [
            "--suite",
            "gemm,elementwise",
            "--tiny",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
            "--time-budget-s",
            "0",
        ]
    )
    assert rc == 0
    for p in tmp_path.glob("*.csv"):
        assert _rows(p) == []


def test_shards_partition_the_cases(tmp_path: Path) -> None:
    for i in range(2):
        main(
            [
                "--suite",
                "elementwise",
                "--tiny",
                "--device",
                "cpu",
                "--out",
                str(tmp_path),
                "--shard",
                f"{i}/2",
            ]
        )
    a = _rows(tmp_path / "elementwise.shard0of2.csv")
    b = _rows(tmp_path / "elementwise.shard1of2.csv")
    assert a and b
    ka, kb = {C.row_key(r) for r in a}, {C.row_key(r) for r in b}
    assert not ka & kb
    merged = tmp_path / "merged"
    main(["--merge", str(tmp_path), "--out", str(merged)])
    assert {C.row_key(r) for r in _rows(merged / "elementwise.csv")} == ka | kb


def test_classify() -> None:
    assert C.classify(torch.cuda.OutOfMemoryError("CUDA out of memory"))[0] == "oom"
    assert C.classify(RuntimeError("No available kernel. Aborting execution."))[0] == "unsupported"
    assert C.classify(ValueError("boom"))[0] == "error"
    assert len(C.classify(RuntimeError("x" * 1000))[1]) <= 200


def test_runner_imports_stay_light() -> None:
    """calibrate.run must not pull in the project (no pydantic on the device machine)."""
    code = (
        "import sys, calibrate.run, calibrate.bench.gemm, calibrate.bench.attention, "
        "calibrate.bench.decode, calibrate.bench.blocksparse, calibrate.bench.elementwise, "
        "calibrate.bench.power, calibrate.bench.collectives, calibrate.bench.summary\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('workloads', 'costmodels', 'hardware_specs', 'simcli', 'pydantic', 'pandas')]\n"
        "assert not bad, bad\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo")
def test_collectives_on_cpu_with_gloo(tmp_path: Path) -> None:
    rc = main(
        [
            "--suite",
            "collectives",
            "--tiny",
            "--device",
            "cpu",
            "--ranks",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    rows = _rows(tmp_path / "collectives.csv")
    assert {r["op"] for r in rows} == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "send_recv",
    }
    assert all(r["ranks"] == "2" and r["bytes"] for r in rows)
    assert (tmp_path / "collectives.meta.2gpu.json").exists()
