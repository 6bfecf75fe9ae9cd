"""Engine profiles (costmodels.steps.engines) and how the step model prices them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from costmodels.steps.engines import (
    ENGINE_IDS,
    EngineError,
    EngineProfile,
    load_engine,
    padded_size,
)
from costmodels.steps.serving import StepModel
from costmodels.steps.serving_grid import StepError

NONE = np.zeros(0, np.int64)


@pytest.mark.parametrize("engine", ENGINE_IDS)
def test_every_shipped_profile_loads_with_a_source_for_every_number(engine):
    p = load_engine(engine)
    assert p.id == engine and p.version_family
    assert p.unsourced_numbers() == []
    assert "default" in p.kernels


def test_the_registry_holds_the_engines_and_refuses_others_in_one_line():
    assert {"vllm", "vllm-v0", "sglang", "trtllm", "pytorch-eager"} <= set(ENGINE_IDS)
    with pytest.raises(EngineError, match="unknown engine 'tgi'; allowed: .*vllm-v0"):
        load_engine("tgi")
    with pytest.raises(StepError, match="allowed:"):
        StepModel("llama3-8b", "h100-sxm", engine="tgi")


def test_a_number_without_source_is_found():
    data = load_engine("vllm").model_dump()
    data["host"]["sources"].pop("per_step_s")
    assert "host.per_step_s" in EngineProfile.model_validate(data).unsourced_numbers()


def test_padding_picks_the_next_capture_size():
    sizes = load_engine("vllm").capture_sizes("h100-sxm", 80.0, 1, 1024)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-1] == 512
    assert padded_size(sizes, 3) == 4 and padded_size(sizes, 17) == 24
    assert padded_size(sizes, 257) == 272 and padded_size(sizes, 513) is None
    # vLLM caps the list at 2 x max_num_seqs; SGLang at cuda_graph_max_bs of the GPU's tier
    assert load_engine("vllm").capture_sizes("h100-sxm", 80.0, 1, 64)[-1] == 128
    assert load_engine("sglang").capture_sizes("h100-sxm", 80.0, 1)[-1] == 256
    assert load_engine("sglang").capture_sizes("h100-sxm", 80.0, 4)[-1] == 512
    sm = StepModel("llama3-8b", "h100-sxm", engine="vllm", max_num_seqs=1024)
    plan = sm.launch_plan(NONE, NONE, np.full(17, 500))
    assert plan["cuda_graph"] == "full" and plan["padded_tokens"] == 24
    # GEMMs run on the padded rows: 17 decodes cost what 24 cost, their attention aside
    a = sm.step_s(NONE, NONE, np.full(17, 1))
    b = sm.step_s(NONE, NONE, np.full(24, 1))
    host = sm.profile.host
    # (their attention over 17 vs 24 one-token contexts differs by ~20 us of 6.6 ms)
    assert a - host.step_s(17, 17) == pytest.approx(b - host.step_s(24, 24), rel=5e-3)
    assert a - host.step_s(17, 17) <= b - host.step_s(24, 24)
    big = sm.launch_plan(NONE, NONE, np.full(600, 500))
    assert big["cuda_graph"] == "none" and big["padded_tokens"] == 600


def test_host_time_adds_serially_or_overlaps():
    sm = StepModel("llama3-8b", "h100-sxm", engine="vllm", max_num_seqs=1024)
    dc = np.full(64, 1000)
    host = 0.0005 + 64 * 1e-5
    assert sm.launch_plan(NONE, NONE, dc)["host_s"] == pytest.approx(host)
    serial = sm.step_s(NONE, NONE, dc)
    parts = sm.breakdown(NONE, NONE, dc)
    assert parts["host"] == pytest.approx(host, rel=1e-6)
    assert sum(parts.values()) == pytest.approx(serial, rel=1e-12)
    gpu = serial - host
    # the same engine with its host work overlapped: max(gpu, host)
    overlapped = sm.launch.host.model_copy(update={"overlap": True})
    sm.launch = dataclasses.replace(sm.launch, host=overlapped)
    sm._decode_memo.clear()
    assert sm.step_s(NONE, NONE, dc) == pytest.approx(gpu, rel=1e-12)
    slow = overlapped.model_copy(update={"per_step_s": 1.0})
    sm.launch = dataclasses.replace(sm.launch, host=slow)
    sm._decode_memo.clear()
    assert sm.step_s(NONE, NONE, dc) == pytest.approx(1.0 + 64 * 1e-5)


def test_the_eager_engine_is_priced_as_before():
    sm = StepModel("llama3-8b", "h100-sxm", engine="pytorch-eager")
    assert (sm.prefill_backend, sm.decode_backend) == ("cudnn", "cudnn")
    plan = sm.launch_plan(NONE, NONE, np.full(37, 100))
    assert plan["padded_tokens"] == 37 and plan["host_s"] == 0.0  # exact graphs, no host


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_h200_decode_is_faster_by_about_the_bandwidth_ratio(engine):
    """Hopper engines price decode attention with FlashInfer's paged decode, measured on
    both GPUs (3.0 / 4.4 TB/s of KV): at batch 224 x 3k context, H200 (4.8 TB/s) beats
    H100 (3.35 TB/s) by most of the 1.43 ratio."""
    dc = np.full(224, 3000)
    t = {}
    for gpu in ("h100-sxm", "h200-sxm"):
        sm = StepModel("llama3-8b", gpu, engine=engine, max_num_seqs=1024)
        assert sm.decode_backend == "flashinfer"
        t[gpu] = sm.step_s(NONE, NONE, dc)
    assert 1.25 < t["h100-sxm"] / t["h200-sxm"] < 1.5


def test_attn_backend_overrides_the_engine_mapping():
    sm = StepModel("llama3-8b", "h200-sxm", engine="sglang", attn_backend="flash")
    assert (sm.prefill_backend, sm.decode_backend) == ("flash", "flash")
    a100 = StepModel("llama3-8b", "a100-sxm-80gb", engine="vllm")
    assert a100.decode_backend == "flash"  # FA2 on Ampere


def test_defaults_follow_the_gpu_tier():
    v1 = load_engine("vllm")
    assert v1.defaults_for("h100-sxm", 80.0).max_num_seqs == 1024
    assert v1.defaults_for("h200-sxm", 141.0).max_num_batched_tokens == 8192
    assert v1.defaults_for("a100-sxm-80gb", 80.0).max_num_batched_tokens == 2048
    sg = load_engine("sglang")
    assert sg.defaults_for("a100-sxm-40gb", 40.0).max_num_batched_tokens == 4096
    assert load_engine("trtllm").defaults.scheduler == "trtllm"


def test_frontend_functions():
    v0 = load_engine("vllm-v0")
    assert v0.frontend.in_engine_process and not load_engine("vllm").frontend.in_engine_process
    assert v0.frontend_ingress_s(1000) == pytest.approx(1000 * 3.07e-6)
    assert v0.frontend_egress_s(10) == pytest.approx(0.043)
    assert load_engine("sglang").frontend_egress_s(10) == 0.0  # no public figure



def test_multi_step_scheduling_amortises_the_host_work():
    """vLLM V0's --num-scheduler-steps n: each iteration carries 1/n of the host work."""
    dc = np.full(64, 500)
    one = StepModel("llama3-8b", "a100-sxm-80gb", engine="vllm-v0")
    ten = StepModel("llama3-8b", "a100-sxm-80gb", engine="vllm-v0", scheduler_steps=10)
    host = one.launch.host.step_s(64, 64)
    assert one.step_s(NONE, NONE, dc) - ten.step_s(NONE, NONE, dc) == pytest.approx(0.9 * host)
    # a prefill is a single step of its own: it carries all the host work
    pn, pp = np.array([512]), np.array([0])
    assert ten.step_s(pn, pp, NONE) == pytest.approx(one.step_s(pn, pp, NONE))
    with pytest.raises(StepError, match="scheduler_steps"):
        StepModel("llama3-8b", "a100-sxm-80gb", engine="vllm-v0", scheduler_steps=0)


