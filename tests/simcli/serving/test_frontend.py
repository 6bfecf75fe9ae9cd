"""The frontend's FIFO recursion against a per-request loop."""

import numpy as np
import pytest

from simcli.serving.frontend import Frontend, FrontendConfig


def lindley(a, s):
    d, free = [], -np.inf
    for ai, si in zip(a, s, strict=True):
        free = max(ai, free) + si
        d.append(free)
    return np.array(d)


@pytest.mark.parametrize("rate", [1.0, 50.0, 1e9])
def test_chunks_match_the_loop(rate):
    rng = np.random.default_rng(0)
    a = np.cumsum(rng.exponential(1 / rate, 2000))
    p = rng.integers(1, 4000, 2000)
    cfg = FrontendConfig(request_s=2e-3, per_prompt_token_s=1e-6, per_output_token_s=5e-4)
    want = lindley(a, cfg.service_s(p))
    fe = Frontend(cfg)
    got, extra = [], []
    for lo in range(0, 2000, 333):  # uneven chunks: the busy state carries over
        d, x = fe.admit(a[lo : lo + 333], p[lo : lo + 333])
        got.append(d)
        extra.append(x)
    got = np.concatenate(got)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.concatenate(extra), want - a + 5e-4, atol=1e-9)
    assert (got >= a + cfg.service_s(p) - 1e-12).all()


def test_offline_burst_serialises_tokenisation():
    cfg = FrontendConfig(request_s=1e-3, per_prompt_token_s=0.0)
    d, extra = Frontend(cfg).admit(np.zeros(1000), np.full(1000, 100))
    assert d[-1] == pytest.approx(1.0)  # 1000 requests x 1 ms, one after another
    assert extra[0] == pytest.approx(1e-3)


def test_inactive_is_the_engine_alone():
    cfg = FrontendConfig()
    assert not cfg.active
    a = np.array([0.0, 0.5, 0.5])
    d, extra = Frontend(cfg).admit(a, np.array([10, 20, 30]))
    np.testing.assert_array_equal(d, a)
    np.testing.assert_array_equal(extra, 0.0)
