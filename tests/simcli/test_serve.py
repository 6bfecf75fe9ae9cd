"""Serving simulator: invariants (hypothesis), closed-form cases, scheduler behaviour, CLI."""

from __future__ import annotations

import csv
import importlib.util
import json
import math

import numpy as np
import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from simcli.commands import serve as serve_cmd
from simcli.errors import set_debug
from simcli.scenario import serving as serve_scenario
from simcli.serving.kv import BlockManager
from simcli.serving.metrics import LogHistogram
from simcli.serving.requests import (
    Request,
    SyntheticSpec,
    TraceError,
    synthetic_requests,
    trace_requests,
)
from simcli.serving.schedulers import SchedulerConfig
from simcli.serving.simulator import ServeConfig, SimulationError, Simulator, simulate
from workloads.lengths import parse_dist

HAVE_STEP = importlib.util.find_spec("costmodels.steps.serving") is not None


class AffineStep:
    """Test double of ``costmodels.steps.serving.StepModel`` (same methods): an iteration costs
    ``base + prefill x new tokens + attn x new x past + decode x sequences + ctx x context``."""

    kv_bytes_per_token = 131072.0

    def __init__(
        self,
        capacity_tokens: int = 1_000_000,
        base: float = 0.004,
        prefill: float = 5e-5,
        attn: float = 0.0,
        decode: float = 1e-4,
        ctx: float = 0.0,
    ) -> None:
        self.capacity = capacity_tokens
        self.base, self.prefill, self.attn, self.decode, self.ctx = base, prefill, attn, decode, ctx
        self.calls = 0

    def step_s(self, prefill_new, prefill_past, decode_ctx) -> float:
        assert len(prefill_new) == len(prefill_past)
        assert len(prefill_new) or len(decode_ctx)
        assert (np.asarray(prefill_new) >= 1).all() and (np.asarray(prefill_past) >= 0).all()
        assert (np.asarray(decode_ctx) >= 1).all()
        self.calls += 1
        return (
            self.base
            + self.prefill * float(np.sum(prefill_new))
            + self.attn * float(np.dot(prefill_new, prefill_past))
            + self.decode * len(decode_ctx)
            + self.ctx * float(np.sum(decode_ctx))
        )

    def kv_capacity_tokens(self, block_size: int, gpu_memory_utilization: float) -> int:
        if self.capacity < 0:
            raise ValueError("model does not fit: weights need 141 GiB of 80 GiB per GPU")
        return self.capacity

    def verify_step_s(self, decode_ctx, k: int) -> float:
        return self.step_s(np.zeros(0, np.int64), np.zeros(0, np.int64), decode_ctx) * (1 + k)


def reqs(rows) -> list[Request]:
    return [Request(i, *row) for i, row in enumerate(rows)]


def cfg(kind="vllm", **kw) -> ServeConfig:
    sched = {k: kw.pop(k) for k in list(kw) if k in SchedulerConfig.model_fields}
    return ServeConfig(scheduler=SchedulerConfig(kind=kind, **sched), **kw)


def workload(n, qps, prompt, output, seed=0, **kw) -> list[Request]:
    spec = SyntheticSpec(
        qps=qps,
        num_requests=n,
        prompt_len=parse_dist(prompt),
        output_len=parse_dist(output),
        seed=seed,
        **kw,
    )
    return list(synthetic_requests(spec))


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("kind", ["vllm", "orca", "sarathi"])
def test_single_request_latency_is_prefill_plus_decodes(kind):
    step = AffineStep()
    prompt, out = 300, 17
    r = reqs([(1.5, prompt, out)])
    res = simulate(step, r, cfg(kind, chunk_size=512))
    e = np.zeros(0, np.int64)
    prefill = step.step_s(np.array([prompt]), np.array([0]), e)
    decode = step.step_s(e, e, np.array([prompt]))
    s = res.summary
    assert r[0].first_token_s - r[0].arrival_s == pytest.approx(prefill, rel=1e-12)
    assert s["ttft_s_p50"] == pytest.approx(prefill, rel=1e-12)
    assert s["e2e_s_p99"] == pytest.approx(prefill + (out - 1) * decode, rel=1e-12)
    assert s["tpot_s_p50"] == pytest.approx(decode, rel=1e-12)
    assert s["requests_completed"] == 1 and s["output_tokens"] == out


