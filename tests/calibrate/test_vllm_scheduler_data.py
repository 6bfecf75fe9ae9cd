"""The committed vLLM V1 scheduler data (calibrate/data/vllm-scheduler-cpu): its schema and
invariants, that the probe stays a runner (no project packages, no pydantic), and that
benchmarks/compare_vllm_scheduler.py runs on it. No vLLM needed."""

from __future__ import annotations

import ast
import csv
import json
from collections import defaultdict
from pathlib import Path

import pytest

from benchmarks import compare_vllm_scheduler as cmp
from calibrate.engines import vllm_scheduler_probe as probe

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibrate" / "data" / "vllm-scheduler-cpu"


def _rows(name: str) -> list[dict]:
    with open(DATA / name, newline="") as f:
        return list(csv.DictReader(f))


def test_meta_records_versions_cpu_and_fit():
    meta = json.loads((DATA / "meta.json").read_text())
    for key in ("vllm_version", "torch_version", "cpu_model", "date_utc", "python"):
        assert meta[key], key
    assert meta["block_size"] == 16
    assert set(meta["scenarios"]) == set(probe.SCENARIOS)
    st = meta["step_time"]
    assert (st["base_s"], st["per_token_s"], st["per_seq_s"]) == (
        probe.STEP_BASE_S, probe.STEP_PER_TOKEN_S, probe.STEP_PER_SEQ_S)  # fmt: skip
    fit = meta["hostcost_fit"]
    assert set(fit["held_out"]) == {"decode", "decode+chunk", "prefills"}
    for part in fit["held_out"].values():
        assert 0 <= part["mape"] < 1 and part["rows"] > 0
    assert fit["all"]["b_s_per_seq"] > 0 and fit["all"]["c_s_per_token"] > 0


def test_iterations_respect_the_engine_limits():
    meta = json.loads((DATA / "meta.json").read_text())
    rows = _rows("iterations.csv")
    assert list(rows[0]) == probe.ITER_COLUMNS
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r["scenario"]].append(r)
    assert set(by) == set(meta["scenarios"])
    for name, its in by.items():
        spec = meta["scenarios"][name]
        assert [int(r["iter"]) for r in its] == list(range(len(its)))
        for r in its:
            dec, pre = int(r["num_decodes"]), int(r["prefill_tokens"])
            tok = int(r["scheduled_tokens"])
            chunks = [c.split(":") for c in r["prefill_chunks"].split(";") if c]
            assert tok == dec + pre == dec + sum(int(n) for _, n in chunks)
            assert len(chunks) == int(r["num_prefills"])
            assert 0 < tok <= spec["max_num_batched_tokens"]
            assert int(r["running"]) <= spec["max_num_seqs"]
            assert 0 <= int(r["kv_free_blocks"]) < spec["num_blocks"]
            # the simulated clock advanced by the probe's step function of this batch
            assert float(r["step_s"]) == pytest.approx(
                probe.step_time_s(tok, dec + len(chunks)), rel=1e-6)  # fmt: skip
            for col in ("schedule_cpu_s", "update_cpu_s", "schedule_wall_s", "update_wall_s"):
                assert float(r[col]) >= 0
        assert sum(int(r["preempted"]) for r in its) == sum(
            len([v for v in r["preempted_ids"].split(";") if v]) for r in its)  # fmt: skip


def test_requests_match_their_draws_and_finish():
    rows = _rows("requests.csv")
    assert list(rows[0]) == probe.REQ_COLUMNS
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r["scenario"]].append(r)
    for name, rs in by.items():
        drawn = probe.draw_requests(probe.SCENARIOS[name])  # the same seeded arrivals
        assert [(float(r["arrival_s"]), int(r["prompt_tokens"]), int(r["output_tokens"]))
                for r in rs] == drawn  # fmt: skip
        for r in rs:
            assert float(r["arrival_s"]) < float(r["first_token_s"]) <= float(r["finish_s"])


def test_hostcost_rows():
    rows = _rows("hostcost.csv")
    assert list(rows[0]) == probe.HOST_COLUMNS
    assert {r["family"] for r in rows} == {"decode", "decode+chunk", "prefills"}
    assert max(int(r["seqs"]) for r in rows) >= 1024
    for r in rows:
        lo, mid, hi = (float(r[c]) for c in ("total_cpu_s_min_round", "total_cpu_s",
                                             "total_cpu_s_max_round"))  # fmt: skip
        assert 0 < lo <= mid <= hi
        assert int(r["tokens"]) == int(r["decodes"]) + int(r["prefill_tokens"])


def test_probe_is_a_runner():
    forbidden = {"pydantic", "typer", "hardware_specs", "workloads", "costmodels", "simcli"}
    for path in (ROOT / "calibrate" / "engines").rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.split(".")[0])
        assert not names & forbidden, f"{path.name} imports {sorted(names & forbidden)}"


def test_compare_runs_and_sarathi_reproduces_v1_without_kv_pressure(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    rc = cmp.main(["--scheduler", "sarathi", "--scenarios", "poisson_chunked,kv_pressure",
                   "--json", str(out)])  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())["scenarios"]
    assert "poisson_chunked" in capsys.readouterr().out
    # no KV pressure, no simultaneous arrivals: V1's batches are sarathi's, iteration by
    # iteration (so finish times agree exactly)
    a = res["poisson_chunked"]
    assert a["same_composition_share"] == 1.0 and a["first_diff_iteration"] is None
    assert a["finish_diff_s_mean_abs"] < 1e-9
    # under KV pressure V1 admits on a chunk's blocks and preempts partial prefills
    b = res["kv_pressure"]
    assert b["preemptions_vllm"] > b["preemptions_simcli"]
    assert b["preempted_partial_prefills_vllm"] > 0


def test_compare_rejects_bad_input(capsys):
    assert cmp.main(["--scheduler", "nope"]) == 2
    assert "allowed:" in capsys.readouterr().err
    assert cmp.main(["--scenarios", "nope"]) == 2
    assert "allowed:" in capsys.readouterr().err


@pytest.mark.skipif("vllm-v1" not in cmp.SCHEDULERS, reason="no vllm-v1 scheduler kind yet")
def test_vllm_v1_kind_reproduces_v1_iteration_by_iteration(tmp_path):
    # every scenario without simultaneous arrivals (offline_seats has 300 at t = 0: the
    # event loop starts an iteration on the first, V1's engine drains its input queue)
    names = ["poisson_chunked", "poisson_8k", "kv_pressure", "long_prompts"]
    out = tmp_path / "v1.json"
    assert cmp.main(["--scheduler", "vllm-v1", "--scenarios", ",".join(names),
                     "--json", str(out)]) == 0  # fmt: skip
    for name, c in json.loads(out.read_text())["scenarios"].items():
        assert c["same_composition_share"] == 1.0, name
        assert c["iterations_vllm"] == c["iterations_simcli"], name
        assert c["preemptions_vllm"] == c["preemptions_simcli"], name
        assert c["finish_diff_s_mean_abs"] < 1e-9, name
