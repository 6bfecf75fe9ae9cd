"""gpt-oss, Gemma and Phi configs through every command, with their sliding-window
layers priced and their KV held as the layers need it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simcli.cli import app
from simcli.scenario.serving import ServeOptions, resolve_serve

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"
OSS = str(EXAMPLES / "gpt-oss-20b.config.json")
GEMMA3 = str(EXAMPLES / "gemma-3-27b.config.json")


def _json(args):
    res = runner.invoke(app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


HYBRIDS = [str(EXAMPLES / f"{n}.config.json") for n in ("nemotron-h-8b", "kimi-linear-48b-a3b")]
VL = str(EXAMPLES / "qwen2.5-vl-7b.config.json")


@pytest.mark.parametrize(
    "model", [OSS, GEMMA3, str(EXAMPLES / "phi-3-mini-4k.config.json"), *HYBRIDS, VL]
)
def test_every_command_runs(model):
    assert _json(["models", "show", model])["num_params"] > 1e9
    step = _json(["step", "--model", model, "--gpu", "h100-sxm", "--tp", "2", "--phase",
                  "decode", "--batch", "16", "--context-len", "2000"])  # fmt: skip
    assert step["step_ms"] > 0
    big = ["--ignore-memory"] if "kimi" in model else []  # 49B on 8 GPUs: priced anyway
    tp = "4" if model == VL else "8"  # Qwen2.5-VL-7B: 4 KV heads
    train = _json(["train", "--model", model, "--gpu", "h100-sxm", "--gpus", "8", "--tp", tp,
                   "--seq-len", "2048", "--global-batch", "16", *big])  # fmt: skip
    assert train["attn_pattern"] == load_native(model)
    serve = _json(["serve", "--model", model, "--gpu", "h100-sxm", "--tp", "2", "--qps", "2",
                   "--num-requests", "40", "--prompt-len", "fixed:1500", "--output-len",
                   "fixed:100"])  # fmt: skip
    assert serve["requests_completed"] == 40
    plan = _json(["serve", "plan", "--model", model, "--gpu-types", "h100-sxm", "--qps", "2",
                  "--num-requests", "40", "--prompt-len", "fixed:1500", "--output-len",
                  "fixed:100", "--slo-ttft-s", "2", "--tp", "2,4"])  # fmt: skip
    assert plan["deployments"] and plan["configs_feasible"] > 0
    comp = _json(["sparsity", "compare", "--model", model, "--gpu", "h100-sxm", "--tp", "2",
                  "--seq-len", "4096", "--patterns", "window:1024"])  # fmt: skip
    assert comp


def load_native(model):
    from workloads.models import load_model

    return load_model(model).native_attn_pattern


def test_the_native_windows_are_priced():
    """gpt-oss at 30k-token prompts: its sliding layers read 128 keys, so decode steps are
    cheaper than with every layer full (the same model under --attn-pattern causal)."""
    opts = dict(model=OSS, gpu="h100-sxm", qps=2.0, num_requests=30,
                prompt_len="fixed:30000", output_len="fixed:200", seed=1)  # fmt: skip
    tpot = {}
    for name, extra in (("own", {}), ("dense", {"attn_pattern": "causal"})):
        sc = resolve_serve(ServeOptions(**opts, **extra))
        tpot[name] = sc.simulator().run(list(sc.arrivals.requests())).summary["tpot_s_p50"]
    assert tpot["own"] < 0.9 * tpot["dense"]


@pytest.mark.parametrize("model", [OSS, GEMMA3])
def test_a_windowed_replica_seats_more_sequences(model):
    """KV follows each layer's kind: the sliding layers free blocks older than the
    window, so under KV pressure more requests decode at once than with full layers."""
    opts = dict(model=model, gpu="h100-sxm", tp=2, qps=1e9, num_requests=400,
                prompt_len="fixed:20000", output_len="fixed:300", seed=2,
                gpu_memory_utilization=0.6, max_batch_size=512)  # fmt: skip
    runs = {}
    for name, extra in (("own", {}), ("dense", {"attn_pattern": "causal"})):
        sc = resolve_serve(ServeOptions(**opts, **extra))
        runs[name] = sc.simulator().run(list(sc.arrivals.requests())).summary
    assert runs["own"]["mean_decode_batch"] > 1.5 * runs["dense"]["mean_decode_batch"]


def test_llama4_runs_with_its_chunks():
    scout = str(EXAMPLES / "llama-4-scout-17b-16e.config.json")
    base = ["step", "--model", scout, "--gpu", "h100-sxm", "--tp", "8", "--phase", "decode",
            "--batch", "32", "--context-len", "30000"]  # fmt: skip
    assert _json(base)["step_ms"] > 0
    serve = _json(["serve", "--model", scout, "--gpu", "h100-sxm", "--tp", "8",
                   "--weight-dtype", "fp8", "--qps", "1", "--num-requests", "20",
                   "--prompt-len", "fixed:20000", "--output-len", "fixed:100"])  # fmt: skip
    assert serve["requests_completed"] == 20


@pytest.mark.parametrize(
    ("name", "pp"),
    [("glm-4.5-air", "1"), ("minimax-m2", "1"), ("kimi-k2", "2"), ("deepseek-v3.2", "1")],
)
def test_the_2025_moe_models_step_and_serve(name, pp):
    """Kimi K2's 1T fp8 weights need 16 H200s (TP 8 x PP 2), as its deployments use."""
    model = str(EXAMPLES / f"{name}.config.json")
    par = ["--gpu", "h200-sxm", "--tp", "8", "--pp", pp, "--weight-dtype", "fp8"]
    step = _json(["step", "--model", model, *par, "--phase", "decode", "--batch", "64",
                  "--context-len", "4000"])  # fmt: skip
    assert step["step_ms"] > 0
    serve = _json(["serve", "--model", model, *par, "--qps", "2", "--num-requests", "20",
                   "--prompt-len", "fixed:2000", "--output-len", "fixed:100"])  # fmt: skip
    assert serve["requests_completed"] == 20


