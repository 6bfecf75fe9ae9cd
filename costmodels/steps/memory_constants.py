"""Constants of the training memory estimator (:mod:`costmodels.steps.memory`): the
bytes frameworks keep per parameter, per saved tensor and per logit, and the memory
outside PyTorch's allocator; each with where it was measured or read."""

from __future__ import annotations

from hardware_specs.schema import MIB

# --------------------------------------------------------------------------- constants

# Allocator fragmentation: PyTorch's caching allocator reserves more than it hands out
# (rounding to blocks, segments split by lifetimes). The H100 steps (expandable_segments,
# calibrate/data/steps-h100) reserved 1.1-4.6% over their peak allocation; 5% is the top
# of that range, applied to every tensor byte.
ALLOCATOR_FRAGMENTATION = 0.05
# cuBLAS and cuBLASLt workspaces, 32 MiB each on Hopper, allocated through the caching
# allocator (so counted by torch.cuda.max_memory_allocated): measured 64 MiB on H100 with
# torch 2.11 / CUDA 13 (the intercept of the per-token memory of the H100 steps).
LIBRARY_WORKSPACE_BYTES = 64 * MIB
# Memory the process holds outside the allocator: CUDA context, kernel images, cuBLAS and
# cuDNN handles. Measured on H100, torch 2.11 / CUDA 13 / cuDNN 9.19, after a training
# step: cudaMemGetInfo used minus torch.cuda.memory_reserved = 767 MiB.
CUDA_CONTEXT_BYTES = 767 * MIB
# Device memory no process can allocate: nvidia-smi total 81559 MiB vs cudaMemGetInfo
# total 81079 MiB (79.18 GiB) on H100 80GB HBM3; taken as the same on every GPU.
DRIVER_RESERVED_BYTES = 480 * MIB
# NCCL's own buffers (cudaMalloc'd outside the allocator; NCCL_BUFFSIZE = 4 MiB per
# channel, peer and protocol, times up to 32 channels): an order-of-magnitude allowance
# for a DP and a TP/PP communicator. Counted for Megatron only: the pytorch framework's
# validation data (one GPU, DDP/FSDP, TP/PP on H200s) measured the allocator's peaks.
NCCL_BUFFER_BYTES = 512 * MIB
# torch.compile'd eager blocks (framework pytorch-compile), bytes saved per token and layer
# per hidden / FFN element, and what torchao float8 saves less (see _layer_acts)
COMPILED_H_BYTES, COMPILED_F_BYTES = 10.0, 6.0
FP8_SAVED_H_BYTES, FP8_SAVED_F_BYTES = 6.0, 2.5
COMPILED_FP8_COPY_BYTES = 1.0
# Activations are bf16 (fp16 under fp16-mixed); fp8 plans keep them in bf16 too except
# the inputs saved for the fp8 GEMMs (Transformer Engine saves those in fp8).
ACT_BYTES = 2

# Bytes per parameter, indexed like workloads.plan.PRECISIONS
# (bf16-mixed, fp16-mixed, bf16, fp8):
#   weight:    the resident parameters
#   grad:      gradients
#   optim:     optimizer state (Adam m and v, fp32 master weights, fp32 grad copies)
#   layer_copy / head_copy: per-forward copies of the GEMM weights kept for the backward
#              (autocast's bf16 casts; fp8 casts with their transposes)
# megatron (Megatron-LM docs, distrib_optimizer.md, table of bytes per parameter): bf16
#   params with fp32 grads (bf16 forces accumulate_allreduce_grads_in_fp32) and fp32
#   master + m + v = 18 B (6 + 12/d with the distributed optimizer); fp16 params and
#   grads, fp32 master + m + v + fp32 grad copy = 20 B (4 + 16/d); pure bf16 (no master
#   weights, m and v in bf16) = 8 B; fp8 = bf16-mixed plus Transformer Engine's fp8 weight
#   and transpose (2 B per layer GEMM weight; the LM head stays bf16).
# pytorch: fp32 params (the master weights), fp32 grads, fp32 m and v = 16 B (the "16
#   bytes/param" of ZeRO's K = 12 plus 4, with no separate low-precision copy); autocast
#   keeps a bf16 copy of every GEMM weight from the forward to the backward (2 B); pure
#   bf16 = 2 + 2 + 4; fp8 (torchao float8) = bf16-mixed with fp8 weight + transpose.
STATE_BYTES: dict[str, dict[str, tuple[int, ...]]] = {
    "megatron": {
        "weight": (2, 2, 2, 2),
        "grad": (4, 2, 2, 4),
        "optim": (12, 16, 4, 12),
        "layer_copy": (0, 0, 0, 2),
        "head_copy": (0, 0, 0, 0),
    },
    "pytorch": {
        "weight": (4, 4, 2, 4),
        "grad": (4, 4, 2, 4),
        "optim": (8, 8, 4, 8),
        "layer_copy": (2, 2, 0, 2),
        "head_copy": (2, 2, 0, 2),
    },
}
# Bytes of a saved GEMM input: fp8 GEMMs save their fp8-cast input (1 B), others bf16.
GEMM_INPUT_BYTES = (2, 2, 2, 1)
# Bytes per logit (fp32 loss buffers; Megatron's vocab_parallel_cross_entropy):
# (at the peak of the micro-batch whose loss runs, kept per other in-flight micro-batch).
#   megatron: bf16 logits 2 + their fp32 copy 4, which becomes the saved softmax and then,
#     in place, the gradient -> 6 peak, 4 kept.
#   pytorch (autocast): bf16 logits 2 + fp32 log-softmax output 4 + its fp32 gradient 4 =
#     10 peak (measured on H100: the peak is inside the cross-entropy backward), 6 kept
#     after the forward (logits and log-softmax); pure bf16: 2 + 2 + 2 peak, 4 kept.
LOGIT_BYTES: dict[str, tuple[tuple[int, int], ...]] = {
    "megatron": ((6, 4), (6, 4), (6, 4), (6, 4)),
    "pytorch": ((10, 6), (10, 6), (6, 4), (10, 6)),
}
