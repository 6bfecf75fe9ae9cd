"""Weight and activation sparsity of a model's linear layers: where each sparse GEMM pays.

``simcli sparsity compare --weight-sparsity 2:4 --activation-sparsity cats:0.5`` adds, per
linear layer of one tensor-parallel rank (QKV, out-projection, MLP gate+up, MLP down;
attention and the LM head are not weight GEMMs of a sparsified checkpoint: SparseGPT and
Wanda prune the transformer blocks' linear layers only), the break-even token count
between the sparse kernel and the dense one, both from the calibrated models
(:func:`costmodels.ops.sparse_gemm.break_even`). CATS (activation sparsity) applies to the
MLP only: its threshold gates the MLP's intermediate neurons (Lee et al. 2024).
"""

from __future__ import annotations

from typing import Any

from costmodels.ops.sparse_gemm import BREAK_EVEN_MAX_TOKENS, break_even, dense_gemm_params
from workloads.models import ModelConfig
from workloads.ops import canonical_sparsity, parse_gemm_sparsity

GEMM_COLUMNS: dict[str, str] = {
    "layer": "linear layer of one TP rank: qkv_proj | o_proj | mlp_up (gate+up) | mlp_down",
    "n": "output features of the layer's weight on one TP rank (cats rows of mlp_up: the up "
    "half only, since CATS computes the gate projection densely to find the active neurons)",
    "k": "input features of the layer's weight on one TP rank",
    "sparsity": "the sparse kernel priced (2:4, unstructured:S, cats:F)",
    "pays": "where the sparse kernel beats dense over 1..65,536 tokens per step: below "
    "(from 1 token up to break_even_tokens), above (from break_even_tokens on), always, never",
    "break_even_tokens": "first token count (tokens per step, all sequences of the batch) at "
    "which the sparse kernel stops (pays=below) or starts (pays=above) beating dense; empty "
    "for always/never",
    "crossings": "sign changes of dense - sparse time over the token range (over 1: the "
    "curves cross again, e.g. at 2:4's 128 -> 256-token kernel switch)",
    "speedup_1_token": "dense / sparse GEMM time at 1 token (decode of one sequence)",
    "speedup_max_tokens": "dense / sparse GEMM time at 65,536 tokens (a long prefill chunk)",
}
WEIGHT_KINDS = ("2:4", "unstructured")
ACTIVATION_KINDS = ("cats",)


def check_sparsity_options(weight: str | None, activation: str | None) -> tuple[str, str]:
    """The two options in their canonical spelling ("" when absent); one ``ValueError``
    line when a value is malformed or of the wrong family."""
    w = canonical_sparsity(weight) if weight else ""
    a = canonical_sparsity(activation) if activation else ""
    if w and parse_gemm_sparsity(w)[0] not in WEIGHT_KINDS:
        raise ValueError(
            f"--weight-sparsity {weight!r} is not a weight sparsity; allowed: 2:4, "
            "unstructured:S (CATS is --activation-sparsity cats:F)"
        )
    if a and parse_gemm_sparsity(a)[0] not in ACTIVATION_KINDS:
        raise ValueError(
            f"--activation-sparsity {activation!r} is not an activation sparsity; allowed: "
            "cats:F with 0 < F <= 1 (2:4 and unstructured are --weight-sparsity)"
        )
    return w, a


def linear_layers(model: ModelConfig, tp: int) -> dict[str, tuple[int, int]]:
    """(n, k) of each linear layer's weight on one TP rank (Megatron's split: QKV and
    gate+up column-parallel, out and down row-parallel; KV heads replicated below tp)."""
    h, d = model.hidden_size, model.head_dim
    heads, kv = model.num_heads // tp, max(1, model.num_kv_heads // tp)
    ffn = model.ffn_hidden_size // tp
    up = 2 if model.gated_mlp else 1
    return {
        "qkv_proj": ((heads + 2 * kv) * d, h),
        "o_proj": (h, heads * d),
        "mlp_up": (up * ffn, h),
        "mlp_down": (h, ffn),
    }


def gemm_break_even_rows(
    model: ModelConfig,
    gpu_id: str,
    tp: int,
    weight: str,
    activation: str,
    dtype: str = "bf16",
) -> list[dict[str, Any]]:
    """One row per (linear layer, sparsity given): see :data:`GEMM_COLUMNS`."""
    from hardware_specs.registry import builtin_catalog

    gpu = builtin_catalog().gpu(gpu_id)
    dense = dense_gemm_params(gpu)
    rows: list[dict[str, Any]] = []
    for layer, (n, k) in linear_layers(model, tp).items():
        kinds = [weight] if weight else []
        if activation and layer.startswith("mlp_"):
            kinds.append(activation)
        for sp in kinds:
            cats_up = sp.startswith("cats") and layer == "mlp_up" and model.activation == "swiglu"
            n_sp = n // 2 if cats_up else n
            be = break_even(n_sp, k, dtype, sp, gpu, dense=dense, max_tokens=BREAK_EVEN_MAX_TOKENS)
            rows.append(
                {
                    "layer": layer,
                    "n": n_sp,
                    "k": k,
                    "sparsity": sp,
                    "pays": be.pays,
                    "break_even_tokens": be.break_even_tokens,
                    "crossings": be.crossings,
                    "speedup_1_token": be.speedup_1_token,
                    "speedup_max_tokens": be.speedup_max_tokens,
                }
            )
    return rows
