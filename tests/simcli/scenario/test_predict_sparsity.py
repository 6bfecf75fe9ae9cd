"""simcli.scenario.predict, simcli.scenario.sparsity and simcli.scenario.registry: the configs
are the commands' options, the run functions return what the commands print, and every
results command is registered."""

from __future__ import annotations

import json

import pydantic
import pytest
import typer
from typer.testing import CliRunner

import simcli.cli
from simcli.errors import set_debug
from simcli.options import OptionError, flags, validate
from simcli.scenario import (
    COMMANDS,
    AttentionConfig,
    GemmConfig,
    LayerConfig,
    PredictBatchConfig,
    SparsityConfig,
    resolve_layer,
    resolve_op,
    resolve_predict_batch,
    resolve_sparsity,
    run_layer,
    run_op,
    run_predict_batch,
    run_sparsity,
    scenario_command,
)
from simcli.scenario.registry import UnknownCommand
from simcli.sparsity.whatif import WhatIfError
from workloads.ops import OpError

runner = CliRunner()
PATHS = [tuple(name.split()) for name in COMMANDS]


def _command(path: tuple[str, ...]):
    cmd = typer.main.get_command(simcli.cli.app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


def _options(path: tuple[str, ...]) -> list:
    return [p for p in _command(path).params if getattr(p, "param_type_name", "") == "option"]


def cli_json(*args: str) -> dict:
    set_debug(False)
    res = runner.invoke(simcli.cli.app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_options_are_the_registered_config_fields(path):
    """One way to configure, for every registered command: each field is an option with its
    flag, default and help; the only other options say where the results go."""
    config = scenario_command(" ".join(path)).config
    by_name = {p.name: p for p in _options(path)}
    for field_name, field in config.model_fields.items():
        option = by_name.pop(field_name)
        assert flags(field_name, field)[0].split("/")[0] in option.opts
        if not field.is_required():
            assert option.default == field.default, field_name
        assert field.description, field_name
        assert option.help and option.help.strip(), option.opts
    output_only = {"trace", "trace_output", "trace_max_steps", "report_qps_points"}
    output_only |= {"report_requests", "output", "output_csv", "quiet", "fmt"}
    assert set(by_name) <= output_only, set(by_name)


# fmt: off
FLAGS = {
    ("predict",): ["--gpu", "--input", "--output", "--profile", "--hardware", "--format"],
    ("predict", "gemm"): ["--m", "--n", "--k", "--batch", "--dtype", "--gpu", "--profile",
                          "--hardware", "--format", "--output"],
    ("predict", "attention"): ["--phase", "--batch", "--seq-q", "--seq-kv", "--heads-q",
                               "--heads-kv", "--head-dim", "--causal", "--no-causal",
                               "--backend", "--dtype", "--gpu"],
    ("predict", "decode"): ["--batch", "--context-len", "--seq-q", "--heads-q", "--heads-kv",
                            "--head-dim", "--dtype", "--gpu"],
    ("predict", "blocksparse"): ["--phase", "--batch", "--seq-len", "--heads-q", "--heads-kv",
                                 "--head-dim", "--density", "--block-size", "--backend"],
    ("predict", "collective"): ["--kind", "--bytes", "--ranks", "--nodes", "--gpu"],
    ("predict", "elementwise"): ["--op", "--m", "--n", "--bytes", "--dtype", "--gpu"],
    ("predict", "layer"): ["--model", "--batch", "--seq-len", "--tp", "--phase",
                           "--sequence-parallel", "--no-sequence-parallel", "--backend",
                           "--dtype", "--gpu", "--profile", "--hardware"],
    ("sparsity", "compare"): ["--model", "--gpu", "--seq-len", "--seq-lens", "--patterns",
                              "--tp", "--batch", "--context-len", "--gqa-groups", "--train-gpus",
                              "--global-batch", "--micro-batch", "--recompute", "--kernels-only",
                              "--format", "--output", "--quiet"],
}
# fmt: on


@pytest.mark.parametrize("path", sorted(FLAGS), ids=" ".join)
def test_contract_flags_are_unchanged(path):
    spelled = {o for p in _options(path) for o in (*p.opts, *p.secondary_opts)}
    assert set(FLAGS[path]) <= spelled, set(FLAGS[path]) - spelled


def test_json_schema_comes_from_the_fields():
    schema = GemmConfig.model_json_schema()
    json.dumps(schema)
    assert schema["required"] == ["m", "n", "k", "gpu"]
    assert "Independent products" in schema["properties"]["batch"]["description"]
    assert (
        "comma list" in SparsityConfig.model_json_schema()["properties"]["seq_lens"]["description"]
    )


# --------------------------------------------------------------------------- runs


def test_run_op_is_what_the_command_prints():
    config = AttentionConfig(seq_q=4096, heads_q=32, heads_kv=8, causal=False, gpu="h100-sxm")
    got = run_op(resolve_op(config)).to_dict()
    want = cli_json("predict", "attention", "--seq-q", "4096", "--heads-q", "32",
                    "--heads-kv", "8", "--no-causal", "--gpu", "h100-sxm")  # fmt: skip
    assert got == want
    assert got["op"] == "attn_fwd" and got["predicted_ms"] > 0


def test_run_layer_is_what_the_command_prints():
    config = LayerConfig(model="llama3-8b", seq_len=2048, tp=2, phase="fwdbwd", gpu="h100-sxm")
    pred = run_layer(resolve_layer(config))
    want = cli_json("predict", "layer", "--model", "llama3-8b", "--seq-len", "2048", "--tp",
                    "2", "--phase", "fwdbwd", "--gpu", "h100-sxm")  # fmt: skip
    assert pred.to_dict() == want
    assert pred.layer_ms == pytest.approx(sum(r["predicted_ms"] for r in want["ops"]))
    assert {r["phase"] for r in pred.rows} == {"fwd", "bwd"}


def test_run_predict_batch_is_what_the_command_prints(tmp_path):
    src = tmp_path / "ops.csv"
    src.write_text("op,m,n,k,bytes\ngemm,128,256,512,\ncopy,,,,1024\n")
    batch = run_predict_batch(resolve_predict_batch(PredictBatchConfig(gpu="h100-sxm",
                                                                       input_csv=src)))  # fmt: skip
    assert batch.to_dict() == cli_json("predict", "--gpu", "h100-sxm", "--input", str(src))
    assert batch.summary()["rows"] == 2 and len(batch.records()) == 2


def test_run_sparsity_is_what_the_command_prints():
    config = SparsityConfig(
        model="llama3-8b", gpu="h100-sxm", seq_lens="4096,8192,4096", patterns="dense,window:2048",
        kernels_only=True,
    )  # fmt: skip
    scenario = resolve_sparsity(config)
    assert scenario.seq_lens == (4096, 8192)  # deduplicated, in order
    got = run_sparsity(scenario).to_dict()
    want = cli_json("sparsity", "compare", "--model", "llama3-8b", "--gpu", "h100-sxm",
                    "--seq-lens", "4096,8192,4096", "--patterns", "dense,window:2048",
                    "--kernels-only")  # fmt: skip
    got.pop("seconds"), want.pop("seconds")
    assert got == json.loads(json.dumps(want)) and len(got["rows"]) == 4


def test_progress_sees_every_length():
    config = SparsityConfig(model="llama3-8b", gpu="h100-sxm", seq_len=4096, kernels_only=True,
                            patterns="dense")  # fmt: skip
    seen: list[int] = []
    run = run_sparsity(resolve_sparsity(config), curve_lens=[2048, 4096], progress=seen.append)
    assert seen == [1, 2, 3] and len(run.curve_rows) == 2 and len(run.rows) == 1


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (AttentionConfig(seq_q=8, heads_q=8, phase="up", gpu="h100-sxm"),
         "unknown --phase 'up'; allowed: fwd, bwd, fwdbwd"),
        (GemmConfig(m=1, n=1, k=1, gpu="h900"), "unknown GPU 'h900'"),
    ],
)  # fmt: skip
def test_resolver_errors_are_one_line(config, message):
    with pytest.raises(ValueError) as err:
        resolve_op(config)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_op_field_is_the_ops_validation_error():
    # the command prints its first error as one line (simcli.errors.user_errors)
    with pytest.raises(pydantic.ValidationError) as err:
        resolve_op(GemmConfig(m=0, n=1, k=1, gpu="h100-sxm"))
    assert err.value.errors()[0]["loc"] == ("m",)