def test_single_request_with_growing_context_sums_each_decode_step():
    step = AffineStep(ctx=1e-6)
    prompt, out = 100, 40
    res = simulate(step, reqs([(0.0, prompt, out)]), cfg("vllm"))
    e = np.zeros(0, np.int64)
    want = step.step_s(np.array([prompt]), np.array([0]), e) + sum(
        step.step_s(e, e, np.array([prompt + i])) for i in range(out - 1)
    )
    assert res.summary["e2e_s_max"] == pytest.approx(want, rel=1e-12)


def test_one_output_token_finishes_at_prefill():
    step = AffineStep()
    res = simulate(step, reqs([(0.0, 64, 1)]), cfg("vllm"))
    assert res.summary["e2e_s_p50"] == res.summary["ttft_s_p50"]
    assert math.isnan(res.summary["tpot_s_p50"])
    assert step.calls == 1


def test_sarathi_chunks_a_long_prompt():
    step = AffineStep()
    r = reqs([(0.0, 1000, 2)])
    simulate(step, r, cfg("sarathi", chunk_size=256))
    assert step.calls == 5  # four chunks, one decode
    e = np.zeros(0, np.int64)
    chunks = [
        step.step_s(np.array([n]), np.array([p]), e)
        for n, p in ((256, 0), (256, 256), (256, 512), (232, 768))
    ]
    assert r[0].first_token_s == pytest.approx(sum(chunks), rel=1e-12)


def test_step_model_called_once_per_iteration():
    step = AffineStep()
    sim = Simulator(step, cfg("vllm", replicas=2))
    sim.run(workload(200, 50, "uniform:16:256", "uniform:1:64"))
    assert step.calls == sim.metrics.iterations


# --------------------------------------------------------------------------- invariants

workloads = st.lists(
    st.tuples(
        st.floats(0, 0.05, allow_nan=False),  # gap (iterations take ~5-50 ms)
        st.integers(1, 300),  # prompt (after the shared prefix, if any)
        st.integers(1, 80),  # output
        st.sampled_from([None, 0, 1]),  # prefix group
    ),
    min_size=1,
    max_size=40,
)
PREFIX_TOKENS = {0: 48, 1: 100}


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    rows=workloads,
    kind=st.sampled_from(["vllm", "orca", "sarathi"]),
    preemption=st.sampled_from(["recompute", "swap"]),
    replicas=st.integers(1, 3),
    pp=st.integers(1, 2),
    capacity=st.integers(64, 1200),
    block=st.sampled_from([1, 4, 16]),
    chunk=st.integers(1, 300),
    max_seqs=st.integers(1, 16),
    router=st.sampled_from(["round_robin", "least_outstanding", "kv_aware"]),
    caching=st.booleans(),
)
def test_invariants(
    rows, kind, preemption, replicas, pp, capacity, block, chunk, max_seqs, router, caching
):
    t = 0.0
    requests = []
    for i, (gap, prompt, out, group) in enumerate(rows):
        t += gap
        ptoks = PREFIX_TOKENS.get(group, 0)  # type: ignore[arg-type]
        requests.append(Request(i, t, prompt + ptoks, out, group, ptoks))
    longest = max(r.prompt_tokens + r.output_tokens for r in requests)
    capacity = max(capacity, pp * (longest + 2 * block))  # every request fits alone
    finished: list[int] = []
    sim = Simulator(
        AffineStep(capacity_tokens=capacity, ctx=1e-7),
        cfg(
            kind,
            replicas=replicas,
            pp=pp,
            block_size=block,
            chunk_size=chunk,
            max_batch_size=max_seqs,
            preemption=preemption,
            router=router,
            prefix_caching=caching,
        ),
        sink=lambda r: finished.append(r.id),
        check=True,  # KV within capacity and consistent, after every event
    )
    res = sim.run(requests)
    assert sorted(finished) == list(range(len(requests)))  # each finishes exactly once
    for r in requests:
        assert r.generated_tokens == r.output_tokens
        assert r.arrival_s <= r.first_token_s <= r.finish_s
        assert all(s.state == 4 for s in r.seqs)
    for rep in sim.replicas:
        for e in rep.engines:
            assert e.kv.peak_used_blocks <= e.kv.num_blocks
            assert e.kv.active_blocks == 0
            assert not e.waiting and not e.prefilling and not e.swapped and e.decode.n == 0
    assert res.summary["requests_completed"] == len(requests)
    assert res.summary["output_tokens"] == sum(r.output_tokens for r in requests)
    assert 0 <= res.summary["kv_util_max"] <= 1


