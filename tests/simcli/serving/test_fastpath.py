"""The serving simulator's fast path (simcli.serving.fastpath) reports what the general
event loop reports, on the runs it takes, and declines the rest."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from simcli.scenario.serving import ServeOptions, resolve_serve
from simcli.serving import fastpath
from simcli.serving.metrics import EnergyMeter, LogHistogram
from simcli.serving.requests import RequestChunk, RequestStream, trace_requests
from simcli.serving.simulator import SimulationError

# KV room for ~12k tokens per replica: the decode batches preempt often
TIGHT = {
    "model": "llama3-8b",
    "gpu": "h100-sxm",
    "replicas": 3,
    "gpu_memory_utilization": 0.25,
    "qps": 20.0,
    "num_requests": 250,
    "prompt_len": "lognormal:700:0.8:3000",
    "output_len": "lognormal:400:0.8:2000",
    "seed": 3,
    # simcli's serve defaults before engine profiles (the engine's own apply otherwise)
    "scheduler": "vllm",
    "max_batch_size": 256,
    "block_size": 16,
}


@pytest.fixture(autouse=True)
def _compiled_for_any_size(monkeypatch):
    """These scenarios are small: take the kernel whatever the size (the policy has its
    own test)."""
    monkeypatch.setattr(fastpath, "COMPILE_FROM_REQUESTS", 0)


@cache
def _scenario(**kw):
    return resolve_serve(ServeOptions(**{**TIGHT, **kw}))


def _both(scenario, requests, **kw):
    """(fast path result, general loop result, their sinks' rows) of one scenario."""
    rows = ([], [])
    out = []
    for i, reqs in enumerate((requests, list(requests))):
        sim = scenario.simulator(energy=True, sink=lambda r, _i=i: rows[_i].append(_row(r)), **kw)
        assert fastpath.eligible(sim, reqs) == (i == 0)
        out.append(sim.run(reqs))
    return out[0], out[1], rows


def _row(req):
    return (req.id, req.replica, req.arrival_s, req.prompt_tokens, req.output_tokens,
            req.first_token_s, req.finish_s, req.preemptions)  # fmt: skip


def _same(a, b):
    """Every summary key equal; float sums taken in another order to 1e-9."""
    assert a.summary.keys() == b.summary.keys()
    for k, x in a.summary.items():
        y = b.summary[k]
        if isinstance(x, float) and isinstance(y, float) and not (math.isnan(x) and math.isnan(y)):
            assert x == pytest.approx(y, rel=1e-9, abs=1e-12), k
        else:
            assert x == y or (x != x and y != y), k
    assert a.per_replica == b.per_replica


@pytest.mark.parametrize("scheduler", ["vllm", "orca", "sarathi"])
@pytest.mark.parametrize("router", ["least_outstanding", "round_robin", "kv_aware"])
def test_fast_path_matches_the_event_loop_under_preemption(scheduler, router):
    sc = _scenario(scheduler=scheduler, router=router)
    fast, slow, rows = _both(sc, sc.arrivals.requests())
    _same(fast, slow)
    assert fast.summary["preemptions"] > 20  # the scenario does exercise preemption
    assert rows[0] == rows[1]  # every request, same order, same times


def test_fast_path_caps_and_refuses_as_the_event_loop_does():
    sc = _scenario(max_model_len=1500, slo_ttft_s=0.03, slo_tpot_s=0.008)
    fast, slow, rows = _both(sc, sc.arrivals.requests())
    _same(fast, slow)
    assert fast.summary["requests_rejected_too_long"] > 0
    assert fast.summary["requests_output_capped"] > 0
    assert 0 < fast.summary["slo_attainment"] < 1
    assert rows[0] == rows[1]


def test_fast_path_replays_a_trace(tmp_path):
    sc = _scenario()
    path = tmp_path / "t.csv"
    lines = ["arrival_s,prompt_tokens,output_tokens"]
    rng = np.random.default_rng(0)
    t = 0.0
    for _ in range(300):
        t += float(rng.exponential(0.08))
        lines.append(f"{t},{int(rng.integers(1, 2500))},{int(rng.integers(1, 900))}")
    path.write_text("\n".join(lines) + "\n")
    stream = trace_requests(path)
    assert not stream.shared_prefixes and stream.expected == 300
    assert trace_requests(path, 120).expected == 120
    fast, slow, rows = _both(sc, stream)
    _same(fast, slow)
    assert rows[0] == rows[1] and len(rows[0]) == 300


def _stream(arrival, prompt, output):
    n = len(arrival)

    def chunks():
        yield RequestChunk(
            0, np.array(arrival, float), np.array(prompt), np.array(output),
            np.full(n, -1), np.zeros(n, np.int64),
        )  # fmt: skip

    return RequestStream(chunks, False)


@pytest.mark.parametrize(
    ("arrival", "prompt", "output", "message"),
    [
        ([0.0, 1.0, 0.5], [10, 10, 10], [5, 5, 5], "request 2 arrives at 0.5 s, before"),
        ([0.0, math.nan], [10, 10], [5, 5], "request 1 arrives at nan s"),
        ([0.0, 1.0], [10, 0], [5, 5], "request 1 has prompt 0 and output 5 tokens"),
        ([0.0, 1.0], [10, 6000], [5, 5], "request 1 needs 6004 tokens of KV cache"),
    ],
)
def test_fast_path_refuses_bad_requests_as_the_event_loop_does(arrival, prompt, output, message):
    sc = _scenario(gpu_memory_utilization=0.24)  # 5776 tokens of KV per replica
    for reqs in (_stream(arrival, prompt, output), list(_stream(arrival, prompt, output))):
        with pytest.raises(SimulationError, match=message.replace(".", r"\.")):
            sc.simulator().run(reqs)


def test_features_only_the_event_loop_models_take_it():
    stream = _scenario().arrivals.requests()
    assert fastpath.eligible(_scenario().simulator(), stream)
    for kw in (
        {"pp": 2},
        {"preemption": "swap"},
        {"disaggregate": True, "prefill_replicas": 1, "decode_replicas": 2},
        {"branches": 2},
        {"attn_pattern": "window:512"},
        {"shared_prefix_len": 64},
    ):
        sc = _scenario(**kw)
        assert not fastpath.eligible(sc.simulator(), sc.arrivals.requests()), kw
    assert not fastpath.eligible(_scenario().simulator(check=True), stream)
    assert not fastpath.eligible(_scenario().simulator(), list(stream))


def test_histogram_add_many_buckets_like_add():
    rng = np.random.default_rng(1)
    vals = np.concatenate([rng.lognormal(-3, 2, 5000), [0.0, 1e-9, 1e9]])
    w = rng.integers(1, 5, vals.size)
    one, many = LogHistogram(), LogHistogram()
    for v, k in zip(vals.tolist(), w.tolist(), strict=True):
        one.add(v, k)
    many.add_many(vals[:2000], w[:2000])
    many.add_many(vals[2000:], w[2000:])
    assert one.counts == many.counts and one.n == many.n
    assert (one.min, one.max) == (many.min, many.max)
    assert many.total == pytest.approx(one.total, rel=1e-12)
    for q in (0.5, 0.9, 0.99):
        assert one.quantile(q) == many.quantile(q)


def test_energy_add_iterations_prices_like_add():
    sim = _scenario().simulator(energy=True)
    meter = sim.replicas[0].energy
    assert meter is not None
    other = EnergyMeter.for_step_model(sim.replicas[0].step_model)
    rng = np.random.default_rng(2)
    rows = []
    for _ in range(9000):  # more than two of the meter's chunks
        n_dec, ctx = int(rng.integers(0, 60)), int(rng.integers(0, 90000))
        new = rng.integers(1, 900, int(rng.integers(0 if n_dec else 1, 3))).tolist()
        past = rng.integers(0, 2000, len(new)).tolist()
        rows.append((new, past, n_dec, ctx if n_dec else 0, float(rng.uniform(1e-3, 0.2))))
    for new, past, n_dec, ctx, dt in rows:
        meter.add(new, past, n_dec, ctx, dt)
    at = [i for i, r in enumerate(rows) for _ in r[0]]
    other.add_iterations(
        np.array([r[4] for r in rows]),
        np.array([r[2] for r in rows]),
        np.array([r[3] for r in rows]),
        np.array(at, dtype=np.int64),
        np.array([a for r in rows for a in r[0]], dtype=np.int64),
        np.array([b for r in rows for b in r[1]], dtype=np.int64),
    )
    assert other.busy_joules() == pytest.approx(meter.busy_joules(), rel=1e-12)


@pytest.mark.parametrize("engine", ["vllm", "vllm-v0", "sglang", "trtllm"])
def test_compiled_prices_equal_the_step_model_bit_for_bit(engine):
    """The compiled copy of StepModel.step_s_summary's scalar path (serving_compiled's
    price_mixed and price_decode) returns the same float on random batches, NaN only where the step
    model leaves its scalar grids: for every engine profile (graph padding, host launches,
    serial or overlapped host work)."""
    from costmodels.steps.serving_compiled import price_mixed

    sm = _scenario(engine=engine, max_batch_size=256).simulator().replicas[0].step_model
    PI, PF, PG, W2, WDEC, DT = sm.summary_tables(256)
    rng = np.random.default_rng(5)
    priced = 0
    for _ in range(3000):
        k = int(rng.integers(0, 9))
        n_dec = int(rng.integers(0 if k else 1, 300))
        new = rng.integers(1, 3000, k)
        past = np.where(rng.random(k) < 0.5, 0, rng.integers(0, 60000, k))
        ctx = int(rng.integers(n_dec, 140000 * max(n_dec, 1))) if n_dec else 0
        got = price_mixed(PI, PF, PG, W2, WDEC, DT, new, past, k, n_dec, ctx)
        want = sm.step_s_summary(new.tolist(), past.tolist(), n_dec, ctx)
        if math.isnan(got):  # the driver prices these with the step model itself
            assert k > 8 or n_dec > 256 or ctx / max(n_dec, 1) > 131072 or past.max() > 131072
            continue
        assert got == want
        priced += 1
    assert priced > 2500


@pytest.mark.parametrize(
    "kw",
    [
        {"engine": "pytorch-eager"},  # its prefills are priced by the driver (PRICE)
        {"attn_pattern": "nsa"},  # every step priced by the pattern's step model
        {"max_batch_size": 512, "scheduler": "sarathi", "chunk_size": 256},
        {"engine": "sglang"},  # overlapped host work, SGLang's capture sizes
        {"engine": "vllm-v0"},  # serial host work, eager prefills
        {"engine": "trtllm"},  # no graphs
        {"engine": "vllm", "scheduler": "sarathi", "chunk_size": 2048},
    ],
)
def test_fast_path_matches_the_event_loop_where_the_step_model_prices(kw):
    sc = _scenario(num_requests=120, **kw)
    fast, slow, rows = _both(sc, sc.arrivals.requests())
    _same(fast, slow)
    assert rows[0] == rows[1]


def test_fast_path_grows_its_arrays_as_the_event_loop_would_run(monkeypatch):
    """Tiny first arrays: the sequence pool and the finish heaps double many times over
    the run, and nothing changes."""
    from simcli.serving import fastkernel as K

    monkeypatch.setattr(fastpath, "POOL", 2)
    monkeypatch.setattr(K, "FINISH_HEAP_PER_SEAT", 1)
    monkeypatch.setattr(fastpath, "FLUSH", 64)  # and many flushes
    sc = _scenario()
    fast, slow, rows = _both(sc, sc.arrivals.requests())
    _same(fast, slow)
    assert rows[0] == rows[1]


def test_fast_path_reports_progress_as_the_event_loop_does():
    sc = _scenario()
    seen = ([], [])
    for i, reqs in enumerate((sc.arrivals.requests(), list(sc.arrivals.requests()))):
        sim = sc.simulator(progress=lambda done, total, _i=i: seen[_i].append(done),
                           progress_total=250)  # fmt: skip
        sim.run(reqs)
    assert seen[0] == seen[1]
    assert len(seen[0]) >= 250 and seen[0][-1] == 250


def test_first_kernel_call_explains_its_compile_pause(monkeypatch, capsys):
    class Now:  # a timer that fires at once
        def __init__(self, _s, fn):
            self.fn = fn

        def start(self):
            self.fn()

        def cancel(self):
            pass

    monkeypatch.setattr(fastpath.threading, "Timer", Now)
    for quiet, expect in ((True, False), (False, True)):
        monkeypatch.setattr(fastpath, "_warm", {"done": False})
        monkeypatch.setattr("simcli.progress._state", {"quiet": quiet})
        sc = _scenario(num_requests=20)
        sc.simulator().run(sc.arrivals.requests())
        assert ("compiling the serving simulator's kernel" in capsys.readouterr().err) == expect


def test_short_streams_take_the_event_loop_unless_asked(monkeypatch):
    """The kernel's start (~0.7 s) pays from about COMPILE_FROM_REQUESTS requests: a stream
    known to be shorter runs on the event loop, unless the caller asks (serve plan)."""
    monkeypatch.setattr(fastpath, "COMPILE_FROM_REQUESTS", 1000)
    sc = _scenario()
    short = sc.arrivals.requests()
    assert short.expected == 250 and fastpath.eligible(sc.simulator(), short)
    assert not fastpath.worth_compiling(short, None)
    assert fastpath.worth_compiling(short, True)
    assert fastpath.worth_compiling(RequestStream(short.chunks, False), None)  # size unknown
    big = _scenario(num_requests=1000).arrivals.requests()
    assert fastpath.worth_compiling(big, None) and not fastpath.worth_compiling(big, False)
    calls = []
    monkeypatch.setattr(fastpath, "run", lambda *a: calls.append(a) or 0.0)
    sc.simulator().run(short)
    assert not calls  # the event loop ran
    with pytest.raises(SimulationError):  # the stub ran no request
        sc.simulator().run(short, compiled=True)
    assert len(calls) == 1
