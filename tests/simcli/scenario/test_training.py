"""simcli.scenario.training: train/plan configs, their resolvers and runs, and the CLI
options generated from the configs."""

from __future__ import annotations

import dataclasses
import json

import pydantic
import pytest
import typer
from typer.testing import CliRunner

import simcli.cli
from simcli.options import OptionError, flags, validate
from simcli.scenario import (
    PlanConfig,
    PlanScenario,
    TrainConfig,
    TrainScenario,
    resolve_plan,
    resolve_train,
    run_plan,
    run_train,
)
from simcli.training.search import SearchResult, search_plans
from workloads.plan import PlanError

TRAIN = {"model": "llama3-8b", "gpu": "h100-sxm", "gpus": 8, "global_batch": 8, "seq_len": 2048}
PLAN = {"model": "llama3-8b", "gpu": "h100-sxm", "gpus": 8, "global_batch": 16, "seq_len": 2048}
runner = CliRunner()


def _command(name: str):
    return typer.main.get_command(simcli.cli.app).commands[name]


def _options(name: str) -> list:
    return [p for p in _command(name).params if getattr(p, "param_type_name", "") == "option"]


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("name", ["train", "plan"])
def test_every_option_has_help_text(name):
    options = _options(name)
    assert len(options) > 10
    for option in options:
        assert option.help and option.help.strip(), option.opts


@pytest.mark.parametrize(("name", "config"), [("train", TrainConfig), ("plan", PlanConfig)])
def test_options_are_the_config_fields(name, config):
    """One way to configure: every field is an option with its flag and default; the only
    other options say where the results go."""
    by_name = {p.name: p for p in _options(name)}
    for field_name, field in config.model_fields.items():
        option = by_name.pop(field_name)
        assert flags(field_name, field)[0].split("/")[0] in option.opts
        if not field.is_required():
            assert option.default == field.default, field_name
        assert field.description, field_name
    assert set(by_name) <= {"trace", "output", "quiet", "fmt"}


# fmt: off
TRAIN_FLAGS = [
    "--model", "--gpu", "--gpus", "--tp", "--pp", "--dp", "--vpp", "--cp", "--zero",
    "--micro-batch", "--global-batch", "--seq-len", "--pp-schedule", "--recompute",
    "--sequence-parallel", "--no-sequence-parallel", "--precision", "--cp-kind", "--ep",
    "--tp-comm", "--layer-split", "--framework", "--attn-backend", "--attn-pattern",
    "--profile", "--hardware", "--cluster", "--trace", "--trace-output", "--output", "--quiet",
    "--ignore-memory", "--format",
]
PLAN_FLAGS = [
    "--model", "--gpu", "--gpus", "--seq-len", "--global-batch", "--top", "--objective",
    "--balance", "--no-balance", "--max-tp", "--tp", "--pp", "--max-pp", "--max-cp",
    "--min-cp-tokens", "--max-micro-batch", "--precision", "--price-per-gpu-hour", "--profile",
    "--hardware", "--output", "--quiet", "--format",
]
# fmt: on


@pytest.mark.parametrize(("name", "expected"), [("train", TRAIN_FLAGS), ("plan", PLAN_FLAGS)])
def test_contract_flags_are_unchanged(name, expected):
    spelled = {o for p in _options(name) for o in (*p.opts, *p.secondary_opts)}
    assert set(expected) <= spelled


def test_json_schema_comes_from_the_fields():
    schema = TrainConfig.model_json_schema()
    json.dumps(schema)
    assert schema["properties"]["cp_kind"]["enum"] == [
        "ring", "ulysses", "tokenring", "allgather", "hierarchical"
    ]
    assert "Tokens per sequence" in schema["properties"]["seq_len"]["description"]
    assert PlanConfig.model_json_schema()["properties"]["tp"]["anyOf"][0]["type"] == "array"


# --------------------------------------------------------------------------- bad input


