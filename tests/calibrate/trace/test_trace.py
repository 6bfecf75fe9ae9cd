"""calibrate.trace: loading, classification, steps and gaps of a trace with known answers
(tests/calibrate/trace/synthetic.py), and the decomposition's op classes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.trace import (
    OP_CLASSES,
    Prediction,
    ServingWorkload,
    TraceError,
    TrainWorkload,
    build_timeline,
    classify,
    classify_name,
    compare,
    load_trace,
    op_class,
    predict_serving,
    predict_train,
)
from calibrate.trace.kineto import launch_times
from calibrate.trace.timeline import Intervals
from tests.calibrate.trace import synthetic as syn

US = 1e-6
PHASES = {"forward": "forward", "optimizer": "optimizer"}


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    return syn.write_trace(tmp_path_factory.mktemp("trace") / "step.json")


@pytest.fixture(scope="module")
def trace(trace_path):
    return load_trace(trace_path)


@pytest.fixture(scope="module")
def timeline(trace):
    return build_timeline(trace, phase_markers=PHASES)


# --------------------------------------------------------------------------- loading


def test_loader_keeps_gpu_runtime_and_annotations_in_seconds(trace):
    gpu = trace.gpu
    assert len(gpu) == len(syn.GPU_EVENTS)
    assert trace.t0_us == syn.BASE_US  # the earliest kept event: ProfilerStep#1
    first = gpu.iloc[0]
    assert first["name"] == syn.GEMM
    assert first["ts_s"] == pytest.approx(20 * US, abs=1e-12)
    assert first["dur_s"] == pytest.approx(40 * US, abs=1e-12)
    assert (first["stream"], first["device"], first["correlation"]) == (7, 0, 1)
    assert first["grid"] == "132,1,1" and first["block"] == "384,1,1"
    assert set(gpu["cat"]) == {"kernel", "gpu_memcpy", "gpu_memset"}
    assert trace.skipped == 1  # the kernel without dur; the instant event is not complete
    assert set(trace.annotations["cat"]) == {"user_annotation", "gpu_user_annotation"}
    assert "aten::mm" not in set(trace.annotations["name"])
    assert trace.meta["deviceProperties"][0]["name"] == "NVIDIA H100"
    # every GPU event finds its launch; the runtime call without args launched nothing
    launch = launch_times(trace)
    expect = {name: launch_us for name, _, _, _, _, launch_us, _, _ in syn.GPU_EVENTS}
    got = dict(zip(gpu["name"], launch / US, strict=True))
    assert got == pytest.approx(expect)


@pytest.mark.parametrize(("gz", "shape"), [(True, "object"), (False, "nested"), (True, "list")])
def test_gzip_nested_and_bare_lists_load_the_same(tmp_path, trace, gz, shape):
    path = syn.write_trace(tmp_path / ("t.json.gz" if gz else "t.json"), gz=gz, shape=shape)
    other = load_trace(path)
    pd.testing.assert_frame_equal(other.gpu, trace.gpu)
    pd.testing.assert_frame_equal(other.annotations, trace.annotations)


def test_gzip_detected_by_content_not_name(tmp_path, trace):
    path = syn.write_trace(tmp_path / "t.json", gz=True)
    pd.testing.assert_frame_equal(load_trace(path).gpu, trace.gpu)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hello, not json", "not JSON"),
        (json.dumps({"schemaVersion": 1}).encode(), "no 'traceEvents' list"),
        (json.dumps([1, 2, 3]).encode(), "no GPU kernels"),
        (gzip.compress(b"{not json", mtime=0), "not JSON"),
        (b"\x1f\x8b\x08\x00garbage", "bad gzip data"),
    ],
)
def test_not_a_trace_is_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=message) as err:
        load_trace(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_missing_trace_is_oserror(tmp_path):
    with pytest.raises(OSError, match="does not exist"):
        load_trace(tmp_path / "nope.json")


# --------------------------------------------------------------------------- classes


def test_every_kernel_of_the_trace_is_classified(trace):
    got = classify(trace.gpu)
    for name, cls, detail in zip(got["name"], got["op_class"], got["detail"], strict=True):
        assert (cls, detail) == syn.EXPECTED_CLASS[name], name


REAL_NAMES = {  # names as H100/H200 torch 2.x traces spell them
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_"
    "segment_k_off_kernel__5x_cublas": ("gemm", ""),
    "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_cublas": ("gemm", "fp8"),
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_"
    "align8>(Params)": ("gemm", ""),
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(X)": ("gemm", ""),
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_"
    "kernel0_0": ("attn_fwd", "cudnn"),
    "void cudnn::fusion::compute_dot_do_o<true, 128>(int, int, int)": ("attn_bwd", "cudnn"),
    "void cudnn::fusion::convert_dq_to_16bits(int)": ("attn_bwd", "cudnn"),
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<X>(Flash_bwd_params)": (
        "attn_bwd",
        "flash",
    ),
    "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<X>"
    "::Params)": ("attn_fwd", "efficient"),
    "fmha_cutlassB_bf16_aligned_128x64_k128_sm80(X)": ("attn_bwd", "efficient"),
    "void flash::flash_fwd_splitkv_kernel<X>(Flash_fwd_params)": ("attn_fwd", "flash"),
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::pow_"
    "tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#1}"
    ", std::array<char*, 2ul> >(int, X)": ("norm", "pow"),
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<"
    "float, float, float, float>, unsigned int, float, 4, 4> >(X)": ("norm", "mean"),
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native"
    "::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at"
    "::TensorIteratorBase&, X const&)::{lambda(int)#1}>(int, X)": ("elementwise", "mul"),
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_"
    "wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::"
    "TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(X)": (
        "elementwise",
        "sum",
    ),
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::"
    "TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(c10::Float8_e4m3fn)#1}, "
    "X>(int, X)": ("fp8_cast", "direct_copy"),
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::"
    "array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)": (
        "memcpy",
        "fill",
    ),
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous "
    "namespace)::OpaqueType<2u>, unsigned int, 4, 64, 64>(X)": ("memcpy", "copy"),
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::"
    "native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)": (
        "softmax_ce",
        "",
    ),
    "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, "
    "float, long>(X)": ("softmax_ce", ""),
    "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, "
    "long>(X)": ("embedding", ""),
    "void at::native::vectorized_layer_norm_kernel<c10::BFloat16, float>(X)": ("norm", ""),
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": ("norm", "triton"),
    "triton_poi_fused_mul_silu_1": ("elementwise", "triton"),
    "triton_red_fused_abs_amax_2": ("fp8_cast", "triton"),
    "triton_poi_fused__to_copy_clamp_mul_reciprocal_3": ("fp8_cast", "triton"),
    "triton_poi_fused_add_cat_mul_neg_4": ("rope", "triton"),
    "triton_per_fused__log_softmax_nll_loss_5": ("softmax_ce", "triton"),
    "triton_tem_fused_mm_0": ("gemm", ""),
    "triton_poi_fused_add_6": ("elementwise", "triton"),
    "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)": ("collective", "all_gather"),
    "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(X)": ("collective", "reduce_scatter"),
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(X)": ("collective", "all_reduce"),
    "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(X)": ("rope", ""),
    "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, "
    "(vllm::Fp8KVCacheDataType)0>(X)": ("memcpy", ""),
    "void vllm::act_and_mul_kernel<c10::BFloat16, &(vllm::silu_kernel<c10::BFloat16>), true>(X)": (
        "elementwise",
        "mul",
    ),
    "void cudnn::fusion::fmha_reduce_head<true>(void const*, void*, unsigned int)": (
        "attn_bwd",
        "cudnn",
    ),
    "void cudnn::fusion::lean_reduction_kernel<false, false, false>(void*, float*)": (
        "attn_fwd",
        "cudnn",
    ),
    "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long)": (
        "embedding",
        "",
    ),
    "void at_cuda_detail::cub::detail::unique_by_key::DeviceUniqueByKeySweepKernel<X>(X)": (
        "embedding",
        "",
    ),
    "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT": ("gemm", ""),
    "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at"
    "::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, X)": (
        "elementwise",
        "copy",
    ),
    "triton_red_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_3": ("norm", "triton"),
    "triton_poi_fused__to_copy__unsafe_view_add_cat_mul_neg_split_transpose_view_3": (
        "rope",
        "triton",
    ),
    "some_new_kernel_nobody_knows": ("other", ""),
}


@pytest.mark.parametrize("name", sorted(REAL_NAMES))
def test_real_kernel_names(name):
    assert classify_name(name) == REAL_NAMES[name]


def test_memcpy_and_memset_by_category():
    assert classify_name("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy") == ("memcpy", "memcpy")
    assert classify_name("Memset (Device)", "gpu_memset") == ("memcpy", "memset")


# --------------------------------------------------------------------------- timeline


def test_intervals_union_and_membership():
    u = Intervals.union(np.array([5.0, 0.0, 2.0, 9.0]), np.array([7.0, 3.0, 4.0, 9.0]))
    assert u.starts.tolist() == [0.0, 5.0] and u.ends.tolist() == [4.0, 7.0]  # 9-9 is empty
    assert u.contains(np.array([0.0, 3.9, 4.0, 6.0, 7.0])).tolist() == [1, 1, 0, 1, 0]
    assert u.total == 6.0


def test_step_windows_from_profiler_steps(timeline):
    assert timeline.step_source == "cpu annotations"
    assert [s.window.name for s in timeline.steps] == ["ProfilerStep#1", "ProfilerStep#2"]
    windows = [(s.window.start_s / US, s.window.end_s / US) for s in timeline.steps]
    assert windows == [pytest.approx((20, 170)), pytest.approx((320, 450))]
    assert [s.events for s in timeline.steps] == [6, 6]
    assert timeline.wall_s == pytest.approx(140 * US)


def test_gap_attribution_exact(timeline):
    one, two = (s.row() for s in timeline.steps)
    approx = lambda us: pytest.approx(us * US, abs=1e-12)  # noqa: E731
    assert one["compute_s"] == approx(100)
    assert one["host_bound_s"] == approx(10)  # rsqrt launched at 95, GPU idle since 90
    assert one["exposed_comm_s"] == approx(30)  # all-reduce 105-140, compute until 110
    assert one["other_s"] == approx(10)  # silu launched at 60, GPU idle 140-150
    assert one["pipeline_wait_s"] == approx(0)
    assert one["comm_s"] == approx(35) and one["comm_overlapped_s"] == approx(5)
    assert one["busy_s"] == approx(130) and one["host_bound_gaps"] == 1
    assert two["compute_s"] == approx(97)
    assert two["host_bound_s"] == approx(18)  # AdamW launched at 400, GPU idle since 392
    assert two["pipeline_wait_s"] == approx(15)  # send/recv alone 430-445
    assert two["exposed_comm_s"] == approx(0) and two["other_s"] == approx(0)
    for row in (one, two):  # the window splits exactly
        parts = ("compute_s", "host_bound_s", "exposed_comm_s", "pipeline_wait_s", "other_s")
        assert sum(row[p] for p in parts) == pytest.approx(row["wall_s"], abs=1e-12)
    gaps = timeline.mean_gaps_s()
    assert {k: v / US for k, v in gaps.items()} == pytest.approx(
        {"host_bound": 14, "exposed_comm": 15, "pipeline_wait": 7.5, "other": 5}
    )


def _dummy_prediction() -> Prediction:
    return Prediction.from_rows(
        [
            ("forward", "qkv", "gemm", "gemm", 30 * US),
            ("forward", "attn", "attn_fwd", "attn_fwd", 15 * US),
            ("optimizer", "adamw", "adamw", "optimizer", 5 * US),
        ]
    )


def test_measured_per_class_unmatched_and_phases(timeline):
    result = compare(timeline, _dummy_prediction(), phase_markers=PHASES)
    classes = result.classes.set_index("op_class")
    assert list(classes.index) == list(OP_CLASSES)
    measured = {c: v / US for c, v in classes["measured_s"].items() if v > 0}
    assert measured == pytest.approx(syn.EXPECTED_US_PER_STEP)
    assert classes.loc["gemm", "error"] == pytest.approx(0.5)  # 30 predicted vs 20 measured
    assert classes.loc["attn_fwd", "error"] == pytest.approx(0.0)
    assert np.isnan(classes.loc["rope", "error"])  # nothing measured
    assert classes.loc["collective", "kernels_per_step"] == 1.0
    assert result.unmatched["name"].tolist() == [syn.CUSTOM]
    assert result.unmatched.loc[0, "count"] == 1
    assert result.unmatched.loc[0, "measured_s"] == pytest.approx(2.5 * US)
    phases = result.phases.set_index("phase")
    assert phases.loc["forward", "measured_kernel_s"] == pytest.approx(35 * US)  # 70 in step 1
    assert phases.loc["optimizer", "measured_kernel_s"] == pytest.approx(10 * US)
    assert phases.loc["optimizer", "predicted_s"] == pytest.approx(5 * US)
    assert result.step_measured_s == pytest.approx(140 * US)
    assert result.step_predicted_s == pytest.approx(50 * US)  # the kernel sum by default
    assert result.gaps_s()["total"] == pytest.approx(41.5 * US)


def test_without_step_annotations_the_trace_is_one_step(tmp_path):
    events = [e for e in syn.events() if e.get("cat") not in ("user_annotation",)]
    events = [e for e in events if e.get("cat") != "gpu_user_annotation"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    tl = build_timeline(load_trace(path))
    assert tl.step_source == "whole trace" and len(tl.steps) == 1
    assert tl.steps[0].window.wall_s == pytest.approx(430 * US)
    assert any("whole trace is one step" in w for w in tl.warnings)


def test_gpu_annotations_delimit_steps_without_cpu_ones(tmp_path):
    events = [e for e in syn.events() if e.get("cat") != "user_annotation"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    tl = build_timeline(load_trace(path))
    assert tl.step_source == "gpu annotations"
    assert [s.window.name for s in tl.steps] == ["ProfilerStep#1"]
    assert tl.steps[0].window.wall_s == pytest.approx(150 * US)


def test_custom_step_marker(trace):
    tl = build_timeline(trace, step_marker="optimizer")
    assert [s.window.name for s in tl.steps] == ["optimizer"]
    assert tl.steps[0].events == 1  # AdamW
    tl = build_timeline(trace, step_marker="train_step")  # not in the trace
    assert tl.step_source == "whole trace"
    assert any("'train_step'" in w for w in tl.warnings)


# --------------------------------------------------------------------------- predictions


def test_decomposition_ops_map_to_classes():
    assert op_class("qkv_proj", "gemm") == "gemm"
    assert op_class("attn", "attn_decode") == "attn_fwd"
    assert op_class("attn_bwd", "attn_bwd") == "attn_bwd"
    assert op_class("tp_allreduce_attn", "all_reduce") == "collective"
    assert op_class("rms1_pow", "copy") == "norm"  # eager RMSNorm kernels
    assert op_class("rms1_float", "copy") == "elementwise"
    assert op_class("rope_q_cat", "copy") == "memcpy"
    assert op_class("rope_q_cos", "copy") == "elementwise"
    assert op_class("fp8_cast_fwd", "copy") == "fp8_cast"
    assert op_class("kv_cache_write", "copy") == "memcpy"
    assert op_class("eager_cross_entropy", "copy") == "softmax_ce"
    assert op_class("optimizer_adamw", "adamw") == "optimizer"


@pytest.fixture(scope="module")
def h100():
    from costmodels.ops.select import get_cost_model

    return get_cost_model("h100-sxm", num_gpus=8)


def test_predict_train_covers_every_op(h100):
    from workloads.models import load_model
    from workloads.plan import make_plan

    model = load_model("llama3-8b")
    plan = make_plan(model, num_gpus=8, tp=2, dp=4, micro_batch=1, global_batch=8, seq_len=512,
                     recompute="selective")  # fmt: skip
    pred = predict_train(TrainWorkload(model, plan, "megatron"), h100, h100.system)
    assert set(pred.ops["op_class"]) <= set(OP_CLASSES) - {"other"}
    by = pred.by_class_s
    assert by["gemm"] > by["attn_fwd"] > 0 and by["attn_bwd"] > 0 and by["collective"] > 0
    assert by["optimizer"] > 0 and by["embedding"] > 0 and by["softmax_ce"] > 0
    assert sum(by.values()) == pytest.approx(sum(pred.by_phase_s.values()))
    assert set(pred.by_phase_s) == {"forward", "backward", "optimizer"}
    assert "dp_grad_all_reduce" in set(pred.ops["name"])
    assert any(n.startswith("recompute_attn") for n in pred.ops["name"])


def test_eager_training_norm_and_rope_run_as_eager_kernels(h100):
    from workloads.models import load_model
    from workloads.plan import make_plan

    model = load_model("llama3-8b")
    plan = make_plan(model, num_gpus=1, micro_batch=1, global_batch=1, seq_len=1024)
    eager = predict_train(TrainWorkload(model, plan, "pytorch"), h100, h100.system)
    fused = predict_train(TrainWorkload(model, plan, "megatron"), h100, h100.system)
    # no RoPE kernel in eager PyTorch: its multiplies are elementwise, its cat a copy
    assert eager.by_class_s["rope"] == 0 and fused.by_class_s["rope"] > 0
    assert eager.by_class_s["memcpy"] > 0 and eager.by_class_s["norm"] > 0
    assert sum(eager.by_class_s.values()) == pytest.approx(eager.ops["seconds"].sum())


@pytest.mark.parametrize(
    ("engine", "phase", "length"), [("vllm", "decode", 1024), ("pytorch-eager", "prefill", 512)]
)
def test_predict_serving_adds_up_to_the_step(h100, engine, phase, length):
    from workloads.models import load_model

    w = ServingWorkload(load_model("llama3-8b"), phase, batch=4, length=length, engine=engine)
    pred = predict_serving(w, h100, "h100-sxm")
    host = pred.host_stall_s or 0.0
    assert sum(pred.by_class_s.values()) + host == pytest.approx(pred.step_s, rel=1e-9)
    assert pred.by_class_s["other"] == 0 and pred.by_class_s["attn_fwd"] > 0
    # eager: host stalls of its launch queue; vllm: V1's host work per iteration (engine
    # profile: 0.5 ms + 10 us per sequence), none of it kernel time
    assert host > 0
    if engine == "vllm":
        assert host == pytest.approx(0.0005 + 4 * 1e-5, rel=1e-9)


# --------------------------------------------------------------------------- real traces

ROOT = Path(__file__).resolve().parents[3]
MEASURED = sorted((ROOT / "calibrate" / "data").glob("*/*/traces/*.trace.json.gz"))


def _one_per_suite() -> list[Path]:
    """The first trace of every suite folder of calibrate/data (trimmed H100/H200 traces of
    eager, compiled, fp8 and recomputed training, prefill, graph and eager decode)."""
    seen: dict[Path, Path] = {}
    for path in MEASURED:
        seen.setdefault(path.parent, path)
    return list(seen.values())


@pytest.mark.parametrize("path", _one_per_suite(), ids=lambda p: f"{p.parts[-4]}/{p.name}")
def test_measured_traces_are_fully_classified(path):
    tl = build_timeline(load_trace(path))
    assert tl.step_source == "cpu annotations" and len(tl.steps) == 2
    ev = tl.measured
    assert ev["launch_ts_s"].notna().all()  # graph replays too: one launch for all
    assert ev.loc[ev["op_class"] == "other", "dur_s"].sum() == 0, set(
        ev.loc[ev["op_class"] == "other", "name"]
    )
    assert {"gemm", "attn_fwd"} <= set(ev["op_class"])
    if "decode-graph" in path.name:
        assert tl.mean_gaps_s()["host_bound"] == 0
