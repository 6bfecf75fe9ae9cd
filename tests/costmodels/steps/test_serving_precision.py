"""Serving precision in the step model (costmodels.steps.serving): weight and KV-cache
dtypes priced, not just stored -- memory and KV capacity, decode and prefill time, the
checks of what a GPU or engine cannot run."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.steps.serving import StepError, StepModel
from simcli.serving.metrics import EnergyMeter
from workloads.decompose.quant import quantised_params_per_layer, weight_format

NONE = np.zeros(0, np.int64)
GIB = 1024**3


@pytest.fixture(scope="module")
def h100() -> dict[str, StepModel]:
    return {
        w: StepModel("llama3-8b", "h100-sxm", weight_dtype=w)
        for w in ("bf16", "fp8", "int8", "int4")
    }


def decode_ms(sm: StepModel, batch: int, ctx: int) -> float:
    return sm.step_ms(NONE, NONE, np.full(batch, ctx))


def prefill_ms(sm: StepModel, n: int) -> float:
    return sm.step_ms(np.array([n]), np.array([0]), NONE)


def test_weight_bytes_follow_the_format(h100):
    m = h100["bf16"].model
    q = quantised_params_per_layer(m, 1) * m.num_layers
    bf16 = h100["bf16"].weight_bytes_per_gpu()
    assert bf16 == 2.0 * m.num_params
    for w in ("fp8", "int8", "int4"):
        want = bf16 - q * (2.0 - weight_format(w).bytes_per_weight)
        assert h100[w].weight_bytes_per_gpu() == pytest.approx(want)
        assert h100[w].weight_bytes_total == pytest.approx(want)
    # Llama-3-8B int4: 13.0 GiB of layer weights shrink to 3.4; embedding and LM head stay bf16
    assert h100["int4"].weight_bytes_per_gpu() / GIB == pytest.approx(5.31, abs=0.01)


def test_smaller_weights_leave_more_kv_cache(h100):
    cap = {w: sm.kv_capacity_tokens() for w, sm in h100.items()}
    # int8 carries group scales (1.016 B per weight), fp8 a per-tensor scale (1 B)
    assert cap["bf16"] < cap["int8"] < cap["fp8"] < cap["int4"]
    freed = h100["bf16"].weight_bytes_per_gpu() - h100["int4"].weight_bytes_per_gpu()
    per_tok = h100["bf16"].kv_bytes_per_token
    assert cap["int4"] - cap["bf16"] == pytest.approx(freed / per_tok, abs=16)


def test_fp8_kv_cache_doubles_the_tokens_and_halves_the_bytes():
    bf16 = StepModel("llama3-8b", "h100-sxm")
    for spelling in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        fp8 = StepModel("llama3-8b", "h100-sxm", kv_cache_dtype=spelling)
        assert fp8.kv_cache_dtype == "fp8"
        assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token / 2
        # the budget left after weights and workspace is the same: twice the tokens
        assert fp8.kv_capacity_tokens() == pytest.approx(2 * bf16.kv_capacity_tokens(), abs=16)
    # decode over long caches reads half the K/V: attention-heavy steps get faster
    fp8 = StepModel("llama3-8b", "h100-sxm", kv_cache_dtype="fp8")
    b, f = decode_ms(bf16, 64, 8000), decode_ms(fp8, 64, 8000)
    attn_b = bf16.breakdown(NONE, NONE, np.full(64, 8000))["attn"]
    attn_f = fp8.breakdown(NONE, NONE, np.full(64, 8000))["attn"]
    assert 0.4 < attn_f / attn_b < 0.65 and f < 0.8 * b
    # prefill attention keeps the activation dtype (fresh K/V from the QKV GEMM)
    assert prefill_ms(fp8, 4096) == pytest.approx(prefill_ms(bf16, 4096), rel=0.01)


def test_int4_decode_at_batch_1_is_faster_by_the_weight_bytes_less_overheads(h100):
    """Llama-3-8B on one H100, batch 1: the decode GEMMs stream 3.9x fewer weight bytes;
    the step gains less: the bf16 LM head (1 GiB), norms, attention and kernel floors stay,
    and Marlin on Hopper streams packed weights at 0.54 of cuBLAS's rate (published)."""
    bf16, int4, int8, fp8 = (decode_ms(h100[w], 1, 1024) for w in ("bf16", "int4", "int8", "fp8"))
    assert 1.6 < bf16 / int4 < 2.2  # 6.54 -> 3.69 ms
    assert 1.25 < bf16 / int8 < 1.6  # 4.78 ms
    assert 1.4 < bf16 / fp8 < 2.0  # fp8 GEMMs read half the bytes: 4.08 ms
    assert int4 < fp8 < int8 < bf16
    gemms = ("qkv_proj", "o_proj", "mlp_up", "mlp_down")
    b = h100["bf16"].breakdown(NONE, NONE, np.array([1024]))
    q = h100["int4"].breakdown(NONE, NONE, np.array([1024]))
    ratio = sum(b[g] for g in gemms) / sum(q[g] for g in gemms)
    assert ratio == pytest.approx(2 / weight_format("int4").bytes_per_weight * 0.54, rel=0.06)
    assert q["lm_head"] == b["lm_head"]  # vLLM leaves the LM head unquantised


