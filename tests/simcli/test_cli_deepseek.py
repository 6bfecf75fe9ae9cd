"""DeepSeek (MLA + fine-grained MoE) end to end through the CLI, and --moe-imbalance."""

import json

import pytest


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_models_show_deepseek(run):
    out = _json(run("models", "show", "deepseek-v2", "--format", "json"))
    assert out["kv_lora_rank"] == 512 and out["num_dense_layers"] == 1
    assert out["kv_cache_bytes_per_token_bf16"] == 60 * 576 * 2


def test_step_deepseek_decode_reads_the_latent_cache(run):
    args = ["step", "--model", "deepseek-v2-lite", "--gpu", "h100-sxm", "--phase", "decode"]
    out = _json(run(*args, "--batch", "8", "--context-len", "2048", "--format", "json"))
    assert out["kv_bytes_per_token"] == 27 * 576 * 2
    assert out["step_ms"] > 0 and out["breakdown_ms"]["kv_b_proj"] > 0
    # the latent is replicated over TP: every rank caches the whole of it
    tp2 = _json(run(*args, "--tp", "2", "--batch", "8", "--context-len", "2048",
                    "--format", "json"))  # fmt: skip
    assert tp2["kv_bytes_per_token"] == 2 * out["kv_bytes_per_token"]


@pytest.mark.parametrize("model", ["deepseek-v2-lite", "mixtral-8x7b"])
def test_step_imbalance_is_monotone(run, model):
    args = ["step", "--model", model, "--gpu", "h100-sxm", "--phase", "prefill",
            "--batch", "2", "--prompt-len", "1024", "--format", "json"]  # fmt: skip
    if model == "mixtral-8x7b":
        args += ["--tp", "2"]
    times = [_json(run(*args, "--moe-imbalance", f))["step_ms"] for f in ("1", "1.5", "3")]
    assert times[0] < times[1] < times[2]
    assert _json(run(*args))["step_ms"] == times[0]  # the default is balanced


def test_serve_deepseek_v3_fp8_on_8_h200(run):
    out = _json(
        run(
            "serve",
            "--model",
            "deepseek-v3",
            "--gpu",
            "h200-sxm",
            "--tp",
            "8",
            "--weight-dtype",
            "fp8",
            "--qps",
            "2",
            "--num-requests",
            "20",
            "--prompt-len",
            "fixed:512",
            "--output-len",
            "fixed:32",
            "--format",
            "json",
        )  # fmt: skip
    )
    assert out["requests_completed"] == 20 and out["tpot_s_p50"] > 0


def test_train_deepseek_with_ep_and_imbalance(run):
    args = ["train", "--model", "deepseek-v2-lite", "--gpu", "h100-sxm", "--gpus", "8",
            "--ep", "8", "--micro-batch", "1", "--global-batch", "16", "--seq-len", "2048",
            "--format", "json"]  # fmt: skip
    base = _json(run(*args))
    skew = _json(run(*args, "--moe-imbalance", "2"))
    assert base["iteration_s"] > 0 and 0 < base["mfu"] < 1
    assert skew["iteration_s"] > base["iteration_s"]


def test_plan_accepts_imbalance(run):
    out = _json(
        run(
            "plan",
            "--model",
            "deepseek-v2-lite",
            "--gpu",
            "h100-sxm",
            "--gpus",
            "8",
            "--seq-len",
            "2048",
            "--global-batch",
            "16",
            "--moe-imbalance",
            "1.5",
            "--format",
            "json",
        )  # fmt: skip
    )
    assert out["plans"]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--model", "llama3-8b", "--moe-imbalance", "2"], "dense"),
        (["--model", "deepseek-v2-lite", "--moe-imbalance", "0.5"], "moe-imbalance"),
    ],
)
def test_bad_imbalance_is_one_line_exit_2(run, args, match):
    result = run("step", *args, "--gpu", "h100-sxm", "--phase", "decode", "--batch", "1",
                 "--context-len", "16")  # fmt: skip
    assert result.exit_code == 2
    assert match in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("mixtral-8x7b", ["--gpus", "16", "--tp", "2", "--pp", "2", "--ep", "4"]),
        ("qwen1.5-moe-a2.7b", ["--gpus", "8", "--ep", "4"]),
    ],
)
def test_train_moe_with_grouped_experts_runs(run, model, extra):
    args = ["train", "--model", model, "--gpu", "h100-sxm", *extra, "--micro-batch", "1",
            "--global-batch", "16", "--seq-len", "2048", "--recompute", "full", "--zero", "1",
            "--format", "json"]  # fmt: skip
    out = _json(run(*args))
    assert out["iteration_s"] > 0 and 0 < out["mfu"] < 1
    skew = _json(run(*args, "--moe-imbalance", "2"))
    assert skew["iteration_s"] > out["iteration_s"]