def test_trtllm_takes_its_fraction_of_the_free_memory():
    """TensorRT-LLM's free_gpu_memory_fraction is of what weights, activations and runtime
    leave; vLLM's gpu_memory_utilization is of the whole GPU."""
    kw = dict(tp=2, weight_dtype="fp8", kv_cache_dtype="fp8", max_num_seqs=1024,
              max_num_batched_tokens=8192)  # fmt: skip
    trt = StepModel("llama3-70b", "h100-sxm", engine="trtllm", **kw)
    vllm = StepModel("llama3-70b", "h100-sxm", engine="vllm", **kw)
    for util in (0.5, 0.9):
        t, v = trt.memory_bytes_per_gpu(util), vllm.memory_bytes_per_gpu(util)
        others = t["weights"] + t["activations"] + t["non_torch"] + t["cuda_graphs"]
        assert t["kv_cache"] == pytest.approx(util * (trt.gpu.memory_bytes - others))
        assert v["kv_cache"] == pytest.approx(util * vllm.gpu.memory_bytes - others)
        assert t["kv_cache"] > v["kv_cache"]
    assert trt.kv_capacity_tokens(32, 0.9) > vllm.kv_capacity_tokens(32, 0.9)


def test_pre_xqa_trtllm_reads_a_kv_head_per_query_head():
    """TensorRT-LLM 0.5-0.6's masked MHA kernel runs a block per query head: a GQA model's
    decode attention moves group-size times the KV of the GQA-aware kernel; an MHA model's
    is unchanged."""
    ctx = np.full(64, 4096)
    for model, group in (("llama3-70b", 8), ("llama2-7b", 1)):
        kw = dict(tp=2 if group > 1 else 1, max_num_seqs=256, max_num_batched_tokens=8192)
        old = StepModel(model, "h100-sxm", engine="trtllm-0.6", **kw)
        new = StepModel(model, "h100-sxm", engine="trtllm", **kw)
        a_old = old._decode_attention_work(np.array([64]), np.array([4096.0]))
        a_new = new._decode_attention_work(np.array([64]), np.array([4096.0]))
        if group == 1:
            assert a_old == pytest.approx(a_new)
            assert old.step_s([], [], ctx) == pytest.approx(new.step_s([], [], ctx), rel=1e-6)
        else:
            assert 0.6 * group < a_old[0] / a_new[0] < 1.2 * group
            assert old.step_s([], [], ctx) > 1.5 * new.step_s([], [], ctx)