def test_batch_needs_gpu_and_input_and_sparsity_one_length():
    with pytest.raises(OpError, match="batch mode needs --gpu and --input"):
        resolve_predict_batch(PredictBatchConfig(gpu="h100-sxm"))
    base = {"model": "llama3-8b", "gpu": "h100-sxm"}
    with pytest.raises(WhatIfError, match="exactly one of --seq-len"):
        resolve_sparsity(SparsityConfig(**base))
    with pytest.raises(WhatIfError, match="exactly one of --seq-len"):
        resolve_sparsity(SparsityConfig(**base, seq_len=8, seq_lens="8"))
    with pytest.raises(WhatIfError, match="--seq-lens '8k' is not a comma list"):
        resolve_sparsity(SparsityConfig(**base, seq_lens="8k"))
    with pytest.raises(WhatIfError, match="--seq-lens ' ' is not a comma list"):
        resolve_sparsity(SparsityConfig(**base, seq_lens=" "))


def test_bad_field_is_one_line_naming_the_flag():
    with pytest.raises(OptionError, match=r"^--bytes x: Input should be a valid integer"):
        validate(scenario_command("predict collective").config, {"nbytes": "x", "gpu": "a"})


# --------------------------------------------------------------------------- registry


def test_registry_names_aliases_and_unknown_commands():
    assert scenario_command("sparsity") is COMMANDS["sparsity compare"]
    assert scenario_command("  predict   gemm ").name == "predict gemm"
    assert scenario_command("serve plan").path == ("serve", "plan")
    with pytest.raises(UnknownCommand) as err:
        scenario_command("predict gem")
    assert "did you mean 'predict gemm'" in str(err.value) and "allowed: plan," in str(err.value)
    with pytest.raises(TypeError, match="takes a GemmConfig"):
        COMMANDS["predict gemm"].run(SparsityConfig(model="m", gpu="g"))


def test_registry_output_is_jsonable():
    out = COMMANDS["predict gemm"].run(GemmConfig(m=64, n=64, k=64, gpu="h100-sxm"))
    assert json.loads(json.dumps(out, allow_nan=False)) == out
