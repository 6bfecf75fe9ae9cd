"""A small Kineto-style trace with known answers (times in microseconds, as in the file).

Two ``ProfilerStep`` annotations on the CPU; kernels on compute stream 7, NCCL on stream
20, one unknown kernel on stream 21; every GPU event has its launch (same correlation id).

Step 1 (GPU window 20-170 µs = 150):
  gemm 20-60, flash fwd 60-90, [idle 90-100: rsqrt launched at 95 -> host-bound 10],
  rsqrt (norm) 100-110, all-reduce 105-140 (5 overlapped, 30 exposed),
  [idle 140-150: silu launched at 60 -> other 10], silu 150-170, custom kernel 150-155.
  compute 100, exposed comm 30, host-bound 10, other 10; comm 35, overlapped 5.
Step 2 (GPU window 320-450 µs = 130):
  cuDNN SDPA backward 320-380, embedding 380-390, memset 390-392,
  [idle 392-410: AdamW launched at 400 -> host-bound 18], AdamW 410-430,
  send/recv 430-445 (pipeline wait 15), memcpy 445-450.
  compute 97, host-bound 18, pipeline wait 15.
Phases: ``forward`` (CPU 5-50 in step 1: gemm + flash = 70) and ``optimizer`` (CPU 395-420
in step 2: AdamW = 20).

Noise a real file has: metadata, flow and instant events, a CPU op, an event without
``dur``, runtime calls that launch nothing, a runtime call without ``args``, a GPU-side
``ProfilerStep`` annotation.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

GEMM = "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
FLASH = (
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
    "false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> "
    ">, false, true, false, false, true, true, false>(Flash_fwd_params)"
)
RSQRT = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() "
    "const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::rsqrt_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() "
    "const::{lambda(float)#1}, std::array<char*, 2ul>)"
)
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
SILU = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel("
    "at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() "
    "const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, "
    "at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}, std::array<char*, 2ul>)"
)
CUSTOM = "my_custom_kernel_v2(float*, int)"
SDPA_BWD = (
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_"
    "64x128x128_4x1x1_kernel0_0"
)
EMBED = (
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, "
    "2, 2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, "
    "at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<long, "
    "unsigned int>, int, int, unsigned int, unsigned int, long)"
)
MEMSET = "Memset (Device)"
ADAMW = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::"
    "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, "
    "double, double, double, bool, float*, float*>(at::native::(anonymous namespace)::"
    "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
    "<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, "
    "double, bool, float*, float*)"
)
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
MEMCPY = "Memcpy DtoD (Device -> Device)"

#: (name, cat, gpu start, gpu end, stream, launch ts, launch api, correlation)
GPU_EVENTS: list[tuple[str, str, float, float, int, float, str, int]] = [
    (GEMM, "kernel", 20, 60, 7, 10, "cudaLaunchKernel", 1),
    (FLASH, "kernel", 60, 90, 7, 15, "cudaLaunchKernel", 2),
    (RSQRT, "kernel", 100, 110, 7, 95, "cudaLaunchKernel", 3),
    (ALLREDUCE, "kernel", 105, 140, 20, 52, "cuLaunchKernelEx", 4),
    (SILU, "kernel", 150, 170, 7, 60, "cudaLaunchKernel", 5),
    (CUSTOM, "kernel", 150, 155, 21, 120, "cudaLaunchKernel", 6),
    (SDPA_BWD, "kernel", 320, 380, 7, 305, "cudaLaunchKernel", 11),
    (EMBED, "kernel", 380, 390, 7, 306, "cudaLaunchKernel", 12),
    (MEMSET, "gpu_memset", 390, 392, 7, 307, "cudaMemsetAsync", 13),
    (ADAMW, "kernel", 410, 430, 7, 400, "cudaLaunchKernel", 14),
    (SENDRECV, "kernel", 430, 445, 20, 308, "cuLaunchKernelEx", 15),
    (MEMCPY, "gpu_memcpy", 445, 450, 7, 309, "cudaMemcpyAsync", 16),
]
EXPECTED_CLASS: dict[str, tuple[str, str]] = {
    GEMM: ("gemm", ""),
    FLASH: ("attn_fwd", "flash"),
    RSQRT: ("norm", "rsqrt"),
    ALLREDUCE: ("collective", "all_reduce"),
    SILU: ("elementwise", "silu"),
    CUSTOM: ("other", ""),
    SDPA_BWD: ("attn_bwd", "cudnn"),
    EMBED: ("embedding", ""),
    MEMSET: ("memcpy", "memset"),
    ADAMW: ("optimizer", ""),
    SENDRECV: ("collective", "send_recv"),
    MEMCPY: ("memcpy", "memcpy"),
}
#: measured µs per step of each class (mean of the two steps)
EXPECTED_US_PER_STEP: dict[str, float] = {
    "gemm": 20.0,
    "attn_fwd": 15.0,
    "attn_bwd": 30.0,
    "norm": 5.0,
    "elementwise": 10.0,
    "embedding": 5.0,
    "memcpy": 3.5,
    "optimizer": 10.0,
    "collective": 25.0,
    "other": 2.5,
}
BASE_US = 1_700_000_000_000_000.0  # absolute microseconds, as older Kineto files have


def events(base_us: float = BASE_US) -> list[dict[str, Any]]:
    """The trace's event list (see the module docstring)."""
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": 123, "tid": 123, "args": {"name": "main"}},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": base_us + 1, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": base_us + 9, "dur": 5,
         "pid": 123, "tid": 123, "args": {"External id": 3}},
        {"ph": "X", "cat": "kernel", "name": "no_dur_kernel", "ts": base_us + 2, "pid": 0,
         "tid": 7, "args": {"stream": 7, "device": 0}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize",
         "ts": base_us + 451, "dur": 2, "pid": 123, "tid": 123, "args": {"correlation": 99}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGetDevice", "ts": base_us + 452,
         "dur": 1, "pid": 123, "tid": 123},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": base_us + 0,
         "dur": 300, "pid": 123, "tid": 123},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": base_us + 300,
         "dur": 300, "pid": 123, "tid": 123},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "ts": base_us + 20,
         "dur": 150, "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "user_annotation", "name": "forward", "ts": base_us + 5, "dur": 45,
         "pid": 123, "tid": 123},
        {"ph": "X", "cat": "user_annotation", "name": "optimizer", "ts": base_us + 395,
         "dur": 25, "pid": 123, "tid": 123},
    ]  # fmt: skip
    for name, cat, start, end, stream, launch, api, corr in GPU_EVENTS:
        out.append(
            {
                "ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream,
                "ts": base_us + start, "dur": end - start,
                "args": {"device": 0, "stream": stream, "correlation": corr,
                         "grid": [132, 1, 1], "block": [384, 1, 1]},
            }
        )  # fmt: skip
        out.append(
            {
                "ph": "X", "cat": "cuda_driver" if api.startswith("cu") and not
                api.startswith("cuda") else "cuda_runtime", "name": api, "pid": 123,
                "tid": 123, "ts": base_us + launch, "dur": 3, "args": {"correlation": corr},
            }
        )  # fmt: skip
        out.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "ts": base_us + launch})
    return out


def write_trace(path: Path, *, gz: bool = False, shape: str = "object") -> Path:
    """Write the trace as ``export_chrome_trace`` would (``shape``: ``object`` with
    ``traceEvents``, ``nested`` one level down, or a bare ``list``)."""
    evs = events()
    doc: Any = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
                "traceEvents": evs}  # fmt: skip
    if shape == "nested":
        doc = {"profile": doc}
    elif shape == "list":
        doc = evs
    text = json.dumps(doc)
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path
