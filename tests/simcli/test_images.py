"""``--images-per-request`` / ``--image-size`` on ``step``, ``serve`` and ``serve plan``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simcli.cli import app

runner = CliRunner()
VL = str(Path(__file__).resolve().parents[2] / "examples" / "models" / "qwen2.5-vl-7b.config.json")
LOAD = ["--qps", "2", "--num-requests", "60", "--prompt-len", "fixed:200", "--output-len",
        "fixed:50"]  # fmt: skip


def _json(args):
    res = runner.invoke(app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_step_adds_image_tokens_and_the_encoder():
    base = ["step", "--model", VL, "--gpu", "h100-sxm", "--phase", "prefill", "--prompt-len",
            "300", "--batch", "2"]  # fmt: skip
    plain = _json(base)
    img = _json([*base, "--images-per-request", "2", "--image-size", "640x480"])
    assert plain["image_tokens_per_request"] == 0 and "vision_encoder" not in plain["breakdown_ms"]
    assert img["image_tokens_per_request"] == 2 * 391  # 34 x 46 patches / 4, per image
    assert img["prefill_new_tokens"] == 2 * (300 + 782)
    assert img["breakdown_ms"]["vision_encoder"] > 0
    assert img["step_ms"] > plain["step_ms"] + img["breakdown_ms"]["vision_encoder"] * 0.99


def test_serve_images_lengthen_ttft_and_count_as_prompt_tokens():
    base = ["serve", "--model", VL, "--gpu", "h100-sxm", *LOAD]
    plain = _json(base)
    img = _json([*base, "--images-per-request", "1", "--image-size", "1280x720"])
    assert img["image_tokens_per_request"] == 1196 and img["image_size"] == "1280x720"
    assert img["ttft_s_p50"] > plain["ttft_s_p50"] + 0.02  # encoder + 1196 more prompt tokens
    assert img["requests_completed"] == plain["requests_completed"] == 60


def test_serve_plan_carries_the_images():
    out = _json(["serve", "plan", "--model", VL, "--gpu-types", "h100-sxm", *LOAD, "--tp", "1",
                 "--slo-ttft-s", "2", "--images-per-request", "1"])  # fmt: skip
    assert out["images_per_request"] == 1 and out["deployments"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "llama3-8b", "--images-per-request", "1"], "no vision encoder"),
        (["--model", VL, "--images-per-request", "1", "--image-size", "12x"], "WIDTHxHEIGHT"),
        (["--model", VL, "--images-per-request", "65"], "images-per-request"),
    ],
)
def test_bad_image_options_are_one_line(args, needle, tmp_path):
    out = tmp_path / "o.json"
    res = runner.invoke(app, ["serve", *args, "--gpu", "h100-sxm", "--qps", "1",
                              "--output", str(out)])  # fmt: skip
    assert res.exit_code != 0
    line = res.output.strip()
    assert needle in line and "\n" not in line and "Traceback" not in line
    assert not out.exists()
