"""Vidur's public A100 operator profiles as a dataset: shapes, units, and the shipped
A100 profile fitted from it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from calibrate.dataset import load_dataset
from calibrate.public.vidur import _gemm_shape, convert, kept
from costmodels.ops.select import get_cost_model

ROOT = Path(__file__).resolve().parents[2]
HEAD = {"n_head": 32, "n_kv_head": 8, "n_embd": 4096, "n_expanded_embd": 14336,
        "use_gated_mlp": True, "vocab_size": 128256}  # fmt: skip


def _row(tokens: int, tp: int, **times: float) -> dict:
    cols = {f"time_stats.{op}.median": ms for op, ms in times.items()}
    return {**HEAD, "num_tokens": tokens, "num_tensor_parallel_workers": tp, **cols}


def test_gemm_shapes_follow_the_model_and_tp():
    r = pd.Series(_row(64, 2))
    assert _gemm_shape("attn_pre_proj", r) == (4096, (32 + 16) * 128 // 2)
    assert _gemm_shape("attn_post_proj", r) == (32 * 128 // 2, 4096)
    assert _gemm_shape("mlp_up_proj", r) == (4096, 2 * 14336 // 2)
    assert _gemm_shape("mlp_down_proj", r) == (14336 // 2, 4096)
    assert kept(1024) and kept(8192) and kept(12288) and not kept(768)


def test_convert_writes_a_dataset_the_fit_loads(tmp_path):
    src = tmp_path / "vidur" / "data" / "profiling" / "compute" / "a100" / "org" / "m"
    src.mkdir(parents=True)
    times = dict(attn_pre_proj=1.0, attn_post_proj=0.5, mlp_up_proj=2.0, mlp_down_proj=1.5,
                 input_layernorm=0.1, mlp_act=0.2, add=0.05)  # fmt: skip
    pd.DataFrame([_row(4096, 1, **times), _row(768, 1, **times)]).to_csv(
        src / "mlp.csv", index=False
    )
    n = convert(tmp_path / "vidur", tmp_path / "out")
    assert n == 7  # 768 tokens is thinned; no post-attention norm column: skipped
    ds = load_dataset(tmp_path / "out")
    gemm = ds.frame[ds.frame.op == "gemm"]
    assert sorted(gemm.measured_s * 1e3) == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert set(ds.frame.family.str.split("/").str[:2].str.join("/")) == {"org/m"}


def test_shipped_a100_profile_is_calibrated_from_it():
    model = get_cost_model("a100-sxm-80gb")
    assert model.provenance.kind == "calibrated"
    assert "vidur" in model.provenance.source
    assert model.expected_error < 0.12
    assert (ROOT / "calibrate" / "data" / "public-vidur-a100" / "meta.json").is_file()
