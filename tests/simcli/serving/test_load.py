"""Closed-loop load (simcli.serving.load): at most N requests in flight, each sent at
max(its arrival, a slot frees), slots handed out in arrival order, latency from the send,
as vllm bench serve --max-concurrency drives an engine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcli.serving import fastpath
from simcli.serving.requests import Request, RequestStream, SyntheticSpec, synthetic_requests
from simcli.serving.simulator import ServeConfig, Simulator
from workloads.lengths import parse_dist


class FlatStep:
    """Iterations of 1 ms plus 10 us per token (prefill) or sequence (decode)."""

    kv_bytes_per_token = 131072.0

    def step_s(self, prefill_new, prefill_past, decode_ctx) -> float:
        return 1e-3 + 1e-5 * (float(np.sum(prefill_new)) + len(decode_ctx))

    def kv_capacity_tokens(self, block_size: int, gpu_memory_utilization: float) -> int:
        return 1_000_000


def _run(reqs, n, **cfg):
    rows = []
    sim = Simulator(
        FlatStep(),
        ServeConfig(max_concurrency=n, **cfg),
        sink=lambda r: rows.append((r.id, r.arrival_s, r.first_token_s, r.finish_s)),
        check=True,
    )
    return sim.run(reqs), sorted(rows)


def _in_flight_max(rows) -> int:
    events = sorted([(a, 1) for _, a, _, _ in rows] + [(f, -1) for _, _, _, f in rows],
                    key=lambda e: (e[0], e[1]))  # fmt: skip
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def test_one_client_sends_each_request_when_the_previous_completes():
    reqs = [Request(i, 0.0, 100, 20) for i in range(6)]  # --qps inf
    res, rows = _run(reqs, 1)
    for prev, nxt in zip(rows, rows[1:], strict=False):
        assert nxt[1] == pytest.approx(prev[3])  # sent at the previous completion
    # every request alone on the replica: the same latency each, measured from its send
    e2e = {round(f - a, 12) for _, a, _, f in rows}
    assert len(e2e) == 1
    # prefill of 100 tokens (2 ms) then 19 decodes of one sequence (1.01 ms each)
    assert e2e.pop() == pytest.approx(2e-3 + 19 * 1.01e-3)
    s = res.summary
    assert s["max_concurrency"] == 1 and s["client_waits"] == 5
    assert s["client_wait_s_max"] == pytest.approx(rows[-1][1])
    assert s["duration_s"] == pytest.approx(rows[-1][3])  # the makespan from t = 0


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_never_more_than_n_in_flight_and_sent_in_arrival_order(n):
    rng = np.random.default_rng(n)
    arrivals = np.cumsum(rng.exponential(0.004, 60))
    reqs = [Request(i, float(t), int(rng.integers(10, 300)), int(rng.integers(1, 60)))
            for i, t in enumerate(arrivals)]  # fmt: skip
    res, rows = _run(reqs, n)
    assert res.summary["requests_completed"] == 60
    assert _in_flight_max(rows) == n  # the load saturates n clients, never more
    sends = [a for _, a, _, _ in rows]
    assert sends == sorted(sends)  # FIFO: ids in order are sent in order
    for (_, sent, _, _), t in zip(rows, arrivals, strict=True):
        assert sent >= t - 1e-12  # never before it arrives


def test_many_clients_is_the_open_loop():
    spec = SyntheticSpec(qps=50, num_requests=300, prompt_len=parse_dist("uniform:10:400"),
                         output_len=parse_dist("uniform:1:80"), seed=4)  # fmt: skip
    closed, rows_c = _run(list(synthetic_requests(spec)), 10_000)
    sim = Simulator(FlatStep(), ServeConfig())
    open_ = sim.run(list(synthetic_requests(spec)))
    for k, v in open_.summary.items():
        assert closed.summary[k] == v or (v != v and closed.summary[k] != closed.summary[k]), k
    assert closed.summary["client_waits"] == 0


def test_a_refused_prompt_frees_its_client():
    # max_model_len 150: request 1's prompt is refused, and the one client goes on
    reqs = [Request(0, 0.0, 100, 10), Request(1, 0.0, 200, 10), Request(2, 0.0, 100, 10)]
    res, rows = _run(reqs, 1, max_model_len=150)
    assert [r[0] for r in rows] == [0, 2]
    assert res.summary["requests_rejected_too_long"] == 1
    assert rows[1][1] == pytest.approx(rows[0][3])


def test_the_compiled_loop_declines_a_closed_loop():
    spec = SyntheticSpec(qps=10, num_requests=50, prompt_len=parse_dist("64"),
                         output_len=parse_dist("8"))  # fmt: skip
    stream = synthetic_requests(spec)
    assert isinstance(stream, RequestStream)
    sim = Simulator(FlatStep(), ServeConfig(max_concurrency=4))
    assert not fastpath.eligible(sim, stream)
    assert sim.run(stream).summary["requests_completed"] == 50


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 6),
    gaps=st.lists(st.floats(0, 0.01), min_size=1, max_size=30),
    outs=st.lists(st.integers(1, 40), min_size=30, max_size=30),
)
def test_closed_loop_invariants(n, gaps, outs):
    t = np.cumsum(gaps)
    reqs = [Request(i, float(a), 50 + 7 * i, outs[i]) for i, a in enumerate(t)]
    res, rows = _run(reqs, n)
    assert res.summary["requests_completed"] == len(reqs)  # every request finishes once
    assert _in_flight_max(rows) <= n
    assert [r[0] for r in rows] == list(range(len(reqs)))
    assert all(f >= ft >= a for _, a, ft, f in rows)  # time never goes backwards