def test_ampere_marlin_reaches_the_ideal_weight_stream():
    bf16 = StepModel("llama3-8b", "a100-sxm-80gb")
    int4 = StepModel("llama3-8b", "a100-sxm-80gb", weight_dtype="int4")
    assert 2.3 < decode_ms(bf16, 1, 1024) / decode_ms(int4, 1, 1024) < 3.4  # 10.06 -> 3.73


def test_compute_bound_prefill_uses_the_gemm_dtype_peak(h100):
    bf16, fp8, int4 = (prefill_ms(h100[w], 4096) for w in ("bf16", "fp8", "int4"))
    assert 1.3 < bf16 / fp8 < 2.0  # fp8 tensor cores; attention stays bf16
    assert 1.0 <= int4 / bf16 < 1.08  # dequantised to bf16: the bf16 peak, no faster
    gemms = ("qkv_proj", "o_proj", "mlp_up", "mlp_down")
    b = h100["bf16"].breakdown(np.array([4096]), np.array([0]), NONE)
    f = h100["fp8"].breakdown(np.array([4096]), np.array([0]), NONE)
    assert 1.6 < sum(b[g] for g in gemms) / sum(f[g] for g in gemms) < 2.1
    assert f["fp8_quant"] > 0 and "fp8_quant" not in b


def test_quantised_grids_match_exact_pricing(h100):
    for w in ("int4", "fp8"):
        sm = h100[w]
        for args in (
            (NONE, NONE, np.full(37, 3000)),
            (np.array([700]), np.array([100]), np.full(5, 900)),
        ):
            assert sm.step_s(*args) == pytest.approx(sm.exact_step_s(*args), rel=0.01)


def test_quantisation_fits_a_70b_model_on_one_gpu():
    with pytest.raises(StepError, match="does not fit"):
        StepModel("llama3-70b", "h100-sxm")
    sm = StepModel("llama3-70b", "h100-sxm", weight_dtype="int4")
    assert sm.weight_bytes_per_gpu() / GIB < 40 and sm.kv_capacity_tokens() > 50_000


