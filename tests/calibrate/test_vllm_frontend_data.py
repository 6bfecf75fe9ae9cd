"""The committed vLLM V1 frontend data (calibrate/data/vllm-frontend-cpu): its schema, that
the fit in meta.json and in the vLLM engine profile is the one recomputed from server.csv,
and that the probe stays a runner (no project packages, no pydantic). No vLLM needed."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest
import yaml

from calibrate.engines import vllm_frontend_probe as probe

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibrate" / "data" / "vllm-frontend-cpu"
PROBE = ROOT / "calibrate" / "engines" / "vllm_frontend_probe.py"


def _header(name: str) -> list[str]:
    with open(DATA / name, newline="") as f:
        return next(csv.reader(f))


def test_csv_schema_and_grid():
    assert _header("server.csv") == probe.SERVER_COLUMNS
    assert _header("tokenize.csv") == probe.TOKENIZE_COLUMNS
    rows = probe.read_csv(DATA / "server.csv")
    grid = {(r["family"], r["output_tokens"]) for r in rows}
    assert grid == {(f, o) for f in probe.PROMPT_FAMILIES for o in probe.OUTPUT_LENGTHS}
    for r in rows:
        assert r["chunks"] == r["output_tokens"]  # one streamed chunk per token
        assert abs(r["prompt_tokens"] - r["family"]) <= 0.05 * r["family"]
        assert 0 < r["first_chunk_cpu_s"] <= r["total_cpu_s"]
        assert 0 <= r["core_cpu_s"] < r["total_cpu_s"]
        assert r["net_cpu_s"] == pytest.approx(r["total_cpu_s"] - r["core_cpu_s"], abs=1e-8)
    assert _header("concurrency.csv") == probe.CONC_COLUMNS
    conc = probe.read_csv(DATA / "concurrency.csv")
    assert {r["concurrency"] for r in conc} == set(probe.CONCURRENCY)
    for r in conc:  # every stream got one chunk per token
        assert r["chunks"] == r["concurrency"] * r["output_tokens"]
        assert 0 <= r["core_cpu_s"] < r["net_cpu_s"]
    tok = probe.read_csv(DATA / "tokenize.csv")
    assert {r["family"] for r in tok} == set(probe.PROMPT_FAMILIES)
    assert all(r["encode_cpu_s"] > 0 and r["chars"] > r["prompt_tokens"] for r in tok)


def test_meta_records_machine_and_fits():
    meta = json.loads((DATA / "meta.json").read_text())
    assert meta["versions"]["vllm"] == "0.11.0"
    assert meta["cpu"]["model name"] and meta["date_utc"] and meta["nproc"] >= 1
    assert len(meta["loadavg"]) == 3 and len(meta["loadavg_at_start"]) == 3
    assert meta["tokenizer"]["vocab_size"] == 128_256
    fit = probe.fit_frontend(probe.read_csv(DATA / "server.csv"))
    for k, v in fit.items():
        assert meta["fit"][k] == (pytest.approx(v, rel=1e-9) if isinstance(v, float) else v), k
    assert 0 < fit["heldout_mape"] < 0.3
    assert meta["concurrency"] == probe.concurrency_summary(
        probe.read_csv(DATA / "concurrency.csv"), meta["fit"]
    )
    tfit = probe.fit_tokenize(probe.read_csv(DATA / "tokenize.csv"))
    assert meta["tokenize_fit"]["per_prompt_token_s"] == pytest.approx(tfit["per_prompt_token_s"])


def test_engine_profile_uses_the_fit():
    """costmodels/data/engines/vllm.yaml carries the fit to three significant figures."""
    fit = probe.fit_frontend(probe.read_csv(DATA / "server.csv"))
    prof = yaml.safe_load((ROOT / "costmodels" / "data" / "engines" / "vllm.yaml").read_text())
    fe = prof["frontend"]
    for k in ("per_request_s", "per_prompt_token_s", "per_output_token_s"):
        assert fe[k] == float(f"{fit[k]:.3g}"), k
        assert "vllm-frontend-cpu" in fe["sources"][k]


def test_probe_imports_no_project_code():
    tree = ast.parse(PROBE.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    assert not names & {"simcli", "costmodels", "hardware_specs", "workloads", "pydantic"}