def test_bad_field_is_one_line_naming_flag_value_and_choices():
    with pytest.raises(OptionError) as err:
        validate(TrainConfig, {**TRAIN, "cp_kind": "mesh"})
    text = str(err.value)
    assert text.startswith("--cp-kind mesh:") and "'ulysses'" in text and "\n" not in text
    with pytest.raises(OptionError, match=r"^--layer-split 7,x: .*allowed: e\.g\. 7,8,8,9$"):
        validate(TrainConfig, {**TRAIN, "layer_split": "7,x"})
    with pytest.raises(OptionError, match=r"^--tp 0,4: has a value < 1; allowed: positive"):
        validate(PlanConfig, {**PLAN, "tp": "0,4"})
    with pytest.raises(OptionError, match=r"^--price-per-gpu-hour -1.0: .*greater than 0"):
        validate(PlanConfig, {**PLAN, "price_usd_per_gpu_hour": -1.0})


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--zero", "5"], "--zero 5: Input should be 0, 1, 2 or 3"),
        (["train", "--framework", "jax"], "--framework jax: Input should be 'megatron', 'p"),
        (["train", "--tp", "0"], "--tp 0 is invalid; allowed: 1 to 1048576"),
        (["plan", "--objective", "speed"], "--objective speed: Input should be 'time' or 'cost'"),
        (["plan", "--pp", "2,x"], "--pp 2,x: not a comma list of integers; allowed: e.g."),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args, needle):
    common = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch",
              "8", "--seq-len", "2048"]  # fmt: skip
    res = runner.invoke(simcli.cli.app, [args[0], *common, *args[1:]])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.output


def test_resolver_errors_name_the_value_and_what_is_allowed():
    with pytest.raises(PlanError, match=r"tp=3 .*allowed tp: 1, 2, 4, 8"):
        resolve_train(TrainConfig(**TRAIN, tp=3))
    with pytest.raises(PlanError) as err:
        resolve_train(TrainConfig(**{**TRAIN, "gpu": "a100-sxm-80gb"}, precision="fp8"))
    assert str(err.value) == (
        "--precision fp8 needs fp8 tensor cores; a100-sxm-80gb has none; allowed: "
        "bf16-mixed, fp16-mixed, bf16"
    )
    with pytest.raises(ValueError, match=r"unknown GPU 'x100'; known: "):
        resolve_plan(PlanConfig(**{**PLAN, "gpu": "x100"}))


def test_cost_objective_needs_a_price():
    scenario = resolve_plan(PlanConfig(**PLAN, objective="cost"))
    unpriced = tuple(dataclasses.replace(hw, price=None) for hw in scenario.hardware)
    with pytest.raises(PlanError, match=r"'h100-sxm'; allowed: pass --price-per-gpu-hour"):
        search_plans(scenario.model, unpriced, seq_len=2048, global_batch=16, objective="cost")


# --------------------------------------------------------------------------- resolution