def test_moe_and_tensor_parallel_quantised():
    bf16 = StepModel("mixtral-8x7b", "h100-sxm", tp=4)
    for w in ("fp8", "int4"):
        q = StepModel("mixtral-8x7b", "h100-sxm", tp=4, weight_dtype=w)
        assert q.weight_bytes_per_gpu() < 0.6 * bf16.weight_bytes_per_gpu()
        assert decode_ms(q, 8, 2048) < decode_ms(bf16, 8, 2048)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"weight_dtype": "fp8"}, "weight_dtype fp8 needs fp8 tensor cores; a100-sxm-80gb"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype fp8 needs fp8 tensor cores"),
        ({"weight_dtype": "int3"}, "allowed: bf16, fp16, fp8, int8, int4"),
        ({"kv_cache_dtype": "int8"}, "allowed: auto, bf16, fp16, fp8, fp8_e4m3, fp8_e5m2"),
        ({"weight_dtype": "fp16"}, "unquantised weights run in the activation dtype"),
        ({"weight_dtype": "int4", "engine": "pytorch-eager"}, "allowed: engine vllm"),
    ],
)
def test_what_cannot_run_is_one_line(kw, message):
    with pytest.raises(StepError, match=message) as err:
        StepModel("llama3-8b", "a100-sxm-80gb", **kw)
    assert "\n" not in str(err.value)


def test_energy_meter_streams_the_stored_weights(h100):
    bf16 = EnergyMeter.for_step_model(h100["bf16"])
    int4 = EnergyMeter.for_step_model(h100["int4"])
    fp8 = EnergyMeter.for_step_model(h100["fp8"])
    assert bf16 is not None and int4 is not None and fp8 is not None
    assert bf16.weight_bytes == 2.0 * h100["bf16"].model.num_params
    assert int4.weight_bytes == h100["int4"].weight_bytes_total < bf16.weight_bytes / 2.5
    assert (bf16.dtype, int4.dtype, fp8.dtype) == ("bf16", "bf16", "fp8")


def test_gpt_oss_mxfp4_experts_match_the_model_card():
    """gpt-oss ships its MoE experts in MXFP4 (4-bit e2m1 + one e8m0 scale per 32: 4.25
    bits), the rest in bf16; OpenAI's gpt-oss model card lists checkpoints of 60.8 GiB
    (120b) and 12.8 GiB (20b). Validation only: nothing is fitted to it."""
    from pathlib import Path

    from costmodels.steps.serving import StepModel
    from workloads.decompose.quant import weight_format
    from workloads.models import load_model

    assert weight_format("mxfp4").bytes_per_weight == pytest.approx(4.25 / 8)
    root = Path(__file__).resolve().parents[3] / "examples" / "models"
    for name, gib in (("gpt-oss-120b", 60.8), ("gpt-oss-20b", 12.8)):
        m = load_model(root / f"{name}.config.json")
        assert m.checkpoint_weights == "mxfp4"
        sm = StepModel(m, "h200-sxm", weight_dtype="mxfp4")
        assert sm.weight_bytes_total / 2**30 == pytest.approx(gib, abs=0.05)
    # quantised experts run as weight-only GEMMs; attention stays bf16
    from workloads.decompose import tp_shard
    from workloads.decompose.serving import serving_templates

    tpls = serving_templates(m, tp_shard(m, 1), weight_dtype="mxfp4")["layer"]
    bits = {t.name: t.weight_bits for t in tpls if t.op == "gemm"}
    assert bits["expert_up"] == bits["expert_down"] == 4 and not bits.get("qkv_proj")


def test_mxfp4_needs_experts_and_fits_gpt_oss_120b_on_one_h100():
    from pathlib import Path

    from simcli.scenario.hardware import resolve_hardware
    from simcli.scenario.step import build_step_model
    from workloads.models import get_model, load_model

    hw = resolve_hardware("h100-sxm", 1)
    with pytest.raises(ValueError, match="mxfp4 stores MoE experts"):
        build_step_model(get_model("llama3-8b"), hw, tp=1, weight_dtype="mxfp4")
    cfg = Path(__file__).resolve().parents[3] / "examples" / "models" / "gpt-oss-120b.config.json"
    m = load_model(cfg)
    with pytest.raises(Exception, match="checkpoint's --weight-dtype mxfp4"):
        build_step_model(m, hw, tp=1)
    assert build_step_model(m, hw, tp=1, weight_dtype="mxfp4").kv_capacity_tokens(16, 0.9) > 0
