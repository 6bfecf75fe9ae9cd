"""Memory of a vLLM-style serving replica: weights per pipeline stage, the activation
workspace of the profile run, the runtime's own memory, CUDA graph pools, and the KV-cache
capacity that is left (vLLM's ``determine_available_memory``).

:class:`VllmMemory` is mixed into :class:`costmodels.steps.serving.StepModel`, which
holds the attributes it reads (``model``, ``tp``, ``pp``, ``dtype``, ``weight_dtype``,
``kv_cache_dtype``, ``shape``, ``gpu``, ``max_num_batched_tokens``, ``max_num_seqs``).
Weights count at their stored size (:mod:`workloads.decompose.quant`: int4/int8/fp8 linear
layers with their scales; :mod:`workloads.decompose.sparsity`: 2:4 or unstructured linear
layers in cuSPARSELt's or Flash-LLM's format, :func:`costmodels.ops.sparse_gemm.
stored_bytes_per_weight`), the KV cache at ``kv_cache_dtype``'s.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from costmodels.ops.sparse_gemm import stored_bytes_per_weight
from costmodels.steps.kv_layout import KvLayout
from costmodels.steps.serving_grid import StepError
from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose import params_per_tp_rank, tp_shard
from workloads.decompose.quant import quantised_params_per_layer, weight_format
from workloads.decompose.sparsity import LinearSparsity, sparse_layer_params

GIB = 1024**3

# vLLM's profile of Llama-3-8B on one H100 at gpu_memory_utilization 0.9 (vllm-project/vllm
# PR #10511, 2024-12): total 79.22 GiB, weights 14.96 GiB, non-torch memory (CUDA context,
# cuBLAS workspaces) 1.79 GiB at tp=1 and 3.58 GiB at tp=2 (NCCL and custom all-reduce
# buffers), activation peak 1.26 GiB, KV cache 53.29 GiB.
NON_TORCH_BYTES = 1.79 * GIB
NON_TORCH_MULTI_GPU_BYTES = 3.58 * GIB
# CUDA graph pools: Llama-3.2-1B (16 layers) "Graph capturing finished in 14 secs, took
# 0.21 GiB" (vllm-project/vllm PR #11349 log); scaled by layers on the GPU.
GRAPH_POOL_BYTES_PER_LAYER = 0.21 * GIB / 16
DEFAULT_MAX_BATCHED_TOKENS = 8192  # vLLM's profile run size for an 8k context
DEFAULT_MAX_SEQS = 256  # vLLM's default max_num_seqs


class VllmMemory:
    """Where a serving GPU's memory goes (see the module docstring)."""

    model: Any
    tp: int
    pp: int
    dtype: str
    weight_dtype: str
    kv_cache_dtype: str
    shape: Any
    gpu: Any
    max_num_batched_tokens: int
    max_num_seqs: int
    sparsity: LinearSparsity = LinearSparsity()

    def _sparse_bytes(self, n: float, layers: int, tp: int, elt: int) -> float:
        """``n`` weights in the activation dtype but the sparse linear layers of ``layers``
        layers (one rank of ``tp``), which store their sparse format."""
        q = sparse_layer_params(self.model, tp_shard(self.model, tp), self.sparsity) * layers
        return float((n - q) * elt + q * stored_bytes_per_weight(self.sparsity.weight, elt))

    def _check_weights_fit(self) -> None:
        cap = self.gpu.memory_bytes
        for stage in range(self.pp):
            need = self.weight_bytes_per_gpu(stage) + self._non_torch_bytes()
            if need > cap:
                raise StepError(
                    f"{self.model.id} does not fit on {self.gpu.id} at tp={self.tp}, "
                    f"pp={self.pp}: weights {self.weight_bytes_per_gpu(stage) / GIB:.1f} GiB "
                    f"+ runtime {self._non_torch_bytes() / GIB:.2f} GiB per GPU > "
                    f"{cap / GIB:.1f} GiB; allowed: a larger --tp or --pp, or a bigger GPU"
                    + self._checkpoint_hint()
                )

    def _checkpoint_hint(self) -> str:
        """A model whose release stores its weights quantised, priced in another format."""
        ck = self.model.checkpoint_weights
        if ck and ck != self.weight_dtype and ck in ("mxfp4", "fp8", "int8", "int4"):
            return f", or its checkpoint's --weight-dtype {ck}"
        return ""

    def stage_layers(self) -> list[int]:
        """Layers per pipeline stage, as vLLM splits them (``get_pp_indices``: the
        remainder goes to the stages before the last, which also holds the LM head)."""
        base = [self.model.num_layers // self.pp] * self.pp
        for i in range(2, self.model.num_layers % self.pp + 2):
            base[-i] += 1
        return base

    def weight_bytes_per_gpu(self, stage: int = 0) -> float:
        """Weights on one GPU of ``stage``: a layer's quantised linear weights at the
        weight format's bytes (group scales included), everything else (embedding, LM head,
        norms, biases, router) in the activation dtype."""
        p = params_per_tp_rank(self.model, self.tp)
        layers = self.stage_layers()[stage]
        n = p["layer"] * layers
        if stage == 0:  # the embedding and a vision-language model's image encoder
            n += p["embedding"]
            n += self.model.vision.params_per_rank(self.tp) if self.model.vision else 0
        if stage == self.pp - 1:
            head = p["lm_head"] or (p["embedding"] if self.pp > 1 else 0)  # tied: own copy
            n += head + p["final_norm"]
        elt = DTYPE_BYTES[Dtype(self.dtype)]
        fmt = weight_format(self.weight_dtype)
        if self.sparsity.weight:  # (never quantised: no sparse kernel for those)
            return self._sparse_bytes(n, layers, self.tp, elt)
        if not fmt.quantised:
            return float(n * elt)
        q = quantised_params_per_layer(self.model, self.tp, fmt) * layers
        return float((n - q) * elt + q * fmt.bytes_per_weight)

    @property
    def weight_bytes_total(self) -> float:
        """Weights of the whole model as stored (what one replica holds over its tp x pp
        GPUs, less the copies TP replicates)."""
        m = self.model
        n = m.num_params
        fmt = weight_format(self.weight_dtype)
        elt = DTYPE_BYTES[Dtype(self.dtype)]
        if self.sparsity.weight:
            return self._sparse_bytes(n, m.num_layers, 1, elt)
        if not fmt.quantised:
            return float(n * elt)
        q = quantised_params_per_layer(m, 1, fmt) * m.num_layers
        return float((n - q) * elt + q * fmt.bytes_per_weight)

    def _non_torch_bytes(self) -> float:
        return NON_TORCH_BYTES if self.tp * self.pp == 1 else NON_TORCH_MULTI_GPU_BYTES

    def activation_bytes(self) -> float:
        """Peak activation workspace of a ``max_num_batched_tokens`` profile run: the
        largest live set of one layer (QKV out, gate-up out, its activation, two hidden
        buffers; bf16) plus fp32 logits, probabilities and log-probabilities of
        ``max_num_seqs`` sequences over the full vocabulary. For Llama-3-8B at 8192
        tokens: 1.24 GiB (vLLM profiled 1.26 GiB, PR #10511)."""
        s, m = self.shape, self.model
        up = (2 if m.gated_mlp else 1) * s.ffn
        per_token = s.elt * ((s.hq + 2 * s.hkv) * m.head_dim + up + s.ffn + 2 * m.hidden_size)
        logits = self.max_num_seqs * m.vocab_size * 4.0 * 3
        return float(self.max_num_batched_tokens * per_token + logits)

    def _kv_elements_per_layer_per_gpu(self) -> int:
        """KV-cache elements one token stores per layer on one TP rank: K and V of the
        rank's KV heads, or for MLA the whole latent ``c_KV`` and ``k^R`` (DeepSeek-V2
        sec. 2.1: ``kv_lora_rank + qk_rope_head_dim``): the down-projection is replicated
        over TP, so every rank caches the full latent and TP does not divide it."""
        m = self.model
        if m.is_mla:
            return m.kv_elements_per_token_per_layer
        return 2 * self.shape.hkv * m.head_dim

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token on one replica: all layers, every TP rank's heads (a KV
        head replicated over ranks when tp > num_kv_heads counts on each; an MLA latent
        on every rank)."""
        kv_elt = DTYPE_BYTES[Dtype(self.kv_cache_dtype)]
        per_layer = self._kv_elements_per_layer_per_gpu() * self.tp
        return float(self.model.attention_layers * per_layer * kv_elt)

    def kv_bytes_per_token_per_gpu(self, stage: int = 0) -> float:
        """KV bytes of one token on one GPU of ``stage``: its layers' share of the
        attention layers (a hybrid's mean layer)."""
        kv_elt = DTYPE_BYTES[Dtype(self.kv_cache_dtype)]
        m = self.model
        layers = self.stage_layers()[stage] * m.attention_layers / m.num_layers
        return float(layers * self._kv_elements_per_layer_per_gpu() * kv_elt)

    @property
    def state_tokens_per_seq(self) -> float:
        """A hybrid's recurrent state per sequence (the mixers' scan and conv state, in
        the model dtype, fp32 where the model asks for it; vLLM's
        ``mamba_ssm_cache_dtype``) as the KV tokens the same memory holds: a paged engine
        takes it from the same pool once per sequence (vLLM V1's hybrid allocator gives
        each mixer layer one state page per request). 0 without mixers."""
        state = self.model.state_bytes_per_seq(DTYPE_BYTES[Dtype(self.dtype)])
        return state / self.kv_bytes_per_token if state else 0.0

    @property
    def kv_layout(self) -> KvLayout | None:
        """A hybrid's :class:`KvLayout`: each sequence also holds its mixers' recurrent
        state; None for a model whose layers all keep a KV cache."""
        if not self.model.mixer:
            return None
        return KvLayout(
            state_tokens=self.state_tokens_per_seq,
            note=f"{self.model.mixer_layers} {self.model.mixer.kind} layers keep a constant "
            f"state per sequence; {self.model.attention_layers} attention layers keep the "
            "whole context",
        )

    def memory_bytes_per_gpu(
        self, gpu_memory_utilization: float = 0.9, stage: int = 0
    ) -> dict[str, float]:
        """Where one GPU's memory goes (vLLM's ``determine_available_memory``). An engine
        whose fraction is of the free memory (TensorRT-LLM's ``free_gpu_memory_fraction``,
        the profile's ``memory_fraction_of: free``) gives the KV cache that fraction of
        what weights, activations and runtime leave."""
        graphs = GRAPH_POOL_BYTES_PER_LAYER * self.stage_layers()[stage]
        parts = {
            "budget": self.gpu.memory_bytes * gpu_memory_utilization,
            "weights": self.weight_bytes_per_gpu(stage),
            "activations": self.activation_bytes(),
            "non_torch": self._non_torch_bytes(),
            "cuda_graphs": graphs,
        }
        others = sum(v for k, v in parts.items() if k != "budget")
        profile = getattr(self, "profile", None)
        if profile is not None and profile.defaults.memory_fraction_of == "free":
            free = self.gpu.memory_bytes - others
            parts["budget"] = others + max(free, 0.0) * gpu_memory_utilization
        parts["kv_cache"] = parts["budget"] - others
        return parts

    def kv_capacity_tokens(self, block_size: int = 16, gpu_memory_utilization: float = 0.9) -> int:
        """Tokens of KV cache one replica holds: (memory x utilisation - weights -
        activation workspace - non-torch memory - CUDA graph pools) / KV bytes per token on
        the fullest GPU, rounded down to whole blocks."""
        if not isinstance(block_size, int | np.integer) or block_size < 1:
            raise StepError(f"block_size must be a positive integer, got {block_size!r}")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise StepError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}"
            )
        tokens = math.inf
        for stage in range(self.pp):
            mem = self.memory_bytes_per_gpu(gpu_memory_utilization, stage)
            per_tok = self.kv_bytes_per_token_per_gpu(stage)
            if mem["kv_cache"] < per_tok * block_size:
                used = mem["budget"] - mem["kv_cache"]
                raise StepError(
                    f"{self.model.id} leaves no room for a KV block on {self.gpu.id} at "
                    f"tp={self.tp}, pp={self.pp}: weights, activations and runtime take "
                    f"{used / GIB:.1f} GiB of {mem['budget'] / GIB:.1f} GiB "
                    f"({gpu_memory_utilization:g} x {self.gpu.memory_gib} GiB); allowed: a "
                    "larger --tp or --pp, a bigger GPU or a higher gpu_memory_utilization"
                )
            tokens = min(tokens, mem["kv_cache"] / per_tok)
        return int(tokens // block_size) * int(block_size)
