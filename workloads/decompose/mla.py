"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434, sec. 2.1) as op
templates, and the attention shapes its phases price.

Per token (paper's notation; ``d_c = kv_lora_rank``, ``d_c' = q_lora_rank``, ``d_h^R =
qk_rope_head_dim``, ``n_h`` heads of QK width ``d_h + d_h^R`` and value width ``d_v``):

- queries: ``c_Q = W^DQ h`` (eq. 12), RMSNorm, ``[q^C; q^R] = W^UQ c_Q`` (eqs. 13-14), or
  one ``q = W^Q h`` when ``q_lora_rank`` is null (DeepSeek-V2-Lite);
- keys and values: ``[c_KV; k^R] = W^DKV h`` with ``W^KR`` fused (eqs. 9, 15), RMSNorm on
  ``c_KV``, RoPE on ``q^R`` and the single shared ``k^R``; the KV cache keeps ``c_KV``
  and ``k^R``: ``d_c + d_h^R`` elements per token per layer, one vector for all heads;
- ``[k^C; v^C] = W^UK c_KV, W^UV c_KV`` (eqs. 10-11), attention, ``u = W^O o`` (eq. 18).

Tensor parallelism (vLLM's ``DeepseekV2MLAAttention``, Megatron's MLA): heads split;
the down-projections ``W^DQ`` and ``W^DKV`` are replicated (their outputs are per token,
not per head), so every TP rank computes and caches the whole latent: the latent KV is
replicated on each rank, not divided by ``tp``.

**Which form is priced.** Prefill and training run the *expanded* form: ``W^UK``/``W^UV``
up-project the latent into per-head keys and values and a FlashAttention-style kernel
runs ``n_h`` heads with QK width ``d_h + d_h^R`` and value width ``d_v``; it is priced
as an ``attn_fwd`` at the mean width ``(d_qk + d_v) / 2``, which reproduces both its
matmul FLOPs (``Q K^T`` at ``d_qk`` plus ``P V`` at ``d_v``) and its K+V bytes exactly.
Decode runs the *absorbed* form of vLLM/SGLang/FlashMLA: ``W^UK`` is absorbed into the
query (``q^C W^UK`` per head) and ``W^UV`` applied to the attention output, so attention
runs over the latent cache directly, MQA-like: ``n_h`` query heads against one KV head
of width ``d_c + d_h^R`` whose first ``d_c`` channels double as the value. It is priced
as an ``attn_decode`` with one KV head of width ``(d_c + d_h^R) / 2`` (``K`` and ``V`` of
that width are exactly the cached bytes read per token); its matmul FLOPs are then
1152/2176 of the absorbed kernel's for DeepSeek's dims, which only matters where decode
attention is compute-bound (many heads per rank). Decode is memory-bound on the cache
for a long context, and reading ``d_c + d_h^R`` elements instead of ``2 n_h d_h``
is the point of the absorbed form.