@pytest.mark.parametrize("kind", ["vllm", "orca", "sarathi"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_invariants_under_pressure(kind, mode):
    requests = workload(
        400, 60, "lognormal:300:1:2000", "lognormal:150:0.8:1000", seed=1,
        shared_prefix_len=160, prefix_groups=3,
    )  # fmt: skip
    sim = Simulator(
        AffineStep(capacity_tokens=12_000, ctx=1e-7),
        cfg(kind, replicas=2, pp=2, preemption=mode, router="kv_aware"),
        check=True,
    )
    res = sim.run(requests).summary
    assert res["requests_completed"] == 400
    assert res["preemptions"] > 0 and res["prefix_cache_hits"] > 0
    assert all(r.generated_tokens == r.output_tokens for r in requests)


def test_time_never_goes_backwards():
    sim = Simulator(AffineStep(capacity_tokens=20_000), cfg("orca", replicas=2))
    seen = []
    orig = sim.arrive

    def arrive(req, now):
        seen.append(now)
        return orig(req, now)

    sim.arrive = arrive  # type: ignore[method-assign]
    requests = workload(500, 80, "lognormal:256:1:2048", "lognormal:64:1:512")
    sim.run(requests)
    assert seen == sorted(seen)
    assert all(r.finish_s >= r.first_token_s >= r.arrival_s for r in requests)


# --------------------------------------------------------------------------- behaviour


def test_preemption_when_kv_is_tight_not_when_ample():
    load = dict(n=300, qps=40, prompt="uniform:200:600", output="uniform:100:400", seed=3)
    for mode in ("recompute", "swap"):
        tight = simulate(
            AffineStep(capacity_tokens=6000), workload(**load), cfg("vllm", preemption=mode)
        )
        ample = simulate(
            AffineStep(capacity_tokens=10**7), workload(**load), cfg("vllm", preemption=mode)
        )
        assert tight.summary["preemptions"] > 0
        assert tight.summary["kv_util_max"] > 0.95
        assert ample.summary["preemptions"] == 0


def test_sarathi_lower_tpot_tail_under_load_with_long_prompts():
    load = dict(n=400, qps=6, prompt="uniform:3000:6000", output="uniform:100:300", seed=1)
    vllm = simulate(AffineStep(), workload(**load), cfg("vllm")).summary
    sarathi = simulate(AffineStep(), workload(**load), cfg("sarathi", chunk_size=512)).summary
    assert sarathi["tpot_s_p99"] < 0.7 * vllm["tpot_s_p99"]
    assert sarathi["tbt_s_max"] < vllm["tbt_s_max"]


def test_vllm_lower_ttft_at_low_load():
    load = dict(n=100, qps=0.5, prompt="uniform:1000:3000", output="uniform:20:100", seed=2)
    vllm = simulate(AffineStep(), workload(**load), cfg("vllm")).summary
    sarathi = simulate(AffineStep(), workload(**load), cfg("sarathi", chunk_size=256)).summary
    assert vllm["ttft_s_p50"] < sarathi["ttft_s_p50"]


def test_prefix_cache_hits_cut_ttft():
    load = dict(n=300, qps=20, prompt="uniform:50:100", output="fixed:20", seed=0)
    extra = dict(shared_prefix_len=2000, prefix_groups=2)
    on = simulate(AffineStep(), workload(**load, **extra), cfg("vllm")).summary
    off = simulate(
        AffineStep(), workload(**load, **extra), cfg("vllm", prefix_caching=False)
    ).summary
    assert on["prefix_cache_hits"] > 250 and off["prefix_cache_hits"] == 0
    assert on["ttft_s_p50"] < 0.5 * off["ttft_s_p50"]


def test_prefix_cache_lru_eviction():
    kv = BlockManager(num_blocks=10, block_size=16)
    a = kv.create((0, 4), 4)
    kv.touch(a)
    b = kv.create((1, 4), 4)
    kv.touch(b)
    kv.release_entry(a)
    kv.release_entry(b)
    assert kv.available_blocks == 10 and kv.evictable_blocks == 8
    kv.acquire(kv.lookup((0, 4)))  # a becomes most recently used and pinned
    kv.allocate(5)  # needs 3 more than free: evicts b (LRU, unpinned), not a
    assert kv.lookup((1, 4)) is None and kv.lookup((0, 4)) is a and kv.evictions == 1
    kv.check()


def test_kv_aware_router_follows_prefix():
    requests = workload(200, 10, "fixed:64", "fixed:8", shared_prefix_len=512, prefix_groups=4)
    sim = Simulator(AffineStep(), cfg("vllm", replicas=4, router="kv_aware"))
    sim.run(requests)
    by_group: dict[int, set[int]] = {}
    for r in requests:
        by_group.setdefault(r.prefix_key, set()).add(r.replica)
    # after the first few, each group sticks to the replica that holds its prefix
    assert sum(len(v) for v in by_group.values()) <= 8
    assert sim.metrics.completed == 200


def test_round_robin_spreads_evenly():
    requests = workload(90, 10, "fixed:64", "fixed:8")
    simulate(AffineStep(), requests, cfg("vllm", replicas=3, router="round_robin"))
    counts = np.bincount([r.replica for r in requests])
    assert list(counts) == [30, 30, 30]


def test_pipeline_parallel_keeps_pp_batches_in_flight():
    load = dict(n=400, qps=200, prompt="fixed:128", output="fixed:64", seed=0)
    one = simulate(AffineStep(), workload(**load), cfg("vllm", pp=1)).summary
    two = simulate(AffineStep(), workload(**load), cfg("vllm", pp=2)).summary
    assert two["throughput_tokens_per_s"] > 1.5 * one["throughput_tokens_per_s"]


def test_goodput_counts_requests_within_slos():
    requests = workload(200, 30, "uniform:100:2000", "uniform:10:200", seed=5)
    free = simulate(AffineStep(), list(requests), cfg("vllm")).summary
    requests = workload(200, 30, "uniform:100:2000", "uniform:10:200", seed=5)
    slo = simulate(
        AffineStep(), requests, cfg("vllm", slo_ttft_s=free["ttft_s_p50"], slo_tpot_s=1.0)
    ).summary
    assert free["slo_attainment"] == 1.0
    assert 0.3 < slo["slo_attainment"] < 0.7
    assert slo["goodput_requests_per_s"] == pytest.approx(
        slo["slo_attainment"] * slo["throughput_requests_per_s"]
    )


def test_request_that_cannot_fit_is_one_error():
    with pytest.raises(SimulationError, match="needs 5099 tokens of KV cache"):
        simulate(AffineStep(capacity_tokens=4096), reqs([(0.0, 5000, 100)]), cfg())
    with pytest.raises(SimulationError, match="no room for the KV cache"):
        simulate(AffineStep(capacity_tokens=8), reqs([(0.0, 5, 1)]), cfg())


def test_prefill_and_decode_pools_extension_point():
    """A prefill-only replica hands finished prefills to a decode-only one (the hooks a
    disaggregated deployment builds on)."""
    sim = Simulator(AffineStep(), cfg("vllm", replicas=2), check=True)
    pre, dec = sim.replicas
    pre.role, dec.role = "prefill", "decode"
    pre.handoff = lambda seq, now: dec.engines[0].admit_decoding(seq, now)

    class ToPrefill:
        def choose(self, replicas, req):
            return pre

    sim.router = ToPrefill()  # type: ignore[assignment]
    requests = workload(100, 20, "uniform:100:800", "uniform:1:50", seed=3)
    sim.run(requests)
    assert all(r.generated_tokens == r.output_tokens for r in requests)
    assert sim.metrics.completed == 100
    assert pre.engines[0].decode.dit == 0 and dec.engines[0].decode.dit > 0
    assert pre.engines[0].kv.active_blocks == 0 == dec.engines[0].kv.active_blocks


# --------------------------------------------------------------------------- streams, metrics


def test_synthetic_stream_is_seeded_and_bursty():
    spec = SyntheticSpec(
        qps=10,
        num_requests=20000,
        prompt_len=parse_dist("fixed:8"),
        output_len=parse_dist("fixed:8"),
        burstiness=3.0,
        seed=7,
    )
    a = [r.arrival_s for r in synthetic_requests(spec)]
    b = [r.arrival_s for r in synthetic_requests(spec)]
    assert a == b
    gaps = np.diff(a)
    assert np.mean(gaps) == pytest.approx(0.1, rel=0.1)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(3.0, rel=0.15)


def test_log_histogram_quantiles_within_half_percent():
    rng = np.random.default_rng(0)
    x = rng.lognormal(-3, 1.5, 50_000)
    h = LogHistogram()
    for v in x:
        h.add(float(v))
    for q in (0.5, 0.9, 0.99):
        exact = np.quantile(x, q, method="inverted_cdf")
        assert h.quantile(q) == pytest.approx(exact, rel=0.006)
    assert h.max == x.max() and h.mean == pytest.approx(x.mean())


def _write(path, text):
    path.write_text(text)
    return path


def test_trace_replay_and_errors(tmp_path):
    good = _write(
        tmp_path / "t.csv",
        "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
        "0.0,100,10,sys,64\n0.5,200,20,,\n0.5,80,5,sys,64\n",
    )
    rs = list(trace_requests(good))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in rs] == [
        (0.0, 100, 10),
        (0.5, 200, 20),
        (0.5, 80, 5),
    ]
    assert rs[0].prefix_key == rs[2].prefix_key == 0 and rs[1].prefix_key is None
    cases = {
        "arrival_s,prompt_tokens,output_tokens\n0,-5,10\n": "line 2: prompt_tokens '-5'",
        "arrival_s,prompt_tokens,output_tokens\n0,5,10\n1,5,abc\n": "line 3: output_tokens",
        "arrival_s,prompt_tokens,output_tokens\n2,5,10\n1,5,10\n": "sorted by arrival_s",
        "arrival_s,prompt\n": "has columns",
        "arrival_s,prompt_tokens,output_tokens\n": "no rows",
        "": "is empty",
        "arrival_s,prompt_tokens,output_tokens\n1,2\n": "2 values, expected 3",
    }
    for i, (text, msg) in enumerate(cases.items()):
        with pytest.raises(TraceError, match=msg) as info:
            list(trace_requests(_write(tmp_path / f"bad{i}.csv", text)))
        assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def cli(monkeypatch):
    root = typer.Typer()

    @root.callback()
    def _root() -> None:
        pass

    root.add_typer(serve_cmd.app, name="serve")
    holder = {"step": AffineStep()}
    monkeypatch.setattr(serve_scenario, "build_step_model", lambda *a, **k: holder["step"])
    runner = CliRunner()

    def invoke(*args: str):
        set_debug(False)
        return runner.invoke(root, ["serve", *args])

    invoke.holder = holder  # type: ignore[attr-defined]
    return invoke


BASE = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--tp", "1")


def test_cli_json_keys(cli):
    result = cli(
        *BASE,
        "--replicas", "2",
        "--scheduler", "sarathi",
        "--qps", "5",
        "--num-requests", "100",
        "--prompt-len", "uniform:128:1024",
        "--output-len", "fixed:32",
        "--seed", "1",
        "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    for key in (
        "requests_completed",
        "ttft_s_p50",
        "ttft_s_p99",
        "tpot_s_p50",
        "tpot_s_p99",
        "e2e_s_p50",
        "e2e_s_p99",
        "throughput_tokens_per_s",
        "goodput_requests_per_s",
        "kv_util_mean",
        "kv_util_max",
        "preemptions",
        "gpu_hours",
        "cost_usd",
    ):
        assert key in out, key
    assert out["requests_completed"] == 100
    assert out["cost_usd"] == pytest.approx(out["gpu_hours"] * 2.95)


def test_cli_price_override_csv_and_table(cli):
    args = (*BASE, "--qps", "5", "--num-requests", "20", "--price-per-gpu-hour", "10")
    result = cli(*args, "--format", "csv")
    assert result.exit_code == 0, result.output
    row = next(csv.DictReader(result.stdout.splitlines()))
    assert float(row["cost_usd"]) == pytest.approx(float(row["gpu_hours"]) * 10)
    assert cli(*args).exit_code == 0


def test_cli_trace_writes_requests_atomically(cli, tmp_path):
    trace = _write(
        tmp_path / "trace.csv", "arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.1,300,5\n"
    )
    out = tmp_path / "reqs.csv"
    result = cli(*BASE, "--trace", str(trace), "--output", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert sorted(int(r["request_id"]) for r in rows) == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reqs.csv", "trace.csv"]


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (("--scheduler", "fifo", "--qps", "1"), "unknown --scheduler 'fifo'; allowed: vllm"),
        (("--qps", "1", "--prompt-len", "uniform:-5:10"), "bad length distribution"),
        (("--qps", "0"), "--qps 0.0 is invalid"),
        ((), "give --qps X"),
        (("--qps", "1", "--preemption", "drop"), "unknown --preemption"),
    ],
)
def test_cli_bad_inputs_are_one_line(cli, args, msg):
    result = cli(*BASE, *args)
    assert result.exit_code == 2, result.output
    assert msg in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_cli_trace_lengths_with_synthetic_arrivals(cli, tmp_path):
    trace = _write(
        tmp_path / "trace.csv",
        "arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.1,300,5\n0.2,700,3\n",
    )
    out = tmp_path / "reqs.csv"
    result = cli(
        *BASE, "--trace", str(trace), "--qps", "50", "--burstiness", "2",
        "--num-requests", "60", "--output", str(out), "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests_completed"] == 60
    rows = list(csv.DictReader(out.read_text().splitlines()))
    pairs = {(int(r["prompt_tokens"]), int(r["output_tokens"])) for r in rows}
    assert pairs <= {(100, 10), (300, 5), (700, 3)} and len(pairs) == 3


