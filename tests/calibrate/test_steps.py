"""The whole-step measurement scripts (calibrate.steps) on the CPU with ``--tiny``:
CSV columns and statuses, failures recorded rather than fatal, and the model code
checked against itself (decode over the cache == prefill; GQA native == repeated).
Needs torch (skipped without it)."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from calibrate.bench import common as C  # noqa: E402
from calibrate.steps import STATUSES  # noqa: E402
from calibrate.steps import serve_step as S  # noqa: E402
from calibrate.steps import train_step as T  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        assert reader.fieldnames is not None
        return rows


def _header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f))


@pytest.fixture(scope="module")
def train_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train")
    rc = T.main(["--out", str(out), "--tiny", "--device", "cpu", "--warmup", "1", "--steps", "2"])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def serve_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serve")
    rc = S.main(["--out", str(out), "--tiny", "--device", "cpu", "--warmup", "1"])
    assert rc == 0
    return out


def test_train_csv_columns_and_values(train_run):
    path = train_run / "train_step.csv"
    assert _header(path) == list(T.COLUMNS)
    for name in (
        "model",
        "layers",
        "hidden",
        "heads",
        "kv_heads",
        "head_dim",
        "ffn",
        "vocab",
        "batch",
        "seq_len",
        "params",
        "step_ms",
        "fwd_ms",
        "bwd_ms",
        "optim_ms",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "tokens_per_s",
        "status",
        "error",
    ):
        assert name in T.COLUMNS
    rows = _rows(path)
    assert len(rows) == len(T.TINY_MODELS) * len(T.TINY_SHAPES)
    for r in rows:
        assert r["status"] == "ok", r
        arch = T.TINY_MODELS[r["model"]]
        assert int(r["params"]) == arch.params()
        step = float(r["step_ms"])
        parts = float(r["fwd_ms"]) + float(r["bwd_ms"]) + float(r["optim_ms"])
        assert step > 0 and parts == pytest.approx(step, rel=0.3)
        tokens = int(r["batch"]) * int(r["seq_len"])
        assert float(r["tokens_per_s"]) == pytest.approx(tokens / step * 1e3, rel=1e-3)
        assert r["gqa_mode"] == ("mha" if arch.kv_heads == arch.heads else "native")
        assert 0 < float(r["loss"]) < 10
    meta = json.loads((train_run / "train_step.meta.json").read_text())
    assert meta["environment"]["torch"] == torch.__version__
    assert meta["counts"] == {"ok": len(rows)} and meta["not_run"] == []
    assert {r["model"] for r in meta["runs"]} == set(T.TINY_MODELS)


def test_train_param_count_matches_model():
    for arch in T.TINY_MODELS.values():
        model = T.build_model(arch, "cpu", "native", 16)
        assert sum(p.numel() for p in model.parameters()) == arch.params()
    # the full-size configs, by formula: about 1.5e9, 3.6e9, 1.3e9 parameters
    assert T.MODELS["llama3.2-1b-like"].params() == 1_498_482_688


def test_train_gqa_native_equals_repeated_kv():
    arch = T.TINY_MODELS["tiny-gqa"]
    torch.manual_seed(0)
    model = T.build_model(arch, "cpu", "native", 16)
    tokens = torch.randint(0, arch.vocab, (2, 16))
    with torch.no_grad():
        a = model(tokens)
        T.set_gqa_mode(model, "repeat")
        b = model(tokens)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_train_failure_recorded_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv(C.INJECT_FAIL_ENV, "train_step")
    args = ["--out", str(tmp_path), "--tiny", "--device", "cpu", "--models", "tiny-mha"]
    rc = T.main([*args, "--shapes", "1x16,2x8", "--steps", "1", "--warmup", "0"])
    assert rc == 0
    rows = _rows(tmp_path / "train_step.csv")
    assert [r["status"] for r in rows] == ["error", "error"]
    assert all("injected failure" in r["error"] for r in rows)


def test_train_time_budget_leaves_complete_csv(tmp_path):
    rc = T.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--time-budget-s", "0"])
    assert rc == 0
    assert _rows(tmp_path / "train_step.csv") == []
    meta = json.loads((tmp_path / "train_step.meta.json").read_text())
    assert len(meta["not_run"]) == len(T.TINY_MODELS) * len(T.TINY_SHAPES)


def test_train_bad_shapes_message():
    with pytest.raises(SystemExit, match="BATCHxSEQ"):
        T.parse_shapes("4by2048")


def test_serve_csv_columns_and_statuses(serve_run):
    path = serve_run / "serve_step.csv"
    assert _header(path) == list(S.COLUMNS)
    rows = _rows(path)
    pre = [r for r in rows if r["phase"] == "prefill"]
    dec = [r for r in rows if r["phase"] == "decode"]
    assert len(pre) == len(S.TINY_PREFILL_BATCHES) * len(S.TINY_PROMPT_LENS)
    assert len(dec) == len(S.TINY_DECODE_BATCHES) * len(S.TINY_CONTEXT_LENS)
    assert {r["status"] for r in rows} <= set(STATUSES)
    for r in pre:
        assert r["status"] == "ok", r
        b, p = int(r["batch"]), int(r["prompt_len"])
        assert int(r["tokens"]) == b * p and r["context_len"] == ""
        assert int(r["kv_cache_bytes"]) == S.TINY.kv_bytes_per_token(2) * b * p
        assert float(r["step_ms"]) > 0 and int(r["reps"]) >= 5 and r["timing"] == "eager"
    # no CUDA graphs on a CPU
    assert all(r["status"] == "unsupported" and "CUDA graph" in r["error"] for r in dec)
    meta = json.loads((serve_run / "serve_step.meta.json").read_text())
    assert "not paged" in meta["method"]["kv_cache"].lower()
    assert meta["model"]["kv_bytes_per_token"] == S.TINY.kv_bytes_per_token()


def test_serve_decode_eager_and_skips(tmp_path):
    rc = S.main(
        [
            "--out",
            str(tmp_path),
            "--tiny",
            "--device",
            "cpu",
            "--decode-mode",
            "eager",
            "--prefill-batches",
            "1,4",
            "--prompt-lens",
            "16",
            "--max-prefill-tokens",
            "32",
            "--decode-batches",
            "2",
            "--context-lens",
            "8",
            "--warmup",
            "0",
        ]
    )
    assert rc == 0
    rows = _rows(tmp_path / "serve_step.csv")
    by = {(r["phase"], r["batch"]): r for r in rows}
    assert by[("prefill", "1")]["status"] == "ok"
    assert by[("prefill", "4")]["status"] == "skipped"
    assert "max-prefill-tokens" in by[("prefill", "4")]["error"]
    d = by[("decode", "2")]
    assert d["status"] == "ok" and d["timing"] == "eager" and d["tokens"] == "2"
    assert int(d["kv_cache_bytes"]) == S.TINY.kv_bytes_per_token() * 2 * 9


def test_serve_decode_over_cache_matches_prefill():
    """Decoding token P-1 over the cache of a (P-1)-token prefill gives the logits of
    a P-token prefill: K/V placement, RoPE positions and the GQA path agree."""
    arch = S.TINY
    w = S.make_weights(arch, "cpu", torch.float32, seed=1)
    rope = S.rope_table(arch, 64, "cpu")
    b, p = 3, 12
    tokens = torch.randint(0, arch.vocab, (b, p))
    with torch.inference_mode():
        full_cache = S.make_cache(arch, b, p, "cpu", torch.float32, 0)
        ref = S.forward(arch, w, full_cache, tokens, 0, rope)
        for gqa in ("native", "repeat"):
            cache = S.make_cache(arch, b, p, "cpu", torch.float32, 0)
            S.forward(arch, w, cache, tokens[:, :-1], 0, rope, gqa)
            logits, nxt = S.decode_step(arch, w, cache, tokens[:, -1:], p - 1, rope, gqa)
            torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(cache, full_cache)
            assert torch.equal(nxt, ref.argmax(-1))


def test_serve_llama3_8b_sizes():
    a = S.LLAMA3_8B
    assert a.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2
    assert 8.0e9 < a.params() < 8.1e9


def test_scripts_import_only_stdlib_torch_and_calibrate():
    forbidden = {"pydantic", "typer", "numpy", "workloads", "costmodels", "simcli"}
    forbidden |= {"hardware_specs"}
    for path in (REPO / "calibrate" / "steps").glob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        assert not names & forbidden, f"{path.name} imports {sorted(names & forbidden)}"


def test_dist_step_ddp_on_two_cpu_processes(tmp_path):
    """torchrun with two gloo processes: DDP-wrapped step, rank 0 writes one ok row."""
    import csv
    import subprocess
    import sys

    pytest.importorskip("torch.distributed.run")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "-m", "calibrate.steps.dist_step", "--out", str(tmp_path), "--mode", "ddp",
           "--tiny", "--device", "cpu", "--warmup", "1", "--steps", "2"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "dist_step.ddp.2gpu.csv").open()))
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["world_size"] == "2"
    assert float(rows[0]["step_ms"]) > 0
