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


_STEP = None


def _step(cls):
    global _STEP
    _STEP = cls("llama3-8b", "h100-sxm")
    return _STEP


def _sim_pair(frontend, n=400, qps=30.0, max_concurrency=None):
    from costmodels.steps.serving import StepModel
    from simcli.serving import fastpath
    from simcli.serving.requests import SyntheticSpec, synthetic_requests
    from simcli.serving.simulator import ServeConfig, Simulator
    from workloads.lengths import parse_dist

    spec = SyntheticSpec(
        qps=qps, num_requests=n, seed=2, prompt_len=parse_dist("uniform:10:2000"),
        output_len=parse_dist("uniform:2:300"),
    )  # fmt: skip
    cfg = ServeConfig(replicas=2, frontend=frontend, max_concurrency=max_concurrency)
    out = []
    for compiled in (False, True):
        rows = []
        sim = Simulator(_STEP or _step(StepModel), cfg, sink=rows.append)
        if max_concurrency is None:
            assert fastpath.eligible(sim, synthetic_requests(spec)) or not fastpath.HAVE_NUMBA
        res = sim.run(synthetic_requests(spec), compiled=compiled and max_concurrency is None)
        out.append((res.summary, sorted((r.id, r.arrival_s, r.first_token_s) for r in rows)))
    return out


def test_frontend_latency_on_both_loops():
    """The compiled loop reports the frontend's time as the event loop does; at light load
    (no queueing at the frontend) TTFT grows by exactly ingress + egress."""
    fe = FrontendConfig(request_s=3e-3, per_prompt_token_s=1e-6, per_output_token_s=2e-3)
    (ev, ev_rows), (co, co_rows) = _sim_pair(fe)
    for k in ("ttft_s_mean", "ttft_s_p99", "e2e_s_mean", "tpot_s_mean", "duration_s"):
        assert ev[k] == pytest.approx(co[k], rel=1e-9), k
    assert ev_rows == pytest.approx(co_rows)
    # at light load the engine's timeline barely moves: TTFT grows by the frontend's time
    (lo, _), _ = _sim_pair(fe, n=200, qps=1.0)
    (base, _), _ = _sim_pair(FrontendConfig(), n=200, qps=1.0)
    fe_s = 3e-3 + 1e-6 * 1005 + 2e-3  # mean prompt of uniform:10:2000
    assert lo["ttft_s_mean"] - base["ttft_s_mean"] == pytest.approx(fe_s, rel=0.1)
    assert lo["tpot_s_mean"] == pytest.approx(base["tpot_s_mean"], rel=0.02)


def test_frontend_in_a_closed_loop():
    fe = FrontendConfig(request_s=5e-3, per_output_token_s=1e-3)
    (ev, _), _ = _sim_pair(fe, n=100, qps=float("inf"), max_concurrency=4)
    (base, _), _ = _sim_pair(FrontendConfig(), n=100, qps=float("inf"), max_concurrency=4)
    assert ev["ttft_s_mean"] > base["ttft_s_mean"] + 5e-3


def test_one_by_one_equals_chunks_bit_for_bit():
    rng = np.random.default_rng(5)
    a = np.cumsum(rng.exponential(0.01, 500))
    p = rng.integers(1, 3000, 500)
    cfg = FrontendConfig(request_s=4e-3, per_prompt_token_s=3e-6)
    d_chunk, _ = Frontend(cfg).admit(a, p)
    fe = Frontend(cfg)
    d_one = np.concatenate([fe.admit(a[i : i + 1], p[i : i + 1])[0] for i in range(500)])
    assert (d_chunk == d_one).all()
