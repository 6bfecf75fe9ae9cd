"""Qwen2.5-VL's vision encoder: transformers' parameter count, the processor's image
grids and tokens, and the encoder's kernels."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from workloads.decompose.vision import vision_encoder_ops, vision_flops
from workloads.models import ModelError, load_hf_config, load_model
from workloads.ops import OpKind
from workloads.vision import ImageLoad, VisionError, parse_image_size

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "models" / "qwen2.5-vl-7b.config.json"


@pytest.fixture(scope="module")
def vl():
    return load_model(CONFIG)


def test_parameter_count_equals_transformers_numel(vl):
    # transformers 5.24 on the meta device: Qwen2_5_VLForConditionalGeneration(config)
    # numel 8,292,166,656, of which model.visual 676,550,144
    assert vl.num_params == 8_292_166_656
    assert vl.vision.params == 676_550_144
    assert vl.qkv_bias and not vl.out_proj_bias  # Qwen2's decoder


def test_text_config_only_and_flat_forms_load_alike(tmp_path, vl):
    # transformers >= 4.53 saves the text keys under text_config (model_type
    # qwen2_5_vl_text), older releases flat; the released file has them flat
    cfg = json.loads(CONFIG.read_text())
    outer = ("model_type", "vision_config", "tie_word_embeddings")
    text = {k: v for k, v in cfg.items() if k not in outer}
    nested = {k: cfg[k] for k in outer} | {"text_config": text | {"model_type": "qwen2_5_vl_text"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(nested))
    assert load_hf_config(path).num_params == vl.num_params
    both = cfg | {"text_config": text}
    path.write_text(json.dumps(both))
    assert load_hf_config(path).num_params == vl.num_params


# transformers' smart_resize (factor 28, min 3136, max 12845056 px), in patches and tokens
HF_GRIDS = [
    ((1024, 1024), (74, 74), 1369),
    ((1280, 720), (52, 92), 1196),
    ((640, 480), (34, 46), 391),
    ((336, 336), (24, 24), 144),
    ((4000, 3000), (214, 286), 15301),
    ((56, 56), (4, 4), 4),
    ((1920, 1080), (78, 138), 2691),
    ((10, 10), (4, 4), 4),
]


@pytest.mark.parametrize("size,grid,tokens", HF_GRIDS)
def test_image_grid_and_tokens_follow_the_processor(vl, size, grid, tokens):
    assert vl.vision.grid(*size) == grid
    assert vl.vision.tokens(*size) == tokens


def test_windows_tile_the_grid(vl):
    wins = vl.vision.windows(1920, 1080)  # 78 x 138 patches in 8 x 8 windows
    assert sum(wins) == vl.vision.patches(1920, 1080)
    assert len(wins) == 10 * 18 and max(wins) == 64 and Counter(wins)[6 * 2] == 1


@pytest.mark.parametrize("text", ["", "12x", "0x10", "10x70000", "axb"])
def test_bad_image_size_is_one_line(text):
    with pytest.raises(VisionError, match="allowed"):
        parse_image_size(text)


def test_bad_vision_config_is_one_line(tmp_path):
    cfg = json.loads(CONFIG.read_text())
    cfg["vision_config"]["num_heads"] = 7
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="num_heads") as exc:
        load_hf_config(path)
    assert "\n" not in str(exc.value)


def test_params_per_rank(vl):
    enc = vl.vision
    assert enc.params_per_rank(1) == enc.params
    # split weights shrink; replicated biases and norms keep 2 x tp copies above params / tp
    assert enc.params / 2 < enc.params_per_rank(2) < enc.params


def test_encoder_flops_are_its_linear_layers_and_attention(vl):
    enc, img = vl.vision, ImageLoad(1, 448, 448)
    p = enc.patches(448, 448)  # 32 x 32, 16 full windows of 64
    h, f = enc.hidden_size, enc.intermediate_size
    linear = p * (enc.patch_dim * h + enc.depth * (4 * h * h + 3 * h * f))
    merger = (p // 4) * (enc.merged_dim**2 + enc.merged_dim * enc.out_hidden_size)
    full = len(enc.fullatt_blocks)
    attn = 2 * h * (full * p * p + (enc.depth - full) * p * 64)
    assert vision_flops(enc, img) == pytest.approx(2 * (linear + merger + attn))


def test_eager_runs_one_sdpa_call_per_window_and_splits_gate_and_up(vl):
    enc, img = vl.vision, ImageLoad(1, 1024, 1024)
    eager = vision_encoder_ops(enc, img, 2, mode="eager")
    calls = sum(o.count for o in eager if o.name.startswith("vit_attn_call"))
    windows = len(enc.windows(1024, 1024))
    assert calls == 2 * (windows * (enc.depth - 4) + 4)
    fused = vision_encoder_ops(enc, img, 2)  # one varlen launch per distinct window size
    sizes = len(set(enc.windows(1024, 1024)))
    launches = sum(o.op.op == OpKind.attn_fwd for o in fused)
    assert launches == (enc.depth - 4) * sizes + 4
    assert all(o.count == 1 for o in fused)
    assert any(o.name.startswith("vit_gate_up") for o in fused)
    assert any(o.name.startswith("vit_gate_") and "up" not in o.name for o in eager)


def test_tp_must_split_the_vision_heads(vl):
    with pytest.raises(ValueError, match="TP 3"):
        vision_encoder_ops(vl.vision, ImageLoad(1, 448, 448), 1, tp=3)
