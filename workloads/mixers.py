"""Linear-attention and state-space token mixers: the layers of 2025-26 hybrids that keep a
constant-size recurrent state instead of a KV cache.

- ``gdn``: Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, arXiv 2412.06464), Qwen3-Next's
  linear attention (HF ``Qwen3NextGatedDeltaNet``): ``in_proj_qkvz`` and ``in_proj_ba``
  from the hidden state, a depthwise causal conv over q, k and v, a gated RMSNorm per
  value head, ``out_proj``; the state is ``heads x key_dim x value_dim`` per layer.
- ``kda``: Kimi Delta Attention (Kimi-Linear, arXiv 2510.26692; HF ``KimiDeltaAttention``):
  q, k, v projections, a conv over the three, low-rank (``head_dim``-wide) forget-gate and
  output-gate projections, a per-head beta, a gated RMSNorm, ``o_proj``.
- ``mamba2``: Mamba-2's SSD layer (Dao and Gu 2024, arXiv 2405.21060, sec. 7; HF
  ``NemotronHMamba2Mixer`` / ``FalconH1Mixer`` / ``GraniteMoeHybridMambaLayer``): one
  ``in_proj`` to ``z, x, B, C, dt``, a conv over ``x, B, C``, the scan, a gated RMSNorm
  (absent in Falcon-H1 unless ``mamba_rms_norm``), ``out_proj``; state ``heads x head_dim
  x d_state``.
- ``mamba``: Mamba-1's selective scan (Gu and Dao 2023, arXiv 2312.00752; HF
  ``JambaMambaMixer``): ``in_proj`` to ``x, z``, a conv, ``x_proj`` to ``dt, B, C``,
  ``dt_proj``, the scan over ``d_inner x d_state``, ``out_proj``; Jamba adds RMSNorms on
  dt, B and C.

Every layer of such a mixer also keeps the conv's last ``conv_kernel - 1`` inputs.
Parameter counts equal HF's ``numel`` (``tests/workloads/test_hybrids.py``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MixerKind = Literal["gdn", "kda", "mamba2", "mamba"]


class LinearMixer(BaseModel):
    """One layer's recurrent token mixer (see the module). Widths:

    - ``heads`` x ``head_dim``: the value (``x``) width the scan outputs, ``inner``;
      Mamba-1 has one "head" of ``d_inner`` channels.
    - ``key_heads`` x ``key_dim``: the key width (GDN's q and k; KDA: = value width);
      for Mamba-2 ``key_heads`` is ``n_groups`` and ``key_dim`` is ``d_state`` (B and C
      are ``n_groups x d_state`` each); for Mamba-1 ``key_dim`` is ``d_state``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: MixerKind
    heads: int = Field(gt=0, description="value heads (Mamba-2: SSM heads; Mamba-1: 1)")
    head_dim: int = Field(gt=0, description="value width per head (Mamba-1: d_inner)")
    key_heads: int = Field(gt=0, description="key heads (Mamba-2: n_groups)")
    key_dim: int = Field(gt=0, description="key width per head (Mamba: d_state)")
    conv_kernel: int = Field(gt=0, description="taps of the depthwise causal conv")
    conv_bias: bool = False
    proj_bias: bool = Field(default=False, description="biases on in_proj and out_proj")
    dt_rank: int | None = Field(default=None, gt=0, description="Mamba-1: dt low rank")
    gate_rank: int | None = Field(default=None, gt=0, description="KDA: gate low rank")
    out_norm: bool = Field(default=True, description="gated RMSNorm before out_proj")
    dt_norms: bool = Field(default=False, description="Jamba: RMSNorms on dt, B and C")
    chunk_size: int = Field(default=64, gt=0, description="chunk of the chunked scan")
    state_fp32: bool = Field(
        default=False, description="serving keeps the recurrent state in fp32 "
        "(mamba_ssm_cache_dtype float32) instead of the KV-cache dtype"
    )  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> LinearMixer:
        if self.kind == "mamba" and self.dt_rank is None:
            raise ValueError("a Mamba-1 mixer needs dt_rank")
        if self.kind == "kda" and self.gate_rank is None:
            raise ValueError("a KDA mixer needs gate_rank")
        if self.kind == "gdn" and self.heads % self.key_heads:
            raise ValueError(f"GDN value heads ({self.heads}) must be a multiple of key heads")
        if self.kind == "mamba2" and self.heads % self.key_heads:
            raise ValueError(f"Mamba-2 heads ({self.heads}) must be a multiple of n_groups")
        return self

    # --- widths ----------------------------------------------------------------------------
    @property
    def inner(self) -> int:
        """The scan's output width (value heads x value width; Mamba: d_inner)."""
        return self.heads * self.head_dim

    @property
    def key_width(self) -> int:
        """GDN/KDA: q (= k) width; Mamba-2: B (= C) width, ``n_groups x d_state``."""
        if self.kind == "kda":
            return self.inner
        if self.kind == "mamba":
            return self.key_dim
        return self.key_heads * self.key_dim

    @property
    def conv_dim(self) -> int:
        """Channels the causal conv runs over: q, k, v (GDN, KDA); x, B, C (Mamba-2); x."""
        if self.kind == "mamba":
            return self.inner
        return self.inner + 2 * self.key_width

    @property
    def in_proj_width(self) -> int:
        """Outputs of the projections from the hidden state, fused as engines fuse them:
        GDN q, k, v, z, b, a; KDA q, k, v, beta and the two gates' down-projections;
        Mamba-2 z, x, B, C, dt; Mamba-1 x, z."""
        if self.kind == "gdn":
            return 2 * self.key_width + 2 * self.inner + 2 * self.heads
        if self.kind == "kda":
            return 3 * self.inner + self.heads + 2 * (self.gate_rank or 0)
        if self.kind == "mamba2":
            return 2 * self.inner + 2 * self.key_width + self.heads
        return 2 * self.inner

    def side_gemms(self) -> list[tuple[str, int, int]]:
        """The mixer's other GEMMs as ``(name, k, n)``: KDA's gate up-projections,
        Mamba-1's ``x_proj`` and ``dt_proj``."""
        if self.kind == "kda":
            r = self.gate_rank or 0
            return [("mixer_gate_up", r, 2 * self.inner)]  # f_b and g_b, one launch each
        if self.kind == "mamba":
            r = self.dt_rank or 0
            return [
                ("mixer_x_proj", self.inner, r + 2 * self.key_dim),
                ("mixer_dt_proj", r, self.inner),
            ]
        return []

    # --- parameters ------------------------------------------------------------------------
    def matmul_params(self, hidden: int) -> int:
        """Weights of the mixer's GEMMs (the FLOP-relevant part)."""
        side = sum(k * n for _, k, n in self.side_gemms())
        return hidden * self.in_proj_width + side + self.inner * hidden

    def params(self, hidden: int) -> int:
        """All parameters of one mixer (HF numel of the module)."""
        n = self.matmul_params(hidden)
        n += self.conv_dim * self.conv_kernel + (self.conv_dim if self.conv_bias else 0)
        if self.proj_bias:
            n += self.in_proj_width + hidden
        h = self.heads
        if self.kind == "gdn":
            n += 2 * h  # dt_bias, A_log
        elif self.kind == "kda":
            n += self.inner + h  # forget gate's dt_bias (per channel), A_log (per head)
        elif self.kind == "mamba2":
            n += 3 * h  # dt_bias, A_log, D
        else:
            n += self.inner  # dt_proj's bias
            n += self.inner * self.key_dim + self.inner  # A_log, D
            if self.dt_norms:
                n += (self.dt_rank or 0) + 2 * self.key_dim
        if self.out_norm:  # per value head (GDN, KDA) or over d_inner (Mamba-2, grouped)
            n += self.head_dim if self.kind in ("gdn", "kda") else self.inner
        return n

    # --- serving state ---------------------------------------------------------------------
    @property
    def state_elements(self) -> int:
        """The recurrent state one sequence keeps per layer: the scan's state (GDN/KDA
        ``heads x key_dim x value_dim``; Mamba-2 ``heads x head_dim x d_state``; Mamba-1
        ``d_inner x d_state``); the conv state is :attr:`conv_state_elements`."""
        if self.kind == "gdn":
            return self.heads * self.key_dim * self.head_dim
        if self.kind == "kda":
            return self.heads * self.head_dim * self.head_dim
        return self.inner * self.key_dim

    @property
    def conv_state_elements(self) -> int:
        """The conv's last ``conv_kernel - 1`` inputs per channel."""
        return self.conv_dim * (self.conv_kernel - 1)

    def state_bytes(self, cache_dtype_bytes: float) -> float:
        """One sequence's state in one layer: the scan state (fp32 when
        :attr:`state_fp32`, else the cache dtype) and the conv state (cache dtype)."""
        ssm = 4.0 if self.state_fp32 else cache_dtype_bytes
        return self.state_elements * ssm + self.conv_state_elements * cache_dtype_bytes

    def flops_per_token(self) -> float:
        """Forward FLOPs of the scan per token, beyond the GEMMs: the chunked form's
        intra-chunk products and state reads/updates (GDN/KDA: Yang et al. 2024, sec. 3.3:
        ``2 C (d_k + d_v)`` for the chunk's ``Q K^T``/``A V`` and ``6 d_k d_v`` for the
        state's output, W-S product and update, per head); SSD (Dao and Gu 2024, sec. 6)
        alike with ``d_k = d_state``, ``d_v = head_dim``; Mamba-1's scan ``9 d_inner
        d_state`` (elementwise recurrence)."""
        c = self.chunk_size
        if self.kind == "mamba":
            return 9.0 * self.inner * self.key_dim
        dk = self.key_dim if self.kind != "kda" else self.head_dim
        dv = self.head_dim
        return float(self.heads * (2 * c * (dk + dv) + 6 * dk * dv))


def count_kind(kinds: tuple[str, ...] | None, *wanted: str) -> int:
    """How many entries of a per-layer tuple are one of ``wanted`` (0 for None)."""
    return sum(k in wanted for k in kinds or ())
