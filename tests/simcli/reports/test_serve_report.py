"""``simcli serve`` / ``serve plan`` --output DIR bundles, --trace-output, errors, progress."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from simcli.cli import app
from simcli.errors import set_debug
from simcli.reports.serve import CSV_SCHEMAS, histogram_cdf, qps_multipliers
from simcli.scenario.serving import plan_deployments
from simcli.serving.metrics import LogHistogram
from simcli.serving.planner import SLO, PlanSpace, Workload
from simcli.serving.requests import Request
from simcli.serving.simulator import ServeConfig, Simulator
from simcli.serving.timeline import SAMPLE_COLUMNS, StepRecorder
from tests.simcli.reports.browser import check_report
from tests.simcli.reports.trace_check import check_no_overlap, load_trace
from tests.simcli.test_serve import AffineStep

SERVE = ("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--replicas", "2", "--qps", "8",
         "--num-requests", "80", "--prompt-len", "uniform:64:512", "--output-len",
         "uniform:8:48", "--slo-ttft-s", "0.2", "--slo-tpot-s", "0.02")  # fmt: skip
SWEEP = ("--report-qps-points", "3", "--report-requests", "40")
PLAN = ("serve", "plan", "--model", "llama3-8b", "--gpus-types", "h100-sxm,a100-sxm-80gb",
        "--tp", "1", "--schedulers", "vllm", "--pd-ratios", "none,1:1", "--qps", "20",
        "--num-requests", "120", "--prompt-len", "uniform:64:512", "--output-len",
        "uniform:8:64", "--slo-ttft-s", "0.3", "--slo-tpot-s", "0.03")  # fmt: skip
SERVE_FILES = {"requests.csv", "summary.csv", "timeline.csv", "replicas.csv", "qps_sweep.csv",
               "config.json", "report.html"}  # fmt: skip


def invoke(*args: str):
    set_debug(False)
    return CliRunner().invoke(app, list(args))


def _headers_match(folder, names) -> None:
    for name in names:
        got = list(pd.read_csv(folder / name, nrows=0).columns)
        assert got == list(CSV_SCHEMAS[name]), name


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    out, trace = tmp / "run", tmp / "steps.json"
    res = invoke(*SERVE, *SWEEP, "--output", str(out), "--trace-output", str(trace),
                 "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    return res, out, trace


def test_serve_bundle_files_schemas_and_config(served):
    res, out, _ = served
    result = json.loads(res.stdout)  # stdout stays one clean JSON object
    assert result["requests_completed"] == 80
    assert {p.name for p in out.iterdir()} == SERVE_FILES
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staging left
    _headers_match(out, SERVE_FILES - {"config.json", "report.html"})
    reqs = pd.read_csv(out / "requests.csv")
    assert len(reqs) == 80 and (reqs.e2e_s >= reqs.ttft_s).all()
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 1
    assert summary.ttft_s_p99[0] == pytest.approx(result["ttft_s_p99"], rel=1e-5)
    sweep = pd.read_csv(out / "qps_sweep.csv")
    assert sweep.offered_qps.tolist() == pytest.approx([8 * m for m in qps_multipliers(3)])
    assert (sweep.requests_completed == 40).all()
    tl = pd.read_csv(out / "timeline.csv")
    assert set(tl.replica) == {0, 1} and (tl.kv_blocks_used <= tl.kv_blocks_total).all()
    assert (tl.groupby("replica").time_s.diff().dropna() >= 0).all()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["command"] == "serve" and cfg["simcli_version"]
    inputs = cfg["inputs"]
    assert inputs["qps"] == 8 and inputs["replicas"] == 2 and inputs["seed"] == 0
    # defaults resolved, not just what was typed: vLLM V1's on an H100 (engine profile)
    assert inputs["scheduler"] == "vllm-v1" and inputs["chunk_size"] == 8192
    resolved = cfg["resolved"]
    assert resolved["model_id"] == "llama3-8b" and resolved["gpu"] == "h100-sxm"
    assert "h100-sxm" in resolved["cost_model"]
    assert resolved["serve_config"]["replicas"] == 2
    assert resolved["serve_config"]["scheduler"]["max_tokens"] == resolved["max_tokens"]
    assert resolved["report"]["requests_per_point"] == 40


def test_serve_report_renders(served, tmp_path):
    _, out, _ = served
    rendered = check_report(out / "report.html", tmp_path, min_svgs=3)
    for text in ("Latency distributions", "QPS sweep", "Timeline", "re-simulating"):
        assert text in rendered.text, text


def test_serve_trace_is_valid_chrome_json(served):
    res, _, trace = served
    doc = json.loads(trace.read_text())
    assert doc["otherData"]["steps_left_out"] == 0
    events = load_trace(trace)
    check_no_overlap(events)
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {0: "replica 0 (mixed)", 1: "replica 1 (mixed)"}
    steps = [e for e in events if e["ph"] == "X"]
    assert len(steps) == json.loads(res.stdout)["iterations"]
    for e in steps:
        assert {"batch_seqs", "prefill_tokens", "decode_tokens"} <= set(e["args"])
    tracks: dict[tuple, list[float]] = {}
    for e in events:
        if e["ph"] != "M":
            key = (e["pid"], e["tid"], e["ph"] == "C" and e["name"])
            tracks.setdefault(key, []).append(e["ts"])
    for key, ts in tracks.items():
        assert ts == sorted(ts), f"time goes backwards on {key}"
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"KV blocks used", "queued sequences"}
    begins = [e for e in events if e["ph"] == "b" and e["name"].startswith("request ")]
    assert len(begins) == 80
    assert sum(e["ph"] == "b" for e in events) == sum(e["ph"] == "e" for e in events)


def test_disaggregated_trace_names_pools_and_stdout_clean(tmp_path):
    trace = tmp_path / "pd.json"
    res = invoke("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--disaggregate",
                 "--prefill-replicas", "1", "--decode-replicas", "2", "--qps", "4",
                 "--num-requests", "30", "--output-len", "fixed:16", "--trace-output",
                 str(trace), "--quiet", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["requests_completed"] == 30
    events = load_trace(trace)
    check_no_overlap(events)
    procs = sorted(e["args"]["name"] for e in events if e["name"] == "process_name")
    assert procs == ["replica 0 (prefill)", "replica 1 (decode)", "replica 2 (decode)"]
    assert [p.name for p in tmp_path.iterdir()] == ["pd.json"]


def test_replayed_trace_sweeps_its_own_rate(tmp_path):
    rows = "".join(f"{0.25 * i},{100 + 10 * i},{4 + i % 3}\n" for i in range(21))
    arrivals = tmp_path / "arrivals.csv"
    arrivals.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    out = tmp_path / "replay"
    res = invoke("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--trace", str(arrivals),
                 "--output", str(out), "--report-qps-points", "2", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    sweep = pd.read_csv(out / "qps_sweep.csv")
    assert sweep.offered_qps.tolist() == pytest.approx([4 * 0.25, 4 * 2.0])  # 20 gaps in 5 s
    assert len(pd.read_csv(out / "requests.csv")) == 21
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["resolved"]["arrivals"] == "trace"


def test_sweep_off(tmp_path):
    out = tmp_path / "nosweep"
    res = invoke(*SERVE, "--num-requests", "20", "--report-qps-points", "0", "--output", str(out))
    assert res.exit_code == 0, res.output
    assert "qps_sweep.csv" not in {p.name for p in out.iterdir()}
    assert "QPS sweep off" in (out / "report.html").read_text()


@pytest.mark.parametrize("where", ["missing_parent", "is_a_file", "trace_dir_missing",
                                   "trace_is_dir"])  # fmt: skip
def test_bad_paths_are_one_line_and_write_nothing(tmp_path, where):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    args = {
        "missing_parent": ("--output", str(tmp_path / "no" / "dir")),
        "is_a_file": ("--output", str(tmp_path / "afile")),
        "trace_dir_missing": (
            "--output",
            str(tmp_path / "o"),
            "--trace-output",
            str(tmp_path / "no" / "t.json"),
        ),  # fmt: skip
        "trace_is_dir": ("--trace-output", str(tmp_path / "adir")),
    }[where]
    res = invoke(*SERVE, *args, "--format", "json")
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert res.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]
    assert list((tmp_path / "adir").iterdir()) == []


def test_failure_mid_run_leaves_no_bundle(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n" + "1,50,5\n" * 50
                     + "2,-3,4\n")  # fmt: skip
    outputs = ("--output", str(tmp_path / "o"), "--trace-output", str(tmp_path / "t.json"))
    res = invoke("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--trace", str(trace),
                 *outputs)  # fmt: skip
    assert res.exit_code == 2 and "prompt_tokens '-3' is invalid" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.csv"]


# --------------------------------------------------------------------------- serve plan


def test_serve_plan_bundle(tmp_path):
    out = tmp_path / "plan"
    res = invoke(*PLAN, "--output", str(out), "--quiet", "--format", "json")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    files = {"plans.csv", "deployments.csv", "config.json", "report.html"}
    assert {p.name for p in out.iterdir()} == files
    _headers_match(out, ("plans.csv", "deployments.csv"))
    plans = pd.read_csv(out / "plans.csv")
    assert len(plans) >= len(result["deployments"])
    assert plans.config.nunique() == result["configs_evaluated"]
    ranked = plans[plans.status == "ranked"].sort_values("rank")
    assert ranked["rank"].tolist() == [d["rank"] for d in result["deployments"]]
    assert ranked.meets_slo.all()
    assert set(plans.status) <= {"ranked", "meets_slo", "misses_slo", "stopped_early",
                                 "skipped", "infeasible", "pruned"}  # fmt: skip
    deps = pd.read_csv(out / "deployments.csv")
    assert deps.usd_per_hour.tolist() == pytest.approx(
        [d["usd_per_hour"] for d in result["deployments"]]
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["command"] == "serve plan" and cfg["inputs"]["qps"] == 20
    assert cfg["inputs"]["attainment"] == 0.9  # a default, resolved
    assert cfg["resolved"]["space"]["gpus"] == ["h100-sxm", "a100-sxm-80gb"]
    assert set(cfg["resolved"]["usd_per_gpu_hour"]) == {"h100-sxm", "a100-sxm-80gb"}
    rendered = check_report(out / "report.html", tmp_path, min_svgs=1)
    assert "Ranking" in rendered.text and "Cost against latency" in rendered.text


def test_serve_plan_bad_output_writes_nothing(tmp_path):
    res = invoke(*PLAN, "--output", str(tmp_path / "no" / "dir"))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "does not exist" in res.stderr
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- hooks


def _requests(n: int, gap_s: float = 0.01) -> list[Request]:
    return [Request(i, i * gap_s, 64 + i % 50, 8 + i % 7) for i in range(n)]


def test_simulator_progress_and_bounded_timeline():
    calls: list[tuple[int, int | None]] = []
    rec = StepRecorder(max_samples=120)
    sim = Simulator(
        AffineStep(),
        ServeConfig(replicas=2),
        progress=lambda d, t: calls.append((d, t)),
        progress_total=1000,
        recorder=rec,
    )
    sim.run(_requests(1000))
    assert calls[-1] == (1000, 1000) and len(calls) <= 202
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    rows = rec.samples()
    assert sim.metrics.iterations > 1000
    assert 0 < len(rows) <= 120 and set(rows[0]) == set(SAMPLE_COLUMNS)
    assert {r["replica"] for r in rows} == {0, 1}
    assert rec.steps == [] and rec.requests == []  # no trace asked for


def test_trace_caps_steps_and_requests():
    rec = StepRecorder(max_trace_steps=50, max_trace_requests=10)
    sim = Simulator(AffineStep(), ServeConfig(), recorder=rec)
    sim.run(_requests(200))
    doc = rec.trace_document()
    assert doc["otherData"]["steps_traced"] == 50
    assert doc["otherData"]["steps_left_out"] == sim.metrics.iterations - 50
    assert doc["otherData"]["requests_traced"] == 10
    assert doc["otherData"]["requests_left_out"] == 190


def test_planner_progress_counts_every_config():
    calls: list[tuple[int, int]] = []
    plan_deployments(
        "llama3-8b",
        Workload(qps=10, num_requests=60, prompt_len="fixed:128", output_len="fixed:16"),
        SLO(ttft_s=1.0),
        PlanSpace(gpus=("h100-sxm",), tp=(1, 2), schedulers=("vllm",), pd_ratios=(None,)),
        top=1,
        progress=lambda d, t: calls.append((d, t)),
    )
    assert calls == [(1, 2), (2, 2)]


def test_histogram_cdf_matches_samples():
    rng = np.random.default_rng(0)
    values = rng.lognormal(-3, 1, 5000)
    hist = LogHistogram()
    for v in values:
        hist.add(float(v))
    x, y = histogram_cdf(hist)
    assert y[0] == 0 and y[-1] == pytest.approx(1.0) and (np.diff(y) >= 0).all()
    assert x[0] == values.min() and x[-1] == values.max()
    # the fraction at each edge is the exact empirical CDF there (within a bucket's 1%)
    for xi, yi in list(zip(x, y, strict=True))[1::200]:
        assert (values <= xi * 1.0101).mean() >= yi >= (values <= xi / 1.0101).mean()


def test_progress_is_wired_to_bars(monkeypatch, tmp_path):
    """serve: requests completed of total, then sweep points; serve plan: configs settled."""
    from contextlib import contextmanager

    from simcli.commands import serve as serve_cmd
    from simcli.commands import serve_plan as plan_cmd

    seen: dict[str, list] = {}

    @contextmanager
    def fake_bar(label, total=None, fields=()):
        calls = seen.setdefault(label, [])
        yield lambda done=None, total=None, **kw: calls.append((done, total))

    monkeypatch.setattr(serve_cmd, "progress_bar", fake_bar)
    monkeypatch.setattr(plan_cmd, "progress_bar", fake_bar)
    res = invoke(*SERVE, "--report-qps-points", "2", "--report-requests", "20",
                 "--output", str(tmp_path / "o"), "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert seen["simulating requests"][-1] == (80, 80)
    assert seen["QPS sweep"] == [(1, 2), (2, 2)]
    res = invoke(*PLAN, "--format", "json")
    assert res.exit_code == 0, res.output
    evaluated = json.loads(res.stdout)["configs_evaluated"]
    assert seen["serve plan: configs"][-1] == (evaluated, evaluated)
