"""Decoder-only transformer architectures: built-ins and HuggingFace ``config.json`` files.

A :class:`ModelConfig` holds the architecture numbers only (no parallelism, no costs).
Parameter counts are exact (they reproduce the published counts of the HF checkpoints
to the parameter), and model FLOPs follow Narayanan et al. 2021 eq. (3) / Chowdhery
et al. 2022 (PaLM) appendix B; see :meth:`ModelConfig.flops_per_token`.

Built-ins live in ``data/models.yaml``; :func:`load_model` takes a built-in id or a path
to a HuggingFace-style ``config.json`` (or the folder holding one).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from workloads.hf_families import FAMILY_TYPES, FamilyError, layer_attention, text_config
from workloads.hf_hybrids import HYBRID_TYPES, family_extra, hybrid_config
from workloads.mixers import LinearMixer
from workloads.vision import VisionEncoder


class ModelError(ValueError):
    """Unknown model id or invalid model file/config; the message is one line for users."""


class ModelConfig(BaseModel):
    """One decoder-only transformer (pre-norm, attention then MLP per layer).

    Dense models have ``num_experts == 1``; for a mixture-of-experts model every layer's
    MLP is replaced by ``num_experts`` experts of width ``moe_ffn_hidden_size`` (defaults
    to ``ffn_hidden_size``) and a bias-free linear router, ``experts_per_token`` of which
    each token visits (Mixtral's layout). Fine-grained MoE (DeepSeekMoE, Dai et al. 2024;
    Qwen2-MoE) adds always-on shared experts (one MLP of ``shared_expert_ffn_hidden_size``,
    optionally behind a sigmoid gate) and keeps ``num_dense_layers`` layers with a dense
    ``ffn_hidden_size`` MLP (DeepSeek's ``first_k_dense_replace``).

    Multi-head latent attention (MLA, DeepSeek-V2, arXiv 2405.04434 sec. 2.1) is on when
    ``kv_lora_rank`` is set: ``head_dim`` is then the query/key head width
    ``qk_nope_head_dim + qk_rope_head_dim``, ``v_head_dim`` the value head width, and the
    KV cache holds the ``kv_lora_rank``-wide latent plus the shared RoPE key per token and
    layer (see :mod:`workloads.decompose.mla`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="stable id, e.g. llama3-8b")
    name: str = Field(min_length=1)
    family: str = Field(min_length=1, description="llama, mistral, mixtral, qwen2, gpt, ...")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_heads: int = Field(gt=0, description="query heads")
    num_kv_heads: int = Field(gt=0, description="key/value heads (GQA); = num_heads for MHA")
    head_dim: int = Field(gt=0, description="per-head width; defaults to hidden_size / num_heads")
    ffn_hidden_size: int = Field(gt=0, description="MLP intermediate width (per expert for MoE)")
    vocab_size: int = Field(gt=0)
    max_seq_len: int = Field(gt=0, description="max positions (learned table size for 'learned')")
    activation: Literal["swiglu", "geglu", "gelu", "relu2"] = Field(
        description="swiglu / geglu: gated MLP act(gate) * up (SiLU; Gemma's tanh GELU); "
        "gelu / relu2: ungated up then down (GPT-2; Nemotron-H's squared ReLU)"
    )
    norm: Literal["rmsnorm", "layernorm"]
    position: Literal["rope", "learned"]
    tie_embeddings: bool = False
    qkv_bias: bool = False
    out_proj_bias: bool = Field(
        default=False, description="bias on the attention output projection"
    )
    mlp_bias: bool = Field(default=False, description="biases on the MLP linears (GPT-2/Megatron)")
    num_experts: int = Field(default=1, gt=0, description="1 = dense")
    experts_per_token: int = Field(default=1, gt=0, description="top-k routing")
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0)
    shared_expert_ffn_hidden_size: int | None = Field(
        default=None, gt=0, description="width of the always-on shared expert MLP (MoE only)"
    )
    shared_expert_gate: bool = Field(
        default=False, description="sigmoid gate Linear(hidden, 1) on the shared expert (Qwen2-MoE)"
    )
    num_dense_layers: int = Field(
        default=0, ge=0, description="MoE models: layers with a dense ffn_hidden_size MLP"
    )
    qk_norm: bool = Field(default=False, description="RMSNorm on each q and k head (Qwen3)")
    qk_norm_span: Literal["head", "layer"] = Field(
        default="head", description="qk_norm over each head (Qwen3, Gemma 3) or over all of "
        "q and all of k (MiniMax-M2's per-layer norm)"
    )  # fmt: skip
    kv_lora_rank: int | None = Field(
        default=None, gt=0, description="MLA latent KV width; None = standard attention"
    )
    q_lora_rank: int | None = Field(
        default=None, gt=0, description="MLA query down-projection rank; None = plain q_proj"
    )
    qk_rope_head_dim: int | None = Field(
        default=None, gt=0, description="MLA: decoupled RoPE part of head_dim (shared key)"
    )
    v_head_dim: int | None = Field(default=None, gt=0, description="MLA: value head width")
    index_n_heads: int | None = Field(
        default=None, gt=0, description="DSA lightning indexer heads (DeepSeek-V3.2)"
    )
    index_head_dim: int | None = Field(default=None, gt=0, description="DSA indexer head width")
    index_topk: int | None = Field(
        default=None, gt=0, description="DSA: key tokens each query attends to"
    )
    norms_per_layer: int = Field(
        default=2, ge=1, le=4, description="norms per layer: 2 pre-norms, 4 with Gemma's "
        "post-attention and post-MLP norms, 1 in Nemotron-H's single-mixer blocks"
    )  # fmt: skip
    final_logit_softcap: float | None = Field(
        default=None, gt=0, description="logits = cap * tanh(logits / cap) (Gemma 2)"
    )
    checkpoint_weights: str | None = Field(
        default=None, description="how the released checkpoint stores weights (gpt-oss: mxfp4)"
    )
    attention_sinks: bool = Field(
        default=False, description="a learned sink logit per query head (gpt-oss)"
    )
    router_bias: bool = Field(default=False, description="MoE router with a bias (gpt-oss)")
    lm_head_bias: bool = Field(default=False, description="a bias on the LM head (Phi-3.5-MoE)")
    sliding_window: int | None = Field(
        default=None, gt=0, description="keys a sliding-window layer attends to"
    )
    attention_chunk_size: int | None = Field(
        default=None, gt=0, description="tokens per chunk of a chunked-attention layer"
    )
    layer_attention: tuple[Literal["full", "sliding", "chunked"], ...] | None = Field(
        default=None, description="each layer's attention (HF layer_types); None = all full"
    )
    mixer: LinearMixer | None = Field(
        default=None, description="the linear-attention / state-space token mixer of the "
        "mixer_layers (workloads.mixers)"
    )  # fmt: skip
    mixer_layers: int = Field(default=0, ge=0, description="layers with the linear mixer")
    attention_free_layers: int = Field(
        default=0, ge=0, description="layers without softmax attention (hybrids)"
    )
    mlp_free_layers: int = Field(
        default=0, ge=0, description="layers without an MLP (Nemotron-H's mixer blocks)"
    )
    attention_output_gate: bool = Field(
        default=False, description="q_proj also emits a sigmoid gate on the attention "
        "output (Qwen3-Next's gated attention)"
    )  # fmt: skip
    vision: VisionEncoder | None = Field(
        default=None, description="a vision-language model's image encoder (workloads.vision)"
    )
    moe_imbalance: float = Field(
        default=1.0,
        ge=1.0,
        allow_inf_nan=False,
        description="routing skew: busiest expert's tokens over the mean (1 = balanced); a "
        "workload assumption carried with the model so every cost keyed on it sees it",
    )
    source: str = Field(min_length=1, description="where the numbers come from")

    @model_validator(mode="before")
    @classmethod
    def _default_head_dim(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("head_dim") is None:
            hidden, heads = data.get("hidden_size"), data.get("num_heads")
            if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
                if hidden % heads:
                    raise ValueError(
                        f"hidden_size ({hidden}) is not a multiple of num_heads ({heads}); "
                        "give head_dim explicitly"
                    )
                data = {**data, "head_dim": hidden // heads}
        return data

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) must be <= num_experts "
                f"({self.num_experts})"
            )
        if self.num_experts == 1 and self.moe_ffn_hidden_size is not None:
            raise ValueError("moe_ffn_hidden_size is only for num_experts > 1")
        if self.num_experts == 1 and (
            self.shared_expert_ffn_hidden_size or self.num_dense_layers or self.shared_expert_gate
        ):
            raise ValueError(
                "shared experts, shared_expert_gate and num_dense_layers are only for "
                "num_experts > 1"
            )
        if self.num_dense_layers + self.mlp_free_layers >= self.num_layers and self.is_moe:
            raise ValueError(
                f"num_dense_layers ({self.num_dense_layers}) must be < num_layers "
                f"({self.num_layers}) for an MoE model"
            )
        if (self.mixer is None) != (self.mixer_layers == 0):
            raise ValueError("mixer and mixer_layers > 0 go together")
        if (
            max(self.mixer_layers, self.attention_free_layers, self.mlp_free_layers)
            > (self.num_layers)
            or self.attention_free_layers == self.num_layers
        ):
            raise ValueError(
                "mixer_layers, attention_free_layers and mlp_free_layers count layers of "
                f"the {self.num_layers}; at least one layer keeps attention"
            )
        dsa = (self.index_n_heads, self.index_head_dim, self.index_topk)
        if any(v is not None for v in dsa) and (None in dsa or not self.kv_lora_rank):
            raise ValueError(
                "DSA needs index_n_heads, index_head_dim and index_topk, on an MLA model"
            )
        if self.layer_attention is not None:
            if len(self.layer_attention) != self.num_layers:
                raise ValueError(
                    f"layer_attention lists {len(self.layer_attention)} layers; the model "
                    f"has num_layers {self.num_layers}"
                )
            if "sliding" in self.layer_attention and self.sliding_window is None:
                raise ValueError("sliding layers need sliding_window")
            if "chunked" in self.layer_attention and self.attention_chunk_size is None:
                raise ValueError("chunked layers need attention_chunk_size")
            if {"sliding", "chunked"} <= set(self.layer_attention):
                raise ValueError("a model mixes sliding and chunked layers: not modelled")
        if self.moe_imbalance != 1.0 and not self.is_moe:
            raise ValueError("moe_imbalance is only for MoE models (num_experts > 1)")
        if self.shared_expert_gate and not self.shared_expert_ffn_hidden_size:
            raise ValueError("shared_expert_gate needs shared_expert_ffn_hidden_size")
        mla = (self.q_lora_rank, self.qk_rope_head_dim, self.v_head_dim)
        if self.kv_lora_rank is None:
            if any(v is not None for v in mla):
                raise ValueError(
                    "q_lora_rank, qk_rope_head_dim and v_head_dim are MLA fields; "
                    "set kv_lora_rank too"
                )
        else:
            if self.qk_rope_head_dim is None or self.v_head_dim is None:
                raise ValueError("MLA (kv_lora_rank) needs qk_rope_head_dim and v_head_dim")
            if self.qk_rope_head_dim >= self.head_dim:
                raise ValueError(
                    f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be < head_dim "
                    f"({self.head_dim} = qk_nope_head_dim + qk_rope_head_dim)"
                )
            if self.position != "rope" or self.qkv_bias:
                raise ValueError("MLA models use RoPE and no Q/K/V biases")
        return self

    # --- shape helpers ---------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def gated_mlp(self) -> bool:
        """act(gate) * up, three matrices (SwiGLU, GeGLU); else up and down (GELU)."""
        return self.activation in ("swiglu", "geglu")

    @property
    def sliding_layers(self) -> int:
        """Local layers: a sliding window of ``sliding_window`` keys, or chunks of
        ``attention_chunk_size`` tokens (Llama 4)."""
        return sum(a != "full" for a in self.layer_attention or ())

    @property
    def native_attn_pattern(self) -> str | None:
        """The attention the architecture itself runs, as a sparsity pattern
        (:mod:`workloads.sparsity`): ``window:W`` (or ``chunk:C``) when every layer is
        local, ``hybrid:dense_every=K,inner=window:W`` when every K-th layer is full
        (gpt-oss and Gemma 2: K = 2; Gemma 3: 6; Llama 4's chunks: 4),
        ``hybrid:dense_fraction=F,...`` for any other mix (where full layers sit does not
        change the cost); None when all are full."""
        if self.index_topk:  # DSA: the indexer's top-k tokens, as 128-token blocks
            block = 128 if self.index_topk % 128 == 0 else 64
            return f"topk:k={-(-self.index_topk // block)},block={block}"
        n, slide = self.num_layers, self.sliding_layers
        if not slide:
            return None
        local = (
            f"chunk:{self.attention_chunk_size}"
            if "chunked" in (self.layer_attention or ())
            else f"window:{self.sliding_window}"
        )
        inner = f"inner={local}"
        if slide == n:
            return local
        full = [i for i, a in enumerate(self.layer_attention or ()) if a == "full"]
        k = full[0] + 1
        if full == list(range(k - 1, n, k)):
            return f"hybrid:dense_every={k},{inner}"
        return f"hybrid:dense_fraction={(n - slide) / n:.6g},{inner}"

    @property
    def v_dim(self) -> int:
        """Value head width: ``v_head_dim`` for MLA, else ``head_dim``."""
        return self.v_head_dim or self.head_dim

    @property
    def qk_nope_head_dim(self) -> int:
        """MLA: the part of a query/key head without RoPE (``head_dim`` otherwise)."""
        return self.head_dim - (self.qk_rope_head_dim or 0)

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (0 for dense models)."""
        if not self.is_moe:
            return 0
        return self.num_layers - self.num_dense_layers - self.mlp_free_layers

    @property
    def dense_layers(self) -> int:
        """Layers with a dense ``ffn_hidden_size`` MLP."""
        return self.num_layers - self.moe_layers - self.mlp_free_layers

    @property
    def attention_layers(self) -> int:
        """Layers with softmax attention: each keeps a KV cache; the others' mixers keep
        a constant-size state (:attr:`mixer`)."""
        return self.num_layers - self.attention_free_layers

    @property
    def is_hybrid(self) -> bool:
        """Some layers carry a linear mixer or no attention (the mean layer then weighs
        attention, mixer and MLP by their layers' shares)."""
        return bool(self.mixer_layers or self.attention_free_layers or self.mlp_free_layers)

    @property
    def shared_ffn_hidden_size(self) -> int:
        """Width of the shared expert MLP (0 without one)."""
        return self.shared_expert_ffn_hidden_size or 0

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """KV-cache elements one token stores in one layer: K and V of every KV head
        (``2 * kv_heads * head_dim``), or for MLA the compressed latent ``c_KV`` and the
        shared RoPE key ``k^R`` (DeepSeek-V2 sec. 2.1.2-2.1.3: ``(d_c + d_h^R)`` per
        token, one vector for all heads; 576 for DeepSeek-V2)."""
        if self.kv_lora_rank is not None:
            return self.kv_lora_rank + (self.qk_rope_head_dim or 0)
        return 2 * self.kv_size

    @property
    def attention_matmul_width(self) -> float:
        """Mean width of the two attention matmuls per query head summed over heads:
        ``heads * (d_qk + d_v) / 2`` (``Q K^T`` runs at the QK width, ``P V`` at the value
        width; = ``q_size`` for standard attention)."""
        return self.num_heads * (self.head_dim + self.v_dim) / 2

    @property
    def expert_ffn_hidden_size(self) -> int:
        """Width of one expert's MLP (the dense MLP width for dense models)."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def q_size(self) -> int:
        """Width of the query projection output, num_heads * head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or the value) projection output, num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    # --- parameter counts ------------------------------------------------------------------
    @property
    def norm_params(self) -> int:
        """One norm's parameters: RMSNorm has a scale, LayerNorm a scale and a bias."""
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @property
    def attention_matmul_params(self) -> int:
        """Weights of one layer's attention GEMMs: Q, K, V and output projections, or
        MLA's ``W^DQ``/``W^UQ`` (or ``W^Q``), ``W^DKV`` with ``W^KR``, ``W^UK``/``W^UV``
        and ``W^O`` (DeepSeek-V2 eqs. 9-14, 37-47)."""
        h = self.hidden_size
        if self.kv_lora_rank is None:
            gate = h * self.q_size if self.attention_output_gate else 0
            return h * (self.q_size + 2 * self.kv_size) + self.q_size * h + gate
        c, r, nh = self.kv_lora_rank, self.qk_rope_head_dim or 0, self.num_heads
        q = h * self.q_size if self.q_lora_rank is None else self.q_lora_rank * (h + self.q_size)
        kv = h * (c + r) + c * nh * (self.qk_nope_head_dim + self.v_dim)
        return q + kv + nh * self.v_dim * h

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer, with their biases (MLA: its
        projections and the RMSNorms on the query and KV latents; Qwen3's q/k norms)."""
        h = self.hidden_size
        n = self.attention_matmul_params
        if self.qkv_bias:
            n += self.q_size + 2 * self.kv_size
        if self.out_proj_bias:
            n += h
        if self.kv_lora_rank is not None:
            n += self.kv_lora_rank + (self.q_lora_rank or 0) + self.indexer_params
        if self.qk_norm:
            n += 2 * self.head_dim if self.qk_norm_span == "head" else self.q_size + self.kv_size
        if self.attention_sinks:
            n += self.num_heads
        return n

    @property
    def indexer_params(self) -> int:
        """DSA's lightning indexer of one layer (HF DeepseekV32 ``Indexer``): ``wq_b``
        from the query latent, ``wk`` and ``weights_proj`` from the hidden state, a
        LayerNorm on its keys; 0 without DSA."""
        if not self.index_n_heads or not self.index_head_dim:
            return 0
        n, d, h = self.index_n_heads, self.index_head_dim, self.hidden_size
        return (self.q_lora_rank or h) * n * d + h * d + 2 * d + h * n

    def _mlp_params(self, ffn: int) -> int:
        h = self.hidden_size
        if self.gated_mlp:  # gate, up, down
            n = 3 * h * ffn + (2 * ffn + h if self.mlp_bias else 0)
        else:  # up, down
            n = 2 * h * ffn + (ffn + h if self.mlp_bias else 0)
        return n

    @property
    def expert_params(self) -> int:
        """One expert's MLP (the dense MLP for dense models)."""
        return self._mlp_params(self.expert_ffn_hidden_size)

    @property
    def router_params(self) -> int:
        """One MoE layer's router (and the shared expert's sigmoid gate, if any)."""
        if not self.is_moe:
            return 0
        gates = self.num_experts + (1 if self.shared_expert_gate else 0)
        return self.hidden_size * gates + (self.num_experts if self.router_bias else 0)

    @property
    def shared_expert_params(self) -> int:
        """The shared expert MLP of one MoE layer (0 without one)."""
        f = self.shared_ffn_hidden_size
        return self._mlp_params(f) if f else 0

    @property
    def dense_mlp_params(self) -> int:
        """The dense MLP of a dense layer."""
        return self._mlp_params(self.ffn_hidden_size)

    @property
    def mlp_params(self) -> int:
        """All MLP parameters of one MoE layer (every routed expert, the shared expert
        and the router), or of a dense model's layer."""
        if not self.is_moe:
            return self.dense_mlp_params
        routed = self.num_experts * self.expert_params
        return routed + self.shared_expert_params + self.router_params

    @property
    def layer_params(self) -> int:
        """One transformer layer: attention, MLP (or experts + router), its norms (an MoE
        layer when the model mixes dense and MoE layers)."""
        return self.attention_params + self.mlp_params + self.norms_per_layer * self.norm_params

    @property
    def mixer_params(self) -> int:
        """One layer's linear mixer (0 without one)."""
        return self.mixer.params(self.hidden_size) if self.mixer else 0

    @property
    def layers_params(self) -> int:
        """All layers: attention where a layer has it, the linear mixers, MoE and dense
        MLPs where a layer has one, every layer's norms."""
        moe = self.mlp_params if self.is_moe else 0
        return (
            self.attention_layers * self.attention_params
            + self.mixer_layers * self.mixer_params
            + self.moe_layers * moe
            + self.dense_layers * self.dense_mlp_params
            + self.num_layers * self.norms_per_layer * self.norm_params
        )

    @property
    def embedding_params(self) -> int:
        """Token embedding plus the learned position table, if any."""
        pos = self.max_seq_len * self.hidden_size if self.position == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def lm_head_params(self) -> int:
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return head + (self.vocab_size if self.lm_head_bias else 0)

    @property
    def num_params(self) -> int:
        """Exact parameter count: embeddings, layers, final norm, untied LM head (and a
        vision-language model's image encoder)."""
        vision = self.vision.params if self.vision else 0
        text = self.embedding_params + self.layers_params + self.norm_params
        return text + self.lm_head_params + vision

    @property
    def num_active_params(self) -> int:
        """Parameters one token touches: only ``experts_per_token`` experts per MoE layer."""
        idle = (self.num_experts - self.experts_per_token) * self.expert_params
        return self.num_params - self.moe_layers * idle

    @property
    def matmul_params_per_token(self) -> int:
        """Weights in matmuls one token goes through: the FLOP-relevant ``N``.

        Layer weight matrices (active experts and router for MoE) and the LM head (it is a
        matmul even when tied); not the embedding gathers, norms or biases. This is the
        ``N`` that makes ``6N`` reproduce Narayanan et al. 2021 eq. (3) exactly.
        """
        h = self.hidden_size
        attn = self.attention_layers * self.attention_matmul_params
        if self.mixer:
            attn += self.mixer_layers * self.mixer.matmul_params(h)
        per_matrix = 3 if self.gated_mlp else 2
        routed = self.experts_per_token * per_matrix * h * self.expert_ffn_hidden_size
        moe = routed + per_matrix * h * self.shared_ffn_hidden_size + self.router_params
        dense = per_matrix * h * self.ffn_hidden_size
        layers = attn + self.moe_layers * moe + self.dense_layers * dense
        return layers + self.vocab_size * h

    # --- memory and FLOPs ------------------------------------------------------------------
    def kv_cache_bytes_per_token(self, dtype_bytes: int | float) -> float:
        """K and V of one token over the attention layers: 2 * layers * kv_heads *
        head_dim * bytes (MLA: layers * (kv_lora_rank + qk_rope_head_dim) * bytes)."""
        if dtype_bytes <= 0:
            raise ModelError(f"dtype_bytes must be > 0, got {dtype_bytes}")
        return float(self.attention_layers * self.kv_elements_per_token_per_layer * dtype_bytes)

    def state_bytes_per_seq(self, dtype_bytes: int | float) -> float:
        """The linear mixers' recurrent and conv state one sequence keeps, whatever its
        length (0 without mixers)."""
        return self.mixer_layers * self.mixer.state_bytes(dtype_bytes) if self.mixer else 0.0

    def flops_per_token(self, seq_len: int, causal: bool = True, training: bool = True) -> float:
        """Model FLOPs per token for a sequence of ``seq_len`` tokens.

        ``F = c * N + c * 2 * L * s * heads * head_dim * f`` with ``c = 6`` for training
        (forward 2, backward 4) or ``c = 2`` for a forward pass, ``N`` =
        :attr:`matmul_params_per_token`, and the attention-matmul term (``Q K^T`` and
        ``P V``, 2 FLOPs per MAC each: ``4 s h`` per token per layer forward) scaled by
        ``f = 1/2`` when ``causal`` (only the lower triangle is computed by causal
        FlashAttention-style kernels), ``f = 1`` otherwise.

        With ``causal=False`` and training this is PaLM's ``6N + 12 L H Q T``
        (Chowdhery et al. 2022, appendix B) and, for GPT models, exactly Narayanan et
        al. 2021 eq. (3) without the recomputation pass: ``72 B s l h^2 (1 + s/(6h) +
        V/(12 l h))`` per iteration divided by ``B s`` tokens. Use ``causal=False`` to
        reproduce those papers' published model FLOPs / MFU; the default counts the work
        a causal kernel really does. Recomputation is never counted (model FLOPs, not
        hardware FLOPs).
        """
        if seq_len <= 0:
            raise ModelError(f"seq_len must be > 0, got {seq_len}")
        c = 6 if training else 2
        width = self.q_size if not self.is_mla else self.attention_matmul_width
        attn = 2 * self.attention_layers * seq_len * width * (0.5 if causal else 1.0)
        if self.mixer:  # the scans' own products (workloads.mixers)
            attn += self.mixer_layers * self.mixer.flops_per_token() / 2
        return float(c * self.matmul_params_per_token + c * attn)


# --- built-ins -------------------------------------------------------------------------------


def _validation_line(exc: ValidationError, where: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    where_loc = f"{where}: {loc}" if loc else where
    got = f" (got {err['input']!r})" if loc and "input" in err else ""
    return f"{where_loc}: {msg}{got}"


def model_from_dict(data: dict[str, Any], where: str = "model") -> ModelConfig:
    """Validate a mapping into a :class:`ModelConfig`; raises :class:`ModelError` (one line)."""
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise ModelError(_validation_line(exc, where)) from exc


@lru_cache(maxsize=1)
def _builtins() -> dict[str, ModelConfig]:
    path = Path(str(resources.files("workloads") / "data" / "models.yaml"))
    data = yaml.safe_load(path.read_text())
    out: dict[str, ModelConfig] = {}
    for entry in data["models"]:
        model = model_from_dict(entry, f"{path.name} entry {entry.get('id', '?')!r}")
        if model.id in out:
            raise ModelError(f"{path.name}: duplicate model id {model.id!r}")
        out[model.id] = model
    return out


def list_models() -> list[ModelConfig]:
    """Built-in models in file order."""
    return list(_builtins().values())


def model_ids() -> list[str]:
    return list(_builtins())


def get_model(model_id: str) -> ModelConfig:
    """A built-in model by id; the error lists the known ids."""
    try:
        return _builtins()[model_id]
    except KeyError:
        raise ModelError(
            f"unknown model {model_id!r}; known: {', '.join(model_ids())} "
            "(or give a path to a HuggingFace config.json)"
        ) from None


def load_model(id_or_path: str | Path) -> ModelConfig:
    """A built-in id, or a path to a HuggingFace ``config.json`` (or its folder)."""
    text = str(id_or_path)
    if isinstance(id_or_path, str) and text in _builtins():
        return _builtins()[text]
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if path.exists() or path.suffix == ".json":
        return load_hf_config(path)
    return get_model(text)


# A skew of num_experts routes every token to one expert; beyond 1000 no built-in or
# published MoE layer has that many experts.
MAX_MOE_IMBALANCE = 1000.0
MOE_IMBALANCE_WHY = "1000 routes every token to one expert of a 1000-expert layer"
MOE_IMBALANCE_HELP = (
    "MoE routing skew: the busiest expert's tokens over the mean (1 = balanced); the "
    "layer's expert GEMMs and the expert-parallel all-to-all are priced at the busiest "
    "expert/EP rank's load."
)


def moe_imbalance_field() -> Any:
    """The ``--moe-imbalance`` option of the commands that price MoE layers."""
    return Field(
        1.0,
        ge=1.0,
        le=MAX_MOE_IMBALANCE,
        json_schema_extra={"le_why": MOE_IMBALANCE_WHY},
        description=MOE_IMBALANCE_HELP,
    )


def with_moe_imbalance(model: ModelConfig, imbalance: float) -> ModelConfig:
    """``model`` with routing skew ``imbalance`` (see :attr:`ModelConfig.moe_imbalance`);
    a one-line error for a dense model or a value below 1."""
    if imbalance == model.moe_imbalance:
        return model
    if not model.is_moe:
        raise ModelError(
            f"--moe-imbalance {imbalance:g}: {model.id} is dense (num_experts 1); "
            "allowed: 1.0, or an MoE model"
        )
    return model_from_dict({**model.model_dump(), "moe_imbalance": imbalance}, model.id)


# --- HuggingFace config.json -----------------------------------------------------------------

SUPPORTED_HF_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
    "deepseek_v3", "deepseek_v32", "gpt2", *FAMILY_TYPES, *HYBRID_TYPES,
)  # fmt: skip


def _require(cfg: dict[str, Any], key: str, where: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ModelError(f"{where}: missing key {key!r}")
    return value


def hf_config_name(cfg: dict[str, Any], path: Path) -> str:
    """The model's name: the config's ``name`` or ``_name_or_path`` (HuggingFace writes the
    checkpoint's id there), else the file's stem (``draft.json``: ``draft``); a file named
    ``config.json``, the checkpoint layout, is named by its folder
    (``Llama-3-8B/config.json``: ``Llama-3-8B``). Never the folder of any other file: the
    command's working folder says nothing about the model."""
    for key in ("name", "_name_or_path"):
        value = cfg.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    if path.name == "config.json" and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem


def load_hf_config(path: str | Path) -> ModelConfig:
    """Map a HuggingFace ``config.json`` (llama, mistral, mixtral, qwen2, gpt2) to a model.

    Llama-family keys: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``num_key_value_heads`` (HF default: = heads), ``intermediate_size``, ``vocab_size``,
    ``max_position_embeddings``, ``tie_word_embeddings`` (default false), ``head_dim`` if
    present; SwiGLU, RMSNorm, RoPE. ``attention_bias`` (llama) adds Q/K/V/O biases,
    ``mlp_bias`` MLP biases; qwen2 always has Q/K/V biases. mixtral adds
    ``num_local_experts`` and ``num_experts_per_tok``. gpt2: ``n_layer``, ``n_embd``,
    ``n_head``, ``n_inner`` (default 4 * n_embd), ``n_positions``, ``vocab_size``; GELU,
    LayerNorm, learned positions, biases on every linear, tied embeddings. qwen3 adds
    per-head q/k RMSNorms; qwen2_moe / qwen3_moe and deepseek_v2 / deepseek_v3 as in
    ``qwen_moe_fields`` and ``deepseek_fields``; gpt_oss, gemma2, gemma3(_text), phi3 ... as
    in :mod:`workloads.hf_families` (their sliding-window layers included); the linear /
    state-space hybrids as in :mod:`workloads.hf_hybrids`.
    A Mistral / Mixtral ``sliding_window`` shorter than the positions puts that window on
    every layer (Mistral 7B v0.1: 4096; later releases set none).
    """
    path = Path(path)
    where = f"config {path}"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ModelError(f"cannot read {where}: {exc.strerror or exc}") from exc
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ModelError(f"{where} must be a JSON object")
    cfg = hybrid_config(text_config(cfg))
    model_type = _require(cfg, "model_type", where)
    if model_type not in SUPPORTED_HF_TYPES:
        raise ModelError(
            f"{where}: unsupported model_type {model_type!r}; "
            f"supported: {', '.join(SUPPORTED_HF_TYPES)}"
        )
    name = hf_config_name(cfg, path)
    common = {
        "id": name,
        "name": name,
        "family": model_type,
        "source": f"HuggingFace config.json ({path})",
    }

    def req(key: str) -> Any:
        return _require(cfg, key, where)

    if model_type == "gpt2":
        hidden = req("n_embd")
        fields = {
            "num_layers": req("n_layer"),
            "hidden_size": hidden,
            "num_heads": req("n_head"),
            "num_kv_heads": req("n_head"),
            "ffn_hidden_size": cfg.get("n_inner") or 4 * hidden,
            "vocab_size": req("vocab_size"),
            "max_seq_len": req("n_positions"),
            "activation": "gelu",
            "norm": "layernorm",
            "position": "learned",
            "tie_embeddings": cfg.get("tie_word_embeddings", True),
            "qkv_bias": True,
            "out_proj_bias": True,
            "mlp_bias": True,
        }
    else:
        heads = req("num_attention_heads")
        attention_bias = bool(cfg.get("attention_bias", False))
        fields = {
            "num_layers": req("num_hidden_layers"),
            "hidden_size": req("hidden_size"),
            "num_heads": heads,
            "num_kv_heads": cfg.get("num_key_value_heads") or heads,
            "head_dim": cfg.get("head_dim"),
            "ffn_hidden_size": req("intermediate_size"),
            "vocab_size": req("vocab_size"),
            "max_seq_len": req("max_position_embeddings"),
            "activation": "swiglu",
            "norm": "rmsnorm",
            "position": "rope",
            "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
            "qkv_bias": model_type in ("qwen2", "qwen2_moe") or attention_bias,
            "out_proj_bias": attention_bias,
            "mlp_bias": bool(cfg.get("mlp_bias", False)),
        }
        if model_type == "mixtral":
            fields["num_experts"] = req("num_local_experts")
            fields["experts_per_token"] = req("num_experts_per_tok")
        elif model_type in ("qwen3", "qwen3_moe"):
            fields["qk_norm"] = True
        try:
            if model_type in ("mistral", "mixtral"):  # Mistral 7B v0.1's window
                kinds = layer_attention(cfg, fields["num_layers"], where)
                window = cfg.get("sliding_window") if kinds else None
                fields.update(layer_attention=kinds, sliding_window=window)
            fields.update(family_extra(model_type, cfg, req, fields["num_layers"], where))
        except FamilyError as exc:
            raise ModelError(str(exc)) from None
    return model_from_dict({**common, **fields}, where)