def test_transformers_style_frameworks_mask_the_local_layers():
    """Under --framework pytorch (transformers' SDPA) Phi-3's 2047-token window costs more
    than causal attention (a masked kernel); Megatron's fused window kernel costs less."""
    phi3 = str(EXAMPLES / "phi-3-mini-4k.config.json")
    base = ["train", "--model", phi3, "--gpu", "h200-sxm", "--gpus", "1", "--micro-batch", "1",
            "--global-batch", "1", "--seq-len", "4096"]  # fmt: skip

    def it(*extra):
        return _json([*base, *extra])["iteration_s"]

    assert it("--framework", "pytorch") > it("--framework", "pytorch", "--attn-pattern", "causal")
    assert it("--framework", "megatron") < it("--framework", "megatron", "--attn-pattern", "causal")


def test_plan_search_prices_the_local_layers_as_train_does():
    args = ["--model", GEMMA3, "--gpu", "h100-sxm", "--gpus", "16", "--seq-len", "4096",
            "--global-batch", "64"]  # fmt: skip
    best = _json(["plan", *args])["plans"][0]
    sp = "--sequence-parallel" if best["sequence_parallel"] else "--no-sequence-parallel"
    flags = ["--tp", best["tp"], "--pp", best["pp"], "--cp", best["cp"], "--tp-comm",
             best["tp_comm"], "--zero", best["zero"], "--micro-batch", best["micro_batch"],
             "--recompute", best["recompute"], sp]  # fmt: skip
    if best["cp"] > 1:
        flags += ["--cp-kind", best["cp_kind"]]
    train = _json(["train", *args, *[str(f) for f in flags]])
    assert train["iteration_s"] == pytest.approx(best["iteration_s"], rel=1e-9)


def test_sparsity_compare_adds_the_models_own_pattern():
    def patterns(model, given):
        out = _json(["sparsity", "compare", "--model", model, "--gpu", "h100-sxm", "--seq-len",
                     "8192", "--patterns", given])  # fmt: skip
        return [r["pattern"] for r in out["rows"]]

    own = "hybrid:dense_every=2,inner=window:128"
    assert patterns(OSS, "window:1024") == ["window:1024", own]
    assert patterns(OSS, own) == [own]  # not twice
    llama = str(EXAMPLES / "llama-3.2-1b.config.json")
    assert patterns(llama, "window:1024") == ["window:1024"]  # no local layers of its own
