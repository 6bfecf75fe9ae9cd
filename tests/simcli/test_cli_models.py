import json

import pytest

from workloads.models import model_ids


def test_models_list_json(run):
    result = run("models", "list", "--format", "json")
    assert result.exit_code == 0, result.output
    ids = [m["id"] for m in json.loads(result.stdout)["models"]]
    assert ids == model_ids()
    assert {"llama3-8b", "mixtral-8x7b", "gpt3-175b", "megatron-1t"} <= set(ids)


def test_models_show_builtin_and_hf_config(run, tmp_path):
    result = run("models", "show", "llama3-8b", "--format", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["num_params"] == 8_030_261_248
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    shown = run("models", "show", str(path), "--format", "json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["num_kv_heads"] == 2


def test_unknown_model_lists_ids(run):
    result = run("models", "show", "llama9")
    assert result.exit_code == 2
    assert "unknown model 'llama9'" in result.stderr and "llama3-8b" in result.stderr


def test_predict_layer_sums_its_ops(run):
    result = run(
        "predict",
        "layer",
        "--model",
        "llama3-8b",
        "--seq-len",
        "4096",
        "--tp",
        "2",
        "--phase",
        "fwdbwd",
        "--gpu",
        "h100-sxm",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["layer_ms"] == pytest.approx(sum(op["predicted_ms"] for op in data["ops"]))
    assert data["all_layers_ms"] == pytest.approx(32 * data["layer_ms"])
    names = {op["name"] for op in data["ops"]}
    assert {"qkv_proj", "attn", "attn_bwd", "mlp_down_wgrad"} <= names
    fwd = run(
        "predict",
        "layer",
        "--model",
        "llama3-8b",
        "--seq-len",
        "4096",
        "--tp",
        "2",
        "--gpu",
        "h100-sxm",
        "--format",
        "json",
    )
    assert 0 < json.loads(fwd.stdout)["layer_ms"] < data["layer_ms"]


def test_predict_layer_tp_across_nodes_is_slower(run):
    def layer_ms(tp):
        r = run(
            "predict",
            "layer",
            "--model",
            "llama3-70b",
            "--seq-len",
            "4096",
            "--tp",
            str(tp),
            "--gpu",
            "a100-sxm-80gb",
            "--format",
            "json",
        )
        assert r.exit_code == 0, r.output
        data = json.loads(r.stdout)
        return sum(op["predicted_ms"] for op in data["ops"] if op["op"] == "all_reduce")

    # a TP group of 16 spans two DGX A100 nodes: its all-reduces leave NVSwitch for the NICs
    assert layer_ms(16) > layer_ms(8)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama3-8b", "--seq-len", "128", "--tp", "3"], "valid tp: 1, 2, 4, 8"),
        (["--model", "nope", "--seq-len", "128"], "unknown model 'nope'"),
        (["--model", "llama3-8b", "--seq-len", "128", "--phase", "up"], "--phase"),
    ],
)
def test_predict_layer_bad_input(run, args, message):
    result = run("predict", "layer", *args, "--gpu", "h100-sxm")
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
