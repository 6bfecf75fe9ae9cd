"""The routed experts of an MoE layer as grouped GEMMs: one launch per projection for all
local experts, as the engines run them (vLLM's ``fused_moe`` Triton kernel; Megatron-Core's
``GroupedMLP`` over Transformer Engine / CUTLASS grouped GEMM in training).

**Which experts run.** ``T`` tokens each pick ``k`` distinct experts of ``E``. Under
uniform routing a given expert is among one token's picks with probability ``k / E``
(symmetry over the ``C(E, k)`` equally likely sets), independently across tokens, so it
receives no token with probability ``(1 - k/E)^T`` and, by linearity of expectation, the
expected number of distinct experts touched is

    ``E_touched(T) = E * (1 - (1 - k/E)^T)``

(the occupancy problem: Feller, *An Introduction to Probability Theory*, vol. 1, ch. II.5
and IX.3, for ``k = 1``; the same argument per expert holds for ``k`` distinct picks). It
is ``k`` at ``T = 1`` and tends to ``E`` as ``T`` grows; it is rounded to the nearest whole
expert. Only touched experts' weights are read: the grouped kernel launches no tile for an
expert without rows (``moe_align_block_size`` lists only non-empty experts' blocks).

**Rows.** The kernel sorts the ``T k`` routed rows by expert and pads each touched expert's
rows up to its M tile ``BLOCK_M`` (:func:`block_m`). The model's ``moe_imbalance`` ``F``
(busiest expert's rows over the mean) prices every touched expert at the busiest one's
``ceil(F * T k / E_touched)`` rows (at most ``T``: a token visits an expert once), padded:
the layer waits for its slowest expert - with expert parallelism, for the busiest EP rank -
so this is that rank's time when the hot experts share it, an upper bound otherwise.

**Pricing.** The grouped GEMM is a batched GEMM of ``E_touched`` products of
``[rows_padded, k] x [k, n]``: FLOPs ``2 rows_padded n k`` summed over the touched experts,
weight bytes ``E_touched k n`` at the weight dtype (fp8 or, through ``weight_bits``, packed
int8/int4 with their scales), activations ``E_touched rows_padded`` rows read and written
once, tiles per expert as the calibrated GEMM model quantises them, and one launch
(``count`` 1, or the MoE layers' share of the mean layer). The activation between the two
GEMMs is one kernel over the ``T k`` routed rows (vLLM's ``silu_and_mul`` on the unpadded
``[T k, 2 f]`` cache).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from workloads.decompose.templates import OpTemplate
from workloads.models import ModelConfig

# vLLM's fused_moe default config (fused_moe.py, ``get_default_config``): BLOCK_SIZE_M 16
# when the tokens M are at most the experts E (few rows per expert: decode), else 64; its
# tuned per-GPU configs pick 16-64 by M the same way. Training's grouped GEMMs run
# thousands of rows per expert, where a 64-row pad is under 2% of the rows.
SMALL_BLOCK_M = 16
LARGE_BLOCK_M = 64

Rows = Callable[[np.ndarray], np.ndarray]


def moe_share(model: ModelConfig) -> float:
    """Share of the layers that are MoE layers (1 for all-MoE and dense models)."""
    if not model.is_moe:
        return 1.0
    return model.moe_layers / model.num_layers


def expected_touched(model: ModelConfig, tokens: np.ndarray) -> np.ndarray:
    """Expected distinct experts receiving at least one of ``tokens`` tokens' top-k picks,
    ``E (1 - (1 - k/E)^T)`` (module docstring), as a float."""
    e, k = model.num_experts, model.experts_per_token
    t = np.asarray(tokens, dtype=float)
    return e * -np.expm1(t * np.log1p(-k / e)) if k < e else np.full(t.shape, float(e))


def touched_experts(model: ModelConfig) -> Rows:
    """Touched experts as a whole number per token count: the expectation rounded to the
    nearest integer (it lies between ``k`` and ``min(k T, E)``)."""
    e, k = model.num_experts, model.experts_per_token

    def f(x: np.ndarray) -> np.ndarray:
        n = np.rint(expected_touched(model, x))
        return np.clip(n, k, e).astype(np.int64)

    return f


def block_m(model: ModelConfig) -> Rows:
    """The grouped kernel's M tile per token count (see :data:`SMALL_BLOCK_M`)."""
    e = model.num_experts
    return lambda x: np.where(np.asarray(x) <= e, SMALL_BLOCK_M, LARGE_BLOCK_M)


def expert_rows(model: ModelConfig) -> Rows:
    """Rows of the busiest touched expert per token count (rounded up, at most ``T``):
    ``ceil(F T k / E_touched)``."""
    k, f, touched = model.experts_per_token, model.moe_imbalance, touched_experts(model)

    def rows(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.int64)
        mean = x * k / touched(x)
        return np.minimum(x, np.ceil(f * mean - 1e-9)).astype(np.int64)

    return rows


def padded_rows(model: ModelConfig) -> Rows:
    """The busiest touched expert's rows padded up to the kernel's M tile."""
    rows, tile = expert_rows(model), block_m(model)

    def f(x: np.ndarray) -> np.ndarray:
        t = tile(x)
        return (-(-rows(x) // t) * t).astype(np.int64)

    return f


def grouped_gemm(
    name: str, model: ModelConfig, k: int, n: int, dtype: str, mult=None
) -> OpTemplate:
    """All touched experts' ``[rows, k] x [k, n]`` products as one grouped launch: a GEMM of
    ``batch`` = touched experts and ``m`` = padded rows per expert (module docstring)."""
    rows, touched = padded_rows(model), touched_experts(model)

    def fields(x: np.ndarray) -> dict:
        return {"m": rows(x), "k": k, "n": n, "batch": touched(x), "dtype": dtype}

    return OpTemplate(name, name, "gemm", fields, "gemm", mult=mult)


def constant(share: float):
    """A ``mult`` of ``share`` instances at every ``x`` (None for 1)."""
    return None if share == 1.0 else (lambda x: np.full(len(x), share))


__all__ = [
    "LARGE_BLOCK_M",
    "SMALL_BLOCK_M",
    "block_m",
    "constant",
    "expected_touched",
    "expert_rows",
    "grouped_gemm",
    "moe_share",
    "padded_rows",
    "touched_experts",
]
