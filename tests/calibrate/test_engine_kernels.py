"""The engine-kernel runner (calibrate/bench/engine_kernels.py): its case grids, rows
and CLI on the CPU; its measuring paths need CUDA and FlashInfer (skipped without)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.bench import common as C
from calibrate.bench import engine_kernels as ek
from workloads.ops import BACKENDS, OpKind

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibrate" / "data"


def test_rows_are_op_csv_rows_with_the_flashinfer_backend():
    for make in (ek.decode_cases, ek.prefill_cases):
        cases = make("full", 64 * C.GiB)
        assert cases
        for c in cases:
            assert set(c.row) <= set(C.COLUMNS)
            assert c.row["backend"] == "flashinfer"
            assert c.row["family"] == ek.family(c.row["heads_q"], c.row["heads_kv"],
                                                c.row["head_dim"])  # fmt: skip
            assert c.group == ek.module_key(c.row)
        # every row's op and backend are ones the op contract accepts
        for c in cases:
            assert c.row["backend"] in BACKENDS[OpKind(c.row["op"])]
        assert len({c.key for c in cases}) == len(cases)


def test_decode_grid_covers_the_engines_head_configs_and_fits_the_pool():
    cases = ek.decode_cases("full", 40 * C.GiB)
    fams = {c.row["family"] for c in cases if c.row["pattern"] == "graph:tc"}
    assert {"h32kv8d128", "h8kv1d128", "h16kv2d128", "h28kv4d128", "h32kv32d128"} <= fams
    assert all(ek.kv_bytes(c.row) <= 40 * C.GiB for c in cases)
    big = ek.decode_cases("full", 140 * C.GiB)
    assert len(big) > len(cases)  # a larger card measures larger caches
    assert max(c.row["batch"] for c in big) == 512
    assert max(c.row["seq_kv"] for c in big) == 32768


def test_prefill_grid_has_prefix_chunks_and_both_kernels():
    cases = ek.prefill_cases("full", 64 * C.GiB)
    kinds = {c.row["pattern"].split(":")[0] for c in cases}
    assert kinds == {"paged", "ragged"}
    chunks = [c for c in cases if c.row["seq_kv"] > c.row["seq_q"]]
    assert chunks and all(c.row["pattern"].startswith("paged") for c in chunks)
    assert all(c.row["causal"] for c in cases)
    assert {c.row["seq_q"] for c in cases} >= {128, 16384}


def test_heads_option_restricts_the_grids():
    only = [(8, 4, 256)]
    dec = ek.decode_cases("full", 64 * C.GiB, only)
    pre = ek.prefill_cases("full", 64 * C.GiB, only)
    assert {c.row["family"] for c in dec + pre} == {"h8kv4d256"}
    assert {c.row["pattern"] for c in dec} == {"graph:tc"}


def test_kv_bytes_counts_whole_pages():
    row = {"batch": 2, "seq_kv": 17, "heads_kv": 8, "head_dim": 128, "dtype": "bf16"}
    assert ek.kv_bytes(row) == 2 * 2 * 2 * ek.PAGE_SIZE * 8 * 128 * 2  # 2 pages each
    assert ek.kv_bytes({**row, "dtype": "fp8"}) == ek.kv_bytes(row) // 2


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "calibrate.bench.engine_kernels", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip


def test_cli_lists_cases_and_refuses_bad_input():
    r = _cli("--list", "--mode", "tiny")
    assert r.returncode == 0, r.stderr
    assert "decode:" in r.stdout and "prefill:" in r.stdout
    bad = _cli("--list", "--suites", "decode,gemm")
    assert bad.returncode != 0 and "allowed: decode, prefill" in bad.stderr
    bad = _cli("--list", "--heads", "8x4")
    assert bad.returncode != 0 and "--heads" in bad.stderr


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200-sxm"])
def test_committed_data_is_complete_and_loads(gpu):
    from calibrate.dataset import load_dataset

    ds = load_dataset(DATA / f"engine-kernels-{gpu}", expect_gpu=gpu)
    f = ds.frame
    assert set(f["backend"]) == {"flashinfer"}
    assert set(f["op"]) == {"attn_decode", "attn_fwd"}
    assert not ds.skipped  # every planned case measured
    assert (f["measured_s"] > 0).all()
    assert (DATA / f"engine-kernels-{gpu}" / "README.md").exists()


def test_measured_decode_is_bandwidth_bound_and_h200_faster():
    """The data itself: large-KV decode reads at 2.5-5 TB/s, and an H200 runs it faster
    than an H100 by about their bandwidth ratio (4.8 / 3.35 TB/s datasheets)."""
    import pandas as pd

    def big(gpu):
        d = pd.read_csv(DATA / f"engine-kernels-{gpu}" / "decode.csv")
        d = d[(d["pattern"] == "graph:tc") & (d["dtype"] == "bf16") & (d["batch"] == 64)
              & (d["seq_kv"] == 32768) & (d["family"] == "h32kv8d128")]  # fmt: skip
        return float(d["measured_ms"].iloc[0])

    kv = 2 * 64 * 32768 * 8 * 128 * 2
    h100, h200 = big("h100-sxm"), big("h200-sxm")
    assert 2.5e12 < kv / (h100 / 1e3) < 3.35e12
    assert 1.25 < h100 / h200 < 1.6


@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("flashinfer"), reason="needs FlashInfer"
)
def test_one_decode_case_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ctx = C.make_context("tiny", "cuda", "events", 0)
    pools = ek.Pools(ctx, 64 * C.MiB, 16 * C.MiB)
    case = ek.decode_cases("tiny", 64 * C.MiB)[0]
    out = ek.run_decode(case, ctx, pools)
    assert out["measured_ms"] > 0


def test_step_model_with_flashinfer_matches_the_measured_steps():
    """calibrate.engine_step_check: the step model with FlashInfer attention against the
    measured CUDA-graph decode steps (never fitted on them): MAPE 2.5% on the H100."""
    from calibrate.engine_step_check import compare

    t = compare("h100-sxm")
    assert len(t) == 18
    assert t["error_pct"].abs().mean() < 4.0 and t["error_pct"].abs().max() < 8.0