def test_cli_bad_trace_leaves_no_output(cli, tmp_path):
    trace = _write(
        tmp_path / "trace.csv",
        "arrival_s,prompt_tokens,output_tokens\n0,100,10\n" + "1,50,5\n" * 50 + "2,-3,4\n",
    )
    out = tmp_path / "reqs.csv"
    result = cli(*BASE, "--trace", str(trace), "--output", str(out))
    assert result.exit_code == 2
    assert "line 53: prompt_tokens '-3' is invalid" in result.stderr
    assert result.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.csv"]


def test_cli_model_that_does_not_fit(cli, tmp_path):
    cli.holder["step"] = AffineStep(capacity_tokens=-1)  # type: ignore[attr-defined]
    out = tmp_path / "reqs.csv"
    result = cli(*BASE, "--qps", "1", "--output", str(out))
    assert result.exit_code == 2
    assert "does not fit" in result.stderr and result.stderr.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- real step model

needs_step = pytest.mark.skipif(not HAVE_STEP, reason="costmodels.steps.serving not available")


@pytest.fixture(scope="module")
def llama8b():
    from costmodels.steps.serving import StepModel

    return StepModel("llama3-8b", "h100-sxm", tp=1)


@needs_step
def test_real_single_request_closed_form(llama8b):
    prompt, out = 1000, 64
    r = reqs([(0.0, prompt, out)])
    simulate(llama8b, r, cfg("vllm"))
    e = np.zeros(0, np.int64)
    prefill = llama8b.step_s(np.array([prompt]), np.array([0]), e)
    decodes = [llama8b.step_s(e, e, np.array([prompt + i])) for i in range(out - 1)]
    assert r[0].first_token_s == pytest.approx(prefill, rel=1e-12)
    assert r[0].finish_s == pytest.approx(prefill + sum(decodes), rel=1e-12)
    # decode steps barely grow with one sequence's context: ~ prefill + (out - 1) x decode
    assert r[0].finish_s == pytest.approx(prefill + (out - 1) * decodes[0], rel=0.02)


