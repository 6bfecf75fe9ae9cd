"""Correctness checks of :mod:`calibrate.bench.linear_mixers`: small-shape outputs of the
timed kernels against float32 references (relative L2 errors, recorded in meta.json)."""

from __future__ import annotations

from calibrate.bench.linear_mixers_cases import DEV
from calibrate.bench.linear_mixers_inputs import (
    _KDA_KW,
    _kda_params,
    _log_decay,
    _randn,
    _ssd_params,
    classify,
)


def _rel(out, ref) -> float:
    import torch

    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def run_checks() -> dict:
    """Small-shape outputs against float32 references (fla's naive recurrences, an SSD
    recurrence written here, mamba_ssm's selective_state_update_ref, torch's conv)."""
    import torch
    import torch.nn.functional as F

    res: dict[str, object] = {}

    def check(name, f):
        try:
            res[name] = round(f(), 6)
        except Exception as exc:  # a broken check does not stop the run
            res[name] = "error: " + classify(exc)[1]

    def l2n(x):
        return F.normalize(x.float(), dim=-1)

    def gdn_chunk():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

        b, s, h, d = 1, 256, 32, 128
        q, k, v = _randn(b, s, h, d), _randn(b, s, h, d), _randn(b, s, h, d)
        g = _log_decay(b, s, h)
        beta = torch.rand(b, s, h, device=DEV).sigmoid().to(torch.bfloat16)
        with torch.no_grad():
            o, _ = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)  # fmt: skip
            ref, _ = naive_recurrent_gated_delta_rule(l2n(q), l2n(k), v.float(),
                                                      beta.float(), g)  # fmt: skip
        return _rel(o, ref)

    def gdn_decode():
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

        b, h, d = 8, 32, 128
        q, k, v = _randn(b, 1, h, d), _randn(b, 1, h, d), _randn(b, 1, h, d)
        g = _log_decay(b, 1, h)
        beta = torch.rand(b, 1, h, device=DEV).sigmoid().to(torch.bfloat16)
        h0 = torch.randn(b, h, d, d, device=DEV) * 0.1
        with torch.no_grad():
            o, ht = fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                     output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True)  # fmt: skip
            ref, rht = naive_recurrent_gated_delta_rule(l2n(q), l2n(k), v.float(),
                                                        beta.float(), g, initial_state=h0,
                                                        output_final_state=True)  # fmt: skip
        return max(_rel(o, ref), _rel(ht, rht))

    def kda_ref(q, k, v, g, beta, a_log, dt_bias, h0=None):
        from fla.ops.kda.naive import naive_recurrent_kda

        h, dk = q.shape[2], q.shape[3]
        gl = -a_log.exp()[:, None] * F.softplus(g.float() + dt_bias.view(h, dk))
        init = None if h0 is None else h0.transpose(-1, -2).float()  # v-first -> k-first
        return naive_recurrent_kda(l2n(q), l2n(k), v.float(), gl, beta.float().sigmoid(),
                                   initial_state=init, output_final_state=True)  # fmt: skip

    def kda_chunk():
        from fla.ops.kda import chunk_kda

        b, s, h, d = 1, 256, 32, 128
        q, k, v = _randn(b, s, h, d), _randn(b, s, h, d), _randn(b, s, h, d)
        g, beta = _randn(b, s, h, d), _randn(b, s, h)
        a_log, dt_bias = _kda_params(h, d)
        with torch.no_grad():
            o, _ = chunk_kda(q, k, v, g, beta, A_log=a_log, dt_bias=dt_bias,
                             output_final_state=True, **_KDA_KW)  # fmt: skip
            ref, _ = kda_ref(q, k, v, g, beta, a_log, dt_bias)
        return _rel(o, ref)

    def kda_decode():
        from fla.ops.kda import fused_recurrent_kda

        b, h, d = 8, 32, 128
        q, k, v = _randn(b, 1, h, d), _randn(b, 1, h, d), _randn(b, 1, h, d)
        g, beta = _randn(b, 1, h, d), _randn(b, 1, h)
        a_log, dt_bias = _kda_params(h, d)
        h0 = torch.randn(b, h, d, d, device=DEV) * 0.1
        with torch.no_grad():
            o, _ = fused_recurrent_kda(q, k, v, g, beta, A_log=a_log, dt_bias=dt_bias,
                                       initial_state=h0, output_final_state=True,
                                       **_KDA_KW)  # fmt: skip
            ref, _ = kda_ref(q, k, v, g, beta, a_log, dt_bias, h0)
        return _rel(o, ref)

    def ssd_chunk():
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        b, s, h, p, n, g, ch = 1, 256, 128, 64, 128, 8, 128
        x, dt = _randn(b, s, h, p), _randn(b, s, h)
        bm, cm = _randn(b, s, g, n), _randn(b, s, g, n)
        a, dt_bias, d = _ssd_params(h)
        with torch.no_grad():
            y = mamba_chunk_scan_combined(x, dt, a, bm, cm, chunk_size=ch, D=d,
                                          dt_bias=dt_bias, dt_softplus=True)  # fmt: skip
            dtf = F.softplus(dt.float() + dt_bias)  # (b, s, h)
            rep = h // g
            bf = bm.float().repeat_interleave(rep, dim=2)  # (b, s, h, n)
            cf = cm.float().repeat_interleave(rep, dim=2)
            st = torch.zeros(b, h, p, n, device=DEV)
            ref = torch.empty(b, s, h, p, device=DEV)
            for t in range(s):
                da = torch.exp(dtf[:, t] * a)  # (b, h)
                st = (
                    st * da[..., None, None]
                    + (dtf[:, t, :, None] * x[:, t].float())[..., None] * bf[:, t, :, None, :]
                )
                ref[:, t] = (st * cf[:, t, :, None, :]).sum(-1) + d[:, None] * x[:, t].float()
        return _rel(y, ref)

    def ssd_decode():
        from mamba_ssm.ops.triton.selective_state_update import (
            selective_state_update,
            selective_state_update_ref,
        )

        b, h, p, n, g = 8, 128, 64, 128, 8
        state = (torch.randn(b, h, p, n, device=DEV) * 0.1).to(torch.float32)
        x = _randn(b, h, p)
        dt = _randn(b, h)[:, :, None].expand(b, h, p)
        a, dt_bias, d = _ssd_params(h)
        a = a[:, None, None].expand(h, p, n)
        dt_bias, d = dt_bias[:, None].expand(h, p), d[:, None].expand(h, p)
        bm, cm = _randn(b, g, n), _randn(b, g, n)
        s2 = state.clone()
        o1 = selective_state_update(state, x, dt, a, bm, cm, D=d, dt_bias=dt_bias,
                                    dt_softplus=True)  # fmt: skip
        ref = selective_state_update_ref(s2, x, dt, a, bm, cm, D=d, dt_bias=dt_bias,
                                         dt_softplus=True)  # fmt: skip
        return max(_rel(o1, ref), _rel(state, s2))

    def mamba1_decode():
        from mamba_ssm.ops.triton.selective_state_update import (
            selective_state_update,
            selective_state_update_ref,
        )

        b, dn, n = 8, 8192, 16
        state = torch.randn(b, dn, n, device=DEV) * 0.1
        x, z, dt = _randn(b, dn), _randn(b, dn), _randn(b, dn)
        a = -torch.arange(1, n + 1, device=DEV, dtype=torch.float32).repeat(dn, 1)
        d, dt_bias = torch.ones(dn, device=DEV), torch.randn(dn, device=DEV) * 0.1
        bm, cm = _randn(b, n), _randn(b, n)
        s2 = state.clone()
        o1 = selective_state_update(state, x, dt, a, bm, cm, D=d, z=z, dt_bias=dt_bias,
                                    dt_softplus=True)  # fmt: skip
        ref = selective_state_update_ref(s2, x, dt, a, bm, cm, D=d, z=z, dt_bias=dt_bias,
                                         dt_softplus=True)  # fmt: skip
        return max(_rel(o1, ref), _rel(state, s2))

    def conv():
        from fla.modules.convolution import causal_conv1d

        b, s, ch, w = 2, 512, 8192, 4
        x = _randn(b, s, ch)
        weight = (torch.randn(ch, w, device=DEV) * 0.3).to(torch.bfloat16)
        with torch.no_grad():
            y = causal_conv1d(x, weight, None, activation="silu", backend="triton")[0]
            ref = F.silu(F.conv1d(x.float().transpose(1, 2), weight.float()[:, None, :],
                                  padding=w - 1, groups=ch)[..., :s]).transpose(1, 2)  # fmt: skip
        return _rel(y, ref)

    for name, f in (("gdn_chunk_fwd", gdn_chunk), ("gdn_decode", gdn_decode),
                    ("kda_chunk_fwd", kda_chunk), ("kda_decode", kda_decode),
                    ("ssd_chunk_fwd", ssd_chunk), ("ssd_decode", ssd_decode),
                    ("mamba1_decode", mamba1_decode), ("conv1d_fla_vs_torch", conv)):  # fmt: skip
        check(name, f)
    return res


# ------------------------------------------------------------------------------ setup
