"""simcli.scenario.serving: the serve / serve plan / step scenarios resolved once."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from costmodels.steps.serving import StepModel
from hardware_specs.prices import gpu_prices, host_copy_bytes_per_s
from simcli.cli import app
from simcli.errors import set_debug
from simcli.options import OptionError, validate
from simcli.scenario.serving import (
    CandidateDeployments,
    ServeOptions,
    ServePlanOptions,
    StepOptions,
    plan_deployments,
    resolve_arrivals,
    resolve_serve,
    resolve_serve_plan,
    resolve_step,
    run_serve,
    run_step,
)
from simcli.serving.plan_inputs import SLO, Candidate, PlanSpace, Workload
from workloads.models import load_model

H100_SWAP = host_copy_bytes_per_s(5)  # H100 SXM: PCIe 5.0 x16


def _serve(**kw) -> ServeOptions:
    base = dict(model="llama3-8b", gpu="h100-sxm", qps=4.0, num_requests=40)
    return ServeOptions(**{**base, **kw})


# --------------------------------------------------------------------------- serve


def test_resolve_serve_builds_everything_from_the_hardware():
    sc = resolve_serve(_serve(tp=2, scheduler="sarathi", chunk_size=256))
    dep = sc.deployment
    assert sc.model.id == "llama3-8b" and sc.drafts == ()
    assert dep.hardware.gpu_id == "h100-sxm" and dep.hardware.num_gpus == 2
    assert dep.step.cost_model is dep.hardware.cost_model
    assert (dep.step.tp, dep.step.pp, dep.step.engine) == (2, 1, "vllm")
    # max_num_seqs: vLLM V1's default on an 80 GB H100 (the engine profile)
    assert dep.step.max_num_batched_tokens == 256 and dep.step.max_num_seqs == 1024
    cfg = dep.config
    assert cfg.swap_bytes_per_s == dep.hardware.host_copy_bytes_per_s == H100_SWAP == 50e9
    assert cfg.price_per_gpu_hour == gpu_prices()["h100-sxm"].usd_per_gpu_hour
    assert cfg.gpus_per_replica == 2 and cfg.scheduler.kind == "sarathi"
    assert cfg.scheduler.max_tokens == max(sc.model.max_seq_len, 2048)
    assert 0 < dep.kv_capacity_tokens() == dep.step.kv_capacity_tokens(16, 0.9)
    assert sc.arrivals.expected == 40 and sc.arrivals.label == "qps 4"
    assert sc.title == "serving llama3-8b on 1 x 2 h100-sxm"


def test_resolve_serve_disaggregated_pools_and_price_override():
    o = _serve(disaggregate=True, replicas=3, pd_ratio="1:2", prefill_tp=2, price_per_gpu_hour=7)
    dep = resolve_serve(o).deployment
    d = dep.config.disaggregation
    assert d is not None and (d.prefill_replicas, d.decode_replicas) == (1, 2)
    assert (d.prefill_gpus_per_replica, d.decode_gpus_per_replica) == (2, 1)
    assert dep.prefill_hardware.num_gpus == 2 and dep.hardware.num_gpus == 1
    assert dep.prefill_step.tp == 2 and dep.step.tp == 1
    assert dep.prefill_step.cost_model is dep.prefill_hardware.cost_model
    assert dep.config.price_per_gpu_hour == 7 and dep.config.gpus == 4


def test_run_serve_keys_and_arrivals(tmp_path):
    sc = resolve_serve(_serve(output_len="fixed:8", prompt_len="fixed:64"))
    run = run_serve(sc)
    out = run.output
    assert out["requests_completed"] == 40 and out["arrivals"] == "qps 4"
    for key in ("ttft_s_p99", "tpot_s_p50", "goodput_requests_per_s", "price_per_gpu_hour"):
        assert key in out
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n0.5,20,3\n1.0,30,4\n")
    replay = resolve_arrivals(ServeOptions(trace=trace))
    assert replay.replay and replay.label == "trace" and replay.expected is None
    assert [r.prompt_tokens for r in replay.requests()] == [10, 20, 30]
    at, base_qps, _ = replay.at_rates(3)
    assert base_qps == pytest.approx(2.0)
    assert [r.arrival_s for r in at(2.0)] == [0.0, 0.25, 0.5]


def test_draft_with_another_vocabulary_is_one_line():
    with pytest.raises(ValueError, match="has a vocabulary of 32000 tokens"):
        resolve_serve(_serve(draft_model="llama2-7b"))


# --------------------------------------------------------------------------- one error line


@pytest.mark.parametrize(
    ("model", "values", "line"),
    [
        (ServeOptions, {"tp": 0}, "--tp 0 is invalid; allowed: 1 to 1024"),
        (
            ServeOptions,
            {"scheduler": "fifo"},
            "unknown --scheduler 'fifo'; allowed: vllm, orca, sarathi, vllm-v1, sglang, trtllm, "
            "priority, trtllm-max-util",
        ),
        (
            ServeOptions,
            {"gpu_memory_utilization": 1.5},
            "--gpu-memory-utilization 1.5 is invalid; allowed: 0 < value <= 1",
        ),
        (
            ServePlanOptions,
            {"model": "m", "qps": 1.0, "slo_ttft_s": 1.0, "tp": "1,x"},
            "--tp 1,x: not a comma list of integers; allowed: e.g. 1,2,4",
        ),
        (
            StepOptions,
            {"model": "m", "gpu": "g", "phase": "sideways"},
            "unknown --phase 'sideways'; allowed: prefill, decode, mixed",
        ),
    ],
)
def test_bad_value_names_flag_value_and_allowed(model, values, line):
    with pytest.raises(OptionError) as err:
        validate(model, values)
    assert str(err.value) == line


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "1", "--tp", "0"],
            "error: --tp 0 is invalid; allowed: 1 to 1024",
        ),
        (
            [
                "serve",
                "plan",
                "--model",
                "llama3-8b",
                "--qps",
                "1",
                "--slo-ttft-s",
                "1",
                "--chunk-sizes",
                "0",
            ],
            "error: --chunk-sizes 0: a value < 1; allowed: positive integers",
        ),  # fmt: skip
        (
            [
                "step",
                "--model",
                "llama3-8b",
                "--gpu",
                "h100-sxm",
                "--phase",
                "decode",
                "--context-len",
                "10",
                "--engine",
                "trt",
            ],
            "error: unknown --engine 'trt'; allowed: pytorch-eager, sglang, trtllm, "
            "trtllm-0.6, vllm, vllm-v0",
        ),  # fmt: skip
    ],
)
def test_cli_bad_value_is_one_line(argv, line):
    set_debug(False)
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [line] and res.stdout == ""


def test_step_says_when_the_batch_does_not_fit_the_kv_cache():
    set_debug(False)
    base = ["step", "--model", "llama3-8b", "--gpu", "h100-sxm", "--phase", "decode",
            "--context-len", "4095", "--format", "json"]  # fmt: skip
    small = CliRunner().invoke(app, [*base, "--batch", "8"])
    d = json.loads(small.stdout)
    assert d["kv_fits"] and d["kv_tokens_needed"] == 8 * 4096 and small.stderr == ""
    assert d["max_model_len"] == 8192  # llama3-8b's max_position_embeddings
    big = CliRunner().invoke(app, [*base, "--batch", "512"])
    d = json.loads(big.stdout)
    assert big.exit_code == 0 and not d["kv_fits"]
    assert d["kv_tokens_needed"] > d["kv_capacity_tokens"]
    assert big.stderr.startswith("warning: the batch's sequences need")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt-len", "9000"], "exceeds the max model length 8192"),
        (["--prompt-len", "2000", "--max-model-len", "1024"], "max model length 1024"),
        (["--prompt-len", "100", "--max-model-len", "100000"], "exceeds llama3-8b's"),
    ],
)
def test_step_refuses_sequences_beyond_the_max_model_len(extra, message):
    set_debug(False)
    res = CliRunner().invoke(app, ["step", "--model", "llama3-8b", "--gpu", "h100-sxm",
                                   "--phase", "prefill", *extra])  # fmt: skip
    assert res.exit_code == 2 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and message in res.stderr


# --------------------------------------------------------------------------- serve plan


CANDIDATES = [
    Candidate("h100-sxm", 1, "sarathi", 512),
    Candidate("h100-sxm", 2, "vllm", None),
    Candidate("h100-sxm", 1, "vllm", None, "1:2"),
    Candidate("a100-sxm-80gb", 1, "orca", None),
]


@pytest.fixture(scope="module")
def builder() -> CandidateDeployments:
    model = load_model("llama3-8b")
    space = PlanSpace(gpus=("h100-sxm", "a100-sxm-80gb"), prices={"a100-sxm-80gb": 1.25})
    slo = SLO(ttft_s=0.5, tpot_s=0.05)
    workload = Workload(qps=5, num_requests=60, prompt_len="fixed:256", output_len="fixed:16")
    return CandidateDeployments(model, space, slo, workload)


@pytest.mark.parametrize("candidate", CANDIDATES, ids=lambda c: c.label)
def test_serve_and_serve_plan_price_a_deployment_identically(builder, candidate):
    replicas = 3
    served = resolve_serve(builder.options(candidate, replicas)).deployment
    planned = builder.serve_config(candidate, replicas)
    assert planned == served.config  # same ServeConfig: scheduler, memory, swap rate, price
    swap = host_copy_bytes_per_s(served.hardware.gpu.pcie_gen)
    assert planned.swap_bytes_per_s == served.hardware.host_copy_bytes_per_s == swap
    assert planned.price_per_gpu_hour == builder.usd_per_gpu_hour(candidate.gpu)
    a, b = builder.step_model(candidate), served.step
    assert type(a) is type(b) is StepModel
    for attr in ("tp", "pp", "engine", "attn_backend", "max_num_batched_tokens", "max_num_seqs"):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert a.cost_model is b.cost_model  # one resolved cost model per (GPU, count)
    args = (np.array([300, 40]), np.array([0, 100]), np.array([500, 900, 1200]))
    assert a.step_s(*args) == b.step_s(*args)
    assert a.kv_capacity_tokens(16, 0.9) == b.kv_capacity_tokens(16, 0.9)


def test_h100_swap_rate_is_its_pcie_rate_in_both(builder):
    cfg = builder.serve_config(CANDIDATES[0], 1)
    assert cfg.swap_bytes_per_s == H100_SWAP == 50e9  # was 25e9 (ServeConfig's default)
    assert resolve_serve(_serve()).deployment.config.swap_bytes_per_s == 50e9


def test_serve_with_the_planned_flags_reproduces_the_deployment(builder):
    result = plan_deployments(
        builder.model,
        builder.workload,
        builder.slo,
        PlanSpace(gpus=("h100-sxm",), tp=(1,), schedulers=("vllm",), pd_ratios=(None,)),
        top=1,
    )
    best = result.deployments[0]
    options = builder.options(best.candidate, best.replicas)
    out = run_serve(resolve_serve(options)).output
    rec = best.record()
    for key in ("ttft_s_p99", "tpot_s_p99", "e2e_s_p99", "throughput_tokens_per_s"):
        assert out[key] == rec[key], key


def test_resolve_serve_plan():
    o = validate(
        ServePlanOptions,
        {
            "model": "llama3-8b",
            "qps": 3.0,
            "slo_tpot_s": 0.05,
            "gpu_types": "h100-sxm, h200-sxm",
            "tp": "1,2",
            "pd_ratios": "none,1:3",
            "price": "h100-sxm=2",
        },
    )
    sc = resolve_serve_plan(o)
    assert sc.space.gpus == ("h100-sxm", "h200-sxm") and sc.space.tp == (1, 2)
    assert sc.space.pd_ratios == (None, "1:3") and sc.space.prices == {"h100-sxm": 2.0}
    assert sc.workload.qps == 3.0 and sc.slo.tpot_s == 0.05 and sc.slo.ttft_s is None


# --------------------------------------------------------------------------- step


def test_resolve_and_run_step():
    o = validate(
        StepOptions,
        {"model": "llama3-8b", "gpu": "h100-sxm", "tp": 2, "phase": "decode", "batch": 8,
         "context_len": 1000},
    )  # fmt: skip
    sc = resolve_step(o)
    assert sc.hardware.num_gpus == 2 and sc.step.cost_model is sc.hardware.cost_model
    out = run_step(sc)
    assert out["decode_seqs"] == 8 and out["tokens"] == 8 and out["num_gpus"] == 2
    assert out["step_ms"] == pytest.approx(1e3 * sc.step.step_s(*sc.batch))
    assert sc.title == "llama3-8b decode step on 2 x h100-sxm (vllm)"


def test_every_option_field_documents_itself():
    for model in (ServeOptions, ServePlanOptions, StepOptions):
        schema = model.model_json_schema()
        for name, prop in schema["properties"].items():
            assert prop.get("description", "").strip(), f"{model.__name__}.{name}"
    json.dumps(ServeOptions.model_json_schema())
