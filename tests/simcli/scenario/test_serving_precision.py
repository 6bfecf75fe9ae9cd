"""Serving precision and the max model length through the scenarios and the CLI:
``--weight-dtype`` / ``--kv-cache-dtype`` on ``step``, ``serve`` and ``serve plan``,
``serve --max-model-len``, ``serve plan --engine`` / ``--gpu-memory-utilization``."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from simcli.cli import app
from simcli.errors import set_debug
from simcli.scenario.serving import CandidateDeployments, resolve_serve, run_serve
from simcli.scenario.serving_options import ServeOptions
from simcli.serving.plan_inputs import SLO, Candidate, PlanSpace, Workload
from workloads.models import load_model


def cli(*argv: str):
    set_debug(False)
    return CliRunner().invoke(app, list(argv))


STEP = ("step", "--model", "llama3-8b", "--gpu", "h100-sxm", "--phase", "decode",
        "--batch", "1", "--context-len", "1024", "--format", "json")  # fmt: skip


def _step(*extra: str) -> dict:
    res = cli(*STEP, *extra)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_step_reports_and_prices_the_precision():
    bf16, int4 = _step(), _step("--weight-dtype", "int4")
    fp8kv = _step("--kv-cache-dtype", "fp8_e5m2")
    assert (bf16["weight_dtype"], bf16["kv_cache_dtype"]) == ("bf16", "bf16")
    assert (int4["weight_dtype"], fp8kv["kv_cache_dtype"]) == ("int4", "fp8")
    assert bf16["step_ms"] / int4["step_ms"] > 1.6  # 6.54 -> 3.69 ms
    assert int4["weight_gib_per_gpu"] < 0.4 * bf16["weight_gib_per_gpu"]
    assert int4["kv_capacity_tokens"] > bf16["kv_capacity_tokens"]
    assert fp8kv["kv_bytes_per_token"] == bf16["kv_bytes_per_token"] / 2
    assert fp8kv["kv_capacity_tokens"] == pytest.approx(2 * bf16["kv_capacity_tokens"], abs=16)
    fp16 = _step("--weight-dtype", "fp16")
    assert (fp16["weight_dtype"], fp16["kv_cache_dtype"]) == ("fp16", "fp16")


def test_step_kv_fit_uses_the_cache_dtype():
    # 64 x 8k on bf16 weights: more than the bf16 cache holds, within an fp8 one
    args = ("--batch", "64", "--context-len", "8000")
    assert not _step(*args)["kv_fits"]
    assert _step(*args, "--kv-cache-dtype", "fp8", "--weight-dtype", "fp8")["kv_fits"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ("step", "--model", "llama3-8b", "--gpu", "a100-sxm-80gb", "--phase", "decode",
             "--context-len", "10", "--weight-dtype", "fp8"),
            "error: --weight-dtype fp8 needs fp8 tensor cores, which a100-sxm-80gb lacks; "
            "allowed on a100-sxm-80gb: bf16, fp16, int8, int4",
        ),
        (
            ("serve", "--model", "llama3-8b", "--gpu", "a100-sxm-80gb", "--qps", "1",
             "--kv-cache-dtype", "fp8_e4m3"),
            "error: --kv-cache-dtype fp8_e4m3 needs fp8 support, which a100-sxm-80gb lacks; "
            "allowed on a100-sxm-80gb: auto, bf16, fp16",
        ),
        (
            ("serve", "plan", "--model", "llama3-8b", "--qps", "1", "--slo-ttft-s", "1",
             "--weight-dtype", "fp8", "--gpus-types", "h100-sxm,a100-sxm-80gb"),
            "error: --weight-dtype fp8 needs fp8 tensor cores, which a100-sxm-80gb lacks; "
            "allowed on a100-sxm-80gb: bf16, fp16, int8, int4 (or leave a100-sxm-80gb out "
            "of --gpus-types)",
        ),
        (
            ("step", "--model", "llama3-8b", "--gpu", "h100-sxm", "--phase", "decode",
             "--context-len", "10", "--weight-dtype", "int2"),
            "error: unknown --weight-dtype 'int2'; allowed: bf16, fp16, fp8, int8, int4, mxfp4",
        ),
        (
            ("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "1",
             "--kv-cache-dtype", "int8"),
            "error: unknown --kv-cache-dtype 'int8'; allowed: auto, bf16, fp16, fp8, "
            "fp8_e4m3, fp8_e5m2",
        ),
        (
            ("step", "--model", "llama3-8b", "--gpu", "h100-sxm", "--phase", "decode",
             "--context-len", "10", "--weight-dtype", "int4", "--engine", "pytorch-eager"),
            "error: --weight-dtype int4 with --engine pytorch-eager is not modelled (the plain "
            "PyTorch model runs unquantised weights); allowed: --engine vllm, or "
            "--weight-dtype bf16 or fp16",
        ),
        (
            ("serve", "plan", "--model", "llama3-8b", "--qps", "1", "--slo-ttft-s", "1",
             "--engine", "pytorch-eager", "--kv-cache-dtype", "fp8"),
            "error: --kv-cache-dtype fp8 with --engine pytorch-eager is not modelled; "
            "allowed: --engine vllm, or --kv-cache-dtype auto",
        ),
        (
            ("serve", "plan", "--model", "llama3-8b", "--qps", "1", "--slo-ttft-s", "1",
             "--gpu-memory-utilization", "0"),
            "error: --gpu-memory-utilization 0.0 is invalid; allowed: 0 < value <= 1",
        ),
        (
            ("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "1",
             "--max-model-len", "9000"),
            "error: --max-model-len 9000 exceeds llama3-8b's max_position_embeddings 8192; "
            "allowed: <= 8192",
        ),
    ],
)  # fmt: skip
def test_bad_precision_or_length_is_one_line(argv, line, tmp_path):
    out = tmp_path / "bundle"
    extra = ("--output", str(out)) if argv[0] == "serve" else ()
    res = cli(*argv, *extra)
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [line] and res.stdout == ""
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no partial output


SERVE = ("serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "4",
         "--num-requests", "60", "--prompt-len", "lognormal:1500:1:6000",
         "--output-len", "fixed:600", "--seed", "3", "--quiet")  # fmt: skip


def test_serve_refuses_and_caps_as_vllm_does(tmp_path):
    res = cli(*SERVE, "--max-model-len", "2048", "--format", "json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    rejected, capped = d["requests_rejected_too_long"], d["requests_output_capped"]
    assert d["max_model_len"] == 2048 and rejected > 0 and capped > 0
    assert d["requests_completed"] == 60 - rejected
    assert d["prompt_tokens"] + d["output_tokens"] <= 2048 * d["requests_completed"]
    default = json.loads(cli(*SERVE, "--format", "json").stdout)
    assert default["max_model_len"] == 8192 and default["requests_rejected_too_long"] == 0
    assert default["requests_completed"] == 60
    # the bundle: summary.csv carries the counts, requests.csv only the served requests
    out = tmp_path / "run"
    res = cli(*SERVE, "--max-model-len", "2048", "--output", str(out),
              "--report-qps-points", "0")  # fmt: skip
    assert res.exit_code == 0, res.output
    with open(out / "summary.csv") as fh:
        row = next(csv.DictReader(fh))
    assert int(row["requests_rejected_too_long"]) == rejected
    assert int(row["requests_output_capped"]) == capped and row["weight_dtype"] == "bf16"
    with open(out / "requests.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 60 - rejected
    assert all(int(r["prompt_tokens"]) + int(r["output_tokens"]) <= 2048 for r in rows)
    html = (out / "report.html").read_text()
    assert "requests_rejected_too_long" in html and "kv_cache_dtype" in html


def test_serve_precision_changes_capacity_and_speed():
    o = dict(model="llama3-8b", gpu="h100-sxm", qps=20.0, num_requests=200,
             prompt_len="fixed:1024", output_len="fixed:256")  # fmt: skip
    base = run_serve(resolve_serve(ServeOptions(**o))).output
    q = run_serve(resolve_serve(ServeOptions(**o, weight_dtype="int4", kv_cache_dtype="fp8")))
    out = q.output
    assert (out["weight_dtype"], out["kv_cache_dtype"]) == ("int4", "fp8")
    assert out["kv_capacity_tokens_per_replica"] > 2 * base["kv_capacity_tokens_per_replica"]
    assert out["tpot_s_p50"] < base["tpot_s_p50"]


def test_disaggregated_kv_transfer_moves_fp8_bytes():
    o = dict(model="llama3-8b", gpu="h100-sxm", qps=2.0, num_requests=30, replicas=2,
             prompt_len="fixed:2048", output_len="fixed:32", disaggregate=True,
             pd_ratio="1:1")  # fmt: skip
    bf16 = run_serve(resolve_serve(ServeOptions(**o))).output
    fp8 = run_serve(resolve_serve(ServeOptions(**o, kv_cache_dtype="fp8"))).output
    assert fp8["kv_transfer_bytes"] == pytest.approx(bf16["kv_transfer_bytes"] / 2)
    assert fp8["kv_transfer_s_mean"] < 0.6 * bf16["kv_transfer_s_mean"]


def test_serve_plan_candidates_carry_engine_memory_and_precision():
    model = load_model("llama3-8b")
    space = PlanSpace(gpus=("h100-sxm",), engine="vllm", gpu_memory_utilization=0.6,
                      weight_dtype="int8", kv_cache_dtype="fp8")  # fmt: skip
    slo, work = SLO(ttft_s=1.0), Workload(qps=2, num_requests=20)
    builder = CandidateDeployments(model, space, slo, work)
    cand = Candidate("h100-sxm", 1, "vllm", None)
    opts = builder.options(cand, 2)
    assert (opts.engine, opts.gpu_memory_utilization) == ("vllm", 0.6)
    assert (opts.weight_dtype, opts.kv_cache_dtype) == ("int8", "fp8")
    step = builder.step_model(cand)
    assert (step.weight_dtype, step.kv_cache_dtype) == ("int8", "fp8")
    served = resolve_serve(opts).deployment
    args = (np.array([300]), np.array([0]), np.array([500, 900]))
    assert served.step.step_s(*args) == step.step_s(*args)
    cfg = builder.serve_config(cand, 2)
    assert cfg == served.config and cfg.gpu_memory_utilization == 0.6


PLAN = ("serve", "plan", "--model", "llama3-8b", "--gpu-types", "h100-sxm", "--tp", "1",
        "--schedulers", "vllm", "--pd-ratios", "none", "--qps", "4", "--num-requests", "100",
        "--slo-ttft-s", "1", "--quiet", "--format", "json")  # fmt: skip


def test_serve_plan_reports_its_settings():
    d = json.loads(cli(*PLAN).stdout)
    assert (d["engine"], d["weight_dtype"], d["kv_cache_dtype"]) == ("vllm", "bf16", "auto")
    assert d["gpu_memory_utilization"] == 0.9 and d["max_model_len"] == 8192
    res = cli(*PLAN, "--weight-dtype", "int4", "--kv-cache-dtype", "fp8",
              "--gpu-memory-utilization", "0.5")  # fmt: skip
    assert res.exit_code == 0, res.output
    q = json.loads(res.stdout)
    assert (q["weight_dtype"], q["kv_cache_dtype"], q["gpu_memory_utilization"]) == (
        "int4", "fp8", 0.5
    )
    row, base = q["deployments"][0], d["deployments"][0]
    assert (row["weight_dtype"], row["kv_cache_dtype"], row["engine"]) == ("int4", "fp8", "vllm")
    assert row["kv_capacity_tokens_per_replica"] != base["kv_capacity_tokens_per_replica"]
    assert row["tpot_s_p50"] < base["tpot_s_p50"]
    csv_out = cli(*PLAN[:-2], "--format", "csv", "--weight-dtype", "int8").stdout
    header, first = csv_out.splitlines()[:2]
    cols = dict(zip(header.split(","), first.split(","), strict=True))
    assert cols["weight_dtype"] == "int8" and cols["engine"] == "vllm"


def test_serve_plan_refuses_and_caps_the_workload_like_serve():
    res = cli(*PLAN[:-2], "--format", "json", "--prompt-len", "lognormal:3000:1",
              "--output-len", "fixed:400")  # fmt: skip
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["requests_rejected_too_long"] > 0 and d["requests_output_capped"] > 0
    assert any("max model length 8192" in n for n in d["notes"])


def test_serve_plan_default_gpus_drop_those_without_fp8():
    """Asked for fp8 weights with the default GPU list, serve plan considers only the
    GPUs that run fp8 (a named A100 is refused, above)."""
    from simcli.scenario.serving_options import ServePlanOptions

    opts = ServePlanOptions(model="llama3-8b", qps=1.0, slo_ttft_s=1.0, weight_dtype="fp8")
    gpus = opts.space().gpus
    assert gpus and "a100-sxm-80gb" not in gpus and "h100-sxm" in gpus
    plain = ServePlanOptions(model="llama3-8b", qps=1.0, slo_ttft_s=1.0).space().gpus
    assert "a100-sxm-80gb" in plain
