"""The linear mixers' scan factors: the shipped table is the fit of the committed H200
data, the held-out errors stay where README quotes them, and the step models use them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from calibrate.fit_mixers import OUT, fit, rows
from calibrate.steps.hf_step import cut_layers
from costmodels.steps.mixer_scan import scan_factor
from costmodels.steps.serving import StepModel
from workloads.decompose.mixer import rank_mixer, scan_bytes_per_token
from workloads.models import load_hf_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"


@pytest.fixture(scope="module")
def fitted():
    return fit(rows())


def test_shipped_factors_are_the_fit_of_the_committed_data(fitted):
    factors, _ = fitted
    assert yaml.safe_load(OUT.read_text())["factors"] == factors


def test_held_out_errors(fitted):
    _, test = fitted
    mape = test.groupby(["kernel", "what"]).ape.mean()
    assert mape["gdn", "fwd"] < 8 and mape["kda", "fwd"] < 8
    assert mape["gdn", "decode"] < 20 and mape["ssd", "decode"] < 25
    assert mape["ssd", "fwd"] < 35  # Granite's chunk-256 family, eager launches


def test_step_model_prices_the_scan_at_its_factor():
    m = load_hf_config(EXAMPLES / "qwen3-next-80b-a3b.config.json")
    sm = StepModel(m, "h200-sxm", tp=4)
    scan = next(t for t in sm._tpls["layer"] if t.name == "mixer_scan")
    raw = scan_bytes_per_token(rank_mixer(m, 4), 2.0)
    assert scan.traffic_bytes == pytest.approx(scan_factor(m, "fwd") * raw)
    # a decoding sequence's whole scan: the decode factor times the state traffic
    state = next(t for t in sm._tpls["seq"] if t.name == "mixer_state")
    mx = rank_mixer(m, 4)
    whole = 2.0 * (4.0 * mx.state_elements + 2.0 * mx.conv_state_elements)
    assert state.traffic_bytes + scan.traffic_bytes == pytest.approx(
        scan_factor(m, "decode") * whole
    )


def test_kda_decode_borrows_gdn_and_dense_models_are_untouched():
    kimi = load_hf_config(EXAMPLES / "kimi-linear-48b-a3b.config.json")
    qwen = load_hf_config(EXAMPLES / "qwen3-next-80b-a3b.config.json")
    assert scan_factor(kimi, "decode") == scan_factor(qwen, "decode")
    assert scan_factor(load_hf_config(EXAMPLES / "llama-3.2-1b.config.json"), "fwd") == 1.0


def test_cut_layers_keeps_the_released_kinds():
    cfg = json.loads((EXAMPLES / "kimi-linear-48b-a3b.config.json").read_text())
    cut = cut_layers(cfg, 4)
    assert cut["linear_attn_config"]["kda_layers"] == [1, 2, 3]
    assert cut["linear_attn_config"]["full_attn_layers"] == [4]
    nem = json.loads((EXAMPLES / "nemotron-h-8b.config.json").read_text())
    assert cut_layers(nem, 26)["hybrid_override_pattern"].count("*") == 2
    assert len(cut_layers(nem, 26)["hybrid_override_pattern"]) == 26