@needs_step
def test_real_schedulers_differ_sensibly(llama8b):
    hot = dict(n=300, qps=4, prompt="uniform:4000:7000", output="uniform:100:300", seed=1)
    vllm = simulate(llama8b, workload(**hot), cfg("vllm")).summary
    sarathi = simulate(llama8b, workload(**hot), cfg("sarathi", chunk_size=512)).summary
    assert sarathi["tpot_s_p99"] < 0.7 * vllm["tpot_s_p99"]
    cold = dict(n=60, qps=0.2, prompt="uniform:2000:6000", output="uniform:20:100", seed=2)
    vllm = simulate(llama8b, workload(**cold), cfg("vllm")).summary
    sarathi = simulate(llama8b, workload(**cold), cfg("sarathi", chunk_size=512)).summary
    assert vllm["ttft_s_p50"] < sarathi["ttft_s_p50"]


@needs_step
def test_real_preemption_when_kv_is_tight(llama8b):
    load = dict(n=200, qps=20, prompt="uniform:500:1500", output="uniform:200:600", seed=4)
    sim = Simulator(llama8b, cfg("vllm"), kv_capacity_tokens=20_000, check=True)
    res = sim.run(workload(**load)).summary
    assert res["preemptions"] > 0 and res["requests_completed"] == 200
    full = simulate(llama8b, workload(**load), cfg("vllm")).summary  # 436k tokens of KV
    assert full["preemptions"] == 0


@needs_step
def test_real_step_model_end_to_end(tmp_path):
    runner = CliRunner()
    root = typer.Typer()

    @root.callback()
    def _root() -> None:
        pass

    root.add_typer(serve_cmd.app, name="serve")
    set_debug(False)
    out_csv = tmp_path / "reqs.csv"
    result = runner.invoke(
        root,
        ["serve", *BASE, "--replicas", "2", "--qps", "4", "--num-requests", "200",
         "--prompt-len", "lognormal:512:1:4096", "--output-len", "lognormal:128:1:1024",
         "--output", str(out_csv), "--format", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["requests_completed"] == 200
    assert 0.005 < out["ttft_s_p50"] < 2.0 and 0.003 < out["tpot_s_p50"] < 0.2
    assert out["energy_kwh"] > 0 and out["cost_usd"] > 0
    assert len(out_csv.read_text().splitlines()) == 201
    big = runner.invoke(
        root, ["serve", "--model", "llama3-70b", "--gpu", "h100-sxm", "--tp", "1", "--qps", "1"]
    )
    assert big.exit_code == 2 and big.stderr.count("\n") == 1
    assert "does not fit" in big.stderr
