"""``simcli serve`` / ``serve plan`` load flags end to end: --qps inf (offline, on the
compiled loop), --max-concurrency (closed loop), --qps-sweep, --gamma-shape (vLLM's
--burstiness), --dataset, --trace-format; bad combinations are one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from simcli.cli import app
from simcli.scenario.serving import resolve_arrivals
from simcli.scenario.serving_options import ServeOptions
from simcli.serving import fastpath
from simcli.serving.requests import SyntheticSpec, synthetic_requests
from workloads.lengths import parse_dist

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "traces"
BASE = ("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--quiet")
SMALL = ("--num-requests", "120", "--prompt-len", "uniform:64:512", "--output-len",
         "uniform:8:64")  # fmt: skip


def _json(*args: str) -> dict:
    res = CliRunner().invoke(app, [*BASE, *args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _error(*args: str) -> str:
    res = CliRunner().invoke(app, [*BASE, *args])
    assert res.exit_code != 0
    return " ".join(res.output.split())


def test_offline_every_request_at_zero_throughput_over_the_makespan():
    out = _json("--qps", "inf", *SMALL)
    assert out["arrivals"] == "qps inf"
    n, dur = out["requests_completed"], out["duration_s"]
    assert n == 120
    # as vllm bench serve reports them: tokens over the benchmark's duration
    assert out["throughput_tokens_per_s"] == pytest.approx(out["output_tokens"] / dur)
    assert out["total_tokens_per_s"] == pytest.approx(
        (out["output_tokens"] + out["prompt_tokens"]) / dur
    )
    assert "max_concurrency" not in out  # open loop: no closed-loop keys


def test_offline_arrays_take_the_compiled_loop():
    o = ServeOptions(model="llama3-8b", gpu="h100-sxm", qps=math.inf, num_requests=50)
    reqs = resolve_arrivals(o).requests()
    assert all(c.arrival_s.max() == 0 for c in reqs.chunks())
    from simcli.scenario.serving import resolve_serve

    sim = resolve_serve(o).simulator()
    assert fastpath.eligible(sim, reqs) == fastpath.HAVE_NUMBA


def test_closed_loop_keys_and_fewer_in_flight_means_slower():
    one = _json("--qps", "inf", "--max-concurrency", "1", *SMALL)
    many = _json("--qps", "inf", "--max-concurrency", "32", *SMALL)
    assert one["arrivals"] == "qps inf, max concurrency 1"
    assert one["max_concurrency"] == 1 and many["max_concurrency"] == 32
    assert one["mean_decode_batch"] <= 1.0  # one client: decodes one at a time
    assert 1 < many["mean_decode_batch"] <= 32
    assert one["duration_s"] > 5 * many["duration_s"]
    assert one["ttft_s_p50"] < many["ttft_s_p50"]  # no queue behind other requests
    assert one["client_wait_s_mean"] > many["client_wait_s_mean"] > 0


def test_qps_sweep_one_row_per_rate(tmp_path):
    out = _json("--qps-sweep", "2,8,inf", "--max-concurrency", "16", *SMALL)
    assert out["qps_sweep"] == [2.0, 8.0, "inf"]
    rows = out["runs"]
    assert [r["qps"] for r in rows] == [2.0, 8.0, "inf"]
    assert [r["arrivals"] for r in rows] == [
        "qps 2, max concurrency 16", "qps 8, max concurrency 16", "qps inf, max concurrency 16"
    ]  # fmt: skip
    tput = [r["throughput_requests_per_s"] for r in rows]
    assert tput[0] < tput[1] < tput[2]
    # the same run as a single --qps
    single = _json("--qps", "8", "--max-concurrency", "16", *SMALL)
    assert single["ttft_s_p99"] == rows[1]["ttft_s_p99"]
    csv_path = tmp_path / "sweep.csv"
    res = CliRunner().invoke(app, [*BASE, "--qps-sweep", "2,8", *SMALL, "--output", str(csv_path),
                                   "--format", "csv"])  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("qps,") and len(lines) == 3


def test_gamma_shape_is_vllms_burstiness():
    # vLLM: gaps ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)); CV = 1/sqrt(shape)
    o = ServeOptions(model="x", gpu="y", qps=5, gamma_shape=0.25)
    assert o.arrival_cv == pytest.approx(2.0)
    spec = SyntheticSpec(qps=5, num_requests=200_000, burstiness=o.arrival_cv,
                         prompt_len=parse_dist("8"), output_len=parse_dist("8"))  # fmt: skip
    a = np.concatenate([c.arrival_s for c in synthetic_requests(spec).chunks()])
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(1 / 5, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.03)
    same = ServeOptions(model="x", gpu="y", qps=5, burstiness=2.0)
    assert same.arrival_cv == o.arrival_cv


def test_dataset_flag_draws_correlated_pairs():
    o = ServeOptions(model="x", gpu="y", qps=5, dataset="splitwise-conv", num_requests=10)
    assert o.prompt_len == "dataset:splitwise-conv:input"
    assert o.output_len == "dataset:splitwise-conv:output"
    spec = resolve_arrivals(o).synthetic
    assert spec is not None and spec.joint is not None and spec.joint.name == "splitwise-conv"
    # an output DIST naming a dataset means its output side
    o2 = ServeOptions(model="x", gpu="y", qps=5, output_len="dataset:splitwise-code")
    assert o2.output_len == "dataset:splitwise-code:output"


def test_trace_formats_from_the_cli():
    out = _json("--trace", str(EXAMPLES / "mooncake.jsonl"))
    # the 9000-token prompt is beyond llama3-8b's 8192: refused, as vLLM refuses it
    assert out["requests_completed"] == 5 and out["requests_rejected_too_long"] == 1
    assert out["prompt_tokens"] == 20956 - 9000
    cols = "arrival=sent_ms,prompt=in_tok,output=out_tok"
    out = _json("--trace", str(EXAMPLES / "custom.csv"), "--trace-columns", cols,
                "--trace-time-unit", "ms")  # fmt: skip
    assert out["requests_completed"] == 5
    # lengths only: resampled under --qps, closed loop too
    out = _json("--trace", str(EXAMPLES / "vidur_lengths.csv"), "--qps", "inf",
                "--max-concurrency", "4", "--num-requests", "40")  # fmt: skip
    assert out["requests_completed"] == 40


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--qps", "1", "--qps-sweep", "1,2"), "--qps-sweep replaces --qps"),
        (("--qps-sweep", "1,-2"), "'-2' is not a rate"),
        (("--qps", "1", "--max-concurrency", "0"), "--max-concurrency 0 is invalid"),
        (("--qps", "1", "--gamma-shape", "0.5", "--burstiness", "2"), "say the same thing"),
        (("--qps", "1", "--dataset", "sharegptx"), "unknown dataset 'sharegptx'"),
        (("--qps", "1", "--dataset", "random", "--prompt-len", "64"), "--dataset random sets"),
        (("--qps", "1", "--trace-format", "azure"), "--trace-format needs --trace FILE"),
        (("--qps", "1", "--dataset", "random", "--trace", str(EXAMPLES / "burstgpt.csv")),
         "the trace's own lengths are used"),
        (("--qps", "nan"), "--qps nan is invalid"),
        (("--trace", str(EXAMPLES / "vidur_lengths.csv")), "no column 'arrived_at'"),
        (("--trace", str(EXAMPLES / "custom.csv")), "no known format"),
        (("--trace", str(EXAMPLES / "burstgpt.csv"), "--trace-format", "azure"),
         "no column 'TIMESTAMP', 'ContextTokens', 'GeneratedTokens'; its columns: Timestamp"),
    ],
)  # fmt: skip
def test_bad_load_flags_are_one_line(args, message):
    assert message in _error(*args)


def test_plan_takes_a_closed_loop_and_offline_load():
    res = CliRunner().invoke(app, [
        "serve", "plan", "--model", "llama3-8b", "--gpus-types", "h100-sxm", "--tp", "1",
        "--schedulers", "vllm", "--pd-ratios", "none", "--qps", "inf", "--max-concurrency",
        "8", "--dataset", "splitwise-code", "--num-requests", "150", "--slo-ttft-s", "2",
        "--slo-tpot-s", "0.05", "--quiet", "--format", "json",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["max_concurrency"] == 8
    assert out["prompt_len"] == "dataset:splitwise-code:input"
    dep = out["deployments"][0]
    assert dep["replicas"] >= 1 and dep["tpot_s_at_slo_percentile"] <= 0.05
