"""``--engine`` profiles, ``--attn-backend`` and ``--hardware`` on step, serve and serve
plan."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from simcli.cli import app

runner = CliRunner()
SERVE = ["serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "4",
         "--num-requests", "60", "--format", "json"]  # fmt: skip
STEP = ["step", "--model", "llama3-8b", "--gpu", "h200-sxm", "--phase", "decode",
        "--batch", "100", "--context-len", "2000", "--format", "json"]  # fmt: skip


def _json(args):
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_step_names_the_engine_profile_and_its_host_part():
    out = _json([*STEP, "--engine", "vllm"])
    assert out["engine"] == "vllm" and out["engine_version_family"].startswith("vllm>=0.8")
    assert out["attn_backend_decode"] == "flashinfer" and out["cuda_graph"] == "full"
    assert out["padded_tokens"] == 104  # 100 decodes replay the graph captured for 104
    assert out["breakdown_ms"]["host"] == pytest.approx(out["host_ms"])
    assert sum(out["breakdown_ms"].values()) == pytest.approx(out["step_ms"])
    sg = _json([*STEP, "--engine", "sglang", "--attn-backend", "flash"])
    assert sg["host_overlapped"] and sg["attn_backend_decode"] == "flash"


@pytest.mark.parametrize("command", [STEP, SERVE])
def test_a_bad_engine_is_one_line(command):
    res = runner.invoke(app, [*command, "--engine", "tgi"])
    assert res.exit_code != 0
    lines = [x for x in res.output.splitlines() if x.strip()]
    allowed = "allowed: pytorch-eager, sglang, trtllm, trtllm-0.6, vllm, vllm-v0"
    assert len(lines) == 1 and allowed in lines[0]


def test_serve_takes_the_engine_defaults_unless_given():
    out = _json([*SERVE, "--engine", "sglang"])
    assert out["engine"] == "sglang" and out["scheduler"] == "sglang"
    assert out["engine_version_family"].startswith("sglang")
    given = _json([*SERVE, "--engine", "trtllm", "--scheduler", "orca", "--attn-backend", "flash"])
    assert given["scheduler"] == "orca" and given["attn_backend_decode"] == "flash"


def test_serve_and_plan_take_a_hardware_file(tmp_path):
    bad = tmp_path / "nope.yaml"
    res = runner.invoke(app, [*SERVE, "--hardware", str(bad)])
    assert res.exit_code != 0 and "nope.yaml" in res.output
    plan = ["serve", "plan", "--model", "llama3-8b", "--gpu-types", "h100-sxm", "--tp", "1",
            "--qps", "3", "--num-requests", "100", "--slo-tpot-s", "0.05", "--schedulers",
            "vllm", "--pd-ratios", "none", "--engine", "vllm-v0", "--format", "json"]  # fmt: skip
    out = _json(plan)
    assert out["engine"] == "vllm-v0" and out["engine_version_family"].startswith("vllm 0.5")
    res = runner.invoke(app, [*plan, "--attn-backend", "nonsense"])
    assert res.exit_code != 0 and "allowed" in res.output


def test_a_gpu_from_the_hardware_file_serves_with_its_engine_defaults(tmp_path):
    from hardware_specs.registry import load_catalog

    gpu = load_catalog().gpu("h100-sxm").model_dump(mode="json")
    gpu.update(id="h100-custom", name="H100 with 141 GB", memory_gib=141.0)
    node = load_catalog().node("dgx-h100").model_dump(mode="json")
    node.update(id="custom-node", gpu="h100-custom")
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({"gpus": [gpu], "nodes": [node]}))
    hw = ["--gpu", "h100-custom", "--hardware", str(path)]
    step = _json([*STEP[:3], *STEP[5:], *hw, "--engine", "sglang"])
    assert step["gpu"] == "h100-custom" and step["attn_backend_decode"] == "flashinfer"  # Hopper
    serve = _json([*SERVE[:3], *SERVE[5:], *hw])
    assert serve["gpu"] == "h100-custom" and serve["scheduler"] == "vllm-v1"


def test_serve_plan_candidates_take_their_gpus_engine_defaults():
    """vLLM V1 seats 1024 sequences on an H100, 256 on an A100 (arg_utils' tiers)."""
    from simcli.scenario.serving import CandidateDeployments
    from simcli.serving.plan_inputs import SLO, Candidate, PlanSpace, Workload
    from workloads.models import load_model

    space = PlanSpace(gpus=("h100-sxm", "a100-sxm-80gb"), tp=(1,), pd_ratios=(None,))
    work = Workload(qps=1, num_requests=10, prompt_len="fixed:100", output_len="fixed:10")
    b = CandidateDeployments(load_model("llama3-8b"), space, SLO(ttft_s=1.0), work)
    h100 = b.options(Candidate("h100-sxm", 1, "sarathi", 512), 1)
    a100 = b.options(Candidate("a100-sxm-80gb", 1, "vllm", None), 1)
    assert (h100.max_batch_size, h100.chunk_size, h100.block_size) == (1024, 512, 16)
    assert (a100.max_batch_size, a100.scheduler) == (256, "vllm")
