"""simcli.options: CLI options generated from a pydantic config."""

from __future__ import annotations

from typing import Literal

import typer
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from simcli.options import config_options, help_text


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="Model id.")
    tp: int = Field(1, ge=1, description="Tensor-parallel degree.")
    kind: Literal["ring", "ulysses"] = Field("ring", description="CP kind.")
    sp: bool | None = Field(None, description="Sequence parallelism; default on when tp > 1.")
    gpu_types: str = Field(
        "a,b", description="GPU ids.", json_schema_extra={"cli": ["--gpu-types", "--gpus-types"]}
    )


def _app():
    app = typer.Typer()
    seen = {}

    @app.callback(invoke_without_command=True)
    @config_options(_Config)
    def cmd(config: _Config, fmt: str = typer.Option("table", "--format", help="Output.")):
        seen["config"], seen["fmt"] = config, fmt

    return app, seen


def test_fields_become_options_and_a_frozen_config():
    app, seen = _app()
    argv = ["--model", "x", "--tp", "2", "--kind", "ulysses", "--no-sp", "--gpus-types", "z"]
    res = CliRunner().invoke(app, [*argv, "--format", "json"])
    assert res.exit_code == 0, res.output
    assert seen["config"] == _Config(model="x", tp=2, kind="ulysses", sp=False, gpu_types="z")
    assert seen["fmt"] == "json"
    res = CliRunner().invoke(app, ["--model", "x"])
    assert seen["config"] == _Config(model="x")


def test_bad_value_is_one_line_naming_the_flag():
    app, _ = _app()
    res = CliRunner().invoke(app, ["--model", "x", "--tp", "0"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: --tp 0: Input should be greater than or equal to 1"
    ]
    res = CliRunner().invoke(app, ["--model", "x", "--kind", "mesh"])
    assert res.exit_code == 2 and "--kind mesh" in res.output and "'ring'" in res.output


def test_help_lists_literal_choices_and_every_field():
    assert help_text(_Config.model_fields["kind"]) == "CP kind. (ring | ulysses)"
    app, _ = _app()
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    for flag in ("--model", "--tp", "--kind", "--sp", "--gpu-types", "--format"):
        assert flag in out