Per token the absorbed products (``W^UK`` on the query, ``W^UV`` on the output: ``n_h
d_h d_c + n_h d_c d_v`` MACs, the same weights) cost what the expanded up-projection of
that token's latent costs (``d_c n_h (d_h + d_v)`` MACs), so one ``kv_b_proj`` GEMM over
the step's tokens prices both forms. Not priced: the up-projection of *cached* context
in a chunked prefill (vLLM re-expands the cached latent of earlier chunks) and the
gradient all-reduce of the replicated down-projections in training.
"""

from __future__ import annotations

from typing import Any

from hardware_specs.schema import DTYPE_BYTES, Dtype
from workloads.decompose.shard import TPShard
from workloads.decompose.templates import OpTemplate, elementwise, gemm, traffic
from workloads.models import ModelConfig
from workloads.ops import OpKind


def mla_templates(
    model: ModelConfig,
    sh: TPShard,
    dtype: str,
    kernels: str,
    serving: bool,
    kv_dtype: str | None,
    attention: OpTemplate,
) -> list[OpTemplate]:
    """The attention block of an MLA layer on one TP rank, in execution order (between the
    TP region markers): projections, norms, RoPE, the latent cache write, ``attention``
    (the phase's placeholder) and the output projection."""
    h, e = model.hidden_size, DTYPE_BYTES[Dtype(dtype)]
    c, r = model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
    nope, dv, heads = model.qk_nope_head_dim, model.v_dim, sh.heads
    fused = kernels == "fused"
    out: list[OpTemplate] = []
    if model.q_lora_rank is None:
        out.append(gemm("q_proj", h, heads * model.head_dim, dtype, regather=fused))
        out.append(gemm("kv_a_proj", h, c + r, dtype, regather=fused))
    else:  # W^DQ and W^DKV fused (vLLM's fused_qkv_a_proj); replicated over TP
        out.append(gemm("qkv_a_proj", h, model.q_lora_rank + c + r, dtype, regather=fused))
        out.append(elementwise("q_a_norm", "rmsnorm", model.q_lora_rank, dtype, label="norm"))
        out.append(gemm("q_b_proj", model.q_lora_rank, heads * model.head_dim, dtype))
    out.append(elementwise("kv_a_norm", "rmsnorm", c, dtype, label="norm"))
    rope_width = (heads + 1) * r  # q^R of each local head and the shared k^R
    if kernels == "fused":
        out.append(elementwise("rope", OpKind.rope.value, rope_width, dtype))
    else:  # in-place rotary: read and write q^R and k^R
        out.append(traffic("rope", 2.0 * rope_width * e))
    if serving:  # the latent and k^R of each token into the paged cache
        kv_e = e if kv_dtype is None else DTYPE_BYTES[Dtype(kv_dtype)]
        out.append(traffic("kv_cache_write", (c + r) * (e + kv_e)))
    out.append(gemm("kv_b_proj", c, heads * (nope + dv), dtype))
    out += _indexer_templates(model, dtype, serving, e)
    out += [attention, gemm("o_proj", heads * dv, h, dtype)]
    return out


# DSA's indexer key cache per token per layer: fp8 keys and one fp32 scale per 128
# (vLLM's DeepseekV32IndexerCache: index_head_dim + index_head_dim // 128 * 4 bytes)
def indexer_cache_bytes(model: ModelConfig) -> int:
    """Bytes a token's indexer key costs per layer (0 without DSA)."""
    d = model.index_head_dim or 0
    return d + -(-d // 128) * 4 if d else 0


def _indexer_templates(model: ModelConfig, dtype: str, serving: bool, e: int) -> list[OpTemplate]:
    """DSA's lightning indexer per token (DeepSeek-V3.2; HF ``Indexer``, vLLM's
    ``Indexer``, replicated over TP): ``wq_b`` from the query latent to ``n`` heads of
    ``d``, ``wk`` and its LayerNorm, ``weights_proj`` (a weight per head), RoPE on the
    rope part of q and k, and the fp8 key into its cache. The scoring of every cached key
    (quadratic) is the step model's (:mod:`costmodels.steps.dsa_indexer`)."""
    if not model.index_n_heads or not model.index_head_dim:
        return []
    n, d, h = model.index_n_heads, model.index_head_dim, model.hidden_size
    r = model.qk_rope_head_dim or 0
    out = [
        gemm("indexer_wq_b", model.q_lora_rank or h, n * d, dtype, label="indexer"),
        gemm("indexer_wk", h, d, dtype, label="indexer"),
        elementwise("indexer_k_norm", "layernorm", d, dtype, label="indexer"),
        gemm("indexer_weights_proj", h, n, dtype, label="indexer"),
        traffic("indexer_rope", 2.0 * (n + 1) * r * e, "indexer"),
    ]
    if serving:  # read the bf16 key, write fp8 and its scale
        out.append(traffic("indexer_cache_write", d * e + indexer_cache_bytes(model), "indexer"))
    return out


def attention_dims(model: ModelConfig, sh: TPShard, phase: str) -> dict[str, Any]:
    """``heads_q``, ``heads_kv`` and ``head_dim`` of the attention op of ``phase``
    (``prefill``/``train`` or ``decode``) on one TP rank; see the module docstring."""
    if not model.is_mla:
        return {"heads_q": sh.heads, "heads_kv": sh.kv_heads, "head_dim": model.head_dim}
    if phase == "decode":  # absorbed: one latent KV head of d_c + d_h^R read as K and V
        width = model.kv_elements_per_token_per_layer
        return {"heads_q": sh.heads, "heads_kv": 1, "head_dim": -(-width // 2)}
    return {
        "heads_q": sh.heads,
        "heads_kv": sh.heads,
        "head_dim": -(-(model.head_dim + model.v_dim) // 2),
    }
