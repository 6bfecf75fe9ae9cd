"""A sweep point is the command's library call: its outputs are what
``simcli <command> ... --format json`` prints, its error the line the command prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import simcli.cli
from simcli.errors import set_debug
from simcli.scenario import COMMANDS
from simcli.sweep.spec import expand, parse_spec, point_id
from simcli.sweep.target import SweepError, resolve
from tests.golden.cases import VOLATILE_KEYS

GPU = "h100-sxm"


def _clean(value):
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def cli(argv: list[str]):
    set_debug(False)
    return CliRunner().invoke(simcli.cli.app, ["--quiet", *argv])


def ops_csv(folder: Path) -> Path:
    path = folder / "ops.csv"
    path.write_text("op,dtype,m,n,k,bytes\ngemm,bf16,128,256,512,\ncopy,,,,,1024\n")
    return path


# (command, spec params, the same point as a command line written by hand)
# fmt: off
CASES = {
    "predict gemm": (
        {"gpu": GPU, "m": 4096, "n": 1024, "k": 512, "dtype": "fp8"},
        ["predict", "gemm", "--gpu", GPU, "--m", "4096", "--n", "1024", "--k", "512",
         "--dtype", "fp8"],
    ),
    "predict attention": (
        {"gpu": GPU, "seq-q": 4096, "heads-q": 32, "heads-kv": 8, "causal": False,
         "backend": "cudnn", "phase": "fwdbwd"},
        ["predict", "attention", "--gpu", GPU, "--seq-q", "4096", "--heads-q", "32",
         "--heads-kv", "8", "--no-causal", "--backend", "cudnn", "--phase", "fwdbwd"],
    ),
    "predict decode": (
        {"gpu": GPU, "batch": 32, "context-len": 4096, "heads-q": 32, "heads-kv": 8},
        ["predict", "decode", "--gpu", GPU, "--batch", "32", "--context-len", "4096",
         "--heads-q", "32", "--heads-kv", "8"],
    ),
    "predict blocksparse": (
        {"gpu": GPU, "seq-len": 32768, "heads-q": 16, "density": 0.05},
        ["predict", "blocksparse", "--gpu", GPU, "--seq-len", "32768", "--heads-q", "16",
         "--density", "0.05"],
    ),
    "predict collective": (
        {"gpu": GPU, "kind": "all_gather", "bytes": 1048576, "ranks": 16, "nodes": 2},
        ["predict", "collective", "--gpu", GPU, "--kind", "all_gather", "--bytes", "1048576",
         "--ranks", "16", "--nodes", "2"],
    ),
    "predict elementwise": (
        {"gpu": GPU, "op": "rmsnorm", "m": 8192, "n": 4096},
        ["predict", "elementwise", "--gpu", GPU, "--op", "rmsnorm", "--m", "8192", "--n", "4096"],
    ),
    "predict layer": (
        {"gpu": GPU, "model": "llama3-8b", "seq-len": 2048, "tp": 2, "phase": "fwdbwd",
         "sequence_parallel": "yes"},
        ["predict", "layer", "--gpu", GPU, "--model", "llama3-8b", "--seq-len", "2048", "--tp",
         "2", "--phase", "fwdbwd", "--sequence-parallel"],
    ),
    "step": (
        {"model": "llama3-8b", "gpu": GPU, "phase": "decode", "batch": 16, "context-len": 2048},
        ["step", "--model", "llama3-8b", "--gpu", GPU, "--phase", "decode", "--batch", "16",
         "--context-len", "2048"],
    ),
    "train": (
        {"model": "llama3-8b", "gpu": GPU, "gpus": 8, "tp": 2, "pp": 2, "layer-split": [15, 17],
         "global_batch": 16, "seq-len": 2048, "recompute": "selective"},
        ["train", "--model", "llama3-8b", "--gpu", GPU, "--gpus", "8", "--tp", "2", "--pp", "2",
         "--layer-split", "15,17", "--global-batch", "16", "--seq-len", "2048", "--recompute",
         "selective"],
    ),
    "plan": (
        {"model": "llama3-8b", "gpu": GPU, "gpus": 8, "seq-len": 2048, "global-batch": 16,
         "top": 2, "tp": [2, 4]},
        ["plan", "--model", "llama3-8b", "--gpu", GPU, "--gpus", "8", "--seq-len", "2048",
         "--global-batch", "16", "--top", "2", "--tp", "2,4"],
    ),
    "serve": (
        {"model": "llama3-8b", "gpu": GPU, "qps": 4, "num-requests": 50,
         "prompt-len": "fixed:512", "output-len": "fixed:64", "seed": 3},
        ["serve", "--model", "llama3-8b", "--gpu", GPU, "--qps", "4", "--num-requests", "50",
         "--prompt-len", "fixed:512", "--output-len", "fixed:64", "--seed", "3"],
    ),
    "sparsity": (
        {"model": "llama3-8b", "gpu": GPU, "seq-lens": [4096, 8192],
         "patterns": "dense;window:2048", "kernels-only": True},
        ["sparsity", "compare", "--model", "llama3-8b", "--gpu", GPU, "--seq-lens", "4096,8192",
         "--patterns", "dense;window:2048", "--kernels-only"],
    ),
}
# fmt: on


@pytest.mark.parametrize("command", sorted(CASES))
def test_point_outputs_are_what_the_command_prints(command):
    params, argv = CASES[command]
    target = resolve(command)
    outcome = target.run(params)
    assert outcome.ok, outcome.error
    res = cli([*argv, "--format", "json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert _clean(outcome.outputs) == _clean(printed)
    assert json.loads(outcome.outputs_json) == outcome.outputs
    # the point's command line, as the target writes it, is the same command
    again = cli(target.argv(params))
    assert again.exit_code == 0, again.output
    assert _clean(json.loads(again.stdout)) == _clean(printed)


def test_batch_predict_point_is_what_the_command_prints(tmp_path):
    src = ops_csv(tmp_path)
    outcome = resolve("predict").run({"gpu": GPU, "input": str(src)})
    res = cli(["predict", "--gpu", GPU, "--input", str(src), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert outcome.ok and outcome.outputs == json.loads(res.stdout)
    assert len(outcome.outputs["rows"]) == 2


def test_serve_plan_point_is_what_the_command_prints():
    params = {
        "model": "llama3-8b", "gpus-types": GPU, "tp": [1, 2], "schedulers": "sarathi",
        "chunk-sizes": 512, "pd-ratios": "none", "qps": 4, "num-requests": 60,
        "slo-ttft-s": 0.5, "slo-tpot-s": 0.05, "top": 2,
    }  # fmt: skip
    outcome = resolve("serve plan").run(params)
    assert outcome.ok, outcome.error
    res = cli([*resolve("serve plan").argv(params)])
    assert res.exit_code == 0, res.output
    assert _clean(outcome.outputs) == _clean(json.loads(res.stdout))


# (command, params, a text the line has): the point's error is the command's one line
# fmt: off
ERRORS = [
    ("train", {"model": "llama3-8b", "gpu": GPU, "gpus": 8, "global-batch": 64,
               "seq-len": 4096, "tp": 1}, "error: plan does not fit"),
    ("train", {"model": "llama3-8b", "gpu": GPU, "gpus": 8, "global-batch": 64,
               "seq-len": 4096, "tp": 0}, "error: --tp 0 is invalid; allowed: 1 to"),
    ("predict gemm", {"gpu": GPU, "m": 0, "n": 1, "k": 1}, "m"),
    ("predict gemm", {"gpu": "h900", "m": 1, "n": 1, "k": 1}, "unknown GPU 'h900'"),
    ("predict gemm", {"gpu": GPU, "m": 1, "n": 1, "k": 1, "dtype": "fp4"}, "dtype"),
    ("predict attention", {"gpu": GPU, "seq-q": 8, "heads-q": 8, "phase": "sideways"},
     "error: unknown --phase 'sideways'; allowed: fwd, bwd, fwdbwd"),
    ("sparsity", {"model": "llama3-8b", "gpu": GPU, "seq-lens": "8k"}, "--seq-lens"),
    ("predict", {"gpu": GPU}, "batch mode needs --gpu and --input"),
]
# fmt: on


@pytest.mark.parametrize(("command", "params", "needle"), ERRORS)
def test_point_error_is_the_line_the_command_prints(command, params, needle):
    target = resolve(command)
    outcome = target.run(params)
    assert not outcome.ok and outcome.outputs is None and outcome.outputs_json is None
    assert needle in outcome.error and "\n" not in outcome.error
    res = cli(target.argv(params))
    assert res.exit_code != 0
    assert res.stderr.strip().splitlines() == [outcome.error]


def test_missing_option_and_bad_type_are_one_line():
    outcome = resolve("predict gemm").run({"gpu": GPU, "m": 1, "n": 1})
    assert outcome.error == "error: Missing option '--k'."
    outcome = resolve("predict gemm").run({"gpu": GPU, "m": 1, "n": 1, "k": "big"})
    assert outcome.error.startswith("error: --k big: Input should be a valid integer")
    train = {"model": "llama3-8b", "gpu": GPU, "global-batch": 8, "seq-len": 2048}
    outcome = resolve("train").run({**train, "gpus": True})
    assert outcome.error.startswith("error: --gpus true: Input should be a valid integer")
    outcome = resolve("train").run({**train, "gpus": 8, "tpp": 2})
    assert outcome.error.startswith("error: params: 'tpp' is not an option of `simcli train`")
    assert "did you mean 'tp'?" in outcome.error


def test_values_as_the_command_line_takes_them():
    target = resolve("train")
    values = target.values(
        {"model": "llama3-8b", "gpus": 8, "layer-split": [15, 17], "sequence-parallel": "off",
         "seq-len": "4096", "dp": None, "ignore-memory": 1}
    )  # fmt: skip
    assert values == {
        "model": "llama3-8b",
        "gpus": 8,
        "layer_split": "15,17",
        "sequence_parallel": False,
        "seq_len": "4096",
        "ignore_memory": True,
    }
    assert resolve("serve").values({"prompt-len": 512, "qps": 2}) == {
        "prompt_len": "512",
        "qps": 2,
    }


def test_every_registered_command_is_sweepable():
    for name in COMMANDS:
        target = resolve(name)
        assert target.command == name and target.options
        assert target.scenario is COMMANDS[name]
    assert resolve("sparsity").command == "sparsity compare"
    assert resolve("predict collective").options["bytes"].field == "nbytes"
    assert resolve("train").options["sequence-parallel"].off_flag == "--no-sequence-parallel"


def test_output_options_are_not_parameters():
    with pytest.raises(SweepError) as err:
        parse_spec({"command": "train", "grid": {"output": ["x"]}}, "s.yaml")
    text = str(err.value)
    assert "'output' is not an option of `simcli train` (an output option" in text
    assert "allowed: activation-offload, activation-sparsity, attn-backend" in text


def test_point_ids_are_unchanged():
    """Ids hash the command and the params by spec name: stores made before resume."""
    points = expand(parse_spec({"command": "sparsity", "fixed": {"model": "m", "gpu": "g"},
                                "grid": {"seq_len": [8]}}))  # fmt: skip
    assert points[0].params == {"gpu": "g", "model": "m", "seq-len": 8}
    assert points[0].point_id == point_id("sparsity compare", points[0].params)
    # the ids the argv-driven sweep gave these points
    train = {
        "command": "train",
        "grid": {"gpu": [GPU], "tp": [1, 2]},
        "fixed": {"model": "llama3-8b", "seq_len": 4096, "global-batch": 64, "gpus": 8},
    }
    ids = [p.point_id for p in expand(parse_spec(train))]
    assert ids == ["8d77372d0d93e563c01b", "7986166933b85b0f4e99"]
