"""docs/published_configs.md: every command on the page runs, and its prediction stays
within the stated distance of the published figure (validation, never fitting)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

import simcli.cli

PAGE = Path(__file__).resolve().parents[2] / "docs" / "published_configs.md"
runner = CliRunner()

# (first words identifying the command, JSON key, published value, largest |error| %)
PUBLISHED = [
    ("--model llama3.1-405b --gpu h100-sxm --gpus 8192", "model_tflops_per_gpu", 430.0, 12.0),
    ("--model gpt3-175b --gpu h100-sxm --gpus 128", "tokens_per_s_per_gpu", 726.0, 8.0),
    ("--model llama3-70b --gpu h100-sxm --gpus 64", "tokens_per_s_per_gpu", 1533.0, 12.0),
    ("--model llama3-8b --gpu h100-sxm --gpus 8", "tokens_per_s_per_gpu", 12036.0, 12.0),
    ("--model llama2-7b --gpu h100-sxm --gpus 1024", "iteration_s", 103.25, 8.0),
    ("--model turing-530b --gpu a100-sxm-80gb", "iteration_s", 37.83, 8.0),
    ("--model megatron-1t --gpu a100-sxm-80gb", "iteration_s", 71.49, 8.0),
]


def _commands() -> list[list[str]]:
    text = PAGE.read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("simcli "):
                out.append(shlex.split(line)[1:])
    return out


def test_the_page_has_six_or_more_configurations():
    assert len(_commands()) >= 6


@pytest.mark.parametrize(
    "key, field, published, bound", PUBLISHED, ids=[p[0][8:20] for p in PUBLISHED]
)
def test_published_configuration_predicted_within_bound(key, field, published, bound):
    cmd = next(c for c in _commands() if key in " ".join(c))
    res = runner.invoke(simcli.cli.app, [*cmd, "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    err = 100.0 * (out[field] / published - 1.0)
    assert abs(err) <= bound, (key, out[field], published)