def test_resolved_train_scenario_is_frozen():
    scenario = resolve_train(TrainConfig(**TRAIN, tp=2, attn_pattern="window:1024"))
    assert isinstance(scenario, TrainScenario)
    assert scenario.plan.tp == 2 and scenario.plan.data_parallel == 4
    assert scenario.hardware.num_gpus == 8 and scenario.hardware.gpu.id == "h100-sxm"
    assert scenario.tp_hardware is not None and scenario.tp_hardware.num_gpus == 2
    assert scenario.cost_model(2) is scenario.tp_hardware.cost_model
    with pytest.raises(ValueError, match="no hardware of 4 GPUs"):
        scenario.cost_model(4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        scenario.plan = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        scenario.hardware.num_gpus = 16  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        scenario.config.tp = 4  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        scenario.plan.tp = 4  # type: ignore[misc]


def test_resolved_plan_scenario_holds_every_gpu_count_searched():
    scenario = resolve_plan(PlanConfig(**PLAN, objective="cost", price_usd_per_gpu_hour=3.0))
    assert isinstance(scenario, PlanScenario)
    assert [hw.num_gpus for hw in scenario.hardware] == [8, 4, 2, 1]
    assert all(hw.usd_per_gpu_hour == 3.0 for hw in scenario.hardware)
    with pytest.raises(dataclasses.FrozenInstanceError):
        scenario.hardware = ()  # type: ignore[misc]
    assert resolve_plan(PlanConfig(**PLAN)).hardware[0].num_gpus == 8


# --------------------------------------------------------------------------- runs


def test_run_train_is_what_the_command_emits():
    config = TrainConfig(**TRAIN, tp=2, recompute="selective")
    run = run_train(resolve_train(config))
    args = ["train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "2",
            "--global-batch", "8", "--seq-len", "2048", "--recompute", "selective",
            "--format", "json"]  # fmt: skip
    res = runner.invoke(simcli.cli.app, args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == json.loads(json.dumps(run.to_dict()))
    flat = run.flat()
    assert flat["breakdown_compute_s"] == run.result.breakdown_s["compute_s"]
    assert run.result.spans == []  # no timeline unless asked for
    assert run_train(resolve_train(config), keep_spans=True).result.spans


def test_run_train_refuses_a_plan_that_does_not_fit_unless_told():
    config = {**TRAIN, "model": "llama3-70b", "tp": 8, "seq_len": 8192}
    with pytest.raises(PlanError, match="does not fit.*or --ignore-memory"):
        run_train(resolve_train(TrainConfig(**config)))
    run = run_train(resolve_train(TrainConfig(**config, ignore_memory=True)))
    assert run.to_dict()["fits"] is False


def test_run_plan_searches_the_resolved_scenario():
    result = run_plan(resolve_plan(PlanConfig(**PLAN, top=2, tp=(2, 4))))
    assert isinstance(result, SearchResult)
    assert 1 <= len(result.plans) <= 2 and all(p.plan.tp in (2, 4) for p in result.plans)
    assert result.summary()["num_gpus"] == 8


def test_memory_margin_parses_gib_percent_and_fraction():
    from simcli.scenario.training import memory_margin_bytes

    cap = 80 * 1024**3
    assert memory_margin_bytes("4GiB", cap) == 4 * 1024**3
    assert memory_margin_bytes("4 GiB", cap) == 4 * 1024**3
    assert memory_margin_bytes("5%", cap) == pytest.approx(0.05 * cap)
    assert memory_margin_bytes("0.05", cap) == pytest.approx(0.05 * cap)
    for bad in ("5x", "2", "-1GiB", "100%"):
        with pytest.raises(ValueError):
            memory_margin_bytes(bad, cap)


def test_memory_margin_decides_what_fits_and_headroom_is_reported(tmp_path):
    """The published NeMo Llama-3-8B CP 2 run (fp8, 8 H100s) fits with NeMo's memory
    settings (fp8 primary weights, bf16 gradient sync) and not without; a margin larger
    than the headroom refuses it with one line and writes no file."""
    nemo = ["train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--cp", "2",
            "--global-batch", "128", "--seq-len", "8192", "--precision", "fp8",
            "--zero", "1"]  # fmt: skip
    res = runner.invoke(simcli.cli.app, nemo)
    assert res.exit_code != 0 and "does not fit" in res.output
    ok = nemo + ["--fp8-params", "--grad-reduce-dtype", "bf16", "--format", "json"]
    res = runner.invoke(simcli.cli.app, ok)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["fits"] and out["memory_margin_gib"] == pytest.approx(0.02 * 79.18, rel=0.01)
    assert out["memory_headroom_gib"] == pytest.approx(
        out["memory_capacity_gib"] - out["peak_memory_gib"]
    )
    margin = f"{out['memory_headroom_gib'] + 0.5:.2f}GiB"
    dest = tmp_path / "o"
    res = runner.invoke(simcli.cli.app, ok + ["--memory-margin", margin, "--output", str(dest)])
    assert res.exit_code != 0 and "does not fit" in res.output and not dest.exists()


def test_huge_inputs_are_refused_or_bounded_quickly():
    """Issue 18 item 7: `plan --global-batch 100000000` ran for minutes and `--gpus
    1000000000` took 40 s to refuse; now both answer in about a second with one line
    (a hang here would hold the suite)."""
    cases = [
        (["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
          "--global-batch", "100000000", "--seq-len", "4096"], "error: no plan"),
        (["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "1000000000",
          "--global-batch", "1024", "--seq-len", "4096"], "allowed: 1 to 1048576"),
        (["train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
          "--global-batch", "100000000", "--seq-len", "4096"], "pipeline tasks per iteration"),
    ]  # fmt: skip
    for argv, want in cases:
        res = runner.invoke(simcli.cli.app, argv)
        assert res.exit_code == 2 and want in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1
