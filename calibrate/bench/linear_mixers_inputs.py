"""Inputs shared by :mod:`calibrate.bench.linear_mixers` and its checks
(:mod:`calibrate.bench.linear_mixers_checks`): random activations, decays and the
mixers' parameters on the GPU, KDA's kernel options, and how a failed case is recorded.
torch is imported where a tensor is made."""

from __future__ import annotations

from calibrate.bench.linear_mixers_cases import DEV


def _randn(*shape, dtype=None, grad=False):
    import torch

    x = torch.randn(*shape, device=DEV, dtype=dtype or torch.bfloat16)
    return x.requires_grad_(grad) if grad else x


def _log_decay(*shape, dtype=None):
    """A log-space decay in (-inf, 0), mostly near 0 as trained models have it."""
    import torch
    import torch.nn.functional as F

    return F.logsigmoid(torch.randn(*shape, device=DEV) + 3.0).to(dtype or torch.float32)


def _kda_params(h, dk):
    import torch

    a_log = torch.log(torch.empty(h, device=DEV).uniform_(1, 16))
    dt_bias = torch.randn(h * dk, device=DEV) * 0.1
    return a_log, dt_bias


_KDA_KW = {"use_qk_l2norm_in_kernel": True, "use_gate_in_kernel": True,
           "use_beta_sigmoid_in_kernel": True, "state_v_first": True}  # fmt: skip


def _ssd_params(h):
    import torch

    a = -torch.empty(h, device=DEV).uniform_(1, 16)  # A = -exp(A_log)
    dt_bias = torch.log(torch.expm1(torch.empty(h, device=DEV).uniform_(0.001, 0.1)))
    return a, dt_bias, torch.ones(h, device=DEV)


def classify(exc: BaseException) -> tuple[str, str]:
    msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]
    if "out of memory" in msg.lower():
        return "oom", msg
    return "error", msg
